"""Pydantic models for every message that crosses a service boundary.

Retriever: ``RetrieveRequest`` / ``RetrieveResponse`` (Search-R1 wire format, plus an optional
request id). Rollout: ``AnswerRequest`` / ``AnswerResponse``, ``WeightUpdateNotice`` /
``WeightUpdateResponse``, and the NCCL path's ``WeightTransferInit`` / ``WeightTransferUpdate`` /
``WeightTransferInfo``. Rollout -> trainer (Redis stream): ``TrajectoryGroup`` of token-level
``Trajectory`` records, encoded by :mod:`llds_proto.codec`.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

SCHEMA_VERSION = 1
"""Bump on any incompatible change to a message below."""

MAX_TOPK = 100
"""Largest ``topk`` a retriever accepts (Search-R1 agents use 3)."""

MAX_QUERIES_PER_REQUEST = 512
"""Largest number of queries in one ``/retrieve`` request."""

MAX_QUERY_CHARS = 4096
"""Longest query string accepted; longer text is a client bug, not a query."""

MAX_QUESTION_CHARS = 4096
"""Longest question ``/answer`` accepts."""


class _Message(BaseModel):
    """Base: strict about unknown fields so a typo is a 422, not a silently ignored option."""

    model_config = ConfigDict(extra="forbid")


# --------------------------------------------------------------------------------------------
# Retriever (Search-R1 /retrieve wire format)
# --------------------------------------------------------------------------------------------

NonEmptyQuery = Annotated[str, StringConstraints(min_length=1, max_length=MAX_QUERY_CHARS)]


class RetrieveRequest(_Message):
    """Body of ``POST /retrieve``; Search-R1 clients send exactly ``queries``/``topk``/``return_scores``."""

    queries: list[NonEmptyQuery] = Field(min_length=1, max_length=MAX_QUERIES_PER_REQUEST)
    """One entry per query; each answered with its own ranked list."""
    topk: int = Field(default=3, ge=1, le=MAX_TOPK)
    """Documents per query, best first."""
    return_scores: bool = False
    """True: items are ``{"document", "score"}``; false: items are the document objects."""
    request_id: str | None = Field(default=None, max_length=128)
    """Optional client id echoed in the response and in the server's logs."""
    schema_version: int = SCHEMA_VERSION
    """Wire-contract version the client speaks."""

    @field_validator("queries")
    @classmethod
    def _no_blank_queries(cls, queries: list[str]) -> list[str]:
        for i, q in enumerate(queries):
            if not q.strip():
                raise ValueError(f"queries[{i}] is blank")
        return queries

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, v: int) -> int:
        if v != SCHEMA_VERSION:
            raise ValueError(f"schema_version {v} is not supported (server speaks {SCHEMA_VERSION})")
        return v


class Document(BaseModel):
    """A corpus passage; ``contents`` is ``"Title"\\ntext`` as in the wiki-18 corpus."""

    model_config = ConfigDict(extra="allow")

    id: str
    """Passage id, unique in the corpus."""
    contents: str
    """First line the (quoted) title, the rest the passage text."""


class ScoredDocument(BaseModel):
    """One hit when ``return_scores`` is true."""

    document: Document
    """The passage."""
    score: float
    """Backend score (inner product, BM25 or fused); higher is better."""


class RetrieveResponse(BaseModel):
    """Response of ``POST /retrieve``: one ranked list per query."""

    result: list[list[ScoredDocument]] | list[list[Document]]
    """``result[i]`` answers ``queries[i]``, best first."""
    request_id: str | None = None
    """The request's id (the client's, or one the server assigned)."""
    truncated: list[bool] | None = None
    """Per query: whether the encoder had to cut it to its length limit (dense backends)."""
    schema_version: int = SCHEMA_VERSION
    """Wire-contract version."""


# --------------------------------------------------------------------------------------------
# Rollout: inference API
# --------------------------------------------------------------------------------------------


class AnswerRequest(_Message):
    """Body of ``POST /answer``: run the search agent on one question (greedy)."""

    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS)
    """The question; blank strings are rejected."""
    max_turns: int | None = Field(default=None, ge=1, le=16)
    """Search-enabled turns before the final no-search turn; server default if absent."""
    schema_version: int = SCHEMA_VERSION
    """Wire-contract version the client speaks."""

    @field_validator("question")
    @classmethod
    def _not_blank(cls, q: str) -> str:
        if not q.strip():
            raise ValueError("question is blank")
        return q


