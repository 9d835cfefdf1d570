"""GPU memory of the GPU presets, per GPU: arithmetic from the model's shape and the presets' settings.

Nothing here runs on a GPU: the trainer's figure adds up what its settings allocate (float32 master
weights, gradients, AdamW's two moments, the reference model, the data-parallel buffers, the micro-batch's
activations and the output head's logits), the rollout's what vLLM reserves and what its weights and KV
cache take of it, against GPUs of 80 and 141 GB. The coefficients that are not a tensor's size are stated
where they are defined (:data:`HEAD_BYTES`, :data:`LAYER_WORK_FACTOR`, :data:`TRAINER_OVERHEAD_GIB`,
:data:`VLLM_OVERHEAD_GIB`); the head's was measured on the CPU (:func:`measure_head_peak`). docs/deploy.md
carries the table between :data:`BEGIN` and :data:`END`, and a test checks it against this module.

    llds bench memory                          # print the tables
    llds bench memory --write docs/deploy.md   # rewrite them in the docs, between the markers
    llds bench memory --check docs/deploy.md   # exit 1 when the docs' tables are not these
    llds bench memory head-peak --chunk 1024 [--smollm2 --fp32]   # peak RSS of one scoring pass, CPU

Importing this module imports no torch.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from llds_bench.shapes import SHAPES, Qwen2Shape

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
GIB = 1024**3
BEGIN = "<!-- memory-table:begin (python -m llds_bench.memory --write docs/deploy.md) -->"
END = "<!-- memory-table:end -->"

HEAD_BYTES = 24
"""Bytes per scored token and vocabulary entry that the output head holds at its peak, with gradients:
its bfloat16 logits, their float32 copy, the softmax, and in the backward pass their gradients. Measured
on the CPU (:func:`measure_head_peak`, bfloat16 autocast, 2 x 2048 tokens, 1998 scored, vocabulary 49152):
20.5 unchunked, 21.5 in chunks of 1024 (whose logits are recomputed in the backward pass); rounded up."""
LAYER_WORK_FACTOR = 2.0
"""A checkpointed decoder layer's backward holds its recomputed activations and, at its peak, gradients of
about the same size: twice :func:`layer_activation_bytes` per token."""
TRAINER_OVERHEAD_GIB = 2.0
"""CUDA context, cuBLAS and NCCL workspaces and the caching allocator's slack of one trainer rank."""
VLLM_OVERHEAD_GIB = 4.0
"""What vLLM needs besides weights and KV cache inside its reservation: CUDA context, the profile run's
activations, CUDA graphs and the sampler's logits (256 sequences x 151936 x 4 B = 0.15 GiB)."""
FIT, TIGHT = 0.9, 1.0
"""A figure up to 90 % of the GPU fits; up to 100 % it is tight (fragmentation may still fail it)."""


@dataclass(frozen=True)
class GPU:
    """A GPU size the table is computed for."""

    name: str
    """What the column says."""
    gib: float
    """Memory the driver reports, GiB."""


GPUS = (GPU("80 GB", 81559 / 1024), GPU("141 GB", 143771 / 1024))
"""nvidia-smi's total memory of an H100 80GB HBM3 (81559 MiB; an A100 80GB reports 81920) and of an
H200 (143771 MiB)."""


# ---------------------------------------------------------------- model shape


def layer_params(s: Qwen2Shape) -> int:
    """Parameters of one decoder layer: q (with bias), k, v (with biases), o, the SwiGLU MLP, two norms."""
    h, kv, i = s.hidden_size, s.num_key_value_heads * s.head_dim, s.intermediate_size
    return (h * h + h) + 2 * (h * kv + kv) + h * h + 3 * h * i + 2 * h


def root_params(s: Qwen2Shape) -> int:
    """Parameters outside the layers (FSDP's root unit): the embedding, an untied head, the final norm."""
    embed = s.vocab_size * s.hidden_size
    return embed * (1 if s.tie_word_embeddings else 2) + s.hidden_size


def param_count(s: Qwen2Shape) -> int:
    """All parameters of the model (Qwen2.5-3B: 3,085,938,688)."""
    return s.num_hidden_layers * layer_params(s) + root_params(s)


