"""Every ``LLDS_<SERVICE>_<FIELD>`` variable the deployments set names a real field of that
service's config class, and every config file they pass exists in configs/: a typo here would be
silently ignored by pydantic-settings and the service would run on its defaults."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import yaml
from deploy_tools import K8S, REPO, compose_services, containers, read_env_file

CONFIG_CLASSES = {
    "ROLLOUT": ("llds_rollout.config", "RolloutSettings"),
    "TRAINER": ("llds_trainer.config", "TrainerConfig"),
    "RETRIEVER": ("llds_retriever.config", "RetrieverConfig"),
    "DASHBOARD": ("llds.dashboard.config", "DashboardConfig"),
    "UP": ("llds.up", "UpConfig"),
}
_SERVICE_VAR = re.compile(r"^LLDS_(ROLLOUT|TRAINER|RETRIEVER|DASHBOARD|UP)_([A-Z0-9_]+)$")


def _env_names() -> list[tuple[str, str]]:
    found = []
    for name, svc in compose_services().items():
        env = svc.get("environment") or {}
        keys = env if isinstance(env, dict) else [e.split("=", 1)[0] for e in env]
        found += [(f"compose:{name}", k) for k in keys]
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict):
                for c in containers(doc):
                    found += [
                        (f"k8s:{path.relative_to(K8S)}:{c['name']}", e["name"]) for e in c.get("env", [])
                    ]
    return [(w, k) for w, k in found if _SERVICE_VAR.match(k)]


@pytest.mark.parametrize(("where", "var"), _env_names(), ids=[f"{w}:{k}" for w, k in _env_names()])
def test_service_env_var_names_a_config_field(where: str, var: str) -> None:
    m = _SERVICE_VAR.match(var)
    assert m is not None
    module, cls_name = CONFIG_CLASSES[m.group(1)]
    cls = getattr(importlib.import_module(module), cls_name)
    assert m.group(2).lower() in cls.model_fields, f"{where}: {var} is not a field of {cls_name}"


def test_env_names_found() -> None:
    names = {k for _, k in _env_names()}
    assert {"LLDS_ROLLOUT_PUBLIC_URL", "LLDS_ROLLOUT_REDIS_URL", "LLDS_TRAINER_REDIS_URL"} <= names


def _config_refs() -> set[str]:
    refs = set()
    texts = [
        p.read_text()
        for p in [REPO / "docker-compose.yml", *REPO.glob("deploy/**/*.y*ml"), *REPO.glob("deploy/docker/*")]
    ]
    for text in texts:
        refs |= set(re.findall(r"/opt/llds/configs/([A-Za-z0-9_.-]+\.toml)", text))
    # Presets named by a variable: compose's defaults, env.example's values, the k8s containers' env.
    refs |= set(re.findall(r"\$\{[A-Z_]+_CONFIG_FILE:-([^}]+)\}", (REPO / "docker-compose.yml").read_text()))
    refs |= {v for k, v in read_env_file().items() if k.endswith("_CONFIG_FILE")}
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict):
                for c in containers(doc):
                    refs |= {e["value"] for e in c.get("env", []) if e["name"].endswith("_CONFIG_FILE")}
    return refs


def test_presets_named_by_variables_are_found() -> None:
    assert {"rollout_search_r1.toml", "trainer_search_r1.toml", "trainer_search_r1_ma.toml"} <= _config_refs()


@pytest.mark.parametrize("name", sorted(_config_refs()))
def test_referenced_config_file_exists(name: str) -> None:
    assert (REPO / "configs" / name).is_file(), f"configs/{name} is referenced by a deployment but missing"


def test_trainer_presets_load(tmp_path: Path) -> None:
    from llds_trainer.config import TrainerConfig

    for name in sorted(_config_refs()):
        if name.startswith("trainer_"):
            TrainerConfig.load(REPO / "configs" / name, {"model": str(tmp_path)})
