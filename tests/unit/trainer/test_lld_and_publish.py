"""LLD alarm rule, weight publishing layout, stale-group policy."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from llds_trainer.lld import LLDMonitor, slope
from llds_trainer.publish import MARKER, gc_versions, newest_published, publish_folder, sha256_file


def test_slope_least_squares() -> None:
    assert slope([1.0, 2.0]) is None
    assert slope([0.0, -1.0, -2.0, -3.0]) == pytest.approx(-1.0)
    assert slope([1.0, 3.0, 2.0]) == pytest.approx(0.5)


def test_alarm_escalates_ok_warning_alarm_and_recovers() -> None:
    m = LLDMonitor(window=5, persist=3, fell_fraction=0.5, spike_factor=3.0)
    states = []
    for i in range(6):  # correct-response likelihood falling, most correct responses displaced
        m.update(-1.0 - 0.1 * i, 0.8, 2.0, 1.0)
        states.append(m.state)
    assert states == ["ok", "ok", "ok", "ok", "warning", "warning"]
    out = m.update(-1.7, 0.8, 2.0, 5.0)  # gradient-norm spike on top of the warning
    assert m.state == "alarm" and out["lld/alarm"] == 2.0
    for v in (-1.0, -0.5, 0.0, 0.5):  # likelihood rising again
        m.update(v, 0.2, 2.0, 1.0)
    assert m.state == "ok"


def test_falling_likelihood_without_displacement_is_not_a_warning() -> None:
    m = LLDMonitor(window=5, persist=2)
    for i in range(8):
        m.update(-1.0 - 0.1 * i, 0.1, 2.0, 1.0)  # few responses fell, and that fraction is flat
    assert m.state == "ok"


def test_a_step_without_correct_responses_holds_the_streak() -> None:
    """A collapsing run has steps with no correct response (no signal): they neither count towards the
    warning nor reset it, so the alarm still fires through them."""
    m = LLDMonitor(window=5, persist=3)
    for v in (-0.1, -0.2, -0.3):
        m.update(v, 0.9, 0.5, 1.0)
    assert (m.streak, m.state) == (1, "ok")
    m.update(None, None, 0.8, 1.0)
    m.update(None, None, 0.9, 1.0)
    assert (m.streak, m.state) == (1, "ok")
    m.update(-0.5, 0.9, 0.9, 1.0)
    m.update(-0.6, 1.0, 0.9, 1.0)
    assert (m.streak, m.state) == (3, "warning")
    m.update(None, None, 0.9, 1.0)
    assert m.state == "warning"  # held, not cleared, by a step with nothing to measure
    m.update(-0.1, 0.0, 0.9, 1.0)  # a measured step that is not displaced clears it
    assert (m.streak, m.state) == (0, "ok")


def test_monitor_state_round_trips() -> None:
    m = LLDMonitor()
    for i in range(4):
        m.update(-float(i), 0.9, 1.0, 1.0)
    n = LLDMonitor()
    n.load_state_dict(json.loads(json.dumps(m.state_dict())))
    assert n.state_dict() == m.state_dict()
    # The histories stay bounded by the window, also when resuming a run that kept more.
    for i in range(30):
        m.update(-float(i), 0.9, 1.0, 1.0)
    assert all(len(v) == m.window for k, v in m.state_dict().items() if isinstance(v, list))
    small = LLDMonitor(window=4)
    small.load_state_dict(m.state_dict())
    assert all(len(v) == 4 for k, v in small.state_dict().items() if isinstance(v, list))
    assert small.correct_logp[-1] == -29.0


def test_publish_writes_marker_last_and_gcs(tiny_model_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    for v in (1, 2, 3):
        publish_folder(model, tokenizer, tmp_path, v, step=10 * v, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000002", "v000003"]
    marker = json.loads((tmp_path / "v000003" / MARKER).read_text())
    assert marker["version"] == 3 and marker["step"] == 30
    assert set(marker["files"]) == {p.name for p in (tmp_path / "v000003").iterdir() if p.name != MARKER}
    assert all(sha256_file(tmp_path / "v000003" / n) == h for n, h in marker["files"].items())
    # Every file the marker lists was written before the marker itself.
    mtime = (tmp_path / "v000003" / MARKER).stat().st_mtime_ns
    assert all((tmp_path / "v000003" / n).stat().st_mtime_ns <= mtime for n in marker["files"])
    (tmp_path / ".v000001.crashed").mkdir()
    # A crashed attempt at the next version too: gc runs only when no publish is in flight.
    (tmp_path / ".v000004.crashed").mkdir()
    (tmp_path / "v000004").mkdir()  # renamed, but killed before its marker
    assert newest_published(tmp_path) == 3
    gone = gc_versions(tmp_path, keep=2)
    assert {tmp_path / ".v000001.crashed", tmp_path / ".v000004.crashed", tmp_path / "v000004"} == set(gone)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "v000002",
        "v000003",
    ]  # retention counts complete ones
    assert newest_published(tmp_path / "absent") == 0


def test_publish_shards_past_the_shard_size(tiny_model_dir: Path, tokenizer: Any, tmp_path: Path) -> None:
    """A policy bigger than ``publish_shard_mb`` goes out as the hub lays it out: shards and an index,
    every one of them covered by the marker."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))  # 13 MB, 12.6 MB of it embedding
    folder = publish_folder(model, tokenizer, tmp_path, 1, step=1, keep=1, max_shard_mb=5)
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    assert shards == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(shards)
    assert set(json.loads((folder / MARKER).read_text())["files"]) >= {
        *shards,
        "model.safetensors.index.json",
    }
    one = publish_folder(model, tokenizer, tmp_path, 2, step=2, keep=2)  # the default: one file
    assert [p.name for p in one.glob("*.safetensors")] == ["model.safetensors"]


