"""Security surface of every service: admin auth in constant time, loopback by default, body-size
limits, weight paths confined to the weights root, no unsafe deserialisation, Redis passwords.

Weight-update auth and rejects over HTTP (401/403, corrupt, incomplete, traversal, symlink escape)
are also covered by ``test_rollout_service.py``; here the confinement is checked on its own, with
the cases a fuzzer would try (NUL bytes, ``.``, nested symlinks, symlinked files).
"""

from __future__ import annotations

import ast
import json
import os
import socket
import stat
import tomllib
from pathlib import Path

import httpx
import pytest
import redis

from llds.redis_server import RedisServer
from llds_server.http import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "services", ROOT / "proto", ROOT / "launcher"]
TOKEN = "t0ken-for-tests"


def _py_files() -> list[Path]:
    return [p for d in SOURCES for p in d.rglob("*.py") if ".venv" not in p.parts]


# ---------------------------------------------------------------------------- deserialisation


def _unsafe_calls(path: Path) -> list[str]:
    """Pickle-family imports, eval/exec, torch.load without weights_only=True, yaml.load, allow_pickle."""
    tree = ast.parse(path.read_text(), filename=str(path))
    bad: list[str] = []
    banned_modules = {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "joblib", "_pickle"}
    for node in ast.walk(tree):
        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            bad += [f"{where} import {a.name}" for a in node.names if a.name.split(".")[0] in banned_modules]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in banned_modules:
            bad.append(f"{where} from {node.module} import")
        elif isinstance(node, ast.Call):
            f = node.func
            kw = {k.arg: k.value for k in node.keywords}
            if isinstance(f, ast.Name) and f.id in ("eval", "exec", "__import__"):
                bad.append(f"{where} {f.id}()")
            if isinstance(f, ast.Attribute):
                owner = f.value.id if isinstance(f.value, ast.Name) else None
                if owner == "torch" and f.attr == "load":
                    wo = kw.get("weights_only")
                    if not (isinstance(wo, ast.Constant) and wo.value is True):
                        bad.append(f"{where} torch.load without weights_only=True")
                if owner == "yaml" and f.attr in ("load", "unsafe_load", "full_load"):
                    bad.append(f"{where} yaml.{f.attr}")
                if owner in ("np", "numpy") and f.attr == "load":
                    ap = kw.get("allow_pickle")
                    if isinstance(ap, ast.Constant) and ap.value is True:
                        bad.append(f"{where} numpy.load(allow_pickle=True)")
                if f.attr in ("loads", "load") and owner in banned_modules:
                    bad.append(f"{where} {owner}.{f.attr}")
    return bad


def test_nothing_deserialises_code_or_pickles() -> None:
    files = _py_files()
    assert len(files) > 50
    bad = [b for p in files for b in _unsafe_calls(p)]
    assert not bad, "unsafe deserialisation:\n" + "\n".join(bad)


def test_the_unsafe_call_scanner_catches_what_it_should(tmp_path: Path) -> None:
    probe = ROOT / "launcher" / "_probe_for_scanner_test.py"
    probe.write_text(
        "import pickle\nimport torch\nx = torch.load('f')\ny = torch.load('f', weights_only=True)\n"
        "eval('1')\nmodel.eval()\n"
    )
    try:
        found = _unsafe_calls(probe)
    finally:
        probe.unlink()
    assert [f.split(" ", 1)[1] for f in found] == [
        "import pickle",
        "torch.load without weights_only=True",
        "eval()",
    ]


def test_cross_service_payloads_are_msgpack_and_json() -> None:
    """The trajectory codec is msgpack (a pickle payload is rejected, not executed)."""
    import pickle  # only to build the hostile payload

    from llds_proto.codec import CodecError, decode_group

    class Boom:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, ("touch /tmp/llds-pwned",))

    with pytest.raises(CodecError):
        decode_group(pickle.dumps(Boom()))
    assert not Path("/tmp/llds-pwned").exists()


# ---------------------------------------------------------------------------- admin auth


def test_every_admin_route_compares_tokens_in_constant_time() -> None:
    with_admin = [p for p in _py_files() if '"/admin' in p.read_text() and "@app." in p.read_text()]
    assert with_admin, "no service with admin routes found"
    for p in with_admin:
        src = p.read_text()
        assert "hmac.compare_digest" in src or "secrets.compare_digest" in src, p
        tree = ast.parse(src)
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare) and any(isinstance(o, (ast.Eq, ast.NotEq)) for o in node.ops):
                names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | {
                    n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                }
                assert not names & {"token", "admin_token", "given"}, (
                    f"{p}:{node.lineno} compares a token with =="
                )


# ---------------------------------------------------------------------------- loopback


def test_every_service_binds_loopback_by_default() -> None:
    from llds.dashboard import DashboardConfig
    from llds.up import UpConfig
    from llds_retriever.config import RetrieverConfig
    from llds_rollout.config import RolloutSettings
    from llds_trainer.config import TrainerConfig

    for cls in (RetrieverConfig, RolloutSettings, TrainerConfig, DashboardConfig, UpConfig):
        assert cls.model_fields["host"].default == "127.0.0.1", cls.__name__
    assert RedisServer(data_dir=Path("unused")).host == "127.0.0.1"


