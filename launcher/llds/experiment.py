"""``llds experiment lld``: GRPO vs GRPO + LLDS vs GRPO + LLDS-MA vs GRPO with the acting alarm.

Every (arm, seed) is its own full ``llds up`` run (real retriever, rollout, trainer and Redis) from the
same starting policy with the same step budget, in its own folder ``OUT/runs/<arm>-s<seed>/``. A run
that finished (``result.json`` there) is skipped by ``--resume``; one that was interrupted is continued
with ``llds up --resume``, so the study can be run in pieces. Afterwards each final policy is
evaluated greedily on the synthetic world's held-out split. Each run's per-step log is kept compact in
``OUT/logs/<arm>-s<seed>.jsonl`` (the signals plotted), next to ``OUT/results.json``; plots and the
report (``OUT/EXPERIMENTS.md``) are rebuilt from those two alone with ``--report-only``, so committed
logs regenerate every figure.

    llds experiment lld --steps 40 --seeds 0,1 --eval-limit 100          # CPU (hours on 2 cores)
    llds experiment lld --steps 40 --seeds 0,1 --eval-limit 100 --resume # continue it
    llds experiment lld --report-only --out runs/experiment-lld          # figures from the logs
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from llds.starts import DEFAULT_START
from llds_proto import steplog as K
from llds_proto.exits import EXIT_NO_SIGNAL
from llds_server.settings import merged

ROOT = Path(__file__).resolve().parents[2]

_LLDS = {"type": "llds", "gate": "action", "answer_weight_mode": "off"}
ARMS: dict[str, dict[str, Any]] = {
    "grpo": {"regularizer": {"type": "none"}},
    "grpo_llds": {"regularizer": _LLDS},
    "grpo_llds_ma": {"regularizer": _LLDS | {"answer_weight_mode": "adaptive_code"}},
    # LLDS at five times the published lambda: at this regime's lr (50x the paper's 1e-6) the term at 0.2
    # slowed the spiral without stopping it (EXPERIMENTS.md).
    "grpo_llds_l1": {"regularizer": _LLDS | {"coef": 1.0}},
    "grpo_alarm": {"regularizer": {"type": "none"}, "lld": {"alarm": {"type": "enable_llds", "llds": _LLDS}}},
    # DAPO's dynamic sampling on plain GRPO: groups whose rewards are all equal are skipped, so a step
    # never reads 0 and --stop-dead cannot see a death; the trainer stops itself instead after 8 uniform
    # groups in a row (the 2 groups of 4 steps, as --stop-dead 4 on the other arms).
    "grpo_ds": {"regularizer": {"type": "none"}, "dynamic_sampling": True, "dynamic_sampling_max_skips": 8},
    # The controlled study's controls (docs/study/DESIGN.md): GRPO whose optimizer leaves the weights alone
    # on an update without advantage signal (no momentum, no decay: only KL would move them otherwise),
    # and LLDS without its action gate (every token whose likelihood fell, lambda 0.2).
    "grpo_skipzero": {"regularizer": {"type": "none"}, "optimizer": {"skip_updates": "no_signal"}},
    "grpo_llds_token": {"regularizer": _LLDS | {"gate": "token"}},
}
"""Trainer-config overrides of each arm (merged by :func:`merged`); everything else comes from the preset
(or --trainer-config)."""
STUDY_KEYS = (
    "preset",
    "steps",
    "eval_limit",
    "eval_steps",
    "trainer_set",
    "seeds",
    "arms",
    "stop_dead",
    "start_digest",
)
"""What OUT/study.json records of the command, so --report-only can state it."""

SIGNALS = [
    (K.REWARD_MEAN, "training reward (mean)"),
    (K.REWARD_EXACT_MATCH, "training exact match"),
    (K.LLD_CORRECT_LOGP_TOKEN, "log-likelihood of correct responses (per token)"),
    (K.LLD_FELL_FRACTION_RESPONSES, "fraction of correct responses whose likelihood fell"),
    (K.ACTOR_ENTROPY, "token entropy"),
    (K.ACTOR_GRAD_NORM, "gradient norm (pre-clip)"),
    (K.LOSS_LLDS, "LLDS term"),
    (K.LLD_ALARM, "LLD alarm (0 ok, 1 warning, 2 alarm)"),
]
"""Signals plotted, one figure each."""
LOG_KEYS = [K.STEP, *(k for k, _ in SIGNALS), K.LLD_ACTION, K.LLDS_LAMBDA, K.ROLLOUT_VALID_SEARCHES_MEAN,
            K.DATA_UNIFORM_SKIPPED, K.LOSS_KL, K.ACTOR_UPDATES, K.ACTOR_SKIPPED_UPDATES, K.PERF_STEP_S,
            K.PERF_LOAD1, K.RUN_START_DIGEST, K.TIME_UNIX]  # fmt: skip
"""Keys kept in a run's compact log (OUT/logs/*.jsonl)."""

COLLAPSE_WINDOW = 10

PRESETS: dict[str, tuple[str, str | None]] = {
    "cpu": ("cpu", None),
    "cpu-collapse": ("cpu", "cpu_collapse"),
    "cpu-study": ("cpu", "cpu_study"),
    "tiny": ("tiny", None),
    "gpu": ("gpu", None),
}
"""Experiment preset -> (``llds up`` preset, overlay). A run's trainer and rollout configs are the ``llds
up`` preset's configs/{trainer,rollout}_<preset>.toml with configs/{trainer,rollout}_<overlay>.toml
merged on top. ``cpu-collapse`` is the CPU preset's model and world with the GRPO setting the collapse
search found (EXPERIMENTS.md); ``cpu-study`` the controlled study's (docs/study/DESIGN.md: 16
trajectories a step, KL 0.001, every tenth step's weights kept for evaluation)."""

QUESTIONS = "questions"
"""OUT/questions/: per-question held-out results, ``<arm>-s<seed>-step<N>.jsonl`` for each evaluated
checkpoint of each run and ``start-step0.jsonl`` for the start, one ``{"id", "em", "f1", "searches"}``
object a line: what paired tests between arms are computed from."""
QUESTION_KEYS = ("id", "em", "f1", "searches")

SEARCH_DIR = ROOT / "docs" / "collapse-search"
"""Where ``llds experiment search --write-repo-report`` puts the search's logs, results and plots."""


def _read_log(run_dir: Path) -> list[dict[str, object]]:
    """A run's step log as written so far (a half-written last line left out)."""
    return K.read_records(run_dir / "trainer" / "train_log.jsonl")


def _series(log: list[dict[str, Any]], key: str) -> list[float | None]:
    return [float(r[key]) if isinstance(r.get(key), int | float) else None for r in log]


def _slope(values: list[float | None]) -> float | None:
    pts = [(i, v) for i, v in enumerate(values) if v is not None]
    if len(pts) < 3:
        return None
    mx = sum(i for i, _ in pts) / len(pts)
    my = sum(v for _, v in pts) / len(pts)
    den = sum((i - mx) ** 2 for i, _ in pts)
    return sum((i - mx) * (v - my) for i, v in pts) / den if den else None


