"""NCCL weight sync: each new policy version goes from the trainer's GPU to the rollouts' vLLM GPUs.

The GPU path beside the folder publish (``weight_sync = "nccl"``, docs/trainer.md). vLLM's own
``NCCLTrainerWeightTransferEngine`` runs the wire protocol (packed broadcast from rank 0); this module
gives it its two inputs and drives it:

- :class:`ReplicaSyncClient`: vLLM's ``VLLMWeightSyncClient`` over the rollouts' admin routes, fanned
  out to every replica as one inference side. The trainer is rank 0 and each replica's vLLM workers
  get their own ranks after it, in order: world size ``1 + sum(workers)``. vLLM's stock
  ``trainer_init`` places a single inference side at rank offset 1; the client re-bases that
  payload (``worker_init_payload``'s output) per replica.
- :func:`policy_source`: a ``WeightSource`` over the live policy with exactly the tensors a
  published folder holds (:func:`published_state`: tied embeddings once, the checkpoint's names).

:class:`NCCLWeightSync` forms the group with the current replicas and sends versions. vLLM is
imported lazily and only on this path: the trainer's usual environment has none.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx

from llds_proto.admin_auth import signed
from llds_proto.messages import WeightTransferInfo, WeightTransferInit, WeightTransferUpdate
from llds_trainer.publish import NotifyResult

log = logging.getLogger("llds.trainer.nccl_sync")

INFO_PATH = "/admin/weight_transfer"
INIT_PATH = "/admin/weight_transfer/init"
UPDATE_PATH = "/admin/weight_transfer/update"


class NCCLSyncError(RuntimeError):
    """NCCL weight sync cannot run here, or a replica refused or failed a step; the message says which."""


def require_nccl() -> None:
    """Fail at start-up unless this process can send over NCCL: a CUDA device and vLLM importable."""
    import torch

    if not torch.cuda.is_available():
        raise NCCLSyncError(
            "weight_sync = 'nccl' needs a CUDA device in the trainer (NCCL is CUDA-only) and none is "
            "visible; set weight_sync = 'filesystem' to publish folders instead"
        )
    try:
        import vllm.distributed.weight_transfer.nccl_engine  # noqa: F401
    except ImportError as e:
        raise NCCLSyncError(
            "weight_sync = 'nccl' needs vLLM (its GPU build) importable by the trainer: pip install vllm, "
            f"or set weight_sync = 'filesystem' ({e})"
        ) from e


# ---------------------------------------------------------------------------- weights


def published_state(model: Any) -> dict[str, Any]:
    """The tensors ``save_pretrained`` writes for ``model`` (so a published folder's), as live views.

    The same steps as transformers' ``save_pretrained``: ``state_dict``, minus ``_keys_to_ignore_on_save``,
    minus tied aliases (a tied ``lm_head.weight`` is sent once, as the embedding), then the model's
    weight conversions reverted to the checkpoint's layout.
    """
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    state = model.state_dict()
    for key in getattr(model, "_keys_to_ignore_on_save", None) or ():
        state.pop(key, None)
    state = remove_tied_weights_from_state_dict(state, model)
    return dict(revert_weight_conversion(model, state))


def policy_source(model: Any) -> Any:
    """vLLM ``WeightSource`` over the live policy: :func:`published_state`, re-read on every pass."""
    import torch
    from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

    class PolicyWeights(WeightSource):
        def metadata(self) -> list[ParamMeta]:
            return [ParamMeta(n, t.dtype, tuple(t.shape)) for n, t in published_state(model).items()]

        def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in published_state(model).items():
                yield name, tensor.detach().contiguous()

    return PolicyWeights()


def update_info(meta: Sequence[Any]) -> dict[str, Any]:
    """The per-round payload vLLM's NCCL sender builds from ``metadata()`` (names, dtypes, shapes)."""
    from dataclasses import asdict

    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

    return asdict(
        NCCLWeightTransferUpdateInfo(
            names=[m.name for m in meta],
            dtype_names=[str(m.dtype).split(".")[-1] for m in meta],
            shapes=[list(m.shape) for m in meta],
        )
    )


# ---------------------------------------------------------------------------- the replicas


@dataclass(frozen=True)
class ReplicaSlot:
    """One replica's place in the group."""

    url: str
    """Base URL of the replica."""
    workers: int
    """NCCL ranks its vLLM workers take."""
    first_rank: int
    """Rank of its first worker, counted from the first inference rank."""


class ReplicaSyncClient:
    """vLLM's ``VLLMWeightSyncClient`` over several rollout replicas, driven as one inference side.

    ``start_weight_update`` asks every replica to check the round (newer version, tensors that fit,
    group joined) before a byte moves, so a refusal fails the round instead of leaving the broadcast
    waiting for a peer; ``update_weights`` is each replica's whole receive (gate, drain, receive,
    serve), so ``finish_weight_update`` has nothing left to do. Every call goes to all replicas at
    once (they meet inside the same NCCL calls) and raises :class:`NCCLSyncError` naming each failure.
    """

    def __init__(self, urls: Sequence[str], token: str | None, timeout_s: float) -> None:
        if not urls:
            raise NCCLSyncError("no rollout replica to sync weights to")
        self.urls = [u.rstrip("/") for u in urls]
        self.token = token
        self.http = httpx.Client(timeout=timeout_s)
        self.slots: list[ReplicaSlot] = []
        self._round: dict[str, Any] | None = None

    def close(self) -> None:
        self.http.close()

    # -------------------------------------------------------------- placement
    def discover(self) -> int:
        """Ask every replica for its workers and place them; returns the group's world size."""
        slots, first = [], 0
        for url, body in zip(
            self.urls, self._fan_out("GET", INFO_PATH, [None] * len(self.urls)), strict=True
        ):
            info = WeightTransferInfo.model_validate(body)
            slots.append(ReplicaSlot(url, info.workers, first))
            first += info.workers
        self.slots = slots
        return self.world_size

    @property
    def world_size(self) -> int:
        """Trainer rank 0 plus every replica's workers."""
        return 1 + sum(s.workers for s in self.slots)

    def replica_payloads(self, init_info: Mapping[str, Any]) -> list[dict[str, Any]]:
        """vLLM's init payload for one inference side at ``rank_offset``, re-based for each replica."""
        if not self.slots:
            raise NCCLSyncError("replicas not placed yet: call discover() first")
        if init_info.get("world_size") != self.world_size:
            raise NCCLSyncError(
                f"init payload has world_size {init_info.get('world_size')!r}, the replicas need {self.world_size}"
            )
        base = int(init_info["rank_offset"])
        return [{**init_info, "rank_offset": base + s.first_rank} for s in self.slots]

    # -------------------------------------------------------------- one round
    def begin(self, version: int, step: int, expected: Mapping[str, Any]) -> None:
        """Set the version of the next round and the tensors it will carry (vLLM's update payload)."""
        self._round = {"version": version, "step": step, **expected}

    def _update_body(self, info: Mapping[str, Any], dry_run: bool) -> dict[str, Any]:
        if self._round is None:
            raise NCCLSyncError("no round begun: call begin(version, step, expected) first")
        body = {**self._round, **info, "dry_run": dry_run}
        return WeightTransferUpdate.model_validate(body).model_dump(mode="json")

    # -------------------------------------------------------------- VLLMWeightSyncClient
    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        bodies = [
            WeightTransferInit.model_validate(p).model_dump(mode="json")
            for p in self.replica_payloads(init_info)
        ]
        self._fan_out("POST", INIT_PATH, bodies)

    def start_weight_update(self) -> None:
        body = self._update_body({}, dry_run=True)
        self._fan_out("POST", UPDATE_PATH, [body] * len(self.slots))

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        if isinstance(update_info, list):
            raise NCCLSyncError("per-worker update payloads are not supported; send one for all workers")
        body = self._update_body(update_info, dry_run=False)
        self._fan_out("POST", UPDATE_PATH, [body] * len(self.slots))

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        """Nothing to do: a replica answers ``update_weights`` only once it serves the new version."""

    # -------------------------------------------------------------- transport
    def _call(self, method: str, url: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        try:
            content, headers = signed(self.token, method, url + path, body)
            r = self.http.request(method, url + path, content=content, headers=headers)
        except httpx.HTTPError as e:
            raise NCCLSyncError(f"{url}: {type(e).__name__}: {e}") from e
        if r.status_code != 200:
            try:
                detail = r.json().get("detail", r.text)
            except ValueError:
                detail = r.text
            raise NCCLSyncError(f"{url}: HTTP {r.status_code}: {str(detail)[:500]}")
        out: dict[str, Any] = r.json()
        return out

    def _fan_out(
        self, method: str, path: str, bodies: Sequence[dict[str, Any] | None]
    ) -> list[dict[str, Any]]:
        """The same call to every replica at once; waits for all, then raises one error naming each failure."""
        urls = [s.url for s in self.slots] if self.slots else self.urls
        with ThreadPoolExecutor(max_workers=len(urls)) as pool:
            futures = [pool.submit(self._call, method, u, path, b) for u, b in zip(urls, bodies, strict=True)]
        errors = [f.exception() for f in futures]
        failed = [str(e) for e in errors if e is not None]
        if failed:
            raise NCCLSyncError(
                f"{method} {path} failed on {len(failed)} of {len(urls)} replicas: " + "; ".join(failed)
            )
        return [f.result() for f in futures]


# ---------------------------------------------------------------------------- the trainer's end


class NCCLWeightSync:
    """Forms the NCCL group with the rollout replicas and sends them each new version.

    The group is formed on the first version and again whenever the set of replicas changes or a
    round failed (replicas leave an old group when told to join a new one).
    """

    def __init__(
        self, model: Any, *, master_address: str, master_port: int, token: str | None, timeout_s: float
    ):
        self.model = model
        self.master_address = master_address
        self.master_port = master_port
        self.token = token
        self.timeout_s = timeout_s
        self.urls: list[str] = []
        self._client: ReplicaSyncClient | None = None
        self._engine: Any = None
        self._source: Any = None

    def deliver(self, urls: list[str], version: int, step: int) -> list[NotifyResult]:
        """Send ``version`` to every replica in ``urls``; a failure is logged and returned, not raised."""
        if not urls:
            log.warning("version %d: no rollout replica to send it to", version)
            return []
        try:
            if self._engine is None or set(urls) != set(self.urls):
                self._connect(urls)
            self._send(version, step)
        except NCCLSyncError as e:
            self.close()
            log.warning("NCCL weight sync of version %d failed: %s", version, e)
            return [NotifyResult(u, False, str(e)) for u in urls]
        log.info("sent version %d (step %d) over NCCL to %d replicas", version, step, len(urls))
        return [NotifyResult(u, True, "received over NCCL") for u in urls]

    def _connect(self, urls: list[str]) -> None:
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )

        self.close()
        client = ReplicaSyncClient(urls, self.token, self.timeout_s)
        self._client = client
        world_size = client.discover()
        init = NCCLTrainerInitInfo(
            master_address=self.master_address, master_port=self.master_port, world_size=world_size, rank=0
        )
        self._source = policy_source(self.model)
        try:
            self._engine = NCCLTrainerWeightTransferEngine.trainer_init(
                init, client=client, source=self._source
            )
        except NCCLSyncError:
            raise
        except (RuntimeError, OSError) as e:  # the rendezvous (TCPStore) or NCCL's own set-up
            raise NCCLSyncError(f"forming the NCCL group failed: {type(e).__name__}: {e}") from e
        self.urls = list(urls)
        log.info(
            "NCCL weight-transfer group formed: world_size=%d master=%s:%d replicas=%s",
            world_size, self.master_address, self.master_port,
            [(s.url, s.first_rank + 1, s.workers) for s in client.slots],
        )  # fmt: skip

    def _send(self, version: int, step: int) -> None:
        assert self._client is not None and self._engine is not None and self._source is not None
        self._client.begin(version, step, update_info(self._source.metadata()))
        self._engine.send_weights()

    def close(self) -> None:
        """Leave the group (the replicas leave theirs when next told to join one)."""
        if self._engine is not None:
            self._engine.shutdown()
        if self._client is not None:
            self._client.close()
        self._engine = self._client = self._source = None
        self.urls = []
