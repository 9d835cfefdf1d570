"""``llds up`` places each child on GPUs of its own (issue 29, item 2), checked without a GPU: the
environment, argv and resolved config of every child for 0, 1, 2, 4 and 8 GPUs, the refusals, the
one-GPU mode's settings and arithmetic, and torchrun's ranks ending with ``llds up``."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import time
import tomllib
from pathlib import Path

import pytest

from llds import placement, supervisor, up
from llds.placement import PlacementError
from llds.supervisor import Child

NAMES = ("retriever", "rollout", "trainer", "dashboard")


@pytest.fixture(autouse=True)
def _no_gpu_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith(("LLDS_UP_", "LLDS_ROLLOUT_", "LLDS_TRAINER_")) or k == "CUDA_VISIBLE_DEVICES":
            monkeypatch.delenv(k)
    # no nvidia-smi answers here: the GPU's memory is unknown unless a test says it
    monkeypatch.setattr(placement, "_nvidia_smi", lambda *a: None)


def _up(tmp_path: Path, *flags: str, preset: str = "gpu") -> up.Up:
    model = tmp_path / "policy"
    model.mkdir(parents=True, exist_ok=True)
    argv = ["--preset", preset, "--run-dir", str(tmp_path / "run"), *flags]
    if preset == "gpu":
        argv += ["--model", str(model)]
    cfg, _ = up.parse_args(argv)
    u = up.Up(cfg)
    u.redis_url = "redis://127.0.0.1:1/0"
    u.paths = {"world": tmp_path, "index": tmp_path / "index", "policy": model}
    return u


def _specs(u: up.Up) -> dict[str, tuple[list[str], dict[str, str], dict[str, object]]]:
    """Child -> (argv, env, its resolved config file, if any)."""
    out = {}
    for name in u.child_names():
        argv, env = u.spec(name)
        conf = tomllib.loads(Path(argv[-1]).read_text()) if argv[-2] == "--config" else {}
        out[name] = (argv, env, conf)
    return out


def _devices(specs: dict[str, tuple[list[str], dict[str, str], dict[str, object]]]) -> dict[str, str | None]:
    return {name: env.get("CUDA_VISIBLE_DEVICES") for name, (_, env, _) in specs.items()}


def _ranks(argv: list[str]) -> int:
    """Trainer ranks an argv starts: torchrun's --nproc-per-node, or one plain process."""
    if argv[1:4] == ["-m", "llds.supervisor", "torchrun"]:
        return int(argv[argv.index("--nproc-per-node") + 1])
    assert argv[1:5] == ["-m", "llds.cli", "trainer", "run"], argv
    return 1


# ---------------------------------------------------------------------------- defaults by GPU count


def test_no_gpu_refuses_a_gpu_preset(tmp_path: Path) -> None:
    with pytest.raises(PlacementError, match="no GPU is visible") as e:
        _up(tmp_path, "--gpus", "0").plan()
    assert "--preset cpu" in str(e.value)


def test_one_gpu_is_shared_in_the_one_gpu_mode(tmp_path: Path) -> None:
    u = _up(tmp_path, "--gpus", "1")
    specs = _specs(u)
    assert _devices(specs) == {"retriever": "", "rollout": "0", "trainer": "0", "dashboard": ""}
    assert u.placement.shared and _ranks(specs["trainer"][0]) == 1
    rollout, trainer = specs["rollout"][2], specs["trainer"][2]
    # rollout_gpu.toml asks 0.85 of the GPU; the trainer preset float32 weights, micro-batch 8
    assert rollout["engine"]["gpu_memory_utilization"] == 0.3  # type: ignore[index]
    assert rollout["engine"]["dtype"] == "bfloat16"  # type: ignore[index]  # the rest of [engine] is kept
    assert (trainer["dtype"], trainer["autocast"], trainer["micro_batch_size"]) == ("bfloat16", "none", 2)
    assert trainer["gradient_checkpointing"] is True and trainer["kl_coef"] == 0.001  # reference kept, bf16