def moving_average(values: list[float | None], window: int) -> list[float | None]:
    """Trailing mean over the last ``window`` present values (None until there is one)."""
    out: list[float | None] = []
    for i in range(len(values)):
        pts = [v for v in values[max(0, i - window + 1) : i + 1] if v is not None]
        out.append(sum(pts) / len(pts) if pts else None)
    return out


def collapse_step(rewards: list[float | None], window: int = COLLAPSE_WINDOW) -> int | None:
    """First step (1-based) from which the ``window``-step moving average of the reward stays below
    half of its running peak to the end of the run; None if it never does (issue 14's definition)."""
    ma = moving_average(rewards, window)
    peak = 0.0
    below: list[bool] = []
    for v in ma:
        if v is not None:
            peak = max(peak, v)
        below.append(v is not None and peak > 0 and v < peak / 2)
    first = None
    for i in range(len(below) - 1, -1, -1):
        if not below[i]:
            break
        first = i + 1
    return first


def logp_turn_step(logps: list[float | None], window: int = COLLAPSE_WINDOW) -> int | None:
    """First step (1-based) at which the slope of the correct responses' log-likelihood over the last
    ``window`` steps is negative; None if it never is."""
    for i in range(len(logps)):
        s = _slope(logps[max(0, i - window + 1) : i + 1])
        if s is not None and s < 0:
            return i + 1
    return None


def _first(log: list[dict[str, Any]], key: str, at_least: float) -> int | None:
    return next(
        (int(r[K.STEP]) for r in log if isinstance(r.get(key), int | float) and r[key] >= at_least), None
    )


def summarize(arm: str, seed: int, log: list[dict[str, Any]]) -> dict[str, Any]:
    """The per-run figures of the report, from its step log alone."""
    rewards = _series(log, K.REWARD_MEAN)
    vals = [v for v in rewards if v is not None]
    tenth = max(1, len(vals) // 10)
    return {
        "arm": arm,
        "seed": seed,
        "steps": len(log),
        "reward_first": statistics.fmean(vals[:tenth]) if vals else None,
        "reward_last": statistics.fmean(vals[-tenth:]) if vals else None,
        "reward_peak_ma": max(
            (v for v in moving_average(rewards, COLLAPSE_WINDOW) if v is not None), default=None
        ),
        "collapse_step": collapse_step(rewards),
        "logp_turn_step": logp_turn_step(_series(log, K.LLD_CORRECT_LOGP_TOKEN)),
        "logp_slope": _slope(_series(log, K.LLD_CORRECT_LOGP_TOKEN)),
        "first_warning_step": _first(log, K.LLD_ALARM, 1),
        "first_action_step": _first(log, K.LLD_ACTION, 1),
        "step_s_median": statistics.median(t)
        if (t := [v for v in _series(log, K.PERF_STEP_S) if v])
        else None,
    }


def compact(log: list[dict[str, Any]]) -> str:
    return "".join(json.dumps({k: r[k] for k in LOG_KEYS if k in r}) + "\n" for r in log)


def questions_name(arm: str, seed: int, step: int) -> str:
    return f"{run_name(arm, seed)}-step{step}.jsonl"


def write_questions(path: Path, examples: list[dict[str, Any]]) -> None:
    """Per-question results, compact (:data:`QUESTION_KEYS`), in the evaluation's question order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({k: e[k] for k in QUESTION_KEYS if k in e}) + "\n" for e in examples))


def kept_versions(run: Path) -> dict[int, Path]:
    """Complete published versions of a run by the trainer step in their marker."""
    from llds_trainer.publish import marker_step

    out = {}
    for marker in (run / "weights").glob("v*/COMPLETE"):
        step = marker_step(marker.parent)
        if step is not None:
            out[step] = marker.parent
    return out


def evaluate_checkpoints(arm: str, seed: int, args: argparse.Namespace, folder: Path,
                         known: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """Evaluate the run's kept weights at each of ``args.eval_steps`` not evaluated yet (OUT/questions
    holds the per-question results, the run's ``checkpoints`` entry the summary). A step the run never
    reached (stopped dead earlier) has no weights: the report counts it as dead. ``known``: the
    summaries a finished run's result already holds (kept as they are when their per-question file
    is there: no weights re-hashed)."""
    steps = getattr(args, "eval_steps", None) or []
    if not steps or not args.eval_limit:
        return {}
    kept = kept_versions(folder / "run")
    done: dict[str, Any] = {}
    for step in steps:
        out = args.out / QUESTIONS / questions_name(arm, seed, step)
        ev = folder / "eval" / f"step{step}"
        if known and str(step) in known and out.is_file():
            done[str(step)] = known[str(step)]
            continue
        if step not in kept:
            if (folder / "run" / PRUNED).is_file() and step <= _last_step(folder / "run"):
                raise SystemExit(
                    f"llds experiment: {run_name(arm, seed)} reached step {step} but its weights were pruned "
                    f"when the run finished ({folder / 'run' / PRUNED}); evaluate it in a study run with "
                    "--keep-weights, or name --eval-steps before the run"
                )
            continue
        if not (ev / "eval.json").is_file():
            evaluate(
                kept[step],
                folder / "rollout_variant.toml",
                args.eval_limit,
                ev,
                f"{run_name(arm, seed)} step {step}",
            )
        report = json.loads((ev / "eval.json").read_text())
        examples = [e for rows in report["examples"].values() for e in rows]
        write_questions(out, examples)
        summary = report["summary"][0]
        done[str(step)] = {"em": summary["em"], "f1": summary["f1"], "searches": summary["searches"],
                           "n": summary["n"], "digest": policy_digest(kept[step])}  # fmt: skip
    lld = args.out / LLD / f"{run_name(arm, seed)}.json"
    if done and not lld.is_file():
        probe_lld({int(k): kept[int(k)] for k in done}, lld)
    return done


PRUNED = "PRUNED"
"""RUN/PRUNED: what :func:`prune` deleted from a finished, evaluated run (and the bytes it freed)."""


def _last_step(run: Path) -> int:
    log = _read_log(run)
    return int(log[-1][K.STEP]) if log else 0


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def prune(run: Path) -> dict[str, Any]:
    """Free a finished, evaluated run's disk: every trainer checkpoint and every published version but
    the newest go (at the cpu-study shape a run keeps about 6 GB of them; a study of arms x seeds
    would fill a disk). The step log, the Redis append-only file, the evaluations and the newest
    weights stay; RUN/PRUNED says what went. Idempotent."""
    import shutil

    gone: list[str] = []
    freed = 0
    newest = max(kept_versions(run).items(), default=(None, None))[1]
    weights = run / "weights"
    doomed = [d for d in sorted(weights.iterdir()) if d.is_dir() and d != newest] if weights.is_dir() else []
    ckpts = run / "trainer" / "checkpoints"
    doomed += sorted(d for d in ckpts.glob("*") if d.is_dir()) if ckpts.is_dir() else []
    for d in doomed:
        freed += _size(d)
        shutil.rmtree(d)
        gone.append(str(d.relative_to(run)))
    record = {"kept": str(newest.relative_to(run)) if newest else None, "deleted": gone, "freed_bytes": freed}
    if gone or not (run / PRUNED).is_file():
        (run / PRUNED).write_text(json.dumps(record, indent=1) + "\n")
    return record


LLD = "lld"
"""OUT/lld/: the fixed probe set's log-likelihood (``llds trainer probe-lld``) under the start
(``start.json``) and each run's evaluated checkpoints (``<arm>-s<seed>.json``: step -> per token)."""