def test_llds_up_passes_loopback_to_every_child(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from llds import supervisor
    from llds.up import Up, UpConfig

    started: list[tuple[str, list[str]]] = []
    redis_hosts: list[str] = []
    passwords: list[str | None] = []

    def fake_start(self: supervisor.Child, echo: bool = True) -> supervisor.Child:
        started.append((self.name, self.argv))
        return self

    def fake_redis_start(self: RedisServer, timeout_s: float = 15.0) -> RedisServer:
        redis_hosts.append(self.host)
        passwords.append(self.password)
        return self

    monkeypatch.setattr(supervisor.Child, "start", fake_start)
    monkeypatch.setattr(supervisor, "wait_healthy", lambda *a, **k: 0.0)
    monkeypatch.setattr(RedisServer, "start", fake_redis_start)
    monkeypatch.delenv("REDIS_URL", raising=False)
    up = Up(UpConfig(preset="tiny", run_dir=tmp_path, retriever_port=0, rollout_port=0, trainer_port=0,
                     dashboard_port=0, redis_port=0))  # fmt: skip
    up.start({"world": tmp_path, "index": tmp_path, "policy": tmp_path})
    assert redis_hosts == ["127.0.0.1"]
    # Its Redis has a password (issue 30: else any local user could register a replica URL), kept
    # owner-only in the run dir and the same on a resume; the children get it in the env only.
    (password,) = passwords
    assert password and len(password) >= 32 and up.redis_url.startswith(f"redis://:{password}@")
    kept = tmp_path / "redis" / "password"
    assert kept.read_text().strip() == password and stat.S_IMODE(kept.stat().st_mode) == 0o600
    assert Up(up.cfg, resume=True).redis_password() == password
    for name, argv in started:
        assert password not in " ".join(argv), name
    for conf in (tmp_path / "configs").glob("*.resolved.toml"):
        assert password not in conf.read_text(), conf
    assert [n for n, _ in started] == ["retriever", "rollout", "trainer", "dashboard"]
    for name, argv in started:
        if "--host" in argv:  # retriever, dashboard
            assert argv[argv.index("--host") + 1] == "127.0.0.1", (name, argv)
        else:  # rollout, trainer: their one resolved config file
            resolved = tomllib.loads(Path(argv[argv.index("--config") + 1]).read_text())
            assert resolved["host"] == "127.0.0.1", (name, resolved)
            for key in ("retriever_url", "redis_url"):
                if key in resolved:
                    host = resolved[key].split("//", 1)[1].rpartition("@")[2]  # the password is left out
                    assert host.startswith("127.0.0.1:"), (name, resolved)
        for flag in ("--retriever-url", "--redis-url", "--rollout-url", "--trainer-url"):
            if flag in argv:
                assert argv[argv.index(flag) + 1].split("//", 1)[1].startswith("127.0.0.1:"), (name, argv)


# ---------------------------------------------------------------------------- body size


def _post_raw(host: str, port: int, path: str, headers: list[str], body: bytes) -> int:
    """A hand-written HTTP/1.1 request (chunked bodies, lying Content-Length); returns the status."""
    with socket.create_connection((host, port), timeout=30) as s:
        head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n"
        s.sendall(head.encode())
        try:
            s.sendall(body)
        except OSError:
            pass  # the server may answer 413 and close before reading everything
        data = b""
        while b"\r\n" not in data:
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1])


def _chunked(payload: bytes, size: int = 64 * 1024) -> bytes:
    out = b""
    for i in range(0, len(payload), size):
        part = payload[i : i + size]
        out += f"{len(part):x}\r\n".encode() + part + b"\r\n"
    return out + b"0\r\n\r\n"


