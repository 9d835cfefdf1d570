"""The controlled study's statistics (docs/study/DESIGN.md), from committed per-question files alone.

A study folder holds ``study.json`` (the command: eval steps, planned runs, start digest),
``results.json`` (one entry per run), ``logs/<arm>-s<seed>.jsonl`` (compact step logs) and
``questions/`` (``start-step0.jsonl`` and ``<arm>-s<seed>-step<N>.jsonl``, one ``{"id", "em", ...}``
object a line). :func:`section` turns them into the report's markdown and one figure; nothing is read
from a run folder, so the committed copy regenerates the report byte for byte.

Definitions (declared in the design before the runs):
- a run *learned* when its held-out EM at some checkpoint is at least the start's + :data:`LEARN_DELTA`;
- it is *collapsed at a checkpoint* when its EM there is below half of the best so far (the start and
  its earlier checkpoints), when it answered with 0 searches a question, or when it was stopped dead
  before that step (no weights: EM 0); collapse is sticky;
- it *held* when its last checkpoint's EM is at least the start's.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llds_proto.steplog import read_records

LEARN_DELTA = 0.10
COLLAPSE_FRACTION = 0.5
BOOTSTRAP_DRAWS = 2000
START = "start-step0.jsonl"


@dataclass
class Checkpoint:
    """One run's evaluation at one step (``em`` None: no weights there, the run was stopped dead)."""

    step: int
    em: float | None
    searches: float | None
    per_question: dict[str, float] = field(default_factory=dict)
    collapsed: bool = False

    @property
    def em_or_dead(self) -> float:
        return 0.0 if self.em is None else self.em


@dataclass
class Run:
    arm: str
    seed: int
    checkpoints: list[Checkpoint]
    stopped_dead_at: int | None = None

    @property
    def collapsed(self) -> bool:
        return any(c.collapsed for c in self.checkpoints)

    def learned(self, start_em: float) -> bool:
        return any(c.em is not None and c.em >= start_em + LEARN_DELTA - 1e-12 for c in self.checkpoints)

    def held(self, start_em: float) -> bool | None:
        return self.checkpoints[-1].em_or_dead >= start_em if self.checkpoints else None