def test_one_gpu_mode_refuses_nccl_weight_sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLDS_TRAINER_WEIGHT_SYNC", "nccl")
    with pytest.raises(PlacementError, match="cannot hold two processes on one GPU"):
        _up(tmp_path, "--gpus", "1").plan()
    assert _up(tmp_path / "two", "--gpus", "2").placement.trainer == (1,)  # on GPUs of its own it may


def test_one_gpu_share_is_a_flag_and_never_raises_a_smaller_configured_share(tmp_path: Path) -> None:
    u = _up(tmp_path, "--gpus", "1", "--one-gpu-rollout-share", "0.2")
    assert _specs(u)["rollout"][2]["engine"]["gpu_memory_utilization"] == 0.2  # type: ignore[index]
    light = tmp_path / "rollout.toml"
    light.write_text('[engine]\ndevice = "cuda"\ngpu_memory_utilization = 0.1\n')
    u = _up(tmp_path / "b", "--gpus", "1", "--rollout-config", str(light))
    assert _specs(u)["rollout"][2]["engine"]["gpu_memory_utilization"] == 0.1  # type: ignore[index]


@pytest.mark.parametrize(
    ("gpus", "rollout", "trainer", "ranks"),
    [(2, ["0"], "1", 1), (3, ["0"], "1,2", 2), (4, ["0"], "1,2,3", 3), (8, ["0", "1"], "2,3,4,5,6,7", 6)],
)
def test_several_gpus_split_one_rollout_gpu_in_four(
    tmp_path: Path, gpus: int, rollout: list[str], trainer: str, ranks: int
) -> None:
    u = _up(tmp_path, "--gpus", str(gpus))
    specs = _specs(u)
    replicas = ["rollout"] + [f"rollout-{i}" for i in range(1, len(rollout))]
    assert u.rollout_names == replicas and not u.placement.shared
    devices = _devices(specs)
    assert [devices[r] for r in replicas] == rollout
    assert (devices["trainer"], devices["retriever"], devices["dashboard"]) == (trainer, "", "")
    assert _ranks(specs["trainer"][0]) == ranks
    # no one-GPU settings: the presets as they are
    assert specs["rollout"][2]["engine"]["gpu_memory_utilization"] == 0.85  # type: ignore[index]
    assert (specs["trainer"][2]["dtype"], specs["trainer"][2]["micro_batch_size"]) == ("float32", 8)
    # each replica: its own port, registry name and config file, the same run and weights
    assert len({specs[r][2]["port"] for r in replicas}) == len(replicas)
    for r in replicas:
        conf = specs[r][2]
        assert conf["replica_name"] == r and conf["port"] == u.ports[r] and conf["run_id"] == u.run_id
        assert specs[r][0][-1].endswith(f"/{r}.resolved.toml")
        assert conf["weights_root"] == str(u.weights_root) and conf["dataset"] == str(
            tmp_path / "train.jsonl"
        )


def test_torchrun_argv_runs_the_trainers_command(tmp_path: Path) -> None:
    argv = _specs(_up(tmp_path, "--gpus", "4"))["trainer"][0]
    assert argv[argv.index("--nproc-per-node") + 2 :][:5] == ["-m", "llds.cli", "trainer", "run", "--config"]
    assert "--standalone" in argv


def test_gpu_ids_index_the_visible_devices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,GPU-abc,7")
    devices = _devices(_specs(_up(tmp_path)))
    assert (devices["rollout"], devices["trainer"]) == ("3", "5,GPU-abc,7")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6,7")
    devices = _devices(_specs(_up(tmp_path / "b", "--gpus", "2")))  # the first two of them
    assert (devices["rollout"], devices["trainer"]) == ("3", "5")
    with pytest.raises(PlacementError, match="names 4 GPU"):
        _up(tmp_path / "c", "--gpus", "6").plan()


