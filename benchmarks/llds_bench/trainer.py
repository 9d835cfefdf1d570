"""``llds bench trainer``: the trainer's speed, memory and checkpoint cost, GRPO against GRPO + LLDS.

Both variants (GRPO, and GRPO + LLDS with the action gate and LLDS-MA) train the same synthetic
groups from the same initial weights: one untimed warm-up step, then ``--repeats`` timed steps each,
on a GPU one variant after the other (one model resident), on the CPU alternating. Reported: trainer
tokens/s (tokens trained per second of the forward + backward + optimizer passes), model FLOP
utilisation in bf16 on a known GPU, the LLDS/GRPO step-time ratio (target <= 1.05), peak memory, and
the time and size of one checkpoint written by the trainer's own checkpoint code. Markdown to stdout
and ``--out``, JSON beside it::

    llds bench trainer --model MODEL_DIR [--groups 2 --group-size 5 --repeats 3] [--out docs/trainer_bench.md]

A GPU check needs no model download: ``--shape`` names a published architecture (``qwen2.5-3b``,
``qwen2.5-7b``, ``qwen2.5-1.5b``; ``tiny`` for the CPU), ``--random-weights`` builds it with random
initialisation, and the groups are random token ids in Search-R1's layout (``--seq-len`` tokens per
trajectory, 4096 by default: see :func:`llds_bench.shapes.search_r1_layout`)::

    llds bench trainer --device cuda --shape qwen2.5-3b --random-weights --out docs/trainer_gpu_bench.md
    llds bench trainer --device cpu --shape tiny --random-weights --seq-len 128 --repeats 1   # the test's
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llds_proto import steplog as K

GPU_DEFAULTS = {"groups": 4, "micro_batch_size": 5, "gradient_checkpointing": True}
"""On CUDA (bf16, as ``configs/trainer_gpu.toml``): 4 groups x 5 = 20 trajectories per step, so each
of the 2 updates accumulates 2 micro-batches of 5 (5 x 4096 tokens per forward); checkpointed
activations as the GPU preset."""
CPU_DEFAULTS = {"groups": 2, "micro_batch_size": 2, "gradient_checkpointing": False}
"""On the CPU (float32): the sizes the SmolLM2 benchmark has always used."""

VARIANTS = ("GRPO", "GRPO + LLDS (action, MA)")


@dataclass
class VariantResult:
    """Medians of one variant's timed steps."""

    step_s: float
    update_s: float
    old_pass_s: float
    train_tokens_per_s: float
    peak_memory_bytes: int
    step_times: list[float] = field(default_factory=list)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llds bench trainer", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="policy folder (e.g. the SmolLM2 or tiny test model)")
    src.add_argument(
        "--shape", help="a named architecture (needs --random-weights): " + ", ".join(_shape_names())
    )
    p.add_argument(
        "--random-weights", action="store_true",
        help="random initialisation from --shape or --model's config.json (no weights read, no tokenizer)",
    )  # fmt: skip
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--groups", type=int, help=f"groups per step (default {GPU_DEFAULTS['groups']} on CUDA, "
                   f"{CPU_DEFAULTS['groups']} on the CPU)")  # fmt: skip
    p.add_argument("--group-size", type=int, default=5)
    p.add_argument("--repeats", type=int, default=3, help="timed steps per variant (after one warm-up)")
    p.add_argument("--micro-batch-size", type=int, help=f"default {GPU_DEFAULTS['micro_batch_size']} on CUDA, "
                   f"{CPU_DEFAULTS['micro_batch_size']} on the CPU")  # fmt: skip
    p.add_argument(
        "--gradient-checkpointing", action=argparse.BooleanOptionalAction,
        help="recompute activations in the backward pass (default: on with CUDA, off on the CPU)",
    )  # fmt: skip
    p.add_argument("--seq-len", type=int, default=4096, help="tokens per trajectory with --random-weights")
    p.add_argument(
        "--search-turns", type=int, default=3, help="search turns per trajectory with --random-weights"
    )
    p.add_argument("--think-words", type=int, default=12, help="words per think span (a --model's tokenizer)")
    p.add_argument(
        "--doc-words", type=int, default=40, help="words per retrieved document (a --model's tokenizer)"
    )
    p.add_argument("--peak-tflops", type=float,
                   help="the device's peak dense bf16 TFLOP/s (default: by GPU name; none on the CPU)")  # fmt: skip
    p.add_argument(
        "--work-dir", help="random policy and checkpoint go here (kept); default a temp dir, deleted"
    )
    p.add_argument("--budget-s", type=float, help="exit 1 when the whole run took longer (after reporting)")
    p.add_argument("--out", help="write the Markdown report here (and JSON beside it, .json)")
    return p


