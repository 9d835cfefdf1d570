"""Helpers for the deployment tests: repository paths, validator binaries, compose interpolation,
kustomize rendering and the check that a container command is a real entrypoint of this project."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
DEPLOY = REPO / "deploy"
COMPOSE_FILE = REPO / "docker-compose.yml"
COMPOSE_CPU = DEPLOY / "compose.cpu.yml"
ENV_EXAMPLE = DEPLOY / "env.example"
K8S = DEPLOY / "k8s"
K8S_OVERLAYS = ("gpu", "gpu-ma", "cpu-small")
SCRIPTS = DEPLOY / "scripts"
DOCKERFILES = sorted((DEPLOY / "docker").glob("*.Dockerfile"))
OUR_IMAGES = re.compile(r"^llds-[a-z]+(:|$)")
"""Images built from this repository; every other image runs its own, third-party command."""

INSTALL_HINTS = {
    "docker-compose": "apt-get install -y docker-compose (Debian's 1.29.2)",
    "kubectl": "apt-get install -y kubectl (or a kustomize binary on PATH)",
}


def tool(name: str) -> str:
    """Path of a validator binary: the test environment's bin folder first, then PATH; skip if absent."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        hint = INSTALL_HINTS.get(name, f"pip install the dev extra (provides {name})")
        pytest.skip(f"{name} is not installed here; install it with: {hint}")
    return found


