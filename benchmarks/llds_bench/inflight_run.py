"""The inflight run: ``llds up`` with weights swapped under running requests and groups trained up to 2
versions behind, for 50 steps; its sampler/trainer mismatch per step, summarised.

    llds up --preset tiny --steps 50 --rollout-config docs/inflight-run/rollout.toml \\
        --trainer-config docs/inflight-run/trainer.toml --run-dir runs/inflight50 --exit-when-done
    python -m llds_bench.inflight_run runs/inflight50 --out docs/inflight-run

writes ``OUT/steps.jsonl`` (the step log's mismatch and staleness keys, one line a step) and
``OUT/report.md`` (the table, rebuilt from ``steps.jsonl`` alone with ``--report-only``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from llds_proto import steplog as K

KEYS = [
    K.STEP, K.MISMATCH_KL, K.MISMATCH_ABS_LOGP_DIFF, K.DATA_LOSS_TOKENS, K.DATA_STALE_TOKENS,
    K.DATA_MIXED_VERSION_TRAJECTORIES, K.DATA_TRAJECTORIES, K.IS_WEIGHT_MEAN, K.IS_TRUNCATED_FRAC,
    K.IS_RATIO_P1_STALE0, K.IS_RATIO_P50_STALE0, K.IS_RATIO_P99_STALE0,
    K.IS_RATIO_P1_STALE1, K.IS_RATIO_P50_STALE1, K.IS_RATIO_P99_STALE1,
    K.IS_RATIO_P1_STALE2PLUS, K.IS_RATIO_P50_STALE2PLUS, K.IS_RATIO_P99_STALE2PLUS, K.PERF_STEP_S,
]  # fmt: skip
"""Step-log keys kept in ``steps.jsonl``."""


def compact(train_log: Path) -> list[dict[str, Any]]:
    return [{k: r[k] for k in KEYS if k in r} for r in K.read_records(train_log)]


def _finite(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r[key]) for r in rows if isinstance(r.get(key), int | float) and math.isfinite(r[key])]


def report(rows: list[dict[str, Any]]) -> str:
    def span(key: str, fmt: str = ".2g") -> str:
        xs = _finite(rows, key)
        return f"{min(xs):{fmt}} .. {max(xs):{fmt}} (median {sorted(xs)[len(xs) // 2]:{fmt}})" if xs else "-"

    half = len(rows) // 2
    first, second = rows[:half], rows[half:]

    def mean(rs: list[dict[str, Any]], key: str) -> str:
        xs = _finite(rs, key)
        return f"{sum(xs) / len(xs):.2g}" if xs else "-"

    tokens = sum(int(r.get(K.DATA_LOSS_TOKENS, 0)) for r in rows)
    stale = sum(int(r.get(K.DATA_STALE_TOKENS, 0)) for r in rows)
    trajs = sum(int(r.get(K.DATA_TRAJECTORIES, 0)) for r in rows)
    mixed = sum(int(r.get(K.DATA_MIXED_VERSION_TRAJECTORIES, 0)) for r in rows)
    lines = [
        f"{len(rows)} steps, {trajs} trajectories, {tokens} loss tokens, of which {stale} stale "
        f"({100 * stale / max(1, tokens):.0f}%); {mixed} trajectories hold tokens of more than one version.",
        "",
        "| figure | range over the steps | mean, first half / second half |",
        "|---|---|---|",
        f"| `{K.MISMATCH_KL}` (KL(sampler \\|\\| pi_old), k3) | {span(K.MISMATCH_KL)} | "
        f"{mean(first, K.MISMATCH_KL)} / {mean(second, K.MISMATCH_KL)} |",
        f"| `{K.MISMATCH_ABS_LOGP_DIFF}` | {span(K.MISMATCH_ABS_LOGP_DIFF)} | "
        f"{mean(first, K.MISMATCH_ABS_LOGP_DIFF)} / {mean(second, K.MISMATCH_ABS_LOGP_DIFF)} |",
        f"| `{K.IS_WEIGHT_MEAN}` | {span(K.IS_WEIGHT_MEAN, '.4f')} | "
        f"{mean(first, K.IS_WEIGHT_MEAN)} / {mean(second, K.IS_WEIGHT_MEAN)} |",
    ]
    for b, (p1, p50, p99) in enumerate(
        [(K.IS_RATIO_P1_STALE0, K.IS_RATIO_P50_STALE0, K.IS_RATIO_P99_STALE0),
         (K.IS_RATIO_P1_STALE1, K.IS_RATIO_P50_STALE1, K.IS_RATIO_P99_STALE1),
         (K.IS_RATIO_P1_STALE2PLUS, K.IS_RATIO_P50_STALE2PLUS, K.IS_RATIO_P99_STALE2PLUS)]
    ):  # fmt: skip
        steps = len(_finite(rows, p50))
        label = f"{b}{'+' if b == 2 else ''} versions behind"
        lines.append(
            f"| ratio pi_old / sampler, {label} ({steps} steps with such tokens): p1 / p50 / p99 | "
            f"{span(p1, '.4f')} / {span(p50, '.4f')} / {span(p99, '.4f')} | {mean(first, p99)} / {mean(second, p99)} (p99) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="python -m llds_bench.inflight_run", description=__doc__.split("\n\n")[0]
    )
    p.add_argument("run_dir", type=Path, nargs="?", help="the run's folder (llds up --run-dir)")
    p.add_argument("--out", type=Path, required=True, help="folder for steps.jsonl and report.md")
    p.add_argument("--report-only", action="store_true", help="rebuild report.md from OUT/steps.jsonl")
    args = p.parse_args(argv)
    steps = args.out / "steps.jsonl"
    if not args.report_only:
        if args.run_dir is None:
            p.error("give the run's folder, or --report-only")
        log = args.run_dir / "trainer" / "train_log.jsonl"
        if not log.is_file():
            p.error(f"{log} does not exist: is {args.run_dir} an llds up run folder?")
        args.out.mkdir(parents=True, exist_ok=True)
        steps.write_text("".join(json.dumps(r) + "\n" for r in compact(log)))
    rows = [json.loads(line) for line in steps.read_text().splitlines() if line.strip()]
    (args.out / "report.md").write_text(report(rows))
    print(report(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