class AnswerTurn(BaseModel):
    """One assistant turn of an answered question."""

    text: str
    """What the model generated in this turn (including the closing tag it stopped at)."""
    search_query: str | None = None
    """The query it searched for, if this turn made a valid search call."""
    documents: list[Document] = Field(default_factory=list)
    """Documents the retriever returned for that query."""


class AnswerResponse(BaseModel):
    """Response of ``POST /answer``."""

    answer: str | None
    """Content of the final ``<answer>``; null when the model never answered."""
    turns: list[AnswerTurn]
    """The conversation, turn by turn."""
    weights_version: int
    """Oldest policy version that produced a token of this answer (every token, unless
    ``weights_versions`` names more than one)."""
    weights_versions: list[int] = Field(default_factory=list)
    """Every policy version that produced a token of this answer, ascending: one under the rollout's
    ``answer_consistency = "version"``, possibly more under ``"latest"`` (a swap reached it in flight)."""
    latency_s: float
    """Server-side wall time."""
    request_id: str | None = None
    """Server-assigned id, also in the server's log line."""
    schema_version: int = SCHEMA_VERSION
    """Wire-contract version."""


# --------------------------------------------------------------------------------------------
# Trainer -> rollout: weight updates
# --------------------------------------------------------------------------------------------


class WeightUpdateNotice(_Message):
    """Body of the rollout's ``POST /admin/weights``: load the published folder as ``version``."""

    version: int = Field(ge=1)
    """New policy version; must be greater than the one serving."""
    path: str = Field(min_length=1, max_length=1024)
    """Folder of the published weights, relative to the rollout's weights root."""
    step: int = Field(default=0, ge=0)
    """Trainer step that produced these weights."""
    schema_version: int = SCHEMA_VERSION
    """Wire-contract version."""


class WeightUpdateResponse(BaseModel):
    """Response of a weight update."""

    version: int
    """Version now serving."""
    load_s: float
    """Seconds from request to serving."""
    schema_version: int = SCHEMA_VERSION
    """Wire-contract version."""


class TrainerInfo(BaseModel):
    """What the trainer tells the rollouts through Redis (``RunKeys.trainer_info``), refreshed on start
    and after every step: how fast it consumes groups, so that a replica starts a group only when the
    trainer will train it within ``staleness_k`` versions (admission control)."""

    run_id: str
    """Run this trainer trains."""
    version: int = Field(ge=0)
    """Newest published policy version."""
    step: int = Field(ge=0)
    """Last completed RL step."""
    groups_per_step: int = Field(ge=1)
    """Groups consumed per RL step."""
    publish_every: int = Field(ge=1)
    """Steps between two published versions."""
    staleness_k: int = Field(ge=0)
    """Largest version lag of a group the trainer accepts."""
    trained_unacked: int = Field(default=0, ge=0)
    """Entries trained on but still pending (acknowledged at the next checkpoint): not queued work."""
    schema_version: int = SCHEMA_VERSION
    """Wire-contract version."""

    def capacity(self, lag: int) -> int:
        """Groups that may be queued or in flight (all replicas) with the engine ``lag`` versions behind.

        The group admitted last waits behind all the others: with Q ahead of it, it is trained in the
        s-th next step, s = ``ceil((Q + 1) / groups_per_step)``, after at most ``ceil((s - 1) /
        publish_every)`` more versions; that must not exceed ``staleness_k - lag``, so
        ``Q + 1 <= groups_per_step * ((staleness_k - lag) * publish_every + 1)``.
        """
        budget = self.staleness_k - lag
        if budget < 0:
            return 0
        return self.groups_per_step * (budget * self.publish_every + 1)


# --------------------------------------------------------------------------------------------
# Trainer -> rollout: NCCL weight transfer (vLLM on GPUs; the fields mirror vLLM's NCCL payloads)
# --------------------------------------------------------------------------------------------

MAX_TRANSFER_TENSORS = 100_000
"""Most tensors one NCCL weight update may name."""

