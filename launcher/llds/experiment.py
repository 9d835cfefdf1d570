"""``llds experiment lld``: GRPO vs GRPO + LLDS vs GRPO + LLDS-MA on the default task.

Starting from the same warm-started policy, with the same seeds and step budget, each variant is a
full ``llds up`` run (real retriever, rollout, trainer and Redis). Afterwards every final policy is
evaluated greedily on the synthetic world's held-out split, and the LLD signals the trainer logged
each step are plotted. Writes ``OUT/experiment.json``, ``OUT/*.png`` and a Markdown report
(``OUT/EXPERIMENTS.md``; ``--write-repo-report`` also copies it to the repository's EXPERIMENTS.md).

    llds experiment lld --steps 8 --eval-limit 60              # CPU configuration (hours on 2 cores)
    llds experiment lld --preset gpu --steps 300 --model DIR    # GPU configuration (see EXPERIMENTS.md)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import tomllib
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parents[2]

VARIANTS: dict[str, dict[str, object]] = {
    "grpo": {"regularizer": "none"},
    "grpo_llds": {"regularizer": "llds", "llds_gate": "action", "answer_weight_mode": "off"},
    "grpo_llds_ma": {"regularizer": "llds", "llds_gate": "action", "answer_weight_mode": "adaptive_code"},
}
"""Trainer-config overrides of each arm; everything else comes from the preset."""

SIGNALS = [
    ("reward/mean", "reward (mean)"),
    ("lld/correct_logp_token", "log-likelihood of correct responses (per token)"),
    ("lld/fell_fraction_responses", "fraction of correct responses whose likelihood fell"),
    ("lld/displacement_mean", "intra-step displacement of correct responses"),
    ("loss/llds", "LLDS term"),
    ("actor/entropy", "token entropy"),
    ("rollout/valid_searches_mean", "valid searches per trajectory"),
]


def _read_log(run_dir: Path) -> list[dict[str, object]]:
    path = run_dir / "trainer" / "train_log.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _series(log: list[dict[str, object]], key: str) -> list[float | None]:
    return [float(r[key]) if isinstance(r.get(key), int | float) else None for r in log]  # type: ignore[arg-type]


def _slope(values: list[float | None]) -> float | None:
    pts = [(i, v) for i, v in enumerate(values) if v is not None]
    if len(pts) < 3:
        return None
    mx = sum(i for i, _ in pts) / len(pts)
    my = sum(v for _, v in pts) / len(pts)
    den = sum((i - mx) ** 2 for i, _ in pts)
    return sum((i - mx) * (v - my) for i, v in pts) / den if den else None


def _last_weights(run_dir: Path) -> Path | None:
    done = sorted(p.parent for p in (run_dir / "weights").glob("v*/COMPLETE"))
    return done[-1] if done else None


def run_arm(name: str, args: argparse.Namespace, out: Path) -> dict[str, object]:
    """One ``llds up`` run with the arm's trainer overrides, then its evaluation."""
    import subprocess

    base_cfg = Path(args.trainer_config or ROOT / "configs" / f"trainer_{args.preset}.toml")
    cfg = tomllib.loads(base_cfg.read_text())
    cfg.update(VARIANTS[name])
    cfg["seed"] = args.seed
    arm_dir = out / name
    arm_dir.mkdir(parents=True, exist_ok=True)
    cfg_path = arm_dir / "trainer_variant.toml"
    cfg_path.write_text(tomli_w.dumps(cfg))
    up = [sys.executable, "-m", "llds.cli", "up", "--preset", args.preset, "--steps", str(args.steps),
          "--run-dir", str(arm_dir / "run"), "--trainer-config", str(cfg_path), "--exit-when-done",
          "--no-dashboard", "--retriever-port", "0", "--rollout-port", "0", "--trainer-port", "0",
          "--redis-port", "0"]  # fmt: skip
    if args.model:
        up += ["--model", args.model]
    t0 = time.monotonic()
    print(f"== {name}: {' '.join(up[3:])}", flush=True)
    if subprocess.run(up).returncode != 0:
        raise RuntimeError(f"arm {name}: llds up failed (logs in {arm_dir / 'run' / 'logs'})")
    train_s = time.monotonic() - t0
    log = _read_log(arm_dir / "run")
    weights = _last_weights(arm_dir / "run")
    result: dict[str, object] = {
        "arm": name,
        "overrides": VARIANTS[name],
        "train_s": train_s,
        "steps": len(log),
    }
    if weights is not None and args.eval_limit:
        ev = [sys.executable, "-m", "llds.cli", "eval", "--model", str(weights), "--data", "synthworld-eval",
              "--limit", str(args.eval_limit), "--out", str(arm_dir / "eval")]  # fmt: skip
        if subprocess.run(ev).returncode != 0:
            raise RuntimeError(f"arm {name}: evaluation failed")
        summary = json.loads((arm_dir / "eval" / "eval.json").read_text())["summary"][0]
        result.update({"eval_em": summary["em"], "eval_f1": summary["f1"], "eval_searches": summary["searches"],
                       "eval_turns": summary["turns"]})  # fmt: skip
    for key, _ in SIGNALS:
        s = _series(log, key)
        vals = [v for v in s if v is not None]
        result[f"{key}:first"] = vals[0] if vals else None
        result[f"{key}:last"] = vals[-1] if vals else None
        result[f"{key}:slope"] = _slope(s)
    result["series"] = {key: _series(log, key) for key, _ in SIGNALS}
    return result