def _shape_names() -> list[str]:
    from llds_bench.shapes import SHAPES

    return list(SHAPES)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    t_start = time.perf_counter()
    err = _check_args(args)
    if err:
        print(f"llds bench trainer: {err}", file=sys.stderr)
        return 2

    from llds_trainer.core import TrainerError, resolve_device

    try:
        device = resolve_device(args.device)
    except TrainerError as e:
        print(f"llds bench trainer: {e}", file=sys.stderr)
        return 2
    defaults = GPU_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="llds-bench-trainer-"))
    work.mkdir(parents=True, exist_ok=True)
    import torch

    try:
        report = _run(args, device, work)
    except torch.OutOfMemoryError as e:
        print(f"llds bench trainer: out of {device.type} memory with micro-batches of {args.micro_batch_size} "
              f"x {args.seq_len if args.random_weights else 'the'} tokens; try a smaller --micro-batch-size: {e}",
              file=sys.stderr)  # fmt: skip
        return 1
    finally:
        if not args.work_dir:
            shutil.rmtree(work, ignore_errors=True)
    report["wall_s"] = time.perf_counter() - t_start
    text = render_markdown(report)
    print(text)
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out} and {out.with_suffix('.json')}")
    if args.budget_s is not None and report["wall_s"] > args.budget_s:
        print(f"llds bench trainer: took {report['wall_s']:.0f} s, over the {args.budget_s:.0f} s budget",
              file=sys.stderr)  # fmt: skip
        return 1
    return 0


def _check_args(args: argparse.Namespace) -> str | None:
    """What is wrong with the flags, before torch loads."""
    from llds_bench.shapes import SHAPES, search_r1_layout

    if args.shape is not None:
        if args.shape not in SHAPES:
            return f"unknown --shape {args.shape!r}; choose from {', '.join(SHAPES)}"
        if not args.random_weights:
            return "--shape needs --random-weights (a shape has no weights, and none are downloaded)"
    if args.repeats < 1 or (args.groups is not None and args.groups < 1) or args.group_size < 1:
        return "--repeats, --groups and --group-size must be >= 1"
    if args.micro_batch_size is not None and args.micro_batch_size < 1:
        return "--micro-batch-size must be >= 1"
    if args.search_turns < 0:
        return "--search-turns must be >= 0"
    if args.random_weights:
        try:
            search_r1_layout(args.seq_len, args.search_turns)
        except ValueError as e:
            return str(e)
    return None


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_memory(device: Any) -> int:
    """CUDA: bytes allocated at most since the last reset; CPU: the process's peak resident set."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _write_random_policy(config: Any, folder: Path, device: Any, dtype: Any) -> Path:
    """A Hugging Face folder holding ``config``'s architecture with random weights (built on ``device``)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(folder, safe_serialization=True)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return folder


def _filesystem(path: Path) -> str:
    """The file system type holding ``path`` (from /proc/mounts; "unknown" elsewhere)."""
    try:
        mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    except OSError:
        return "unknown"
    p = str(path.resolve())
    best = max((m for m in mounts if p == m[0] or p.startswith(m[0].rstrip("/") + "/")), key=lambda m: len(m[0]),
               default=None)  # fmt: skip
    return best[1] if best else "unknown"


def _policy_and_groups(args: argparse.Namespace, device: Any, work: Path, dtype: Any) -> dict[str, Any]:
    """The policy folder (a random one written into ``work``), its label and the step's groups."""
    from transformers import AutoConfig

    from llds_bench.shapes import SHAPES, search_r1_layout
    from llds_trainer.synthetic import synthetic_groups, synthetic_token_groups

    if not args.random_weights:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.model)
        groups = synthetic_groups(tok, args.groups, args.group_size, seed=0, think_words=args.think_words,
                                  doc_words=args.doc_words)  # fmt: skip
        return {"model_dir": args.model, "label": Path(args.model).name, "source": args.model, "layout": None,
                "groups": groups, "random_policy_s": None}  # fmt: skip
    config = SHAPES[args.shape].hf_config() if args.shape else AutoConfig.from_pretrained(args.model)
    label = f"{args.shape or Path(args.model).name} (random weights)"
    print(f"building {label} on {device}", flush=True)
    t0 = time.perf_counter()
    model_dir = _write_random_policy(config, work / "policy", device, dtype)
    build_s = time.perf_counter() - t0
    layout = search_r1_layout(args.seq_len, args.search_turns)
    return {
        "model_dir": str(model_dir), "label": label, "layout": layout, "random_policy_s": build_s,
        "source": SHAPES[args.shape].source if args.shape else f"{args.model}/config.json",
        "groups": synthetic_token_groups(config.vocab_size, layout, args.groups, args.group_size, seed=0),
    }  # fmt: skip


