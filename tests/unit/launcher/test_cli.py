"""The `llds` command routes every subcommand to its service entrypoint and rejects unknown ones."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llds import cli


def test_every_route_names_an_existing_module_file() -> None:
    import importlib.util

    for path, (module, _func, _) in cli.ROUTES.items():
        assert importlib.util.find_spec(module) is not None, f"llds {' '.join(path)} -> {module} missing"


def test_routing_keeps_the_verb_where_needed() -> None:
    func, rest = cli.resolve(["world", "build", "--out", "x"])
    assert func.__module__ == "llds.world" and rest == ["build", "--out", "x"]


def test_unknown_command_is_a_usage_error() -> None:
    res = subprocess.run([sys.executable, "-m", "llds.cli", "bogus"], capture_output=True, text=True)
    assert res.returncode == 2 and "invalid choice: 'bogus'" in res.stderr


@pytest.mark.parametrize("argv", [["--help"], ["up", "--help"]])
def test_help_is_instant_and_imports_no_torch(argv: list[str]) -> None:
    code = (
        "import sys; from llds import cli\n"
        f"try:\n    cli.main({argv!r})\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch imported for --help'\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_up_rejects_bad_values_with_a_message() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "llds.cli", "up", "--steps", "-1"], capture_output=True, text=True
    )
    assert res.returncode == 2 and "steps" in res.stderr


class _Exec(Exception):
    """Raised by the fake execv: the process would have been replaced."""


def _reexec_target(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], has_vllm: bool = False
) -> list[str] | None:
    """What _maybe_reexec would exec for argv (None: it runs here), with vLLM absent from this env."""
    real = importlib.util.find_spec
    monkeypatch.setattr(
        cli.importlib.util,
        "find_spec",
        lambda name, *a: object() if has_vllm else None if name == "vllm" else real(name, *a),
    )
    monkeypatch.setenv("LLDS_VLLM_PYTHON", "/opt/vllm/bin/python")
    monkeypatch.delenv("LLDS_VLLM_REEXEC", raising=False)

    def fake_execv(path: str, args: list[str]) -> None:
        raise _Exec(args)

    monkeypatch.setattr(cli.os, "execv", fake_execv)
    try:
        cli._maybe_reexec(argv)
    except _Exec as e:
        return list(e.args[0])
    return None


def test_engine_commands_move_to_the_vllm_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["rollout", "serve", "--model", "m"]
    assert _reexec_target(monkeypatch, argv) == ["/opt/vllm/bin/python", "-m", "llds.cli", *argv]
    assert os.environ["LLDS_VLLM_REEXEC"] == "1"  # once: the child does not re-exec again
    assert _reexec_target(monkeypatch, ["answer", "q"]) is not None
    assert _reexec_target(monkeypatch, ["bench", "rollout"]) is not None


@pytest.mark.parametrize(
    "argv",
    [["trainer", "run"], ["up"], ["rollout", "serve", "--engine", "transformers"],
     ["answer", "--engine=transformers", "q"], ["rollout", "serve", "--engine.type", "transformers"],
     ["rollout", "serve", "--engine.type=transformers"], ["answer", "--set", "engine.type=transformers", "q"]],
)  # fmt: skip
def test_other_commands_and_the_light_backend_stay(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> None:
    assert _reexec_target(monkeypatch, argv) is None


def test_no_reexec_when_vllm_is_here_or_already_done(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _reexec_target(monkeypatch, ["rollout", "serve"], has_vllm=True) is None
    monkeypatch.setenv("LLDS_VLLM_REEXEC", "1")
    cli._maybe_reexec(["rollout", "serve"])  # execv is the fake still: it would raise


def test_vllm_python_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(cli.importlib.util, "find_spec", lambda n, *a: None if n == "vllm" else real(n, *a))
    monkeypatch.setenv("LLDS_VLLM_PYTHON", "/x/python")
    assert cli.vllm_python() == "/x/python"
    monkeypatch.delenv("LLDS_VLLM_PYTHON")
    monkeypatch.setattr(cli, "REPO_ROOT", tmp_path)
    assert cli.vllm_python() is None
    (tmp_path / ".venv-vllm" / "bin").mkdir(parents=True)
    (tmp_path / ".venv-vllm" / "bin" / "python").touch()
    assert cli.vllm_python() == str(tmp_path / ".venv-vllm" / "bin" / "python")
