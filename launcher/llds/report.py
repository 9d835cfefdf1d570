"""``llds report RUN_DIR``: PNG plots of a run's reward and LLD signals and a one-page summary.

Reads the trainer's per-step log (``RUN_DIR/train_log.jsonl``, or ``RUN_DIR/trainer/train_log.jsonl``
where ``llds up`` puts it; a path to the JSONL file itself also works) and writes into
``RUN_DIR/report/`` (or ``--out``): ``reward.png``, ``lld.png``, ``training.png`` and ``summary.md``.

    llds report runs/20261129-120000
    llds report runs/20261129-120000 --out /tmp/report
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llds_proto import steplog as K

LOG_NAMES = ("train_log.jsonl", "trainer/train_log.jsonl")
ALARM_NAMES = {0: "ok", 1: "warning", 2: "alarm"}


class ReportError(ValueError):
    """The run's log is missing or unreadable; the message says which file and line."""


@dataclass(frozen=True)
class Figure:
    """One PNG: a grid of subplots, each a title and the keys it draws."""

    name: str
    title: str
    plots: tuple[tuple[str, tuple[str, ...]], ...]


FIGURES: tuple[Figure, ...] = (
    Figure("reward", "Reward", (("Reward and exact match", (K.REWARD_MEAN, K.REWARD_EXACT_MATCH)),)),
    Figure("lld", "Likelihood dynamics (LLD signals)", (
        ("Log-likelihood per token", (K.LLD_CORRECT_LOGP_TOKEN, K.LLD_FIRST_ACTION_LOGP, K.LLD_LATER_ACTION_LOGP,
                                      K.LLD_INCORRECT_LOGP_TOKEN)),
        ("Correct log-likelihood slope", (K.LLD_CORRECT_LOGP_SLOPE,)),
        ("Displaced (fell) and gated fractions", (K.LLD_FELL_FRACTION_RESPONSES, K.LLD_FELL_FRACTION_ACTIONS,
                                                  K.LLDS_GATED_FRACTION)),
        ("Correct - incorrect gap", (K.LLD_CORRECT_INCORRECT_GAP,)),
        ("LLD alarm (0 ok, 1 warning, 2 alarm)", (K.LLD_ALARM,)),
        ("LLDS term", (K.LOSS_LLDS,)),
    )),
    Figure("training", "Training", (
        ("Losses", (K.LOSS_TOTAL, K.LOSS_POLICY, K.LOSS_KL)),
        ("Token entropy", (K.ACTOR_ENTROPY,)),
        ("Gradient norm (pre-clip)", (K.ACTOR_GRAD_NORM,)),
        ("Clip fraction", (K.ACTOR_CLIP_FRAC,)),
        ("Response length", (K.ROLLOUT_RESPONSE_LEN_MEAN,)),
        ("Turns and valid searches", (K.ROLLOUT_TURNS_MEAN, K.ROLLOUT_VALID_SEARCHES_MEAN)),
    )),
)  # fmt: skip

SUMMARY_KEYS = (
    K.REWARD_MEAN, K.REWARD_EXACT_MATCH, K.LOSS_LLDS, K.LLD_CORRECT_LOGP_TOKEN, K.LLD_CORRECT_LOGP_SLOPE,
    K.LLD_FELL_FRACTION_RESPONSES, K.LLD_FELL_FRACTION_ACTIONS, K.LLD_CORRECT_INCORRECT_GAP, K.LLDS_GATED_FRACTION,
    K.ACTOR_ENTROPY, K.ACTOR_GRAD_NORM, K.ROLLOUT_RESPONSE_LEN_MEAN, K.ROLLOUT_TURNS_MEAN,
    K.ROLLOUT_VALID_SEARCHES_MEAN,
)  # fmt: skip
STEPPED = (K.LLD_ALARM, K.WEIGHTS_VERSION)
"""Keys drawn as steps (levels, versions)."""


def find_log(path: Path) -> Path:
    """The train log for a run directory (or the file itself)."""
    if path.is_file():
        return path
    for name in LOG_NAMES:
        if (path / name).is_file():
            return path / name
    raise ReportError(f"no train log in {path}: looked for {', '.join(str(path / n) for n in LOG_NAMES)}")


def read_log(path: Path) -> list[dict[str, Any]]:
    """Step records in file order. A truncated last line (a run killed mid-write) is dropped;
    a bad line anywhere else is an error."""
    try:
        logged = K.read_step_log(path)
    except K.StepLogError as e:
        raise ReportError(str(e)) from e
    if logged.torn_line is not None:
        print(
            f"warning: {path}:{logged.torn_line} is incomplete (run still writing or killed); ignored",
            file=sys.stderr,
        )
    if not logged.records:
        raise ReportError(f"{path} holds no step records")
    return logged.records


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v) if math.isfinite(v) else None