def test_nvidia_smi_counts_the_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})" for i in range(2)]
    monkeypatch.setattr(placement, "_nvidia_smi", lambda *a: lines if a == ("-L",) else None)
    assert _devices(_specs(_up(tmp_path))) == {
        "retriever": "",
        "rollout": "0",
        "trainer": "1",
        "dashboard": "",
    }


# ---------------------------------------------------------------------------- flags


@pytest.mark.parametrize(
    "flags",
    [["--rollout-gpus", "6,7", "--trainer-gpus", "0,1,2,3"], ["--rollout-gpus", "6", "--rollout-gpus", "7",
     "--trainer-gpus", "0,1", "--trainer-gpus", "2,3"]],
)  # fmt: skip
def test_explicit_gpus_one_value_or_repeated(tmp_path: Path, flags: list[str]) -> None:
    u = _up(tmp_path, "--gpus", "8", *flags)
    devices = _devices(_specs(u))
    assert (devices["rollout"], devices["rollout-1"], devices["trainer"]) == ("6", "7", "0,1,2,3")
    assert up.UpConfig.load(_write_config(u)).rollout_gpus == [6, 7]  # kept in the run's config


def _write_config(u: up.Up) -> Path:
    path = u.run_dir / "up_config.toml"
    u.cfg.write_toml(path)
    return path


def test_one_side_given_leaves_the_other_the_rest(tmp_path: Path) -> None:
    devices = _devices(_specs(_up(tmp_path, "--gpus", "4", "--trainer-gpus", "2,3")))
    assert (devices["rollout"], devices["rollout-1"], devices["trainer"]) == ("0", "1", "2,3")
    devices = _devices(_specs(_up(tmp_path / "b", "--gpus", "4", "--rollout-gpus", "3")))
    assert (devices["rollout"], devices["trainer"]) == ("3", "0,1,2")


def test_the_same_single_gpu_on_both_sides_is_the_one_gpu_mode(tmp_path: Path) -> None:
    u = _up(tmp_path, "--gpus", "4", "--rollout-gpus", "2", "--trainer-gpus", "2")
    assert u.placement.shared and _devices(_specs(u))["trainer"] == "2"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--rollout-gpus", "0,1", "--trainer-gpus", "1,2"], "share GPU 1: each child needs GPUs of its own"),
        (["--rollout-gpus", "0", "--trainer-gpus", "0,1"], "share GPU 0"),
        (["--trainer-gpus", "4"], "GPU 4 does not exist; 4 GPU(s) seen through nvidia-smi -L (ids 0..3)"),
        (["--rollout-gpus", "-1"], "GPU -1 does not exist"),
        (["--trainer-gpus", "0,1,2,3"], "no GPU is left for the rollout"),
        (["--rollout-gpus", "0,1,2,3"], "no GPU is left for the trainer"),
    ],
)
def test_bad_placements_are_refused_naming_the_gpus(tmp_path: Path, flags: list[str], message: str) -> None:
    with pytest.raises(PlacementError) as e:
        _up(tmp_path, "--gpus", "4", *flags).plan()
    assert message in str(e.value)


def test_a_gpu_named_twice_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        up.parse_args(["--rollout-gpus", "1,1"])
    assert "name a GPU twice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        up.parse_args(["--trainer-gpus", "a"])
    assert "'a' is not an integer" in capsys.readouterr().err


def test_cpu_presets_change_nothing(tmp_path: Path) -> None:
    for preset in ("cpu", "tiny"):
        u = _up(tmp_path / preset, preset=preset)
        assert not u.placement.active
        specs = _specs(u)
        assert all("CUDA_VISIBLE_DEVICES" not in env for _, env, _ in specs.values()), preset
        assert _ranks(specs["trainer"][0]) == 1 and set(specs) == set(NAMES)


def test_gpu_flags_on_a_cpu_config_are_refused(tmp_path: Path) -> None:
    with pytest.raises(PlacementError, match="--trainer-gpus 1 given, but the trainer runs on the CPU"):
        _up(tmp_path, "--gpus", "2", "--trainer-gpus", "1", preset="tiny").plan()


