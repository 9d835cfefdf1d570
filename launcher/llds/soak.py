"""``llds bench soak``: run the whole system for N steps and fail if anything keeps growing.

Runs what ``llds up`` runs (Redis, retriever, rollout, trainer, dashboard) for ``--steps`` training
steps and every ``--sample-every`` steps samples, from /proc, each service's resident memory, open
file descriptors and process count (the service's process and everything in its session, such as
vLLM's engine process), the launcher's own, Redis ``used_memory`` and the run's stream length
(XLEN), the run dir's bytes and its checkpoint and weights-version counts. The samples go to
``RUN_DIR/soak_samples.jsonl``. After the warm-up fraction each series' least-squares slope per
step, times the steps measured, is its growth; a checked series that grows more than its tolerance
fails the benchmark (exit 1, naming it). Series that grow by design (logs, the Redis append-only
file) are reported, never checked.

    llds bench soak --preset tiny --steps 500 --out docs/soak_bench.md   # the benchmark
    llds bench soak --preset tiny --steps 4 --sample-every 1 --report-only   # smoke run
"""

from __future__ import annotations

import argparse
import fnmatch
import itertools
import json
import os
import re
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from llds_proto import steplog as K

if TYPE_CHECKING:
    from llds.up import Up

MIB = 1 << 20


@dataclass(frozen=True)
class Tolerance:
    """Growth a series may show over the measured steps: ``rel`` of its median or ``abs`` in its
    unit, whichever is larger (the absolute floor keeps small series out of noise)."""

    rel: float
    abs: float

    def allowed(self, median: float) -> float:
        return max(self.rel * abs(median), self.abs)


TOLERANCES: tuple[tuple[str, Tolerance | None], ...] = (
    ("rss_bytes/*", Tolerance(0.10, 64 * MIB)),
    ("open_files/*", Tolerance(0.10, 16)),
    ("processes/*", Tolerance(0.0, 2)),
    ("redis/used_memory_bytes", Tolerance(0.10, 1 * MIB)),
    ("redis/stream_length", Tolerance(0.0, 16)),
    ("run_dir/state_bytes", Tolerance(0.25, 16 * MIB)),
    ("run_dir/checkpoints", Tolerance(0.0, 1)),
    ("run_dir/weight_versions", Tolerance(0.0, 1)),
    ("run_dir/log_bytes", None),
    ("run_dir/redis_bytes", None),
    ("run_dir/total_bytes", None),
)
"""Series name pattern -> tolerance, first match wins; None: reported only (grows by design: logs and
the append-only file, which Valkey rewrites only past 64 MiB)."""

LOG_SUFFIXES = (".log", ".jsonl", ".csv")
"""Files that grow by design wherever they are (service logs, train_log.jsonl, the samples)."""


def tolerance_of(series: str) -> Tolerance | None:
    for pattern, tol in TOLERANCES:
        if fnmatch.fnmatchcase(series, pattern):
            return tol
    return None


# ---------------------------------------------------------------------------- /proc


