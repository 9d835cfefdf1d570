"""``llds bench all``: run every benchmark and regenerate BENCHMARKS.md.

Each service benchmark measures against its own baseline in the same run and writes a Markdown
section (``docs/<service>_bench.md``); this stitches them, with the command that produced each,
into BENCHMARKS.md.

    llds bench all [--quick] [--only retriever,trainer]
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
    extra = ROOT / "docs" / "load_bench.md"
    if extra.exists():
        parts.append(extra.read_text().strip() + "\n")
    out.write_text("\n".join(parts))
    return out


QUICK_ARGS = {
    "retriever": ["--quick"],
    "rollout": ["--trajectories", "8", "--no-swap"],
    "trainer": ["--groups", "1", "--group-size", "2", "--repeats", "1"],
}
"""Smoke-size arguments of each benchmark for ``--quick``."""


def _with_default_model(argv: list[str]) -> list[str]:
    """The rollout and trainer benchmarks measure the default policy unless ``--model`` is given."""
    if any(a == "--model" or a.startswith("--model=") for a in argv):
        return argv
    from llds.assets import smollm2_dir

    return ["--model", str(smollm2_dir()), *argv]


def rollout_main(argv: list[str]) -> int:
    """``llds bench rollout``: the rollout benchmark on SmolLM2 by default."""
    from llds_rollout.bench import main as bench_main

    return bench_main(_with_default_model(argv))


def trainer_main(argv: list[str]) -> int:
    """``llds bench trainer``: the trainer benchmark on SmolLM2 by default."""
    from llds_trainer.bench import main as bench_main

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
