"""``llds up`` on your own data (issue 29, item 6): ``--dataset`` with ``--corpus`` (indexed into the run
dir by the retriever's own builder, once per content), ``--index`` or ``--retriever-url``; refusals
name the file, line and field; ``--resume`` keeps them. The index build is real; children are not
started (their argv, env and resolved configs are what is checked)."""

from __future__ import annotations

import json
import os
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from llds import up
from llds_server.settings import ConfigError

QUESTIONS = [
    {"id": "q1", "question": "Who built the Glass Bridge of Ostrava?", "golden_answers": ["Mila Horak"]},
    {"id": "q2", "question": "In which year did the Orlen canal open?", "golden_answers": ["1871"]},
]
DOCS = [
    {
        "id": "d1",
        "contents": '"Glass Bridge of Ostrava"\nThe Glass Bridge of Ostrava was built by Mila Horak.',
    },
    {"id": "d2", "contents": '"Orlen canal"\nThe Orlen canal opened in 1871 after ten years of work.'},
    {"id": "d3", "contents": '"Mila Horak"\nMila Horak was an engineer who built bridges.'},
]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("LLDS_UP_", "LLDS_ROLLOUT_", "LLDS_TRAINER_")) or k in (
            "REDIS_URL",
            "CUDA_VISIBLE_DEVICES",
        ):
            monkeypatch.delenv(k)


def _jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture()
def data(tmp_path: Path) -> dict[str, Path]:
    return {
        "dataset": _jsonl(tmp_path / "questions.jsonl", QUESTIONS),
        "eval": _jsonl(tmp_path / "heldout.jsonl", QUESTIONS[1:]),
        "corpus": _jsonl(tmp_path / "docs.jsonl", DOCS),
    }


def _up(tmp_path: Path, *flags: str, resume: bool = False) -> up.Up:
    argv = ["--preset", "tiny", "--run-dir", str(tmp_path / "run"), *flags]
    cfg, _ = up.parse_args(argv)
    return up.Up(cfg, resume=resume)


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}')

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture()
def retriever() -> Iterator[tuple[str, type[_Health]]]:
    """A stand-in retriever on loopback answering GET /health with ``handler.status``."""
    handler = type("Handler", (_Health,), {"status": 200})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dataset", "{dataset}"], "needs the documents its questions are answered from: --corpus FILE"),
        (["--corpus", "{corpus}"], "give your training questions with --dataset FILE"),
        (["--dataset", "{dataset}", "--corpus", "{corpus}", "--index", "{corpus}"], "--corpus and --index each"),
        (["--dataset", "{dataset}", "--corpus", "{corpus}", "--retriever-url", "http://127.0.0.1:9"],
         "--corpus and --retriever-url each give the documents"),
        (["--eval-dataset", "{eval}"], "--eval-dataset goes with --dataset"),
        (["--dataset", "{dataset}", "--corpus", "{missing}"], "is not a file"),
        (["--dataset", "{dataset}", "--index", "{corpus}"], "--index: index folder"),
    ],
)  # fmt: skip
def test_incoherent_data_flags_are_refused(
    tmp_path: Path, data: dict[str, Path], flags: list[str], message: str
) -> None:
    given = {**{k: str(v) for k, v in data.items()}, "missing": str(tmp_path / "nope.jsonl")}
    with pytest.raises(ConfigError) as e:
        _up(tmp_path, *[f.format(**given) for f in flags]).check_data()
    assert message in str(e.value)


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"id": "q3", "question": "Where?"}, "no gold answers (golden_answers"),
        ({"id": "q3", "golden_answers": ["x"]}, "no question (neither 'question'"),
        ({"question": "Where?", "golden_answers": ["x"]}, "no row index (extra_info.index or id)"),
    ],
)
def test_a_bad_question_row_is_named_by_file_line_and_field(
    tmp_path: Path, data: dict[str, Path], row: dict[str, object], field: str
) -> None:
    bad = _jsonl(tmp_path / "bad.jsonl", [*QUESTIONS, row])
    for flags in (["--dataset", str(bad)], ["--dataset", str(data["dataset"]), "--eval-dataset", str(bad)]):
        with pytest.raises(ConfigError) as e:
            _up(tmp_path, *flags, "--corpus", str(data["corpus"])).check_data()
        assert f"{bad}:3: {field}" in str(e.value) and str(e.value).startswith(f"{flags[-2]}: ")


