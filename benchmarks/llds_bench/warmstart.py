"""``llds bench warmstart``: rebuilding a shipped start, timed, against the warm start as it was.

Runs ``llds warmstart`` with the settings a shipped start's manifest records (its command), on this
machine, in a child process: wall time, tokens/s, peak resident memory, and whether the adapter it
trains is the shipped one bit for bit. Then, in the same invocation, the baseline: the tree at
``--baseline-ref`` (the full fine-tune that computed float32 logits over the whole vocabulary at
every position) on the first ``--baseline-examples`` demonstrations, for its tokens/s and memory.
Each child's peak memory is its own (``getrusage`` of a wrapper process that runs only it).

    llds bench warmstart --out docs/warmstart_bench.md --json docs/warmstart_bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from llds_bench.step import BASELINE_REF, PACKAGE_DIRS, cpu_times, extract

_WRAP = (
    "import json, resource, subprocess, sys, time; t = time.perf_counter(); r = subprocess.run(sys.argv[1:]); "
    "print(json.dumps({'rc': r.returncode, 'wall_s': time.perf_counter() - t, "
    "'peak_rss_gib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20}))"
)
"""A wrapper that runs one command and prints its wall time and peak resident memory (KiB on Linux)."""


def measured(cmd: list[str], env: dict[str, str], log: Path) -> dict[str, Any]:
    """Run ``cmd`` under the wrapper; its output to ``log``; the wrapper's figures and the CPU steal."""
    import subprocess

    steal0, total0 = cpu_times()
    with log.open("w") as f:
        res = subprocess.run(
            [sys.executable, "-c", _WRAP, *cmd], env=env, stdout=subprocess.PIPE, stderr=f, text=True
        )
    steal1, total1 = cpu_times()
    last = res.stdout.strip().splitlines()[-1] if res.stdout.strip() else "{}"
    out = dict(json.loads(last))
    out["cpu_steal_frac"] = (steal1 - steal0) / max(total1 - total0, 1)
    log.write_text(log.read_text() + res.stdout)
    if out.get("rc") != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed; see {log}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llds bench warmstart", description=__doc__.split("\n\n")[0])
    p.add_argument("--start", default=None, help="shipped start to rebuild (default: the default start)")
    p.add_argument("--baseline-ref", default=BASELINE_REF)
    p.add_argument("--baseline-examples", type=int, default=24, help="demonstrations the baseline trains on")
    p.add_argument("--work", type=Path, default=Path("runs/bench-warmstart"))
    p.add_argument("--out", type=Path, help="Markdown section to write")
    p.add_argument("--json", type=Path, help="figures as JSON")
    args = p.parse_args(argv)
    from llds import assets, starts
    from llds.up import ensure_world
    from llds_proto.digest import short, tensors_digest

    start = starts.load(args.start or starts.DEFAULT_START)
    m = start.manifest
    base, world = assets.smollm2_dir(), ensure_world(m["world"]["seed"])
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    cmd = starts.concrete(m["command"].split()[1:], base, world, work / "new")  # [1:]: drop "llds"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    print(f"== rebuild of start {start.name}: llds {' '.join(cmd)}", flush=True)
    new = measured([sys.executable, "-m", "llds.cli", *cmd], env, work / "new.log")
    info = json.loads((work / "new" / "warmstart.json").read_text())
    new |= {"tokens": info["tokens"], "train_s": info["seconds"], "tokens_per_s": info["tokens"] / info["seconds"],
            "precision": info["precision"], "adapter_digest": tensors_digest(work / "new" / "adapter"),
            "same_adapter": tensors_digest(work / "new" / "adapter") == m["adapter_digest"]}  # fmt: skip
    tree = extract(args.baseline_ref, Path(tempfile.mkdtemp(prefix="llds-baseline-")))
    bcmd = ["warmstart", "--model", str(base), "--world", str(world), "--out", str(work / "baseline"),
            "--max-examples", str(args.baseline_examples)]  # fmt: skip
    print(f"== baseline ({args.baseline_ref}): llds {' '.join(bcmd)}", flush=True)
    benv = {**env, "PYTHONPATH": os.pathsep.join(str(tree / d) for d in PACKAGE_DIRS)}
    old = measured([sys.executable, "-m", "llds.cli", *bcmd], benv, work / "baseline.log")
    binfo = json.loads((work / "baseline" / "warmstart.json").read_text())
    old |= {"train_s": binfo["seconds"], "examples": binfo["examples"]}
    # The old warmstart.json has no token count: the same demonstrations, tokenized, give it.
    from transformers import AutoTokenizer

    from llds_trainer.warmstart import build_demonstrations

    demos = build_demonstrations(AutoTokenizer.from_pretrained(str(base)), world, args.baseline_examples, 0)
    old["tokens"] = sum(len(d.prompt_ids) + len(d.response_ids) for d in demos)
    old["tokens_per_s"] = old["tokens"] / old["train_s"]
    meta = {"command": "llds bench warmstart " + " ".join(argv if argv is not None else sys.argv[1:]),
            "start": start.name, "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
            "baseline_ref": args.baseline_ref}  # fmt: skip
    md = "\n".join([
        f"## Warm start rebuild (start `{start.name}`)",
        "",
        f"Command: `{meta['command']}` ({meta['cpus']} CPUs, {meta['date']}). The rebuild runs the command the "
        f"start's manifest records; the baseline is `llds warmstart` of the tree at `{args.baseline_ref}` (full "
        f"fine-tune, float32 logits over the whole vocabulary at every position) on the first "
        f"{args.baseline_examples} demonstrations, in the same invocation.",
        "",
        "| run | wall (s) | training (s) | tokens | tokens/s | peak memory (GiB) | CPU steal |",
        "|---|---|---|---|---|---|---|",
        f"| rebuild ({new['precision']}) | {new['wall_s']:.0f} | {new['train_s']:.0f} | {new['tokens']} | "
        f"{new['tokens_per_s']:.0f} | {new['peak_rss_gib']:.2f} | {100 * new['cpu_steal_frac']:.0f}% |",
        f"| baseline | {old['wall_s']:.0f} | {old['train_s']:.0f} | {old['tokens']} | {old['tokens_per_s']:.0f} | "
        f"{old['peak_rss_gib']:.2f} | {100 * old['cpu_steal_frac']:.0f}% |",
        "",
        f"Tokens/s, rebuild over baseline: {new['tokens_per_s'] / old['tokens_per_s']:.2f}x. The rebuilt adapter "
        f"{'is' if new['same_adapter'] else 'is not'} the shipped one bit for bit (digest "
        f"{short(new['adapter_digest'])}, shipped {short(m['adapter_digest'])}).",
        "",
    ])  # fmt: skip
    print(md)
    if args.out:
        args.out.write_text(md)
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "rebuild": new, "baseline": old}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
