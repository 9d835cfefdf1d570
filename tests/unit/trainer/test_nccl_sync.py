"""The trainer's NCCL weight sync without NCCL: config and start-up errors, the tensors it would send
(the published folder's), the replica client's fan-out against real rollout apps on loopback (fake
receiving engines), and the publish step's wiring.

The broadcast itself needs CUDA; vLLM's side of the handshake (its stock ``trainer_init`` and
``send_weights`` driving this client) is in tests/integration/test_weight_transfer_vllm.py.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fakeredis
import httpx
import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file
from transfer_fakes import Receiver

from llds_proto import streams
from llds_rollout.app import create_app
from llds_rollout.config import RolloutSettings, VLLMEngineSettings
from llds_rollout.engine.base import Engine
from llds_server.http import BackgroundServer, free_port
from llds_trainer.config import TrainerConfig
from llds_trainer.nccl_sync import NCCLSyncError, ReplicaSyncClient, published_state, require_nccl
from llds_trainer.publish import NotifyResult, publish_folder

TOKEN = "sync-token"
NAMES = ["model.embed_tokens.weight", "model.norm.weight"]
SHAPES = [[8, 4], [4]]
SPEC = {n: tuple(s) for n, s in zip(NAMES, SHAPES, strict=True)}
EXPECTED = {"names": NAMES, "dtype_names": ["float32", "float32"], "shapes": SHAPES}
PAYLOAD = {
    "master_address": "10.1.2.3",
    "master_port": 29600,
    "rank_offset": 1,
    "world_size": 4,
    "packed": True,
    "packed_buffer_size_bytes": 1 << 20,
    "packed_num_buffers": 2,
}


# ---------------------------------------------------------------------------- config and start-up


def test_nccl_sync_needs_a_gpu_trainer() -> None:
    assert TrainerConfig().weight_sync == "filesystem"
    with pytest.raises(ValidationError, match="weight_sync = 'nccl' needs the trainer on a GPU"):
        TrainerConfig(weight_sync="nccl", device="cpu")
    cfg = TrainerConfig(
        weight_sync="nccl", device="cuda", nccl_master_address="10.0.0.5", nccl_master_port=29700
    )
    assert (cfg.nccl_master_address, cfg.nccl_master_port) == ("10.0.0.5", 29700)


def test_start_up_check_names_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(NCCLSyncError, match=r"needs a CUDA device.*weight_sync = 'filesystem'"):
        require_nccl()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(NCCLSyncError, match=r"needs vLLM.*weight_sync = 'filesystem'"):
            require_nccl()
    else:
        require_nccl()


# ---------------------------------------------------------------------------- what is sent


def test_sends_exactly_the_published_folders_tensors(
    tiny_model_dir: Path, tokenizer: Any, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    assert model.config.tie_word_embeddings
    folder = publish_folder(model, tokenizer, tmp_path, 1, step=1, keep=1)
    on_disk = load_file(str(folder / "model.safetensors"))
    state = published_state(model)
    assert {k: (v.dtype, v.shape) for k, v in state.items()} == {
        k: (v.dtype, v.shape) for k, v in on_disk.items()
    }
    assert "lm_head.weight" not in state  # tied: sent once, as the embedding
    for name, tensor in state.items():
        assert torch.equal(tensor, on_disk[name]), name
    # live views of the parameters: nothing is copied before the broadcast
    assert state["model.embed_tokens.weight"].data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert list(published_state(model)) == list(state)  # the same order on every pass


# ---------------------------------------------------------------------------- the replica client


class FolderOnly(Receiver):
    """A replica started with engine.weight_transfer = 'filesystem'."""

    @property
    def transfer_enabled(self) -> bool:
        return False


def _replica(stack: ExitStack, model: Path, engine: Engine, nccl: bool = True) -> str:
    es = (
        VLLMEngineSettings(weight_transfer="nccl", device="cuda", openai_api=False)
        if nccl
        else VLLMEngineSettings(openai_api=False)
    )
    port = free_port()  # the replica knows the URL it is reached at: the trainer's requests are signed for it
    settings = RolloutSettings(model=str(model), train=False, admin_token=TOKEN, engine=es, port=port)
    srv = stack.enter_context(BackgroundServer(create_app(settings, engine), port=port))
    deadline = time.monotonic() + 60
    while httpx.get(srv.url + "/health").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return srv.url


@pytest.fixture()
def replicas(tiny_model_dir: Path) -> Iterator[list[tuple[str, Receiver]]]:
    with ExitStack() as stack:
        engines = [Receiver(1, SPEC), Receiver(2, SPEC)]
        yield [(_replica(stack, tiny_model_dir, e), e) for e in engines]


@pytest.mark.integration
def test_each_replica_gets_its_own_ranks_in_one_group(replicas: list[tuple[str, Receiver]]) -> None:
    (url_a, a), (url_b, b) = replicas
    client = ReplicaSyncClient([url_a, url_b + "/"], TOKEN, timeout_s=10)
    assert client.discover() == 4  # trainer + 1 + 2 workers
    assert [(s.url, s.first_rank, s.workers) for s in client.slots] == [(url_a, 0, 1), (url_b, 1, 2)]
    client.init_weight_transfer_engine(dict(PAYLOAD))
    assert a.inits == [{**PAYLOAD, "rank_offset": 1}]
    assert b.inits == [{**PAYLOAD, "rank_offset": 2}]

    client.begin(5, 12, EXPECTED)
    client.start_weight_update()  # every replica checks the round; nothing is received yet
    assert a.checks == b.checks == [NAMES] and a.received == b.received == []
    client.update_weights(dict(EXPECTED))
    client.finish_weight_update()
    assert a.received == b.received == [5] and a.version == b.version == 5
    for url in (url_a, url_b):
        assert httpx.get(url + "/health").json()["detail"]["weights_version"] == 5
    client.close()


@pytest.mark.integration
def test_fan_out_errors_name_the_replica(replicas: list[tuple[str, Receiver]]) -> None:
    (url_a, a), (url_b, b) = replicas
    client = ReplicaSyncClient([url_a, url_b], TOKEN, timeout_s=10)
    with pytest.raises(NCCLSyncError, match="discover"):
        client.replica_payloads(PAYLOAD)
    client.discover()
    with pytest.raises(NCCLSyncError, match="world_size 3, the replicas need 4"):
        client.init_weight_transfer_engine({**PAYLOAD, "world_size": 3})
    with pytest.raises(NCCLSyncError, match="no round begun"):
        client.start_weight_update()
    client.init_weight_transfer_engine(dict(PAYLOAD))
    client.begin(1, 1, {**EXPECTED, "shapes": [[8, 5], [4]]})
    with pytest.raises(NCCLSyncError, match=r"failed on 2 of 2 replicas.*HTTP 400.*does not match"):
        client.start_weight_update()
    assert a.received == b.received == []
    with pytest.raises(NCCLSyncError, match="per-worker update payloads"):
        client.update_weights([dict(EXPECTED)])

    wrong = ReplicaSyncClient([url_a], "wrong-token", timeout_s=10)
    with pytest.raises(NCCLSyncError, match=f"{url_a}: HTTP 401"):
        wrong.discover()
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(NCCLSyncError, match=f"failed on 1 of 2 replicas: {dead}: ConnectError"):
        ReplicaSyncClient([url_a, dead], TOKEN, timeout_s=5).discover()
    with pytest.raises(NCCLSyncError, match="no rollout replica"):
        ReplicaSyncClient([], TOKEN, timeout_s=5)


@pytest.mark.integration
def test_a_replica_started_for_folders_is_refused_at_discovery(tiny_model_dir: Path) -> None:
    with ExitStack() as stack:
        url = _replica(stack, tiny_model_dir, FolderOnly(1, SPEC), nccl=False)
        with pytest.raises(NCCLSyncError, match=r"HTTP 409.*engine.weight_transfer = 'nccl'"):
            ReplicaSyncClient([url], TOKEN, timeout_s=10).discover()


# ---------------------------------------------------------------------------- the publish step


class FakeSync:
    def __init__(self, ok: bool = True) -> None:
        self.ok = ok
        self.calls: list[tuple[list[str], int, int]] = []

    def deliver(self, urls: list[str], version: int, step: int) -> list[NotifyResult]:
        self.calls.append((list(urls), version, step))
        return [NotifyResult(u, self.ok, "x") for u in urls]


@pytest.mark.parametrize("ok", [True, False])
def test_publish_sends_over_nccl_instead_of_writing_a_folder(tmp_path: Path, ok: bool) -> None:
    from llds_trainer.dist import DistContext
    from llds_trainer.service import TrainerService

    cfg = TrainerConfig(
        weight_sync="nccl",
        device="cuda",
        weights_root=str(tmp_path / "weights"),
        run_dir=str(tmp_path / "run"),
        notify_urls=["http://r1:8001"],
        replica_hosts=["r2"],
    )
    service = TrainerService(cfg, admin_token=TOKEN)
    service.redis = fakeredis.FakeRedis()
    service.redis.hset(streams.DEFAULT_KEYS.registry, "rollout-b", "http://r2:8001")
    service.redis.hset(streams.DEFAULT_KEYS.registry, "rollout-c", "http://r3:8001")  # not in replica_hosts
    service.trainer = SimpleNamespace(model=object(), dist=DistContext())  # one process: rank 0 publishes
    service._nccl = sync = FakeSync(ok)
    service._publish(3, 9)
    assert sync.calls == [(["http://r1:8001", "http://r2:8001"], 3, 9)]
    assert not (tmp_path / "weights").exists()
    assert service.redis.get(streams.DEFAULT_KEYS.trainer_version) == b"3"
    assert service.metrics.notify_failures._value.get() == (0 if ok else 2)
    assert service.metrics.replicas_refused._value.get() == 1
