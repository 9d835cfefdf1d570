"""docker-compose.yml and deploy/compose.cpu.yml: validated by docker-compose itself (Debian's
1.29.2, no Docker engine needed) and by the compose-spec JSON schema, then checked for what the
deployment promises: GPU reservations, healthchecks gating start-up, shared named volumes, secrets
from the env file, Redis password + append-only, nothing unauthenticated published off the host."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from deploy_tools import (
    COMPOSE_CPU,
    COMPOSE_FILE,
    ENV_EXAMPLE,
    assert_preset_applied,
    compose_config,
    preset_path,
    read_env_file,
    resolved_settings,
    run,
    tool,
)


def _volume(spec: str | dict) -> dict:
    """A volume entry as docker-compose 1.29 prints it (``source:target[:mode]``) or long syntax."""
    if isinstance(spec, dict):
        return {
            "source": spec.get("source"),
            "target": spec["target"],
            "read_only": bool(spec.get("read_only")),
        }
    parts = spec.split(":")
    return {
        "source": parts[0],
        "target": parts[1],
        "read_only": len(parts) > 2 and "ro" in parts[2].split(","),
    }


def _host_ip(spec: str | dict) -> str | None:
    """Host address of a published port (``ip:host:container[/proto]`` or long syntax)."""
    if isinstance(spec, dict):
        return spec.get("host_ip")
    parts = str(spec).split(":")
    return parts[0] if len(parts) == 3 else None


def _seconds(value: str | int | float) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    total = 0.0
    for num, unit in re.findall(r"([\d.]+)(h|ms|m|s|us|ns)", value):
        total += float(num) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}[unit]
    return total


@pytest.fixture(scope="module")
def gpu() -> dict:
    return compose_config(COMPOSE_FILE, profiles=("setup",))


@pytest.fixture(scope="module")
def cpu() -> dict:
    return compose_config(COMPOSE_FILE, COMPOSE_CPU)


@pytest.mark.parametrize(
    "files", [(COMPOSE_FILE,), (COMPOSE_FILE, COMPOSE_CPU)], ids=["gpu", "gpu+cpu-override"]
)
def test_docker_compose_config_accepts_files(files: tuple) -> None:
    argv = [tool("docker-compose"), "--env-file", str(ENV_EXAMPLE)]
    for f in files:
        argv += ["-f", str(f)]
    res = run([*argv, "config", "-q"])
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("path", [COMPOSE_FILE, COMPOSE_CPU], ids=lambda p: p.name)
def test_compose_files_match_compose_spec_schema(path) -> None:
    res = run([tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path)])
    assert res.returncode == 0, res.stdout + res.stderr


def test_docker_compose_rejects_a_broken_file(tmp_path) -> None:
    """The validator is live: a bad depends_on condition fails."""
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "services:\n  a:\n    image: x\n    depends_on:\n      b:\n        condition: service_happy\n"
        "  b:\n    image: y\n"
    )
    res = run([tool("docker-compose"), "-f", str(bad), "config", "-q"], cwd=tmp_path)
    assert res.returncode != 0


@pytest.mark.parametrize("secret", ["REDIS_PASSWORD", "LLDS_ADMIN_TOKEN", "GRAFANA_ADMIN_PASSWORD"])
def test_compose_refuses_to_start_without_each_secret(tmp_path, secret: str) -> None:
    env = {k: v for k, v in read_env_file().items() if k != secret}
    env_file = tmp_path / "env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    res = run([tool("docker-compose"), "--env-file", str(env_file), "-f", str(COMPOSE_FILE), "config", "-q"])
    assert res.returncode != 0 and secret in res.stderr


def test_redis_refuses_the_placeholder_password(gpu: dict) -> None:
    """The env file copied unchanged: Redis exits before it writes its config or starts (the services
    refuse the same placeholder in their URLs and the admin token, tests/unit/server/test_cli_flags.py)."""
    command = [part.replace("$$", "$") for part in gpu["services"]["redis"]["command"]]
    env = {"PATH": "/usr/bin:/bin", "REDIS_PASSWORD": read_env_file()["REDIS_PASSWORD"]}
    res = run(command, env=env)
    assert res.returncode == 1 and "REDIS_PASSWORD is the placeholder" in res.stderr


def test_gpu_services_reserve_gpus(gpu: dict) -> None:
    for name in ("rollout", "trainer"):
        devices = gpu["services"][name]["deploy"]["resources"]["reservations"]["devices"]
        assert any("gpu" in d["capabilities"] and d["driver"] == "nvidia" for d in devices), name


def test_startup_is_gated_by_healthchecks(gpu: dict) -> None:
    svcs = gpu["services"]
    for name in ("redis", "retriever", "rollout", "trainer", "dashboard", "prometheus", "grafana"):
        assert "test" in svcs[name]["healthcheck"], f"{name} has no healthcheck"
    assert svcs["rollout"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert svcs["rollout"]["depends_on"]["retriever"]["condition"] == "service_healthy"
    assert svcs["trainer"]["depends_on"]["redis"]["condition"] == "service_healthy"
    # Model loading takes minutes: a short start period would mark a loading service unhealthy.
    for name in ("retriever", "rollout", "trainer"):
        assert _seconds(svcs[name]["healthcheck"]["start_period"]) >= 300, name


def test_services_listen_on_all_interfaces_inside_containers(gpu: dict) -> None:
    for name in ("retriever", "rollout", "trainer", "dashboard"):
        cmd = gpu["services"][name]["command"]
        assert cmd[cmd.index("--host") + 1] == "0.0.0.0", name


def test_weights_volume_is_shared_trainer_writes_rollout_reads(gpu: dict) -> None:
    def mount(svc: str, target: str) -> dict:
        vols = [_volume(v) for v in gpu["services"][svc]["volumes"]]
        return next(v for v in vols if v["target"] == target)

    t, r = mount("trainer", "/data/weights"), mount("rollout", "/data/weights")
    assert t["source"] == r["source"] == "weights"
    assert not t.get("read_only") and r.get("read_only")
    for name in ("weights", "hf-cache", "indexes", "models", "redis-data"):
        assert name in gpu["volumes"], name
    # Both sides agree on the weights root of the run.
    t_cmd, r_cmd = gpu["services"]["trainer"]["command"], gpu["services"]["rollout"]["command"]
    assert t_cmd[t_cmd.index("--weights-root") + 1] == r_cmd[r_cmd.index("--weights-root") + 1]


def test_redis_has_password_and_append_only_persistence(gpu: dict) -> None:
    redis = gpu["services"]["redis"]
    script = " ".join(redis["command"])
    assert "requirepass" in script and "--appendonly yes" in script
    assert "--requirepass" not in script, "the password must not be on the command line"
    assert redis["environment"]["REDIS_PASSWORD"] == read_env_file()["REDIS_PASSWORD"]
    assert any(
        _volume(v) == {"source": "redis-data", "target": "/data", "read_only": False}
        for v in redis["volumes"]
    )
    for name in ("rollout", "trainer"):
        env = gpu["services"][name]["environment"]
        url = env[f"LLDS_{name.upper()}_REDIS_URL"]
        assert url == f"redis://:{read_env_file()['REDIS_PASSWORD']}@redis:6379/0"
        assert "--redis-url" not in gpu["services"][name]["command"], "keep the password off the command line"
        assert env["LLDS_ADMIN_TOKEN"] == read_env_file()["LLDS_ADMIN_TOKEN"]


def test_only_loopback_ports_and_no_internal_service_published(gpu: dict) -> None:
    for name, svc in gpu["services"].items():
        for port in svc.get("ports", []):
            assert _host_ip(port) == "127.0.0.1", f"{name} publishes {port} beyond loopback"
    for name in ("redis", "rollout", "trainer"):
        assert not gpu["services"][name].get("ports"), f"{name} must stay on the service network"


def test_rollout_registers_a_reachable_url(gpu: dict, cpu: dict) -> None:
    """The rollout's default URL is its bind address (0.0.0.0): it must advertise its service name."""
    for env in (gpu["services"]["rollout"]["environment"], cpu["services"]["rollout-cpu"]["environment"]):
        assert env["LLDS_ROLLOUT_PUBLIC_URL"] == "http://rollout:8001"
        assert env["LLDS_ROLLOUT_REPLICA_NAME"] == "rollout"


