"""``python -m llds_rollout [serve|answer|bench] ...``; the guard matters: vLLM spawns processes."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    commands = {"serve": "serve_main", "answer": "answer_main"}
    if not argv or argv[0] not in (*commands, "bench"):
        print("usage: python -m llds_rollout {serve|answer|bench} ...", file=sys.stderr)
        return 2
    if argv[0] == "bench":
        from llds_rollout import bench

        return bench.main(argv[1:])
    from llds_rollout import cli

    return int(getattr(cli, commands[argv[0]])(argv[1:]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
