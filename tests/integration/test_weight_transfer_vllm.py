"""NCCL weight transfer against vLLM's own code, without NCCL (everything but the broadcast).

- our engine settings and wire payloads are accepted by vLLM (``AsyncEngineArgs``,
  ``NCCLWeightTransferInitInfo``, ``NCCLWeightTransferUpdateInfo``), and vLLM's payloads by ours;
- the trainer's ``WeightSource`` declares what it yields (vLLM's ``_checked_iter``);
- vLLM's stock ``trainer_init`` and ``send_weights`` drive two real rollout apps on loopback (fake
  receiving engines) through our client: one rank range per replica, a checked round before the
  broadcast, versions bumped; only the NCCL endpoint and the broadcast are replaced;
- the vLLM engine's receive path, on a stand-in ``AsyncLLM``: same gate and drain as a folder swap,
  vLLM's calls in order, a failure mid-way stops serving; and ``start`` refuses NCCL on a CPU build.

Needs vLLM: run with ``.venv-vllm/bin/python -m pytest tests/integration/test_weight_transfer_vllm.py``
(``make test-vllm``); the main environment skips it. No vLLM engine is started.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import torch
from transfer_fakes import Receiver

from llds_proto.messages import WeightTransferInit, WeightTransferUpdate
from llds_rollout.app import create_app
from llds_rollout.config import RolloutSettings, VLLMEngineSettings
from llds_rollout.engine.base import EngineError, GenerationRequest, GenerationResult, WeightLoadError
from llds_rollout.engine.transfer import WeightTransferError
from llds_server.http import BackgroundServer, free_port

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM is not importable in this environment; `make test-vllm` runs this file in .venv-vllm",
    ),
]

TOKEN = "nccl-token"
NCCL = VLLMEngineSettings(weight_transfer="nccl", device="cuda", openai_api=False)


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))


# ---------------------------------------------------------------------------- config and payloads


def test_engine_args_accept_our_weight_transfer_config(tiny_model_dir: Path) -> None:
    from vllm import AsyncEngineArgs
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    from llds_rollout.engine.vllm import weight_transfer_config

    cfg = weight_transfer_config(NCCL)
    args = AsyncEngineArgs(model=str(tiny_model_dir), weight_transfer_config=cfg)
    assert args.weight_transfer_config is cfg and cfg.backend == "nccl"
    assert cfg.backend in WeightTransferEngineFactory._registry
    assert weight_transfer_config(VLLMEngineSettings()) is None


def test_our_payloads_and_vllms_agree(model: Any) -> None:
    from vllm.distributed.weight_transfer.nccl_engine import (
        NCCLTrainerInitInfo,
        NCCLWeightTransferEngine,
        NCCLWeightTransferInitInfo,
        NCCLWeightTransferUpdateInfo,
        worker_init_payload,
    )

    from llds_trainer.nccl_sync import policy_source, update_info

    # what the rollout forwards to vLLM's workers (``parse_init_info``)
    ours = WeightTransferInit(master_address="10.0.0.1", master_port=29600, rank_offset=2, world_size=4)
    info = NCCLWeightTransferEngine.init_info_cls(**ours.model_dump(exclude={"schema_version"}))
    assert (info.rank_offset, info.world_size, info.packed) == (2, 4, True)
    # what vLLM's trainer side sends, with its wire params defaults, is one of our messages
    trainer = NCCLTrainerInitInfo(master_address="10.0.0.1", master_port=29600, world_size=4, rank=0)
    payload = worker_init_payload(
        NCCLWeightTransferInitInfo(
            master_address=trainer.master_address,
            master_port=trainer.master_port,
            rank_offset=1,
            world_size=trainer.world_size,
            packed=trainer.packed,
            packed_buffer_size_bytes=trainer.packed_buffer_size_bytes,
            packed_num_buffers=trainer.packed_num_buffers,
        )
    )
    assert WeightTransferInit.model_validate(payload).model_dump(exclude={"schema_version"}) == payload
    defaults = WeightTransferInit(master_address="10.0.0.1", master_port=29600, rank_offset=1, world_size=4)
    assert defaults.model_dump(exclude={"schema_version"}) == payload  # our wire defaults are vLLM's
    # the per-round payload, for float32 and bfloat16 policies
    for dtype, name in ((torch.float32, "float32"), (torch.bfloat16, "bfloat16")):
        body = update_info(policy_source(copy.deepcopy(model).to(dtype)).metadata())
        typed = NCCLWeightTransferEngine.update_info_cls(**body)
        assert isinstance(typed, NCCLWeightTransferUpdateInfo) and set(typed.dtype_names) == {name}
        msg = WeightTransferUpdate(version=1, **body)
        assert (
            NCCLWeightTransferUpdateInfo(**msg.model_dump(include={"names", "dtype_names", "shapes"}))
            == typed
        )


def test_weight_source_declares_what_it_yields(model: Any) -> None:
    from vllm.distributed.weight_transfer.base import WeightSource
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerWeightTransferEngine

    from llds_trainer.nccl_sync import policy_source, published_state

    source = policy_source(model)
    assert isinstance(source, WeightSource)
    meta = source.metadata()
    pairs = list(NCCLTrainerWeightTransferEngine._checked_iter(source, meta))
    assert [n for n, _ in pairs] == [m.name for m in meta] == list(published_state(model))
    assert "lm_head.weight" not in dict(pairs)
    assert all(t.is_contiguous() for _, t in pairs)
    assert [n for g in source.groups() for n in g] == sorted(dict(pairs), key=[m.name for m in meta].index)
    assert sum(len(names) for names, _ in source.iter_groups()) == len(meta)


# ---------------------------------------------------------------------------- the trainer's end, driven by vLLM


@pytest.fixture()
def replicas(tiny_model_dir: Path) -> Iterator[list[tuple[str, Receiver]]]:
    from llds_rollout.engine.vllm import checkpoint_spec

    spec = checkpoint_spec(tiny_model_dir)
    with ExitStack() as stack:
        out = []
        for workers in (1, 2):
            engine = Receiver(workers, spec)
            port = free_port()  # the replica's own URL: the trainer's requests are signed for it
            s = RolloutSettings(
                model=str(tiny_model_dir), train=False, admin_token=TOKEN, engine=NCCL, port=port
            )
            srv = stack.enter_context(BackgroundServer(create_app(s, engine), port=port))
            deadline = time.monotonic() + 60
            while httpx.get(srv.url + "/health").status_code != 200:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            out.append((srv.url, engine))
        yield out


def test_vllms_trainer_engine_drives_every_replica(
    replicas: list[tuple[str, Receiver]], model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm.distributed.weight_transfer import nccl_engine

    from llds_trainer.nccl_sync import NCCLWeightSync, published_state

    endpoints: list[Any] = []
    broadcasts: list[list[str]] = []

    def open_endpoint(init_info: Any) -> Any:  # the trainer's rank 0 (a PyNcclCommunicator on GPUs)
        endpoints.append(init_info)
        return SimpleNamespace(destroy=lambda: None)

    def broadcast(self: Any, source: Any, meta: Any) -> None:  # the packed NCCL broadcast
        broadcasts.append([name for name, _ in self._checked_iter(source, meta)])

    monkeypatch.setattr(nccl_engine, "open_trainer_endpoint", open_endpoint)
    monkeypatch.setattr(nccl_engine.NCCLTrainerWeightTransferEngine, "_broadcast", broadcast)
    (url_a, a), (url_b, b) = replicas
    sync = NCCLWeightSync(model, master_address="10.9.8.7", master_port=29611, token=TOKEN, timeout_s=30)

    results = sync.deliver([url_a, url_b], version=1, step=4)
    assert [(r.url, r.ok) for r in results] == [(url_a, True), (url_b, True)], results
    (endpoint,) = endpoints
    assert (endpoint.master_address, endpoint.master_port, endpoint.world_size) == ("10.9.8.7", 29611, 4)
    assert [(i["rank_offset"], i["world_size"], i["master_port"]) for i in a.inits + b.inits] == [
        (1, 4, 29611),
        (2, 4, 29611),
    ]
    assert broadcasts == [list(published_state(model))]
    assert a.received == b.received == [1]

    assert all(r.ok for r in sync.deliver([url_a, url_b], version=2, step=8))
    assert len(endpoints) == 1 and a.received == b.received == [1, 2]  # same group, next round

    assert all(r.ok for r in sync.deliver([url_a], version=3, step=12))  # the replica set changed
    assert a.inits[-1]["world_size"] == 2 and a.inits[-1]["rank_offset"] == 1 and a.received == [1, 2, 3]

    refused = sync.deliver([url_a], version=3, step=12)  # not newer: refused before any broadcast
    assert not refused[0].ok and "not newer than serving 3" in refused[0].detail
    assert len(broadcasts) == 3 and sync.urls == []  # the group is formed again next time


# ---------------------------------------------------------------------------- the rollout's vLLM engine


class StandInLLM:
    """What ``VLLMEngine`` calls on ``AsyncLLM``; generation waits for ``release``; records every call."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.payloads: list[Any] = []
        self.release = threading.Event()
        self.fail_update = False
        self.vllm_config = SimpleNamespace(
            parallel_config=SimpleNamespace(world_size=2, data_parallel_size=1)
        )

    async def generate(self, prompt: Any, params: Any, request_id: str) -> Any:
        self.calls.append("generate")
        while not self.release.is_set():
            await asyncio.sleep(0.01)
        self.calls.append("generated")
        lp = {7: SimpleNamespace(logprob=-0.5)}
        yield SimpleNamespace(
            outputs=[SimpleNamespace(token_ids=[7], logprobs=[lp], finish_reason="length", stop_reason=None)]
        )

    async def init_weight_transfer_engine(self, request: Any) -> None:
        self.calls.append("init_weight_transfer_engine")
        self.payloads.append(request.init_info)

    async def shutdown_weight_transfer_engine(self) -> None:
        self.calls.append("shutdown_weight_transfer_engine")

    async def pause_generation(self, mode: str = "abort", clear_cache: bool = False) -> None:
        self.calls.append("pause_generation")

    async def resume_generation(self) -> None:
        self.calls.append("resume_generation")

    async def start_weight_update(self) -> None:
        self.calls.append("start_weight_update")

    async def update_weights(self, request: Any) -> None:
        self.calls.append("update_weights")
        self.payloads.append(request.update_info)
        if self.fail_update:
            raise RuntimeError("NCCL error: remote process exited")

    async def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.calls.append("finish_weight_update")

    async def reset_prefix_cache(self) -> None:
        self.calls.append("reset_prefix_cache")

    def shutdown(self) -> None:
        pass