def plot(results: list[dict[str, object]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for key, title in SIGNALS:
        fig, ax = plt.subplots(figsize=(6, 3.2))
        drawn = False
        for r in results:
            ys = r["series"][key]  # type: ignore[index]
            pts = [(i + 1, v) for i, v in enumerate(ys) if v is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=str(r["arm"]))
                drawn = True
        if not drawn:
            plt.close(fig)
            continue
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.legend()
        fig.tight_layout()
        p = out / (key.replace("/", "_") + ".png")
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def report(
    results: list[dict[str, object]], args: argparse.Namespace, plots: list[Path], plot_prefix: str = ""
) -> str:
    def f(x: object) -> str:
        return f"{x:.4f}" if isinstance(x, float) else ("-" if x is None else str(x))

    lines = [
        "# The LLD experiment",
        "",
        f"Command: `llds experiment lld --preset {args.preset} --steps {args.steps} --eval-limit {args.eval_limit}"
        f" --seed {args.seed}`. Each arm is a full `llds up` run from the same warm-started policy, same seeds and"
        " step budget; reward is exact match. Evaluation: greedy, max 4 turns, top-3 BM25, first"
        f" {args.eval_limit} questions of the synthetic world's held-out split.",
        "",
        "| arm | steps | reward first -> last | correct logp/token first -> last (slope/step) | displaced frac (last) "
        "| LLDS term (last) | eval EM | eval searches/q | train s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['arm']} | {r['steps']} | {f(r['reward/mean:first'])} -> {f(r['reward/mean:last'])} "
            f"| {f(r['lld/correct_logp_token:first'])} -> {f(r['lld/correct_logp_token:last'])} "
            f"({f(r['lld/correct_logp_token:slope'])}) | {f(r['lld/fell_fraction_responses:last'])} "
            f"| {f(r['loss/llds:last'])} | {f(r.get('eval_em'))} | {f(r.get('eval_searches'))} | {f(r['train_s'])} |"
        )
    lines += ["", *[f"![{p.stem}]({plot_prefix}{p.name})" for p in plots], ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llds experiment lld", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--preset", default="cpu", choices=["cpu", "tiny", "gpu"], help="llds up preset of every arm"
    )
    p.add_argument("--model", help="starting policy (default: the preset's warm-started policy)")
    p.add_argument("--trainer-config", help="base trainer TOML (default configs/trainer_<preset>.toml)")
    p.add_argument("--steps", type=int, default=8, help="RL steps per arm")
    p.add_argument(
        "--eval-limit", type=int, default=60, help="held-out questions per arm (0 = skip evaluation)"
    )
    p.add_argument("--seed", type=int, default=0, help="trainer seed of every arm")
    p.add_argument(
        "--arms", default=",".join(VARIANTS), help="comma-separated subset of " + ",".join(VARIANTS)
    )
    p.add_argument("--out", type=Path, default=Path("runs/experiment-lld"), help="output folder")
    p.add_argument(
        "--write-repo-report",
        action="store_true",
        help="also write the repository's EXPERIMENTS.md (plots copied to docs/experiment-lld/)",
    )
    p.add_argument(
        "--report-only", action="store_true", help="rebuild plots and report from OUT/experiment.json"
    )
    args = p.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in VARIANTS]
    if bad or args.steps < 1 or args.eval_limit < 0:
        p.error(f"arms must be among {list(VARIANTS)} (got {bad}), --steps >= 1, --eval-limit >= 0")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        results = json.loads((args.out / "experiment.json").read_text())
    else:
        results = [run_arm(a, args, args.out) for a in arms]
        (args.out / "experiment.json").write_text(json.dumps(results, indent=2) + "\n")
    plots = plot(results, args.out)
    md = report(results, args, plots)
    (args.out / "EXPERIMENTS.md").write_text(md)
    if args.write_repo_report:
        import shutil

        dest = ROOT / "docs" / "experiment-lld"
        dest.mkdir(parents=True, exist_ok=True)
        for p_ in plots:
            shutil.copy(p_, dest / p_.name)
        (ROOT / "EXPERIMENTS.md").write_text(report(results, args, plots, plot_prefix="docs/experiment-lld/"))
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
