"""Dockerfiles: hadolint clean at every level, multi-stage, pinned base images, a non-root user,
the vLLM-based images on the official image pinned to vllm==0.33.0, a .dockerignore that keeps
secrets and local state out of the build context, and the dependency-list helper they run."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_tools import DEPLOY, DOCKERFILES, REPO, run, tool

GPU_IMAGES = ("rollout.Dockerfile", "trainer.Dockerfile")


def test_every_service_has_a_dockerfile() -> None:
    names = {p.name for p in DOCKERFILES}
    assert {"retriever.Dockerfile", "rollout.Dockerfile", "trainer.Dockerfile", "dashboard.Dockerfile",
            "cpu.Dockerfile"} <= names  # fmt: skip


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    res = run([tool("hadolint"), "--no-color", "--failure-threshold", "style", str(dockerfile)])
    assert res.returncode == 0, res.stdout + res.stderr


def test_hadolint_is_live(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    res = run([tool("hadolint"), "--no-color", str(bad)])
    assert res.returncode != 0 and "DL3007" in res.stdout


def _args(text: str) -> dict[str, str]:
    return dict(re.findall(r"^ARG\s+(\w+)=(\S+)", text, flags=re.MULTILINE))


def _from_images(text: str) -> list[str]:
    args = _args(text)
    images = []
    for ref in re.findall(r"^FROM\s+(\S+)", text, flags=re.MULTILINE):
        images.append(re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], ref))
    return images


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_multi_stage_with_pinned_bases(dockerfile: Path) -> None:
    images = _from_images(dockerfile.read_text())
    assert len(images) >= 2, "build in one stage, run in another"
    for image in images:
        name, _, tag = image.rpartition(":")
        assert name and tag and tag != "latest" and re.search(r"\d", tag), f"unpinned base image {image}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_runs_as_non_root(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    users = re.findall(r"^USER\s+(\S+)", text, flags=re.MULTILINE)
    assert users, "no USER: the image would run as root"
    uid = re.sub(r"\$\{(\w+)\}", lambda m: _args(text)[m.group(1)], users[-1]).split(":")[0]
    assert uid.isdigit() and int(uid) >= 1000, users[-1]


@pytest.mark.parametrize("name", GPU_IMAGES)
def test_gpu_images_build_on_vllm_matching_the_pin(name: str) -> None:
    text = (DEPLOY / "docker" / name).read_text()
    assert _from_images(text)[-1] == "vllm/vllm-openai:v0.33.0"
    assert "ENTRYPOINT []" in text, "reset vLLM's `vllm serve` entrypoint"
    assert "--exclude torch" in text, "keep the image's CUDA torch"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_copied_sources_exist(dockerfile: Path) -> None:
    for src in re.findall(r"^COPY\s+(?!--from)(.+)\s+\S+$", dockerfile.read_text(), flags=re.MULTILINE):
        for part in src.split():
            assert (REPO / part).exists(), f"{dockerfile.name}: COPY {part}: not in the repository"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_copy_every_package_root_the_wheel_is_built_from(dockerfile: Path) -> None:
    """A package root pyproject names (``[tool.setuptools.packages.find] where``) and an image leaves out
    builds a wheel without its packages: ``llds bench`` would fail there with an import error."""
    import tomllib

    roots = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"][
        "where"
    ]
    copied = set()
    for src in re.findall(r"^COPY\s+(?!--from)(.+)\s+\S+$", dockerfile.read_text(), flags=re.MULTILINE):
        copied |= set(src.split())
    missing = [r for r in roots if r not in copied and r.split("/")[0] not in copied]
    assert not missing, f"{dockerfile.name} builds the project without {missing}"


def test_dockerignore_keeps_secrets_and_local_state_out() -> None:
    lines = set((REPO / ".dockerignore").read_text().split())
    for entry in (".git", ".venv", ".env", "runs", "**/__pycache__", "deploy/k8s"):
        assert entry in lines, entry
    for needed in ("pyproject.toml", "README.md", "proto", "services", "launcher", "benchmarks", "configs"):
        assert needed not in lines, f"{needed} is installed by the images"


def test_requirements_helper_drops_only_excluded() -> None:
    res = subprocess.run(
        [sys.executable, str(DEPLOY / "docker" / "requirements.py"), "--pyproject", str(REPO / "pyproject.toml"),
         "--exclude", "torch", "--exclude", "Faiss_CPU"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    names = {re.split(r"[<>=!~ \[;]", line, maxsplit=1)[0].lower() for line in res.stdout.splitlines()}
    assert "torch" not in names and "faiss-cpu" not in names
    assert {"transformers", "fastapi", "redis"} <= names
