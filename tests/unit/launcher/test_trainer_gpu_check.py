"""``llds bench trainer --shape ... --random-weights``, the trainer benchmark on a published shape with
random weights (what a GPU runs without a download): the same command on the CPU with the tiny shape
(so it cannot rot), the published shapes, and the FLOP count. The whole GPU check
(``scripts/gpu-check.sh``) is tests/unit/launcher/test_gpu_check.py's."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llds_bench.shapes import SHAPES, peak_bf16_tflops, search_r1_layout, train_flops

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "gpu-check.sh"
FIGURES = ("trainer tokens/s", "MFU (update)", "peak memory", "Step-time ratio LLDS / GRPO", "Checkpoint")


def _bench(argv: list[str]) -> int:
    from llds.cli import main

    return main(["bench", "trainer", *argv])


def test_the_gpu_check_command_on_the_cpu_reports_every_figure(tmp_path: Path) -> None:
    out, work = tmp_path / "report.md", tmp_path / "work"
    argv = [
        "--device", "cpu", "--shape", "tiny", "--random-weights", "--seq-len", "128", "--groups", "1",
        "--group-size", "4", "--repeats", "1", "--peak-tflops", "1", "--work-dir", str(work),
        "--out", str(out), "--budget-s", "600",
    ]  # fmt: skip
    assert _bench(argv) == 0

    text = out.read_text()
    assert all(f in text for f in FIGURES), text
    assert "not GPU figures" in text
    r = json.loads(out.with_suffix(".json").read_text())
    assert r["layout"] == {"prompt": 16, "search_turns": 3, "turn": 16, "observation": 16, "answer": 16}
    assert (r["trajectories"], r["tokens_per_step"], r["loss_tokens_per_step"]) == (4, 4 * 128, 4 * 64)
    assert r["model_info"]["params"] == 344_768 and r["model_info"]["tied_embeddings"]
    assert (r["dtype"], r["gradient_checkpointing"]) == ("float32", False)
    for v in r["variants"].values():
        assert v["train_tokens_per_s"] > 0 and v["step_tokens_per_s"] > 0
        assert 0 < v["update_s"] < v["step_s"]
        assert 0 < v["mfu_update"] < 1 and 0 < v["mfu_step"] < 1
        assert v["peak_memory_bytes"] > 2**20
    # One step each on a shared CPU: only a sane ratio, not the target's.
    assert math.isfinite(r["llds_grpo_step_ratio"]) and r["llds_grpo_step_ratio"] > 0
    ck = r["checkpoint"]
    files = {f.name: f.stat().st_size for f in Path(ck["path"]).iterdir()}
    assert files == ck["files"] and ck["bytes"] == sum(files.values()) > 0
    assert files["model.safetensors"] > 4 * 300_000 and files["optimizer.pt"] > files["model.safetensors"]
    assert ck["write_s"] > 0
    assert (work / "policy" / "config.json").is_file()
    assert 0 < r["wall_s"] < 600


def test_without_a_peak_the_cpu_reports_no_mfu(tmp_path: Path) -> None:
    out = tmp_path / "r.md"
    argv = ["--device", "cpu", "--shape", "tiny", "--random-weights", "--seq-len", "64", "--search-turns", "1",
            "--groups", "1", "--group-size", "2", "--repeats", "1", "--out", str(out)]  # fmt: skip
    assert _bench(argv) == 0
    r = json.loads(out.with_suffix(".json").read_text())
    assert all(v["mfu_update"] is None and v["mfu_step"] is None for v in r["variants"].values())
    assert "| n/a | n/a |" in out.read_text()
    assert not Path(r["checkpoint"]["path"]).exists()  # the temp work dir is removed


def test_a_model_folder_is_measured_with_its_tokenizer_or_from_its_config(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    small = ["--device", "cpu", "--groups", "1", "--group-size", "2", "--repeats", "1"]
    assert _bench(["--model", str(tiny_model_dir), *small, "--think-words", "2", "--doc-words", "4",
                   "--out", str(tmp_path / "a.md")]) == 0  # fmt: skip
    a = json.loads((tmp_path / "a.json").read_text())
    assert a["layout"] is None and a["model_info"]["vocab"] == 49152
    assert (tmp_path / "a.md").read_text().startswith("# Trainer benchmark: GRPO vs GRPO + LLDS")
    argv = [
        "--model",
        str(tiny_model_dir),
        "--random-weights",
        "--seq-len",
        "64",
        *small,
        "--out",
        str(tmp_path / "b.md"),
    ]
    assert _bench(argv) == 0
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["tokens_per_step"] == 2 * 64 and b["source"] == f"{tiny_model_dir}/config.json"
    assert b["model_info"]["params"] == a["model_info"]["params"]


def test_benchmarks_md_holds_the_gpu_check_after_the_trainer_benchmark(tmp_path: Path) -> None:
    from llds.bench import stitch

    text = stitch(tmp_path / "BENCHMARKS.md").read_text()
    order = [
        text.index(h) for h in ("# Trainer benchmark:", "# Trainer check (", "# GPU check (", "# Load test")
    ]
    assert order == sorted(order)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--shape", "qwen2.5-3b"], "needs --random-weights"),
        (["--shape", "qwen9-1t", "--random-weights"], "unknown --shape"),
        (["--shape", "tiny", "--random-weights", "--seq-len", "6"], "too short"),
        (["--shape", "tiny", "--random-weights", "--search-turns", "-1"], "--search-turns must be >= 0"),
    ],
)
def test_bad_flags_fail_before_any_model_loads(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _bench(["--device", "cpu", *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_named_shapes_have_the_published_parameter_counts() -> None:
    """Qwen2.5 model cards: 1.54 B (1.31 B non-embedding), 3.09 B (2.77 B), 7.61 B (6.53 B)."""
    import torch
    from transformers import AutoModelForCausalLM

    from llds_bench.shapes import matmul_params

    expected = {"qwen2.5-1.5b": (1.54, 1.31), "qwen2.5-3b": (3.09, 2.77), "qwen2.5-7b": (7.61, 6.53)}
    for name, (total, non_embedding) in expected.items():
        shape = SHAPES[name]
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(shape.hf_config())
        n = sum(p.numel() for p in model.parameters())
        embedding = shape.vocab_size * shape.hidden_size
        heads = 1 if shape.tie_word_embeddings else 2
        assert abs(n / 1e9 - total) < 0.01, name
        assert abs((n - heads * embedding) / 1e9 - non_embedding) < 0.01, name
        assert matmul_params(model) == n - (heads - 1) * embedding, name
        assert shape.head_dim == 128 and model.config.rope_parameters["rope_theta"] == 1e6


def test_model_flops_by_hand() -> None:
    # 6 N per token for 3 tokens, plus causal attention 6 * layers * width * s (s + 1).
    assert train_flops(10, 2, 4, [3]) == 6 * 10 * 3 + 6 * 2 * 4 * 3 * 4 == 756
    assert train_flops(10, 2, 4, [3, 1]) == 756 + 6 * 10 + 6 * 2 * 4 * 1 * 2


def test_the_default_layout_is_search_r1_at_its_context_limit() -> None:
    lay = search_r1_layout(4096)
    assert (lay.prompt, lay.search_turns, lay.turn, lay.observation, lay.answer) == (596, 3, 500, 500, 500)
    assert (lay.total, lay.loss_tokens) == (4096, 2000)


@pytest.mark.parametrize(
    ("name", "tflops"),
    [("NVIDIA H100 80GB HBM3", 989), ("NVIDIA H100 PCIe", 756), ("NVIDIA H200", 989),
     ("NVIDIA A100-SXM4-80GB", 312), ("Tesla T4", None)],
)  # fmt: skip
def test_peak_by_gpu_name(name: str, tflops: float | None) -> None:
    assert peak_bf16_tflops(name) == tflops


@pytest.mark.gpu
@pytest.mark.slow
def test_the_benchmark_on_a_gpu(tmp_path: Path) -> None:
    """The benchmark at Qwen2.5-3B's shape on a GPU, within its 8-minute budget."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    out = tmp_path / "gpu.md"
    argv = [
        "--device",
        "cuda",
        "--shape",
        "qwen2.5-3b",
        "--random-weights",
        "--budget-s",
        "480",
        "--out",
        str(out),
    ]
    assert _bench(argv) == 0
    r = json.loads(out.with_suffix(".json").read_text())
    assert r["dtype"] == "bfloat16" and r["gradient_checkpointing"]
    assert r["peak_tflops"] is None or all(0 < v["mfu_update"] < 1 for v in r["variants"].values())