def test_rollout_and_trainer_run_their_presets(gpu: dict) -> None:
    """Each GPU service reads its preset: the rollout samples with rollout_search_r1.toml's settings (top-p
    0.95, 128 groups in flight, a 30 s retriever timeout, vLLM in bf16 at 85 % of its GPU), not the
    defaults (top-p 1.0, 8 groups, 10 s), and the trainer trains with trainer_search_r1.toml's."""
    svcs = gpu["services"]
    ro = resolved_settings(svcs["rollout"]["command"], svcs["rollout"]["environment"])
    preset = preset_path(svcs["rollout"]["command"])
    assert preset.name == "rollout_search_r1.toml"
    assert_preset_applied(ro, preset)
    assert (ro.top_p, ro.max_groups_in_flight, ro.retriever_timeout_s) == (0.95, 128, 30.0)
    assert (ro.engine.type, ro.engine.dtype, ro.engine.gpu_memory_utilization) == ("vllm", "bfloat16", 0.85)
    tr = resolved_settings(svcs["trainer"]["command"], svcs["trainer"]["environment"])
    preset = preset_path(svcs["trainer"]["command"])
    assert preset.name == "trainer_search_r1.toml"
    assert_preset_applied(tr, preset)
    assert tr.regularizer.answer_weight_mode == "off"