def _measure(
    trainers: dict[str, Any], groups: list[Any], repeats: int, device: Any
) -> dict[str, VariantResult]:
    """One untimed warm-up step each, then ``repeats`` timed rounds of one step each, in turn; medians."""
    from tqdm import tqdm

    for name, tr in trainers.items():
        print(f"{name}: warm-up step", flush=True)
        tr.train_step(groups)
        _sync(device)
    rows: dict[str, dict[str, list[float]]] = {
        n: {"step": [], "update": [], "old": [], "tps": []} for n in trainers
    }
    for _ in tqdm(range(repeats), desc=" / ".join(trainers), unit="round"):
        for name, tr in trainers.items():
            t0 = time.perf_counter()
            rec = tr.train_step(groups)
            _sync(device)
            row = rows[name]
            row["step"].append(time.perf_counter() - t0)
            row["update"].append(rec[K.PERF_UPDATE_S])
            row["old"].append(rec[K.PERF_OLD_PASS_S])
            row["tps"].append(rec[K.PERF_TRAIN_TOKENS_PER_S])
    peak = _peak_memory(device)
    med = statistics.median
    return {
        n: VariantResult(step_s=med(r["step"]), update_s=med(r["update"]), old_pass_s=med(r["old"]),
                         train_tokens_per_s=med(r["tps"]), peak_memory_bytes=peak, step_times=r["step"])
        for n, r in rows.items()
    }  # fmt: skip


def _checkpoint(tr: Any, run_dir: Path) -> dict[str, Any]:
    """Time and size of one checkpoint written by the trainer's own code."""
    t0 = time.perf_counter()
    path = tr.save_checkpoint(run_dir)
    write_s = time.perf_counter() - t0
    files = {f.name: f.stat().st_size for f in sorted(path.iterdir()) if f.is_file()}
    return {"write_s": write_s, "bytes": sum(files.values()), "files": files, "path": str(path),
            "filesystem": _filesystem(path)}  # fmt: skip


