"""The NCCL weight-transfer routes in-process, on a fake receiving engine: auth, 409 for engines
without the capability, placement, version bump, rejections that keep the old version serving, the
answer gate, and a failure mid-transfer taking the replica out of service.

The engine side of a real transfer (vLLM's NCCL broadcast) needs GPUs; the vLLM engine's own
gate/drain ordering is in tests/integration/test_weight_transfer_vllm.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import TypeAdapter, ValidationError
from rollout_fakes import ScriptedEngine

from llds_rollout.app import create_app
from llds_rollout.config import (
    EngineSettings,
    RolloutSettings,
    TransformersEngineSettings,
    VLLMEngineSettings,
)
from llds_rollout.engine.base import GenerationRequest, GenerationResult, WeightLoadError
from llds_rollout.engine.transfer import (
    WeightTransferError,
    WeightTransferStateError,
    collective_receiver,
)

TOKEN = "transfer-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SPEC = {"model.embed_tokens.weight": [8, 4], "model.norm.weight": [4]}
NCCL_ENGINE = VLLMEngineSettings(weight_transfer="nccl", device="cuda", openai_api=False)
INIT = {"master_address": "10.0.0.1", "master_port": 29600, "rank_offset": 1, "world_size": 3}


def update_body(version: int, **over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "version": version,
        "step": 7,
        "names": list(SPEC),
        "dtype_names": ["bfloat16", "bfloat16"],
        "shapes": list(SPEC.values()),
    }
    body.update(over)
    return body


class FakeReceiver(ScriptedEngine):
    """A scripted engine that also receives over a pretend NCCL group; records every call in order.

    ``hold`` (when set) keeps each generation running until released, to observe the answer gate.
    """

    def __init__(self, tokenizer: Any, workers: int = 2, fail: bool = False) -> None:
        super().__init__(tokenizer, ["<answer> Paris </answer>"] * 8, version=0)
        self.workers = workers
        self.fail = fail
        self.joined = False
        self.calls: list[tuple[Any, ...]] = []
        self.hold: threading.Event | None = None

    @property
    def transfer_enabled(self) -> bool:
        return True

    @property
    def transfer_workers(self) -> int:
        return self.workers

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        self.calls.append(("generate", self._version))
        while self.hold is not None and not self.hold.is_set():
            await _sleep()
        res = await super().generate(request)
        self.calls.append(("generated", res.version))
        return res

    async def init_weight_transfer(self, init_info: Any) -> None:
        self.calls.append(("init", dict(init_info)))
        self.joined = True

    def check_transfer(self, names: Sequence[str], shapes: Sequence[Sequence[int]]) -> None:
        if not self.joined:
            raise WeightTransferStateError("no NCCL group joined yet")
        if dict(zip(names, (list(s) for s in shapes), strict=True)) != SPEC:
            raise WeightLoadError("checkpoint does not match the served model's tensors")

    async def receive_weights(
        self, names: Sequence[str], dtype_names: Sequence[str], shapes: Sequence[Sequence[int]], version: int
    ) -> None:
        self.calls.append(("receive", version, list(names), list(dtype_names)))
        if self.fail:
            raise WeightTransferError("NCCL broadcast aborted; the weights are in an unknown state")
        self._version = version


async def _sleep() -> None:
    import asyncio

    await asyncio.sleep(0.01)


def settings(model: Path, engine: EngineSettings = NCCL_ENGINE, token: str | None = TOKEN) -> RolloutSettings:
    return RolloutSettings(model=str(model), train=False, admin_token=token, engine=engine)


@contextmanager
def serve(s: RolloutSettings, engine: Any) -> Iterator[TestClient]:
    with TestClient(create_app(s, engine)) as client:
        deadline = time.monotonic() + 60
        while client.get("/health").status_code != 200:
            assert time.monotonic() < deadline, client.get("/health").json()
            time.sleep(0.05)
        yield client


@pytest.fixture()
def nccl(tiny_model_dir: Path, tokenizer: Any) -> Iterator[tuple[TestClient, FakeReceiver]]:
    engine = FakeReceiver(tokenizer)
    with serve(settings(tiny_model_dir), engine) as client:
        yield client, engine


def metric(client: TestClient, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not exported")


ROUTES = [
    ("GET", "/admin/weight_transfer", None),
    ("POST", "/admin/weight_transfer/init", INIT),
    ("POST", "/admin/weight_transfer/update", update_body(1)),
]


# ---------------------------------------------------------------------------- auth and capability


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_routes_need_the_bearer_token(nccl: Any, method: str, path: str, body: Any) -> None:
    client, engine = nccl
    assert client.request(method, path, json=body).status_code == 401
    assert (
        client.request(method, path, json=body, headers={"Authorization": "Bearer nope"}).status_code == 401
    )
    assert client.request(method, path, json=body, headers={"Authorization": TOKEN}).status_code == 401
    assert [c for c in engine.calls if c[0] != "generate"] == []


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_routes_take_the_trainers_signature_for_this_replica_only(
    nccl: Any, method: str, path: str, body: Any
) -> None:
    """The trainer signs instead of sending the token (issue 30): a request signed for this replica's
    URL passes once; replayed, signed for another URL, or with another key, it is refused."""
    from llds_proto.admin_auth import SIGNATURE_HEADER, signed

    client, engine = nccl
    me = "http://127.0.0.1:8001"  # the replica's URL (host and port of its settings)

    def send(key: str, url: str) -> tuple[int, dict[str, str], bytes]:
        content, headers = signed(key, method, url + path, body)
        r = client.request(method, path, content=content or None, headers=headers)
        return r.status_code, headers, content

    code, headers, content = send(TOKEN, me)
    assert code != 401 and code != 403, code
    again = client.request(method, path, content=content or None, headers=headers)
    assert again.status_code == 401 and "replayed" in again.json()["detail"], again.text
    for key, url in ((TOKEN, "http://127.0.0.1:9999"), ("not-the-token", me)):
        code, _, _ = send(key, url)
        assert code == 401
    assert SIGNATURE_HEADER == "X-LLDS-Signature"
    calls = [c[0] for c in engine.calls if c[0] != "generate"]
    assert len(calls) <= 1  # the one accepted request, at most (GET reads no engine state)


def test_routes_are_403_without_a_configured_token(tiny_model_dir: Path, tokenizer: Any) -> None:
    with serve(settings(tiny_model_dir, token=None), FakeReceiver(tokenizer)) as client:
        for method, path, body in ROUTES:
            r = client.request(method, path, json=body, headers=AUTH)
            assert r.status_code == 403 and "admin disabled" in r.json()["detail"]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_engine_without_the_capability_answers_409_naming_the_setting(
    tiny_model_dir: Path, tokenizer: Any, method: str, path: str, body: Any
) -> None:
    s = settings(tiny_model_dir, engine=TransformersEngineSettings())
    with serve(s, ScriptedEngine(tokenizer, [])) as client:
        r = client.request(method, path, json=body, headers=AUTH)
    assert r.status_code == 409
    assert "engine.weight_transfer = 'nccl'" in r.json()["detail"]
    assert "engine.type = 'transformers'" in r.json()["detail"]


def test_vllm_engine_started_for_folders_has_no_receiver() -> None:
    from llds_rollout.engine.vllm import VLLMEngine

    folders = VLLMEngineSettings()
    with pytest.raises(WeightTransferStateError, match=r"engine.weight_transfer = 'filesystem'"):
        collective_receiver(VLLMEngine("m", folders), folders)
    nccl = VLLMEngine("m", NCCL_ENGINE)
    assert collective_receiver(nccl, NCCL_ENGINE) is nccl


def test_nccl_settings_need_vllm_on_a_gpu() -> None:
    engine = TypeAdapter(EngineSettings)
    with pytest.raises(
        ValidationError, match=r"transformers\.weight_transfer\n\s+Extra inputs are not permitted"
    ):
        engine.validate_python({"type": "transformers", "weight_transfer": "nccl", "device": "cuda"})
    with pytest.raises(ValidationError, match=r"set engine.device = 'cuda'"):
        VLLMEngineSettings(weight_transfer="nccl")
    assert engine.validate_python({}).weight_transfer == "filesystem"


# ---------------------------------------------------------------------------- init


def test_info_and_init_place_the_replica(nccl: Any) -> None:
    client, engine = nccl
    info = client.get("/admin/weight_transfer", headers=AUTH).json()
    assert (info["backend"], info["workers"], info["version"]) == ("nccl", 2, 0)
    r = client.post("/admin/weight_transfer/init", json=INIT, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["workers"] == 2
    (call,) = [c for c in engine.calls if c[0] == "init"]
    assert call[1] == {
        **INIT,
        "packed": True,
        "packed_buffer_size_bytes": 1 << 30,
        "packed_num_buffers": 2,
    }


def test_init_rejects_a_placement_that_does_not_fit(nccl: Any) -> None:
    client, engine = nccl
    r = client.post("/admin/weight_transfer/init", json={**INIT, "rank_offset": 2}, headers=AUTH)
    assert r.status_code == 400 and "do not fit a group of 3" in r.json()["detail"]
    for bad in (
        {**INIT, "rank_offset": 3},
        {**INIT, "rank_offset": 0},
        {**INIT, "nccl_unique_id_b64": "AA=="},
    ):
        assert client.post("/admin/weight_transfer/init", json=bad, headers=AUTH).status_code == 422
    assert not engine.joined


# ---------------------------------------------------------------------------- update


def test_update_before_init_is_409(nccl: Any) -> None:
    client, engine = nccl
    r = client.post("/admin/weight_transfer/update", json=update_body(1), headers=AUTH)
    assert r.status_code == 409 and "no NCCL group joined" in r.json()["detail"]
    assert engine.version == 0


def test_update_bumps_the_version_and_the_metrics(nccl: Any) -> None:
    client, engine = nccl
    client.post("/admin/weight_transfer/init", json=INIT, headers=AUTH)
    r = client.post("/admin/weight_transfer/update", json=update_body(3), headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["version"] == 3 and engine.version == 3
    (call,) = [c for c in engine.calls if c[0] == "receive"]
    assert call == ("receive", 3, list(SPEC), ["bfloat16", "bfloat16"])
    assert metric(client, "llds_rollout_weights_version") == 3
    assert metric(client, "llds_rollout_weight_swap_seconds_count") == 1
    assert client.get("/health").json()["detail"]["weights_version"] == 3
    answer = client.post("/answer", json={"question": "capital of France?"}).json()
    assert answer["weights_version"] == 3


def test_dry_run_checks_without_receiving(nccl: Any) -> None:
    client, engine = nccl
    client.post("/admin/weight_transfer/init", json=INIT, headers=AUTH)
    r = client.post("/admin/weight_transfer/update", json=update_body(1, dry_run=True), headers=AUTH)
    assert r.status_code == 200 and r.json()["version"] == 0
    bad = update_body(1, dry_run=True, shapes=[[8, 5], [4]])
    assert client.post("/admin/weight_transfer/update", json=bad, headers=AUTH).status_code == 400
    assert not [c for c in engine.calls if c[0] == "receive"] and engine.version == 0


@pytest.mark.parametrize(
    ("over", "status", "detail"),
    [
        ({"version": 2}, 400, "not newer than serving 2"),
        ({"shapes": [[8, 5], [4]]}, 400, "does not match the served model"),
        ({"names": ["model.embed_tokens.weight", "lm_head.weight"]}, 400, "does not match the served model"),
        ({"shapes": [[8, 4]]}, 422, "differ in length"),
        ({"names": ["a", "a"]}, 422, "repeat"),
        ({"dtype_names": ["bfloat16", "complex32"]}, 422, "dtype_names"),
        ({"shapes": [[8, -4], [4]]}, 422, "greater than or equal to 0"),
        ({"names": []}, 422, "at least 1"),
    ],
)
def test_bad_updates_are_refused_and_the_old_version_keeps_serving(
    nccl: Any, over: dict[str, Any], status: int, detail: str
) -> None:
    client, engine = nccl
    client.post("/admin/weight_transfer/init", json=INIT, headers=AUTH)
    assert client.post("/admin/weight_transfer/update", json=update_body(2), headers=AUTH).status_code == 200
    r = client.post("/admin/weight_transfer/update", json={**update_body(3), **over}, headers=AUTH)
    assert r.status_code == status, r.text
    assert detail in r.text
    assert engine.version == 2 and len([c for c in engine.calls if c[0] == "receive"]) == 1
    assert client.post("/answer", json={"question": "capital of France?"}).json()["weights_version"] == 2
    if status == 400:
        assert metric(client, "llds_rollout_weight_updates_rejected_total") == 1


def test_update_waits_for_answers_in_flight(nccl: Any) -> None:
    client, engine = nccl
    client.post("/admin/weight_transfer/init", json=INIT, headers=AUTH)
    engine.hold = threading.Event()
    out: dict[str, Any] = {}
    answering = threading.Thread(
        target=lambda: out.update(answer=client.post("/answer", json={"question": "capital of France?"}))
    )
    answering.start()
    while not engine.calls or engine.calls[-1][0] != "generate":
        time.sleep(0.01)
    updating = threading.Thread(
        target=lambda: out.update(
            update=client.post("/admin/weight_transfer/update", json=update_body(1), headers=AUTH)
        )
    )
    updating.start()
    time.sleep(0.3)
    assert [c[0] for c in engine.calls if c[0] != "init"] == ["generate"]  # the swap waits at the gate
    engine.hold.set()
    answering.join(10)
    updating.join(10)
    assert out["update"].status_code == 200 and out["answer"].status_code == 200
    assert [c[0] for c in engine.calls if c[0] != "init"] == ["generate", "generated", "receive"]
    assert out["answer"].json()["weights_version"] == 0  # the answer ran on one version, the old one
    assert engine.version == 1


def test_a_transfer_failing_mid_way_takes_the_replica_out_of_service(
    tiny_model_dir: Path, tokenizer: Any
) -> None:
    engine = FakeReceiver(tokenizer, fail=True)
    with serve(settings(tiny_model_dir), engine) as client:
        client.post("/admin/weight_transfer/init", json=INIT, headers=AUTH)
        r = client.post("/admin/weight_transfer/update", json=update_body(1), headers=AUTH)
        assert r.status_code == 502 and "unknown state" in r.json()["detail"]
        health = client.get("/health")
        assert health.status_code == 503 and "unknown state" in health.json()["detail"]["error"]
        assert client.post("/answer", json={"question": "capital of France?"}).status_code == 503
