"""The package layering, read from the sources: services never import each other, nothing below the
launcher imports the benchmarks, and benchmark code lives in ``llds_bench`` rather than the services."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SERVICES = {
    "llds_retriever": "services/retriever",
    "llds_rollout": "services/rollout",
    "llds_trainer": "services/trainer",
}
LOWER = {**SERVICES, "llds_proto": "proto", "llds_server": "services/common"}


def _imports(root: Path) -> dict[Path, set[str]]:
    found: dict[Path, set[str]] = {}
    for path in root.rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
        found[path] = names
    return found


def test_services_import_no_other_service_and_nothing_imports_the_benchmarks_but_the_launcher() -> None:
    bad = []
    for pkg, folder in LOWER.items():
        forbidden = {"llds", "llds_bench", *(set(SERVICES) - {pkg})}
        for path, names in _imports(REPO / folder / pkg).items():
            if hit := names & forbidden:
                bad.append(f"{path.relative_to(REPO)} imports {sorted(hit)}")
    assert not bad, bad


def test_benchmark_code_lives_in_llds_bench_not_in_the_service_packages() -> None:
    in_services = [
        str(p.relative_to(REPO))
        for folder in LOWER.values()
        for p in (REPO / folder).rglob("*.py")
        if "bench" in p.stem
    ]
    assert not in_services, f"benchmark modules inside service packages: {in_services}"
    assert {p.stem for p in (REPO / "benchmarks" / "llds_bench").glob("*.py")} >= {
        "retriever",
        "rollout",
        "trainer",
    }


def test_the_layout_check_is_live(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text(
        "import llds_bench.rollout\nfrom llds_trainer.core import Trainer\nfrom . import x\n"
    )
    assert _imports(tmp_path)[tmp_path / "m.py"] == {"llds_bench", "llds_trainer"}
