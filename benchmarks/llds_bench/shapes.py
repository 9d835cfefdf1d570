"""Model shapes, sequence layout and FLOP accounting of ``llds bench trainer --shape``.

A shape is a published model's architecture without its weights: ``--random-weights`` builds it with
random initialisation, so a machine with PyTorch and transformers alone (no download, no tokenizer)
can measure the trainer at the real model's size. Model FLOP utilisation (MFU) divides the model
FLOPs of the trained tokens by the accelerator's peak dense bf16 FLOP/s (:data:`PEAK_BF16_TFLOPS`).

Importing this module imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llds_trainer.synthetic import TokenLayout


@dataclass(frozen=True)
class Qwen2Shape:
    """A Qwen2-architecture decoder (``Qwen2ForCausalLM``: RoPE, SwiGLU, RMSNorm, QKV bias, GQA)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768
    pad_token_id: int = 151643
    """Qwen2.5's ``<|endoftext|>``, its tokenizer's pad token."""
    source: str = ""
    """Where the numbers come from."""

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def hf_config(self) -> Any:
        """The ``transformers.Qwen2Config`` of this shape."""
        from transformers import Qwen2Config

        # head_dim and rope_theta are not in every transformers release's signature (5.x folds rope_theta
        # into rope_parameters), so they go in as plain keyword arguments.
        fields: dict[str, Any] = dict(
            vocab_size=self.vocab_size, hidden_size=self.hidden_size, intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_hidden_layers, num_attention_heads=self.num_attention_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
            max_position_embeddings=self.max_position_embeddings, rope_theta=self.rope_theta,
            rms_norm_eps=self.rms_norm_eps, tie_word_embeddings=self.tie_word_embeddings,
            pad_token_id=self.pad_token_id, use_cache=False,
        )  # fmt: skip
        return Qwen2Config(**fields)


_HF = "the model's config.json on the Hugging Face Hub (Qwen/{name}-Instruct; the base model's has the same shape)"

SHAPES: dict[str, Qwen2Shape] = {
    "qwen2.5-1.5b": Qwen2Shape(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
        source=_HF.format(name="Qwen2.5-1.5B"),
    ),
    "qwen2.5-3b": Qwen2Shape(
        hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
        num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
        source=_HF.format(name="Qwen2.5-3B"),
    ),
    # The 7B's embedding has 152064 rows (151936 in the smaller ones) and is not tied to the head.
    "qwen2.5-7b": Qwen2Shape(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False,
        source=_HF.format(name="Qwen2.5-7B"),
    ),
    "tiny": Qwen2Shape(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=1,
        num_key_value_heads=1, vocab_size=4096, tie_word_embeddings=True, max_position_embeddings=8192,
        pad_token_id=0, source="this repository: a Qwen2-architecture model small enough for the CPU tests",
    ),
    "tiny-qwen": Qwen2Shape(
        hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, vocab_size=151936, tie_word_embeddings=True,
        source="this repository: llds.assets.tiny_qwen_dir's shape, Qwen2.5's vocabulary (its tokenizer fits)",
    ),
}  # fmt: skip
"""The named shapes of ``--shape``."""


def search_r1_layout(seq_len: int, search_turns: int = 3) -> TokenLayout:
    """A trajectory of ``seq_len`` tokens in Search-R1's proportions.

    At ``seq_len`` 4096 it is the longest sequence the rollout's Search-R1 settings allow
    (``configs/rollout_search_r1.toml``: 3 search turns in training, 500 generated and 500 retrieved
    tokens per turn, a 4096-token context): 3 x (500 + 500) tokens of searches, a 500-token answer turn
    and the remaining 596 tokens of prompt. Other lengths scale the turns by ``seq_len / 4096``.
    """
    turn = max(1, round(seq_len * 500 / 4096))
    prompt = seq_len - search_turns * 2 * turn - turn
    if prompt < 1:
        raise ValueError(f"--seq-len {seq_len} is too short for {search_turns} search turns of {turn} tokens")
    return TokenLayout(prompt=prompt, search_turns=search_turns, turn=turn, observation=turn, answer=turn)


PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("GH200", 989.0),
    ("H200", 989.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
)
"""Dense bf16 tensor-core peak (TFLOP/s, no sparsity) by a substring of ``torch.cuda.get_device_name()``,
first match wins: NVIDIA's data sheets (H100/H200 SXM 989, H100 PCIe 756, H100 NVL 835, A100 312,
L40S 362)."""


def peak_bf16_tflops(device_name: str) -> float | None:
    """The peak of :data:`PEAK_BF16_TFLOPS` for a CUDA device name; ``None`` when unknown."""
    for key, tflops in PEAK_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return tflops
    return None


def matmul_params(model: Any) -> int:
    """Parameters that take part in a matrix product per token: all of them but an untied input
    embedding (a table look-up; a tied one is the output head's matrix and counts once)."""
    n = sum(p.numel() for p in model.parameters())
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    return n if head is not None and head.weight is emb else n - emb.numel()


def train_flops(n_matmul: int, num_layers: int, attn_width: int, seq_lens: list[int]) -> float:
    """Model FLOPs of one forward + backward over sequences of ``seq_lens`` tokens.

    ``6 * N`` per token for the matrix products (forward 2N, backward 4N) plus causal attention:
    query i attends to i keys, ``QK^T`` and ``AV`` cost ``2 * i * width`` each forward, so a sequence of
    ``s`` tokens costs ``6 * layers * width * s (s + 1)`` over forward + backward. Activation
    recomputation (gradient checkpointing) is not counted: MFU counts the model's FLOPs, not the
    hardware's.
    """
    tokens = sum(seq_lens)
    attn = sum(6 * num_layers * attn_width * s * (s + 1) for s in seq_lens)
    return 6.0 * n_matmul * tokens + float(attn)


def forward_flops(n_matmul: int, num_layers: int, attn_width: int, seq_lens: list[int]) -> float:
    """Model FLOPs of one forward pass (a third of :func:`train_flops`)."""
    return train_flops(n_matmul, num_layers, attn_width, seq_lens) / 3.0