def test_llds_up_exits_2_on_a_bad_dataset_before_starting_anything(
    tmp_path: Path, data: dict[str, Path], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(up.Up, "prepare", lambda self: pytest.fail("nothing may start"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(QUESTIONS[0]) + "\n{not json\n")
    light = tmp_path / "rollout.toml"
    light.write_text('[engine]\ntype = "transformers"\n')
    code = up.main(["--preset", "tiny", "--run-dir", str(tmp_path / "run"), "--rollout-config", str(light),
                    "--dataset", str(bad), "--corpus", str(data["corpus"])])  # fmt: skip
    assert code == 2 and f"llds up: --dataset: {bad}:2: not JSON" in capsys.readouterr().err


# ---------------------------------------------------------------------------- --corpus: a real index build


def test_corpus_is_indexed_into_the_run_dir_once_and_the_children_use_it(
    tmp_path: Path, data: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    flags = [
        "--dataset",
        str(data["dataset"]),
        "--eval-dataset",
        str(data["eval"]),
        "--corpus",
        str(data["corpus"]),
    ]
    u = _up(tmp_path, *flags)
    u.check_data()
    paths = u.prepare()
    index = paths["index"]
    assert index.parent == u.run_dir / "index" and index.name == f"bm25-{up.file_digest(data['corpus'])[:16]}"
    manifest = json.loads((index / "manifest.json").read_text())
    assert (manifest["kind"], manifest["num_docs"]) == ("bm25", 3)
    assert "world" not in paths  # the synthetic world is not built for your own data
    u.paths, u.redis_url = paths, "redis://127.0.0.1:1/0"
    argv, _ = u.spec("retriever")
    assert argv[argv.index("--index") + 1] == str(index)
    rollout = tomllib.loads(Path(u.spec("rollout")[0][-1]).read_text())
    assert rollout["dataset"] == str(data["dataset"]) and rollout["retriever_url"] == u.url("retriever")
    assert up.first_question(paths["eval"]) == (QUESTIONS[1]["question"], ["1871"])
    # the prebuilt index passes --index's check
    up.Up(up.parse_args(["--preset", "tiny", "--run-dir", str(tmp_path / "r2"), "--dataset", str(data["dataset"]),
                         "--index", str(index)])[0]).check_data()  # fmt: skip

    # a resume finds it by its content: nothing is rebuilt
    (u.run_dir / "run_id").write_text(u.run_id + "\n")
    monkeypatch.setattr(up, "run_tool", lambda args: pytest.fail(f"rebuilt: {args}"))
    assert _up(tmp_path, *flags, resume=True).prepare()["index"] == index
    # the file changed under the run: refused, not silently re-indexed
    _jsonl(data["corpus"], DOCS[:2])
    with pytest.raises(ConfigError, match="its content changed"):
        _up(tmp_path, *flags, resume=True).prepare()


# ---------------------------------------------------------------------------- --retriever-url


def test_retriever_url_starts_no_retriever_and_is_health_checked(
    tmp_path: Path, data: dict[str, Path], retriever: tuple[str, type[_Health]]
) -> None:
    url, handler = retriever
    u = _up(
        tmp_path, "--dataset", str(data["dataset"]), "--retriever-url", url + "/", "--retriever-port", "1"
    )
    u.check_data()
    assert "retriever" not in u.child_names() and u.url("retriever") == url
    paths = u.prepare()
    assert "index" not in paths
    u.paths, u.redis_url = paths, "redis://127.0.0.1:1/0"
    assert tomllib.loads(Path(u.spec("rollout")[0][-1]).read_text())["retriever_url"] == url
    dash = u.spec("dashboard")[0]
    assert dash[dash.index("--retriever-url") + 1] == url
    handler.status = 503
    with pytest.raises(ConfigError, match="GET /health answered 503"):
        u.check_data()
    with pytest.raises(ConfigError, match="is it running"):
        _up(tmp_path, "--dataset", str(data["dataset"]), "--retriever-url", "http://127.0.0.1:9").check_data()


def test_retriever_url_leaves_the_retriever_port_unchecked(tmp_path: Path, data: dict[str, Path]) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = str(s.getsockname()[1])
        flags = ["--rollout-port", "0", "--trainer-port", "0", "--dashboard-port", "0", "--redis-port", "0",
                 "--retriever-port", port]  # fmt: skip
        with pytest.raises(ConfigError, match=f"retriever port {port} is held"):
            _up(tmp_path, *flags).check_ports()
        _up(
            tmp_path, *flags, "--dataset", str(data["dataset"]), "--retriever-url", "http://x:1"
        ).check_ports()


# ---------------------------------------------------------------------------- --resume


def test_resume_keeps_the_data_and_refuses_to_change_it(
    tmp_path: Path, data: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg, _ = up.parse_args(["--preset", "tiny", "--run-dir", "run", "--dataset", "questions.jsonl",
                            "--corpus", "docs.jsonl"])  # fmt: skip
    first = up.Up(cfg)
    assert first.cfg.dataset == data["dataset"]  # made absolute: a resume from elsewhere reads the same file
    first.run_dir.mkdir()
    (first.run_dir / "run_id").write_text(first.run_id + "\n")
    first.cfg.model_copy(update={"run_dir": first.run_dir}).write_toml(first.run_dir / "up_config.toml")
    monkeypatch.chdir("/")
    again, resume = up.parse_args(["--resume", str(first.run_dir)])
    assert resume and (again.dataset, again.corpus) == (data["dataset"], data["corpus"])
    for flag in ("--dataset", "--corpus", "--index", "--eval-dataset"):
        with pytest.raises(SystemExit):
            up.parse_args(["--resume", str(first.run_dir), flag, "x"])
        assert f"drop {flag}" in capsys.readouterr().err