def _model_info(model: Any) -> dict[str, Any]:
    from llds_bench.shapes import matmul_params

    mc = model.config
    return {
        "params": sum(p.numel() for p in model.parameters()), "matmul_params": matmul_params(model),
        "layers": mc.num_hidden_layers, "hidden": mc.hidden_size, "heads": mc.num_attention_heads,
        "kv_heads": mc.num_key_value_heads, "vocab": mc.vocab_size, "tied_embeddings": bool(mc.tie_word_embeddings),
        "head_dim": int(getattr(mc, "head_dim", None) or mc.hidden_size // mc.num_attention_heads),
    }  # fmt: skip


def _run(args: argparse.Namespace, device: Any, work: Path) -> dict[str, Any]:
    import gc

    import torch

    from llds_bench.shapes import forward_flops, peak_bf16_tflops, train_flops
    from llds_trainer.config import TrainerConfig
    from llds_trainer.core import Trainer

    dtype_name = "bfloat16" if device.type == "cuda" else "float32"
    src = _policy_and_groups(args, device, work, getattr(torch, dtype_name))
    groups = src["groups"]
    seq_lens = [len(t.prompt_ids) + len(t.response_ids) for g in groups for t in g.trajectories]
    tokens, loss_tokens = sum(seq_lens), sum(sum(t.loss_mask) for g in groups for t in g.trajectories)
    common = dict(
        model=src["model_dir"], device=device.type, dtype=dtype_name, optimizer={"lr": 1e-6},
        gradient_checkpointing=args.gradient_checkpointing, micro_batch_size=args.micro_batch_size,
        minibatches_per_step=2, lld={"probe": False}, seed=0,
    )  # fmt: skip
    configs = {
        VARIANTS[0]: TrainerConfig(**common, regularizer="none"),
        VARIANTS[1]: TrainerConfig(
            **common, regularizer={"type": "llds", "gate": "action", "answer_weight_mode": "adaptive_code"}
        ),
    }
    # On a GPU the variants run one after the other, so one model is resident and the peak memory is
    # one variant's; on a (shared) CPU both are resident and their steps alternate, so drift in the
    # machine's load hits both alike.
    rounds = [[v] for v in VARIANTS] if device.type == "cuda" else [list(VARIANTS)]
    results: dict[str, VariantResult] = {}
    load_s: dict[str, float] = {}
    for names in rounds:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        trainers = {}
        for name in names:
            t0 = time.perf_counter()
            trainers[name] = Trainer(configs[name])
            load_s[name] = time.perf_counter() - t0
        info = _model_info(next(iter(trainers.values())).model)
        results.update(_measure(trainers, groups, args.repeats, device))
        if VARIANTS[1] in trainers:
            print(f"{VARIANTS[1]}: writing a checkpoint", flush=True)
            checkpoint = {
                **_checkpoint(trainers[VARIANTS[1]], work / "run"),
                "kept": args.work_dir is not None,
            }
        del trainers
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()

    peak_tflops, peak_source = (args.peak_tflops, "--peak-tflops") if args.peak_tflops else (None, None)
    if device.type == "cuda":
        gpu = torch.cuda.get_device_name(device)
        device_desc = f"cuda: {gpu}"
        if peak_tflops is None and (known := peak_bf16_tflops(gpu)) is not None:
            peak_tflops, peak_source = known, f"table entry for {gpu}"
    else:
        device_desc = f"cpu: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads"
    flop_args = (info["matmul_params"], info["layers"], info["heads"] * info["head_dim"], seq_lens)
    f_train, f_old = train_flops(*flop_args), forward_flops(*flop_args)
    variants: dict[str, Any] = {}
    for name, r in results.items():
        peak = peak_tflops * 1e12 if peak_tflops else None
        variants[name] = {
            "step_s": r.step_s, "update_s": r.update_s, "old_pass_s": r.old_pass_s,
            "train_tokens_per_s": r.train_tokens_per_s, "step_tokens_per_s": tokens / r.step_s,
            "mfu_update": f_train / r.update_s / peak if peak else None,
            "mfu_step": (f_train + f_old) / r.step_s / peak if peak else None,
            "peak_memory_bytes": r.peak_memory_bytes, "step_times_s": r.step_times,
        }  # fmt: skip
    base, llds = (results[v] for v in VARIANTS)
    return {
        "command": "llds bench trainer " + " ".join(_argv_for_report(args)),
        "model": src["label"], "shape": args.shape, "source": src["source"], "model_info": info,
        "device": device_desc, "device_type": device.type, "dtype": dtype_name,
        "gradient_checkpointing": args.gradient_checkpointing, "groups": args.groups, "group_size": args.group_size,
        "trajectories": len(seq_lens), "tokens_per_step": tokens, "loss_tokens_per_step": loss_tokens,
        "seq_len_max": max(seq_lens), "layout": None if src["layout"] is None else vars(src["layout"]),
        "micro_batch_size": args.micro_batch_size, "updates_per_step": 2, "repeats": args.repeats,
        "train_flops_per_step": f_train, "peak_tflops": peak_tflops, "peak_source": peak_source,
        "memory_kind": "torch.cuda.max_memory_allocated" if device.type == "cuda" else "process peak RSS",
        "variants": variants,
        "llds_grpo_step_ratio": llds.step_s / base.step_s,
        "llds_grpo_update_ratio": llds.update_s / base.update_s,
        "checkpoint": checkpoint,
        "setup_s": {"random_policy": src["random_policy_s"], "trainer_load": load_s},
    }  # fmt: skip


def _argv_for_report(args: argparse.Namespace) -> list[str]:
    out = ["--model", args.model] if args.model else ["--shape", args.shape]
    if args.random_weights:
        out += ["--random-weights", "--seq-len", str(args.seq_len), "--search-turns", str(args.search_turns)]
    out += ["--device", args.device, "--groups", str(args.groups), "--group-size", str(args.group_size),
            "--repeats", str(args.repeats), "--micro-batch-size", str(args.micro_batch_size)]  # fmt: skip
    return out


def _size(n: float) -> str:
    """Bytes in the largest binary unit that keeps the number >= 1."""
    for unit in ("B", "KiB", "MiB"):
        if n < 1024:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} GiB"