@pytest.fixture(scope="module")
def post_services(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """The two services with POST routes, in-process on loopback, with small body limits."""
    from llds_retriever.app import create_app as retriever_app
    from llds_retriever.config import RetrieverConfig
    from llds_rollout.app import create_app as rollout_app
    from llds_rollout.config import RolloutSettings
    from llds_server.http import BackgroundServer

    empty = tmp_path_factory.mktemp("no-index")
    rcfg = RetrieverConfig(index_dir=empty, max_body_bytes=4096)
    ocfg = RolloutSettings.load(
        overrides={"model": str(tiny_model_dir), "train": False, "max_body_bytes": 4096, "admin_token": TOKEN,
                   "weights_root": tmp_path_factory.mktemp("weights"), "retriever_url": f"http://127.0.0.1:{free_port()}"}
    )  # fmt: skip
    with BackgroundServer(retriever_app(rcfg)) as r, BackgroundServer(rollout_app(ocfg)) as o:
        yield {
            "retriever": (r.port, "/retrieve"),
            "rollout": (o.port, "/answer"),
            "rollout-admin": (o.port, "/admin/weights"),
        }


@pytest.mark.parametrize("svc", ["retriever", "rollout", "rollout-admin"])
def test_oversized_bodies_get_413(post_services: dict[str, tuple[int, str]], svc: str) -> None:
    port, path = post_services[svc]
    url = f"http://127.0.0.1:{port}{path}"
    big = json.dumps({"question": "x" * 10_000, "queries": ["x" * 10_000]}).encode()
    auth = [f"Authorization: Bearer {TOKEN}"] if "admin" in svc else []
    # declared length over the limit
    r = httpx.post(
        url, content=big, headers={"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    )
    assert r.status_code == 413, r.text
    assert "limit" in r.json()["detail"]
    # chunked: no length declared, cut off while streaming
    status = _post_raw("127.0.0.1", port, path, ["Content-Type: application/json", "Transfer-Encoding: chunked", *auth],
                       _chunked(big))  # fmt: skip
    assert status == 413
    # a garbage Content-Length
    status = _post_raw(
        "127.0.0.1", port, path, ["Content-Type: application/json", "Content-Length: 12abc", *auth], b"{}"
    )
    assert status in (400, 413)
    # a body under the limit is not refused for its size
    small = httpx.post(
        url, json={"question": "q", "queries": ["q"]}, headers={"Authorization": f"Bearer {TOKEN}"}
    )
    assert small.status_code != 413


def test_services_without_post_routes_take_no_bodies(tmp_path: Path) -> None:
    """Trainer and dashboard are read-only: no route accepts a request body at all."""
    from llds.dashboard import DashboardConfig
    from llds.dashboard import create_app as dashboard_app
    from llds_trainer.app import create_app as trainer_app
    from llds_trainer.config import TrainerConfig
    from llds_trainer.service import TrainerService

    for app in (trainer_app(TrainerService(TrainerConfig(run_dir=str(tmp_path)))),
                dashboard_app(DashboardConfig(), poll=False)):  # fmt: skip
        for path, ops in app.openapi()["paths"].items():
            for method, op in ops.items():
                assert method == "get" and "requestBody" not in op, (path, method)


# ---------------------------------------------------------------------------- weight paths


def test_weight_paths_are_confined_to_the_weights_root(tmp_path: Path) -> None:
    from llds_rollout.weights import WeightsError, resolve_folder, verify_published, write_marker

    root = tmp_path / "weights"
    good = root / "v000001"
    good.mkdir(parents=True)
    (good / "model.safetensors").write_bytes(b"x")
    write_marker(good, 1)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.safetensors").write_bytes(b"s")
    (root / "link-out").symlink_to(outside, target_is_directory=True)
    nested = root / "v000002"
    nested.mkdir()
    (nested / "inner").symlink_to(outside, target_is_directory=True)
    # a published folder whose file is a symlink to a file outside the root
    sneaky = root / "v000003"
    sneaky.mkdir()
    (sneaky / "model.safetensors").symlink_to(outside / "secret.safetensors")
    write_marker(sneaky, 3)

    assert resolve_folder(root, "v000001") == good.resolve()
    assert resolve_folder(root, "./v000001/../v000001") == good.resolve()
    for rel in ["..", ".", "", "../outside", "v000001/../../outside", str(outside), "/etc", "link-out",
                "v000002/inner", "v000001/model.safetensors", "nope", "v000001\x00", "\x00", "a" * 5000,
                "~", "~root"]:  # fmt: skip
        with pytest.raises(WeightsError):
            resolve_folder(root, rel)
    with pytest.raises(WeightsError, match="not a regular file"):
        verify_published(root, "v000003", 3)


# ---------------------------------------------------------------------------- redis password


def test_redis_password_is_required_and_works_through_urls(tmp_path: Path) -> None:
    from llds_proto import streams
    from llds_trainer.queue import StreamQueue

    with RedisServer(data_dir=tmp_path, password="pa55-word") as server:
        assert server.url.startswith("redis://:pa55-word@127.0.0.1:")
        no_auth = f"redis://127.0.0.1:{server.port}/0"
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(no_auth).xadd(streams.DEFAULT_KEYS.stream, {"group": b"x"})
        with pytest.raises(redis.AuthenticationError):
            redis.Redis.from_url(f"redis://:wrong@127.0.0.1:{server.port}/0").ping()
        # what the services do: a client from the URL (sync for the trainer, asyncio for the rollout)
        client = redis.Redis.from_url(server.url)
        client.xadd(streams.DEFAULT_KEYS.stream, {streams.GROUP_FIELD: b"not-a-group"})
        q = StreamQueue(client, "trainer-0", block_ms=100)
        q.ensure_group()
        got = q.fetch(1, lambda: False)
        assert len(got) == 1 and got[0].group is None and got[0].error

        import asyncio

        import redis.asyncio as aioredis

        async def _async_ping() -> bool:
            c = aioredis.Redis.from_url(server.url)
            try:
                return bool(await c.ping())
            finally:
                await c.aclose()

        assert asyncio.run(_async_ping())
        # Not on the command line, which every local user reads; in a file only its owner reads.
        assert server.proc is not None
        assert "pa55-word" not in Path(f"/proc/{server.proc.pid}/cmdline").read_bytes().decode()
        assert stat.S_IMODE((tmp_path / "auth.conf").stat().st_mode) == 0o600