def kv_bytes_per_token(s: Qwen2Shape, dtype_bytes: int = 2) -> int:
    """KV cache of one token over all layers: keys and values of every KV head."""
    return 2 * s.num_hidden_layers * s.num_key_value_heads * s.head_dim * dtype_bytes


def layer_activation_bytes(s: Qwen2Shape, stream_bytes: int, compute_bytes: int) -> int:
    """Bytes per token one decoder layer keeps for its backward pass: six hidden-size tensors of the
    residual stream and the RMSNorms (in the parameters' dtype), and in the compute dtype the normed
    inputs of attention and MLP, q, k and v before and after RoPE, the attention output, the projected
    output, and the MLP's gate, up, activation and product (4 x intermediate). Attention itself is taken
    as a flash or memory-efficient kernel (no sequence-squared matrix)."""
    h, kv, i = s.hidden_size, s.num_key_value_heads * s.head_dim, s.intermediate_size
    return stream_bytes * 6 * h + compute_bytes * (6 * h + 4 * kv + 4 * i)


# ---------------------------------------------------------------- the trainer


@dataclass(frozen=True)
class TrainerKnobs:
    """What of a trainer preset (and the rollout preset that makes its trajectories) sizes its memory."""

    micro_batch: int
    """Trajectories per forward/backward (``micro_batch_size``)."""
    seq_len: int
    """Longest trajectory, tokens (the rollout's ``max_context_tokens``)."""
    loss_tokens: int
    """Most scored (generated) tokens of one trajectory."""
    param_bytes: int
    """Bytes of a parameter, and of its gradient and each AdamW moment (``dtype``)."""
    compute_bytes: int
    """Bytes of the forward's matrix-product outputs (2 under bfloat16 autocast)."""
    reference_bytes: int
    """Bytes of a reference-model parameter; 0 without a reference (``kl_coef`` 0)."""
    chunk: int
    """``logits_chunk_tokens`` (0: the whole micro-batch's scored tokens at once)."""
    checkpointing: bool
    """``gradient_checkpointing``."""
    parallel: Literal["ddp", "fsdp"]
    """``parallel``."""
    fused_adam: bool
    """AdamW's fused kernel (no full-size temporaries) rather than foreach (one)."""

    @classmethod
    def from_presets(cls, trainer: Any, rollout: Any, device: str = "cuda") -> TrainerKnobs:
        """From a resolved ``TrainerConfig`` and ``RolloutSettings``, the trainer on ``device``."""
        pb = 4 if trainer.dtype == "float32" else 2
        cb = 2 if trainer.autocast == "bfloat16" or trainer.dtype == "bfloat16" else 4
        ref = trainer.reference_dtype
        if ref == "auto":
            ref = "bfloat16" if device == "cuda" else "float32"
        impl = trainer.optimizer.implementation
        seq = rollout.max_context_tokens
        return cls(
            micro_batch=trainer.micro_batch_size,
            seq_len=seq,
            loss_tokens=min(seq - 1, (rollout.max_turns + 1) * rollout.max_tokens_per_turn),
            param_bytes=pb,
            compute_bytes=cb,
            reference_bytes=(4 if ref == "float32" else 2) if trainer.kl_coef > 0 else 0,
            chunk=trainer.logits_chunk_tokens,
            checkpointing=trainer.gradient_checkpointing,
            parallel=trainer.parallel,
            fused_adam=impl == "fused" or (impl == "auto" and trainer.parallel != "fsdp"),
        )


@dataclass(frozen=True)
class TrainerMemory:
    """One trainer rank's memory, bytes, by what holds it."""

    weights: float
    grads: float
    adam: float
    reference: float
    saved: float
    """Activations the micro-batch keeps for the backward pass (checkpointed layer inputs, the mask)."""
    head: float
    """The output head's peak: scored tokens at once x vocabulary x :data:`HEAD_BYTES`."""
    layer: float
    """One layer's backward working set (recomputed activations and their gradients)."""
    fsdp: float
    """Gathered (unsharded) parameters and gradients of the units in use (fsdp over several ranks)."""
    ddp_buffer: float
    """ddp's flat all-reduce buffer: a copy of every gradient (several ranks)."""
    adam_temp: float
    """foreach AdamW's temporary (a square root of the second moment)."""
    overhead: float
    """:data:`TRAINER_OVERHEAD_GIB`."""

    @property
    def static(self) -> float:
        """What every phase of a step holds."""
        return self.weights + self.grads + self.adam + self.reference + self.overhead

    @property
    def backward(self) -> float:
        """The micro-step's peak: saved activations, the head or a layer's backward, FSDP's gathered units."""
        return self.saved + max(self.head, self.layer) + self.fsdp

    @property
    def total(self) -> float:
        """The step's peak: the largest phase (micro-step, all-reduce, optimizer) on top of the static part."""
        return self.static + max(self.backward, self.ddp_buffer, self.adam_temp)