def test_a_rollout_device_index_is_refused(tmp_path: Path) -> None:
    conf = tmp_path / "rollout.toml"
    conf.write_text('[engine]\ndevice = "cuda:1"\n')
    with pytest.raises(PlacementError, match=r"give engine\.device = 'cuda'"):
        _up(tmp_path, "--gpus", "2", "--rollout-config", str(conf)).plan()


def test_resume_may_move_the_gpus(tmp_path: Path) -> None:
    cfg, _ = up.parse_args(
        ["--preset", "gpu", "--model", "m", "--run-dir", str(tmp_path / "r"), "--gpus", "2"]
    )
    first = up.Up(cfg)
    first.run_dir.mkdir(parents=True)
    (first.run_dir / "run_id").write_text(first.run_id + "\n")
    cfg.write_toml(first.run_dir / "up_config.toml")
    again, resume = up.parse_args(["--resume", str(first.run_dir), "--gpus", "4", "--trainer-gpus", "1,2,3"])
    assert resume and (again.gpus, again.trainer_gpus, again.preset) == (4, [1, 2, 3], "gpu")


# ---------------------------------------------------------------------------- the one-GPU mode's start


def test_one_gpu_mode_starts_the_trainer_after_the_rollout_is_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    events: list[str] = []

    def fake_start(self: Child, echo: bool = True) -> Child:
        events.append(f"start {self.name}")
        return self

    monkeypatch.setattr(Child, "start", fake_start)
    monkeypatch.setattr(
        supervisor, "wait_healthy", lambda c, *a, **k: events.append(f"healthy {c.name}") or 0.0
    )
    monkeypatch.setattr(up.Up, "check_ports", lambda self: None)
    u = _up(tmp_path, "--gpus", "1", "--redis-url", "redis://127.0.0.1:1/0")
    u.start(u.paths)
    assert events.index("healthy rollout") < events.index("start trainer")
    u2 = _up(tmp_path / "two", "--gpus", "2", "--redis-url", "redis://127.0.0.1:1/0")
    events.clear()
    u2.start(u2.paths)
    assert events.index("start trainer") < events.index("healthy rollout")  # side by side: all at once


# ---------------------------------------------------------------------------- the arithmetic


def _fake_model(path: Path, params: int) -> Path:
    """A folder whose safetensors header declares ``params`` bfloat16 parameters (no data: only the
    header is read)."""
    path.mkdir(parents=True, exist_ok=True)
    rows = params // 1024
    header = json.dumps({"w": {"dtype": "BF16", "shape": [rows, 1024], "data_offsets": [0, rows * 2048]},
                         "__metadata__": {"format": "pt"}}).encode()  # fmt: skip
    (path / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    return path


def test_parameter_count_reads_the_headers(tmp_path: Path) -> None:
    assert placement.parameter_count(_fake_model(tmp_path / "m", 3_000_000 * 1024)) == 3_000_000 * 1024
    assert placement.parameter_count(tmp_path / "none") is None


@pytest.mark.parametrize(
    ("params", "gpu_gb", "dtype"),
    [(1.5e9, 141, "float32"), (0.5e9, 24, "float32"), (3.1e9, 80, "bfloat16"), (7.6e9, 141, "bfloat16"),
     (7.6e9, 80, None), (1.5e9, 24, None)],
)  # fmt: skip
def test_one_gpu_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], params: float,
    gpu_gb: int, dtype: str | None,
) -> None:  # fmt: skip
    """Weights, gradients, two AdamW moments and the reference (kl_coef 0.001 in the preset): 20 bytes a
    parameter in float32 (the preset's master weights), 10 in bfloat16, in the 60% of the GPU that
    vLLM's 30% and the 10% reserve leave; float32 kept when it fits, else bfloat16, else refused."""
    _fake_model(tmp_path / "policy", int(params))
    monkeypatch.setattr(
        placement, "_nvidia_smi", lambda *a: [str(gpu_gb * 1e9 / 2**20)] if "-i" in a else None
    )
    u = _up(tmp_path, "--gpus", "1")
    if dtype is None:
        with pytest.raises(PlacementError) as e:
            u.plan()
        msg = str(e.value)
        assert (
            f"the trainer needs {params * 10 / 1e9:.1f} GB" in msg
            and "--rollout-gpus 0 --trainer-gpus 1" in msg
        )
        return
    trainer = _specs(u)["trainer"][2]
    assert (trainer["dtype"], trainer["micro_batch_size"], trainer["gradient_checkpointing"]) == (
        dtype,
        2,
        True,
    )
    assert trainer["autocast"] == ("bfloat16" if dtype == "float32" else "none")  # the preset's, kept
    warned = "rounded away, and at lr 1e-06 most are" in " ".join(u.one_gpu_notes)
    assert warned == (dtype == "bfloat16")