@pytest.fixture()
def engine(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, StandInLLM]]:
    from vllm.platforms import current_platform
    from vllm.v1.engine.async_llm import AsyncLLM

    from llds_rollout.engine.vllm import VLLMEngine

    llm = StandInLLM()
    created: list[Any] = []
    monkeypatch.setattr(current_platform, "is_cuda_alike", lambda: True)
    monkeypatch.setattr(AsyncLLM, "from_engine_args", lambda args: created.append(args) or llm)
    eng = VLLMEngine(str(tiny_model_dir), NCCL)
    eng.start()
    (args,) = created
    assert args.weight_transfer_config.backend == "nccl"
    yield eng, llm
    eng.shutdown()


def _names_shapes(tiny_model_dir: Path) -> tuple[list[str], list[list[int]]]:
    from llds_rollout.engine.vllm import checkpoint_spec

    spec = checkpoint_spec(tiny_model_dir)
    return list(spec), [list(s) for s in spec.values()]


def test_receive_runs_between_requests_in_vllms_order(engine: Any, tiny_model_dir: Path) -> None:
    eng, llm = engine
    names, shapes = _names_shapes(tiny_model_dir)
    req = GenerationRequest([1, 2, 3], max_tokens=1)
    assert eng.transfer_workers == 2

    async def main() -> tuple[GenerationResult, GenerationResult]:
        await eng.init_weight_transfer(
            {"master_address": "h", "master_port": 1, "rank_offset": 1, "world_size": 3}
        )
        with pytest.raises(WeightLoadError, match="does not match"):
            eng.check_transfer(names, [[1], *shapes[1:]])
        first = asyncio.ensure_future(eng.generate(req))
        while "generate" not in llm.calls:
            await asyncio.sleep(0.01)
        swap = asyncio.ensure_future(eng.receive_weights(names, ["float32"] * len(names), shapes, 1))
        await asyncio.sleep(0.2)
        second = asyncio.ensure_future(eng.generate(req))  # arrives during the swap: waits at the gate
        await asyncio.sleep(0.2)
        assert llm.calls == ["init_weight_transfer_engine", "generate"]  # the swap waits for the drain
        llm.release.set()
        await swap
        return await first, await second

    first, second = asyncio.run(main())
    assert llm.calls == [
        "init_weight_transfer_engine",
        "generate",
        "generated",
        "pause_generation",
        "start_weight_update",
        "update_weights",
        "finish_weight_update",
        "reset_prefix_cache",
        "resume_generation",
        "generate",
        "generated",
    ]
    assert (first.version, second.version, eng.version) == (0, 1, 1)
    assert llm.payloads[0]["rank_offset"] == 1
    assert llm.payloads[1] == {"names": names, "dtype_names": ["float32"] * len(names), "shapes": shapes}

    asyncio.run(
        eng.init_weight_transfer({"master_address": "h", "master_port": 2, "rank_offset": 1, "world_size": 2})
    )
    assert llm.calls[-2:] == ["shutdown_weight_transfer_engine", "init_weight_transfer_engine"]


