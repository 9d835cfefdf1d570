"""Scoring only the loss-mask positions gives the log-probs and entropies of the full computation, and the
chunked output head (``logits_chunk_tokens``) gives the unchunked values without the [N, V] logits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from llds_trainer.loss import entropy_from_logits, token_logprobs
from llds_trainer.scoring import target_logprobs


def test_target_logprobs_equal_the_full_vocabulary_computation(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32).eval()
    ids = torch.randint(0, 49152, (2, 12))  # [B, L]
    att = torch.ones_like(ids)
    att[1, 9:] = 0  # right padding
    targets = ids[:, 1:]  # [B, L-1]
    mask = torch.zeros(2, 11)
    mask[0, 3:5] = 1  # an action, an observation gap, another action
    mask[0, 7:10] = 1
    mask[1, 4:8] = 1
    lp, ent = target_logprobs(model, ids, att, targets, mask, temperature=0.7, want_entropy=True)
    full = model(input_ids=ids, attention_mask=att).logits[:, :-1] / 0.7  # [B, L-1, V]
    want_lp, want_ent = token_logprobs(full, targets), entropy_from_logits(full)
    m = mask.bool()
    torch.testing.assert_close(lp[m], want_lp[m], rtol=0, atol=1e-5)
    torch.testing.assert_close(ent[m], want_ent[m], rtol=0, atol=1e-5)
    assert torch.all(lp[~m] == 0) and torch.all(ent[~m] == 0)


def test_gradients_flow_and_an_empty_mask_still_runs_the_model(tiny_model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    ids = torch.randint(0, 49152, (1, 8))
    mask = torch.zeros(1, 7)
    lp, _ = target_logprobs(model, ids, torch.ones_like(ids), ids[:, 1:], mask)
    (lp.sum() * 0.0).backward()  # a graph exists: a filler pass of a sharded update joins the collective
    mask[0, 2:5] = 1
    lp, _ = target_logprobs(model, ids, torch.ones_like(ids), ids[:, 1:], mask)
    model.zero_grad()
    lp.sum().backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())


# ------------------------------------------------------------------ chunked output head


def _long_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three rows of 300 tokens, loss spans of different layouts (the union of positions is wider than
    any row's), right padding on the last: ``N`` = 540 scored tokens."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 49152, (3, 300), generator=g)  # [B, L]
    att = torch.ones_like(ids)
    att[2, 250:] = 0
    mask = torch.zeros(3, 299)  # [B, L-1]
    mask[0, 20:120] = 1
    mask[0, 150:200] = 1
    mask[1, 40:290] = 1
    mask[2, 100:240] = 1
    return ids, att, ids[:, 1:], mask


def _score(model: Any, chunk: int, grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    ids, att, targets, mask = _long_batch()
    model.zero_grad(set_to_none=True)
    with torch.set_grad_enabled(grad):
        lp, ent = target_logprobs(
            model, ids, att, targets, mask, temperature=0.7, want_entropy=True, chunk_tokens=chunk
        )
    assert ent is not None
    grads = None
    if grad:
        (lp.sum() + 0.5 * ent.sum()).backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])  # type: ignore[union-attr]
    return lp, ent, grads


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)


@pytest.mark.parametrize("chunk", [1, 7, 64, 540, 4096])
def test_chunked_head_gives_the_unchunked_values_and_gradients(tiny: Any, chunk: int) -> None:
    """Log-probs, entropies and every parameter's gradient of the chunked head (one chunk to 540 of the
    540 tokens, and more than all) against the head over the whole micro-batch at once. Measured here:
    the values are the same bits for chunks of 7 and more (1 row takes a matrix-vector kernel that
    rounds differently: 1.9e-6 nats on ~11); the gradients, a sum over fewer rows per product, differ
    by 4e-7 of their largest entry."""
    want_lp, want_ent, want_g = _score(tiny, 0, grad=True)
    for grad in (False, True):
        lp, ent, g = _score(tiny, chunk, grad)
        torch.testing.assert_close(lp, want_lp, rtol=1e-6, atol=1e-6 if chunk > 1 else 5e-6)
        torch.testing.assert_close(ent, want_ent, rtol=1e-6, atol=1e-6 if chunk > 1 else 5e-6)
        if g is not None:
            assert want_g is not None
            assert float((g - want_g).abs().max()) <= 1e-5 * float(want_g.abs().max())
    assert torch.all(want_lp[~_long_batch()[3].bool()] == 0)


def _largest_tensor(fn: Any) -> int:
    """Elements of the largest tensor any torch operation produced while ``fn`` ran (forward and backward)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        biggest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    Largest.biggest = max(Largest.biggest, t.numel())
            return out

    with Largest():
        fn()
    return Largest.biggest


def test_chunked_head_never_holds_the_whole_selection_s_logits(tiny: Any) -> None:
    """Chunks of 64: no tensor of the forward or the backward is bigger than one chunk's logits or the
    (tied) embedding matrix; unchunked, the [N, V] logits of all 540 scored tokens exist."""
    n, vocab = 540, tiny.config.vocab_size
    embedding = tiny.get_input_embeddings().weight.numel()  # [V, H], its gradient included
    ids, att, targets, mask = _long_batch()

    def step(chunk: int) -> None:
        lp, ent = target_logprobs(tiny, ids, att, targets, mask, want_entropy=True, chunk_tokens=chunk)
        (lp.sum() + ent.sum()).backward()  # type: ignore[union-attr]

    chunked = _largest_tensor(lambda: step(64))
    whole = _largest_tensor(lambda: step(0))
    tiny.zero_grad(set_to_none=True)
    assert chunked <= max(64 * vocab, embedding) < n * vocab
    assert whole >= n * vocab


def test_chunked_head_refuses_a_model_that_transforms_its_logits(tiny: Any) -> None:
    """A forward that scales the head's output (soft-capping does the same) would turn the log-probs the
    hook returns into garbage: it is refused, never silently used."""
    from llds_trainer.scoring import ScoringError

    class Scaled(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def get_output_embeddings(self) -> Any:
            return self.inner.get_output_embeddings()

        def forward(self, **kw: Any) -> Any:
            out = self.inner(**kw)
            out.logits = out.logits * 2.0
            return out

    ids, att, targets, mask = _long_batch()
    with pytest.raises(ScoringError, match="logits_chunk_tokens = 0"):
        target_logprobs(Scaled(tiny), ids, att, targets, mask, chunk_tokens=64)
    assert not tiny.get_output_embeddings()._forward_pre_hooks, "the hooks are removed after a failure"
    lp, _ = target_logprobs(Scaled(tiny), ids, att, targets, mask, chunk_tokens=0)
    assert torch.all(lp <= 0)


@pytest.mark.parametrize("chunk", [0, 4])
def test_an_empty_mask_keeps_a_graph_under_any_chunking(tiny: Any, chunk: int) -> None:
    ids = torch.randint(0, 49152, (1, 8))
    lp, _ = target_logprobs(
        tiny, ids, torch.ones_like(ids), ids[:, 1:], torch.zeros(1, 7), chunk_tokens=chunk
    )
    assert lp.requires_grad and torch.all(lp == 0)
    (lp.sum() * 0.0).backward()