def _service(version: int, lineage: Any = None, **cfg: Any) -> Any:
    from llds_trainer.config import TrainerConfig
    from llds_trainer.core import TrainState
    from llds_trainer.lineage import Lineage
    from llds_trainer.service import TrainerService

    svc = TrainerService(TrainerConfig(**cfg))
    st = TrainState(version=version, lineage=lineage or Lineage())
    st.add_consumed(1, ["old"])
    # A model's limits as the trainer reads them: SmolLM2's 49152 embedding rows, 4096 positions.
    model = SimpleNamespace(get_input_embeddings=lambda: SimpleNamespace(num_embeddings=49152),
                            config=SimpleNamespace(max_position_embeddings=4096))  # fmt: skip
    svc.trainer = SimpleNamespace(state=st, model=model)
    return svc


def test_drop_reasons(tokenizer: Any) -> None:
    from llds_trainer.queue import Entry
    from llds_trainer.synthetic import synthetic_groups

    svc = _service(3, staleness_k=1, run_id="run-a")

    def group(version: int, index: int, run_id: str = "") -> Any:
        g = synthetic_groups(tokenizer, 1, 2, version=version, think_words=2, doc_words=3, start_index=index)[
            0
        ]
        return g.model_copy(update={"run_id": run_id})

    g_v1, g_v2 = group(1, 0), group(2, 5)
    assert svc._drop_reason(Entry("1-0", g_v1), set()) == "stale"
    assert svc._drop_reason(Entry("1-1", g_v2), set()) is None
    assert svc._drop_reason(Entry("1-2", g_v2), {g_v2.group_id}) == "duplicate"
    assert svc._drop_reason(Entry("1-3", None, "bad"), set()) == "invalid"
    assert svc._drop_reason(Entry("1-4", group(3, 6, "run-b")), set()) == "foreign"
    assert svc._drop_reason(Entry("1-5", group(3, 7, "run-a")), set()) is None  # own run
    assert svc._drop_reason(Entry("1-6", group(3, 8)), set()) is None  # groups without a run id pass
    assert svc._drop_reason(Entry("1-7", group(4, 9)), set()) == "ahead"
    assert (
        svc._drop_reason(Entry("1-8", group(3, 0).model_copy(update={"group_id": "old"})), set())
        == "duplicate"
    )
    g = group(3, 10)
    t = g.trajectories[1]
    for ids, why in (([49152], "out_of_vocab"), ([-1], "out_of_vocab"), ([5] * 4096, "too_long")):
        bad = t.model_copy(update={"prompt_ids": [*ids, *t.prompt_ids]})
        assert (
            svc._drop_reason(
                Entry("1-9", g.model_copy(update={"trajectories": [g.trajectories[0], bad]})), set()
            )
            == why
        )
    # An entry that made max_entry_failures (2) steps fail goes, whatever else it is.
    assert svc._drop_reason(Entry("1-10", group(3, 11), failures=1), set()) is None
    assert svc._drop_reason(Entry("1-11", group(3, 12), failures=2), set()) == "failed"


