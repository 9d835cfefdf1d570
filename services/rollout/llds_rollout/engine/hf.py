"""Transformers backend: a continuous-batching decode loop over a Hugging Face causal LM on the CPU.

One worker thread owns the model. Requests wait in a queue; between decode steps the worker admits
waiting requests (prefilled together, then merged into the running batch by left-padding the KV
cache), runs one decode step for every running row, and retires rows that hit a stop string, EOS or
their token budget. The loop is our own rather than ``model.generate`` so that the sampled ids, their
log-probs and the stop rule are exactly ours, and so that rows can join and leave between steps.

A weight swap is a command in the same queue, applied between two decode steps as ``swap_mode``
says: ``drain`` stops admission until the running rows finish on the old weights (no request sees
two versions); ``inflight`` copies the tensors in at once and the running rows go on with their cache
as it is; ``abort`` copies them in and re-admits every running row with its generated tokens appended
to its prompt, so its cache is recomputed under the new weights. Every token records the version
that sampled it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from llds_rollout.engine.base import (
    Engine,
    EngineError,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    WeightLoadError,
    WeightSwapError,
)

log = logging.getLogger("llds_rollout.engine.hf")

_STOP_WINDOW = 16
"""Tokens decoded to look for a stop string; each stop string is far shorter than this many tokens."""


@dataclass
class _Row:
    req: GenerationRequest
    fut: concurrent.futures.Future[GenerationResult]
    version: int
    ids: list[int] = field(default_factory=list)
    lps: list[float] = field(default_factory=list)
    vs: list[int] = field(default_factory=list)
    finish: FinishReason | None = None
    stop_str: str | None = None
    t_submit: float = 0.0
    t_start: float = 0.0


@dataclass
class _Swap:
    tensors: Mapping[str, torch.Tensor]
    version: int
    fut: concurrent.futures.Future[None]


_STOP = object()


def _alive(r: _Row) -> bool:
    """Still decoding: not finished, and its caller still waits."""
    return r.finish is None and not r.fut.done()


def check_tensors(model: torch.nn.Module, tensors: Mapping[str, torch.Tensor]) -> None:
    """Raise :class:`WeightLoadError` unless ``tensors`` cover every parameter of ``model`` exactly.

    Tied parameters (e.g. ``lm_head.weight`` sharing the embedding) may be absent, as safetensors
    checkpoints store them once.
    """
    sd = model.state_dict()
    unexpected = sorted(set(tensors) - set(sd))
    if unexpected:
        raise WeightLoadError(f"tensors not in the model: {unexpected[:5]}")
    provided_ptrs = {sd[k].data_ptr() for k in tensors}
    missing = [k for k in sd if k not in tensors and sd[k].data_ptr() not in provided_ptrs]
    if missing:
        raise WeightLoadError(f"tensors missing from the checkpoint: {missing[:5]}")
    for k, t in tensors.items():
        if tuple(t.shape) != tuple(sd[k].shape):
            raise WeightLoadError(f"{k}: shape {tuple(t.shape)} != model's {tuple(sd[k].shape)}")
        if not t.is_floating_point() and sd[k].is_floating_point():
            raise WeightLoadError(f"{k}: dtype {t.dtype} is not a floating type")


def sample_tokens(
    logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, generator: torch.Generator | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row.

    Args:
        logits: ``[B, V]`` next-token logits.
        temperature: ``[B]``; 0 selects greedy (argmax) for that row.
        top_p: ``[B]`` nucleus mass kept (1.0 keeps everything).

    Returns:
        ``([B] token ids, [B] log-probs)``: the log-prob of the chosen token under the distribution it
        was sampled from: temperature-scaled softmax, renormalised over the top-p nucleus (raw
        logits when greedy). This is vLLM's ``processed_logprobs``, so both backends agree.
    """
    logits = logits.float()
    greedy = temperature <= 0
    t = torch.where(greedy, torch.ones_like(temperature), temperature)
    logp = torch.log_softmax(logits / t[:, None], dim=-1)  # [B, V]
    probs = logp.exp()
    if bool((top_p < 1).any()):
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # [B, V] mass strictly above each token
        sorted_p = sorted_p.masked_fill(before > top_p[:, None], 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
        logp = torch.where(greedy[:, None], logp, probs.log())  # the renormalised nucleus is sampled from
    # Exponential race (argmax of p / E, E ~ Exp(1)) draws from ``probs`` exactly, and is ~50x faster
    # than torch.multinomial over a 50k vocabulary on the CPU.
    race = torch.empty_like(probs).exponential_(generator=generator)
    sampled = (probs / race).argmax(-1)  # [B]
    tokens = torch.where(greedy, logits.argmax(-1), sampled)
    return tokens, logp.gather(-1, tokens[:, None]).squeeze(-1)


class TransformersEngine(Engine):
    """Continuous-batching engine over ``AutoModelForCausalLM`` (CPU or one GPU)."""

    def __init__(
        self,
        model: str,
        *,
        max_batch_size: int = 32,
        dtype: str = "float32",
        device: str = "cpu",
        seed: int = 0,
        torch_threads: int = 0,
        initial_version: int = 0,
        swap_mode: str = "drain",
    ) -> None:
        super().__init__()
        self.model_name = model
        self.max_batch_size = max_batch_size
        self.dtype = getattr(torch, dtype)
        self.device = torch.device(device)
        self._version = initial_version
        self.torch_threads = torch_threads
        self.swap_mode = swap_mode
        self._generator = torch.Generator(device=self.device).manual_seed(seed)
        self._queue: queue.Queue[Any] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._ready = False
        self._stopped = False
        self.model: Any = None
        self.tokenizer: Any = None
        self._eos: set[int] = set()
        self._stats = {"generated_tokens": 0.0, "busy_s": 0.0, "steps": 0.0, "requests": 0.0}

    # ------------------------------------------------------------------ lifecycle

    @property
    def ready(self) -> bool:
        return self._ready

    def start(self) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if self.torch_threads:
            torch.set_num_threads(self.torch_threads)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_name)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_name, dtype=self.dtype)
        self.model.to(self.device).eval()
        eos = self.model.generation_config.eos_token_id
        self._eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            self._eos.add(int(self.tokenizer.eos_token_id))
        pad = self.tokenizer.pad_token_id
        self._pad = int(pad if pad is not None else next(iter(self._eos), 0))
        self._thread = threading.Thread(target=self._run, name="hf-engine", daemon=True)
        self._thread.start()
        self._ready = True
        log.info("transformers engine ready model=%s version=%d", self.model_name, self._version)

    def shutdown(self) -> None:
        self._ready = False
        self._stopped = True
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout=30)
            self._thread = None

    def stats(self) -> dict[str, float]:
        return dict(self._stats)

    # ------------------------------------------------------------------ API

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if not self._ready:
            raise EngineError("engine is not loaded")
        if self._failed is not None:
            raise EngineError(self._failed)
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {request.max_tokens}")
        if not request.prompt_ids:
            raise ValueError("empty prompt")
        fut: concurrent.futures.Future[GenerationResult] = concurrent.futures.Future()
        self._queue.put(_Row(req=request, fut=fut, version=-1, t_submit=time.perf_counter()))
        return await asyncio.wrap_future(fut)

    async def update_weights(self, tensors: Mapping[str, torch.Tensor], folder: Path, version: int) -> None:
        if not self._ready:
            raise EngineError("engine is not loaded")
        await asyncio.to_thread(check_tensors, self.model, tensors)
        fut: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._queue.put(_Swap(tensors=tensors, version=version, fut=fut))
        await asyncio.wrap_future(fut)

    # ------------------------------------------------------------------ worker

    def _run(self) -> None:
        waiting: deque[_Row] = deque()
        swap: _Swap | None = None
        running: list[_Row] = []
        batch: dict[str, Any] = {}
        waited_steps = 0
        while True:
            block = not running and not waiting and swap is None
            try:
                items = [
                    self._queue.get(timeout=1.0 if block else None) if block else self._queue.get_nowait()
                ]
            except queue.Empty:
                items = []
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            for it in items:
                if it is _STOP:
                    for f in [r.fut for r in [*running, *waiting]] + ([swap.fut] if swap else []):
                        if not f.done():
                            f.set_exception(EngineError("engine shut down"))
                    return
                if isinstance(it, _Swap):
                    if swap is not None and not swap.fut.done():
                        swap.fut.set_exception(EngineError("superseded by a newer weight update"))
                    swap = it
                else:
                    waiting.append(it)
            if swap is not None and (not running or self.swap_mode != "drain"):
                if self._apply_swap(swap) and self.swap_mode == "abort" and running:
                    # Each live row continues from its last token: re-prefilled under the new weights.
                    waiting.extendleft(reversed([r for r in running if _alive(r)]))
                    running, batch = [], {}
                swap = None
            try:
                # A cancelled caller (its asyncio task was cancelled) needs no tokens.
                waiting = deque(r for r in waiting if not r.fut.done())
                live = sum(1 for r in running if _alive(r))
                if swap is None and waiting and live < self.max_batch_size:
                    # Joining copies the whole KV cache, so arrivals are admitted in bunches relative
                    # to the batch size; a lone arrival waits at most a few decode steps.
                    if not live or len(waiting) >= max(1, live // 4) or waited_steps >= 4:
                        new = [
                            waiting.popleft() for _ in range(min(len(waiting), self.max_batch_size - live))
                        ]
                        running, batch = self._admit(running, batch, new)
                        waited_steps = 0
                    else:
                        waited_steps += 1
                if running:
                    running, batch = self._step(running, batch)
            except Exception as e:  # the model failed: fail what it was running, keep serving
                log.exception("engine step failed")
                for r in running:
                    if not r.fut.done():
                        r.fut.set_exception(EngineError(f"engine step failed: {e}"))
                running, batch = [], {}

    def _apply_swap(self, swap: _Swap) -> bool:
        """Copy the tensors in and serve them as ``swap.version``; False (the future failed) if not."""
        t0 = time.perf_counter()
        try:
            sd = self.model.state_dict()
            with torch.no_grad():
                for k, t in swap.tensors.items():
                    sd[k].copy_(t.to(device=self.device, dtype=sd[k].dtype))
        except Exception as e:
            # The tensors copied before the failure are in: no whole version is serving.
            self.mark_failed(
                f"weights update to version {swap.version} failed mid-way (copying: {e}); the weights "
                "are mixed: serving nothing until a whole version loads"
            )
            if not swap.fut.done():
                swap.fut.set_exception(WeightSwapError(self._failed or ""))
            return False
        self._version = swap.version
        self._failed = None
        log.info("weights swapped version=%d copy_s=%.3f", swap.version, time.perf_counter() - t0)
        if not swap.fut.done():
            swap.fut.set_result(None)
        return True

    @torch.no_grad()
    def _admit(self, running: list[_Row], batch: dict[str, Any], new: list[_Row]) -> tuple[list[_Row], dict]:
        t0 = time.perf_counter()
        for r in new:
            if not r.ids:  # a row re-admitted by an abort swap keeps its start
                r.version = self._version
                r.t_start = t0
        # Prompts are prefilled in chunks of similar length: left padding inside a chunk is computed
        # for nothing, and prompt lengths here range from a bare question to a 4k-token context.
        new.sort(key=lambda r: len(r.req.prompt_ids) + len(r.ids))
        parts: list[dict[str, Any]] = []
        chunk: list[_Row] = []
        for r in new:
            longest = len(r.req.prompt_ids) + len(r.ids)
            if chunk and longest * (len(chunk) + 1) > 1.25 * (
                sum(len(c.req.prompt_ids) + len(c.ids) for c in chunk) + longest
            ):
                parts.append(self._prefill(chunk))
                chunk = []
            chunk.append(r)
        parts.append(self._prefill(chunk))
        self._stats["busy_s"] += time.perf_counter() - t0
        self._stats["requests"] += len(new)
        running, batch = self._compact(running, batch)
        new_batch = self._stack(([batch] if running else []) + parts)
        return self._retire(running + new, new_batch)

    def _prefill(self, rows: list[_Row]) -> dict[str, Any]:
        n = max(len(r.req.prompt_ids) + len(r.ids) for r in rows)
        ids = torch.full((len(rows), n), self._pad, dtype=torch.long)
        mask = torch.zeros((len(rows), n), dtype=torch.long)
        for i, r in enumerate(rows):
            p = r.req.prompt_ids + r.ids  # a re-admitted row: its prompt and what it has generated
            ids[i, n - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, n - len(p) :] = 1
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=pos.to(self.device),
            use_cache=True,
        )
        self._check_cache(out.past_key_values)
        nxt = self._sample_rows(rows, out.logits[:, -1, :])
        return {"cache": out.past_key_values, "mask": mask.to(self.device), "next": nxt}

    @torch.no_grad()
    def _step(self, running: list[_Row], batch: dict[str, Any]) -> tuple[list[_Row], dict]:
        t0 = time.perf_counter()
        mask = batch["mask"]
        pos = mask.sum(-1, keepdim=True)  # [B, 1]: real tokens before the fed one
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        out = self.model(
            input_ids=batch["next"][:, None],
            attention_mask=mask,
            position_ids=pos,
            past_key_values=batch["cache"],
            use_cache=True,
        )
        batch = {
            "cache": out.past_key_values,
            "mask": mask,
            "next": self._sample_rows(running, out.logits[:, -1, :]),
        }
        self._stats["busy_s"] += time.perf_counter() - t0
        self._stats["steps"] += 1
        return self._retire(running, batch)

    def _sample_rows(self, rows: list[_Row], logits: torch.Tensor) -> torch.Tensor:
        temps = torch.tensor([r.req.temperature for r in rows], dtype=torch.float32, device=logits.device)
        top_p = torch.tensor([r.req.top_p for r in rows], dtype=torch.float32, device=logits.device)
        tokens, lps = sample_tokens(logits, temps, top_p, self._generator)
        for r, tok, lp in zip(rows, tokens.tolist(), lps.tolist(), strict=True):
            if not _alive(r):  # a finished row still in the batch: its token is never used
                continue
            r.ids.append(int(tok))
            r.lps.append(float(lp))
            r.vs.append(self._version)
            self._stats["generated_tokens"] += 1
            if tok in self._eos:
                r.finish = "eos"
            elif r.req.stop:
                tail = self.tokenizer.decode(r.ids[-_STOP_WINDOW:], skip_special_tokens=False)
                hit = next((s for s in r.req.stop if s in tail), None)
                if hit is not None:
                    r.finish, r.stop_str = "stop", hit
            if r.finish is None and len(r.ids) >= r.req.max_tokens:
                r.finish = "length"
        return tokens

    def _retire(self, rows: list[_Row], batch: dict[str, Any]) -> tuple[list[_Row], dict]:
        now = time.perf_counter()
        for r in rows:
            if r.finish is not None and not r.fut.done():
                r.fut.set_result(
                    GenerationResult(
                        token_ids=r.ids,
                        logprobs=r.lps,
                        version=r.version,
                        finish_reason=r.finish,
                        stop_str=r.stop_str,
                        timings={"queue_s": r.t_start - r.t_submit, "generate_s": now - r.t_start},
                        token_versions=r.vs,
                    )
                )
        dead = sum(1 for r in rows if not _alive(r))
        # Removing rows copies the whole KV cache: finished rows ride along (a wasted row each step)
        # until they are a third of the batch, or until the next admission copies the cache anyway.
        if dead == len(rows):
            return [], {}
        if 3 * dead >= len(rows):
            return self._compact(rows, batch)
        return rows, batch

    def _compact(self, rows: list[_Row], batch: dict[str, Any]) -> tuple[list[_Row], dict]:
        keep = [i for i, r in enumerate(rows) if _alive(r)]
        if len(keep) == len(rows):
            return rows, batch
        if not keep:
            return [], {}
        idx = torch.tensor(keep, dtype=torch.long, device=batch["mask"].device)
        mask = batch["mask"][idx]
        first = int(mask.any(0).nonzero()[0])  # columns that are padding for every kept row go
        for layer in batch["cache"].layers:
            layer.keys = layer.keys[idx, :, first:, :]
            layer.values = layer.values[idx, :, first:, :]
        return [rows[i] for i in keep], {
            "cache": batch["cache"],
            "mask": mask[:, first:],
            "next": batch["next"][idx],
        }

    @staticmethod
    def _stack(parts: list[dict[str, Any]]) -> dict[str, Any]:
        """One batch from several, rows in order, each left-padded to the longest (one copy)."""
        if len(parts) == 1:
            return parts[0]
        n = max(p["mask"].shape[1] for p in parts)
        cache = parts[0]["cache"]
        for i, layer in enumerate(cache.layers):
            for attr in ("keys", "values"):
                setattr(
                    layer,
                    attr,
                    torch.cat(
                        [
                            F.pad(getattr(p["cache"].layers[i], attr), (0, 0, n - p["mask"].shape[1], 0))
                            for p in parts
                        ]
                    ),
                )
        mask = torch.cat([F.pad(p["mask"], (n - p["mask"].shape[1], 0)) for p in parts])
        return {"cache": cache, "mask": mask, "next": torch.cat([p["next"] for p in parts])}

    @staticmethod
    def _check_cache(cache: Any) -> None:
        from transformers.cache_utils import DynamicLayer

        if cache is None or any(type(layer) is not DynamicLayer for layer in cache.layers):
            raise EngineError(
                "the transformers backend batches only models with a plain full-attention KV cache"
            )
