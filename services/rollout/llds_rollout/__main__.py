"""``python -m llds_rollout [serve|answer] ...``; the guard matters: vLLM spawns processes."""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    commands = {"serve": "serve_main", "answer": "answer_main"}
    if not argv or argv[0] not in commands:
        print(
            "usage: python -m llds_rollout {serve|answer} ... (the benchmark: llds bench rollout)",
            file=sys.stderr,
        )
        return 2
    from llds_rollout import cli

    return int(getattr(cli, commands[argv[0]])(argv[1:]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
