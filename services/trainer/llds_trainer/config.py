"""The trainer's configuration: a tree of pydantic sections, resolved defaults < TOML < env < CLI flags.

A section whose ``type`` key picks an implementation (``[policy_loss]``, ``[regularizer]``,
``[correction]``, ``[lld.alarm]``) is a union of one config class per implementation; the module
that implements them builds its object from the section alone (``llds_trainer.objective``,
``llds_trainer.correction``, ``llds_trainer.lld``).

Importing this module imports no torch, so ``llds trainer run --help`` and config validation are
instant and a bad config fails before a model loads.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import SettingsConfigDict

from llds_proto.streams import DEFAULT_RUN_ID, check_run_id
from llds_server.settings import ConfigModel, ServiceSettings, refuse_moved, typed_union
from llds_trainer.regularizers import RegularizerConfig
from llds_trainer.regularizers.llds import LLDSConfig

ADMIN_TOKEN_ENV = "LLDS_ADMIN_TOKEN"
"""Environment variable holding the bearer token of the rollout's admin routes."""


MOVED = {
    "lr": "optimizer.lr", "weight_decay": "optimizer.weight_decay", "adam_betas": "optimizer.betas",
    "adam_eps": "optimizer.eps", "warmup_steps": "optimizer.warmup_steps", "grad_clip": "optimizer.grad_clip",
    "clip_eps": "policy_loss.clip_eps", "clip_eps_high": "policy_loss.clip_eps_high",
    "dual_clip_c": "policy_loss.dual_clip_c", "gspo_clip_eps": "policy_loss.clip_eps with type gspo",
    "gspo_clip_eps_high": "policy_loss.clip_eps_high with type gspo", "llds_lambda": "regularizer.coef",
    "llds_gate": "regularizer.gate", "llds_normalize": "regularizer.normalize",
    "answer_weight_mode": "regularizer.answer_weight_mode", "answer_weight": "regularizer.answer_weight",
    "is_correction": "correction.tokens, or correction.type none", "is_method": "correction.type",
    "is_cap": "correction.cap", "is_low": "correction.low", "is_high": "correction.high",
    "lld_probe": "lld.probe", "lld_window": "lld.window", "lld_slope_threshold": "lld.slope_threshold",
    "lld_fell_fraction": "lld.fell_fraction", "lld_persist_steps": "lld.persist_steps",
    "lld_spike_factor": "lld.spike_factor", "lld_alarm_action": "lld.alarm.type",
    "lld_alarm_trigger": "lld.alarm.trigger", "lld_alarm_lambda_factor": "lld.alarm.factor",
    "lld_alarm_lambda_max": "lld.alarm.max",
}  # fmt: skip
"""Flat settings of earlier releases -> where they live now (an old TOML fails with this message)."""


class AdamWConfig(ConfigModel):
    """AdamW, with a linear warm-up and a global gradient-norm clip per update."""

    type: Literal["adamw"] = "adamw"
    """The optimizer (AdamW is the one there is)."""
    lr: float = Field(default=1e-6, gt=0)
    """Learning rate after warm-up."""
    weight_decay: float = Field(default=0.01, ge=0)
    """Decoupled weight decay."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam betas."""
    eps: float = Field(default=1e-8, gt=0)
    """Adam epsilon."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear warm-up over this many RL steps: lr * (step + 1) / warmup_steps, then constant."""
    grad_clip: float = Field(default=1.0, gt=0)
    """Global gradient-norm clip per optimizer update."""
    implementation: Literal["auto", "foreach", "fused"] = "auto"
    """torch's AdamW kernel: ``fused`` updates every parameter in one kernel (on a 2-core CPU ~3x faster
    than ``foreach`` for SmolLM2's 135M parameters, same arithmetic); ``auto``: fused for replicated
    parameters, foreach for fsdp's sharded ones."""
    skip_updates: Literal["never", "zero_grad", "no_signal"] = "never"
    """When an update does not move the weights at all. ``never`` (the default, what other frameworks
    do): AdamW steps on every mini-batch, so a step whose gradient is exactly zero (every group of
    plain GRPO uniform) still moves the weights through momentum and weight decay. ``zero_grad``: no
    optimizer step (no momentum, no decay, no step count) when the pre-clip gradient norm is exactly 0.
    ``no_signal``: none either when every trajectory of the mini-batch has advantage 0, even if a KL or
    regularizer term adds a gradient. Skipped updates are counted in ``actor/skipped_updates``."""