def test_a_failed_receive_stops_serving(engine: Any, tiny_model_dir: Path) -> None:
    eng, llm = engine
    names, shapes = _names_shapes(tiny_model_dir)
    llm.release.set()
    llm.fail_update = True

    async def main() -> None:
        await eng.init_weight_transfer(
            {"master_address": "h", "master_port": 1, "rank_offset": 1, "world_size": 3}
        )
        with pytest.raises(WeightTransferError, match="unknown state"):
            await eng.receive_weights(names, ["float32"] * len(names), shapes, 1)
        with pytest.raises(EngineError, match="unknown state"):
            await eng.generate(GenerationRequest([1, 2], max_tokens=1))

    asyncio.run(main())
    assert llm.calls[-2:] == ["update_weights", "resume_generation"] and not eng.ready and eng.version == 0


def test_start_refuses_nccl_on_a_cpu_build(tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.platforms import current_platform
    from vllm.v1.engine.async_llm import AsyncLLM

    from llds_rollout.engine.vllm import VLLMEngine

    def refuse(args: Any) -> Any:
        raise AssertionError("no engine may start")

    monkeypatch.setattr(AsyncLLM, "from_engine_args", refuse)
    monkeypatch.setattr(current_platform, "is_cuda_alike", lambda: False)
    with pytest.raises(EngineError, match=r"engine.weight_transfer = 'nccl' needs vLLM's GPU build"):
        VLLMEngine(str(tiny_model_dir), NCCL).start()
