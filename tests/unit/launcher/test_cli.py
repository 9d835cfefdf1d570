"""The `llds` command routes every subcommand to its service entrypoint and rejects unknown ones."""

import subprocess
import sys

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
