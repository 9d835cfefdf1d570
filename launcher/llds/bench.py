"""``llds bench all``: run every benchmark and regenerate BENCHMARKS.md.

Each service benchmark measures against its own baseline in the same run and writes a Markdown
section (``docs/<service>_bench.md``); this stitches them, with the command that produced each,
into BENCHMARKS.md.

    llds bench all [--quick] [--only retriever,trainer]

The soak (``llds bench soak``, launcher/llds/soak.py) runs for many minutes, so ``all`` does not run
it; its section (``docs/soak_bench.md``, written by ``llds bench soak --out``) is stitched in too.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = ("retriever", "rollout", "trainer")

HEADER = """# Benchmarks

Every figure here comes from a benchmark in this repository, measured as a ratio against a baseline
run in the same process or run, on the machine named in each section. Regenerate everything with
`llds bench all` (or one section with `llds bench <service>`); each section names its own command.
"""


SOAK_PLACEHOLDER = """# Soak: `llds up` for many steps, nothing may keep growing

Not measured yet. Command: `llds bench soak --preset tiny --steps 500 --out docs/soak_bench.md`
(then `llds bench all --stitch-only`).

It runs the whole system as `llds up` does and every 10 trainer steps samples, from /proc, each
service's resident memory, open file descriptors and process count (the service and everything in
its session, e.g. vLLM's engine process; the launcher too), Redis `used_memory` and the run's
stream length (XLEN), the run dir's bytes and its checkpoint and weights-version counts, into
`RUN_DIR/soak_samples.jsonl`. Leaving out the first 20% of the steps, it fits each series'
least-squares slope per step; growth = slope x steps measured. The run fails (exit 1, naming the
series) when a checked series grows more than the larger of a fraction of its median and an absolute
floor: memory 10% / 64 MiB, open files 10% / 16, processes 2, Redis memory 10% / 1 MiB, stream
length 16 entries, run-dir state (checkpoints, weights, configs) 25% / 16 MiB, checkpoints and
weight versions 1. Logs and the Redis append-only file grow by design and are reported only.
"""
"""BENCHMARKS.md's soak section until ``llds bench soak --out docs/soak_bench.md`` has run."""


GPU_CHECK_PLACEHOLDER = """# Trainer check (qwen2.5-3b, random weights, cuda)

Not measured yet. Command: `llds bench trainer --device cuda --shape qwen2.5-3b --random-weights
--budget-s 480 --out docs/trainer_gpu_bench.md` on a machine with one GPU (then `llds bench all
--stitch-only`). See docs/trainer.md, "Benchmark and GPU check".
"""
"""BENCHMARKS.md's trainer GPU section until ``llds bench trainer --shape`` has written docs/trainer_gpu_bench.md."""

GPU_CHECK_ALL_PLACEHOLDER = """# GPU check (cuda)

Not run on a GPU yet. Command: `scripts/gpu-check.sh` on a machine with a GPU (it writes
`docs/gpu_check_bench.md`; then `llds bench all --stitch-only`): versions against the images' pins,
faiss on the GPU, `llds up` placement on one and two GPUs, configs/trainer_search_r1.toml at the
longest trajectory (tokens/s, MFU, peak memory), the rollout on vLLM with an in-place weight swap
(swap time). See docs/gpu-check.md.
"""
"""BENCHMARKS.md's section of the whole GPU check until ``scripts/gpu-check.sh`` has written docs/gpu_check_bench.md."""


SWAP_PLACEHOLDER = """## Weight swaps under load, per swap mode

Not measured yet. Command: `llds bench swaps --rollout-config configs/rollout_cpu.toml --out
docs/swap_bench.md` (then `llds bench all --stitch-only`).
"""
"""BENCHMARKS.md's swap section until ``llds bench swaps`` has written ``docs/swap_bench.md``."""


TRAINER_EXTRAS = (
    ("step", "## CPU training step (`cpu-collapse` preset)\n\nNot measured yet. Command: `llds bench step "
     "--steps 8 --warmup 2 --out docs/step_bench.md --json docs/step_bench.json`.\n"),
    ("warmstart", "## Warm start rebuild\n\nNot measured yet. Command: `llds bench warmstart --out "
     "docs/warmstart_bench.md`.\n"),
    ("precision", "## Float32 vs bfloat16 autocast on the CPU\n\nNot measured yet. Command: `python -m "
     "llds_bench.precision --report docs/precision/*.json --out docs/precision_bench.md`.\n"),
)  # fmt: skip
"""Sections after the trainer's (docs/<name>_bench.md), each with its text until its benchmark has run."""


