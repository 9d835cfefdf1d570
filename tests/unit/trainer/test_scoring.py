"""Scoring only the loss-mask positions gives the log-probs and entropies of the full computation."""

from __future__ import annotations

from pathlib import Path

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
