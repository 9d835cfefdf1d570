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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llds bench all", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="pass --quick to every benchmark (smoke sizes)")
    p.add_argument("--only", default=",".join(SECTIONS), help="comma-separated subset of " + ",".join(SECTIONS))
    p.add_argument("--stitch-only", action="store_true", help="only rebuild BENCHMARKS.md from existing sections")
    args = p.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        p.error(f"unknown benchmark(s) {unknown}; choose from {list(SECTIONS)}")
    failed = []
    if not args.stitch_only:
        for name in chosen:
            cmd = [sys.executable, "-m", "llds.cli", "bench", name] + (["--quick"] if args.quick else [])
            print(f"$ llds bench {name}{' --quick' if args.quick else ''}", flush=True)
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
