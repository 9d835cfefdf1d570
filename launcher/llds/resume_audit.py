"""``llds bench resume-audit``: a run killed with ``kill -9`` again and again, resumed each time, and
audited from outside: every prompt of the run's data order is accounted for, none trained twice.

A real ``llds up`` (the tiny preset, vLLM by default) trains ``--steps`` steps. At random moments,
each after the run made progress since the last restart, one of these dies by SIGKILL: the trainer,
the rollout (with its engine processes), the retriever, ``llds up`` alone (its children end by their
lifeline), the whole tree at once, or the Redis server (which this benchmark starts, with
``appendfsync always``, so that an acknowledged write is on disk). Whatever is left of the run is
then killed too, Redis is started again on its append-only file if it died, and ``llds up --resume``
continues. After ``--kills`` kills the run goes to its end.

An observer that is neither the trainer nor the rollout reads the trajectory stream and the drop
record as they grow (``XREAD``, before the trainer trims them) into ``WORK/observed.jsonl``. The
audit then reads only that, Redis's keys at the end and the final checkpoint's bytes:

- every position below the run's cursor reached the stream, the drop record, or is claimed (in flight
  at the end); none reached the stream twice;
- every stream entry was trained (its group id in the checkpoint's consumed ids, each once), dropped
  by the trainer (acknowledged unused: named in its log when it says why), or is still in the stream;
- AdamW's step count in the checkpoint is steps x updates per step: no step trained twice or lost.

    llds bench resume-audit --steps 200 --kills 20 --out docs/resume_audit.md   # the audit
    llds bench resume-audit --steps 12 --kills 3                                 # a smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

TARGETS = ("trainer", "rollout", "retriever", "launcher", "tree", "redis")
POSITION = re.compile(r":p(\d+)$")


class Observer(threading.Thread):
    """Reads the run's trajectory stream and drop record as they grow, appending each entry (id,
    group id, or the drop's fields) to a file: the audit's witness, outside the run's processes.
    ``url`` may be a function: called again at every reconnect (a Redis that ``llds up`` restarts
    on another port)."""

    def __init__(self, url: str | Callable[[], str], run_id: str, path: Path) -> None:
        super().__init__(name="audit-observer", daemon=True)
        from llds_proto.streams import RunKeys

        self.url, self.keys, self.path = url, RunKeys(run_id), path
        self.last = {self.keys.stream: "0", self.keys.data_dropped: "0"}
        self.stop = threading.Event()
        self.errors = 0

    def run(self) -> None:
        import redis

        from llds_proto.codec import decode_group
        from llds_proto.streams import GROUP_FIELD

        client = None
        with self.path.open("a") as out:
            while not self.stop.is_set():
                try:
                    url = self.url() if callable(self.url) else self.url
                    client = client or redis.Redis.from_url(url, socket_timeout=5)
                    got = client.xread(dict(self.last), block=200, count=500)  # type: ignore[arg-type]
                except redis.RedisError:
                    self.errors += 1
                    client = None
                    time.sleep(0.2)  # Redis killed: back when it is
                    continue
                for key, entries in got or []:
                    key = key.decode()
                    for eid, fields in entries:
                        eid = eid.decode()
                        self.last[key] = eid
                        if key == self.keys.stream:
                            g = decode_group(fields[GROUP_FIELD])
                            row = {"stream": eid, "group_id": g.group_id, "t": time.time()}
                        else:
                            row = {"dropped": eid, **{k.decode(): v.decode() for k, v in fields.items()}}
                        out.write(json.dumps(row) + "\n")
                out.flush()


def _descendants(pid: int) -> list[Any]:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _child(launcher: int, part: str) -> Any:
    import psutil

    for p in _descendants(launcher):
        try:
            if part in " ".join(p.cmdline()):
                return p
        except psutil.NoSuchProcess:
            continue
    return None


def _kill_all(procs: list[Any]) -> None:
    import psutil

    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=30)


def _steps(run_dir: Path) -> int:
    from llds_proto import steplog as K

    log = K.read_records(run_dir / "trainer" / "train_log.jsonl")
    return int(log[-1][K.STEP]) if log else 0


def _trainer_config(preset: str, steps: int, out: Path) -> Path:
    """The preset's trainer config with a consumed-id window holding every step (the audit reads them
    all from the final checkpoint)."""
    import tomli_w

    from llds.experiment import preset_config

    cfg = preset_config(preset, "trainer")
    cfg["consumed_window_steps"] = steps + 16
    out.write_text(tomli_w.dumps(cfg))
    return out


def _launch(
    args: argparse.Namespace, run_dir: Path, redis_url: str, cfg: Path, log: Path, first: bool
) -> subprocess.Popen[bytes]:
    common = ["--retriever-port", "0", "--rollout-port", "0", "--trainer-port", "0", "--no-dashboard",
              "--exit-when-done"]  # fmt: skip
    if first:
        argv = ["up", "--preset", args.preset, "--steps", str(args.steps), "--run-dir", str(run_dir),
                "--trainer-config", str(cfg), "--redis-url", redis_url, *common]  # fmt: skip
    else:
        argv = ["up", "--resume", str(run_dir)]
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    with log.open("ab") as f:
        f.write(f"\n=== {time.strftime('%H:%M:%S')} llds {' '.join(argv)}\n".encode())
        f.flush()
        return subprocess.Popen([sys.executable, "-m", "llds.cli", *argv], stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)  # fmt: skip


def _wait_progress(proc: subprocess.Popen[bytes], run_dir: Path, past: int, timeout_s: float) -> int:
    """Wait until the run logged a step past ``past`` (or ended); returns the step reached."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        step = _steps(run_dir) if (run_dir / "trainer").is_dir() else 0
        if step > past or proc.poll() is not None:
            return step
        time.sleep(1.0)
    raise SystemExit(f"resume-audit: no step past {past} within {timeout_s:.0f} s; see {run_dir}/logs")


