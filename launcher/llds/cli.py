"""``llds``: one command line for the whole system.

``llds up`` runs everything on one machine; the other subcommands start one service or tool each
and hand their arguments to that service's own entrypoint, so ``llds rollout serve --help`` is the
rollout's help. Imports are lazy: ``llds --help`` does not import torch.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable

# subcommand path -> (module, function, help). Each function takes the remaining argv.
ROUTES: dict[tuple[str, ...], tuple[str, str, str]] = {
    ("up",): (
        "llds.up",
        "main",
        "run the whole system on this machine (Redis, retriever, rollout, trainer, dashboard)",
    ),
    ("answer",): ("llds_rollout.cli", "answer_main", "answer a question with the search agent"),
    ("retriever", "serve"): ("llds_retriever.cli", "serve_main", "serve POST /retrieve"),
    ("index", "build"): ("llds_retriever.cli", "index_main", "build a BM25 / dense / hybrid index"),
    ("index", "info"): ("llds_retriever.cli", "index_main", "print what an index holds"),
    ("rollout", "serve"): (
        "llds_rollout.cli",
        "serve_main",
        "serve /answer and generate training trajectories",
    ),
    ("trainer", "run"): ("llds_trainer.cli", "run_main", "train with GRPO + LLDS from the trajectory stream"),
    ("warmstart",): ("llds_trainer.warmstart", "main", "fine-tune the policy on protocol demonstrations"),
    ("world", "build"): ("llds.world", "main", "write the synthetic world (corpus + questions)"),
    ("dashboard", "serve"): ("llds.dashboard", "main", "serve the live training dashboard"),
    ("eval",): ("llds.evaluate", "main", "evaluate a policy (exact match, F1) on a question set"),
    ("report",): ("llds.report", "main", "plot a run's reward and LLD signals"),
    ("experiment", "lld"): (
        "llds.experiment",
        "main",
        "GRPO vs GRPO+LLDS vs GRPO+LLDS-MA on the default task",
    ),
    ("bench", "retriever"): ("llds_retriever.bench", "main", "retriever throughput and latency vs baseline"),
    ("bench", "rollout"): ("llds.bench", "rollout_main", "async vs synchronous rollout, swap time"),
    ("bench", "trainer"): ("llds.bench", "trainer_main", "GRPO vs GRPO+LLDS step time"),
    ("bench", "all"): ("llds.bench", "main", "run every benchmark and regenerate BENCHMARKS.md"),
    ("assets",): ("llds.assets", "main", "build the offline model assets (SmolLM2, tiny test model)"),
}

# Subcommands whose routed function still expects the sub-verb ("build"/"info") in argv.
_KEEP_VERB = {("index", "build"), ("index", "info"), ("world", "build")}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser; each leaf takes the rest of the command line as its own arguments."""
    parser = argparse.ArgumentParser(prog="llds", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}  # type: ignore[type-arg]
    for path, (_, _, help_) in ROUTES.items():
        if len(path) == 1:
            p = sub.add_parser(path[0], help=help_, add_help=False)
            p.add_argument("args", nargs=argparse.REMAINDER)
            continue
        if path[0] not in groups:
            g = sub.add_parser(path[0], help=f"{path[0]} commands")
            groups[path[0]] = g.add_subparsers(dest="verb", required=True, metavar="VERB")
        leaf = groups[path[0]].add_parser(path[1], help=help_, add_help=False)
        leaf.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def resolve(argv: list[str]) -> tuple[Callable[[list[str]], int], list[str]]:
    """Map a command line to (entry function, its argv); argparse reports unknown commands."""
    for n in (2, 1):
        path = tuple(argv[:n])
        if len(path) == n and path in ROUTES:
            module_name, func_name, _ = ROUTES[path]
            rest = list(argv[n:])
            if path in _KEEP_VERB:
                rest = [path[1], *rest]
            module = importlib.import_module(module_name)
            return getattr(module, func_name), rest
    build_parser().parse_args(argv)  # prints usage and exits for unknown or incomplete commands
    raise SystemExit(2)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    func, rest = resolve(argv)
    try:
        return int(func(rest) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