def series(records: list[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of one key, skipping records without a finite value."""
    xs: list[float] = []
    ys: list[float] = []
    for i, rec in enumerate(records):
        y = _num(rec.get(key))
        if y is None:
            continue
        x = _num(rec.get(K.STEP))
        xs.append(x if x is not None else float(i + 1))
        ys.append(y)
    return xs, ys


def plot_figure(fig_spec: Figure, records: list[dict[str, Any]], out: Path) -> Path | None:
    """Write one PNG; None when none of its keys has data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = [(t, [k for k in keys if series(records, k)[1]]) for t, keys in fig_spec.plots]
    plots = [(t, keys) for t, keys in plots if keys]
    if not plots:
        return None
    cols = 1 if len(plots) == 1 else 2
    rows = math.ceil(len(plots) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(6.5 * cols, 3.2 * rows), squeeze=False)
    for ax, (title, keys) in zip(axes.flat, plots, strict=False):
        for key in keys:
            xs, ys = series(records, key)
            stepped = key in STEPPED
            ax.plot(xs, ys, label=key, drawstyle="steps-post" if stepped else "default",
                    marker="o" if len(xs) < 30 else None, markersize=3)  # fmt: skip
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(plots) :]:
        ax.axis("off")
    fig.suptitle(fig_spec.title)
    fig.tight_layout()
    path = out / f"{fig_spec.name}.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _fmt(v: float | None) -> str:
    if v is None:
        return "–"
    if v == 0 or 1e-3 <= abs(v) < 1e5:
        return f"{v:.4g}"
    return f"{v:.3e}"


def summarize(records: list[dict[str, Any]], log_path: Path, images: list[Path]) -> str:
    """The one-page Markdown summary."""
    steps = [s for s in (_num(r.get(K.STEP)) for r in records) if s is not None]
    lines = [
        f"# Run report: {log_path.parent.name if log_path.parent.name != 'trainer' else log_path.parent.parent.name}",
        "",
    ]
    lines.append(f"- log: `{log_path}`")
    lines.append(
        f"- step records: {len(records)}" + (f" (steps {int(min(steps))}-{int(max(steps))})" if steps else "")
    )
    xs, rewards = series(records, K.REWARD_MEAN)
    if rewards:
        best = max(range(len(rewards)), key=rewards.__getitem__)
        lines.append(f"- {K.REWARD_MEAN}: first {_fmt(rewards[0])}, last {_fmt(rewards[-1])}, "
                     f"best {_fmt(rewards[best])} at step {int(xs[best])}")  # fmt: skip
    ax, alarms = series(records, K.LLD_ALARM)
    if alarms:
        counts = {name: sum(1 for a in alarms if int(a) == level) for level, name in ALARM_NAMES.items()}
        first = next((int(x) for x, a in zip(ax, alarms, strict=True) if a >= 2), None)
        first_warn = next((int(x) for x, a in zip(ax, alarms, strict=True) if a >= 1), None)
        lines.append(f"- LLD alarm: final **{ALARM_NAMES.get(int(alarms[-1]), alarms[-1])}**; steps ok {counts['ok']}, "
                     f"warning {counts['warning']}, alarm {counts['alarm']}; first warning at step "
                     f"{first_warn if first_warn is not None else '–'}, first alarm at step "
                     f"{first if first is not None else '–'}")  # fmt: skip
    else:
        lines.append("- LLD alarm: not logged")
    lines += ["", "| key | first | last | min | max |", "|---|---|---|---|---|"]
    for key in SUMMARY_KEYS:
        _, ys = series(records, key)
        if ys:
            lines.append(f"| `{key}` | {_fmt(ys[0])} | {_fmt(ys[-1])} | {_fmt(min(ys))} | {_fmt(max(ys))} |")
    lines.append("")
    for img in images:
        lines += [f"![{img.stem}]({img.name})", ""]
    return "\n".join(lines)


def build(run: Path, out: Path | None = None) -> dict[str, Path]:
    """Write the plots and summary.md; returns name -> path of what was written."""
    log_path = find_log(run)
    records = read_log(log_path)
    if out is None:
        run_dir = log_path.parent.parent if log_path.parent.name == "trainer" else log_path.parent
        out = run_dir / "report"
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    for spec in FIGURES:
        path = plot_figure(spec, records, out)
        if path is not None:
            written[spec.name] = path
    summary = out / "summary.md"
    summary.write_text(summarize(records, log_path, list(written.values())))
    written["summary"] = summary
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llds report", description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="run directory (or its train_log.jsonl)")
    p.add_argument("--out", type=Path, help="output folder (default RUN_DIR/report)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        written = build(args.run, args.out)
    except ReportError as e:
        print(f"llds report: {e}", file=sys.stderr)
        return 2
    for name, path in written.items():
        print(f"{name:<9} {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