def run(
    argv: list[str], cwd: Path = REPO, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a validator; the caller asserts on the result."""
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def read_env_file(path: Path = ENV_EXAMPLE) -> dict[str, str]:
    """KEY=VALUE lines of an env file (comments and blanks skipped)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


_VAR = re.compile(r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


def interpolate(value: Any, env: dict[str, str]) -> Any:
    """Compose-style ``${VAR}``, ``${VAR:-default}``, ``${VAR:?error}`` and ``$$`` substitution."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name, op, arg = m.group("name"), m.group("op"), m.group("arg")
        got = env.get(name)
        if op and op.endswith("?") and not got:
            raise KeyError(f"{name}: {arg}")
        if op and op.endswith("-") and not got:
            return arg
        return got or ""

    return _VAR.sub(sub, value)


def compose_services(files: tuple[Path, ...] = (COMPOSE_FILE, COMPOSE_CPU)) -> dict[str, dict[str, Any]]:
    """Services of the given compose files, merged shallowly per key and interpolated with env.example."""
    env = read_env_file()
    merged: dict[str, dict[str, Any]] = {}
    for path in files:
        data = yaml.safe_load(path.read_text())
        for name, svc in (data.get("services") or {}).items():
            merged.setdefault(name, {}).update(svc or {})
    return {name: interpolate(svc, env) for name, svc in merged.items()}


def compose_config(*files: Path, profiles: tuple[str, ...] = ()) -> dict[str, Any]:
    """The configuration docker-compose resolves (validated by it) with deploy/env.example."""
    argv = [tool("docker-compose"), "--env-file", str(ENV_EXAMPLE)]
    for f in files:
        argv += ["-f", str(f)]
    for p in profiles:
        argv += ["--profile", p]
    res = run([*argv, "config"])
    assert res.returncode == 0, res.stderr
    return yaml.safe_load(res.stdout)


def kustomize_argv() -> list[str]:
    """``kubectl kustomize`` or a standalone ``kustomize build``, whichever is installed."""
    if shutil.which("kustomize"):
        return [shutil.which("kustomize") or "kustomize", "build"]
    return [tool("kubectl"), "kustomize"]


def render_kustomize(target: str, workdir: Path) -> list[dict[str, Any]]:
    """Render ``deploy/k8s/<target>`` from a copy of deploy/k8s with secrets.env made from the example."""
    copy = workdir / "k8s"
    shutil.copytree(K8S, copy)
    shutil.copy(copy / "base" / "secrets.env.example", copy / "base" / "secrets.env")
    res = run([*kustomize_argv(), str(copy / target)], env={**os.environ, "HOME": str(workdir)})
    assert res.returncode == 0, f"kustomize {target} failed:\n{res.stderr}"
    return [d for d in yaml.safe_load_all(res.stdout) if d]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The pod spec of a workload (Deployment, StatefulSet, Job), None for other kinds."""
    if obj.get("kind") in {"Deployment", "StatefulSet", "Job", "DaemonSet"}:
        return obj["spec"]["template"]["spec"]
    return None


def containers(obj: dict[str, Any], init: bool = True) -> Iterator[dict[str, Any]]:
    """Containers (and init containers) of a workload or of a partial strategic-merge patch."""
    spec = pod_spec(obj) if "kind" in obj else None
    if spec is None:
        spec = ((obj.get("spec") or {}).get("template") or {}).get("spec") or {}
    yield from spec.get("containers") or []
    if init:
        yield from spec.get("initContainers") or []


# ------------------------------------------------------------------ real entrypoints


def _module_runnable(module: str) -> bool:
    """True if ``python -m module`` can run: a module, or a package with ``__main__``."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:
        return False
    if spec is None:
        return False
    if spec.submodule_search_locations is not None:
        return importlib.util.find_spec(f"{module}.__main__") is not None
    return True


SERVICE_PARSERS: dict[tuple[str, ...], tuple[str, str]] = {
    ("up",): ("llds.up", "build_parser"),
    ("answer",): ("llds_rollout.cli", "answer_parser"),
    ("retriever", "serve"): ("llds_retriever.cli", "serve_parser"),
    ("rollout", "serve"): ("llds_rollout.cli", "serve_parser"),
    ("trainer", "run"): ("llds_trainer.cli", "build_parser"),
    ("dashboard", "serve"): ("llds.dashboard.cli", "build_parser"),
}
"""The commands whose flags come from a settings class, and the function building each one's parser."""
MODULE_COMMANDS = {"llds_trainer": ("trainer", "run"), "llds_retriever": ("retriever", "serve")}
"""``python -m MODULE`` (and ``torchrun -m MODULE``) that take a command's flags as they are."""


def flags_error(command: tuple[str, ...], flags: list[str]) -> str | None:
    """Why the parser of ``command`` (a key of :data:`SERVICE_PARSERS`) rejects ``flags``, or None."""
    import contextlib
    import io

    module, func = SERVICE_PARSERS[command]
    parser = getattr(importlib.import_module(module), func)()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            parser.parse_args(flags)
    except SystemExit:
        return f"`llds {' '.join(command)}` rejects {flags}: {err.getvalue().strip().splitlines()[-1]}"
    return None


def _module_error(module: str, rest: list[str]) -> str | None:
    if not _module_runnable(module):
        return f"`-m {module}`: module not runnable"
    if module in MODULE_COMMANDS:
        return flags_error(MODULE_COMMANDS[module], rest)
    if module == "llds_rollout" and rest[:1] in (["serve"], ["answer"]):
        return flags_error(("rollout", "serve") if rest[0] == "serve" else ("answer",), rest[1:])
    return None


def entrypoint_error(argv: list[str]) -> str | None:
    """Why ``argv`` is not a real entrypoint of this project, or None if it is one.

    Accepted: ``llds <subcommand> ...`` that the launcher's parser knows; ``python[3] -m MODULE``
    with MODULE runnable; ``torchrun [opts] -m MODULE`` or ``torchrun [opts] --no-python PROGRAM``
    with PROGRAM itself accepted; ``bash /opt/llds/scripts/NAME.sh`` with deploy/scripts/NAME.sh
    present (the images copy deploy/scripts to /opt/llds/scripts). The flags of a command in
    :data:`SERVICE_PARSERS` (or of a module in :data:`MODULE_COMMANDS`) must parse with its parser.
    """
    if not argv:
        return "empty command"
    prog, rest = Path(argv[0]).name, list(argv[1:])
    if prog == "llds":
        from llds.cli import build_parser

        # parse_known_args: the leaves hand their own flags on to the service (argparse.REMAINDER
        # does not take a leading --flag), so only the subcommand path is judged here.
        try:
            build_parser().parse_known_args(rest)
        except SystemExit:
            return f"`llds {' '.join(rest[:2])}` is not a subcommand of the llds launcher"
        for command in SERVICE_PARSERS:
            if tuple(rest[: len(command)]) == command:
                return flags_error(command, rest[len(command) :])
        return None
    if prog in {"python", "python3"}:
        if len(rest) >= 2 and rest[0] == "-m":
            return _module_error(rest[1], rest[2:])
        return f"python without -m MODULE: {argv}"
    if prog == "torchrun":
        for i, tok in enumerate(rest):
            if tok == "-m":
                mod = rest[i + 1] if i + 1 < len(rest) else ""
                return _module_error(mod, rest[i + 2 :])
            if tok.startswith("-"):
                continue
            if "--no-python" not in rest[:i]:
                return f"torchrun runs a script file ({tok}) instead of a module or the llds launcher"
            return entrypoint_error(rest[i:])
        return "torchrun without a program"
    if prog in {"bash", "sh"} and rest and rest[0].startswith("/opt/llds/scripts/"):
        script = SCRIPTS / Path(rest[0]).name
        return None if script.is_file() else f"{rest[0]}: no deploy/scripts/{script.name} in the repository"
    return f"not an llds entrypoint: {argv}"


# ------------------------------------------------------------------ what a service resolves

IMAGE_CONFIGS = "/opt/llds/configs/"
"""Where the images (and compose's bind mount) put configs/."""
SERVICE_CLASSES = {
    ("rollout", "serve"): ("llds_rollout.config", "RolloutSettings"),
    ("trainer", "run"): ("llds_trainer.config", "TrainerConfig"),
}
PLACEHOLDER = "change-me"
"""How deploy/env.example and secrets.env.example begin each secret."""
_K8S_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def k8s_env(container: dict[str, Any]) -> dict[str, str]:
    """A container's literal environment (``valueFrom`` entries, secrets and pod fields, left out)."""
    return {e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e}


def expand_k8s(argv: list[str], env: dict[str, str]) -> list[str]:
    """``$(VAR)`` in command and args replaced as the kubelet does from the container's environment (a
    reference to an undefined variable stays as written)."""
    return [_K8S_VAR.sub(lambda m: env.get(m.group(1), m.group(0)), a) for a in argv]


def service_command(argv: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """(the service command of :data:`SERVICE_CLASSES`, its flags) of a container's argv: ``llds rollout
    serve ...``, ``llds trainer run ...``, ``torchrun ... -m llds_trainer ...``, ``python -m llds_trainer``."""
    prog = Path(argv[0]).name
    if prog == "llds":
        for command in SERVICE_CLASSES:
            if tuple(argv[1 : 1 + len(command)]) == command:
                return command, argv[1 + len(command) :]
    if "-m" in argv and prog in {"torchrun", "python", "python3"}:
        i = argv.index("-m")
        if argv[i + 1] in MODULE_COMMANDS and MODULE_COMMANDS[argv[i + 1]] in SERVICE_CLASSES:
            return MODULE_COMMANDS[argv[i + 1]], argv[i + 2 :]
    raise ValueError(f"not a rollout or trainer command: {argv}")


def preset_path(argv: list[str]) -> Path:
    """The configs/ file the ``--config`` of a service's argv names inside the image."""
    if "--config" not in argv:
        raise AssertionError(f"no --config preset: {argv}")
    inside = argv[argv.index("--config") + 1]
    assert inside.startswith(IMAGE_CONFIGS), f"--config {inside} is not under {IMAGE_CONFIGS}"
    return REPO / "configs" / inside.removeprefix(IMAGE_CONFIGS)


def resolved_settings(argv: list[str], env: dict[str, str]) -> Any:
    """The settings the rollout or trainer of ``argv`` resolves inside its container: its flags parsed by
    its own parser, ``--config`` read from configs/, the container's ``LLDS_*`` environment (and none of
    this process's; the example env file's placeholder secrets, which the services refuse, replaced)."""
    from llds_server.cli import settings_overrides

    env = {k: v.replace(PLACEHOLDER, "set-in-the-test") for k, v in env.items()}
    command, flags = service_command(argv)
    module, func = SERVICE_PARSERS[command]
    args = getattr(importlib.import_module(module), func)().parse_args(flags)
    cls_module, cls_name = SERVICE_CLASSES[command]
    cls = getattr(importlib.import_module(cls_module), cls_name)
    saved = {k: v for k, v in os.environ.items() if k.startswith("LLDS_")}
    try:
        for k in saved:
            del os.environ[k]
        os.environ.update({k: v for k, v in env.items() if k.startswith("LLDS_")})
        return cls.load(preset_path(flags), settings_overrides(args, cls))
    finally:
        for k in [k for k in os.environ if k.startswith("LLDS_")]:
            del os.environ[k]
        os.environ.update(saved)


def assert_preset_applied(settings: Any, preset: Path, skip: tuple[str, ...] = ()) -> None:
    """Every setting ``preset`` states is the value ``settings`` resolved (but the dotted keys in ``skip``)."""

    def leaves(d: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
        for k, v in d.items():
            if isinstance(v, dict):
                yield from leaves(v, f"{prefix}{k}.")
            else:
                yield f"{prefix}{k}", v

    dumped = settings.model_dump(mode="json")
    for key, want in leaves(tomllib.loads(preset.read_text())):
        if key in skip:
            continue
        got: Any = dumped
        for part in key.split("."):
            got = got[part]
        assert got == (list(want) if isinstance(want, tuple) else want), (
            f"{preset.name}: {key} = {got}, not {want}"
        )
