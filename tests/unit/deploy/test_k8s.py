"""Kubernetes manifests: the base and each overlay render with kustomize (``kubectl kustomize``) and
every rendered object validates offline against the Kubernetes 1.37 schemas (kubernetes-validate,
strict: unknown fields fail). Then the scale-out promises: one GPU per rollout replica, each
replica advertising its own pod URL, a torchrun Job with a headless Service for rendezvous, Redis
as a StatefulSet with a PVC and a password Secret, weights on a shared ReadWriteMany volume."""

from __future__ import annotations

import base64
import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest
from deploy_tools import (
    K8S_OVERLAYS,
    assert_preset_applied,
    containers,
    expand_k8s,
    k8s_env,
    pod_spec,
    preset_path,
    render_kustomize,
    resolved_settings,
)

K8S_VERSION = "1.37.0"
TARGETS = ("base", *(f"overlays/{o}" for o in K8S_OVERLAYS))


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for target in TARGETS:
        out[target] = render_kustomize(target, tmp_path_factory.mktemp(target.replace("/", "-")))
    return out


def _get(docs: list[dict], kind: str, name: str) -> dict:
    matches = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"{kind}/{name}: {len(matches)} found"
    return matches[0]


def _container(obj: dict, name: str) -> dict:
    return next(c for c in containers(obj, init=False) if c["name"] == name)


