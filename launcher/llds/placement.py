"""Which GPUs each child of ``llds up`` runs on (docs/gpu-placement.md).

A child whose resolved config puts it on a GPU (the rollout's ``engine.device = "cuda"``, the
trainer's ``device = "cuda"``) gets ``CUDA_VISIBLE_DEVICES`` naming its own GPUs: one rollout
replica per rollout GPU, one trainer rank (torchrun) per trainer GPU. Nothing else sees a GPU: the
retriever and the dashboard get none. A config on the CPU changes nothing (no variable is set).

GPU ids are indices into the GPUs ``llds up`` sees: the entries of its own ``CUDA_VISIBLE_DEVICES``
when set, else every GPU ``nvidia-smi -L`` lists (``--gpus N`` overrides the count).

Defaults, from the number of GPUs ``n`` (both children on GPUs):

- ``n == 1``: both on GPU 0, the one-GPU mode: vLLM takes a small share of the memory, the trainer
  a small micro-batch with gradient checkpointing, its weights in float32 when they fit beside vLLM
  and in bfloat16 otherwise (:func:`one_gpu_precision`, which refuses a policy that fits neither way).
- ``n >= 2``: the first ``max(1, n // 4)`` GPUs are rollout replicas, the rest trainer ranks
  (2 -> 1 + 1, 4 -> 1 + 3, 8 -> 2 + 6).

A side given alone (``--trainer-gpus 2,3``) leaves the other side the GPUs it does not name. Two
sides sharing a GPU are refused, except both naming the same single GPU (the one-GPU mode).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from llds_proto.digest import tensor_shapes
from llds_server.settings import ConfigError

ROLLOUT_FRACTION = 4
"""Of every 4 GPUs one goes to the rollout (at least one): a trainer step spends several forward
passes per sampled token (pi_old, the reference, the update's forward and backward, a recompute under
gradient checkpointing) where the rollout spends one decoding pass."""
ONE_GPU_MICRO_BATCH = 2
"""Largest trainer micro-batch in the one-GPU mode (a smaller configured one is kept)."""
ONE_GPU_RESERVE = 0.10
"""Share of a shared GPU's memory left for activations, the CUDA contexts and allocator slack."""
BF16_BYTES = 2
TRAINER_STATE_COPIES = 4
"""Tensors of the policy's size a trainer holds: the weights, their gradients and AdamW's two moments."""


class PlacementError(ConfigError):
    """A GPU placement that cannot work; the message names the flags and GPUs."""


def parse_ids(value: object) -> list[int] | None:
    """``--rollout-gpus``'s value as GPU ids: ``"0,1"``, ``[0, 1]`` or (repeated flags) ``[[0, 1], [2]]``."""
    if value is None:
        return None
    if isinstance(value, str):
        parts: list[object] = [p.strip() for p in value.split(",")]
    elif isinstance(value, list | tuple):
        parts = []
        for v in value:
            nested = parse_ids(v)
            parts.extend(nested or [])
    else:
        parts = [value]
    out = []
    for p in parts:
        try:
            if isinstance(p, bool) or not isinstance(p, int | str):
                raise ValueError
            out.append(int(p))  # a negative id is refused by place(), naming the GPUs there are
        except ValueError:
            raise ValueError(f"GPU id {p!r} is not an integer (give ids like 0,1)") from None
    if len(set(out)) != len(out):
        raise ValueError(f"GPU ids {out} name a GPU twice")
    return out