def probe_lld(models: dict[int, Path], out: Path) -> None:
    """Score the fixed probe set of correct trajectories under each checkpoint (step -> weights folder);
    writes ``{"logp_token": {step: value}, "per_demo": {step: [...]}}`` to ``out``."""
    import subprocess
    import tempfile

    from llds.up import ensure_world

    steps = sorted(models)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "lld.json"
        cmd = [sys.executable, "-m", "llds.cli", "trainer", "probe-lld", "--world", str(ensure_world(0)),
               "--out", str(raw)] + [x for s in steps for x in ("--model", str(models[s]))]  # fmt: skip
        if subprocess.run(cmd).returncode != 0:
            raise RuntimeError(f"probe-lld failed for {out.stem}")
        rep = json.loads(raw.read_text())
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"first": rep["first"], "count": rep["count"],
                               "logp_token": {str(s): m["logp_token"] for s, m in zip(steps, rep["models"], strict=True)},
                               "per_demo": {str(s): [round(d["logp"], 4) for d in m["per_demo"]]
                                            for s, m in zip(steps, rep["models"], strict=True)}}) + "\n")  # fmt: skip


def run_name(arm: str, seed: int) -> str:
    return f"{arm}-s{seed}"


def flat_keys(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested tables as dotted keys (``{"regularizer": {"type": "none"}}`` -> ``regularizer.type``)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= flat_keys(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def preset_config(preset: str, kind: str) -> dict[str, Any]:
    """The preset's ``kind`` (trainer / rollout) config: the ``llds up`` preset's TOML and its overlay."""
    up, overlay = PRESETS[preset]
    cfg = tomllib.loads((ROOT / "configs" / f"{kind}_{up}.toml").read_text())
    if overlay is None:
        return cfg
    return merged(cfg, tomllib.loads((ROOT / "configs" / f"{kind}_{overlay}.toml").read_text()))


def dead(log: list[dict[str, Any]], n: int) -> bool:
    """The last ``n`` steps all had zero reward: zero advantage everywhere, so no gradient can revive
    the policy (what ``--stop-dead`` stops a run on)."""
    tail = _series(log[-n:], K.REWARD_MEAN) if n > 0 else []
    return len(tail) == n > 0 and all(v == 0 for v in tail)


def _up_command(args: argparse.Namespace, run: Path, cfgs: dict[str, Path], resume: bool) -> list[str]:
    base = [sys.executable, "-m", "llds.cli", "up", "--steps", str(args.steps), "--exit-when-done",
            "--retriever-port", "0", "--rollout-port", "0", "--trainer-port", "0", "--redis-port", "0"]  # fmt: skip
    if resume:
        return [*base, "--resume", str(run)]
    cmd = [*base, "--preset", PRESETS[args.preset][0], "--run-dir", str(run), "--no-dashboard"]
    for kind, path in cfgs.items():
        cmd += [f"--{kind}-config", str(path)]
    if args.model:
        return [*cmd, "--model", args.model]
    start = getattr(args, "start", None) or DEFAULT_START
    return [*cmd, "--start", start] if PRESETS[args.preset][0] == "cpu" else cmd


def _train(cmd: list[str], run: Path, stop_dead: int, steps: int, poll_s: float = 5.0) -> int | None:
    """Run ``llds up`` for ``steps``; with ``stop_dead`` > 0, stop it (Ctrl-C: a clean stop) once the
    last ``stop_dead`` steps had zero reward. Returns the step it was stopped at, None if it ran its
    steps. Raises :class:`NoSignal` when the trainer stopped the run for want of a learning signal;
    a run that ended short of its steps otherwise (Ctrl-C, SIGTERM: ``llds up`` exits 0 on a
    requested stop) raises :class:`Interrupted`, judged by the step log, not the exit code."""
    import os
    import signal
    import subprocess

    proc = subprocess.Popen(cmd)
    stopped = None
    try:
        while True:
            try:
                code = proc.wait(timeout=poll_s)
                break
            except subprocess.TimeoutExpired:
                log = _read_log(run)
                if stop_dead and stopped is None and dead(log, stop_dead):
                    stopped = int(log[-1][K.STEP])
                    print(f"== dead for {stop_dead} steps at step {stopped}: stopping the run", flush=True)
                    proc.send_signal(signal.SIGINT)
    except KeyboardInterrupt:
        # A Ctrl-C at the terminal reached llds up too (same process group): signalling it again would
        # interrupt its shutdown. Otherwise (kill -INT of this process alone) pass it on.
        if os.getpgid(proc.pid) != os.getpgrp():
            proc.send_signal(signal.SIGINT)
        while proc.poll() is None:
            try:
                proc.wait()
            except KeyboardInterrupt:
                continue  # llds up is stopping its children; leaving now would orphan them
        raise
    last = max((int(r[K.STEP]) for r in _read_log(run)), default=0)
    if code == EXIT_NO_SIGNAL:
        print(f"== no learning signal left after step {last}: the trainer stopped the run", flush=True)
        raise NoSignal(last)
    if code != 0:
        raise RuntimeError(f"llds up failed with exit code {code} (logs in {run / 'logs'})")
    if stopped is None and last < steps:
        raise Interrupted(f"{run} stopped at step {last} of {steps}; continue it with --resume")
    return stopped


class Interrupted(Exception):
    """A run that ended before its steps without being stopped by --stop-dead."""


class NoSignal(Exception):
    """The trainer stopped the run itself after ``step``: dynamic sampling found only groups whose
    rewards were all equal (``llds up`` exited with :data:`EXIT_NO_SIGNAL`)."""

    def __init__(self, step: int) -> None:
        super().__init__(f"no learning signal left after step {step}")
        self.step = step


def run_one(
    arm: str,
    seed: int,
    args: argparse.Namespace,
    trainer: dict[str, Any] | None = None,
    rollout: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train (or continue) one (arm, seed) run, evaluate it, write its result and compact log. The
    arm's trainer overrides default to ``ARMS[arm]``; ``rollout`` overrides the rollout preset."""

    trainer = ARMS[arm] if trainer is None else trainer
    folder = args.out / "runs" / run_name(arm, seed)
    if (folder / "result.json").is_file():
        result = dict(json.loads((folder / "result.json").read_text()))
        weights = sorted(p.parent for p in (folder / "run" / "weights").glob("v*/COMPLETE"))
        if (
            args.eval_limit
            and weights
            and result.get("eval_shape") != _shape(folder / "rollout_variant.toml")
        ):
            # Evaluated before evaluations used the run's own rollout shape: evaluate again, train nothing.
            print(
                f"== {run_name(arm, seed)}: finished earlier; evaluating it again in its rollout shape",
                flush=True,
            )
            result |= evaluate(weights[-1], folder / "rollout_variant.toml", args.eval_limit, folder / "eval",
                               run_name(arm, seed))  # fmt: skip
            (folder / "result.json").write_text(json.dumps(result, indent=1) + "\n")
        else:
            print(f"== {run_name(arm, seed)}: finished earlier, skipped", flush=True)
        if getattr(args, "eval_steps", None):
            # checkpoints not evaluated yet (or their probe-set LLD): an evaluation is done once
            now = result.get("checkpoints", {}) | evaluate_checkpoints(
                arm, seed, args, folder, result.get("checkpoints")
            )
            if now != result.get("checkpoints"):
                result["checkpoints"] = now
                (folder / "result.json").write_text(json.dumps(result, indent=1) + "\n")
        _prune(folder, args)
        return result
    run = folder / "run"
    resume = (run / "up_config.toml").is_file()
    if resume and not args.resume:
        raise SystemExit(f"llds experiment: {folder} holds an unfinished run; pass --resume or another --out")
    folder.mkdir(parents=True, exist_ok=True)
    # The seed is the rollout's too (question order, sampling), so arms on one seed see the same questions.
    cfgs = {"trainer": folder / "trainer_variant.toml", "rollout": folder / "rollout_variant.toml"}
    if not resume:
        given = args.trainer_config and tomllib.loads(Path(args.trainer_config).read_text())
        base = merged(
            given or preset_config(args.preset, "trainer"), trainer_sets(getattr(args, "trainer_set", None))
        )
        cfgs["trainer"].write_text(tomli_w.dumps(merged(base, trainer | {"seed": seed})))
        seeded = merged(preset_config(args.preset, "rollout"), rollout or {})
        seeded = merged(seeded, {"seed": seed, "engine": {"seed": seed}})
        cfgs["rollout"].write_text(tomli_w.dumps(seeded))
    cmd = _up_command(args, run, cfgs, resume)
    t0 = time.monotonic()
    stop_dead = getattr(args, "stop_dead", 0)
    why = None
    if resume and stop_dead and dead(earlier := _read_log(run), stop_dead):
        # Stopped dead before an interruption (of its evaluation, say): nothing left to train.
        stopped: int | None = int(earlier[-1][K.STEP])
        print(f"== {run_name(arm, seed)}: stopped dead at step {stopped} earlier; evaluating", flush=True)
    else:
        print(f"== {run_name(arm, seed)}: {' '.join(cmd[3:])}", flush=True)
        try:
            stopped = _train(cmd, run, stop_dead, args.steps)
        except NoSignal as e:
            stopped, why = e.step, "no learning signal: dynamic sampling's uniform-group limit"
    log = _read_log(run)
    logged = {str(r[K.RUN_START_DIGEST]) for r in log if r.get(K.RUN_START_DIGEST)}
    want = getattr(args, "start_digest", None)
    if want and logged and logged != {want}:
        raise SystemExit(f"llds experiment: {run_name(arm, seed)} started from {', '.join(sorted(logged))} (its step "
                         f"log), not the study's start {want}: not a run of this study")  # fmt: skip
    result = summarize(arm, seed, log) | {"overrides": trainer, "train_s": time.monotonic() - t0,
                                          "start_digest": getattr(args, "start_digest", None),
                                          "start_eval_em": getattr(args, "start_eval_em", None)}  # fmt: skip
    if rollout:
        result["rollout_overrides"] = rollout
    if stopped is not None:
        result |= {"stopped_dead_at": stopped, "stop_dead": args.stop_dead,
                   "stopped_why": why or f"reward 0 for {args.stop_dead} steps"}  # fmt: skip
    done = sorted(p.parent for p in (run / "weights").glob("v*/COMPLETE"))
    result["checkpoints"] = evaluate_checkpoints(arm, seed, args, folder)
    last = kept_versions(run)
    final = result["checkpoints"].get(str(max(last))) if last else None
    if final:  # the last step was one of --eval-steps: that evaluation is the final one
        result |= {"eval_em": final["em"], "eval_f1": final["f1"], "eval_searches": final["searches"],
                   "eval_n": final["n"], "eval_shape": _shape(cfgs["rollout"])}  # fmt: skip
    elif done and args.eval_limit:
        result |= evaluate(done[-1], cfgs["rollout"], args.eval_limit, folder / "eval", run_name(arm, seed))
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    (args.out / "logs" / f"{run_name(arm, seed)}.jsonl").write_text(compact(log))
    (folder / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    _prune(folder, args)
    return result


def _prune(folder: Path, args: argparse.Namespace) -> None:
    if getattr(args, "keep_weights", False) or not (folder / "run").is_dir():
        return
    rec = prune(folder / "run")
    if rec["deleted"]:
        print(f"== {folder.name}: pruned {len(rec['deleted'])} checkpoints and versions "
              f"({rec['freed_bytes'] / 2**30:.1f} GiB); kept {rec['kept']} (--keep-weights keeps all)", flush=True)  # fmt: skip


def evaluate(model: Path, rollout_config: Path, limit: int, out: Path, name: str) -> dict[str, Any]:
    """Held-out EM of ``model`` on the first ``limit`` questions, answered in the run's own rollout shape
    (``rollout_config``: its top-k, document and turn lengths). The rollout's defaults (500 tokens a turn)
    let a collapsed policy ramble: 20 to 30 minutes for 100 questions on 2 cores, not 3."""
    import subprocess

    ev = [sys.executable, "-m", "llds.cli", "eval", "--model", str(model), "--data", "synthworld-eval",
          "--limit", str(limit), "--rollout-config", str(rollout_config), "--out", str(out)]  # fmt: skip
    if subprocess.run(ev).returncode != 0:
        raise RuntimeError(f"{name}: evaluation failed")
    summary = json.loads((out / "eval.json").read_text())["summary"][0]
    return {"eval_em": summary["em"], "eval_f1": summary["f1"], "eval_searches": summary["searches"],
            "eval_n": limit, "eval_shape": _shape(rollout_config)}  # fmt: skip


def _shape(rollout_config: Path) -> dict[str, int] | None:
    """The answer shape (top-k, token limits) an evaluation with ``rollout_config`` uses."""
    from llds.evaluate import answer_shape

    return answer_shape(rollout_config) if rollout_config.is_file() else None


def policy_digest(model: Path | None) -> str | None:
    """The short SHA-256 over ``model``'s tensors (:func:`llds_proto.digest.tensors_digest`): which
    starting policy a run had (None: no safetensors there). Shipped starts merge to the same bytes on
    every machine, so runs of one study on two machines share it."""
    from llds_proto.digest import short, tensors_digest

    if model is None or not model.is_dir() or not any(model.glob("*.safetensors")):
        return None
    return short(tensors_digest(model))


def start_policy(args: argparse.Namespace) -> Path | None:
    """The policy every run starts from (None: the gpu preset without --model)."""
    from llds import assets, starts

    if args.model:
        return Path(args.model)
    up_preset = PRESETS[args.preset][0]
    if up_preset == "tiny":
        return assets.tiny_model_dir()
    return starts.policy_dir(getattr(args, "start", None) or DEFAULT_START) if up_preset == "cpu" else None


def baseline(args: argparse.Namespace) -> dict[str, Any] | None:
    """Held-out EM of the starting policy, in the runs' rollout shape (OUT/baseline; done once)."""
    folder = args.out / "baseline"
    done = folder / "result.json"
    if done.is_file():
        return dict(json.loads(done.read_text()))
    model = start_policy(args)
    if model is None or not args.eval_limit:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    cfg = folder / "rollout.toml"
    cfg.write_text(tomli_w.dumps(preset_config(args.preset, "rollout")))
    result = {"model": str(model), "digest": policy_digest(model)}
    shipped = _shipped_heldout(args, cfg)
    if shipped is not None:
        print(
            f"== baseline: the shipped start's held-out results (same bytes, same shape): {model}", flush=True
        )
        result |= shipped
    else:
        print(f"== baseline: evaluating the starting policy {model}", flush=True)
        result |= evaluate(model, cfg, args.eval_limit, folder / "eval", "baseline")
        if getattr(args, "eval_steps", None):
            report = json.loads((folder / "eval" / "eval.json").read_text())
            write_questions(args.out / QUESTIONS / "start-step0.jsonl",
                            [e for rows in report["examples"].values() for e in rows])  # fmt: skip
    done.write_text(json.dumps(result, indent=1) + "\n")
    return result


def _shipped_heldout(args: argparse.Namespace, cfg: Path) -> dict[str, Any] | None:
    """A shipped start's own held-out results as the study's step 0, when they are the evaluation the
    study would make: every held-out question (--eval-limit covers them), greedy, in the same answer
    shape. The per-question file is copied to OUT/questions/start-step0.jsonl."""
    from llds import starts

    if args.model or PRESETS[args.preset][0] != "cpu" or not getattr(args, "eval_steps", None):
        return None
    start = starts.load(getattr(args, "start", None) or DEFAULT_START)
    held = start.manifest.get("heldout") or {}
    path = start.folder / starts.HELDOUT
    if not path.is_file() or args.eval_limit < int(held.get("n", 0)) or not held.get("rollout_config"):
        return None
    if _shape(ROOT / held["rollout_config"]) != _shape(cfg):
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    write_questions(args.out / QUESTIONS / "start-step0.jsonl", rows)
    n = len(rows)
    return {"eval_em": sum(r["em"] for r in rows) / n, "eval_f1": sum(r["f1"] for r in rows) / n,
            "eval_searches": sum(r["searches"] for r in rows) / n, "eval_n": n, "eval_shape": _shape(cfg),
            "from": f"{start.folder.relative_to(ROOT)}/{starts.HELDOUT}"}  # fmt: skip


def _run_or_exit(*a: Any, **k: Any) -> dict[str, Any]:
    try:
        return run_one(*a, **k)
    except (Interrupted, KeyboardInterrupt) as e:
        raise SystemExit(
            f"llds experiment: interrupted ({str(e) or 'Ctrl-C'}); finished runs are kept"
        ) from None


def trainer_sets(items: list[str] | None) -> dict[str, Any]:
    """``--trainer-set KEY=VALUE`` items as a nested override (``optimizer.lr=4e-5`` ->
    ``{"optimizer": {"lr": 4e-05}}``); a value is read as TOML (numbers, booleans, quoted strings), a
    bare word as a string. ValueError names a malformed item."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, eq, raw = item.partition("=")
        if not eq or not key.strip() or any(not part for part in key.strip().split(".")):
            raise ValueError(f"--trainer-set wants KEY=VALUE (dotted keys), got {item!r}")
        try:
            value = tomllib.loads(f"v = {raw.strip()}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw.strip()
        node = out
        *parents, last = key.strip().split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _merge_results(out: Path, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OUT/results.json with ``new`` merged in by (arm, seed), ordered by seed then arm: invocations of
    the study with different --seeds or --arms add up instead of overwriting each other."""
    path = out / "results.json"
    old = json.loads(path.read_text()) if path.is_file() else []
    by = {(r["arm"], r["seed"]): r for r in [*old, *new]}
    order = {a: i for i, a in enumerate(ARMS)}
    results = sorted(by.values(), key=lambda r: (r["seed"], order.get(r["arm"], len(order)), r["arm"]))
    path.write_text(json.dumps(results, indent=1) + "\n")
    return results


def _write_study(args: argparse.Namespace, seeds: list[int], arms: list[str]) -> None:
    """OUT/study.json: this command, with --seeds and --arms widened to every earlier invocation's."""
    path = args.out / "study.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    seen_seeds = set(_ints(str(old.get("seeds", "")))) | set(seeds)
    seen_arms = {x for x in str(old.get("arms", "")).split(",") if x.strip()} | set(arms)
    study = {k: getattr(args, k) for k in STUDY_KEYS}
    # The report's "Start:" line names it: a shipped start, or the --model folder.
    model = getattr(args, "model", None)
    study["start"] = Path(model).name if model else (getattr(args, "start", None) or DEFAULT_START)
    differ = [f"{k} {old[k]!r} there, {study[k]!r} here"
              for k in ("preset", "steps", "eval_limit", "eval_steps", "trainer_set", "stop_dead", "start_digest")
              if k in old and old[k] != study[k]]  # fmt: skip
    if differ:
        raise SystemExit(
            f"llds experiment: {path} is another study ({'; '.join(differ)}); pass another --out"
        )
    study["seeds"] = ",".join(str(x) for x in sorted(seen_seeds))
    study["arms"] = ",".join(
        sorted(seen_arms, key=lambda a: (list(ARMS).index(a) if a in ARMS else len(ARMS), a))
    )
    # The (arm, seed) runs some piece asked for: the union of --seeds x --arms over-states a study run in
    # pieces (`--seeds 2 --arms grpo` does not plan grpo_ds on seed 2).
    planned = old.get("planned", [])
    planned += [[a, s] for s in seeds for a in arms if [a, s] not in planned]
    study["planned"] = args.planned = planned
    path.write_text(json.dumps(study) + "\n")


def load_logs(out: Path, results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    logs = {}
    for r in results:
        name = run_name(r["arm"], r["seed"])
        path = out / "logs" / f"{name}.jsonl"
        logs[name] = K.read_records(path)
    return logs


def plot_stem(key: str) -> str:
    """File name (without ``.png``) of a signal's figure: ``reward/mean`` -> ``reward_mean``."""
    return key.replace("/", "_")


def plot(results: list[dict[str, Any]], logs: dict[str, list[dict[str, Any]]], out: Path) -> list[Path]:
    """One figure per signal: every run thin, each arm's mean over its seeds bold."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(dict.fromkeys(r["arm"] for r in results))
    colors = {a: f"C{i}" for i, a in enumerate(arms)}
    paths = []
    for key, title in SIGNALS:
        fig, ax = plt.subplots(figsize=(7, 3.4))
        drawn = False
        for arm in arms:
            runs = [_series(logs[run_name(arm, r["seed"])], key) for r in results if r["arm"] == arm]
            for ys in runs:
                pts = [(i + 1, v) for i, v in enumerate(ys) if v is not None]
                if pts:
                    ax.plot(*zip(*pts, strict=True), color=colors[arm], lw=0.8, alpha=0.45)
                    drawn = True
            n = max((len(ys) for ys in runs), default=0)
            mean = []
            for i in range(n):
                vals = [ys[i] for ys in runs if i < len(ys) and ys[i] is not None]
                mean.append((i + 1, sum(vals) / len(vals)) if vals else None)  # type: ignore[arg-type]
            pts = [p for p in mean if p is not None]
            if pts:
                ax.plot(
                    *zip(*pts, strict=True), color=colors[arm], lw=2.4, label=f"{arm} (mean of {len(runs)})"
                )
        if not drawn:
            plt.close(fig)
            continue
        ax.set_title(title)
        ax.set_xlabel("RL step")
        ax.legend(fontsize=7)
        fig.tight_layout()
        p = out / f"{plot_stem(key)}.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def _f(x: object) -> str:
    if isinstance(x, float):
        return f"{x:.3f}"
    return "-" if x is None else str(x)


def paired(results: list[dict[str, Any]], key: str, baseline: str = "grpo") -> list[str]:
    """Per-seed differences of ``key`` from the baseline arm, with their mean and spread per arm."""
    base = {r["seed"]: r.get(key) for r in results if r["arm"] == baseline}
    rows = []
    for arm in dict.fromkeys(r["arm"] for r in results if r["arm"] != baseline):
        diffs = [(r["seed"], r[key] - base[r["seed"]]) for r in results
                 if r["arm"] == arm and r.get(key) is not None and base.get(r["seed"]) is not None]  # fmt: skip
        if not diffs:
            continue
        d = [x for _, x in diffs]
        spread = statistics.stdev(d) if len(d) > 1 else None
        rows.append(f"| {arm} - {baseline} | {key} | " + ", ".join(f"s{s}: {x:+.3f}" for s, x in diffs)
                    + f" | {statistics.fmean(d):+.3f} | {_f(spread)} |")  # fmt: skip
    return rows


def report(
    results: list[dict[str, Any]],
    args: argparse.Namespace,
    plots: list[Path],
    plot_prefix: str = "",
    base: dict[str, Any] | None = None,
) -> str:
    lines = [
        "# The LLD experiment",
        "",
        f"Command: `llds experiment lld --preset {args.preset} --steps {args.steps} --eval-limit {args.eval_limit}"
        f" --seeds {args.seeds} --arms {args.arms}`. Every (arm, seed) is a full `llds up` run from the preset's starting"
        " policy; reward is exact match. Collapse: the 10-step moving average of the training reward falls below"
        " half its peak and stays there (step given). Evaluation: greedy on the synthetic world's held-out split.",
        "",
        "| arm | seed | steps | reward first -> last tenth | peak MA | collapse step | logp slope turns < 0 "
        "| first warning | alarm acted | eval EM | start EM |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    results = [r | {"start_eval_em": _start_em(r, base)} for r in results]
    for r in results:
        lines.append(
            f"| {r['arm']} | {r['seed']} | {r['steps']} | {_f(r['reward_first'])} -> {_f(r['reward_last'])} "
            f"| {_f(r['reward_peak_ma'])} | {_f(r['collapse_step'])} | {_f(r['logp_turn_step'])} "
            f"| {_f(r['first_warning_step'])} | {_f(r['first_action_step'])} | {_f(r.get('eval_em'))} "
            f"| {_f(r['start_eval_em'])} |"
        )
    if base is not None:
        lines += ["", f"The starting policy (`{Path(base['model']).name}`), evaluated the same way: held-out EM "
                  f"{_f(base['eval_em'])} on {base['eval_n']} questions."]  # fmt: skip
    if len(starts := _starts(results)) > 1:
        lines += ["", "Not every run is known to start from the same policy (SHA-256 of its weights; a warm start "
                  "regenerated on another machine is not bit-identical): " + "; ".join(f"{d}: {', '.join(n)}" for d, n in starts.items())
                  + ". Paired differences across them mix the arm's effect with the start's."]  # fmt: skip
    if not results:
        lines += ["", "No (arm, seed) run of this command has finished yet."]
    have = {(r["arm"], r["seed"]) for r in results}
    planned = getattr(args, "planned", None) or [
        (a, s) for s in _ints(str(args.seeds)) for a in str(args.arms).split(",") if a
    ]  # a study recorded before pieces were: every arm on every seed
    todo = [f"{a} s{s}" for a, s in planned if (a, s) not in have]
    if results and todo:
        lines += ["", f"Not finished yet (the command with `--resume` runs them): {', '.join(todo)}."]
    gains = [r | {"eval_em - start": r["eval_em"] - r["start_eval_em"]} for r in results
             if r.get("eval_em") is not None and r["start_eval_em"] is not None]  # fmt: skip
    diffs = paired(results, "eval_em") + paired(gains, "eval_em - start") + paired(results, "reward_last")
    if diffs:
        lines += ["", "Paired by seed, against GRPO (`eval_em - start`: each run's held-out EM less its own "
                  "starting policy's, which pairs runs that started from different policies):", "", "| arms | figure | per seed | mean | std |",
                  "|---|---|---|---|---|", *diffs]  # fmt: skip
    if getattr(args, "eval_steps", None) and (args.out / QUESTIONS / "start-step0.jsonl").is_file():
        from llds import study

        more, _figs = study.section(args.out, list(ARMS))
        lines += ["", "## Held-out evaluation at checkpoints (per question, paired)", "",
                  "Definitions, arms and statistics as declared in docs/study/DESIGN.md.", "", *more]  # fmt: skip
    lines += ["", *[f"![{p.stem}]({plot_prefix}{p.name})" for p in plots], ""]
    return "\n".join(lines)


def repo_report(
    results: list[dict[str, Any]],
    args: argparse.Namespace,
    plots: list[Path],
    base: dict[str, Any] | None = None,
) -> str:
    """The repository's EXPERIMENTS.md: the comparison, then the collapse search it rests on (from
    docs/collapse-search/results.json), then the hand-written reading (docs/experiment-lld/notes.md)."""
    md = report(results, args, plots, plot_prefix="docs/experiment-lld/", base=base)
    found = SEARCH_DIR / "results.json"
    if found.is_file():
        search = json.loads(found.read_text())
        figs = sorted(p.name for p in SEARCH_DIR.glob("*.png"))
        md += "\n".join(["", "## The collapse search", "",
                         "Command: `llds experiment search` (grid `configs/collapse_search.toml`, seed 0, GRPO; logs "
                         "in `docs/collapse-search/logs/`, table rebuilt with `--report-only`).", "",
                         *search_table(search), "", *[f"![search {f}](docs/collapse-search/{f})" for f in figs], ""])  # fmt: skip
    notes = ROOT / "docs" / "experiment-lld" / "notes.md"
    if notes.is_file():
        md += "\n" + notes.read_text()
    return md


def _start_em(r: dict[str, Any], base: dict[str, Any] | None) -> float | None:
    """Held-out EM of the policy run ``r`` started from: recorded with the run, else the study's
    baseline when the digests say it is the same policy."""
    if r.get("start_eval_em") is not None:
        return float(r["start_eval_em"])
    if base and base.get("digest") and r.get("start_digest") == base["digest"]:
        return float(base["eval_em"])
    return None


def _starts(results: list[dict[str, Any]]) -> dict[str, list[str]]:
    """Runs by the digest of their starting policy (``not recorded`` for runs from before digests)."""
    out: dict[str, list[str]] = {}
    for r in results:
        out.setdefault(r.get("start_digest") or "not recorded", []).append(run_name(r["arm"], r["seed"]))
    return out


def _stopped(r: dict[str, Any]) -> str:
    at = r.get("stopped_dead_at")
    if at is None:
        return "-"
    why = r.get("stopped_why") or f"reward 0 for {r.get('stop_dead', '?')} steps"
    return f"{at} ({why})"


def search_table(results: list[dict[str, Any]]) -> list[str]:
    """The collapse search's table: one row per setting tried, collapsed or not."""
    lines = [
        "| setting | overrides (trainer; rollout) | steps | s/step | reward first -> last tenth | peak MA "
        "| collapse step | logp slope < 0 from | LLD before collapse | stopped dead at |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        skip = ("regularizer", "regularizer.type")
        over = ", ".join(f"{k}={v}" for k, v in flat_keys(r["overrides"]).items() if k not in skip)
        if r.get("rollout_overrides"):
            over += "; " + ", ".join(f"{k}={v}" for k, v in flat_keys(r["rollout_overrides"]).items())
        c, t = r["collapse_step"], r["logp_turn_step"]
        first = "-" if c is None else ("yes" if t is not None and t < c else "no")
        lines.append(
            f"| {r['arm']} | {over} | {r['steps']} | {_f(r.get('step_s_median'))} "
            f"| {_f(r['reward_first'])} -> {_f(r['reward_last'])} | {_f(r['reward_peak_ma'])} | {_f(c)} "
            f"| {_f(t)} | {first} | {_stopped(r)} |"
        )
    return lines


def _copy_to_repo(dest: Path, files: list[Path], out: Path, logs: dict[str, Any]) -> None:
    """Copy ``files`` into ``dest`` and each run's compact log (OUT/logs/<name>.jsonl) into dest/logs."""
    import shutil

    (dest / "logs").mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(f, dest / f.name)
    for name in logs:
        shutil.copy(out / "logs" / f"{name}.jsonl", dest / "logs" / f"{name}.jsonl")


def export(out: Path, dest: Path) -> list[Path]:
    """Copy what the study's report is rebuilt from into ``dest`` (to commit): study.json, results.json,
    the start's evaluation (baseline.json), the compact step logs, the per-question results, the
    probe-set LLD and a load record if one was kept (``load.log``: ``unix-time /proc/loadavg`` lines). ``llds experiment lld --report-only --out DEST`` then regenerates the report and its
    figures from those files alone."""
    import shutil

    copied = []
    pairs = [(out / "study.json", dest / "study.json"), (out / "results.json", dest / "results.json"),
             (out / "baseline" / "result.json", dest / "baseline.json"), (out / "load.log", dest / "load.log")]  # fmt: skip
    for sub in ("logs", QUESTIONS, LLD):
        pairs += [(f, dest / sub / f.name) for f in sorted((out / sub).glob("*.json*"))]
    for src, dst in pairs:
        if src.is_file():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
            copied.append(dst)
    return copied


def _interruptible() -> None:
    """Ctrl-C stops the experiment (after its current run stopped cleanly) even when it was started
    with SIGINT ignored (a script's background job inherits that)."""
    import signal

    signal.signal(signal.SIGINT, signal.default_int_handler)


def search_main(argv: list[str] | None = None) -> int:
    """``llds experiment search``: each setting of a grid file is one GRPO run (its own ``llds up``);
    the table says which collapsed, when, and whether the correct responses' likelihood fell first."""
    p = argparse.ArgumentParser(prog="llds experiment search", description=search_main.__doc__)
    p.add_argument("--grid", type=Path, default=ROOT / "configs" / "collapse_search.toml",
                   help="TOML: preset, arm, and [[setting]] tables (name, trainer = {...}, rollout = {...})")  # fmt: skip
    p.add_argument("--steps", type=int, default=30, help="RL steps per setting")
    p.add_argument("--seed", type=int, default=0, help="trainer seed of every setting")
    p.add_argument("--stop-dead", type=int, default=6,
                   help="stop a setting once this many consecutive steps had zero reward (0 = never)")  # fmt: skip
    p.add_argument("--only", help="comma-separated setting names to run (default: all)")
    p.add_argument("--out", type=Path, default=Path("runs/collapse-search"), help="output folder")
    p.add_argument("--resume", action="store_true", help="skip finished settings, continue interrupted ones")
    p.add_argument("--report-only", action="store_true", help="rebuild the table and plots from OUT")
    p.add_argument("--write-repo-report", action="store_true",
                   help=f"also copy logs, results and plots to {SEARCH_DIR.relative_to(ROOT)}/")  # fmt: skip
    args = p.parse_args(argv)
    _interruptible()
    try:
        grid = tomllib.loads(args.grid.read_text())
    except (OSError, tomllib.TOMLDecodeError) as e:
        p.error(f"--grid {args.grid}: {e}")
    settings = grid.get("setting", [])
    names = [s.get("name") for s in settings]
    arm = grid.get("arm", "grpo")
    args.preset, args.model, args.trainer_config = grid.get("preset", "cpu"), None, None
    args.start = grid.get("start", DEFAULT_START)
    args.eval_limit = 0
    if (
        arm not in ARMS
        or args.preset not in PRESETS
        or not settings
        or None in names
        or len(set(names)) < len(names)
    ):
        p.error(f"--grid {args.grid}: needs arm in {list(ARMS)}, preset in {list(PRESETS)} and [[setting]] "
                "tables with distinct names")  # fmt: skip
    only = [n.strip() for n in args.only.split(",")] if args.only else names
    if unknown := [n for n in only if n not in names]:
        p.error(f"--only: no setting named {unknown} in {args.grid}")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.json"
    done = {r["arm"]: r for r in json.loads(path.read_text())} if path.is_file() else {}
    if not args.report_only:
        for s in settings:
            if s["name"] in only:
                done[s["name"]] = _run_or_exit(s["name"], args.seed, args, merged(ARMS[arm], s.get("trainer", {})),
                                          s.get("rollout") or None)  # fmt: skip
                results = [done[n] for n in names if n in done]
                path.write_text(json.dumps(results, indent=1) + "\n")
    results = [done[n] for n in names if n in done]
    if not results:
        p.error(f"no finished setting in {args.out}")
    logs = load_logs(args.out, results)
    shown = {plot_stem(k) for k in (K.REWARD_MEAN, K.LLD_CORRECT_LOGP_TOKEN, K.ACTOR_ENTROPY)}
    plots = [x for x in plot(results, logs, args.out) if x.stem in shown]
    md = ["# Collapse search", "", f"Grid: `{args.grid.name}`; command: `llds experiment search --steps "
          f"{args.steps} --stop-dead N` (N per run: last column).", "", *search_table(results),
          "", *[f"![{x.stem}]({x.name})" for x in plots], ""]  # fmt: skip
    (args.out / "SEARCH.md").write_text("\n".join(md))
    if args.write_repo_report:
        _copy_to_repo(SEARCH_DIR, [*plots, path, args.out / "SEARCH.md"], args.out, logs)
    print("\n".join(md))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llds experiment lld", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--preset",
        default="cpu",
        choices=list(PRESETS),
        help="preset of every run (cpu-collapse: the collapse regime)",
    )
    p.add_argument("--model", help="starting policy folder (default: the cpu presets' shipped --start)")
    p.add_argument(
        "--start", default="smollm2-demos160", help="shipped start of the cpu presets (llds start list)"
    )
    p.add_argument("--trainer-config", help="base trainer TOML (default configs/trainer_<preset>.toml)")
    p.add_argument("--trainer-set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a trainer setting of every arm (dotted keys: optimizer.lr=4e-5); repeatable")  # fmt: skip
    p.add_argument("--steps", type=int, default=8, help="RL steps per run")
    p.add_argument(
        "--eval-limit", type=int, default=100, help="held-out questions per run (0 = skip evaluation)"
    )
    p.add_argument("--eval-steps", default="",
                   help="comma-separated steps whose weights are evaluated after each run (the preset must keep "
                        "them: keep_versions_every); per-question results go to OUT/questions/")  # fmt: skip
    p.add_argument("--seeds", default="0,1", help="comma-separated trainer seeds; every arm runs each")
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of " + ",".join(ARMS))
    p.add_argument("--out", type=Path, default=Path("runs/experiment-lld"), help="output folder")
    p.add_argument("--resume", action="store_true", help="skip finished runs, continue interrupted ones")
    p.add_argument("--keep-weights", action="store_true",
                   help="keep a finished run's checkpoints and published versions (default: once evaluated, "
                        "only its newest weights stay; RUN/PRUNED lists what went)")  # fmt: skip
    p.add_argument("--stop-dead", type=int, default=0,
                   help="stop a run once this many consecutive steps had zero reward (0 = never)")  # fmt: skip
    p.add_argument("--write-repo-report", action="store_true",
                   help="also write the repository's EXPERIMENTS.md (plots and logs into docs/experiment-lld/)")  # fmt: skip
    p.add_argument("--export", type=Path, metavar="DIR",
                   help="also copy the files the report is rebuilt from into DIR (to commit: --report-only --out DIR)")  # fmt: skip
    p.add_argument(
        "--report-only",
        action="store_true",
        help="rebuild plots and report from OUT/results.json and OUT/logs",
    )
    args = p.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    bad = [a for a in arms if a not in ARMS]
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        p.error(f"--seeds must be comma-separated integers, got {args.seeds!r}")
    try:
        trainer_sets(args.trainer_set)
    except ValueError as e:
        p.error(str(e))
    try:
        args.eval_steps = sorted(set(_ints(args.eval_steps)))
    except ValueError:
        p.error(f"--eval-steps must be comma-separated integers, got {args.eval_steps!r}")
    if any(x < 1 or x > args.steps for x in args.eval_steps):
        p.error(f"--eval-steps must lie in 1..--steps ({args.steps}), got {args.eval_steps}")
    if bad or not seeds or args.steps < 1 or args.eval_limit < 0:
        p.error(
            f"arms must be among {list(ARMS)} (got {bad}), --seeds non-empty, --steps >= 1, --eval-limit >= 0"
        )
    _interruptible()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        path = args.out / "results.json"
        if not path.is_file():
            p.error(f"--report-only needs {path} (written by a run of the experiment)")
        results = json.loads(path.read_text())
        study = args.out / "study.json"
        if study.is_file():
            for k, v in json.loads(study.read_text()).items():
                setattr(args, k, v)
    else:
        # One start per study: its digest is recorded in study.json and every run's result; a piece of
        # the study started from other bytes is refused before anything runs.
        args.start_digest = policy_digest(start_policy(args))
        _write_study(args, seeds, arms)
        start = baseline(args) or {}
        args.start_eval_em = start.get("eval_em")
        if args.eval_steps and args.eval_limit and not (args.out / LLD / "start.json").is_file():
            probe_lld({0: start_policy(args)}, args.out / LLD / "start.json")  # type: ignore[dict-item]
        results = []
        for s in seeds:
            for a in arms:
                results = _merge_results(args.out, [_run_or_exit(a, s, args)])
    logs = load_logs(args.out, results)
    plots = plot(results, logs, args.out)
    found = args.out / "baseline" / "result.json"
    # A study's folder keeps it there; the repository's copy (docs/experiment-lld) as baseline.json.
    copy = found if found.is_file() else args.out / "baseline.json"
    base = json.loads(copy.read_text()) if copy.is_file() else None
    md = report(results, args, plots, base=base)
    (args.out / "EXPERIMENTS.md").write_text(md)
    if args.export:
        print(f"exported {len(export(args.out, args.export))} files to {args.export}", flush=True)
    if args.write_repo_report:
        files = [*plots, args.out / "results.json", args.out / "study.json"]
        _copy_to_repo(ROOT / "docs" / "experiment-lld", files, args.out, logs)
        if found.is_file():
            import shutil

            shutil.copy(found, ROOT / "docs" / "experiment-lld" / "baseline.json")
        (ROOT / "EXPERIMENTS.md").write_text(repo_report(results, args, plots, base=base))
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
