"""``llds bench precision``: float32 against bfloat16 autocast for the CPU preset's model on this CPU.

The trainer's step on SmolLM2-135M is its matrix products; whether bfloat16 autocast pays depends on
the CPU (native on AVX512-BF16 and AMX, emulated through float32 elsewhere). This measures, in one
process, the training micro-step (forward + backward, the head on ~100 loss positions of each row)
and the no-grad scoring pass, in float32 and under bfloat16 autocast, on a random-weight model of
SmolLM2-135M's shape, and prints the ratio; ``--model`` adds the sampler/trainer mismatch that
autocast would cost (KL of float32 log-probs against bfloat16-autocast ones on tokens the float32
model sampled, the trainer's ``mismatch/kl`` estimator). It needs only torch and transformers, so it
runs on any host (e.g. ``taskset -c 0,1`` on a bigger machine to compare CPUs at 2 cores).

    python -m llds_bench.precision --threads 2 [--model DIR] [--json OUT.json]
    python -m llds_bench.precision --report docs/precision/*.json --out docs/precision_bench.md
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

SMOLLM2_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, head_dim=64, tie_word_embeddings=True)  # fmt: skip
"""SmolLM2-135M-Instruct's architecture (random weights stand in: speed does not depend on them)."""


def _model(path: str | None):  # type: ignore[no-untyped-def]
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if path:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**SMOLLM2_SHAPE)).to(torch.float32)


def _logp(model, ids, positions, autocast):  # type: ignore[no-untyped-def]
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids, use_cache=False, logits_to_keep=positions).logits
    return torch.log_softmax(logits.float(), -1).gather(-1, ids[:, positions + 1].unsqueeze(-1)).squeeze(-1)


def speed(model, batch: int, seq: int, autocast: bool, grad: bool, repeats: int) -> float:  # type: ignore[no-untyped-def]
    """Tokens per second of one micro-step (best of ``repeats`` after a warm-up)."""
    import torch

    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g)
    positions = torch.cat([torch.arange(seq // 2, seq // 2 + 60), torch.arange(seq - 50, seq - 10)])
    best = float("inf")
    for i in range(repeats + 1):
        t = time.perf_counter()
        if grad:
            _logp(model, ids, positions, autocast).sum().backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                _logp(model, ids, positions, autocast)
        if i:
            best = min(best, time.perf_counter() - t)
    return batch * seq / best


def mismatch(model, prompts: int = 4, new_tokens: int = 48) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """KL(float32 sampler || bfloat16-autocast trainer) (k3 estimator) and mean |log-ratio| on tokens
    the float32 model sampled at temperature 1 from short random prompts."""
    import torch

    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, model.config.vocab_size, (prompts, 16), generator=g)
    torch.manual_seed(3)
    with torch.no_grad():
        out = model.generate(ids, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=new_tokens,
                             min_new_tokens=new_tokens, pad_token_id=0)  # fmt: skip
        positions = torch.arange(ids.shape[1] - 1, out.shape[1] - 1)
        fp32 = _logp(model, out, positions, autocast=False)
        bf16 = _logp(model, out, positions, autocast=True)
    d = (fp32 - bf16).double().flatten()  # log(trainer / sampler) with the sampler in float32
    return {"mismatch_kl": float((torch.exp(d) - d - 1).mean()), "mean_abs_logp_diff": float(d.abs().mean()),
            "tokens": int(d.numel())}  # fmt: skip


def report(files: list[Path]) -> str:
    """BENCHMARKS.md's section from the JSON files of runs on several hosts."""
    lines = [
        "## Float32 vs bfloat16 autocast on the CPU (SmolLM2-135M shape, 2 cores)",
        "",
        "Command: `python -m llds_bench.precision --threads 2 [--model DIR] --json F` on each host (on a bigger "
        "host pinned to 2 cores: `scripts/cpu-precision-check.sh`); this table: `python -m llds_bench.precision "
        "--report docs/precision/*.json --out docs/precision_bench.md`. Micro-step of the trainer (forward + "
        "backward, 2 rows of 360 tokens, the head on 100 positions a row) and the no-grad scoring pass, best "
        "of 3 after a warm-up, both precisions in one process. Mismatch: KL(float32 sampler || bfloat16 "
        "trainer), the step log's `mismatch/kl` estimator, on 192 tokens the float32 policy sampled.",
        "",
        "| host (file) | native bf16 | torch | train fp32 tok/s | train bf16 tok/s | bf16/fp32 | score fp32 | "
        "score bf16 | bf16/fp32 | mismatch KL | mean abs log-ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for f in files:
        r = json.loads(f.read_text())
        kl = f"{r['mismatch_kl']:.1e}" if "mismatch_kl" in r else "-"
        diff = f"{r['mean_abs_logp_diff']:.3f}" if "mean_abs_logp_diff" in r else "-"
        lines.append(
            f"| {f.stem} ({', '.join(r['flags'])}) | {'yes' if r['native_bf16'] else 'no'} | {r['torch']} | "
            f"{r['train_fp32_tokens_per_s']:.0f} | {r['train_bf16_tokens_per_s']:.0f} | {r['train_bf16_over_fp32']:.2f} | "
            f"{r['score_fp32_tokens_per_s']:.0f} | {r['score_bf16_tokens_per_s']:.0f} | {r['score_bf16_over_fp32']:.2f} | "
            f"{kl} | {diff} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llds bench precision", description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=2, help="rows per micro-step (the CPU preset's micro-batch)")
    p.add_argument("--seq", type=int, default=360, help="tokens per row (a cpu-collapse trajectory's length)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--model", help="a policy folder: also measure the mismatch autocast costs")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--report", type=Path, nargs="+", help="only write the table of these JSON files (--out)")
    p.add_argument("--out", type=Path, help="with --report: the Markdown section to write")
    args = p.parse_args(argv)
    if args.report:
        md = report(args.report)
        print(md)
        if args.out:
            args.out.write_text(md)
        return 0
    import torch

    from llds_trainer.precision import cpu_flags, cpu_native_bf16

    torch.set_num_threads(args.threads)
    model = _model(args.model)
    flags = sorted(f for f in cpu_flags() if "bf16" in f or "amx" in f or f in ("avx512f", "avx2"))
    out: dict[str, Any] = {"cpu": platform.processor() or platform.machine(), "flags": flags,
                           "native_bf16": cpu_native_bf16(), "threads": args.threads, "torch": torch.__version__,
                           "batch": args.batch, "seq": args.seq}  # fmt: skip
    for grad in (True, False):
        for ac in (False, True):
            key = f"{'train' if grad else 'score'}_{'bf16' if ac else 'fp32'}_tokens_per_s"
            out[key] = round(speed(model, args.batch, args.seq, ac, grad, args.repeats), 1)
            print(f"{key}: {out[key]}", flush=True)
    out["train_bf16_over_fp32"] = round(out["train_bf16_tokens_per_s"] / out["train_fp32_tokens_per_s"], 3)
    out["score_bf16_over_fp32"] = round(out["score_bf16_tokens_per_s"] / out["score_fp32_tokens_per_s"], 3)
    if args.model:
        out |= mismatch(model)
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