class PPOConfig(ConfigModel):
    """PPO's token-level clipped surrogate (GRPO's policy loss), optionally asymmetric and dual-clipped."""

    type: Literal["ppo"] = "ppo"
    """Token-level PPO-clip."""
    clip_eps: float = Field(default=0.2, gt=0, lt=1)
    """Clip range of the ratio (lower, and upper unless ``clip_eps_high``)."""
    clip_eps_high: float | None = Field(default=None, gt=0)
    """Upper clip range; unset = symmetric."""
    dual_clip_c: float | None = Field(default=None, gt=1)
    """Dual clip: bound a negative-advantage token's loss at ``c * |A|`` (3.0 is common); unset = off."""


class GSPOConfig(ConfigModel):
    """GSPO's sequence-level surrogate: one length-normalised ratio per response (arXiv 2507.18071)."""

    type: Literal["gspo"] = "gspo"
    """Sequence-level clipped surrogate."""
    clip_eps: float = Field(default=3e-4, gt=0, lt=1)
    """Clip range of the ratio (lower, and upper unless ``clip_eps_high``)."""
    clip_eps_high: float = Field(default=4e-4, gt=0)
    """Upper clip range."""


PolicyLossConfig = typed_union(PPOConfig, GSPOConfig)


CorrectionTokens = Literal["stale", "all"]


class _CorrectionConfig(ConfigModel):
    """What every correction has: the tokens it applies to (after the subclass's ``type``)."""

    type: str
    """Set by each correction."""
    tokens: CorrectionTokens = "stale"
    """Tokens corrected: those sampled by an older version than pi_old, or every one (also corrects
    engine/trainer numerics)."""


class TruncatedISConfig(_CorrectionConfig):
    """Truncated importance weights (the default): ``tis`` token weights min(r, cap); ``seq_tis`` one
    weight per trajectory min(prod r, cap)."""

    type: Literal["tis", "seq_tis"] = "tis"
    """Token-level (``tis``) or trajectory-level (``seq_tis``) truncated weights."""
    cap: float = Field(default=2.0, ge=1.0)
    """Upper clamp of the weights."""


class MaskedISConfig(_CorrectionConfig):
    """Masking: ``mis`` drops tokens with r outside [low, high] (the rest weighted r); ``seq_mis`` the
    same with a trajectory's prod r; ``geo_reject`` drops trajectories whose geometric-mean r is
    outside [low, high] (weight 1)."""

    type: Literal["mis", "seq_mis", "geo_reject"] = "mis"
    """Token masking (``mis``), trajectory masking (``seq_mis``) or geometric-mean rejection."""
    low: float = Field(default=0.5, gt=0, lt=1)
    """Lower bound of the kept ratios; < 1 (a ratio of 1, on-policy, is always kept)."""
    high: float = Field(default=2.0, gt=1)
    """Upper bound of the kept ratios; > 1 (geo_reject wants a tight one, about 1.001)."""


class NoCorrectionConfig(ConfigModel):
    """No off-policy correction: the sampler's tokens are trained as if pi_old had sampled them."""

    type: Literal["none"] = "none"
    """No correction."""


CorrectionConfig = typed_union(TruncatedISConfig, MaskedISConfig, NoCorrectionConfig)

AlarmTrigger = Literal["warning", "alarm"]


class NoAlarmActionConfig(ConfigModel):
    """The monitor only reports its state."""

    type: Literal["none"] = "none"
    """Monitor only."""


class _ActingAlarmConfig(ConfigModel):
    """What every acting alarm has: the monitor state whose entry acts (after the subclass's ``type``)."""

    type: str
    """Set by each action."""
    trigger: AlarmTrigger = "warning"
    """Monitor state whose entry acts."""


class EnableLLDSConfig(_ActingAlarmConfig):
    """Switch LLDS on when the monitor enters ``trigger`` (runs with ``regularizer.type = "none"``)."""

    type: Literal["enable_llds"] = "enable_llds"
    """Switch the LLDS below on."""
    llds: LLDSConfig = LLDSConfig()
    """The LLDS switched on."""


class RaiseLambdaConfig(_ActingAlarmConfig):
    """Multiply the LLDS weight each time the monitor enters ``trigger`` (runs with
    ``regularizer.type = "llds"``)."""

    type: Literal["raise_lambda"] = "raise_lambda"
    """Raise lambda."""
    factor: float = Field(default=2.0, gt=1)
    """Factor applied to lambda each time."""
    max: float = Field(default=1.0, gt=0)
    """Cap of lambda."""


