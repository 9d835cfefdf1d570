"""Every container this project builds runs a real entrypoint: an ``llds`` subcommand the launcher's
parser knows (``llds.cli.build_parser()``), a runnable ``python -m`` module, torchrun over one of
those, or a script that exists in deploy/scripts; a service command's flags parse with that
service's own parser (``deploy_tools.SERVICE_PARSERS``). Checked for docker-compose.yml with the CPU
override, the Kubernetes manifests, the Dockerfiles' default commands and the scripts' llds calls."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml
from deploy_tools import (
    DOCKERFILES,
    K8S,
    OUR_IMAGES,
    SCRIPTS,
    compose_services,
    containers,
    entrypoint_error,
)


def _our_services() -> dict[str, dict]:
    services = compose_services()
    ours = {n: s for n, s in services.items() if OUR_IMAGES.match(str(s.get("image", "")))}
    assert {"retriever", "rollout", "trainer", "dashboard", "rollout-cpu", "trainer-cpu"} <= set(ours)
    return ours


@pytest.mark.parametrize("name", sorted(_our_services()))
def test_compose_service_command_is_a_real_entrypoint(name: str) -> None:
    svc = _our_services()[name]
    command = svc.get("command")
    assert isinstance(command, list) and command, f"{name}: give an explicit exec-form command"
    assert entrypoint_error(command) is None, f"{name}: {entrypoint_error(command)}"


def test_entrypoint_check_rejects_unknown_commands() -> None:
    assert entrypoint_error(["llds", "rollout", "serve", "--port", "8001"]) is None
    assert entrypoint_error(["llds", "rollout", "nonexistent"]) is not None
    assert entrypoint_error(["llds", "nonexistent"]) is not None
    assert entrypoint_error(["python", "-m", "no_such_module_xyz"]) is not None
    assert entrypoint_error(["torchrun", "--nnodes=2", "--no-python", "llds", "trainer", "run"]) is None
    assert entrypoint_error(["torchrun", "--nnodes=2", "train.py"]) is not None
    assert entrypoint_error(["bash", "/opt/llds/scripts/no_such_script.sh"]) is not None
    assert entrypoint_error(["vllm", "serve", "model"]) is not None
    # a service's own flags are judged by that service's parser
    assert entrypoint_error(["llds", "rollout", "serve", "--no-such-flag", "1"]) is not None
    assert entrypoint_error(["llds", "retriever", "serve", "--port", "eighty"]) is not None
    assert (
        entrypoint_error(["python", "-m", "llds_trainer", "--notify-url", "http://r:1", "--no-resume"])
        is None
    )
    assert entrypoint_error(["torchrun", "--nnodes=1", "-m", "llds_trainer", "--bogus"]) is not None


def _k8s_commands() -> list[tuple[str, list[str]]]:
    found = []
    for path in sorted(K8S.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict):
                continue
            for c in containers(doc):
                image = str(c.get("image", ""))
                if "command" in c and (not image or OUR_IMAGES.match(image)):
                    argv = [*c["command"], *c.get("args", [])]
                    found.append((f"{path.relative_to(K8S)}:{c['name']}", argv))
    return found


@pytest.mark.parametrize(("where", "argv"), _k8s_commands(), ids=[w for w, _ in _k8s_commands()])
def test_k8s_container_command_is_a_real_entrypoint(where: str, argv: list[str]) -> None:
    assert entrypoint_error(argv) is None, f"{where}: {entrypoint_error(argv)}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfile_default_command_is_a_real_entrypoint(dockerfile: Path) -> None:
    text = dockerfile.read_text().replace("\\\n", " ")
    cmds = re.findall(r"^CMD\s+(\[.*\])\s*$", text, flags=re.MULTILINE)
    assert cmds, f"{dockerfile.name}: no exec-form CMD"
    argv = json.loads(cmds[-1])
    assert entrypoint_error(argv) is None, f"{dockerfile.name}: {entrypoint_error(argv)}"


def _script_llds_calls() -> list[tuple[str, list[str]]]:
    calls = []
    for script in sorted(SCRIPTS.glob("*.sh")):
        for line in script.read_text().splitlines():
            stripped = line.strip()
            for prefix in ("llds ", "if llds ", "if ! llds ", "python3 -m "):
                if stripped.startswith(prefix):
                    cmd = stripped[len(prefix) :].split(">")[0].rstrip("\\ ;")
                    head = ["llds"] if "llds" in prefix else ["python3", "-m"]
                    calls.append((f"{script.name}: {stripped[:60]}", [*head, *shlex.split(cmd)]))
    return calls


def test_scripts_call_llds() -> None:
    assert len(_script_llds_calls()) >= 5, _script_llds_calls()


@pytest.mark.parametrize(("where", "argv"), _script_llds_calls(), ids=[w for w, _ in _script_llds_calls()])
def test_script_llds_call_is_a_real_subcommand(where: str, argv: list[str]) -> None:
    assert entrypoint_error(argv) is None, f"{where}: {entrypoint_error(argv)}"


def test_routed_modules_of_deploy_commands_exist() -> None:
    """The launcher routes each subcommand used by a deployment to a module that is present."""
    import importlib.util

    from llds.cli import ROUTES

    used = {("retriever", "serve"), ("rollout", "serve"), ("trainer", "run"), ("dashboard", "serve"),
            ("index", "build"), ("index", "info"), ("world", "build"), ("start", "path"), ("assets",), ("up",)}  # fmt: skip
    missing = []
    for path in sorted(used):
        module = ROUTES[path][0]
        if importlib.util.find_spec(module) is None:
            missing.append(f"llds {' '.join(path)} -> {module}")
    assert not missing, "routed modules missing: " + ", ".join(missing)