def section_path(name: str) -> Path:
    return ROOT / "docs" / f"{name}_bench.md"


def stitch(out: Path = ROOT / "BENCHMARKS.md") -> Path:
    """Write BENCHMARKS.md from the per-service sections that exist."""
    parts = [HEADER]
    for name in SECTIONS:
        p = section_path(name)
        if p.exists():
            parts.append(p.read_text().strip() + "\n")
        else:
            parts.append(f"## {name}\n\nNot measured yet: run `llds bench {name}`.\n")
        if name == "rollout":
            swaps = section_path("swap")
            parts.append((swaps.read_text() if swaps.exists() else SWAP_PLACEHOLDER).strip() + "\n")
        if name == "trainer":
            gpu = section_path("trainer_gpu")
            parts.append((gpu.read_text() if gpu.exists() else GPU_CHECK_PLACEHOLDER).strip() + "\n")
            check = section_path("gpu_check")
            parts.append((check.read_text() if check.exists() else GPU_CHECK_ALL_PLACEHOLDER).strip() + "\n")
            for extra_name, placeholder in TRAINER_EXTRAS:
                extra_path = section_path(extra_name)
                parts.append((extra_path.read_text() if extra_path.exists() else placeholder).strip() + "\n")
                if extra_name == "step":
                    # Earlier runs of the step benchmark (other settings of this tree), kept as measured.
                    for run in sorted((ROOT / "docs" / "step_bench_runs").glob("*.md")):
                        body = run.read_text().strip().split("\n", 1)[1]
                        parts.append(f"### Earlier run: {run.stem}\n{body}\n")
    extra = ROOT / "docs" / "load_bench.md"
    if extra.exists():
        parts.append(extra.read_text().strip() + "\n")
    soak = section_path("soak")
    parts.append((soak.read_text() if soak.exists() else SOAK_PLACEHOLDER).strip() + "\n")
    out.write_text("\n".join(parts))
    return out


QUICK_ARGS = {
    "retriever": ["--quick"],
    "rollout": ["--trajectories", "8", "--no-swap"],
    "trainer": ["--groups", "1", "--group-size", "2", "--repeats", "1"],
}
"""Smoke-size arguments of each benchmark for ``--quick``."""


def _with_default_model(argv: list[str]) -> list[str]:
    """The rollout and trainer benchmarks measure the default policy unless ``--model`` (or the
    trainer's ``--shape``) is given."""
    if any(
        a in ("--model", "--shape", "-h", "--help") or a.startswith(("--model=", "--shape=")) for a in argv
    ):
        return argv
    from llds.assets import smollm2_dir

    return ["--model", str(smollm2_dir()), *argv]


def rollout_main(argv: list[str]) -> int:
    """``llds bench rollout``: the rollout benchmark on SmolLM2 by default."""
    from llds_bench.rollout import main as bench_main

    return bench_main(_with_default_model(argv))


def swaps_main(argv: list[str]) -> int:
    """``llds bench swaps``: weight swaps under load per swap mode, on SmolLM2 by default."""
    from llds_bench.swaps import main as bench_main

    return bench_main(_with_default_model(argv))


def soak_main(argv: list[str]) -> int:
    """``llds bench soak``: the whole system for N steps, checked for growth."""
    from llds.soak import main as soak

    return soak(argv)


def trainer_main(argv: list[str]) -> int:
    """``llds bench trainer``: the trainer benchmark on SmolLM2 by default (``--shape`` for a random-weight
    architecture, the GPU check)."""
    from llds_bench.trainer import main as bench_main

    return bench_main(_with_default_model(argv))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llds bench all", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke sizes for every benchmark (see QUICK_ARGS)")
    p.add_argument(
        "--only", default=",".join(SECTIONS), help="comma-separated subset of " + ",".join(SECTIONS)
    )
    p.add_argument(
        "--stitch-only", action="store_true", help="only rebuild BENCHMARKS.md from existing sections"
    )
    args = p.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; choose from {list(SECTIONS)}")
    failed = []
    if not args.stitch_only:
        for name in chosen:
            extra = QUICK_ARGS[name] if args.quick else []
            cmd = [sys.executable, "-m", "llds.cli", "bench", name, *extra]
            print(f"$ llds bench {name} {' '.join(extra)}", flush=True)
            t0 = time.monotonic()
            if subprocess.run(cmd).returncode != 0:
                failed.append(name)
            print(f"  {name}: {time.monotonic() - t0:.0f} s", flush=True)
    print(f"wrote {stitch()}")
    if failed:
        print(f"failed: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
