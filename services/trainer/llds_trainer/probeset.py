"""LLD as the paper defines it: the log-likelihood of one fixed set of correct trajectories, re-scored
under each checkpoint's weights (not fresh samples, whose likelihood follows the policy's entropy).

The probe set is the synthetic world's protocol demonstrations of train-split rows that no shipped
start was trained on (rows 160.. by default: the starts use the first 64 or 160), tokenized exactly as
``llds warmstart`` tokenizes them (think, search, the retrieved documents, think, answer). The score of
a policy is the mean log-probability of their assistant tokens (documents and prompt excluded).

    llds trainer probe-lld --world DIR --model START --model CKPT10 --model CKPT20 --out lld.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

FIRST = 160
COUNT = 32


def score(model_dir: Path, samples: list[Any], micro: int = 2) -> list[tuple[float, int]]:
    """(sum of assistant-token log-probs, their count) of each sample under ``model_dir``'s weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from llds_trainer.batch import collate
    from llds_trainer.scoring import target_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    order = sorted(
        range(len(samples)), key=lambda i: len(samples[i].prompt_ids) + len(samples[i].response_ids)
    )
    out: list[tuple[float, int]] = [(0.0, 0)] * len(samples)
    with torch.no_grad():
        for k in range(0, len(order), micro):
            idx = order[k : k + micro]
            mb = collate([samples[i] for i in idx], idx, int(pad))
            logp, _ = target_logprobs(model, mb.input_ids, mb.attention_mask, mb.targets, mb.loss_mask)
            for b, i in enumerate(idx):
                out[i] = (float((logp[b] * mb.loss_mask[b]).sum()), int(mb.loss_mask[b].sum()))
    return out


def probe_samples(tokenizer: Any, world: Path, first: int = FIRST, count: int = COUNT) -> list[Any]:
    """The fixed probe set as trainer samples (loss mask on the assistant tokens)."""
    from llds_trainer.warmstart import build_demonstrations

    demos = build_demonstrations(tokenizer, world, count, seed=0, first=first)
    if len(demos) < count:
        raise ValueError(
            f"{world}/train.jsonl has {first + len(demos)} rows: no {count} demonstrations from row {first}"
        )
    return [d.sample(reward=1.0) for d in demos]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llds trainer probe-lld", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--world", type=Path, required=True, help="synthetic world folder (train.jsonl, corpus.jsonl)"
    )
    p.add_argument("--model", type=Path, action="append", required=True, help="policy folder (repeatable)")
    p.add_argument("--first", type=int, default=FIRST, help="first train-split row of the probe set")
    p.add_argument("--count", type=int, default=COUNT, help="demonstrations in the probe set")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--out", type=Path, help="write the scores here as JSON (default: print them)")
    args = p.parse_args(argv)
    if args.first < 0 or args.count < 1:
        p.error(f"--first must be >= 0 and --count >= 1, got {args.first} and {args.count}")
    missing = [str(m) for m in args.model if not (m / "config.json").is_file()]
    if missing or not (args.world / "train.jsonl").is_file():
        p.error(
            f"not a policy folder: {', '.join(missing)}" if missing else f"no train.jsonl in {args.world}"
        )
    import torch
    from transformers import AutoTokenizer

    if args.threads:
        torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model[0])
    try:
        samples = probe_samples(tok, args.world, args.first, args.count)
    except ValueError as e:
        p.error(str(e))
    rows = []
    for m in args.model:
        per = score(m, samples)
        tokens = sum(n for _, n in per)
        rows.append({"model": str(m), "logp_token": sum(s for s, _ in per) / tokens, "tokens": tokens,
                     "per_demo": [{"id": x.group_id, "logp": s, "tokens": n} for x, (s, n) in zip(samples, per, strict=True)]})  # fmt: skip
    report = {"world": str(args.world), "first": args.first, "count": args.count, "models": rows}
    text = json.dumps(report, indent=1) + "\n"
    if args.out:
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
