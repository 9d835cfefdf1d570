"""Methods mixed into vLLM's workers (``worker_extension_cls``), called by name via ``collective_rpc``.

Imported inside vLLM's worker processes only; nothing here runs in the service process.
"""

from __future__ import annotations

from typing import Any


class WorkerExtension:
    """Weight reload that keeps tied embeddings tied."""

    def llds_reload_weights(self, weights_path: str) -> bool:
        """``reload_weights`` from a folder, then refresh a tied ``lm_head``.

        The in-place reload skips ``lm_head`` when it is tied to the input embedding (it is not in
        the checkpoint), so on CPUs its pre-packed oneDNN GEMM handle, built from the weight at
        start-up, keeps the old output weights: a model with ``tie_word_embeddings`` (SmolLM2,
        Qwen2.5-0.5B/1.5B/3B) would sample from stale logits. Re-running the layer's
        post-load processing rebuilds it from the reloaded tensor. Returns whether it did.
        """
        self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        runner: Any = self.model_runner  # type: ignore[attr-defined]
        model = runner.get_model()
        config = runner.model_config.hf_text_config
        lm_head = getattr(model, "lm_head", None)
        embed = getattr(getattr(model, "model", None), "embed_tokens", None)
        if not getattr(config, "tie_word_embeddings", False) or lm_head is None or embed is None:
            return False
        if lm_head.weight is not embed.weight:
            lm_head.weight = embed.weight
        method = getattr(lm_head, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(lm_head)
        return True