def _count(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def render_markdown(r: dict[str, Any]) -> str:
    """The report as a BENCHMARKS.md section."""
    m = r["model_info"]
    ck = r["checkpoint"]
    lay = r["layout"]
    layout = (
        f"{lay['prompt']} prompt + {lay['search_turns']} x ({lay['turn']} generated + {lay['observation']} "
        f"retrieved) + {lay['answer']} answer tokens each"
        if lay else f"up to {r['seq_len_max']} tokens each"
    )  # fmt: skip
    if r["peak_tflops"]:
        peak = f"{r['peak_tflops']:g} TFLOP/s ({r['peak_source']})"
    elif r["device_type"] == "cuda":
        peak = "unknown GPU, so MFU is n/a (pass --peak-tflops)"
    else:
        peak = "none on the CPU, so MFU is n/a"
    title = (
        f"Trainer check ({r['model'].replace(' (random weights)', '')}, random weights, {r['device_type']})"
        if r["layout"] else "Trainer benchmark: GRPO vs GRPO + LLDS"
    )  # fmt: skip
    setup = r["setup_s"]
    built = (
        f"random policy built and written in {setup['random_policy']:.1f} s, "
        if setup["random_policy"]
        else ""
    )
    loads = " and ".join(f"{v:.1f}" for v in setup["trainer_load"].values())
    lines = [
        f"# {title}",
        "",
        f"`{r['command']}`",
        "",
        f"Model {r['model']}: {_count(m['params'])} parameters ({m['layers']} layers, hidden {m['hidden']}, "
        f"{m['heads']} attention / {m['kv_heads']} KV heads of {m['head_dim']}, vocabulary {m['vocab']}, "
        f"{'tied' if m['tied_embeddings'] else 'untied'} embeddings; {r['source']}). "
        f"Device {r['device']}, {r['dtype']}, gradient checkpointing {'on' if r['gradient_checkpointing'] else 'off'}. "
        f"Per step {r['groups']} groups x {r['group_size']} = {r['trajectories']} trajectories "
        f"({layout}; {r['tokens_per_step']} tokens, {r['loss_tokens_per_step']} loss tokens), "
        f"{r['updates_per_step']} optimizer updates of micro-batches of {r['micro_batch_size']}; "
        f"median of {r['repeats']} steps after one warm-up, "
        + ("one variant after the other" if r["device_type"] == "cuda" else "the variants' steps alternating")
        + f". Peak: {peak}.",
        "",
        "| variant | step s | update s | pi_old pass s | trainer tokens/s | MFU (update) | MFU (step) | peak memory |",
        "|---|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for name in VARIANTS:
        v = r["variants"][name]
        lines.append(
            f"| {name} | {v['step_s']:.3f} | {v['update_s']:.3f} | {v['old_pass_s']:.3f} | "
            f"{v['train_tokens_per_s']:.0f} | {_pct(v['mfu_update'])} | {_pct(v['mfu_step'])} | "
            f"{_size(v['peak_memory_bytes'])} |"
        )
    files = ", ".join(f"{k} {_size(v)}" for k, v in ck["files"].items())
    lines += [
        "",
        f"Step-time ratio LLDS / GRPO: **{r['llds_grpo_step_ratio']:.3f}** (target <= 1.05; update passes "
        f"alone {r['llds_grpo_update_ratio']:.3f}). Checkpoint (GRPO + LLDS, after its steps): written in "
        f"**{ck['write_s']:.2f} s**, **{_size(ck['bytes'])}** on {ck['filesystem']} ({files}). "
        f"Whole run: {r['wall_s']:.0f} s ({built}trainers loaded in {loads} s).",
        "",
        "Trainer tokens/s: tokens trained (every token of every sequence, once per step) per second of",
        "the update passes (forward + backward + optimizer), the trainer's own `perf/train_tokens_per_s`.",
        "MFU: model FLOPs / seconds / the device's peak; model FLOPs are 6 x N x tokens (N: parameters in",
        "matrix products, an untied input embedding left out) plus causal attention, 6 x layers x width x",
        "s(s+1) per sequence of s tokens; recomputation under gradient checkpointing is not counted. MFU",
        "(update) is over the update passes; MFU (step) adds the no-grad pi_old forward (a third of the",
        "training FLOPs) and divides by the whole step. Peak memory: "
        + (
            "`torch.cuda.max_memory_allocated` of the variant (reset before it loads)."
            if r["device_type"] == "cuda"
            else "the process's peak resident set (both variants are resident)."
        ),
        "Checkpoint: `Trainer.save_checkpoint` (weights, AdamW state, RNG, state; fsynced, renamed into",
        "place), timed end to end.",
    ]
    if r["device_type"] != "cuda":
        lines += [
            "",
            "Measured on the CPU: not GPU figures. The GPU figures come from `llds bench trainer --device",
            "cuda --shape qwen2.5-3b --random-weights --budget-s 480 --out docs/trainer_gpu_bench.md` on a",
            "machine with one GPU; not measured yet.",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