def gpu_ids_arg(text: str) -> list[int]:
    """argparse ``type`` of the GPU-id flags: ``0,1`` in one flag."""
    import argparse

    try:
        return parse_ids(text) or []
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _nvidia_smi(*args: str) -> list[str] | None:
    """Lines of ``nvidia-smi ARGS``; None when there is no nvidia-smi or it fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        res = subprocess.run([exe, *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if res.returncode != 0:
        return None
    return [line.strip() for line in res.stdout.splitlines() if line.strip()]


def visible_gpus(count: int | None = None, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    """The ``CUDA_VISIBLE_DEVICES`` entries ``llds up`` may hand out, GPU id i being entry i: its own
    ``CUDA_VISIBLE_DEVICES`` when set, else one per GPU ``nvidia-smi -L`` lists; ``count`` (``--gpus``)
    takes that many (the first of the variable's entries, or ids ``0..count-1``)."""
    env = os.environ if environ is None else environ
    given = env.get("CUDA_VISIBLE_DEVICES")
    entries: tuple[str, ...] | None = None
    if given is not None:
        entries = ()
        for e in given.split(","):
            e = e.strip()
            if not e or e == "-1":
                break  # CUDA reads the list up to the first invalid entry
            entries += (e,)
    if count is None:
        if entries is not None:
            return entries
        lines = _nvidia_smi("-L") or []
        return tuple(str(i) for i in range(sum(1 for line in lines if line.startswith("GPU "))))
    if entries is not None:
        if len(entries) < count:
            raise PlacementError(
                f"--gpus {count}, but CUDA_VISIBLE_DEVICES={given!r} names {len(entries)} GPU(s)"
            )
        return entries[:count]
    return tuple(str(i) for i in range(count))


def gpu_memory_bytes(device: str) -> int | None:
    """Total memory of GPU ``device`` (an index or UUID as ``nvidia-smi -i`` takes it); None unknown."""
    lines = _nvidia_smi("-i", device, "--query-gpu=memory.total", "--format=csv,noheader,nounits")
    try:
        return int(float(lines[0]) * 2**20) if lines else None
    except ValueError:
        return None


@dataclass(frozen=True)
class Placement:
    """GPU ids (indices into ``visible``) of each child; an empty side runs without a GPU."""

    visible: tuple[str, ...]
    """``CUDA_VISIBLE_DEVICES`` entries by id."""
    rollout: tuple[int, ...] = ()
    """One rollout replica per id; empty: one replica, on the CPU (no variable set)."""
    trainer: tuple[int, ...] = ()
    """One trainer rank per id; empty: one process, on the CPU (no variable set)."""

    @property
    def active(self) -> bool:
        """Some child runs on a GPU: then every child gets a ``CUDA_VISIBLE_DEVICES``."""
        return bool(self.rollout or self.trainer)

    @property
    def shared(self) -> bool:
        """The one-GPU mode: rollout and trainer on the same single GPU."""
        return bool(self.rollout) and self.rollout == self.trainer

    @property
    def replicas(self) -> int:
        return max(1, len(self.rollout))

    @property
    def ranks(self) -> int:
        return max(1, len(self.trainer))

    def devices(self, ids: tuple[int, ...]) -> str:
        return ",".join(self.visible[i] for i in ids)

    def env(self, child: str, replica: int = 0) -> dict[str, str]:
        """The ``CUDA_VISIBLE_DEVICES`` of ``child`` (``rollout`` replica ``replica``, ``trainer``, or
        any other child: none), or nothing when no child is on a GPU."""
        if not self.active:
            return {}
        if child == "rollout" and self.rollout:
            return {"CUDA_VISIBLE_DEVICES": self.devices((self.rollout[replica],))}
        if child == "trainer" and self.trainer:
            return {"CUDA_VISIBLE_DEVICES": self.devices(self.trainer)}
        return {"CUDA_VISIBLE_DEVICES": ""}

    def describe(self) -> str:
        """One console line."""

        def side(ids: tuple[int, ...], unit: str) -> str:
            if not ids:
                return "CPU"
            return f"GPU {self.devices(ids)} ({len(ids)} {unit}{'s' if len(ids) > 1 else ''})"

        mode = " — one GPU shared (the one-GPU mode)" if self.shared else ""
        return f"rollout on {side(self.rollout, 'replica')}, trainer on {side(self.trainer, 'rank')}{mode}"


def place(
    visible: tuple[str, ...],
    *,
    rollout_on_gpu: bool,
    trainer_on_gpu: bool,
    rollout_ids: list[int] | None = None,
    trainer_ids: list[int] | None = None,
) -> Placement:
    """The placement of the children (see the module docstring); ``trainer_on_gpu`` false also for
    no trainer (``--no-train``). Raises :class:`PlacementError` naming the problem."""
    n = len(visible)
    for flag, ids, on_gpu, what in (
        ("--rollout-gpus", rollout_ids, rollout_on_gpu, "the rollout's config puts its engine on the CPU"),
        ("--trainer-gpus", trainer_ids, trainer_on_gpu, "the trainer runs on the CPU (or not at all)"),
    ):
        if ids is None:
            continue
        if not on_gpu:
            raise PlacementError(f"{flag} {_ids(ids)} given, but {what}: drop {flag}, or use a GPU config")
        if not ids:
            raise PlacementError(f"{flag} names no GPU")
        bad = [i for i in ids if not 0 <= i < n]
        if bad:
            raise PlacementError(
                f"{flag} {_ids(ids)}: GPU {_ids(bad)} does not exist; {_seen(visible)} (ids 0..{n - 1})"
                if n
                else f"{flag} {_ids(ids)}: no GPU is visible ({_seen(visible)})"
            )
    if not (rollout_on_gpu or trainer_on_gpu):
        return Placement(visible)
    if n == 0:
        who = " and ".join(w for w, on in (("rollout", rollout_on_gpu), ("trainer", trainer_on_gpu)) if on)
        raise PlacementError(
            f"the {who} config runs on a GPU (device cuda), but no GPU is visible ({_seen(visible)}): "
            "use a CPU preset (--preset cpu or tiny), or --gpus N if the count is wrong"
        )
    rollout, trainer = _defaults(n, rollout_on_gpu, trainer_on_gpu, rollout_ids, trainer_ids)
    common = set(rollout) & set(trainer)
    if common and not (len(rollout) == len(trainer) == 1):
        raise PlacementError(
            f"--rollout-gpus {_ids(rollout)} and --trainer-gpus {_ids(trainer)} share GPU {_ids(sorted(common))}: "
            "each child needs GPUs of its own; only one single GPU may be shared by both (the one-GPU "
            "mode: --rollout-gpus 0 --trainer-gpus 0)"
        )
    if rollout_on_gpu and not rollout:
        raise PlacementError(f"no GPU is left for the rollout: --trainer-gpus {_ids(trainer)} takes all {n}")
    if trainer_on_gpu and not trainer:
        raise PlacementError(f"no GPU is left for the trainer: --rollout-gpus {_ids(rollout)} takes all {n}")
    return Placement(visible, tuple(rollout), tuple(trainer))


def _defaults(
    n: int,
    rollout_on_gpu: bool,
    trainer_on_gpu: bool,
    rollout_ids: list[int] | None,
    trainer_ids: list[int] | None,
) -> tuple[list[int], list[int]]:
    every = list(range(n))
    if not trainer_on_gpu:
        return (rollout_ids if rollout_ids is not None else [0]), []
    if not rollout_on_gpu:
        return [], (trainer_ids if trainer_ids is not None else every)
    if rollout_ids is None and trainer_ids is None:
        if n == 1:
            return [0], [0]
        r = max(1, n // ROLLOUT_FRACTION)
        return every[:r], every[r:]
    if rollout_ids is None:
        assert trainer_ids is not None
        rest = [i for i in every if i not in trainer_ids]
        return (rest if rest or len(trainer_ids) != 1 else list(trainer_ids)), trainer_ids
    if trainer_ids is None:
        rest = [i for i in every if i not in rollout_ids]
        return rollout_ids, (rest if rest or len(rollout_ids) != 1 else list(rollout_ids))
    return rollout_ids, trainer_ids


def _ids(ids: list[int] | tuple[int, ...]) -> str:
    return ",".join(map(str, ids))


def _seen(visible: tuple[str, ...]) -> str:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f"CUDA_VISIBLE_DEVICES={env!r}" if env is not None else "nvidia-smi -L"
    return f"{len(visible)} GPU(s) seen through {where}"


# ---------------------------------------------------------------------------- the one-GPU mode


def one_gpu_settings(
    rollout_share: float, gpu_memory_utilization: float | None, micro_batch_size: int, bf16: bool
) -> tuple[dict[str, object], dict[str, object]]:
    """(rollout, trainer) settings the one-GPU mode puts on top of the children's configs: vLLM
    limited to ``rollout_share`` of the GPU (or less, as configured), a trainer micro-batch of at most
    :data:`ONE_GPU_MICRO_BATCH` with activations recomputed (gradient checkpointing), and with
    ``bf16`` the trainer's weights, gradients, AdamW state and reference model in bfloat16."""
    rollout: dict[str, object] = {}
    if gpu_memory_utilization is not None:
        rollout["engine"] = {"gpu_memory_utilization": min(gpu_memory_utilization, rollout_share)}
    trainer: dict[str, object] = {
        "micro_batch_size": min(micro_batch_size, ONE_GPU_MICRO_BATCH),
        "gradient_checkpointing": True,
    }
    if bf16:
        trainer.update(dtype="bfloat16", autocast="none")
    return rollout, trainer


def parameter_count(model_dir: Path) -> int | None:
    """Parameters in a model folder's safetensors files (their headers only); None when it has none."""
    files = sorted(model_dir.glob("*.safetensors")) if model_dir.is_dir() else []
    if not files:
        return None
    return sum(math.prod(shape) for f in files for shape in tensor_shapes(f).values())


@dataclass(frozen=True)
class OneGpuFit:
    """The one-GPU mode's arithmetic, in bytes: the trainer's weights, gradients and AdamW moments at
    ``weight_bytes`` a parameter (+ the reference model, bfloat16 on a GPU: the trainer's
    ``reference_dtype = "auto"``) in what vLLM and the reserve leave, and vLLM's bfloat16 weights in
    its share."""

    params: int
    gpu: int
    rollout_share: float
    reference: bool
    weight_bytes: int = BF16_BYTES
    """4: float32 master weights; 2: bfloat16."""

    @property
    def trainer_need(self) -> int:
        return self.params * (self.weight_bytes * TRAINER_STATE_COPIES + BF16_BYTES * int(self.reference))

    @property
    def trainer_budget(self) -> int:
        return int(self.gpu * (1.0 - self.rollout_share - ONE_GPU_RESERVE))

    @property
    def rollout_weights(self) -> int:
        return self.params * BF16_BYTES

    @property
    def rollout_budget(self) -> int:
        return int(self.gpu * self.rollout_share)

    def problem(self) -> str | None:
        gb = 1e9
        dtype = "float32" if self.weight_bytes == 4 else "bfloat16"
        if self.trainer_need > self.trainer_budget:
            return (
                f"the trainer needs {self.trainer_need / gb:.1f} GB ({self.params / 1e9:.2f}B parameters x "
                f"{self.weight_bytes} bytes x {TRAINER_STATE_COPIES}: {dtype} weights, gradients, AdamW moments"
                f"{f', + {BF16_BYTES} bytes each for the bfloat16 reference model' if self.reference else ''}) and has {self.trainer_budget / gb:.1f} GB "
                f"of the GPU's {self.gpu / gb:.1f} GB (vLLM takes {self.rollout_share:.0%}, "
                f"{ONE_GPU_RESERVE:.0%} is kept for activations)"
            )
        if self.rollout_weights >= self.rollout_budget:
            return (
                f"vLLM's {self.rollout_share:.0%} of the GPU ({self.rollout_budget / gb:.1f} GB) does not "
                f"hold the policy's bfloat16 weights ({self.rollout_weights / gb:.1f} GB) and a KV cache"
            )
        return None


def one_gpu_precision(params: int, gpu: int, rollout_share: float, reference: bool, float32: bool) -> bool:
    """Whether the one-GPU mode must store the trainer's weights in bfloat16: float32 master weights
    (``float32``: what the config asks) are kept when the arithmetic fits them, else bfloat16 when it
    fits those; neither fitting raises :class:`PlacementError` saying what to do instead."""
    fit = OneGpuFit(params=params, gpu=gpu, rollout_share=rollout_share, reference=reference)
    if float32 and OneGpuFit(params, gpu, rollout_share, reference, weight_bytes=4).problem() is None:
        return False
    why = fit.problem()
    if why is not None:
        raise PlacementError(
            f"one GPU cannot hold both the rollout and the trainer of this policy: {why}. Use two GPUs "
            "(--gpus 2, or --rollout-gpus 0 --trainer-gpus 1), a smaller policy, or another --one-gpu-rollout-share"
        )
    return True
