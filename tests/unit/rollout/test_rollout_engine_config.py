"""The ``[engine]`` section: a union picked by ``type`` (vLLM's knobs on the vLLM variant alone), and a
preset that serves either backend."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import TypeAdapter, ValidationError

from llds_rollout import cli
from llds_rollout.config import EngineSettings, TransformersEngineSettings, VLLMEngineSettings

ROOT = Path(__file__).resolve().parents[3]


def _settings(*argv: str) -> object:
    return cli.load_settings(cli.serve_parser().parse_args(["--no-train", "--model", "m", *argv]))


def test_the_type_picks_the_variant_and_vllm_is_the_default() -> None:
    engine = TypeAdapter(EngineSettings)
    assert isinstance(engine.validate_python({}), VLLMEngineSettings)
    assert isinstance(engine.validate_python("transformers"), TransformersEngineSettings)
    with pytest.raises(ValidationError, match=r"vllm\.torch_threads\n\s+Extra inputs are not permitted"):
        engine.validate_python({"torch_threads": 2})


def test_vllms_context_follows_the_trajectory_cap_unless_set() -> None:
    assert _settings("--max-context-tokens", "1536").engine.max_model_len == 1536
    assert (
        _settings("--max-context-tokens", "1536", "--engine.max-model-len", "4096").engine.max_model_len
        == 4096
    )
    assert VLLMEngineSettings().max_model_len is None  # built alone: the model's own limit


@pytest.mark.parametrize("preset", ["rollout_tiny.toml", "rollout_cpu.toml"])
@pytest.mark.parametrize("engine", ["vllm", "transformers"])
def test_the_cpu_presets_serve_either_backend(preset: str, engine: str) -> None:
    s = _settings("--config", str(ROOT / "configs" / preset), "--engine", engine)
    assert s.engine.type == engine  # type: ignore[attr-defined]


def test_the_vllm_fields_of_earlier_releases_are_refused_with_their_new_names() -> None:
    with pytest.raises(ValidationError, match=r"vllm_max_model_len \(now max_model_len\)"):
        TypeAdapter(EngineSettings).validate_python({"vllm_max_model_len": 1024})


def test_a_flag_that_retypes_the_engine_keeps_the_presets_shared_knobs_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    preset = tmp_path / "p.toml"
    preset.write_text("[engine]\nmax_batch_size = 8\nmax_model_len = 1024\ngpu_memory_utilization = 0.9\n")
    e = _settings("--config", str(preset), "--engine", "transformers").engine  # type: ignore[attr-defined]
    assert (e.type, e.max_batch_size) == ("transformers", 8)  # vLLM's two knobs dropped, the shared one kept
    monkeypatch.setenv("LLDS_ROLLOUT_ENGINE", '{"type": "transformers", "torch_threads": 1}')
    e = _settings("--config", str(preset)).engine  # type: ignore[attr-defined]
    assert (e.type, e.max_batch_size, e.torch_threads) == ("transformers", 8, 1)  # env over TOML, likewise
    e = _settings("--config", str(preset), "--engine", "vllm").engine  # type: ignore[attr-defined]
    assert (e.type, e.max_batch_size, e.max_model_len) == ("vllm", 8, 1024)  # the env's type replaced in turn