AlarmActionConfig = typed_union(NoAlarmActionConfig, EnableLLDSConfig, RaiseLambdaConfig)


class LLDMonitorConfig(ConfigModel):
    """The likelihood-displacement monitor (``llds_trainer.lld``): signals, warning and alarm."""

    probe: bool = True
    """After each step's last update, one extra no-grad forward to measure intra-step displacement."""
    window: int = Field(default=10, ge=3)
    """Steps in the slope window."""
    slope_threshold: float = Field(default=0.0, ge=0)
    """Warning needs the correct-response log-likelihood slope (nats/token/step) below minus this."""
    fell_fraction: float = Field(default=0.5, ge=0, le=1)
    """Warning needs the fraction of correct responses whose likelihood fell at or above this."""
    persist_steps: int = Field(default=3, ge=1)
    """Consecutive steps the warning conditions must hold."""
    spike_factor: float = Field(default=3.0, gt=1)
    """Alarm: entropy or gradient norm above this multiple of its window median."""
    alarm: AlarmActionConfig = NoAlarmActionConfig()
    """What entering a monitor state does: nothing (``none``), ``enable_llds`` or ``raise_lambda``."""


class TrainerConfig(ServiceSettings):
    """Everything the trainer service reads; every field documented, env prefix ``LLDS_TRAINER_``."""

    model_config = SettingsConfigDict(
        env_prefix="LLDS_TRAINER_", env_nested_delimiter="__", extra="forbid", validate_default=True
    )

    # ---------------------------------------------------------------- wiring
    run_id: str = DEFAULT_RUN_ID
    """Run this trainer trains: names its Redis keys (``llds:{run_id}:...``); groups of another run are dropped."""
    model: str | None = None
    """Initial policy: a Hugging Face folder (version 0). Required to train."""
    reference_model: str | None = None
    """Frozen reference for the KL term; defaults to ``model``. Loaded only when ``kl_coef`` > 0."""
    reference_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    """Parameter dtype of the reference model; ``auto``: bfloat16 on a GPU (half of a float32 copy: 6 GB
    instead of 12 for a 3B model), float32 on the CPU. Its log-probs and the KL term are float32."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """Redis holding the run's trajectory stream, version and info keys and replica registry."""
    run_dir: str = "runs/trainer"
    """Checkpoints, ``train_log.jsonl`` and the resolved ``trainer_config.toml`` go here."""
    weights_root: str = "runs/weights"
    """Published policy versions go to ``{weights_root}/v{version:06d}/``."""
    host: str = "127.0.0.1"
    """HTTP bind address."""
    port: int = Field(default=8002, ge=0, le=65535)
    """HTTP port (0 = pick a free one)."""
    consumer_name: str = Field(default="trainer-0", min_length=1, max_length=128)
    """Name in the Redis consumer group; keep it stable across restarts to re-read own pending groups."""
    notify_urls: list[str] = Field(default_factory=list)
    """Rollout base URLs notified of each new version, besides those in ``llds:{run_id}:rollout:replicas``."""
    replica_hosts: list[str] = Field(default_factory=lambda: ["127.0.0.1", "::1", "localhost"], min_length=1)
    """Hosts a registered replica URL may name; any other registration is refused (logged, counted,
    never contacted). Each entry is a host name (``*`` globs: ``*.rollout.llds.svc.cluster.local``),
    an address or a network (``10.0.0.0/8``); ``*`` allows any. ``notify_urls`` are allowed as given."""
    replica_ttl_s: float = Field(default=30.0, gt=0)
    """A registered replica whose heartbeat is older than this is pruned from the registry before a
    version goes out (it died without deregistering); keep it well above the replicas' ``heartbeat_s``."""
    notify_timeout_s: float = Field(default=30.0, gt=0)
    """Timeout of one ``POST /admin/weights`` (or of one NCCL weight-transfer call to a replica)."""
    weight_sync: Literal["filesystem", "nccl"] = "filesystem"
    """How rollouts get each version: ``filesystem`` (published folder + ``POST /admin/weights``) or
    ``nccl`` (vLLM's NCCL broadcast from the trainer's GPU; needs CUDA, vLLM, and rollouts started
    with ``engine.weight_transfer = "nccl"``)."""
    nccl_master_address: str = Field(default="127.0.0.1", min_length=1)
    """Trainer host as the rollout replicas reach it: the NCCL group's rendezvous (``weight_sync = nccl``)."""
    nccl_master_port: int = Field(default=29600, ge=1, le=65535)
    """TCP port the trainer opens for that rendezvous."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train; ``auto`` = CUDA when available."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Parameter dtype (bfloat16 only on GPUs; gradients and AdamW state stay in the same dtype, and a
    bfloat16 weight loses most updates of lr 1e-6: prefer float32 with ``autocast``)."""
    autocast: Literal["none", "bfloat16"] = "none"
    """Mixed precision: the forward passes run under ``torch.autocast`` in this dtype while parameters,
    gradients and AdamW state stay in ``dtype`` (float32 master weights). bfloat16 runs on GPUs and on
    CPUs (natively with AVX512-BF16/AMX, emulated and slow elsewhere)."""
    num_threads: int = Field(default=0, ge=0)
    """torch intra-op threads on the CPU (0 = torch's default)."""
    threads_while_sampling: int = Field(default=-1, ge=-1)
    """On the CPU, what the trainer does while a rollout replica of this run samples (its in-flight groups
    in Redis), for a rollout sharing this machine's cores: -1 nothing; 0 waits before each forward until
    no replica samples (at most ``rollout_wait_max_s``), taking turns with the rollout; N > 0 runs N torch
    threads meanwhile (``num_threads`` otherwise). Measured on 2 cores: OpenMP threads of the two
    processes on the same cores ran the trainer's forward 7x slower than alone (BENCHMARKS.md, step)."""
    rollout_wait_max_s: float = Field(default=60.0, gt=0)
    """``threads_while_sampling = 0``: the longest a forward waits for the rollout (then it runs anyway)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass to save memory."""
    logits_chunk_tokens: int = Field(default=1024, ge=0)
    """Scored tokens whose output-head logits exist at once: the head and the float32 log-softmax and
    entropy over the vocabulary run on this many loss tokens at a time (their logits recomputed in the
    backward pass when a micro-batch has more), so that memory is about 24 bytes x this x the vocabulary
    (1024 x Qwen2.5's 151936: 3.7 GB) whatever the micro-batch; 0: the whole micro-batch at once (all
    its kept positions' logits plus float32 copies: 58 GB for 8 trajectories of Search-R1's 4 turns of
    500 generated tokens). The values are the unchunked ones to float32 rounding. See docs/deploy.md."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """Data parallelism over torchrun's ranks: ``ddp`` (every rank a full replica of model, gradients and
    AdamW state; gradients all-reduced) or ``fsdp`` (FSDP2 ``fully_shard``: each rank holds 1/W of them;
    sharded DCP checkpoints, weights gathered to rank 0 to publish). See docs/trainer.md."""

    # ---------------------------------------------------------------- schedule
    steps: int = Field(default=0, ge=0)
    """Train until this RL step (absolute, also after a resume); 0 = forever."""
    groups_per_step: int = Field(default=2, ge=1)
    """Trajectory groups (prompts) consumed per RL step."""
    minibatches_per_step: int = Field(default=2, ge=1)
    """Optimizer updates per RL step (and epoch); LLDS is zero on the first one by construction."""
    epochs_per_step: int = Field(default=1, ge=1)
    """Passes over the step's batch (PPO epochs)."""
    micro_batch_size: int = Field(default=4, ge=1)
    """Trajectories per forward/backward; a mini-batch accumulates gradients over its micro-batches."""
    shuffle: bool = True
    """Shuffle trajectories across mini-batches (seeded by ``seed`` and the step)."""
    old_from_first_update: bool = True
    """Take pi_old of the first mini-batch's trajectories from the first update's own forward (the
    weights are still pi_old's there), so the pi_old pass scores only the other mini-batches: the same
    values (the first update's ratio is exactly 1), one forward fewer per first-mini-batch trajectory.
    One process only (with several ranks every trajectory is scored by the pass)."""
    seed: int = 0
    """Seed of the shuffling and of torch's RNG."""

    # ---------------------------------------------------------------- objective
    optimizer: AdamWConfig = AdamWConfig()
    """The optimizer and its learning-rate schedule."""
    policy_loss: PolicyLossConfig = PPOConfig()
    """The clipped policy-gradient surrogate: ``type = "ppo"`` (token-level PPO-clip, GRPO) or ``"gspo"``."""
    loss_agg: Literal["token_mean", "seq_mean_token_mean"] = "token_mean"
    """Aggregation of the token losses of a micro-batch (Search-R1: token_mean)."""
    overlong_filter: bool = False
    """DAPO's overlong filtering: truncated responses (finish ``length``/``context``) keep their
    place in the group's advantage but are masked out of the loss (counted in ``data/overlong``)."""
    temperature: float = Field(default=1.0, gt=0)
    """Sampling temperature; logits are divided by it so log-probs match the sampler's."""
    kl_coef: float = Field(default=0.0, ge=0)
    """Coefficient of the low-variance KL to the reference model (0 = no reference model loaded)."""
    kl_clamp: float = Field(default=10.0, gt=0)
    """Clamp of the per-token k3 KL estimate."""
    entropy_coef: float = Field(default=0.0, ge=0)
    """Entropy bonus coefficient (subtracted from the loss)."""
    regularizer: RegularizerConfig = LLDSConfig()
    """Likelihood regulariser added to the loss, one module each in ``llds_trainer.regularizers``:
    ``type = "llds"`` (default) or ``"none"`` (plain GRPO)."""
    correction: CorrectionConfig = TruncatedISConfig()
    """Off-policy correction against the sampler's log-probs (``llds_trainer.correction``), with
    ratio r = pi_old / sampler: ``type = "tis"``/``"seq_tis"`` (truncated weights), ``"mis"``/``"seq_mis"``/
    ``"geo_reject"`` (masking) or ``"none"``."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling (arXiv 2503.14476): skip, acknowledge and count (``uniform``) groups whose
    rewards are all equal (zero advantage, no learning signal) and read on until the step is full."""
    dynamic_sampling_max_skips: int = Field(default=256, ge=0)
    """Fail the step (the trainer stops with an error naming the cause) once it has skipped this many
    uniform groups in a row: a policy whose every group scores the same (a collapsed one, all 0) would
    otherwise have the rollout sample for ever. 0 = no limit. (DAPO's max_num_gen_batches.)"""
    staleness_k: int = Field(default=1, ge=0)
    """Drop a group whose oldest token is more than K real updates (lineage distance) behind the trainer."""

    # ---------------------------------------------------------------- queue
    max_entry_failures: int = Field(default=2, ge=1)
    """Set a stream entry aside (the run's dead-letter stream) once it has made this many training
    steps raise: alone when a failed step's groups are each checked by themselves, or with its whole
    step when no single group is to blame. Counted in Redis, so a crash loop ends too."""
    max_failed_steps_in_row: int = Field(default=8, ge=1)
    """Stop with the error once this many training steps in a row have raised: a failure that every
    batch meets is a fault of the trainer, not of the data, and must not eat the stream."""
    claim_idle_ms: int = Field(default=60_000, ge=1)
    """Reclaim another consumer's pending group after it sat unacknowledged this long (XAUTOCLAIM)."""
    read_block_ms: int = Field(default=1000, ge=1)
    """Longest single blocking XREADGROUP wait (the loop re-checks for shutdown in between)."""

    # ---------------------------------------------------------------- outputs
    checkpoint_every: int = Field(default=1, ge=1)
    """Write a checkpoint every N steps (and on the last and on a stop); groups are acknowledged only then.
    Keep every publish a checkpoint (``publish_every`` a multiple of this; every preset does): a crash
    between checkpoints orphans the versions published since, and the groups they sampled are dropped."""
    consumed_window_steps: int = Field(default=64, ge=1)
    """Steps whose group ids the checkpoint keeps for duplicate detection; must be >= checkpoint_every.
    Enough because a trained entry is acknowledged right after the first checkpoint that holds its step,
    so a redelivered entry was trained less than checkpoint_every steps before that checkpoint; the rest
    of the window catches a group the rollout pushed twice (a retried XADD) a few steps apart."""
    keep_checkpoints: int = Field(default=2, ge=1)
    """Checkpoints kept (older ones deleted)."""
    resume: bool = True
    """Resume from the newest checkpoint in ``run_dir`` if one exists."""
    publish_every: int = Field(default=1, ge=1)
    """Publish a new weights version every N steps (independent of ``checkpoint_every``)."""
    keep_versions: int = Field(default=3, ge=1)
    """Published versions kept under ``weights_root`` (older ones garbage-collected)."""
    pin_ttl_s: float = Field(default=600.0, gt=0)
    """A published version a replica pinned (it is reading the folder) less than this long ago is
    not deleted by the clean-up of old versions; an older pin is a replica that died mid-read."""
    keep_versions_every: int = Field(default=0, ge=0)
    """Also keep every published version whose step is a multiple of N (0: none): the checkpoints a
    study evaluates after the run (``llds experiment lld --eval-steps``), 0.5 GB each for SmolLM2."""
    publish_shard_mb: int = Field(default=5000, ge=1)
    """Largest safetensors file of a published version, in MB: bigger policies are written as
    ``model-0000i-of-0000n.safetensors`` shards plus ``model.safetensors.index.json``, as the hub lays
    them out (5000 = transformers' 5 GB; a 3B bfloat16 policy is 2 shards, a float32 one 3)."""

    # ---------------------------------------------------------------- monitoring
    lld: LLDMonitorConfig = LLDMonitorConfig()
    """The likelihood-displacement monitor, its alarm and what the alarm does."""
    trackers: list[Literal["tensorboard", "wandb"]] = Field(default_factory=list)
    """Extra step writers beside train_log.jsonl: TensorBoard (``run_dir/tensorboard``) and/or W&B."""
    wandb_project: str = "llds"
    """W&B project name."""
    wandb_mode: Literal["offline", "online"] = "offline"
    """W&B mode; offline writes ``run_dir/wandb`` for a later ``wandb sync``."""
    history_limit: int = Field(default=2000, ge=1)
    """Step records kept in memory for ``GET /history`` (the full log stays in train_log.jsonl)."""

    @model_validator(mode="before")
    @classmethod
    def _moved(cls, data: Any) -> Any:
        return refuse_moved(data, MOVED, "these trainer settings moved into sections")

    @field_validator("replica_hosts")
    @classmethod
    def _replica_hosts_parse(cls, v: list[str]) -> list[str]:
        import ipaddress

        for p in v:
            if "/" in p:
                try:
                    ipaddress.ip_network(p, strict=False)
                except ValueError as e:
                    raise ValueError(f"replica_hosts entry {p!r} is not a network: {e}") from e
            elif not p.strip():
                raise ValueError("replica_hosts has an empty entry")
        return v

    @field_validator("run_id")
    @classmethod
    def _run_id(cls, v: str) -> str:
        return check_run_id(v)

    @model_validator(mode="after")
    def _check(self) -> TrainerConfig:
        if self.consumed_window_steps < self.checkpoint_every:
            raise ValueError(
                f"consumed_window_steps ({self.consumed_window_steps}) must be >= checkpoint_every "
                f"({self.checkpoint_every}): a redelivered entry can be that many steps old"
            )
        alarm = self.lld.alarm.type
        if alarm == "enable_llds" and self.regularizer.type != "none":
            raise ValueError(
                "lld.alarm.type = 'enable_llds' needs regularizer.type = 'none' (LLDS is already on); "
                "use 'raise_lambda' to strengthen it"
            )
        if alarm == "raise_lambda" and self.regularizer.type != "llds":
            raise ValueError(
                "lld.alarm.type = 'raise_lambda' needs regularizer.type = 'llds' (there is no lambda to "
                "raise); use 'enable_llds' to switch it on"
            )
        if alarm != "none" and not self.lld.probe:
            raise ValueError(
                "an acting LLD alarm needs lld.probe = true (the alarm reads its displacement signal)"
            )
        if self.dtype == "bfloat16" and self.device == "cpu":
            raise ValueError("dtype bfloat16 needs a GPU; use float32 on the CPU")
        if self.reference_dtype == "bfloat16" and self.device == "cpu":
            raise ValueError("reference_dtype bfloat16 needs a GPU; use float32 (or auto) on the CPU")
        if self.weight_sync == "nccl" and self.device == "cpu":
            raise ValueError("weight_sync = 'nccl' needs the trainer on a GPU (NCCL is CUDA-only)")
        if self.weight_sync == "nccl" and self.parallel == "fsdp":
            raise ValueError(
                "weight_sync = 'nccl' sends the live model's full tensors from one GPU, and under "
                "parallel = 'fsdp' each rank holds only a shard: use weight_sync = 'filesystem' (rank 0 "
                "gathers and publishes a folder) or parallel = 'ddp'"
            )
        return self