def test_orphaned_and_lineage_stale_drops(tokenizer: Any) -> None:
    from llds_trainer.lineage import Lineage
    from llds_trainer.queue import Entry
    from llds_trainer.synthetic import synthetic_groups

    # Checkpoint at version 3, versions up to 5 had gone out: 4, 5 orphaned, 6 = the restored weights.
    lin = Lineage()
    assert lin.restart(3, 5) == (6, (4, 5))
    svc = _service(7, lin, staleness_k=1)
    by_version = {
        v: synthetic_groups(tokenizer, 1, 2, version=v, think_words=2, doc_words=3, start_index=v)[0]
        for v in range(1, 8)
    }
    reasons = {v: svc._drop_reason(Entry(f"2-{v}", g), set()) for v, g in by_version.items()}
    # 7 is 0 real updates behind, 6 (alias) and 3 are 1 behind (only 7 is real in (3, 7]), 2 is 2 behind.
    assert reasons == {1: "stale", 2: "stale", 3: None, 4: "orphaned", 5: "orphaned", 6: None, 7: None}
    # One orphaned token is enough, even in a group whose other tokens are current.
    mixed = by_version[7].model_copy(deep=True)
    t = mixed.trajectories[0]
    first = t.loss_mask.index(1)
    t.versions[first] = 5
    assert svc._drop_reason(Entry("2-9", mixed), set()) == "orphaned"


def test_dynamic_sampling_skips_groups_whose_rewards_are_all_equal(tokenizer: Any) -> None:
    from llds_trainer.queue import Entry
    from llds_trainer.synthetic import synthetic_groups

    g = synthetic_groups(tokenizer, 1, 3, version=3, think_words=2, doc_words=3, start_index=20)[0]
    mixed = g.model_copy(
        update={
            "trajectories": [
                t.model_copy(update={"reward": r}) for t, r in zip(g.trajectories, (0, 1, 1), strict=True)
            ]
        }
    )
    same = g.model_copy(
        update={
            "trajectories": [t.model_copy(update={"reward": 1.0}) for t in g.trajectories],
            "group_id": "same",
        }
    )
    on = _service(3, dynamic_sampling=True)
    assert on._drop_reason(Entry("2-0", same), set()) == "uniform"
    assert on._drop_reason(Entry("2-1", mixed), set()) is None
    off = _service(3)
    assert off._drop_reason(Entry("2-2", same), set()) is None


def test_dynamic_sampling_fails_clearly_when_every_group_is_uniform(tokenizer: Any) -> None:
    """A collapsed policy (every reward 0) must not have the trainer read for ever: after
    dynamic_sampling_max_skips uniform groups in a row the step fails, naming the cause; every skipped
    entry is acknowledged. A group with a signal in between restarts the count."""
    import threading

    from llds_trainer.core import NoLearningSignal
    from llds_trainer.metrics import TrainerMetrics
    from llds_trainer.queue import Entry
    from llds_trainer.synthetic import synthetic_groups

    gs = synthetic_groups(tokenizer, 12, 3, version=3, think_words=2, doc_words=3, start_index=40)

    def rewards(g: Any, values: tuple[float, ...]) -> Any:
        ts = [t.model_copy(update={"reward": v}) for t, v in zip(g.trajectories, values, strict=True)]
        return g.model_copy(update={"trajectories": ts})

    class Queue:
        def __init__(self, groups: list[Any]) -> None:
            self.entries = [Entry(f"{i}-0", g) for i, g in enumerate(groups)]
            self.acked: list[str] = []

        def fetch(self, n: int, _stop: Any) -> list[Any]:
            out, self.entries = self.entries[:n], self.entries[n:]
            return out

        def ack(self, ids: list[str]) -> None:
            self.acked += ids

    svc = _service(3, dynamic_sampling=True, dynamic_sampling_max_skips=4, groups_per_step=2)
    svc.metrics, svc.stop_event = TrainerMetrics(), threading.Event()
    dead = [rewards(g, (0, 0, 0)) for g in gs[:6]]
    svc.queue = Queue(dead)
    with pytest.raises(NoLearningSignal, match="skipped 4 groups in a row whose rewards were all equal"):
        svc._fetch_usable()
    assert svc.queue.acked == ["0-0", "1-0", "2-0", "3-0"]
    # 3 uniform, one with a signal, 3 uniform, one with a signal: the run of skips never reaches 4
    mixed = [rewards(g, (0, 0, 0)) for g in gs[6:9]] + [rewards(gs[9], (0, 1, 0))]
    mixed += [rewards(g, (1, 1, 1)) for g in gs[10:12]] + [rewards(gs[0], (0, 0, 1))]
    svc = _service(3, dynamic_sampling=True, dynamic_sampling_max_skips=4, groups_per_step=2)
    svc.metrics, svc.stop_event, svc.queue = TrainerMetrics(), threading.Event(), Queue(mixed)
    groups, ids = svc._fetch_usable()
    assert [g.group_id for g in groups] == [gs[9].group_id, gs[0].group_id] and ids == ["3-0", "6-0"]