def read_questions(path: Path) -> dict[str, dict[str, Any]]:
    """Per-question rows of one evaluation, by question id."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {str(r["id"]): r for r in rows}


def mean_of(rows: dict[str, dict[str, Any]], key: str) -> float:
    return sum(float(r[key]) for r in rows.values()) / len(rows) if rows else 0.0


def build_runs(folder: Path, steps: list[int], planned: list[tuple[str, int]],
               results: list[dict[str, Any]], start_em: float) -> list[Run]:  # fmt: skip
    """The planned runs with the checkpoints they have (a step a run has not reached yet is left out;
    a step after it was stopped dead is a dead checkpoint), collapse marked by the definitions."""
    by = {(r["arm"], int(r["seed"])): r for r in results}
    runs = []
    for arm, seed in planned:
        res = by.get((arm, seed))
        dead_at = res.get("stopped_dead_at") if res else None
        cps: list[Checkpoint] = []
        best = start_em
        collapsed = False
        for step in steps:
            path = folder / "questions" / f"{arm}-s{seed}-step{step}.jsonl"
            if path.is_file():
                rows = read_questions(path)
                em, searches = mean_of(rows, "em"), mean_of(rows, "searches")
                cp = Checkpoint(step, em, searches, {k: float(r["em"]) for k, r in rows.items()})
                collapsed = collapsed or em < COLLAPSE_FRACTION * best or searches == 0
                best = max(best, em)
            elif dead_at is not None and step > int(dead_at):
                cp = Checkpoint(step, None, None)
                collapsed = True
            else:
                continue  # not evaluated yet
            cp.collapsed = collapsed
            cps.append(cp)
        runs.append(Run(arm, seed, cps, dead_at))
    return runs


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    """Mean and a 95% t interval over ``xs`` (the interval is the mean itself for one value)."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, m, m
    from scipy.stats import t

    h = t.ppf(0.975, len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))
    return m, m - h, m + h


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    """Exact 95% interval of a proportion k/n."""
    from scipy.stats import beta

    lo = 0.0 if k == 0 else float(beta.ppf(0.025, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(0.975, k + 1, n - k))
    return lo, hi


def mcnemar_p(only_a: int, only_b: int) -> float:
    """Exact two-sided McNemar p-value: a binomial test of the discordant pairs at 1/2."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    k = min(only_a, only_b)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def paired(a: dict[int, dict[str, float]], b: dict[int, dict[str, float]],
           draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> dict[str, Any] | None:  # fmt: skip
    """Arm A against arm B at one checkpoint: ``a``/``b`` map a seed to its per-question EM (a dead
    checkpoint: every question 0). Pairs are (seed, question) present in both. Returns the EM
    difference A - B, its 95% bootstrap interval (seeds resampled, then questions within each), the
    discordant counts and the exact McNemar p-value; None without a common seed."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    pairs = {s: [(a[s][q], b[s][q]) for q in sorted(set(a[s]) & set(b[s]))] for s in seeds}
    flat = [d for s in seeds for d in pairs[s]]
    only_a = sum(1 for x, y in flat if x > y)
    only_b = sum(1 for x, y in flat if y > x)
    diff = sum(x - y for x, y in flat) / len(flat)
    rng = random.Random(seed)
    boots = []
    for _ in range(draws):
        tot = n = 0.0
        for s in rng.choices(seeds, k=len(seeds)):
            qs = pairs[s]
            for x, y in rng.choices(qs, k=len(qs)):
                tot += x - y
                n += 1
        boots.append(tot / n)
    boots.sort()
    lo, hi = boots[int(0.025 * draws)], boots[int(0.975 * draws) - 1]
    return {"diff": diff, "lo": lo, "hi": hi, "only_a": only_a, "only_b": only_b,
            "p": mcnemar_p(only_a, only_b), "seeds": len(seeds), "pairs": len(flat)}  # fmt: skip


def per_question(run: Run, step: int, ids: list[str]) -> dict[str, float] | None:
    """A run's per-question EM at ``step`` (every question 0 on a dead checkpoint), None if absent."""
    for c in run.checkpoints:
        if c.step == step:
            return c.per_question if c.em is not None else dict.fromkeys(ids, 0.0)
    return None


def reward_window(log: list[dict[str, Any]], window: int = 10) -> tuple[float | None, float | None]:
    """Best and last full-window moving mean of training reward (``None``: fewer steps than the window)."""
    r = [float(x["reward/mean"]) for x in log if x.get("reward/mean") is not None]
    if len(r) < window:
        return None, None
    means = [statistics.fmean(r[i - window : i]) for i in range(window, len(r) + 1)]
    return max(means), means[-1]


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def section(folder: Path, arms_order: list[str], baseline_arm: str = "grpo") -> tuple[list[str], list[Path]]:
    """The study's report (markdown lines) and its figure, from ``folder``'s committed files."""
    study = json.loads((folder / "study.json").read_text())
    results = json.loads((folder / "results.json").read_text()) if (folder / "results.json").is_file() else []
    steps = [int(x) for x in study.get("eval_steps") or []]
    planned = [(str(a), int(s)) for a, s in study.get("planned", [])]
    start_rows = read_questions(folder / "questions" / START)
    ids = sorted(start_rows)
    start_em = mean_of(start_rows, "em")
    runs = build_runs(folder, steps, planned, results, start_em)
    arms = [a for a in arms_order if any(r.arm == a for r in runs)]
    arms += sorted({r.arm for r in runs} - set(arms))
    digests = sorted({str(r.get("start_digest")) for r in results})
    lines = [
        f"Start: `{study.get('start', '?')}`, tensors digest `{study.get('start_digest')}` "
        f"(every run's recorded start: {', '.join(f'`{d}`' for d in digests) or 'none yet'}); greedy held-out EM "
        f"{start_em:.3f} on {len(ids)} questions, {mean_of(start_rows, 'searches'):.2f} searches a question. "
        f"Preset `{study.get('preset')}`, {study.get('steps')} steps"
        + (f", trainer overrides `{' '.join(study['trainer_set'])}`" if study.get("trainer_set") else "")
        + ".",
        "",
        "### Held-out EM by checkpoint (mean over seeds, 95% t interval; a dead checkpoint counts 0)",
        "",
        "| arm | runs | " + " | ".join(f"step {s}" for s in steps) + " |",
        "|---|---|" + "---|" * len(steps),
    ]
    for arm in arms:
        mine = [r for r in runs if r.arm == arm]
        cells = []
        for s in steps:
            xs = [c.em_or_dead for r in mine for c in r.checkpoints if c.step == s]
            if not xs:
                cells.append("-")
                continue
            m, lo, hi = t_interval(xs)
            cells.append(f"{m:.3f} [{lo:.3f}, {hi:.3f}] (n={len(xs)})")
        lines.append(f"| {arm} | {len(mine)} | " + " | ".join(cells) + " |")
    lines += ["", "### Runs", "",
              "| run | " + " | ".join(f"EM@{s}" for s in steps) + " | learned | collapsed | held | reward 10-step mean (best / last) |",
              "|---|" + "---|" * (len(steps) + 4)]  # fmt: skip
    logs = folder / "logs"
    for r in runs:
        cps = {c.step: c for c in r.checkpoints}
        cells = []
        for s in steps:
            c = cps.get(s)
            cells.append(
                "-"
                if c is None
                else ("dead" if c.em is None else f"{c.em:.3f}") + (" (c)" if c and c.collapsed else "")
            )
        path = logs / f"{r.arm}-s{r.seed}.jsonl"
        log = read_records(path)
        best, last = reward_window(log)
        held = r.held(start_em)
        lines.append(f"| {r.arm}-s{r.seed} | " + " | ".join(cells)
                     + f" | {'yes' if r.learned(start_em) else 'no'} | {'yes' if r.collapsed else 'no'} | "
                     + ("-" if held is None else "yes" if held else "no") + f" | {_f(best)} / {_f(last)} |")  # fmt: skip
    lines += ["", "(c): collapsed at or before that checkpoint (the design's definition).", "",
              "### Per arm", "", "| arm | runs evaluated | learned | collapsed (95% CI) | held |", "|---|---|---|---|---|"]  # fmt: skip
    for arm in arms:
        mine = [r for r in runs if r.arm == arm and r.checkpoints]
        if not mine:
            continue
        k = sum(r.collapsed for r in mine)
        lo, hi = clopper_pearson(k, len(mine))
        lines.append(f"| {arm} | {len(mine)} | {sum(r.learned(start_em) for r in mine)} | {k} [{lo:.2f}, {hi:.2f}] | "
                     f"{sum(bool(r.held(start_em)) for r in mine)} |")  # fmt: skip
    lines += ["", f"### Paired per question against `{baseline_arm}` (pairs: same seed, same question)", "",
              "| arm | step | EM difference [95% bootstrap] | only this arm right | only baseline right | exact McNemar p | seeds |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    base_runs = {r.seed: r for r in runs if r.arm == baseline_arm}
    for arm in arms:
        if arm == baseline_arm:
            continue
        by_seed = {r.seed: r for r in runs if r.arm == arm}
        for s in steps:
            a = {sd: q for sd, r in by_seed.items() if (q := per_question(r, s, ids)) is not None}
            b = {sd: q for sd, r in base_runs.items() if (q := per_question(r, s, ids)) is not None}
            p = paired(a, b)
            if p is None:
                continue
            lines.append(f"| {arm} | {s} | {p['diff']:+.3f} [{p['lo']:+.3f}, {p['hi']:+.3f}] | {p['only_a']} | "
                         f"{p['only_b']} | {p['p']:.3g} | {p['seeds']} |")  # fmt: skip
    lines += ["", "### Each run against the start (paired per question)", "",
              "| run | step | EM difference [95% bootstrap] | gained | lost | exact McNemar p |", "|---|---|---|---|---|---|"]  # fmt: skip
    start_q = {k: float(r["em"]) for k, r in start_rows.items()}
    for r in runs:
        for c in r.checkpoints:
            q = per_question(r, c.step, ids)
            p = paired({0: q}, {0: start_q}) if q is not None else None
            if p is not None:
                lines.append(f"| {r.arm}-s{r.seed} | {c.step} | {p['diff']:+.3f} [{p['lo']:+.3f}, {p['hi']:+.3f}] | "
                             f"{p['only_a']} | {p['only_b']} | {p['p']:.3g} |")  # fmt: skip
    lines += lld_table(folder, runs, arms, steps)
    figure = plot(folder, runs, arms, steps, start_em)
    lines += ["", f"![held-out EM by checkpoint]({figure.name})", ""]
    return lines, [figure]


def lld_table(folder: Path, runs: list[Run], arms: list[str], steps: list[int]) -> list[str]:
    """Likelihood displacement as the paper measures it: the change, from the start, of the fixed probe
    set's mean log-probability per assistant token (OUT/lld/), per arm and checkpoint."""
    start_path = folder / "lld" / "start.json"
    if not start_path.is_file():
        return []
    start = json.loads(start_path.read_text())
    base = float(start["logp_token"]["0"])
    lines = ["", f"### Likelihood of a fixed set of correct trajectories (change from the start's {base:.3f} nats a token)",
             "", f"{start['count']} protocol demonstrations of train-split rows {start['first']}.. (no start was trained on "
             "them), re-scored under each checkpoint (`llds trainer probe-lld`); mean over seeds, 95% t interval.", "",
             "| arm | " + " | ".join(f"step {s}" for s in steps) + " |", "|---|" + "---|" * len(steps)]  # fmt: skip
    for arm in arms:
        per_run = []
        for r in runs:
            path = folder / "lld" / f"{r.arm}-s{r.seed}.json"
            if r.arm == arm and path.is_file():
                per_run.append(json.loads(path.read_text())["logp_token"])
        cells = []
        for s in steps:
            xs = [float(d[str(s)]) - base for d in per_run if str(s) in d]
            if xs:
                m, lo, hi = t_interval(xs)
                cells.append(f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}] (n={len(xs)})")
            else:
                cells.append("-")
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    return lines


def plot(folder: Path, runs: list[Run], arms: list[str], steps: list[int], start_em: float) -> Path:
    """Held-out EM over checkpoints: each run thin, each arm's mean with its 95% interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, arm in enumerate(arms):
        color = f"C{i}"
        mine = [r for r in runs if r.arm == arm]
        for r in mine:
            ax.plot([0] + [c.step for c in r.checkpoints], [start_em] + [c.em_or_dead for c in r.checkpoints],
                    color=color, alpha=0.25, lw=0.8)  # fmt: skip
        xs, ms, los, his = [0], [start_em], [start_em], [start_em]
        for s in steps:
            vals = [c.em_or_dead for r in mine for c in r.checkpoints if c.step == s]
            if vals:
                m, lo, hi = t_interval(vals)
                xs.append(s), ms.append(m), los.append(lo), his.append(hi)  # type: ignore[func-returns-value]
        ax.plot(xs, ms, color=color, lw=2, label=f"{arm} ({len(mine)} runs)")
        ax.fill_between(xs, los, his, color=color, alpha=0.12)
    ax.axhline(start_em, color="k", ls=":", lw=1, label="start")
    ax.axhline(start_em + LEARN_DELTA, color="k", ls="--", lw=0.8, label=f"start + {LEARN_DELTA}")
    ax.set_xlabel("training step")
    ax.set_ylabel("greedy held-out EM")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = folder / "study_em.png"
    fig.savefig(out, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return out
