"""The GRPO + LLDS learner: one RL step on a list of trajectory groups, checkpoint and resume.

No web framework and no Redis here: :class:`Trainer` takes decoded groups and returns the step's
log record, so it is unit-testable with a tiny model. One RL step, data flowing one way through
modules that never call back into an earlier one:

1. groups -> samples with GRPO advantages (``llds_trainer.batch``);
2. pi_old pass (no grad, ``llds_trainer.scoring``): the current policy's log-probs of every sampled
   token (and the reference model's when the KL term is on) and the entropy;
3. off-policy correction (``llds_trainer.correction``): weights and a keep mask per token from the
   sampler's log-probs, pi_old's and the sampling versions, and the sampler/trainer mismatch;
4. ``epochs_per_step`` x ``minibatches_per_step`` optimizer updates (:meth:`Trainer._update`), each
   accumulating gradients over micro-batches (split across data-parallel ranks, the model replicated
   or sharded by ``llds_trainer.parallel``), clipped, AdamW; each
   micro-step is the config-chosen :class:`~llds_trainer.objective.Objective` (policy loss, KL, entropy,
   regulariser) returning a :class:`~llds_trainer.objective.MicroStats`, summed and reduced by name;
5. LLD probe (no grad): the log-probs after the last update, for the displacement signals
   (``llds_trainer.signals``), then the LLD monitor and the acting alarm.
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from llds_proto import steplog as K
from llds_proto.messages import TrajectoryGroup
from llds_trainer import checkpoint as ckpt
from llds_trainer.batch import Sample, collate, response_slice, samples_from_groups
from llds_trainer.config import TrainerConfig
from llds_trainer.correction import CorrectionOut, apply_mask, build_correction, ratio_quantiles
from llds_trainer.dist import DistContext
from llds_trainer.faults import raise_for_groups
from llds_trainer.lineage import Lineage
from llds_trainer.lld import AlarmAction, LLDMonitor
from llds_trainer.loss import answer_weight
from llds_trainer.objective import MicroInputs, MicroStats, Objective, active_llds, configured_lambda
from llds_trainer.parallel import build_parallel
from llds_trainer.scoring import Scorer
from llds_trainer.signals import lld_signals, mean

log = logging.getLogger("llds.trainer")


class TrainerError(RuntimeError):
    """The trainer cannot continue (bad model folder, empty batch, unreadable checkpoint)."""


class NoLearningSignal(TrainerError):
    """Dynamic sampling found nothing to learn from for ``dynamic_sampling_max_skips`` groups in a row;
    the trainer exits with :data:`llds_proto.exits.EXIT_NO_SIGNAL`."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise TrainerError("device 'cuda' requested but no CUDA device is available")
    return torch.device(name)


def reference_dtype(cfg: TrainerConfig, device: torch.device) -> torch.dtype:
    """Parameter dtype of the frozen reference model (``TrainerConfig.reference_dtype``): ``auto`` is
    bfloat16 on a GPU (half a float32 copy's memory; its log-probs and the KL term are still float32)
    and float32 on the CPU."""
    name = cfg.reference_dtype
    if name == "auto":
        name = "bfloat16" if device.type == "cuda" else "float32"
    if name == "bfloat16" and device.type != "cuda":
        raise TrainerError(f"reference_dtype bfloat16 needs a GPU; the trainer runs on {device.type}")
    return torch.bfloat16 if name == "bfloat16" else torch.float32