def run(args: argparse.Namespace) -> dict[str, Any]:
    from llds.redis_server import RedisServer

    work: Path = args.work.resolve()  # (Redis runs in its own folder: a relative path would be its)
    if work.exists() and any(work.iterdir()):
        raise SystemExit(f"resume-audit: {work} is not empty (the audit starts from nothing)")
    work.mkdir(parents=True, exist_ok=True)
    run_dir, log = work / "run", work / "llds_up.log"
    rng = random.Random(args.seed)
    redis = RedisServer(data_dir=work / "redis", appendfsync="always").start()
    cfg = _trainer_config(args.preset, args.steps, work / "trainer.toml")
    kills: list[dict[str, Any]] = []
    observer: Observer | None = None
    t0 = time.monotonic()
    try:
        proc = _launch(args, run_dir, redis.url, cfg, log, first=True)
        # The observer reads from the stream's first entry: it must start before the trainer can trim
        # one, so as soon as the run has an id (llds up writes it before it starts any child).
        deadline = time.monotonic() + 120
        while not (run_dir / "run_id").is_file():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"resume-audit: llds up wrote no run id; see {log}")
            time.sleep(0.05)
        observer = Observer(redis.url, (run_dir / "run_id").read_text().strip(), work / "observed.jsonl")
        observer.start()
        step = 0
        for i in range(args.kills):
            step = _wait_progress(proc, run_dir, step, args.step_timeout_s)
            if proc.poll() is not None:
                raise SystemExit(
                    f"resume-audit: llds up ended (exit {proc.returncode}) before kill {i + 1}; see {log}"
                )
            time.sleep(rng.uniform(args.min_gap_s, args.max_gap_s))
            target = rng.choice(TARGETS)
            procs = _descendants(proc.pid)
            victim = {
                "trainer": "trainer run",
                "rollout": "rollout serve",
                "retriever": "retriever serve",
            }.get(target)
            at = _steps(run_dir)
            if victim:
                p = _child(proc.pid, victim)
                pids = [p.pid] if p else []
                _kill_all([p] if p else [])
            elif target == "launcher":
                pids = [proc.pid]
                os.kill(proc.pid, signal.SIGKILL)
            elif target == "redis":
                assert redis.proc is not None
                pids = [redis.proc.pid]
                redis.kill()
            else:  # the tree: launcher and every descendant in one sweep
                import psutil

                pids = [proc.pid, *(p.pid for p in procs)]
                _kill_all([psutil.Process(proc.pid), *procs])
            # a crash of the host: whatever the kill left is gone too before the resume (a launcher
            # alone is given the time its children's lifelines take)
            try:
                proc.wait(60 if target == "launcher" else 20)
            except subprocess.TimeoutExpired:
                pass
            time.sleep(15 if target == "launcher" else 0)
            left = [p for p in procs if p.is_running()]
            _kill_all(left)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if redis.proc is None or redis.proc.poll() is not None:
                redis.start()
            kills.append(
                {"kill": i + 1, "target": target, "pids": pids, "at_step": at, "left_running": len(left)}
            )
            step = at  # the next kill waits for the resumed run to go past where this one hit it
            print(
                f"kill {i + 1}/{args.kills}: {target} at step {at} ({len(left)} left running, killed)",
                flush=True,
            )
            proc = _launch(args, run_dir, redis.url, cfg, log, first=False)
        code = proc.wait(args.final_timeout_s)
        if code != 0:
            raise SystemExit(f"resume-audit: the last llds up --resume exited {code}; see {log}")
        time.sleep(2.0)  # the observer's last read
    finally:
        if observer is not None:
            observer.stop.set()
            observer.join(10)
    report = audit(work, run_dir, redis.url, args.steps)
    redis.stop()
    report |= {"kills": kills, "wall_s": round(time.monotonic() - t0, 1), "steps": args.steps,
               "seed": args.seed, "preset": args.preset, "observer_redis_errors": observer.errors if observer else None}  # fmt: skip
    (work / "audit.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def audit(work: Path, run_dir: Path, url: str, steps: int) -> dict[str, Any]:
    """The figures and the failures, from the observer's file, Redis at the end and the checkpoint."""
    import redis
    import torch

    from llds_proto import steplog as K
    from llds_proto.codec import decode_group
    from llds_proto.streams import GROUP_FIELD, RunKeys

    keys = RunKeys((run_dir / "run_id").read_text().strip())
    rows = [json.loads(x) for x in (work / "observed.jsonl").read_text().splitlines() if x.strip()]
    entries = [r for r in rows if "stream" in r]
    drops = [r for r in rows if "dropped" in r]
    client = redis.Redis.from_url(url)
    cursor = int(client.get(keys.data_cursor) or 0)
    claims = {int(k): v.decode() for k, v in client.hgetall(keys.data_claims).items()}
    in_stream = {decode_group(f[GROUP_FIELD]).group_id for _, f in client.xrange(keys.stream)}
    failures: list[str] = []

    pushed = Counter(int(m.group(1)) for r in entries if (m := POSITION.search(r["group_id"])))
    twice = sorted(p for p, n in pushed.items() if n > 1)
    dropped = {int(r["position"]): r["why"] for r in drops}
    accounted = set(pushed) | set(dropped) | set(claims)
    missing = sorted(set(range(cursor)) - accounted)
    if twice:
        failures.append(f"positions in the stream more than once: {twice[:20]}")
    if missing:
        failures.append(
            f"positions below the cursor ({cursor}) nowhere (stream, drops, claims): {missing[:20]}"
        )
    if set(pushed) & set(dropped):
        failures.append(f"positions both pushed and dropped: {sorted(set(pushed) & set(dropped))[:20]}")

    ckpts = sorted(p for p in (run_dir / "trainer" / "checkpoints").iterdir() if p.name.startswith("step_"))
    state = json.loads((ckpts[-1] / "state.json").read_text())
    consumed: list[str] = state["consumed"]
    trained_twice = sorted(g for g, n in Counter(consumed).items() if n > 1)
    if trained_twice:
        failures.append(f"group ids trained twice: {trained_twice[:20]}")
    if state.get("consumed_total") != len(consumed):
        failures.append(
            f"consumed_total {state.get('consumed_total')} != {len(consumed)} ids kept: the window lost some"
        )
    seen = {r["group_id"] for r in entries}
    unseen = sorted(set(consumed) - seen)
    if unseen:
        failures.append(f"trained groups the observer never saw in the stream: {unseen[:20]}")
    opt = torch.load(ckpts[-1] / "optimizer.pt", weights_only=True)
    adam = sorted({int(s["step"]) for s in opt["state"].values()})
    records = K.read_records(run_dir / "trainer" / "train_log.jsonl")
    logged = [int(r[K.STEP]) for r in records]
    if logged != list(range(1, steps + 1)):
        failures.append(f"the step log is not steps 1..{steps} once each: {Counter(logged).most_common(3)}")
    updates = sum(int(r.get(K.ACTOR_UPDATES) or 0) for r in records)
    if state["step"] != steps:
        failures.append(f"the final checkpoint is step {state['step']}, not {steps}")
    if adam != [updates]:
        failures.append(f"AdamW step counts {adam}, not the {updates} updates the step log records")
    trainer_dropped = sorted(seen - set(consumed) - in_stream)
    reasons = _drop_reasons(run_dir, trainer_dropped)
    return {
        "cursor": cursor,
        "stream_entries_observed": len(entries),
        "positions_pushed": len(pushed),
        "positions_dropped_by_rollout": dict(Counter(dropped.values())),
        "positions_claimed_at_end": len(claims),
        "trained": len(consumed),
        "dropped_by_trainer": len(trainer_dropped),
        "dropped_by_trainer_reasons": dict(Counter(reasons.values())),
        "left_in_stream": len(in_stream),
        "adam_steps": adam,
        "updates_logged": updates,
        "failures": failures,
    }


def _drop_reasons(run_dir: Path, ids: list[str]) -> dict[str, str]:
    """Why the trainer dropped each of ``ids``, from its log where it says (else ``unlogged``)."""
    text = ""
    for p in sorted((run_dir / "logs").glob("trainer*.log*")):
        text += p.read_text(errors="replace")
    out = {}
    for gid in ids:
        m = re.search(rf"dropping entry \S+ \({re.escape(gid)}\): (\w+)", text)
        out[gid] = m.group(1) if m else "unlogged"
    return out


def markdown(report: dict[str, Any], command: str) -> str:
    k = Counter(x["target"] for x in report["kills"])
    lines = [
        "## Lossless resume: the audit",
        "",
        f"Command: `{command}` ({report['wall_s'] / 60:.0f} minutes on this machine). {len(report['kills'])} kills "
        f"({', '.join(f'{n} {t}' for t, n in sorted(k.items()))}), each followed by `llds up --resume`; "
        f"{report['steps']} steps in all. Audited from the stream as an outside reader saw it, Redis's keys at the end "
        "and the final checkpoint's files.",
        "",
        "| figure | value |",
        "|---|---|",
        f"| positions of the data order handed out (the cursor) | {report['cursor']} |",
        f"| reached the trajectory stream (each once) | {report['positions_pushed']} |",
        f"| recorded as dropped by the rollout | {report['positions_dropped_by_rollout'] or 0} |",
        f"| claimed at the end (in flight) | {report['positions_claimed_at_end']} |",
        f"| stream entries trained (each once) | {report['trained']} |",
        f"| acknowledged unused by the trainer | {report['dropped_by_trainer']} {report['dropped_by_trainer_reasons'] or ''} |",
        f"| left in the stream at the end | {report['left_in_stream']} |",
        f"| AdamW step count / optimiser updates in the step log | {report['adam_steps']} / {report['updates_logged']} |",
        f"| failures | {len(report['failures'])} |",
        "",
    ]
    lines += [f"- FAILED: {f}" for f in report["failures"]] or ["No position lost, none trained twice."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llds bench resume-audit", description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200, help="training steps of the run")
    p.add_argument("--kills", type=int, default=20, help="random kill -9s, each followed by a resume")
    p.add_argument("--seed", type=int, default=0, help="seed of the kill schedule (targets and gaps)")
    p.add_argument("--preset", default="tiny", help="llds up preset (default tiny: vLLM, the tiny model)")
    p.add_argument("--work", type=Path, default=Path("runs/resume-audit"), help="empty folder for the run")
    p.add_argument("--min-gap-s", type=float, default=5.0, help="shortest wait after progress before a kill")
    p.add_argument("--max-gap-s", type=float, default=40.0, help="longest wait after progress before a kill")
    p.add_argument(
        "--step-timeout-s", type=float, default=900.0, help="longest wait for a resumed run's next step"
    )
    p.add_argument(
        "--final-timeout-s", type=float, default=7200.0, help="longest wait for the last piece to finish"
    )
    p.add_argument("--out", type=Path, help="write the report (markdown) here")
    args = p.parse_args(argv)
    if args.steps < 2 or args.kills < 1 or not 0 <= args.min_gap_s <= args.max_gap_s:
        p.error(
            f"--steps >= 2 (got {args.steps}), --kills >= 1 (got {args.kills}), 0 <= --min-gap-s <= --max-gap-s"
        )
    report = run(args)
    text = markdown(report, "llds bench resume-audit " + " ".join(argv if argv is not None else sys.argv[1:]))
    print(text)
    if args.out:
        args.out.write_text(text)
    return 1 if report["failures"] else 0
