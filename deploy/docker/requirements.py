"""Print the project's runtime dependencies from pyproject.toml, one per line, minus excluded names.

The GPU images build on the official vLLM image, whose CUDA torch must stay as it is: they install
the project's other dependencies from this list and the project itself with ``--no-deps``.
Standard library only, so it runs in any base image before anything is installed.

    python3 deploy/docker/requirements.py --exclude torch > /tmp/requirements.txt
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from pathlib import Path

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def normalize(name: str) -> str:
    """PEP 503 normalised distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirements(pyproject: Path, exclude: set[str]) -> list[str]:
    """The ``[project].dependencies`` of ``pyproject`` whose names are not in ``exclude``."""
    deps: list[str] = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    skip = {normalize(n) for n in exclude}
    out = []
    for dep in deps:
        match = _NAME.match(dep)
        if match is None:
            raise ValueError(f"cannot parse dependency {dep!r} in {pyproject}")
        if normalize(match.group(1)) not in skip:
            out.append(dep)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--pyproject", type=Path, default=Path("pyproject.toml"), help="pyproject.toml to read"
    )
    parser.add_argument(
        "--exclude", action="append", default=[], help="distribution name to leave out (repeatable)"
    )
    args = parser.parse_args(argv)
    sys.stdout.write("".join(f"{dep}\n" for dep in requirements(args.pyproject, set(args.exclude))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