@dataclass
class TrainState:
    """Everything besides tensors that a resume needs."""

    step: int = 0
    """RL steps completed."""
    version: int = 0
    """Version the current weights are published as (a publishing step bumps it before its
    checkpoint, so a checkpoint names the version its weights go out as)."""
    window: int = 64
    """Steps whose consumed group ids are kept (``TrainerConfig.consumed_window_steps``)."""
    lineage: Lineage = field(default_factory=Lineage)
    """Versions that are not real updates (orphaned by a restart, restart aliases)."""
    consumed_total: int = 0
    """Groups trained on over the whole run (the window below forgets, this does not)."""
    consumed_steps: deque[tuple[int, list[str]]] = field(default_factory=deque)
    """``(step, group ids)`` of the last ``window`` steps, oldest first."""
    consumed_set: set[str] = field(default_factory=set)
    """The ids of ``consumed_steps``, for duplicate detection."""

    @property
    def consumed(self) -> list[str]:
        """Group ids of the window's steps in training order (a list: a double-trained id shows)."""
        return [g for _, ids in self.consumed_steps for g in ids]

    def add_consumed(self, step: int, ids: Sequence[str]) -> None:
        """Record the groups of ``step``; the step that leaves the window is forgotten."""
        self.consumed_steps.append((step, list(ids)))
        self.consumed_set.update(ids)
        self.consumed_total += len(ids)
        while len(self.consumed_steps) > self.window:
            # Ids are unique in the window (duplicates are dropped before training), so the set
            # loses exactly the ids of the step that leaves.
            _, old = self.consumed_steps.popleft()
            self.consumed_set.difference_update(old)

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "version": self.version,
            "consumed": self.consumed,
            "consumed_steps": [[s, len(ids)] for s, ids in self.consumed_steps],
            "consumed_total": self.consumed_total,
            "lineage": self.lineage.state_dict(),
        }

    @classmethod
    def from_state(cls, st: dict[str, Any], window: int) -> TrainState:
        """Inverse of :meth:`state_dict` (checkpoints without the window layout hold one bucket)."""
        out = cls(step=int(st["step"]), version=int(st["version"]), window=window)
        out.lineage = Lineage.from_state(st.get("lineage"))
        ids = list(st["consumed"])
        layout = st.get("consumed_steps") or ([[out.step, len(ids)]] if ids else [])
        if sum(n for _, n in layout) != len(ids):
            raise ckpt.CheckpointError(f"consumed_steps {layout} does not add up to {len(ids)} consumed ids")
        k = 0
        for s, n in layout:
            out.consumed_steps.append((int(s), ids[k : k + n]))
            k += n
        while len(out.consumed_steps) > window:
            out.consumed_steps.popleft()
        out.consumed_set = {g for _, b in out.consumed_steps for g in b}
        out.consumed_total = int(st.get("consumed_total", len(ids)))
        return out


def lr_at(cfg: TrainerConfig, step: int) -> float:
    """Learning rate of 0-based RL step ``step``: linear warm-up, then constant."""
    opt = cfg.optimizer
    if opt.warmup_steps <= 0:
        return opt.lr
    return opt.lr * min(1.0, (step + 1) / opt.warmup_steps)