TransferDtype = Literal[
    "float32", "float16", "bfloat16", "float64", "float8_e4m3fn", "float8_e5m2",
    "int64", "int32", "int16", "int8", "uint8", "bool",
]  # fmt: skip
"""Wire dtype of a transferred tensor, spelled as ``torch.<name>``."""


class WeightTransferInfo(BaseModel):
    """Response of ``GET /admin/weight_transfer`` and ``POST /admin/weight_transfer/init``."""

    backend: Literal["nccl"]
    """Transport this replica receives weights over (only NCCL replicas answer 200)."""
    workers: int = Field(ge=1)
    """NCCL ranks this replica occupies: its vLLM workers (tensor x pipeline x data parallel)."""
    version: int
    """Version serving now."""
    schema_version: int = SCHEMA_VERSION
    """Wire-contract version."""


class WeightTransferInit(_Message):
    """Body of ``POST /admin/weight_transfer/init``: join the trainer's NCCL group.

    The trainer is rank 0 and opens the rendezvous; this replica's workers take ranks
    ``rank_offset .. rank_offset + workers - 1``. Sent to every replica at once: all ranks meet.
    """

    master_address: str = Field(min_length=1, max_length=255)
    """Host of the trainer's rendezvous (TCPStore), as this replica reaches it."""
    master_port: int = Field(ge=1, le=65535)
    """Port of that rendezvous."""
    rank_offset: int = Field(ge=1)
    """Rank of this replica's first worker in the group."""
    world_size: int = Field(ge=2)
    """Ranks in the group: 1 (trainer) + every replica's workers."""
    packed: bool = True
    """Packed broadcast (tensors batched into buffers); must match the trainer."""
    packed_buffer_size_bytes: int = Field(default=1 << 30, ge=1)
    """Size of one packed buffer; must match the trainer."""
    packed_num_buffers: int = Field(default=2, ge=1)
    """Packed buffers in flight; must match the trainer."""
    schema_version: int = SCHEMA_VERSION
    """Wire-contract version."""

    @model_validator(mode="after")
    def _rank_inside(self) -> WeightTransferInit:
        if self.rank_offset >= self.world_size:
            raise ValueError(f"rank_offset {self.rank_offset} is outside a group of {self.world_size}")
        return self


class WeightTransferUpdate(_Message):
    """Body of ``POST /admin/weight_transfer/update``: receive ``version`` over the joined group.

    ``names``/``dtype_names``/``shapes`` describe the broadcast tensor by tensor, in order (vLLM's
    ``NCCLWeightTransferUpdateInfo``); the names are the published checkpoint's. Answered once the
    new version serves; a rejected update (4xx) leaves the old one serving.
    """

    version: int = Field(ge=1)
    """New policy version; must be greater than the one serving."""
    step: int = Field(default=0, ge=0)
    """Trainer step that produced these weights."""
    names: list[Annotated[str, StringConstraints(min_length=1, max_length=512)]] = Field(
        min_length=1, max_length=MAX_TRANSFER_TENSORS
    )
    """Tensor names, in broadcast order."""
    dtype_names: list[TransferDtype] = Field(max_length=MAX_TRANSFER_TENSORS)
    """Wire dtype of each tensor."""
    shapes: list[list[Annotated[int, Field(ge=0)]]] = Field(max_length=MAX_TRANSFER_TENSORS)
    """Shape of each tensor."""
    dry_run: bool = False
    """Only check (version, names, shapes, group joined) and answer; nothing is received."""
    schema_version: int = SCHEMA_VERSION
    """Wire-contract version."""

    @model_validator(mode="after")
    def _aligned(self) -> WeightTransferUpdate:
        n = len(self.names)
        if len(self.dtype_names) != n or len(self.shapes) != n:
            raise ValueError(
                f"names, dtype_names and shapes differ in length ({n}, {len(self.dtype_names)}, "
                f"{len(self.shapes)})"
            )
        if len(set(self.names)) != n:
            raise ValueError("names repeat a tensor")
        return self


class HealthResponse(BaseModel):
    """Body of every service's ``GET /health``."""

    status: Literal["ok", "starting", "degraded"]
    """``ok`` only when the service can do its job (index or model loaded)."""
    service: str
    """Service name."""
    detail: dict[str, object] = Field(default_factory=dict)
    """Service-specific facts (weights version, index size, step)."""
    schema_version: int = SCHEMA_VERSION
    """Wire-contract version."""


