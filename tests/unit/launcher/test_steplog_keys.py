"""Every step-record key the launcher reads (dashboard panels, ``llds report``, ``llds experiment``) and
every key the trainer exports as a gauge is one ``llds_proto.steplog`` defines: a key renamed on one
side only fails here, not as an empty chart."""

from __future__ import annotations

import pytest

from llds import experiment, report
from llds.dashboard.panels import HIDDEN_HISTORY, PANELS, H
from llds_proto import steplog
from llds_trainer.metrics import GAUGES

ASKED: dict[str, set[str]] = {
    "dashboard panels": {s for p in PANELS if p.source == H for s in p.series} | HIDDEN_HISTORY,
    "report figures": {k for fig in report.FIGURES for _, keys in fig.plots for k in keys},
    "report summary": set(report.SUMMARY_KEYS) | set(report.STEPPED),
    "experiment log and plots": set(experiment.LOG_KEYS) | {k for k, _ in experiment.SIGNALS},
    "trainer gauges": set(GAUGES),
}


@pytest.mark.parametrize("consumer", sorted(ASKED))
def test_every_key_read_is_a_trainer_key(consumer: str) -> None:
    asked = ASKED[consumer]
    assert asked, consumer
    unknown = sorted(asked - steplog.KEYS)
    assert not unknown, f"{consumer} reads keys the trainer's key module does not define: {unknown}"


def test_experiment_log_keys_keep_their_strings() -> None:
    # Committed compact logs (docs/experiment-lld/logs, docs/collapse-search/logs) use these.
    assert experiment.LOG_KEYS == [
        "step", "reward/mean", "reward/exact_match", "lld/correct_logp_token", "lld/fell_fraction_responses",
        "actor/entropy", "actor/grad_norm", "loss/llds", "lld/alarm", "lld/action", "llds/lambda",
        "rollout/valid_searches_mean", "data/uniform_skipped", "loss/kl", "actor/updates", "actor/skipped_updates",
        "perf/step_s", "perf/load1", "run/start_digest", "time/unix",
    ]  # fmt: skip