def test_one_gpu_fit_unchecked_is_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _up(tmp_path, "--gpus", "1").plan()
    assert "fit not checked: the GPU's memory is unknown" in capsys.readouterr().out


# ---------------------------------------------------------------------------- torchrun's ranks


RANK_SCRIPT = """
import os, sys, time
from llds_server import lifeline
lifeline.install("rank")  # as llds.cli does before `trainer run`
rank = int(os.environ["RANK"])
print(f"rank {rank} parent {os.getppid()} lifeline {os.environ.get('LLDS_PARENT_PID')} "
      f"world {os.environ['WORLD_SIZE']}", flush=True)
open(os.path.join(sys.argv[2], f"rank{rank}"), "w").close()
if sys.argv[1] == "exit":
    # rank 0 fails once rank 1 has started (torchrun stops the others when one fails)
    deadline = time.monotonic() + 120
    while rank == 0 and not os.path.exists(os.path.join(sys.argv[2], "rank1")) and time.monotonic() < deadline:
        time.sleep(0.1)
    sys.exit(3 if rank == 0 else 0)
time.sleep(120)
"""


def _torchrun(tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    argv = supervisor.torchrun_argv(2, [str(script), mode, str(tmp_path)])
    env = {**os.environ, "LLDS_PARENT_PID": str(os.getpid()), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)  # fmt: skip


def test_torchrun_ranks_watch_the_wrapper_and_its_exit_status_is_the_failed_ranks(tmp_path: Path) -> None:
    proc = _torchrun(tmp_path, "exit")
    out, _ = proc.communicate(timeout=180)
    # rank 0 exited 3 (a trainer out of learning signal): the wrapper exits 3, not torchrun's 1
    assert proc.returncode == 3, out
    lines = [line for line in out.splitlines() if line.startswith("rank ")]
    assert len(lines) == 2, out
    for line in lines:
        _, _, _, parent, _, lifeline, _, world = line.split()
        assert parent == lifeline == str(proc.pid) and world == "2", line


def test_torchrun_ranks_end_when_the_wrapper_is_killed(tmp_path: Path) -> None:
    import psutil

    proc = _torchrun(tmp_path, "sleep")
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + 180
    while len(seen) < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("rank "):
            seen.append(line)
    assert len(seen) == 2
    ranks = [
        p for p in psutil.Process(proc.pid).children(recursive=True) if "rank.py" in " ".join(p.cmdline())
    ]
    assert len(ranks) == 2 and all(
        os.getpgid(r.pid) != os.getpgid(proc.pid) for r in ranks
    )  # out of its group
    os.killpg(proc.pid, 9)  # what llds up's reap does: only the wrapper's group
    proc.wait(30)
    # each rank's lifeline saw its parent go: SIGTERM, then SIGKILL after LLDS_PARENT_GRACE_S
    _, alive = psutil.wait_procs(ranks, timeout=30)
    assert not alive, [p.pid for p in alive]