class Trainer:
    """Policy, optimizer and step logic of one data-parallel rank."""

    def __init__(self, cfg: TrainerConfig, dist: DistContext | None = None):
        if not cfg.model:
            raise TrainerError("no model folder given (--model)")
        if not Path(cfg.model, "config.json").is_file():
            raise TrainerError(f"model folder {cfg.model} has no config.json")
        from transformers import AutoModelForCausalLM

        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.dist = dist or DistContext()
        if cfg.num_threads and self.device.type == "cpu":
            torch.set_num_threads(cfg.num_threads)
        torch.manual_seed(cfg.seed)
        dtype = torch.bfloat16 if cfg.dtype == "bfloat16" else torch.float32
        self.model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=dtype).to(self.device)
        self.model.config.use_cache = False
        if cfg.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self.parallel = build_parallel(cfg.parallel, self.dist)
        self.parallel.wrap(self.model)
        self.ref_model = None
        if cfg.kl_coef > 0:
            ref = cfg.reference_model or cfg.model
            ref_dtype = reference_dtype(cfg, self.device)
            self.ref_model = AutoModelForCausalLM.from_pretrained(ref, dtype=ref_dtype).to(self.device)
            self.ref_model.eval().requires_grad_(False)
            # Sharded like the policy under fsdp: a frozen replica would cost a full copy of the
            # weights per rank, most of what sharding the policy saved (a 7B bf16 reference: 14 GB).
            self.parallel.wrap(self.ref_model)
        pad = self.model.config.pad_token_id
        self.pad_id = int(pad) if pad is not None else 0
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        impl = cfg.optimizer.implementation
        fused = impl == "fused" or (impl == "auto" and cfg.parallel != "fsdp")
        self.optimizer = torch.optim.AdamW(
            self.params,
            lr=cfg.optimizer.lr,
            betas=cfg.optimizer.betas,
            eps=cfg.optimizer.eps,
            weight_decay=cfg.optimizer.weight_decay,
            fused=fused,
            foreach=None if fused else True,
        )
        self.state = TrainState(window=cfg.consumed_window_steps)
        self.updates_this_step = 0
        """Optimizer updates the current (or last) step applied: after a step raised, whether the
        weights may have moved."""
        self.monitor = LLDMonitor.from_config(cfg.lld)
        self.alarm_action = AlarmAction.from_config(cfg.lld.alarm, configured_lambda(cfg))
        self.objective = Objective.from_config(cfg, self.alarm_action.lam)
        self.correction = build_correction(cfg.correction)
        autocast = torch.bfloat16 if cfg.autocast == "bfloat16" else None
        self.scorer = Scorer(self.model, self.ref_model, cfg.temperature, cfg.micro_batch_size, self.pad_id,
                             self.device, self.dist, autocast, lockstep=self.parallel.lockstep,
                             chunk_tokens=cfg.logits_chunk_tokens)  # fmt: skip

    # ------------------------------------------------------------------ the step's passes

    def _correct(
        self, samples: list[Sample], old: list[Tensor]
    ) -> tuple[CorrectionOut | None, dict[str, float | int | None]]:
        """The off-policy correction of every sample (rows in sample order) and its step-record values,
        with the sampler/trainer mismatch and the loss and stale token counts.

        Computed once per step on all samples (every rank holds them all), so the statistics need no
        reduction across ranks and count each token once whatever the epochs and mini-batches.
        """
        full = collate(samples, range(len(samples)), self.pad_id).to(self.device)
        logp_old = self.scorer.place(full, samples, old)  # [N, L-1]
        loss = full.loss_mask.bool()  # [N, L-1]
        d = (logp_old - full.logp_sampler)[loss]  # [n] log-ratio pi_old / sampler of the loss tokens
        behind = (self.state.version - full.versions)[loss]  # [n] versions behind the trainer's
        rec = ratio_quantiles(d, behind)
        # The sampler/trainer mismatch from the same log-ratios: KL(sampler || pi_old) (k3 estimator).
        rec[K.MISMATCH_KL] = float((torch.exp(d) - d - 1).double().mean()) if d.numel() else None
        rec[K.MISMATCH_ABS_LOGP_DIFF] = float(d.abs().double().mean()) if d.numel() else None
        rec[K.DATA_LOSS_TOKENS] = int(loss.sum())
        rec[K.DATA_STALE_TOKENS] = int((behind > 0).sum())
        rec[K.DATA_MIXED_VERSION_TRAJECTORIES] = sum(
            len({v for v, m in zip(s.versions, s.loss_mask, strict=True) if m}) > 1 for s in samples
        )
        if self.correction is None:
            return None, {**rec, K.IS_WEIGHT_MEAN: None, K.IS_TRUNCATED_FRAC: None,
                          K.IS_MASKED_TOKEN_FRAC: None, K.IS_DROPPED_SEQ_FRAC: None}  # fmt: skip
        apply = apply_mask(self.cfg.correction.tokens, loss, full.versions, self.state.version)  # type: ignore[union-attr]
        out = self.correction.weights(logp_old, full.logp_sampler, apply, full.loss_mask)
        st = out.stats
        rec[K.IS_WEIGHT_MEAN] = st.weight_sum / st.kept_corrected if st.kept_corrected else None
        rec[K.IS_TRUNCATED_FRAC] = (
            st.truncated / st.corrected if st.truncated is not None and st.corrected else None
        )
        rec[K.IS_MASKED_TOKEN_FRAC] = st.masked_tokens / st.loss_tokens if st.loss_tokens else None
        rec[K.IS_DROPPED_SEQ_FRAC] = st.dropped_sequences / st.sequences if st.sequences else None
        return out, rec

    def orders(self, n: int, step: int) -> list[list[list[int]]]:
        """The step's sample order: per epoch, its mini-batches (lists of sample positions)."""
        cfg = self.cfg
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        out = []
        for _epoch in range(cfg.epochs_per_step):
            order = torch.randperm(n, generator=gen).tolist() if cfg.shuffle else list(range(n))
            out.append(
                [m.tolist() for m in torch.tensor_split(torch.tensor(order), cfg.minibatches_per_step)]
            )
        return out

    def reuses_old_pass(self) -> bool:
        """Whether pi_old of the first mini-batch comes from the first update's own forward (see
        ``TrainerConfig.old_from_first_update``): one process, no dropout, so that forward runs the
        weights pi_old means on the same inputs, and the values are pi_old's."""
        cfg = self.cfg
        if not cfg.old_from_first_update or self.dist.world_size != 1:
            return False
        dropout = any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in self.model.modules())
        return not dropout and not getattr(self.model.config, "attention_dropout", 0.0)

    def _update(
        self,
        samples: list[Sample],
        orders: list[list[list[int]]],
        old: list[Tensor],
        ent: list[Tensor],
        ref: list[Tensor] | None,
        ans_w: float | None,
        step: int,
        first: set[int],
    ) -> tuple[dict[str, float], float, list[float], int, dict[str, float | int | None]]:
        """``epochs_per_step`` x ``minibatches_per_step`` optimizer updates. Returns the micro-step stats
        summed over micro-batches and ranks (by name), the largest ratio, the pre-clip gradient norm of
        each update, how many updates a non-finite norm skipped, and the correction's step values.

        ``first``: samples whose pi_old (and entropy) the first update's forward provides, filled into
        ``old`` and ``ent`` there; the correction of the other rows waits until ``old`` is whole.
        """
        cfg = self.cfg
        total = MicroStats()
        ratio_max = 0.0
        grad_norms: list[float] = []
        nonfinite = skipped = 0
        corr: CorrectionOut | None = None
        corr_rec: dict[str, float | int | None] = {}
        if not first:
            corr, corr_rec = self._correct(samples, old)
        self.model.train()
        for epoch, minibatches in enumerate(orders):
            for mb_pos, mini in enumerate(minibatches):
                if not mini:
                    continue
                fills = bool(first) and epoch == 0 and mb_pos == 0
                micros = self.scorer.micro_batches(mini)
                scale = 1.0 / len(micros)
                for idx, real in self.scorer.mine(micros):
                    mb = collate([samples[i] for i in idx], idx, self.pad_id).to(self.device)
                    if not real:
                        # A sharded backward is a collective: join it with a pass that adds zero.
                        (self.scorer.logp(self.model, mb, False)[0].sum() * 0.0).backward()
                        continue
                    logp_new, ent_new = self.scorer.logp(self.model, mb, fills or cfg.entropy_coef > 0)
                    is_w = keep = None
                    if fills:
                        logp_old = logp_new.detach()  # [B, L-1]: these weights are pi_old
                        for b, i in enumerate(idx):
                            sl = response_slice(samples[i])
                            old[i] = logp_old[b, sl].cpu()
                            ent[i] = ent_new[b, sl].detach().cpu()  # type: ignore[index]
                        if self.correction is not None:
                            apply = apply_mask(cfg.correction.tokens, mb.loss_mask.bool(), mb.versions,  # type: ignore[union-attr]
                                               self.state.version)  # fmt: skip
                            out = self.correction.weights(logp_old, mb.logp_sampler, apply, mb.loss_mask)
                            is_w, keep = out.weights, out.keep_mask
                    else:
                        logp_old = self.scorer.place(mb, samples, old)
                        if corr is not None:
                            # the step's rows of this micro-batch (right padding: its columns are a prefix)
                            rows, cols = torch.tensor(mb.index, device=self.device), mb.loss_mask.shape[1]
                            is_w, keep = corr.weights[rows, :cols], corr.keep_mask[rows, :cols]
                    x = MicroInputs(logp_new, logp_old, mb.advantages, mb.loss_mask, mb.answer_mask,
                                    entropy=ent_new if cfg.entropy_coef > 0 else None,
                                    logp_ref=self.scorer.place(mb, samples, ref) if ref is not None else None,
                                    is_weights=is_w, keep_mask=keep)  # fmt: skip
                    loss, stats, r_max = self.objective(x, ans_w)
                    (loss * scale).backward()
                    stats.train_tokens = int(mb.attention_mask.sum())
                    total.add(stats)
                    ratio_max = max(ratio_max, r_max)
                self.parallel.reduce_grads(self.params)
                norm = self.parallel.clip_grad_norm(self.params, cfg.optimizer.grad_clip)
                if self._skips(norm, [samples[i] for i in mini]):
                    skipped += 1
                elif math.isfinite(norm):
                    self.optimizer.step()
                    self.updates_this_step += 1
                else:
                    nonfinite += 1
                    log.warning("step %d: non-finite gradient norm, update skipped", step + 1)
                self.optimizer.zero_grad(set_to_none=True)
                grad_norms.append(norm)
                if fills:
                    # pi_old is whole now: the correction of every row, and the step's statistics.
                    corr, corr_rec = self._correct(samples, old)
        # Every rank reduces the same names in the same order, so every rank logs the same record.
        local = total.as_dict()
        sums = dict(zip(local, self.dist.all_reduce_sum(list(local.values())), strict=True))
        corr_rec[K.ACTOR_SKIPPED_UPDATES] = skipped
        return sums, ratio_max, grad_norms, nonfinite, corr_rec

    def _skips(self, norm: float, mini: list[Sample]) -> bool:
        """Whether ``optimizer.skip_updates`` leaves the weights (and the optimizer's state) alone for
        this update. ``norm`` is the pre-clip norm every rank computed alike; ``mini`` the whole
        mini-batch (every rank's rows), so ranks agree."""
        mode = self.cfg.optimizer.skip_updates
        if mode == "zero_grad":
            return norm == 0.0
        if mode == "no_signal":
            return all(s.advantage == 0 for s in mini)
        return False

    def _probe(self, samples: list[Sample], parts: list[list[int]]) -> list[Tensor]:
        """Log-probs after the step's last update, of the micro-batches that hold a correct response:
        the displacement signals read no other (``llds_trainer.signals``). Rows not scored are empty.

        ``parts``: the sample lists pi_old was scored in (the first update's mini-batch, in its order,
        and the pi_old pass's rows), each re-scored in the same micro-batches, so that a sample's
        before and after come from the same padding and batch: weights that did not move give a
        displacement of exactly zero."""
        out = [torch.zeros(0) for _ in samples]
        for part in parts:
            sub = [samples[i] for i in part]
            correct = {k for k, s in enumerate(sub) if s.correct}
            if not correct:
                continue
            scored = self.scorer.score(sub, entropy=False, ref=False, only=correct)[0]
            for k, i in enumerate(part):
                out[i] = scored[k]
        return out

    def _samples(self, groups: Sequence[TrajectoryGroup]) -> list[Sample]:
        raise_for_groups([g.group_id for g in groups])
        return samples_from_groups(groups, overlong_filter=self.cfg.overlong_filter)

    def check_group(self, group: TrajectoryGroup) -> str | None:
        """Why ``group`` alone fails a forward and backward pass of the policy (None: it passes). The
        service asks this of each group of a step that raised, to find the entries to blame; the
        gradients are thrown away and the weights and the optimizer's state are not touched."""
        try:
            samples = self._samples([group])
            self.model.train()
            for idx in self.scorer.micro_batches(range(len(samples))):
                mb = collate([samples[i] for i in idx], idx, self.pad_id).to(self.device)
                self.scorer.logp(self.model, mb, False)[0].sum().backward()
            return None
        except Exception as e:  # what failed is the answer
            return f"{type(e).__name__}: {e}"
        finally:
            self.optimizer.zero_grad(set_to_none=True)

    # ------------------------------------------------------------------ the step
    def train_step(self, groups: Sequence[TrajectoryGroup]) -> dict[str, Any]:
        """One RL step on ``groups``; returns the step's log record (slash-namespaced keys)."""
        t0 = time.perf_counter()
        cfg = self.cfg
        self.updates_this_step = 0
        samples = self._samples(groups)
        if not samples or not any(s.n_loss_tokens for s in samples):
            raise TrainerError(
                "a step needs at least one trajectory with loss tokens"
                + (
                    " (overlong_filter masked every truncated one)"
                    if any(s.overlong for s in samples)
                    else ""
                )
            )
        step = self.state.step
        lr = lr_at(cfg, step)
        for g in self.optimizer.param_groups:
            g["lr"] = lr

        orders = self.orders(len(samples), step)
        first = set(orders[0][0]) if self.reuses_old_pass() and orders[0] else set()
        rest = [i for i in range(len(samples)) if i not in first]
        old, ent = [torch.zeros(0)] * len(samples), [torch.zeros(0)] * len(samples)
        if rest:
            rest_old, rest_ent, _ = self.scorer.score([samples[i] for i in rest], entropy=True, ref=False)
            for k, i in enumerate(rest):
                old[i], ent[i] = rest_old[k], rest_ent[k]  # type: ignore[index]
        ref = (
            self.scorer.score(samples, entropy=False, ref=True, policy=False)[2] if cfg.kl_coef > 0 else None
        )
        t_old = time.perf_counter()
        v_s = sum(s.num_valid_searches for s in samples) / len(samples)
        lam = self.alarm_action.lam
        llds = active_llds(cfg)
        ans_w = None
        if llds is not None:
            ans_w = answer_weight(
                llds.answer_weight_mode, llds.coef if lam is None else lam, llds.answer_weight, v_s
            )

        sums, ratio_max, grad_norms, nonfinite, corr_rec = self._update(
            samples, orders, old, ent, ref, ans_w, step, first
        )
        t_train = time.perf_counter()
        n_micro = max(sums["micro"], 1)

        after = self._probe(samples, [list(orders[0][0]) if first else [], rest]) if cfg.lld.probe else None
        t_probe = time.perf_counter()
        self.state.step += 1
        rec: dict[str, Any] = {
            K.STEP: self.state.step,
            K.TIME_UNIX: time.time(),
            K.DATA_GROUPS: len(groups),
            K.DATA_TRAJECTORIES: len(samples),
            K.DATA_OVERLONG: sum(s.overlong for s in samples),
            K.REWARD_MEAN: sum(s.reward for s in samples) / len(samples),
            K.REWARD_EXACT_MATCH: sum(s.exact_match for s in samples) / len(samples),
            K.LOSS_TOTAL: sums["total"] / n_micro,
            K.LOSS_POLICY: sums["pg"] / n_micro,
            K.LOSS_LLDS: sums["llds"] / sums["llds_n"] if sums["llds_n"] else 0.0,
            # loss/total = loss/policy + kl_coef * loss/kl - entropy_coef * loss/entropy + loss/llds
            # (each a mean over the same micro-batches).
            K.LOSS_KL: sums["kl"] / sums["kl_n"] if sums["kl_n"] else None,
            K.LOSS_ENTROPY: sums["ent"] / sums["ent_n"] if sums["ent_n"] else None,
            K.LLDS_GATED_FRACTION: sums["gated"] / sums["gate_units"] if sums["gate_units"] else 0.0,
            K.LLDS_ANSWER_WEIGHT: ans_w,
            K.ACTOR_LR: lr,
            K.ACTOR_UPDATES: len(grad_norms) - nonfinite - corr_rec[K.ACTOR_SKIPPED_UPDATES],
            K.ACTOR_NONFINITE_UPDATES: nonfinite,
            K.ACTOR_GRAD_NORM: mean(grad_norms),
            K.ACTOR_GRAD_NORM_MAX: max(grad_norms) if grad_norms else None,
            K.ACTOR_CLIP_FRAC: sums["clip"] / n_micro,
            K.ACTOR_DUAL_CLIP_FRAC: sums["dual_clip"] / n_micro
            if getattr(cfg.policy_loss, "dual_clip_c", None) is not None
            else None,
            K.ACTOR_RATIO_MAX: ratio_max,
            **corr_rec,
            K.ROLLOUT_VALID_SEARCHES_MEAN: v_s,
            K.ROLLOUT_TURNS_MEAN: sum(s.num_turns for s in samples) / len(samples),
            K.ROLLOUT_RESPONSE_LEN_MEAN: sum(len(s.response_ids) for s in samples) / len(samples),
            K.PERF_OLD_PASS_S: t_old - t0,
            K.PERF_OLD_FROM_UPDATE_FRAC: len(first) / len(samples),
            K.PERF_UPDATE_S: t_train - t_old,
            K.PERF_PROBE_S: t_probe - t_train,
            K.PERF_TRAIN_TOKENS_PER_S: sums["train_tokens"] / max(t_train - t_old, 1e-9),
        }
        rec.update(lld_signals(samples, old, ent, after))
        rec[K.LLD_LLDS_TERM] = rec[K.LOSS_LLDS]
        before = self.monitor.state
        rec.update(
            self.monitor.update(
                rec[K.LLD_CORRECT_LOGP_TOKEN],
                rec[K.LLD_FELL_FRACTION_RESPONSES],
                rec[K.ACTOR_ENTROPY],
                rec[K.ACTOR_GRAD_NORM],
            )
        )
        # The lambda this step trained with; an acting alarm changes the next step's (lld/action = 1).
        rec[K.LLDS_LAMBDA] = 0.0 if lam is None else lam
        acted = self.alarm_action.react(before, self.monitor.state, self.state.step)
        rec[K.LLD_ACTION] = float(acted)
        if acted:
            self.objective = Objective.from_config(cfg, self.alarm_action.lam)
            log.warning(
                "LLD alarm %s at step %d: %s, LLDS lambda now %s (from the next step)",
                self.monitor.state, self.state.step, cfg.lld.alarm.type, self.alarm_action.lam,
            )  # fmt: skip
        rec[K.PERF_STEP_S] = time.perf_counter() - t0
        return rec

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, run_dir: str | Path) -> Path:
        """Atomically write the full training state for the current step; returns its folder.

        Every rank calls this: rank 0 makes the temp folder, the model and optimizer go in by
        :meth:`DataParallel.save` (rank 0 alone when replicated, every rank its shards when sharded),
        then rank 0 adds the RNG and ``state.json`` and renames the folder into place.
        """
        from safetensors.torch import save_file

        main = self.dist.is_main
        tmp = Path(self.dist.broadcast_object(str(ckpt.begin(run_dir, self.state.step)) if main else None))
        try:
            self.parallel.save(self.model, self.optimizer, tmp)
            if main:
                rng = {"torch": torch.get_rng_state()}
                if torch.cuda.is_available():
                    rng["cuda"] = torch.cuda.get_rng_state()
                save_file(rng, str(tmp / ckpt.RNG_FILE))
        except (OSError, RuntimeError) as e:
            # torch reports a failed write (ENOSPC, EFBIG) as an opaque iostream error: name the cause.
            if main:
                shutil.rmtree(tmp, ignore_errors=True)
            free = shutil.disk_usage(tmp.parent).free
            raise ckpt.CheckpointError(
                f"writing checkpoint step {self.state.step} into {tmp.parent} failed ({free} bytes free; "
                f"disk full or file size limit?): {e}; the previous checkpoint is untouched"
            ) from e
        final = ckpt.checkpoint_root(run_dir) / f"step_{self.state.step:08d}"
        if main:
            state = {
                **self.state.state_dict(),
                "monitor": self.monitor.state_dict(),
                "alarm_action": self.alarm_action.state_dict(),
                "model_source": self.cfg.model,
                "parallel": self.cfg.parallel,
                "world_size": self.dist.world_size,
            }
            final = ckpt.commit(tmp, run_dir, self.state.step, state, self.cfg.keep_checkpoints)
        self.dist.barrier()  # no rank goes on (to a next checkpoint, to exit) before the rename
        return final

    def load_checkpoint(self, path: Path) -> None:
        """Restore model, optimizer, RNG, step, version, lineage, consumed ids and monitor history
        (every rank calls this)."""
        from safetensors.torch import load_file

        st = ckpt.read_state(path)
        self.parallel.load(self.model, self.optimizer, path)
        if (path / ckpt.RNG_FILE).is_file():
            rng = load_file(str(path / ckpt.RNG_FILE))
            torch.set_rng_state(rng["torch"])
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state(rng["cuda"])
        self.state = TrainState.from_state(st, self.cfg.consumed_window_steps)
        self.monitor.load_state_dict(st["monitor"])
        self.alarm_action.load_state_dict(st.get("alarm_action"))
        self.objective = Objective.from_config(self.cfg, self.alarm_action.lam)

    def published_state(self) -> dict[str, Any] | None:
        """The state dict a publish writes on rank 0, or None for the live model's own.

        Every rank calls this: under fsdp it gathers the shards to rank 0.
        """
        return self.parallel.full_state(self.model)
