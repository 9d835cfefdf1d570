"""yamllint over docker-compose.yml and every YAML file under deploy/, shellcheck over the scripts,
ruff-clean Python helpers are covered by `make lint`; each validator also shown to be live."""

from __future__ import annotations

from pathlib import Path

import pytest
from deploy_tools import COMPOSE_FILE, DEPLOY, REPO, SCRIPTS, run, tool

YAMLLINT_CONFIG = DEPLOY / "yamllint.yaml"
SHELL_SCRIPTS = sorted(SCRIPTS.glob("*.sh"))


def test_yamllint_clean() -> None:
    res = run(
        [tool("yamllint"), "-c", str(YAMLLINT_CONFIG), "-f", "parsable", str(COMPOSE_FILE), str(DEPLOY)]
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_yamllint_is_live(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("a: 1\na: 2\n")
    res = run([tool("yamllint"), "-c", str(YAMLLINT_CONFIG), str(bad)])
    assert res.returncode != 0 and "duplication" in res.stdout


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_clean(script: Path) -> None:
    res = run([tool("shellcheck"), "--external-sources", "--severity=style", str(script.relative_to(REPO))])
    assert res.returncode == 0, res.stdout + res.stderr


@pytest.mark.parametrize("script", SHELL_SCRIPTS, ids=lambda p: p.name)
def test_scripts_are_strict_executable_and_documented(script: Path) -> None:
    lines = script.read_text().splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert lines[1].startswith("# "), "open with a comment saying what the script does"
    if script.name != "_common.sh":
        assert "set -euo pipefail" in lines
    assert script.stat().st_mode & 0o111, f"chmod +x {script.name}"


def test_shellcheck_is_live(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sh"
    bad.write_text("#!/usr/bin/env bash\nrm -rf $1/*\n")
    res = run([tool("shellcheck"), str(bad)])
    assert res.returncode != 0 and "SC2086" in res.stdout