def test_gc_keeps_the_versions_a_study_evaluates(tmp_path: Path) -> None:
    """keep_versions_every: a complete version whose marker names a step that is a multiple of N
    survives garbage collection beside the newest ``keep``; the others go as before."""
    import json

    for v in range(1, 13):
        d = tmp_path / f"v{v:06d}"
        d.mkdir()
        (d / MARKER).write_text(json.dumps({"version": v, "step": v + 100, "files": {}}))
    gc_versions(tmp_path, keep=2, keep_every=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000005", "v000010", "v000011", "v000012"]
    gc_versions(tmp_path, keep=1)  # without it the evaluated steps go too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000012"]


def test_notify_logs_replica_urls_without_their_secrets(caplog: pytest.LogCaptureFixture) -> None:
    from llds_proto.messages import WeightUpdateNotice
    from llds_server.http import free_port
    from llds_trainer.publish import notify_replicas

    notice = WeightUpdateNotice(version=1, path="/w/v000001", step=1)
    port = free_port()  # nothing listens there
    with caplog.at_level("INFO", logger="llds.trainer.publish"):
        (res,) = notify_replicas([f"http://user:hunter2@127.0.0.1:{port}/?token=abc"], notice, None, 2)
    assert not res.ok
    assert f"notify http://user:***@127.0.0.1:{port}/?token=*** of version 1 failed" in caplog.text
    assert "hunter2" not in caplog.text and "abc" not in caplog.text


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("http://127.0.0.1:8001", True),
        ("http://localhost:8001", True),
        ("http://[::1]:8001", True),
        ("http://127.0.0.2:8001", False),
        ("http://10.1.2.3:8001", True),
        ("http://10.1.2.3.evil.example:8001", False),
        ("http://r-0.rollout.llds.svc.cluster.local:8001", True),
        ("http://rollout.llds.svc.cluster.local.evil.example:8001", False),
        ("http://user:pw@evil.example:8001", False),
        ("not a url", False),
    ],
)
def test_replica_hosts(url: str, allowed: bool) -> None:
    from llds_trainer.publish import host_allowed

    patterns = ["127.0.0.1", "::1", "localhost", "10.0.0.0/8", "*.rollout.llds.svc.cluster.local"]
    assert host_allowed(url, patterns) is allowed
    assert host_allowed(url, ["*"]) is (url != "not a url")


def test_replica_hosts_config_names_a_bad_network() -> None:
    from llds_trainer.config import TrainerConfig

    with pytest.raises(ValueError, match=r"replica_hosts entry '10\.0\.0\.0/33' is not a network"):
        TrainerConfig(replica_hosts=["10.0.0.0/33"])


def test_gc_keeps_a_version_a_replica_is_reading(tmp_path: Path) -> None:
    """Issue 30: deleting files under a reading engine mixes its weights; a pinned version stays."""
    import json

    for v in range(1, 6):
        d = tmp_path / f"v{v:06d}"
        d.mkdir()
        (d / MARKER).write_text(json.dumps({"version": v, "step": v, "files": {}}))
    gc_versions(tmp_path, keep=2, pinned={2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000002", "v000004", "v000005"]
    gc_versions(tmp_path, keep=2)  # unpinned: it goes
    assert sorted(p.name for p in tmp_path.iterdir()) == ["v000004", "v000005"]


def test_pins_expire_and_an_unreadable_redis_keeps_every_version(tmp_path: Path) -> None:
    import time as _time

    import fakeredis
    import redis

    from llds_proto import streams
    from llds_trainer.config import TrainerConfig
    from llds_trainer.service import TrainerService

    svc = TrainerService(TrainerConfig(pin_ttl_s=60, weights_root=str(tmp_path / "weights")))
    svc.redis = fakeredis.FakeRedis()
    now = _time.time()
    svc.redis.zadd(
        streams.DEFAULT_KEYS.weight_pins, {"7/rollout-a": now - 5, "3/rollout-b": now - 600, "9/x": now}
    )
    assert svc._pinned_versions() == {7, 9}
    assert (
        svc.redis.zscore(streams.DEFAULT_KEYS.weight_pins, "3/rollout-b") is None
    )  # a dead reader's pin went

    class Down:
        def pipeline(self, transaction: bool = False) -> Any:
            raise redis.ConnectionError("down")

    svc.redis = Down()
    (tmp_path / "weights" / "v000004").mkdir(parents=True)
    assert svc._pinned_versions() == {4}
