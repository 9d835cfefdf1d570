"""``llds warmstart``: supervised warm-start on search-protocol demonstrations.

SmolLM2-135M does not follow the Search-R1 protocol out of the box (0/24 complete ``<search>``
calls); a short fine-tune on demonstrations built from the synthetic world fixes that. Each
demonstration is tokenized exactly as the rollout builds trajectories (``prompt_ids`` for the
prompt, ``tokenizer.encode(turn, add_special_tokens=False)`` per assistant turn, ``observation_ids``
for retrieved documents, :class:`TrajectoryBuilder` for the loss mask), and the loss is on assistant
tokens only. Example::

    python -m llds_trainer.warmstart --model MODEL_DIR --world WORLD_DIR --out OUT_DIR \\
        [--epochs 1 --lr 3e-5 --batch-size 8 --full|--lora --max-examples 160]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llds_proto.search_protocol import TrajectoryBuilder, observation_ids, prompt_ids

log = logging.getLogger("llds.warmstart")

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class WarmstartError(RuntimeError):
    """The world folder or the model cannot be used; the message says which file and why."""


@dataclass(frozen=True)
class Demonstration:
    """One protocol demonstration at token level."""

    row_id: str
    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    turns: list[str]
    """Assistant turn texts, in order."""

    def sample(self, reward: float = 0.0) -> Any:
        """The demonstration as a trainer sample (no sampler log-probs, version 0; ``reward`` also
        its exact match): what the warm start trains on and the LLD probe set scores."""
        from llds_trainer.batch import Sample

        n = len(self.response_ids)
        return Sample(self.row_id, self.row_id, tuple(self.prompt_ids), tuple(self.response_ids),
                      tuple(self.loss_mask), tuple([0.0] * n), tuple([0] * n), None, reward, reward, 0, 0, 0.0)  # fmt: skip


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise WarmstartError(f"{path} does not exist (build the world with `llds world build --out DIR`)")
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise WarmstartError(f"{path}:{i} is not JSON: {e}") from e
    return rows


def demo_turns(row: dict[str, Any]) -> list[str]:
    """Assistant turn texts: one think+search per hop, then think+answer."""
    turns = []
    for k, hop in enumerate(row["support"]):
        q = hop["query"].strip()
        why = "I need to find out" if k == 0 else "Now I need to find out"
        turns.append(f"<think> {why} {q}. </think>\n<search> {q} </search>")
    gold = row["golden_answers"][0]
    turns.append(f"<think> The documents say the answer is {gold}. </think>\n<answer> {gold} </answer>")
    return turns


def build_demonstration(
    tokenizer: Any, row: dict[str, Any], corpus: dict[str, dict[str, Any]], rng: random.Random
) -> Demonstration:
    """Tokenize one training row as a rollout would have: gold passage among 3 retrieved documents."""
    support = row.get("support")
    if not support:
        raise WarmstartError(f"row {row.get('id')!r} has no 'support' hops")
    ids_pool = list(corpus)
    b = TrajectoryBuilder()
    turns = demo_turns(row)
    for hop, turn in zip(support, turns, strict=False):
        gold_id = hop["doc_id"]
        if gold_id not in corpus:
            raise WarmstartError(f"row {row.get('id')!r}: doc_id {gold_id!r} is not in corpus.jsonl")
        ids = tokenizer.encode(turn, add_special_tokens=False)
        b.add_generated(ids, [0.0] * len(ids), 0)
        others = [d for d in rng.sample(ids_pool, min(len(ids_pool), 3)) if d != gold_id][:2]
        docs = [corpus[d] for d in others]
        docs.insert(rng.randrange(len(docs) + 1), corpus[gold_id])
        b.add_observation(observation_ids(tokenizer, docs))
    final = tokenizer.encode(turns[-1], add_special_tokens=False)
    b.add_generated(final, [0.0] * len(final), 0)
    return Demonstration(
        row_id=str(row.get("id")),
        prompt_ids=prompt_ids(tokenizer, row["question"]),
        response_ids=b.response_ids,
        loss_mask=b.loss_mask,
        turns=turns,
    )


def build_demonstrations(
    tokenizer: Any, world: Path, max_examples: int | None = None, seed: int = 0, first: int = 0
) -> list[Demonstration]:
    """Demonstrations of the train split's rows ``first`` .. ``first + max_examples`` (all: None)."""
    corpus = {str(d["id"]): d for d in read_jsonl(world / "corpus.jsonl")}
    rows = read_jsonl(world / "train.jsonl")[first:]
    if max_examples:
        rows = rows[:max_examples]
    rng = random.Random(seed)
    return [build_demonstration(tokenizer, r, corpus, rng) for r in rows]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llds warmstart", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="base model folder")
    p.add_argument("--world", required=True, help="synthetic world folder (train.jsonl, corpus.jsonl)")
    p.add_argument("--out", required=True, help="output folder (written atomically)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=None, help="default 3e-5 full, 2e-4 LoRA")
    p.add_argument("--batch-size", type=int, default=8, help="demonstrations per optimizer step")
    p.add_argument(
        "--micro-batch-size", type=int, default=2,
        help="demonstrations per forward (a batch's gradient is accumulated over its micro-batches; "
        "the update is the same, the padding and memory are smaller)",
    )  # fmt: skip
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--full", dest="lora", action="store_false", help="full fine-tune (default)")
    mode.add_argument(
        "--lora", dest="lora", action="store_true",
        help="LoRA; the output is the base with the adapter merged bit-identically on any machine "
        "(llds_trainer.adapter), the adapter itself in OUT/adapter",
    )  # fmt: skip
    p.set_defaults(lora=False)
    p.add_argument("--lora-rank", type=int, default=16)
    p.add_argument("--lora-alpha", type=int, default=32)
    p.add_argument(
        "--lora-targets", default=",".join(LORA_TARGETS), help="comma-separated module names LoRA adapts"
    )
    p.add_argument(
        "--lora-layers", default="",
        help="decoder layers LoRA adapts, e.g. 15-29 or 0,2,4 (default all); layers below the lowest "
        "adapted one need no backward, which makes a step cheaper",
    )  # fmt: skip
    p.add_argument("--save-adapter", help="also copy the LoRA adapter to this folder")
    p.add_argument("--max-examples", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = default)")
    p.add_argument(
        "--optimizer", choices=["auto", "fused", "foreach"], default="auto",
        help="AdamW kernel: auto = fused for a full fine-tune, foreach for LoRA",
    )  # fmt: skip
    p.add_argument(
        "--autocast", choices=["auto", "bfloat16", "none"], default="auto",
        help="forward dtype: auto = bfloat16 where the CPU (AVX512-BF16, AMX) or GPU has it natively, "
        "else float32; the weights and optimizer stay float32",
    )  # fmt: skip
    return p


def batches(samples: list[Any], batch_size: int, micro: int, rng: random.Random) -> list[list[list[int]]]:
    """One epoch: shuffled batches of ``batch_size``, each split into micro-batches of similar length
    (sorted inside the batch, which changes padding, not the batch's gradient)."""
    order = list(range(len(samples)))
    rng.shuffle(order)
    out = []
    for i in range(0, len(order), batch_size):
        batch = sorted(
            order[i : i + batch_size], key=lambda j: len(samples[j].prompt_ids) + len(samples[j].response_ids)
        )
        out.append([batch[k : k + micro] for k in range(0, len(batch), micro)])
    return out


def parse_layers(spec: str) -> list[int] | None:
    """``"15-29"`` / ``"0,2,4"`` / ``"0-3,8"`` -> layer indices; ``""`` -> None (all layers)."""
    if not spec.strip():
        return None
    out: list[int] = []
    for part in spec.split(","):
        a, _, b = part.strip().partition("-")
        try:
            lo, hi = int(a), int(b or a)
        except ValueError as e:
            raise WarmstartError(f"--lora-layers {spec!r}: {part!r} is not N or N-M") from e
        if lo < 0 or hi < lo:
            raise WarmstartError(f"--lora-layers {spec!r}: {part!r} is not a range of layer indices")
        out.extend(range(lo, hi + 1))
    return sorted(set(out))


def _peak_rss_gib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    world, out = Path(args.world), Path(args.out)
    for flag in ("epochs", "batch_size", "micro_batch_size", "lora_rank"):
        if getattr(args, flag) < 1:
            print(
                f"llds warmstart: --{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}",
                file=sys.stderr,
            )
            return 2
    targets = [t.strip() for t in args.lora_targets.split(",") if t.strip()]
    if args.lora and not targets:
        print(f"llds warmstart: --lora-targets names no module: {args.lora_targets!r}", file=sys.stderr)
        return 2
    try:
        layers = parse_layers(args.lora_layers)
    except WarmstartError as e:
        print(f"llds warmstart: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    import torch
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from llds_trainer.batch import collate
    from llds_trainer.precision import resolve_precision
    from llds_trainer.scoring import target_logprobs

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    precision = resolve_precision(args.autocast, "cpu")
    tok = AutoTokenizer.from_pretrained(args.model)
    try:
        demos = build_demonstrations(tok, world, args.max_examples, args.seed)
    except WarmstartError as e:
        print(f"llds warmstart: {e}", file=sys.stderr)
        return 2
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.config.use_cache = False
    lr = args.lr if args.lr is not None else (2e-4 if args.lora else 3e-5)
    if args.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(
                r=args.lora_rank,
                lora_alpha=args.lora_alpha,
                target_modules=targets,
                lora_dropout=0.0,
                layers_to_transform=layers,
            ),
        )
    params = [p for p in model.parameters() if p.requires_grad]
    where = f" of layers {args.lora_layers}" if layers else ""
    what = f"LoRA rank {args.lora_rank} on {','.join(targets)}{where}" if args.lora else "full fine-tune"
    print(
        f"warmstart: {len(demos)} demonstrations, {what}, {sum(p.numel() for p in params):,} trained "
        f"parameters, {precision.reason}, {torch.get_num_threads()} threads",
        flush=True,
    )
    # fused: one kernel over all parameters (several times foreach's speed for a full fine-tune on a
    # CPU); a LoRA's few parameters make the kernel's choice immaterial to speed, and the shipped
    # starts were trained with foreach, which a rebuild must repeat to give their bits.
    fused = args.optimizer == "fused" or (args.optimizer == "auto" and not args.lora)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, fused=fused, foreach=None if fused else True)
    samples = [d.sample() for d in demos]
    pad = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    n_tokens = 0
    losses: list[float] = []
    model.train()
    plan = [
        b for _ in range(args.epochs) for b in batches(samples, args.batch_size, args.micro_batch_size, rng)
    ]
    bar = tqdm(total=len(plan), desc="warmstart", unit="batch")
    for batch in plan:
        n_loss = sum(samples[j].n_loss_tokens for micro in batch for j in micro)
        total = 0.0
        for micro in batch:
            mb = collate([samples[j] for j in micro], micro, int(pad))
            logp, _ = target_logprobs(
                model,
                mb.input_ids,
                mb.attention_mask,
                mb.targets,
                mb.loss_mask,
                autocast=precision.torch_dtype(),
            )  # [B, L-1], zero off the loss mask
            # The batch's token mean, accumulated: each micro-batch adds its share of the sum.
            loss = -(logp * mb.loss_mask).sum() / max(n_loss, 1)
            loss.backward()
            total += float(loss.detach())
            n_tokens += int(mb.attention_mask.sum())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(total)
        bar.update(1)
        bar.set_postfix(loss=f"{total:.3f}")
    bar.close()
    elapsed = time.perf_counter() - t0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    if args.lora:
        from llds_trainer.adapter import merge_folder

        model.save_pretrained(tmp / "adapter")
        if args.save_adapter:
            shutil.copytree(tmp / "adapter", args.save_adapter, dirs_exist_ok=True)
        merge_folder(args.model, tmp / "adapter", tmp)
    else:
        model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    info = {"examples": len(demos), "epochs": args.epochs, "lr": lr, "lora": args.lora,
            "lora_rank": args.lora_rank if args.lora else None, "lora_alpha": args.lora_alpha if args.lora else None,
            "lora_targets": targets if args.lora else None, "lora_layers": layers if args.lora else None, "batch_size": args.batch_size, "seed": args.seed,
            "precision": precision.autocast, "optimizer": "fused" if fused else "foreach", "loss_first": losses[0], "loss_last": losses[-1],
            "seconds": elapsed, "tokens": n_tokens, "peak_rss_gib": round(_peak_rss_gib(), 3),
            "threads": torch.get_num_threads()}  # fmt: skip
    (tmp / "warmstart.json").write_text(json.dumps(info, indent=1) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    print(
        f"warmstart: {len(demos)} demonstrations x {args.epochs} epoch(s), {'LoRA' if args.lora else 'full'} lr {lr:g}, {precision.reason}\n"
        f"  loss {losses[0]:.3f} -> {losses[-1]:.3f}, {n_tokens} tokens in {elapsed:.0f} s "
        f"({n_tokens / max(elapsed, 1e-9):.0f} tokens/s), peak memory {info['peak_rss_gib']:.2f} GiB\n  wrote {out}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
