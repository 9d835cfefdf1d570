"""The controlled study's statistics (llds.study) on per-question files written here: the design's
collapse, learning and holding definitions, the intervals and the paired tests."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from llds import study


def _write(folder: Path, name: str, ems: list[float], searches: float = 1.0) -> None:
    (folder / "questions").mkdir(parents=True, exist_ok=True)
    rows = [{"id": f"q{i}", "em": e, "f1": e, "searches": searches} for i, e in enumerate(ems)]
    (folder / "questions" / name).write_text("".join(json.dumps(r) + "\n" for r in rows))


def _ems(n_right: int, n: int = 20) -> list[float]:
    return [1.0] * n_right + [0.0] * (n - n_right)


def _study(folder: Path, planned: list[list[object]], results: list[dict[str, object]]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "study.json").write_text(json.dumps({"eval_steps": [10, 20, 30], "planned": planned,
                                                   "start": "s", "start_digest": "abc"}))  # fmt: skip
    (folder / "results.json").write_text(json.dumps(results))


def test_collapse_learning_and_holding_follow_the_declared_definitions(tmp_path: Path) -> None:
    _write(tmp_path, study.START, _ems(8))  # start EM 0.40
    # learns to 0.55, then falls below half of its best (0.25 < 0.275): collapsed from step 30
    for step, k in ((10, 11), (20, 9), (30, 5)):
        _write(tmp_path, f"grpo-s0-step{step}.jsonl", _ems(k))
    # stopped dead after step 12: steps 20 and 30 are dead checkpoints
    _write(tmp_path, "grpo-s1-step10.jsonl", _ems(8))
    # holds, learns; step 30 not evaluated yet
    _write(tmp_path, "grpo_llds-s0-step10.jsonl", _ems(10))
    _write(tmp_path, "grpo_llds-s0-step20.jsonl", _ems(10))
    # stops searching: collapsed although its EM is not below half
    _write(tmp_path, "grpo_llds-s1-step10.jsonl", _ems(7), searches=0.0)
    planned = [["grpo", 0], ["grpo", 1], ["grpo_llds", 0], ["grpo_llds", 1]]
    results = [{"arm": "grpo", "seed": 1, "stopped_dead_at": 12}]
    runs = {(r.arm, r.seed): r for r in study.build_runs(tmp_path, [10, 20, 30], [(a, s) for a, s in planned],  # type: ignore[misc]
                                                         results, 0.4)}  # fmt: skip
    g0, g1, l0, l1 = runs["grpo", 0], runs["grpo", 1], runs["grpo_llds", 0], runs["grpo_llds", 1]
    assert [c.collapsed for c in g0.checkpoints] == [False, False, True]
    assert g0.learned(0.4) and g0.collapsed and not g0.held(0.4)
    assert [c.em for c in g1.checkpoints] == [0.4, None, None]
    assert g1.collapsed and [c.em_or_dead for c in g1.checkpoints] == [0.4, 0.0, 0.0]
    assert (
        [c.step for c in l0.checkpoints] == [10, 20] and l0.learned(0.4) and l0.held(0.4) and not l0.collapsed
    )
    assert l1.collapsed and not l1.learned(0.4)


def test_exact_mcnemar_and_intervals() -> None:
    assert study.mcnemar_p(0, 0) == 1.0
    assert study.mcnemar_p(7, 28) == pytest.approx(2 * sum(math.comb(35, i) for i in range(8)) / 2**35)
    assert study.mcnemar_p(28, 7) == study.mcnemar_p(7, 28)
    m, lo, hi = study.t_interval([0.4, 0.5, 0.6])
    assert m == pytest.approx(0.5) and lo == pytest.approx(0.5 - 4.302653 * 0.1 / math.sqrt(3), rel=1e-5)
    assert study.t_interval([0.3]) == (0.3, 0.3, 0.3)
    lo, hi = study.clopper_pearson(0, 5)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 5))
    lo, hi = study.clopper_pearson(5, 5)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 5))


def test_paired_difference_pairs_by_seed_and_question() -> None:
    a = {0: {"q0": 1.0, "q1": 1.0, "q2": 0.0}, 1: {"q0": 1.0, "q1": 0.0, "q2": 0.0}, 7: {"q0": 1.0}}
    b = {0: {"q0": 0.0, "q1": 1.0, "q2": 0.0}, 1: {"q0": 0.0, "q1": 0.0, "q2": 1.0}}
    p = study.paired(a, b, draws=500)
    assert p is not None and p["seeds"] == 2 and p["pairs"] == 6  # seed 7 has no partner
    assert (p["only_a"], p["only_b"]) == (2, 1) and p["diff"] == pytest.approx(1 / 6)
    assert p["lo"] <= p["diff"] <= p["hi"]
    assert study.paired(a, {}, draws=10) is None
    same = study.paired(a, a, draws=50)
    assert same is not None and same["diff"] == same["lo"] == same["hi"] == 0.0 and same["p"] == 1.0


def test_the_section_regenerates_identically_from_the_files(tmp_path: Path) -> None:
    _write(tmp_path, study.START, _ems(8))
    for arm, ks in (("grpo", (11, 9, 5)), ("grpo_llds", (10, 10, 9))):
        for step, k in zip((10, 20, 30), ks, strict=True):
            _write(tmp_path, f"{arm}-s0-step{step}.jsonl", _ems(k))
    _study(tmp_path, [["grpo", 0], ["grpo_llds", 0]],
           [{"arm": "grpo", "seed": 0, "start_digest": "abc"}, {"arm": "grpo_llds", "seed": 0, "start_digest": "abc"}])  # fmt: skip
    (tmp_path / "lld").mkdir()
    (tmp_path / "lld" / "start.json").write_text(
        json.dumps({"first": 160, "count": 32, "logp_token": {"0": -1.0}})
    )
    (tmp_path / "lld" / "grpo-s0.json").write_text(
        json.dumps({"logp_token": {"10": -1.5, "20": -2.0, "30": -3.0}})
    )
    lines, figs = study.section(tmp_path, ["grpo", "grpo_llds"])
    text = "\n".join(lines)
    assert "| grpo | -0.500 [-0.500, -0.500] (n=1) | -1.000 [-1.000, -1.000] (n=1) | -2.000" in text
    assert "| grpo_llds | - | - | - |" in text
    assert "| grpo-s0 | 0.550 | 0.450 | 0.250 (c) | yes | yes | no |" in text
    assert "| grpo_llds-s0 | 0.500 | 0.500 | 0.450 | yes | no | yes |" in text
    assert "| grpo_llds | 30 | +0.200 [" in text  # 9 vs 5 right of 20, paired
    png = figs[0].read_bytes()
    again, _ = study.section(tmp_path, ["grpo", "grpo_llds"])
    assert again == lines and figs[0].read_bytes() == png


def test_an_exported_study_rebuilds_its_report_from_the_exported_files_alone(tmp_path: Path) -> None:
    """--export copies what --report-only reads; the report rebuilt from the copy is the original's."""
    from llds import experiment

    out = tmp_path / "out"
    _write(out, study.START, _ems(8))
    _write(out, "grpo-s0-step10.jsonl", _ems(11))
    (out / "logs").mkdir()
    (out / "logs" / "grpo-s0.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.25}) + "\n")
    (out / "study.json").write_text(json.dumps({"preset": "cpu-study", "steps": 10, "eval_limit": 20, "eval_steps": [10],
                                                "seeds": "0", "arms": "grpo", "planned": [["grpo", 0]],
                                                "stop_dead": 0, "start_digest": "abc", "trainer_set": []}))  # fmt: skip
    result = experiment.summarize("grpo", 0, [{"step": 1, "reward/mean": 0.25}]) | {"start_digest": "abc"}
    (out / "results.json").write_text(json.dumps([result]))
    assert experiment.main(["--report-only", "--out", str(out), "--export", str(tmp_path / "copy")]) == 0
    assert experiment.main(["--report-only", "--out", str(tmp_path / "copy")]) == 0
    a, b = (out / "EXPERIMENTS.md").read_text(), (tmp_path / "copy" / "EXPERIMENTS.md").read_text()
    assert a == b and "| grpo-s0 | 0.550 | yes | no | yes |" in a
    assert (tmp_path / "copy" / "study_em.png").read_bytes() == (out / "study_em.png").read_bytes()


STUDIES = sorted(
    p.parent for p in (Path(__file__).resolve().parents[3] / "docs" / "study").glob("*/study.json")
)


@pytest.mark.parametrize("folder", STUDIES, ids=[p.name for p in STUDIES])
def test_each_committed_study_regenerates_its_report_from_its_files(folder: Path, tmp_path: Path) -> None:
    """docs/study/<phase>/ holds the files a study's report is rebuilt from; `llds experiment lld
        --report-only` over a copy (without the report and figures) gives the committed EXPERIMENTS.md
    byte for byte and draws the figures again."""
    import shutil

    from llds import experiment

    copy = tmp_path / folder.name
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("*.md", "*.png"))
    assert experiment.main(["--report-only", "--out", str(copy)]) == 0
    assert (copy / "EXPERIMENTS.md").read_text() == (folder / "EXPERIMENTS.md").read_text()
    assert (copy / "study_em.png").stat().st_size > 10_000  # the figure is drawn from those files too