def trainer_memory(s: Qwen2Shape, k: TrainerKnobs, ranks: int) -> TrainerMemory:
    """Peak memory of one of ``ranks`` trainer ranks training shape ``s`` with settings ``k``."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    p = param_count(s)
    shard = ranks if k.parallel == "fsdp" else 1
    tokens = k.micro_batch * k.seq_len
    h = s.hidden_size
    per_layer = layer_activation_bytes(s, k.param_bytes, k.compute_bytes) * tokens
    if k.checkpointing:
        saved = s.num_hidden_layers * tokens * h * k.param_bytes
    else:
        saved = s.num_hidden_layers * per_layer
    saved += k.micro_batch * k.seq_len * k.seq_len  # the padding mask, one byte per query and key
    scored = k.micro_batch * k.loss_tokens
    at_once = min(scored, k.chunk) if k.chunk > 0 else scored
    fsdp = 0.0
    if shard > 1:
        # The root unit stays gathered from its forward through its backward (its gradients too); a
        # layer is gathered with the next one prefetched, and its gradients before the reduce-scatter.
        fsdp = root_params(s) * (2 * k.param_bytes + k.reference_bytes) + 3 * layer_params(s) * k.param_bytes
    return TrainerMemory(
        weights=p * k.param_bytes / shard,
        grads=p * k.param_bytes / shard,
        adam=2 * p * k.param_bytes / shard,
        reference=p * k.reference_bytes / shard,
        saved=saved,
        head=HEAD_BYTES * at_once * s.vocab_size,
        layer=LAYER_WORK_FACTOR * per_layer,
        fsdp=fsdp,
        ddp_buffer=p * k.param_bytes if k.parallel == "ddp" and ranks > 1 else 0.0,
        adam_temp=0.0 if k.fused_adam else p * k.param_bytes / shard,
        overhead=TRAINER_OVERHEAD_GIB * GIB,
    )


# ---------------------------------------------------------------- the rollout


@dataclass(frozen=True)
class RolloutMemory:
    """One vLLM replica's memory on one GPU, bytes."""

    reserved: float
    """What vLLM takes: ``gpu_memory_utilization`` x the GPU."""
    weights: float
    overhead: float
    """:data:`VLLM_OVERHEAD_GIB`."""
    kv_per_sequence: float
    """KV cache of one sequence of ``max_model_len`` tokens."""

    @property
    def kv(self) -> float:
        """What is left of the reservation for the KV cache."""
        return self.reserved - self.weights - self.overhead

    @property
    def sequences(self) -> int:
        """Full-length sequences the KV cache holds at once."""
        return max(0, int(self.kv // self.kv_per_sequence))


def rollout_memory(s: Qwen2Shape, engine: Any, max_model_len: int, gpu: GPU) -> RolloutMemory:
    """vLLM with ``engine`` settings (``[engine]`` of a rollout preset) serving shape ``s`` on ``gpu``."""
    wb = 4 if engine.dtype == "float32" else 2
    return RolloutMemory(
        reserved=engine.gpu_memory_utilization * gpu.gib * GIB,
        weights=param_count(s) * wb,
        overhead=VLLM_OVERHEAD_GIB * GIB,
        kv_per_sequence=max_model_len * kv_bytes_per_token(s, wb),
    )


# ---------------------------------------------------------------- presets and the table


def load_preset(name: str, overrides: dict[str, Any] | None = None) -> Any:
    """``configs/<name>.toml`` resolved by its settings class (no environment), ``overrides`` on top."""
    from llds_server.settings import merged

    data = merged(tomllib.loads((CONFIGS / f"{name}.toml").read_text()), overrides or {})
    if name.startswith("trainer_"):
        from llds_trainer.config import TrainerConfig

        return TrainerConfig.model_validate(data)
    from llds_rollout.config import RolloutSettings

    return RolloutSettings.model_validate(merged({"dataset": "train.jsonl"}, data))


@dataclass(frozen=True)
class Scenario:
    """A row of the table: the presets a deployment runs and what it overrides in them."""

    label: str
    trainer: str
    rollout: str
    trainer_overrides: tuple[tuple[str, Any], ...] = ()
    """Dotted trainer settings over the preset (``("parallel", "fsdp")``)."""


GPU_COUNTS = (1, 2, 4, 8)
"""The columns' GPU counts; :func:`split` says how a count is divided."""
SHARED_ROLLOUT = (("gpu_memory_utilization", 0.2),)
"""The rollout's ``[engine]`` on a GPU it shares with the trainer (deploy/env.example's one-GPU setting)."""

SCENARIOS: tuple[Scenario, ...] = (
    Scenario("search_r1, ddp (compose)", "trainer_search_r1", "rollout_search_r1"),
    Scenario("search_r1, fsdp (k8s)", "trainer_search_r1", "rollout_search_r1", (("parallel", "fsdp"),)),
    Scenario("search_r1, ddp, micro-batch 2", "trainer_search_r1", "rollout_search_r1",
             (("micro_batch_size", 2),)),
    Scenario("gpu (`llds up --preset gpu`)", "trainer_gpu", "rollout_gpu"),
    Scenario("search_r1 as it was (float32 reference, unchunked head)", "trainer_search_r1", "rollout_search_r1",
             (("reference_dtype", "float32"), ("logits_chunk_tokens", 0))),
)  # fmt: skip
"""The rows of docs/deploy.md's table. The -MA preset (``trainer_search_r1_ma``) differs from
``trainer_search_r1`` in the LLDS answer weight alone: the same memory."""


def split(gpus: int) -> tuple[int, int]:
    """(trainer ranks, rollout GPUs) of ``gpus``: one GPU is shared (rollout GPUs 0), more are halved
    (the trainer takes the smaller half: a replica per GPU needs no more than one)."""
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    return (1, 0) if gpus == 1 else (gpus // 2, gpus - gpus // 2)


def _overrides(pairs: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        *path, last = key.split(".")
        d = out
        for part in path:
            d = d.setdefault(part, {})
        d[last] = value
    return out


def _gib(x: float) -> str:
    return f"{x / GIB:.1f}"


def verdict(need: float, gpu: GPU) -> str:
    """``fits`` (up to :data:`FIT` of the GPU), ``tight`` (up to all of it) or ``no``."""
    share = need / (gpu.gib * GIB)
    return "fits" if share <= FIT else "tight" if share <= TIGHT else "no"


def cell(sc: Scenario, shape: Qwen2Shape, gpus: int, gpu: GPU) -> str:
    """One GPU's figure in a deployment of ``gpus`` GPUs of size ``gpu``: the trainer's per-GPU peak (and
    vLLM's reservation on a shared GPU), GiB, and the verdict."""
    ranks, rollouts = split(gpus)
    tr = load_preset(sc.trainer, _overrides(sc.trainer_overrides))
    ro = load_preset(sc.rollout, {"engine": _overrides(SHARED_ROLLOUT)} if rollouts == 0 else None)
    t = trainer_memory(shape, TrainerKnobs.from_presets(tr, ro), ranks).total
    if rollouts:
        return f"{_gib(t)} {verdict(t, gpu)}"
    r = rollout_memory(shape, ro.engine, ro.engine.max_model_len or ro.max_context_tokens, gpu).reserved
    return f"{_gib(t)}+{_gib(r)} {verdict(t + r, gpu)}"


def breakdown(sc: Scenario, shape: Qwen2Shape, ranks: int) -> str:
    """The trainer's parts on one of ``ranks`` ranks, GiB, as a table row."""
    tr = load_preset(sc.trainer, _overrides(sc.trainer_overrides))
    ro = load_preset(sc.rollout)
    k = TrainerKnobs.from_presets(tr, ro)
    m = trainer_memory(shape, k, ranks)
    scored = k.micro_batch * k.loss_tokens
    head = f"{min(k.chunk, scored)} of {scored}" if k.chunk else f"all {scored}"
    parts = (m.weights + m.grads + m.adam, m.reference, m.overhead, m.saved, m.fsdp, m.head, m.layer,
             max(m.ddp_buffer, m.adam_temp), m.total)  # fmt: skip
    return (f"| {sc.label} | {ranks} | {k.micro_batch} x {k.seq_len} | {head} | "
            + " | ".join(_gib(x) for x in parts) + " |")  # fmt: skip


def rollout_row(name: str, shared: bool, shape: Qwen2Shape) -> str:
    """A rollout preset's vLLM on a dedicated (or shared) GPU of each size, as a table row."""
    ro = load_preset(name, {"engine": _overrides(SHARED_ROLLOUT)} if shared else None)
    max_len = ro.engine.max_model_len or ro.max_context_tokens
    cells = []
    for gpu in GPUS:
        r = rollout_memory(shape, ro.engine, max_len, gpu)
        cells.append(f"{_gib(r.reserved)} / {_gib(r.kv)} / {r.sequences}")
    where = "shared" if shared else "own GPU"
    return (f"| {name} ({where}) | {ro.engine.gpu_memory_utilization} | {_gib(param_count(shape) * 2)} | "
            f"{max_len} | {ro.engine.max_batch_size} | " + " | ".join(cells) + " |")  # fmt: skip


def table(shape_name: str = "qwen2.5-3b") -> str:
    """The Markdown tables of :data:`SCENARIOS` for ``shape_name``."""
    shape = SHAPES[shape_name]
    sizes = [(n, g) for n in GPU_COUNTS for g in GPUS]
    lines = [
        f"**{shape_name}** ({param_count(shape):,} parameters, vocabulary {shape.vocab_size:,}). Trainer peak per "
        "GPU, GiB, and whether it fits (up to 90 % of the GPU), is tight (90-100 %: the allocator's "
        "fragmentation may still fail it) or does not. GPUs are split by `llds_bench.memory.split`: 1 GPU "
        "holds the trainer and the rollout (vLLM at `gpu_memory_utilization` 0.2, the second figure); 2, 4 "
        "and 8 GPUs are half trainer ranks, half rollout replicas (one GPU each, the next table).",
        "",
        "| scenario | " + " | ".join(f"{n} x {g.name}" for n, g in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for sc in SCENARIOS:
        lines.append(f"| {sc.label} | " + " | ".join(cell(sc, shape, n, g) for n, g in sizes) + " |")
    lines += [
        "",
        "One trainer rank's parts, GiB: weights + gradients + AdamW (float32, 16 B per parameter, / ranks "
        "under fsdp), the bfloat16 reference, CUDA overhead, activations saved for the backward pass "
        "(checkpointed layer inputs and the padding mask), FSDP's gathered units, the head's logits "
        "(scored tokens at once x vocabulary x 24 B), one layer's backward, the all-reduce buffer (ddp) or "
        "AdamW's temporary (foreach); peak = the first three + the largest of (saved + FSDP + the larger of "
        "head and layer) and the buffer.",
        "",
        "| scenario | ranks | micro-batch | scored tokens at once | weights+grads+AdamW | reference | "
        "overhead | saved | FSDP | head | layer | buffer | peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for sc in SCENARIOS:
        lines.append(breakdown(sc, shape, 4 if sc.trainer_overrides == (("parallel", "fsdp"),) else 1))
    lines += [
        "",
        "A rollout replica (vLLM, bfloat16): reserved (`gpu_memory_utilization` x the GPU) / left for the KV "
        f"cache after the weights and {VLLM_OVERHEAD_GIB:g} GiB of vLLM's own / sequences of `max_model_len` "
        "tokens the KV cache holds at once (against `max_batch_size` decoded together).",
        "",
        "| rollout preset | gpu_memory_utilization | weights | max_model_len | max_batch_size | "
        + " | ".join(g.name for g in GPUS)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(GPUS),
        rollout_row("rollout_search_r1", False, shape),
        rollout_row("rollout_search_r1", True, shape),
        rollout_row("rollout_gpu", False, shape),
    ]
    return "\n".join(lines) + "\n"


def replace_between_markers(text: str, body: str) -> str:
    """``text`` with what lies between :data:`BEGIN` and :data:`END` replaced by ``body``."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise ValueError(f"expected one {BEGIN!r} ... {END!r} pair")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    return f"{head}{BEGIN}\n{body}{END}{tail}"


# ---------------------------------------------------------------- measuring the head on the CPU


HEAD_ONLY = dict(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=1, num_key_value_heads=1, head_dim=64, tie_word_embeddings=True)  # fmt: skip
"""A 2-layer model with SmolLM2's vocabulary: its scoring's memory is the output head's."""


def measure_head_peak(
    chunk: int,
    *,
    batch: int = 2,
    seq: int = 2048,
    scored: int = 1000,
    bf16: bool = True,
    smollm2: bool = False,
) -> dict[str, float]:
    """Peak resident memory (RSS) one forward and backward of the trainer's scoring adds, on this CPU, for
    random weights of :data:`HEAD_ONLY` (or of SmolLM2-135M's shape), gradient checkpointing on: run it in
    a fresh process per figure (the peak of a process only grows).

    Returns the figures and ``bytes_per_token_vocab``: the peak over (scored tokens at once x vocabulary)."""
    import resource

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from llds_bench.precision import SMOLLM2_SHAPE
    from llds_trainer.scoring import target_logprobs

    torch.manual_seed(0)
    shape: dict[str, Any] = dict(SMOLLM2_SHAPE if smollm2 else HEAD_ONLY)
    model = LlamaForCausalLM(LlamaConfig(**shape)).float()
    model.gradient_checkpointing_enable()
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)  # [B, L]
    mask = torch.zeros(batch, seq - 1)  # [B, L-1]: 3 turns per row, offset by row
    turn = scored // 3
    for b in range(batch):
        for t in range(3):
            start = 100 + 37 * b + 2 * t * turn
            mask[b, start : start + turn] = 1
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    lp, ent = target_logprobs(model, ids, torch.ones_like(ids), ids[:, 1:], mask, want_entropy=True,
                              chunk_tokens=chunk, autocast=torch.bfloat16 if bf16 else None)  # fmt: skip
    (lp.sum() + ent.sum()).backward()  # type: ignore[union-attr]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    n = int(mask.sum())
    at_once = min(n, chunk) if chunk else n
    return {"scored": n, "chunk": chunk, "peak_added_mib": (peak - before) / 2**20,
            "bytes_per_token_vocab": (peak - before) / (at_once * vocab)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["head-peak"]:
        p = argparse.ArgumentParser(prog="llds bench memory head-peak")
        p.add_argument("--chunk", type=int, default=1024, help="logits_chunk_tokens (0: unchunked)")
        p.add_argument("--batch", type=int, default=2)
        p.add_argument("--seq", type=int, default=2048)
        p.add_argument("--scored", type=int, default=1000, help="scored tokens per row")
        p.add_argument("--fp32", action="store_true", help="no bfloat16 autocast")
        p.add_argument("--smollm2", action="store_true", help="SmolLM2-135M's 30 layers, not 2 small ones")
        a = p.parse_args(argv[1:])
        got = measure_head_peak(a.chunk, batch=a.batch, seq=a.seq, scored=a.scored, bf16=not a.fp32,
                                smollm2=a.smollm2)  # fmt: skip
        print(" ".join(f"{k}={v:.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in got.items()))
        return 0
    p = argparse.ArgumentParser(prog="llds bench memory", description=__doc__.split("\n\n")[0])
    p.add_argument("--shape", default="qwen2.5-3b", choices=sorted(SHAPES))
    p.add_argument("--write", type=Path, help="rewrite the table between the markers of this Markdown file")
    p.add_argument("--check", type=Path, help="exit 1 if this Markdown file's table is not the computed one")
    a = p.parse_args(argv)
    body = table(a.shape)
    if a.write:
        a.write.write_text(replace_between_markers(a.write.read_text(), body))
        print(f"wrote the memory table into {a.write}")
    elif a.check:
        if replace_between_markers(a.check.read_text(), body) != a.check.read_text():
            print(f"{a.check}: the memory table is stale; run llds bench memory --write {a.check}")
            return 1
        print(f"{a.check}: the memory table is current")
    else:
        print(body, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
