"""Container health probe: exit 0 when ``GET URL`` answers 200, 1 otherwise (503 while starting).

Standard library only, so every image can run it without curl or wget:

    python3 /opt/llds/healthcheck.py http://127.0.0.1:8000/health
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: healthcheck.py URL", file=sys.stderr)
        return 2
    try:
        with urllib.request.urlopen(argv[0], timeout=4) as resp:
            return 0 if resp.status == 200 else 1
    except (urllib.error.URLError, OSError) as e:
        print(f"unhealthy: {argv[0]}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
