"""``llds bench trainer``: step time of GRPO against GRPO + LLDS (action gate, MA on) on the same batch.

Both variants get the same synthetic batch (rollout token layout) and the same initial weights;
steps alternate between them after one untimed warm-up step each. Reports the median step time,
their ratio (target <= 1.05), trained tokens/s and peak memory, and writes a Markdown table::

    llds bench trainer --model MODEL_DIR [--groups 2 --group-size 5 --repeats 3] \\
        [--out docs/trainer_bench.md]
"""

from __future__ import annotations

import argparse
import platform
import resource
import statistics
import sys
import time
from pathlib import Path

from llds_proto import steplog as K


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="llds bench trainer", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="policy folder (e.g. the SmolLM2 or tiny test model)")
    p.add_argument("--groups", type=int, default=2)
    p.add_argument("--group-size", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument("--think-words", type=int, default=12)
    p.add_argument("--doc-words", type=int, default=40)
    p.add_argument("--device", default="auto")
    p.add_argument("--out", help="write the Markdown report here (e.g. docs/trainer_bench.md)")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.groups < 1:
        print("llds bench trainer: --repeats and --groups must be >= 1", file=sys.stderr)
        return 2

    import torch
    from tqdm import tqdm
    from transformers import AutoTokenizer

    from llds_trainer.config import TrainerConfig
    from llds_trainer.core import Trainer
    from llds_trainer.synthetic import synthetic_groups

    tok = AutoTokenizer.from_pretrained(args.model)
    groups = synthetic_groups(
        tok, args.groups, args.group_size, seed=0, think_words=args.think_words, doc_words=args.doc_words
    )
    common = dict(
        model=args.model, device=args.device, optimizer={"lr": 1e-6}, micro_batch_size=args.micro_batch_size,
        minibatches_per_step=2, lld={"probe": False}, seed=0,
    )  # fmt: skip
    variants = {
        "GRPO": TrainerConfig(**common, regularizer="none"),
        "GRPO + LLDS (action, MA)": TrainerConfig(
            **common, regularizer={"type": "llds", "gate": "action", "answer_weight_mode": "adaptive_code"}
        ),
    }
    trainers = {name: Trainer(cfg) for name, cfg in variants.items()}
    times: dict[str, list[float]] = {n: [] for n in trainers}
    update_times: dict[str, list[float]] = {n: [] for n in trainers}
    tokens = sum(len(t.prompt_ids) + len(t.response_ids) for g in groups for t in g.trajectories)
    loss_tokens = sum(sum(t.loss_mask) for g in groups for t in g.trajectories)
    for tr in trainers.values():
        tr.train_step(groups)  # warm-up
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    for _ in tqdm(range(args.repeats), desc="bench trainer", unit="round"):
        for name, tr in trainers.items():
            t0 = time.perf_counter()
            rec = tr.train_step(groups)
            times[name].append(time.perf_counter() - t0)
            update_times[name].append(rec[K.PERF_UPDATE_S])
    med = {n: statistics.median(v) for n, v in times.items()}
    upd = {n: statistics.median(v) for n, v in update_times.items()}
    base, llds = list(trainers)
    ratio = med[llds] / med[base]
    peak = (
        f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB (CUDA, both variants)"
        if torch.cuda.is_available()
        else f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB RSS (process, both variants)"
    )
    lines = [
        "# Trainer benchmark: GRPO vs GRPO + LLDS",
        "",
        f"Model `{Path(args.model).name}`, {args.groups} groups x {args.group_size} trajectories "
        f"({tokens} tokens, {loss_tokens} loss tokens) per step, 2 updates per step, micro-batch "
        f"{args.micro_batch_size}, device {trainers[base].device}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}; median of {args.repeats} steps after one warm-up.",
        "",
        "| variant | step s | update s | tokens/s (step) |",
        "|---|---|---|---|",
    ]
    for n in trainers:
        lines.append(f"| {n} | {med[n]:.3f} | {upd[n]:.3f} | {tokens * 2 / med[n]:.0f} |")
    lines += [
        "",
        f"Step time ratio LLDS / GRPO: **{ratio:.3f}** (target <= 1.05). Peak memory: {peak}.",
        "",
        "Tokens/s counts every token of each sequence once per update pass (2 per step); a step also",
        "runs one no-grad pi_old pass. Reproduce: `llds bench trainer --model DIR --out docs/trainer_bench.md`.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