# --------------------------------------------------------------------------------------------
# Rollout -> trainer: token-level trajectories
# --------------------------------------------------------------------------------------------

Span = tuple[int, int]
"""Half-open ``[start, end)`` token range inside a trajectory's response tokens."""


class Trajectory(BaseModel):
    """One sampled multi-turn response, at token level.

    ``response_ids`` holds every token after the prompt in order: the engine's sampled tokens and
    the observation tokens the environment appended. ``loss_mask`` is 1 exactly on sampled tokens.
    ``logprobs`` are the sampler's log-probabilities (0.0 on observation tokens) and
    ``versions`` the policy version that sampled each token (-1 on observation tokens).
    """

    trajectory_id: str
    """Unique id (group id + sample index)."""
    sample_index: int = Field(ge=0)
    """Position inside its group."""
    prompt_ids: list[int]
    """Prompt token ids (chat template applied)."""
    response_ids: list[int]
    """Sampled and observation token ids after the prompt."""
    logprobs: list[float]
    """Sampling log-prob of each response token; 0.0 where ``loss_mask`` is 0."""
    loss_mask: list[int]
    """1 on model-generated tokens, 0 on observation / invalid-action feedback tokens."""
    versions: list[int]
    """Policy version that sampled each response token; -1 on observation tokens."""
    action_spans: list[Span]
    """Maximal runs of loss-mask tokens: one per assistant turn."""
    answer_span: Span | None = None
    """Token range of the final ``<answer>...</answer>`` (tags included), if any."""
    reward: float
    """Scalar outcome reward."""
    exact_match: float = 0.0
    """Exact match of the final answer (reported even when the reward is another function)."""
    num_valid_searches: int = Field(default=0, ge=0)
    """Searches that produced an observation."""
    num_turns: int = Field(default=0, ge=0)
    """Assistant turns."""
    answer: str | None = None
    """Content of the last ``<answer>`` in the response, if any."""
    finish_reason: Literal["answer", "max_turns", "length", "context"] = "answer"
    """Why the conversation stopped."""
    timings: dict[str, float] = Field(default_factory=dict)
    """Wall seconds: ``generate``, ``retrieve``, ``total``."""

    @model_validator(mode="after")
    def _aligned(self) -> Trajectory:
        n = len(self.response_ids)
        for name in ("logprobs", "loss_mask", "versions"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, response_ids has {n}")
        for s, e in self.action_spans + ([self.answer_span] if self.answer_span else []):
            if not 0 <= s < e <= n:
                raise ValueError(f"span ({s}, {e}) outside response of {n} tokens")
        if any(not math.isfinite(x) for x in self.logprobs):
            raise ValueError("logprobs must be finite")
        return self

    @property
    def min_version(self) -> int:
        """Oldest policy version that sampled any token of this trajectory."""
        sampled = [v for v, m in zip(self.versions, self.loss_mask, strict=True) if m]
        return min(sampled) if sampled else -1


class TrajectoryGroup(BaseModel):
    """The G samples of one prompt: the unit the trainer consumes and acknowledges."""

    schema_version: int = SCHEMA_VERSION
    """Wire-contract version."""
    group_id: str
    """Unique across datasets and epochs (``{data_source}:{index}:{epoch}``)."""
    prompt_id: str
    """Dataset row id (``{data_source}:{index}``)."""
    question: str
    """The question as asked."""
    gold_answers: list[str]
    """Accepted answers."""
    trajectories: list[Trajectory] = Field(min_length=1)
    """The samples."""
    created_at: float
    """Unix time the group finished."""
    producer: str = ""
    """Rollout replica that produced it."""
    run_id: str = ""
    """Run the group was sampled for; a trainer rejects groups of another run."""

    @property
    def min_version(self) -> int:
        """Oldest policy version that sampled any token of the group; -1 if none sampled any.

        Trajectories without a sampled token are left out: they must not hide the age of the others.
        """
        sampled = [t.min_version for t in self.trajectories if t.min_version >= 0]
        return min(sampled) if sampled else -1

    @property
    def max_version(self) -> int:
        """Newest policy version that sampled any token of the group; -1 if none sampled any."""
        return max(
            (v for t in self.trajectories for v, m in zip(t.versions, t.loss_mask, strict=True) if m),
            default=-1,
        )