def test_presets_come_from_the_checkout_read_only(gpu: dict, cpu: dict) -> None:
    """configs/ is mounted over the image's copy: another or an edited preset needs no image rebuild."""
    for svcs, names in (
        (gpu["services"], ("rollout", "trainer")),
        (cpu["services"], ("rollout-cpu", "trainer-cpu")),
    ):
        for name in names:
            vols = [_volume(v) for v in svcs[name]["volumes"]]
            mount = next(v for v in vols if v["target"] == "/opt/llds/configs")
            assert Path(mount["source"]).resolve() == (COMPOSE_FILE.parent / "configs").resolve(), name
            assert mount["read_only"], name


def test_env_file_selects_the_ma_preset_and_the_one_gpu_share(tmp_path: Path) -> None:
    """``TRAINER_CONFIG_FILE=trainer_search_r1_ma.toml`` trains the -MA recipe and ``LLDS_ROLLOUT_ENGINE``
    overrides one key of the preset's engine, keeping the rest; no image is rebuilt for either."""
    env = read_env_file() | {
        "TRAINER_CONFIG_FILE": "trainer_search_r1_ma.toml",
        "LLDS_ROLLOUT_ENGINE": '{"gpu_memory_utilization": 0.2}',
        "ROLLOUT_GPUS": "0",
        "TRAINER_GPUS": "0",
    }
    env_file = tmp_path / "env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    res = run([tool("docker-compose"), "--env-file", str(env_file), "-f", str(COMPOSE_FILE), "config"])
    assert res.returncode == 0, res.stderr
    svcs = yaml.safe_load(res.stdout)["services"]
    tr = resolved_settings(svcs["trainer"]["command"], svcs["trainer"]["environment"])
    assert tr.regularizer.answer_weight_mode == "adaptive_code"
    assert_preset_applied(tr, preset_path(svcs["trainer"]["command"]))
    ro = resolved_settings(svcs["rollout"]["command"], svcs["rollout"]["environment"])
    assert ro.engine.gpu_memory_utilization == 0.2
    assert (ro.engine.dtype, ro.engine.max_batch_size, ro.top_p) == ("bfloat16", 256, 0.95)


def test_rollout_image_builds_on_the_pinned_vllm_image() -> None:
    text = (COMPOSE_FILE.parent / "deploy" / "docker" / "rollout.Dockerfile").read_text()
    assert "ARG VLLM_IMAGE=vllm/vllm-openai:v0.33.0" in text


def test_cpu_override_replaces_gpu_services(cpu: dict) -> None:
    svcs = cpu["services"]
    assert svcs["rollout"]["profiles"] == ["gpu"] and svcs["trainer"]["profiles"] == ["gpu"]
    for name in ("rollout-cpu", "trainer-cpu", "prepare"):
        assert "deploy" not in svcs[name], f"{name} must not reserve a GPU"
        assert svcs[name]["image"].startswith("llds-cpu:")
    assert svcs["rollout-cpu"]["networks"]["default"]["aliases"] == ["rollout"]
    assert svcs["trainer-cpu"]["networks"]["default"]["aliases"] == ["trainer"]
    assert svcs["retriever"]["depends_on"]["prepare"]["condition"] == "service_completed_successfully"


def test_env_example_documents_every_variable_the_compose_files_use() -> None:
    used = set()
    for path in (COMPOSE_FILE, COMPOSE_CPU):
        used |= set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", path.read_text()))
    missing = used - set(read_env_file())
    assert not missing, f"add to deploy/env.example: {sorted(missing)}"


def test_the_serve_profile_serves_the_agent_and_trains_nothing() -> None:
    """``docker compose --profile serve up retriever agent``: the rollout with training off (no
    dataset, no Redis, no weights folder), its preset applied, on the host's loopback, waiting only for
    the retriever, with the API key that /v1 and /agent/v1 need beyond loopback passed through; the
    training services never depend on it."""
    svcs = compose_config(COMPOSE_FILE, profiles=("serve",))["services"]
    agent = svcs["agent"]
    ro = resolved_settings(agent["command"], agent["environment"])
    assert ro.train is False and ro.dataset is None and ro.weights_root is None
    assert_preset_applied(ro, preset_path(agent["command"]))
    assert ro.redis_url is None or "LLDS_ROLLOUT_REDIS_URL" not in agent["environment"]
    assert set(agent["depends_on"]) == {"retriever"}
    assert "LLDS_API_KEY" in agent["environment"]
    assert [_host_ip(p) for p in agent["ports"]] == ["127.0.0.1"]
    assert all("agent" not in (svc.get("depends_on") or {}) for name, svc in svcs.items() if name != "agent")
    assert agent["profiles"] == ["serve"], "the agent must start only with its profile"
