"""``llds data fetch`` against a small Search-R1 fixture served from loopback by a fake hub.

The fake hub answers like Hugging Face's ``resolve`` URLs: a Git LFS file's HEAD is a 302 whose
``X-Linked-Etag`` / ``X-Linked-Size`` give its sha256 and size, and its bytes come from a second
("CDN") path that honours Range; a plain git file is served directly with its blob sha1 as ETag.
It can cut a connection midway, ignore Range, serve corrupt bytes or fail with a status.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import faiss
import numpy as np
import pytest

from llds import data_fetch
from llds.data_fetch import ChecksumError, DataSet, FetchError, Part, RemoteFile, fetch

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = Path(__file__).resolve().parents[3]


@dataclass
class Hub:
    """Files by URL key (``datasets/REPO/resolve/REV/PATH``) and the faults to inject."""

    files: dict[str, bytes] = field(default_factory=dict)
    lfs: set[str] = field(default_factory=set)
    drop_once: dict[str, int] = field(default_factory=dict)
    """key -> bytes sent before the connection is cut (once)."""
    ignore_range: set[str] = field(default_factory=set)
    corrupt: set[str] = field(default_factory=set)
    """Served with one byte changed; the stated checksum and size stay those of the real file."""
    status: dict[str, int] = field(default_factory=dict)
    """key -> HTTP status every GET of it gets."""
    log: list[tuple[str, str, str | None, int]] = field(default_factory=list)
    """(method, path, Range header, status) of every request."""
    base_url: str = ""

    def key(self, file: RemoteFile) -> str:
        return f"datasets/{file.repo}/resolve/{file.revision}/{file.path}"

    def gets(self, suffix: str) -> list[str | None]:
        """Range headers of the GETs whose path ends with ``suffix`` and that were answered with bytes."""
        return [rng for method, path, rng, status in self.log
                if method == "GET" and path.endswith(suffix) and status in (200, 206, 503)]  # fmt: skip


def _handler(hub: Hub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _headers(self, status: int, headers: dict[str, str]) -> None:
            hub.log.append((self.command, self.path, self.headers.get("Range"), status))
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()

        def _route(self, head: bool) -> None:
            path = self.path.lstrip("/")
            cdn = path.startswith("cdn/")
            key = path.removeprefix("cdn/")
            if key not in hub.files:
                self._headers(404, {"Content-Length": "0"})
                return
            data = hub.files[key]
            if key in hub.lfs and not cdn:  # the hub: a redirect that states the LFS sha256 and size
                self._headers(302, {"Location": f"/cdn/{key}", "X-Linked-Etag": f'"{hashlib.sha256(data).hexdigest()}"',
                                    "X-Linked-Size": str(len(data)), "X-Repo-Commit": COMMIT,
                                    "Content-Length": "0"})  # fmt: skip
                return
            if not head and key in hub.status:
                self._headers(hub.status[key], {"Content-Length": "0"})
                return
            headers = {"Content-Length": str(len(data)), "X-Repo-Commit": COMMIT}
            if key not in hub.lfs:
                headers["ETag"] = '"' + hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() + '"'
            if head:
                self._headers(200, headers)
                return
            if key in hub.corrupt:
                data = data[:-1] + bytes([data[-1] ^ 0xFF])
            start, status = 0, 200
            rng = self.headers.get("Range")
            if rng and key not in hub.ignore_range:
                start = int(rng.removeprefix("bytes=").split("-")[0])
                if start >= len(data):
                    self._headers(416, {"Content-Range": f"bytes */{len(data)}", "Content-Length": "0"})
                    return
                status = 206
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            body = data[start:]
            headers["Content-Length"] = str(len(body))
            self._headers(status, headers)
            cut = hub.drop_once.pop(key, None)
            if cut is not None:
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
                self.close_connection = True
                return
            self.wfile.write(body)

        def do_HEAD(self) -> None:
            self._route(head=True)

        def do_GET(self) -> None:
            self._route(head=False)

    return Handler


def _parquet(rows: list[dict[str, object]]) -> bytes:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def _search_r1_row(source: str, i: int, question: str, answers: list[str]) -> dict[str, object]:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": f"Answer the given question. Question: {question}\n"}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": answers}},
        "extra_info": {"split": "test", "index": i},
    }


@dataclass
class Fixture:
    """What the fake hub serves for ``search-r1``, and the expected results."""

    train_rows: list[dict[str, object]]
    passages: bytes
    vectors: np.ndarray


def _fixture(hub: Hub) -> Fixture:
    ds = data_fetch.CATALOG["search-r1"]
    files = {f.dest: f for part in ds.parts for f in part.files}
    train_rows = [
        _search_r1_row(s, i, f"question {i}?", [f"answer {i}"]) for i, s in enumerate(["nq", "hotpotqa"] * 3)
    ]
    test_rows = [
        _search_r1_row(s, i, f"q{i}?", [f"a{i}"]) for i, (s, _) in enumerate(data_fetch.SEARCH_R1_EVAL)
    ]
    passages = "".join(
        json.dumps({"id": str(i), "contents": f'"Title {i}"\npassage {i}'}) + "\n" for i in range(300)
    ).encode()
    vectors = np.random.default_rng(0).standard_normal((300, 32)).astype(np.float32)
    index = faiss.IndexFlatIP(32)
    index.add(vectors)
    blob = faiss.serialize_index(index).tobytes()
    half = len(blob) // 2
    content = {
        "nq_hotpotqa_train/train.parquet": _parquet(train_rows),
        "nq_hotpotqa_train/test.parquet": _parquet(test_rows),
        "wiki18/wiki-18.jsonl.gz": gzip.compress(passages),
        "wiki18/part_aa": blob[:half],
        "wiki18/part_ab": blob[half:],
    }
    for name, _ in data_fetch.SEARCH_R1_EVAL:
        rows = [
            {"id": f"{name}-{i}", "question": f"{name} {i}?", "golden_answers": [str(i)], "metadata": {}}
            for i in range(3)
        ]
        content[f"eval/{name}.jsonl"] = "".join(json.dumps(r) + "\n" for r in rows).encode()
    for dest, data in content.items():
        key = hub.key(files[dest])
        hub.files[key] = data
        if not dest.startswith("eval/"):
            hub.lfs.add(key)
    return Fixture(train_rows, passages, vectors)  # fmt: skip


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    hub = Hub()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    hub.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()


def _key(hub: Hub, dest: str) -> str:
    ds = data_fetch.CATALOG["search-r1"]
    return hub.key(next(f for p in ds.parts for f in p.files if f.dest == dest))


def _fetch(hub: Hub, out: Path, only: list[str] | None = None, **kw: object) -> list[data_fetch.Outcome]:
    return fetch("search-r1", out, only, hub.base_url, progress=False, backoff_s=0.0, **kw)  # type: ignore[arg-type]


def test_full_fetch_writes_checked_products_and_a_second_fetch_downloads_nothing(
    hub: Hub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fx = _fixture(hub)
    out = tmp_path / "sr1"
    rc = data_fetch.main(["search-r1", "--out", str(out), "--base-url", hub.base_url, "--no-progress"])
    printed = capsys.readouterr().out
    assert rc == 0, printed

    train = [json.loads(line) for line in (out / "nq_hotpotqa_train/train.jsonl").read_text().splitlines()]
    assert train == fx.train_rows
    test = [json.loads(line) for line in (out / "nq_hotpotqa_train/test.jsonl").read_text().splitlines()]
    assert [r["data_source"] for r in test] == [name for name, _ in data_fetch.SEARCH_R1_EVAL]
    for name, _ in data_fetch.SEARCH_R1_EVAL:
        assert (out / f"eval/{name}.jsonl").read_bytes() == hub.files[_key(hub, f"eval/{name}.jsonl")]
    assert (out / "wiki18/wiki-18.jsonl").read_bytes() == fx.passages
    index = faiss.read_index(str(out / "wiki18/e5_Flat.index"))
    assert index.ntotal == 300 and np.array_equal(index.reconstruct_n(0, 300), fx.vectors)
    # downloads a step consumed are gone, and nothing half-done is left
    left = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert not [n for n in left if n.startswith("part_") or n.endswith((".gz", ".part", ".partial"))], left

    lock = json.loads((out / "fetch.lock.json").read_text())["files"]
    for rel, entry in lock.items():
        if "removed" not in entry:
            assert entry["sha256"] == hashlib.sha256((out / rel).read_bytes()).hexdigest(), rel
    assert (
        "sha256 from server" in lock["wiki18/part_aa"]["checks"]
        and lock["wiki18/part_aa"]["commit"] == COMMIT
    )
    assert "git sha1 from server" in lock["eval/bamboogle.jsonl"]["checks"]
    assert lock["wiki18/e5_Flat.index"]["made_from"] == ["wiki18/part_aa", "wiki18/part_ab"]
    assert "wiki18/e5_Flat.index" in printed and "fetch.lock.json" in printed

    hub.log.clear()
    again = _fetch(hub, out)
    assert hub.log == []  # verified against the lock: not even a HEAD
    assert {o.path for o in again} == {p for part in data_fetch.SEARCH_R1.parts for p in part.products()}
    assert all(o.action.startswith("verified") for o in again)


def test_a_connection_cut_midway_resumes_with_a_range_request(hub: Hub, tmp_path: Path) -> None:
    fx = _fixture(hub)
    key = _key(hub, "wiki18/part_aa")
    hub.drop_once[key] = 1000
    outcomes = _fetch(hub, tmp_path, ["index"])
    assert hub.gets(key) == [None, "bytes=1000-"]
    assert next(o for o in outcomes if o.path == "wiki18/part_aa").action == "resumed, 1 retry"
    index = faiss.read_index(str(tmp_path / "wiki18/e5_Flat.index"))
    assert np.array_equal(index.reconstruct_n(0, 300), fx.vectors)


def test_an_interrupted_run_resumes_from_its_part_file(hub: Hub, tmp_path: Path) -> None:
    _fixture(hub)
    key = _key(hub, "wiki18/part_ab")
    (tmp_path / "wiki18").mkdir()
    (tmp_path / "wiki18/part_ab.part").write_bytes(hub.files[key][:700])
    outcomes = _fetch(hub, tmp_path, ["index"])
    assert hub.gets(key) == ["bytes=700-"]
    assert next(o for o in outcomes if o.path == "wiki18/part_ab").action == "resumed from 700 B"


def test_a_server_that_ignores_range_restarts_the_file_cleanly(hub: Hub, tmp_path: Path) -> None:
    fx = _fixture(hub)
    key = _key(hub, "wiki18/part_ab")
    hub.ignore_range.add(key)
    (tmp_path / "wiki18").mkdir()
    (tmp_path / "wiki18/part_ab.part").write_bytes(b"\0" * 700)  # not even a prefix of the file
    outcomes = _fetch(hub, tmp_path, ["index"])
    assert hub.gets(key) == ["bytes=700-"]
    assert next(o for o in outcomes if o.path == "wiki18/part_ab").action.startswith("restarted")
    assert np.array_equal(
        faiss.read_index(str(tmp_path / "wiki18/e5_Flat.index")).reconstruct_n(0, 300), fx.vectors
    )


def test_a_checksum_mismatch_is_named_and_leaves_nothing_that_looks_complete(
    hub: Hub, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _fixture(hub)
    key = _key(hub, "wiki18/wiki-18.jsonl.gz")
    hub.corrupt.add(key)
    rc = data_fetch.main(
        ["search-r1", "--only", "corpus", "--out", str(tmp_path), "--base-url", hub.base_url, "--no-progress"]
    )
    err = capsys.readouterr().err
    assert rc == 1
    want = hashlib.sha256(hub.files[key]).hexdigest()
    assert f"{hub.base_url}/{key}" in err and "sha256" in err and want in err and "deleted" in err
    assert sorted(p.name for p in (tmp_path / "wiki18").iterdir()) == []
    lock = tmp_path / "fetch.lock.json"
    assert not lock.exists() or json.loads(lock.read_text())["files"] == {}

    # a plain git file: checked against its blob sha1
    bam = _key(hub, "eval/bamboogle.jsonl")
    hub.corrupt.add(bam)
    with pytest.raises(ChecksumError, match="git blob sha1"):
        _fetch(hub, tmp_path, ["eval"])
    assert (
        not (tmp_path / "eval/bamboogle.jsonl").exists()
        and not (tmp_path / "eval/bamboogle.jsonl.part").exists()
    )
    assert (tmp_path / "eval/nq.jsonl").exists()  # fetched before it, and kept


def _one_file_set(path: str, sha256: str | None) -> DataSet:
    f = RemoteFile(repo="someone/things", path=path, dest=path, sha256=sha256)
    return DataSet(name="t", about="t", parts=[Part(name="p", about="p", files=[f])])


def test_pinned_sha256_is_checked_after_download_and_against_the_server(hub: Hub, tmp_path: Path) -> None:
    hub.files["datasets/someone/things/resolve/main/a.txt"] = b"hello\n"
    hub.files["datasets/someone/things/resolve/main/b.bin"] = b"x" * 5000
    hub.lfs.add("datasets/someone/things/resolve/main/b.bin")
    wrong = "0" * 64
    f = data_fetch.Fetcher(tmp_path, hub.base_url, progress=False, backoff_s=0.0)
    with pytest.raises(ChecksumError, match="pinned in the manifest"):
        f.run(_one_file_set("a.txt", wrong))
    assert not (tmp_path / "a.txt").exists()
    hub.log.clear()
    with pytest.raises(ChecksumError, match="the manifest pins"):
        f.run(_one_file_set("b.bin", wrong))
    assert hub.gets("b.bin") == []  # refused before downloading
    good = hashlib.sha256(b"hello\n").hexdigest()
    f.run(_one_file_set("a.txt", good))
    assert "sha256 pinned" in f.lock.files["a.txt"]["checks"]
    f.close()


def test_http_errors_and_exhausted_retries_name_the_url_and_status(hub: Hub, tmp_path: Path) -> None:
    f = data_fetch.Fetcher(tmp_path, hub.base_url, progress=False, backoff_s=0.0, retries=2)
    with pytest.raises(
        FetchError,
        match=r"HEAD http://127\.0\.0\.1:\d+/datasets/someone/things/resolve/main/gone\.txt: HTTP 404",
    ):
        f.run(_one_file_set("gone.txt", None))
    key = "datasets/someone/things/resolve/main/busy.txt"
    hub.files[key] = b"busy"
    hub.status[key] = 503
    with pytest.raises(FetchError, match=r"HTTP 503.*gave up after 2 retries"):
        f.run(_one_file_set("busy.txt", None))
    assert len(hub.gets("busy.txt")) == 3
    f.close()


def test_unknown_data_set_or_part_is_refused_with_the_choices(hub: Hub, tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="no data set 'nope'; known: search-r1"):
        fetch("nope", tmp_path)
    with pytest.raises(FetchError, match="no part 'bogus'; parts: train, eval, corpus, index"):
        _fetch(hub, tmp_path, ["bogus"])


def test_a_file_changed_after_fetching_is_refused(hub: Hub, tmp_path: Path) -> None:
    _fixture(hub)
    _fetch(hub, tmp_path, ["eval"])
    nq = tmp_path / "eval/nq.jsonl"
    data = nq.read_bytes()
    nq.write_bytes(data[:-2] + b"X\n")
    with pytest.raises(ChecksumError, match=r"nq\.jsonl: sha256 .* recorded .* changed after it was fetched"):
        _fetch(hub, tmp_path, ["eval"])


def test_files_already_there_are_checked_against_the_server_or_need_adopt(hub: Hub, tmp_path: Path) -> None:
    fx = _fixture(hub)
    (tmp_path / "eval").mkdir()
    nq_key = _key(hub, "eval/nq.jsonl")
    (tmp_path / "eval/nq.jsonl").write_bytes(hub.files[nq_key])
    (tmp_path / "eval/popqa.jsonl").write_bytes(b"something else\n")
    with pytest.raises(
        ChecksumError, match=r"popqa\.jsonl is there but not in .* differs from the published file"
    ):
        _fetch(hub, tmp_path, ["eval"])
    assert (tmp_path / "eval/popqa.jsonl").read_bytes() == b"something else\n"  # never deleted
    assert hub.gets(nq_key) == []  # matched the server's checksum: not downloaded
    (tmp_path / "eval/popqa.jsonl").unlink()
    _fetch(hub, tmp_path, ["eval"])

    (tmp_path / "wiki18").mkdir()
    (tmp_path / "wiki18/wiki-18.jsonl").write_bytes(fx.passages)
    with pytest.raises(FetchError, match="--adopt"):
        _fetch(hub, tmp_path, ["corpus"])
    outcomes = _fetch(hub, tmp_path, ["corpus"], adopt=True)
    assert [o.action for o in outcomes] == ["adopted (--adopt: recorded as it was, not checked)"]
    assert hub.gets("wiki-18.jsonl.gz") == []


def test_quick_checks_size_and_mtime_only(hub: Hub, tmp_path: Path) -> None:
    _fixture(hub)
    _fetch(hub, tmp_path, ["eval"])
    outcomes = _fetch(hub, tmp_path, ["eval"], quick=True)
    assert all(o.action.startswith("kept (--quick") for o in outcomes)


def test_listing_names_every_source() -> None:
    text = data_fetch.listing()
    for name, split in data_fetch.SEARCH_R1_EVAL:
        assert f"RUC-NLPIR/FlashRAG_datasets:{name}/{split}.jsonl -> eval/{name}.jsonl" in text
    assert "PeterJinGo/wiki-18-e5-index:part_ab -> wiki18/part_ab" in text
    assert "concat: wiki18/part_aa, wiki18/part_ab -> wiki18/e5_Flat.index" in text


def test_base_url_comes_from_the_flag_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(data_fetch.BASE_URL_ENV, raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    assert data_fetch.default_base_url() == "https://huggingface.co"
    monkeypatch.setenv("HF_ENDPOINT", "https://mirror.example")
    assert data_fetch.default_base_url() == "https://mirror.example"
    monkeypatch.setenv(data_fetch.BASE_URL_ENV, "http://127.0.0.1:9")
    assert data_fetch.default_base_url() == "http://127.0.0.1:9"
    f = RemoteFile(repo="PeterJinGo/wiki-18-corpus", path="wiki-18.jsonl.gz", dest="x")
    assert f.url("http://h/") == "http://h/datasets/PeterJinGo/wiki-18-corpus/resolve/main/wiki-18.jsonl.gz"


def _run_script(hub: Hub, tmp_path: Path, script: str, out: Path) -> subprocess.CompletedProcess[str]:
    """Run a deploy/scripts wrapper with ``llds`` meaning this interpreter and this tree."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    shim = bin_dir / "llds"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m llds.cli "$@"\n')
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", data_fetch.BASE_URL_ENV: hub.base_url,
           "SKIP_DISK_CHECK": "1", "PYTHONPATH": os.pathsep.join(sys.path)}  # fmt: skip
    return subprocess.run(["bash", str(REPO / "deploy/scripts" / script), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def test_deploy_wrappers_fetch_once_and_take_over_an_earlier_download(hub: Hub, tmp_path: Path) -> None:
    fx = _fixture(hub)
    res = _run_script(hub, tmp_path, "download_wiki18.sh", tmp_path / "indexes/wiki18")
    assert res.returncode == 0, res.stderr
    wiki = tmp_path / "indexes/wiki18"
    assert (wiki / "wiki-18.jsonl").read_bytes() == fx.passages and (wiki / "COMPLETE").exists()
    hub.log.clear()
    assert _run_script(hub, tmp_path, "download_wiki18.sh", wiki).returncode == 0
    assert hub.log == []

    res = _run_script(hub, tmp_path, "download_dataset.sh", tmp_path / "datasets/wrong_name")
    assert res.returncode != 0 and "must end in /nq_hotpotqa_train" in res.stderr

    # the earlier lock-less script's results: recorded, not fetched again
    old = tmp_path / "old/wiki18"
    old.mkdir(parents=True)
    (old / "wiki-18.jsonl").write_bytes(fx.passages)
    (old / "e5_Flat.index").write_bytes(b"".join(hub.files[_key(hub, f"wiki18/part_a{c}")] for c in "ab"))
    (old / "COMPLETE").write_text("{}\n")
    hub.log.clear()
    res = _run_script(hub, tmp_path, "download_wiki18.sh", old)
    assert res.returncode == 0, res.stderr
    assert hub.log == [] and "adopted" in res.stdout
    assert set(json.loads((tmp_path / "old/fetch.lock.json").read_text())["files"]) == {
        "wiki18/wiki-18.jsonl",
        "wiki18/e5_Flat.index",
    }


def test_two_fetches_into_one_folder_do_not_interleave(hub: Hub, tmp_path: Path) -> None:
    import fcntl

    _fixture(hub)
    tmp_path.mkdir(exist_ok=True)
    with (tmp_path / ".fetch.busy").open("a") as other:
        fcntl.flock(other, fcntl.LOCK_EX)
        with pytest.raises(FetchError, match="another llds data fetch is writing"):
            _fetch(hub, tmp_path, ["eval"])
    assert hub.log == []
    _fetch(hub, tmp_path, ["eval"])