def _env(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


@pytest.mark.parametrize("target", TARGETS)
def test_renders_and_validates_strictly(rendered: dict, target: str) -> None:
    import kubernetes_validate

    docs = rendered[target]
    assert len(docs) >= 14
    for doc in docs:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_validator_is_live(rendered: dict) -> None:
    import kubernetes_validate

    bad = copy.deepcopy(_get(rendered["base"], "Deployment", "llds-rollout"))
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_secrets_stay_out_of_the_repository() -> None:
    base = Path(__file__).resolve().parents[3] / "deploy" / "k8s" / "base"
    assert (base / "secrets.env.example").exists()
    assert not (base / "secrets.env").exists(), (
        "deploy/k8s/base/secrets.env holds real secrets: never commit it"
    )


@pytest.mark.parametrize("target", TARGETS)
def test_rollout_replicas_advertise_their_own_pod_url(rendered: dict, target: str) -> None:
    rollout = _get(rendered[target], "Deployment", "llds-rollout")
    env = _env(_container(rollout, "rollout"))
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["LLDS_ROLLOUT_PUBLIC_URL"]["value"] == "http://$(POD_IP):8001"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["LLDS_ROLLOUT_REPLICA_NAME"]["value"] == "$(POD_NAME)"
    # Dependent variables must be defined before they are used.
    names = list(env)
    assert names.index("POD_IP") < names.index("LLDS_ROLLOUT_PUBLIC_URL")
    assert names.index("REDIS_PASSWORD") < names.index("LLDS_ROLLOUT_REDIS_URL")


def test_gpu_overlay_scales_out(rendered: dict) -> None:
    docs = rendered["overlays/gpu"]
    rollout = _get(docs, "Deployment", "llds-rollout")
    assert rollout["spec"]["replicas"] >= 2
    assert _container(rollout, "rollout")["resources"]["limits"]["nvidia.com/gpu"] == 1
    job = _get(docs, "Job", "llds-trainer")
    env = {k: v["value"] for k, v in _env(_container(job, "trainer")).items() if "value" in v}
    nnodes, nproc = int(env["NNODES"]), int(env["NPROC_PER_NODE"])
    assert nnodes >= 2 and job["spec"]["completions"] == job["spec"]["parallelism"] == nnodes
    assert _container(job, "trainer")["resources"]["limits"]["nvidia.com/gpu"] == nproc
    _get(docs, "Job", "llds-setup")


@pytest.mark.parametrize("target", TARGETS)
def test_trainer_is_a_torchrun_job_with_rendezvous(rendered: dict, target: str) -> None:
    docs = rendered[target]
    job = _get(docs, "Job", "llds-trainer")
    spec = pod_spec(job)
    assert job["spec"]["completionMode"] == "Indexed"
    headless = _get(docs, "Service", "llds-trainer")
    assert headless["spec"]["clusterIP"] == "None" and spec["subdomain"] == "llds-trainer"
    http = _get(docs, "Service", "llds-trainer-http")
    assert http["spec"]["selector"]["batch.kubernetes.io/job-completion-index"] == "0"
    trainer = _container(job, "trainer")
    argv = [*trainer["command"], *trainer.get("args", [])]
    if target != "overlays/cpu-small":
        assert argv[0] == "torchrun" and "--nnodes=$(NNODES)" in argv
        assert "--rdzv-endpoint=llds-trainer-0.llds-trainer:29400" in argv
    assert argv[argv.index("--host") + 1] == "0.0.0.0"


@pytest.mark.parametrize("target", TARGETS)
def test_redis_statefulset_with_pvc_and_secret(rendered: dict, target: str) -> None:
    docs = rendered[target]
    redis = _get(docs, "StatefulSet", "llds-redis")
    assert redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    c = _container(redis, "redis")
    script = " ".join(c["command"])
    assert "--appendonly yes" in script and "requirepass" in script and "--requirepass" not in script
    secret_name = _env(c)["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"]
    secret = _get(docs, "Secret", secret_name)
    assert set(secret["data"]) >= {"REDIS_PASSWORD", "LLDS_ADMIN_TOKEN"}
    assert _get(docs, "Service", "llds-redis")["spec"]["clusterIP"] == "None"


def test_redis_refuses_the_example_secrets_placeholder(rendered: dict) -> None:
    docs = rendered["base"]  # rendered with secrets.env copied from secrets.env.example
    c = _container(_get(docs, "StatefulSet", "llds-redis"), "redis")
    secret = _get(docs, "Secret", _env(c)["REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"])
    env = {
        "PATH": "/usr/bin:/bin",
        "REDIS_PASSWORD": base64.b64decode(secret["data"]["REDIS_PASSWORD"]).decode(),
    }
    res = subprocess.run(c["command"], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 1 and "REDIS_PASSWORD is the placeholder" in res.stderr


@pytest.mark.parametrize("target", TARGETS)
def test_weights_shared_trainer_writes_rollouts_read(rendered: dict, target: str) -> None:
    docs = rendered[target]
    pvc = _get(docs, "PersistentVolumeClaim", "llds-weights")
    if target != "overlays/cpu-small":
        assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]

    def weights_mount(obj: dict, name: str) -> dict:
        spec = pod_spec(obj)
        vol = next(
            v["name"]
            for v in spec["volumes"]
            if v.get("persistentVolumeClaim", {}).get("claimName") == "llds-weights"
        )
        return next(m for m in _container(obj, name)["volumeMounts"] if m["name"] == vol)

    assert weights_mount(_get(docs, "Deployment", "llds-rollout"), "rollout").get("readOnly") is True
    assert not weights_mount(_get(docs, "Job", "llds-trainer"), "trainer").get("readOnly")


@pytest.mark.parametrize("target", TARGETS)
def test_pods_run_as_non_root_and_services_bind_all_interfaces(rendered: dict, target: str) -> None:
    for obj in rendered[target]:
        spec = pod_spec(obj)
        if spec is None:
            continue
        assert spec["securityContext"]["runAsNonRoot"] is True, obj["metadata"]["name"]
        assert spec.get("automountServiceAccountToken") is False, obj["metadata"]["name"]
        for c in containers(obj):
            assert c["securityContext"]["allowPrivilegeEscalation"] is False, c["name"]
            argv = [*c.get("command", []), *c.get("args", [])]
            if "--host" in argv:
                assert argv[argv.index("--host") + 1] == "0.0.0.0", c["name"]


def test_internal_services_are_fenced_by_a_network_policy(rendered: dict) -> None:
    policy = _get(rendered["base"], "NetworkPolicy", "llds-internal-only")
    fenced = policy["spec"]["podSelector"]["matchExpressions"][0]["values"]
    assert {"llds-redis", "llds-rollout", "llds-trainer"} <= set(fenced)


def test_cpu_small_overlay_needs_no_gpu(rendered: dict) -> None:
    docs = rendered["overlays/cpu-small"]
    for obj in docs:
        for c in containers(obj):
            assert "nvidia.com/gpu" not in (c.get("resources", {}).get("limits") or {}), c["name"]
            if c["name"] in {"rollout", "trainer", "prepare"}:
                assert c["image"].startswith("llds-cpu:"), c["image"]
    rollout = _container(_get(docs, "Deployment", "llds-rollout"), "rollout")
    assert "LLDS_ROLLOUT_ENGINE" not in _env(rollout), "the CPU engine comes from rollout_cpu.toml"
    for pvc in (d for d in docs if d["kind"] == "PersistentVolumeClaim"):
        assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    _get(docs, "Job", "llds-prepare")


PRESETS = {
    "base": ("rollout_search_r1.toml", "trainer_search_r1.toml"),
    "overlays/gpu": ("rollout_search_r1.toml", "trainer_search_r1.toml"),
    "overlays/gpu-ma": ("rollout_search_r1.toml", "trainer_search_r1_ma.toml"),
    "overlays/cpu-small": ("rollout_cpu.toml", "trainer_cpu.toml"),
}
"""Target -> the (rollout, trainer) presets its pods run."""


def _resolved(docs: list[dict], kind: str, name: str, container: str) -> tuple[Path, Any]:
    c = _container(_get(docs, kind, name), container)
    env = k8s_env(c)
    argv = expand_k8s([*c["command"], *c.get("args", [])], env)
    return preset_path(argv), resolved_settings(argv, env)


@pytest.mark.parametrize("target", TARGETS)
def test_rollout_and_trainer_run_their_presets(rendered: dict, target: str) -> None:
    """The rollout's argv names its preset (the published sampling settings, not the defaults: top-p 1.0,
    8 groups in flight, a 10 s retriever timeout) and every setting the preset states is what it resolves
    in its container; the same for the trainer, whose -MA preset the gpu-ma overlay selects."""
    docs = rendered[target]
    want_rollout, want_trainer = PRESETS[target]
    preset, ro = _resolved(docs, "Deployment", "llds-rollout", "rollout")
    assert preset.name == want_rollout
    assert_preset_applied(ro, preset)
    preset, tr = _resolved(docs, "Job", "llds-trainer", "trainer")
    assert preset.name == want_trainer
    assert_preset_applied(tr, preset)
    if target != "overlays/cpu-small":
        assert (ro.top_p, ro.max_groups_in_flight, ro.retriever_timeout_s) == (0.95, 128, 30.0)
        assert (ro.engine.dtype, ro.engine.gpu_memory_utilization) == ("bfloat16", 0.85)
        want_ma = "adaptive_code" if target == "overlays/gpu-ma" else "off"
        assert tr.regularizer.answer_weight_mode == want_ma


@pytest.mark.parametrize("target", TARGETS)
def test_gpu_trainer_shards_its_state_with_fsdp(rendered: dict, target: str) -> None:
    """16 ranks of full replicas would each hold 46 GiB of float32 weights, gradients and AdamW state of a
    3B policy plus an all-reduce buffer of all gradients; sharded, a rank holds 1/16 (docs/deploy.md)."""
    _, tr = _resolved(rendered[target], "Job", "llds-trainer", "trainer")
    assert tr.parallel == ("ddp" if target == "overlays/cpu-small" else "fsdp")