def process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, session id) of every process now."""
    out: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        # after "pid (comm) ": state ppid pgrp session ... (comm may hold spaces and parentheses)
        fields = stat[stat.rindex(b")") + 2 :].split()
        out[int(name)] = (int(fields[1]), int(fields[3]))
    return out


def process_tree(root: int, table: dict[int, tuple[int, int]], session: bool) -> set[int]:
    """``root`` and its descendants; with ``session`` also every process in the session ``root``
    leads (a service's children that outlived their parent)."""
    pids = {root} if root in table else set()
    if session:
        pids |= {p for p, (_, sid) in table.items() if sid == root}
    children: dict[int, list[int]] = {}
    for p, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(p)
    frontier = list(pids)
    while frontier:
        for c in children.get(frontier.pop(), []):
            if c not in pids:
                pids.add(c)
                frontier.append(c)
    return pids


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` (VmRSS), 0 for a process without one or gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def open_files(pid: int) -> int:
    """Open file descriptors of ``pid`` (files, sockets, pipes), 0 if gone."""
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def usage(pids: set[int]) -> dict[str, int]:
    return {
        "rss_bytes": sum(rss_bytes(p) for p in pids),
        "open_files": sum(open_files(p) for p in pids),
        "processes": len(pids),
    }


def run_dir_usage(run_dir: Path) -> dict[str, int]:
    """Bytes of the run dir split into state (checkpoints, weights, configs: bounded by the keep
    settings), logs and Redis data; checkpoint and weight-version counts."""
    total = logs = redis_bytes = 0
    for dirpath, _, files in os.walk(run_dir):
        rel = Path(dirpath).relative_to(run_dir)
        for name in files:
            try:
                size = os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue  # rotated away meanwhile
            total += size
            if rel.parts[:1] == ("redis",):
                redis_bytes += size
            elif rel.parts[:1] == ("logs",) or name.endswith(LOG_SUFFIXES):
                logs += size
    ckpts = run_dir / "trainer" / "checkpoints"
    weights = run_dir / "weights"
    return {
        "total_bytes": total,
        "state_bytes": total - logs - redis_bytes,
        "log_bytes": logs,
        "redis_bytes": redis_bytes,
        "checkpoints": sum(1 for p in ckpts.glob("step_*") if p.is_dir()) if ckpts.is_dir() else 0,
        "weight_versions": sum(1 for p in weights.glob("v*") if (p / "COMPLETE").is_file())
        if weights.is_dir()
        else 0,
    }


# ---------------------------------------------------------------------------- sampling


class Sampler:
    """Samples a running :class:`llds.up.Up` into ``RUN_DIR/soak_samples.jsonl``."""

    def __init__(self, up: Up, every: int, path: Path | None = None):
        self.up = up
        self.every = every
        self.path = path or up.run_dir / "soak_samples.jsonl"
        # A resumed soak continues the series of the run it resumes (time keeps counting from there).
        self.samples: list[dict[str, float]] = (
            [json.loads(x) for x in self.path.read_text().splitlines() if x.strip()]
            if self.path.exists()
            else []
        )
        self.next_step = int(self.samples[-1]["step"]) + every if self.samples else 0
        self.t0 = time.monotonic() - (self.samples[-1]["t"] if self.samples else 0.0)

    def on_status(self, status: dict[str, object]) -> None:
        """``Up.wait_for_steps`` hook: sample when the trainer has moved ``every`` steps on."""
        step = int(str(status.get("step") or 0))
        if step >= self.next_step:
            self.sample(step)
            self.next_step = step + self.every

    def sample(self, step: int) -> dict[str, float]:
        from llds_proto.streams import RunKeys

        up = self.up
        rec: dict[str, float] = {"t": round(time.monotonic() - self.t0, 2), "step": step}
        table = process_table()
        groups = {"launcher": {os.getpid()}}
        for child in up.children:
            if child.running():
                groups[child.name] = process_tree(child.pid, table, session=True)
        if up.redis is not None and up.redis.proc is not None:
            groups["redis"] = process_tree(up.redis.proc.pid, table, session=False)
        for name, pids in groups.items():
            for k, v in usage(pids).items():
                rec[f"{k}/{name}"] = v
        import redis

        try:
            client = redis.Redis.from_url(up.redis_url, socket_timeout=5)
            rec["redis/used_memory_bytes"] = int(client.info("memory")["used_memory"])
            rec["redis/stream_length"] = int(client.xlen(RunKeys(up.run_id).stream))
        except redis.RedisError:
            pass  # a missing point, not a zero
        for k, v in run_dir_usage(up.run_dir).items():
            rec[f"run_dir/{k}"] = v
        self.samples.append(rec)
        with self.path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        print(progress_line(rec, up.cfg.steps), flush=True)
        return rec


def _fmt(series: str, v: float) -> str:
    if "bytes" in series:
        return f"{v / MIB:.1f} MiB"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def progress_line(rec: dict[str, float], steps: int) -> str:
    rss = sum(v for k, v in rec.items() if k.startswith("rss_bytes/"))
    return (
        f"soak step {int(rec['step'])}/{steps}  t {rec['t']:.0f} s  rss {rss / MIB:.0f} MiB  "
        f"stream {rec.get('redis/stream_length', '?')}  redis {_fmt('bytes', rec.get('redis/used_memory_bytes', 0))}  "
        f"run dir {_fmt('bytes', rec['run_dir/total_bytes'])}"
    )


# ---------------------------------------------------------------------------- analysis


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ``ys`` over ``xs`` (0 when ``xs`` do not vary)."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        return 0.0
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx


@dataclass(frozen=True)
class Trend:
    """One series after the warm-up: its fit and verdict."""

    series: str
    n: int
    first: float
    last: float
    slope_per_step: float
    growth: float
    """Slope times the steps measured: what the fit says the series gained over the window."""
    allowed: float | None
    """Growth tolerated; None: reported, not checked."""

    @property
    def verdict(self) -> str:
        if self.allowed is None:
            return "info"
        if self.n < 3:
            return "too few samples"
        return "GROWING" if self.growth > self.allowed else "ok"

    @property
    def failed(self) -> bool:
        return self.verdict in ("GROWING", "too few samples")


def analyse(samples: list[dict[str, float]], warmup: float) -> list[Trend]:
    """Each series' trend over the samples at or after ``warmup`` of the last sampled step."""
    if not samples:
        return []
    cutoff = warmup * max(s["step"] for s in samples)
    kept = [s for s in samples if s["step"] >= cutoff]
    names = sorted({k for s in samples for k in s} - {"t", "step"})
    out = []
    for name in names:
        pts = [(float(s["step"]), float(s[name])) for s in kept if s.get(name) is not None]
        tol = tolerance_of(name)
        if not pts:
            out.append(Trend(name, 0, 0.0, 0.0, 0.0, 0.0, tol.allowed(0) if tol else None))
            continue
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        k = slope(xs, ys) if len(pts) >= 2 else 0.0
        out.append(
            Trend(
                series=name,
                n=len(pts),
                first=ys[0],
                last=ys[-1],
                slope_per_step=k,
                growth=k * (max(xs) - min(xs)),
                allowed=tol.allowed(statistics.median(ys)) if tol else None,
            )
        )
    return out


def summary_table(trends: list[Trend]) -> list[str]:
    rows = ["| series | samples | first | last | slope / step | growth | tolerance | verdict |",
            "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for t in trends:
        rate = f"{t.slope_per_step / 1024:.1f} KiB" if "bytes" in t.series else f"{t.slope_per_step:.3g}"
        rows.append(
            f"| {t.series} | {t.n} | {_fmt(t.series, t.first)} | {_fmt(t.series, t.last)} | {rate} | "
            f"{_fmt(t.series, t.growth)} | {_fmt(t.series, t.allowed) if t.allowed is not None else '-'} | "
            f"{t.verdict} |"
        )
    return rows


def report(
    trends: list[Trend],
    command: str,
    steps_done: int,
    wall_s: float,
    warmup: float,
    figures: dict[str, float] | None = None,
) -> str:
    failed = [t.series for t in trends if t.failed]
    lines = [
        "# Soak: `llds up` for many steps, nothing may keep growing",
        "",
        f"Command: `{command}`. {steps_done} steps in {wall_s / 60:.1f} min on {os.cpu_count()} CPU cores; "
        f"trend fitted over the steps after the first {warmup:.0%}.",
        "",
        "Growth = least-squares slope per step x steps measured; tolerance = the larger of a fraction of "
        "the series' median and an absolute floor (launcher/llds/soak.py `TOLERANCES`). `info` series "
        "grow by design (logs, the Redis append-only file) and are not checked.",
        "",
        *summary_table(trends),
        "",
        f"Verdict: {'FAILED, growing: ' + ', '.join(failed) if failed else 'nothing keeps growing'}.",
    ]
    if figures:
        lines += ["", "Run figures (`run_figures`: train log, samples and the drops the services logged):", "",
                  *figures_table(figures)]  # fmt: skip
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- run figures

DROP_LINE = re.compile(r"dropping entry \S+ \((?P<group>[^)]*)\): (?P<reason>\w+)")
ROLLOUT_STALE_LINE = "stale group dropped"


def drop_lines(run_dir: Path) -> list[str]:
    """Every drop the services logged, in order: the trainer's ``dropping entry`` lines and the
    rollout's ``stale group dropped`` lines (logs are appended across ``--resume``)."""
    out = []
    for name, needle in (("trainer", "dropping entry"), ("rollout", ROLLOUT_STALE_LINE)):
        path = run_dir / "logs" / f"{name}.log"
        if path.is_file():
            out += [
                f"{name}: {x.strip()}" for x in path.read_text(errors="replace").splitlines() if needle in x
            ]
    return out


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q * (len(xs) - 1)))] if xs else 0.0


def run_figures(
    samples: list[dict[str, float]], train: list[dict[str, float]], drops: list[str]
) -> dict[str, float]:
    """The run's headline figures: pace, exactness, drops, memory (from the samples, the trainer's
    train log and the logged drops)."""
    fig: dict[str, float] = {"steps": float(max((r[K.STEP] for r in train), default=0))}
    fig["wall_min"] = max((s["t"] for s in samples), default=0.0) / 60
    step_s = [float(r[K.PERF_STEP_S]) for r in train if K.PERF_STEP_S in r]
    fig["step_s_median"], fig["step_s_p90"] = statistics.median(step_s or [0.0]), _pct(step_s, 0.9)
    stamps = sorted(float(r[K.TIME_UNIX]) for r in train if K.TIME_UNIX in r)
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    fig["cycle_s_median"] = statistics.median(gaps) if gaps else 0.0
    fig["groups_trained"] = float(sum(r.get(K.DATA_GROUPS, 0) for r in train))
    fig["mismatch_kl_max_abs"] = max(
        (abs(float(r[K.MISMATCH_KL])) for r in train if K.MISMATCH_KL in r), default=0.0
    )
    fig["mismatch_abs_logp_diff_max"] = max(
        (float(r.get(K.MISMATCH_ABS_LOGP_DIFF, 0)) for r in train), default=0.0
    )
    reasons: dict[str, int] = {}
    for line in drops:
        m = DROP_LINE.search(line) if line.startswith("trainer:") else None
        if m:
            reasons[m["reason"]] = reasons.get(m["reason"], 0) + 1
    for reason, n in sorted(reasons.items()):
        fig[f"trainer_dropped_{reason}"] = float(n)
    fig["trainer_dropped_stale"] = float(reasons.get("stale", 0))
    fig["rollout_dropped_stale"] = float(sum(1 for x in drops if x.startswith("rollout:")))
    totals = [sum(v for k, v in s.items() if k.startswith("rss_bytes/")) for s in samples]
    fig["rss_peak_total_mib"] = max(totals, default=0.0) / MIB
    for name in sorted({k.split("/", 1)[1] for s in samples for k in s if k.startswith("rss_bytes/")}):
        fig[f"rss_peak_{name}_mib"] = (
            max((s.get(f"rss_bytes/{name}", 0.0) for s in samples), default=0.0) / MIB
        )
    fig["redis_used_memory_peak_mib"] = (
        max((s.get("redis/used_memory_bytes", 0.0) for s in samples), default=0.0) / MIB
    )
    fig["stream_length_max"] = max((s.get("redis/stream_length", 0.0) for s in samples), default=0.0)
    fig["run_dir_peak_mib"] = max((s.get("run_dir/total_bytes", 0.0) for s in samples), default=0.0) / MIB
    rewards = [float(r[K.REWARD_MEAN]) for r in train if K.REWARD_MEAN in r]
    if rewards:
        n = max(1, len(rewards) // 10)
        fig["reward_first_tenth"], fig["reward_last_tenth"] = (
            statistics.fmean(rewards[:n]),
            statistics.fmean(rewards[-n:]),
        )
    return fig


def figures_table(fig: dict[str, float]) -> list[str]:
    rows = ["| figure | value |", "|---|---|"]
    for k, v in fig.items():
        rows.append(f"| {k} | {v:.3g} |" if abs(v) < 1000 else f"| {k} | {v:.0f} |")
    return rows


# ---------------------------------------------------------------------------- command


def _verdict(trends: list[Trend], report_only: bool) -> int:
    """Print which series grow; the exit code that goes with it."""
    growing = [t for t in trends if t.failed]
    if not growing:
        print("soak: nothing keeps growing")
        return 0
    names = ", ".join(f"{t.series} ({t.verdict}: +{_fmt(t.series, t.growth)} > {_fmt(t.series, t.allowed or 0)})"
                      for t in growing)  # fmt: skip
    print(f"llds bench soak: {'growing (report only)' if report_only else 'FAILED, growing'}: {names}",
          file=sys.stderr)  # fmt: skip
    return 0 if report_only else 1


def _jsonl(path: Path) -> list[dict[str, float]]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def _from_samples(
    path: Path,
    warmup: float,
    out: Path | None,
    report_only: bool,
    train_log: Path | None = None,
    drops: Path | None = None,
) -> int:
    """Re-derive the report of a finished soak from its committed samples (and, for the run figures,
    its train log and logged drops)."""
    for f in (path, train_log, drops):
        if f is not None and not f.is_file():
            print(f"llds bench soak: no such file {f}", file=sys.stderr)
            return 2
    samples = _jsonl(path)
    trends = analyse(samples, warmup)
    steps = int(max((s["step"] for s in samples), default=0))
    wall = float(max((s["t"] for s in samples), default=0.0))
    figures = None
    command = f"llds bench soak --from-samples {path}"
    if train_log is not None:
        lines = drops.read_text().splitlines() if drops is not None else []
        figures = run_figures(samples, K.read_records(train_log), lines)
        command += f" --train-log {train_log}" + (f" --drops {drops}" if drops is not None else "")
        print("\n".join(figures_table(figures)))
    text = report(trends, command, steps, wall, warmup, figures)
    if out:
        out.write_text(text)
    print("\n".join(summary_table(trends)))
    return _verdict(trends, report_only)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="llds bench soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", choices=["cpu", "tiny", "gpu"], default="tiny", help="llds up preset")
    p.add_argument("--model", help="policy folder (as llds up --model)")
    p.add_argument("--steps", type=int, default=500, help="training steps to run")
    p.add_argument("--sample-every", type=int, default=10, help="trainer steps between samples")
    p.add_argument("--warmup", type=float, default=0.2, help="fraction of the steps left out of the fit")
    p.add_argument("--run-dir", type=Path, help="run dir (default runs/soak-<timestamp>)")
    p.add_argument("--out", type=Path, help="also write the Markdown report here (e.g. docs/soak_bench.md)")
    p.add_argument("--no-dashboard", action="store_true", help="do not run the dashboard")
    p.add_argument("--report-only", action="store_true", help="report the trends, exit 0 even if one grows")
    p.add_argument(
        "--resume",
        type=Path,
        metavar="RUN_DIR",
        help="continue a soak whose run was interrupted (llds up --resume), appending to its samples",
    )
    p.add_argument(
        "--from-samples",
        type=Path,
        metavar="JSONL",
        help="only analyse a soak_samples.jsonl written earlier (no services are started)",
    )
    p.add_argument("--train-log", type=Path, metavar="JSONL",
                   help="with --from-samples: the run's train_log.jsonl, for the run figures")  # fmt: skip
    p.add_argument("--drops", type=Path, metavar="LOG",
                   help="with --train-log: the run's soak_drops.log (the drops its services logged)")  # fmt: skip
    args = p.parse_args(argv)
    if args.from_samples is not None:
        return _from_samples(
            args.from_samples, args.warmup, args.out, args.report_only, args.train_log, args.drops
        )
    if args.train_log is not None or args.drops is not None:
        p.error("--train-log and --drops go with --from-samples (a live soak reads its own run dir)")
    if args.steps < 1 or args.sample_every < 1 or not 0 <= args.warmup < 1:
        p.error("--steps and --sample-every must be >= 1 and --warmup in [0, 1)")

    from llds.supervisor import ChildFailed
    from llds.up import Up, UpConfig, _check_preset
    from llds_server.settings import ConfigError

    ports = {"retriever_port": 0, "rollout_port": 0, "trainer_port": 0, "dashboard_port": 0, "redis_port": 0}
    if args.resume is not None:
        if not (args.resume / "up_config.toml").is_file():
            p.error(f"{args.resume} is not a run dir of llds up (it has no up_config.toml)")
        cfg = UpConfig.load(args.resume / "up_config.toml",
                            {"steps": args.steps, "run_dir": args.resume, "exit_when_done": True, **ports})  # fmt: skip
    else:
        run_dir = args.run_dir or Path("runs") / time.strftime("soak-%Y%m%d-%H%M%S")
        cfg = UpConfig.load(None, {
            "preset": args.preset, "model": args.model, "steps": args.steps, "run_dir": run_dir,
            "exit_when_done": True, "dashboard": not args.no_dashboard, **ports,
        })  # fmt: skip
    up = Up(cfg, resume=args.resume is not None, echo=False)
    try:
        _check_preset(cfg)
        up.check_run_dir()
        up.check_engine()
    except (ConfigError, ValueError) as e:
        print(f"llds bench soak: {e}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    # Started from a script's background job, a process inherits SIGINT ignored; Ctrl-C (SIGINT)
    # must still stop the run cleanly.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sampler = Sampler(up, args.sample_every)
    command = "llds bench soak " + " ".join(sys.argv[1:] if argv is None else argv)
    code = 0
    t0 = time.monotonic()
    try:
        up.start(up.prepare())
        print(f"soak: {args.steps} steps, a sample every {args.sample_every} steps into {sampler.path}; "
              f"service logs in {up.run_dir / 'logs'}", flush=True)  # fmt: skip
        status = up.wait_for_steps(on_status=sampler.on_status)
        sampler.sample(max(int(str(status.get("step") or 0)), up.logged_step()))
    except KeyboardInterrupt:
        print("\nstopping ...")
        code = 130
    except ChildFailed as e:
        print(f"llds bench soak: the run failed: {e}", file=sys.stderr)
        code = 1
    finally:
        up.stop()
    wall_s = time.monotonic() - t0
    trends = analyse(sampler.samples, args.warmup)
    drops = drop_lines(up.run_dir)
    (up.run_dir / "soak_drops.log").write_text("".join(x + "\n" for x in drops))
    train_log = up.run_dir / "trainer" / "train_log.jsonl"
    figures = run_figures(sampler.samples, K.read_records(train_log), drops)
    (up.run_dir / "soak_figures.json").write_text(json.dumps(figures, indent=1) + "\n")
    text = report(trends, command, up.logged_step(), wall_s, args.warmup, figures)
    (up.run_dir / "soak_report.md").write_text(text)
    if args.out:
        args.out.write_text(text)
    print("\n" + "=" * 72)
    print("\n".join(summary_table(trends)))
    print("=" * 72)
    print(f"samples {sampler.path}\nreport  {up.run_dir / 'soak_report.md'}")
    verdict = _verdict(trends, args.report_only)
    return code or verdict


if __name__ == "__main__":
    raise SystemExit(main())
