"""``llds bench retriever``: throughput, latency and recall of the retriever on Natural Questions.

    llds bench retriever                 # full run (~15 min on 2 CPU cores), writes docs/retriever_bench.md
    llds bench retriever --quick         # smoke run on a small slice (~2 min)
    llds bench retriever --corpus C.jsonl --questions Q.jsonl --quick   # any data with gold passage ids

What it measures, in one run:
1. recall@1 and @5 of the gold passage for BM25, dense and hybrid (in-process, no HTTP);
2. the ceiling: query-encoder throughput at its best batch size, no HTTP;
3. closed-loop load with 1, 16, 64 and 256 concurrent single-query clients against (a) our server
   and (b) the Search-R1-style baseline (``llds_retriever.baseline``), one after the other on the same
   machine, each a subprocess on loopback. Our server runs with the cache off and every query is a
   different question, so the numbers measure batching, not caching.

Data: NQ passages from the ``bigbench`` sdist (evaluation use only, see :mod:`llds_retriever.nq`).
Questions JSONL rows need ``question`` and ``gold_id`` (the id of the passage that answers it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from llds_server.http import free_port

# --------------------------------------------------------------------------------------------------
# Load generator: a minimal HTTP/1.1 keep-alive client, cheap enough not to steal the server's CPU.
# --------------------------------------------------------------------------------------------------


class _Conn:
    def __init__(self, host: str, port: int):
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        raw = await self.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        data = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return status, data

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


@dataclass
class LoadResult:
    """One concurrency level against one server."""

    clients: int
    ok: int
    rejected: int
    errors: int
    seconds: float
    latencies: np.ndarray

    @property
    def qps(self) -> float:
        return self.ok / self.seconds

    def pct(self, p: float) -> float:
        return float(np.percentile(self.latencies, p)) * 1000 if len(self.latencies) else float("nan")


async def run_load(
    host: str, port: int, queries: list[str], clients: int, seconds: float, warmup: float, topk: int = 3
) -> LoadResult:
    """``clients`` closed-loop clients, each sending one query per request, for warmup + seconds."""
    counter = iter(range(1 << 60))
    lat: list[float] = []
    stats = {"ok": 0, "rejected": 0, "errors": 0}
    start = time.perf_counter()
    t_measure, t_end = start + warmup, start + warmup + seconds

    async def client() -> None:
        conn = _Conn(host, port)
        try:
            while time.perf_counter() < t_end:
                q = queries[next(counter) % len(queries)]
                body = json.dumps({"queries": [q], "topk": topk, "return_scores": True}).encode()
                t0 = time.perf_counter()
                try:
                    status, _ = await conn.post("/retrieve", body)
                except (OSError, asyncio.IncompleteReadError):
                    await conn.close()
                    status = -1
                t1 = time.perf_counter()
                # Count what completes inside the window, whenever it started: with latencies of
                # seconds, dropping requests started before the window would understate throughput.
                if not t_measure <= t1 <= t_end:
                    continue
                if status == 200:
                    stats["ok"] += 1
                    lat.append(t1 - t0)
                elif status == 503:
                    stats["rejected"] += 1
                    await asyncio.sleep(0.01)
                else:
                    stats["errors"] += 1
        finally:
            await conn.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return LoadResult(clients, stats["ok"], stats["rejected"], stats["errors"], seconds, np.asarray(lat))


# --------------------------------------------------------------------------------------------------
# Servers as subprocesses
# --------------------------------------------------------------------------------------------------


def wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    """Poll ``url``/health until 200; raise if the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before becoming healthy")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} not healthy after {timeout:.0f} s")


class Server:
    """A server subprocess on a free loopback port, stopped on exit."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None, log_path: Path | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (log_path or Path(os.devnull)).open("wb")
        self.proc = subprocess.Popen(
            [*argv, "--port", str(self.port)],
            env={**os.environ, **(env or {})},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def __enter__(self) -> Server:
        try:
            wait_healthy(self.url, self.proc, timeout=300)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


# --------------------------------------------------------------------------------------------------
# Recall and ceiling (in-process)
# --------------------------------------------------------------------------------------------------


def recall(
    backend: Any, ids: list[str], questions: list[dict[str, Any]], batch: int = 64
) -> dict[str, float]:
    """recall@1 and @5 of each question's gold passage."""
    hit1 = hit5 = 0
    for s in range(0, len(questions), batch):
        chunk = questions[s : s + batch]
        hits = backend.search([q["question"] for q in chunk], 5)
        for q, rows in zip(chunk, hits.rows.tolist(), strict=True):
            got = [ids[r] for r in rows if r >= 0]
            hit1 += bool(got[:1] == [q["gold_id"]])
            hit5 += q["gold_id"] in got
    n = max(1, len(questions))
    return {"recall@1": hit1 / n, "recall@5": hit5 / n}


def encoder_ceiling(encoder: Any, queries: list[str], sizes: list[int], seconds: float) -> dict[int, float]:
    """Queries/s of ``encoder.encode_queries`` per batch size (no HTTP, no search)."""
    out = {}
    for bs in sizes:
        encoder.encode_queries(queries[:bs])  # warm-up
        n, i, t0 = 0, 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            batch = [queries[(i + j) % len(queries)] for j in range(bs)]
            encoder.encode_queries(batch)
            n, i = n + bs, i + bs
        out[bs] = n / (time.perf_counter() - t0)
    return out


# --------------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------------


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} CPU cores ({cpu}), Python {platform.python_version()}"


def render(report: dict[str, Any]) -> str:
    """Markdown report."""
    lines = [
        "# Retriever benchmark",
        "",
        f"Generated by `llds bench retriever{' --quick' if report['quick'] else ''}` on {report['machine']}; "
        f"load average before/after: {report['load_before']} / {report['load_after']}.",
        f"Data: {report['data']}; {report['passages']} passages, {report['n_load_queries']} distinct load "
        f"queries; encoder `{report['encoder']}`, dense flat inner-product index, topk 3, return_scores true.",
        f"Our server: max_wait_ms={report['max_wait_ms']}, max_batch={report['max_batch']}, cache off. "
        f"Both servers: torch threads {report['torch_threads'] or 'default'}; "
        f"{report['seconds']:.0f} s measured per level after {report['warmup']:.0f} s warm-up.",
        "",
        "## Recall of the gold passage",
        "",
        f"Over {report['n_recall']} questions.",
        "",
        "| backend | recall@1 | recall@5 |",
        "|---|---|---|",
    ]
    for name, r in report["recall"].items():
        lines.append(f"| {name} | {r['recall@1']:.3f} | {r['recall@5']:.3f} |")
    ceil = report["ceiling"]
    best_bs = max(ceil, key=ceil.get)
    lines += [
        "",
        "## Ceiling: query encoder alone (no HTTP, no search)",
        "",
        "| batch size | " + " | ".join(str(b) for b in ceil) + " |",
        "|---|" + "---|" * len(ceil),
        "| queries/s | " + " | ".join(f"{v:.0f}" for v in ceil.values()) + " |",
        "",
        f"Ceiling = {ceil[best_bs]:.0f} queries/s (batch {best_bs}).",
        "",
        "## Load: concurrent single-query clients",
        "",
        "| clients | ours q/s | ours p50 ms | ours p99 ms | baseline q/s | baseline p50 ms | baseline p99 ms "
        "| speed-up | % of ceiling | ours 503 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ours, base in zip(report["ours"], report["baseline"], strict=True):
        lines.append(
            f"| {ours['clients']} | {ours['qps']:.0f} | {ours['p50']:.1f} | {ours['p99']:.1f} | "
            f"{base['qps']:.0f} | {base['p50']:.1f} | {base['p99']:.1f} | "
            f"{ours['qps'] / max(base['qps'], 1e-9):.1f}x | {100 * ours['qps'] / ceil[best_bs]:.0f}% | "
            f"{ours['rejected']} |"
        )
    t = report.get("target")
    if t:
        lines += [
            "",
            f"Target at 64 clients: >= 5x baseline throughput ({t['speedup']:.1f}x: "
            f"{'met' if t['speedup'] >= 5 else 'not met'}), >= 70% of ceiling ({t['ceiling_pct']:.0f}%: "
            f"{'met' if t['ceiling_pct'] >= 70 else 'not met'}), lower p99 ({t['p99_ours']:.1f} vs "
            f"{t['p99_base']:.1f} ms: {'met' if t['p99_ours'] < t['p99_base'] else 'not met'}).",
        ]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open() as f:
        return [json.loads(line) for line in f if line.strip()]


def _subset_corpus(corpus: Path, questions: list[dict[str, Any]], n: int, out: Path) -> Path:
    """The first ``n`` passages plus every gold passage of ``questions``."""
    gold = {q["gold_id"] for q in questions}
    out.parent.mkdir(parents=True, exist_ok=True)
    with corpus.open() as src, out.open("w") as dst:
        for i, line in enumerate(src):
            if i < n or json.loads(line)["id"] in gold:
                dst.write(line)
    return out


def main(argv: list[str]) -> int:
    """Run the benchmark; prints the table and writes the markdown report."""
    p = argparse.ArgumentParser(prog="llds bench retriever", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small slice, short levels (smoke test)")
    p.add_argument("--corpus", type=Path, help="corpus JSONL (default: NQ passages from bigbench)")
    p.add_argument("--questions", type=Path, help="questions JSONL with question + gold_id")
    p.add_argument("--encoder", default="minilm")
    p.add_argument("--clients", default="1,16,64,256", help="comma-separated concurrency levels")
    p.add_argument("--seconds", type=float, help="measured seconds per level (default 15, quick 3)")
    p.add_argument("--warmup", type=float, help="warm-up seconds per level (default 3, quick 1)")
    p.add_argument("--recall-questions", type=int, help="questions for recall (default 2000, quick 100)")
    p.add_argument("--passages", type=int, help="limit the corpus (gold passages always kept)")
    p.add_argument("--max-wait-ms", type=float, default=1.0)
    p.add_argument("--max-batch", type=int, default=32)
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="encoder threads of both servers and the ceiling (0 = torch default)",
    )
    p.add_argument("--work-dir", type=Path, help="where indexes go (default: cache)")
    p.add_argument("--out", type=Path, default=Path("docs/retriever_bench.md"))
    args = p.parse_args(argv)
    if (args.corpus is None) != (args.questions is None):
        print("error: give both --corpus and --questions, or neither", file=sys.stderr)
        return 2
    clients = [int(c) for c in args.clients.split(",")]
    seconds = args.seconds or (3.0 if args.quick else 15.0)
    warmup = args.warmup if args.warmup is not None else (1.0 if args.quick else 3.0)
    n_recall = args.recall_questions or (100 if args.quick else 2000)

    import logging

    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from llds_retriever.backends import DenseBackend
    from llds_retriever.config import RetrieverConfig
    from llds_retriever.corpus import cache_root
    from llds_retriever.index import BuildOptions, build_index
    from llds_retriever.loader import load
    from llds_retriever.nq import load_nq

    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    if args.corpus is not None:
        corpus, qpath, data = args.corpus, args.questions, f"{args.corpus.name} / {args.questions.name}"
    else:
        corpus, qpath = load_nq()
        data = "Natural Questions passages from bigbench (contextual_parametric_knowledge_conflicts)"
    questions = _read_jsonl(qpath)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(questions))
    questions = [questions[i] for i in order]
    passages = args.passages or (1000 if args.quick else 0)
    work = args.work_dir or cache_root() / "retriever" / "bench"
    recall_qs = questions[:n_recall]
    if passages:
        corpus = _subset_corpus(corpus, recall_qs, passages, work / f"corpus-{passages}-{n_recall}.jsonl")
    index_dir = work / f"index-{corpus.stem}-{args.encoder.replace('/', '_')}"
    if args.torch_threads:
        import torch

        torch.set_num_threads(args.torch_threads)
    print(f"building hybrid index of {corpus} into {index_dir} (resumes if interrupted)", flush=True)
    manifest = build_index(
        BuildOptions(corpus=corpus, kind="hybrid", out=index_dir, encoder=args.encoder, device="cpu")
    )

    report: dict[str, Any] = {
        "quick": args.quick,
        "machine": _machine(),
        "load_before": f"{load_before:.2f}",
        "data": data,
        "passages": manifest["num_docs"],
        "encoder": args.encoder,
        "max_wait_ms": args.max_wait_ms,
        "max_batch": args.max_batch,
        "torch_threads": args.torch_threads,
        "seconds": seconds,
        "warmup": warmup,
        "n_recall": len(recall_qs),
        "recall": {},
    }
    dense = None
    for kind in ("bm25", "dense", "hybrid"):
        knobs = {} if kind == "bm25" else {"device": "cpu", "torch_threads": args.torch_threads}
        loaded = load(RetrieverConfig(index_dir=index_dir, backend={"type": kind, **knobs}))
        ids = [loaded.corpus.doc(r)["id"] for r in range(len(loaded.corpus))]
        report["recall"][kind] = recall(loaded.backend, ids, recall_qs)
        print(f"recall {kind}: {report['recall'][kind]}", flush=True)
        if kind == "dense":
            dense = loaded.backend
    assert isinstance(dense, DenseBackend)
    load_queries = [q["question"] for q in questions]
    report["n_load_queries"] = len(load_queries)
    sizes = [1, 16, 64, 128] if args.quick else [1, 16, 64, 128, 256]
    report["ceiling"] = encoder_ceiling(dense.encoder, load_queries, sizes, 1.0 if args.quick else 4.0)
    print(f"ceiling: {report['ceiling']}", flush=True)

    env = {"LLDS_RETRIEVER_BACKEND__TORCH_THREADS": str(args.torch_threads), "HF_HUB_OFFLINE": "1"}
    ours_argv = [
        sys.executable, "-m", "llds_retriever", "--index", str(index_dir), "--type", "dense",
        "--device", "cpu", "--cache-size", "0", "--max-wait-ms", str(args.max_wait_ms),
        "--max-batch", str(args.max_batch), "--max-queue", "4096", "--log-level", "warning",
    ]  # fmt: skip
    base_argv = [
        sys.executable, "-m", "llds_retriever.baseline", "--index", str(index_dir), "--type", "dense",
        "--torch-threads", str(args.torch_threads),
    ]  # fmt: skip
    for name, argv_ in (("ours", ours_argv), ("baseline", base_argv)):
        report[name] = []
        with Server(argv_, env=env, log_path=work / f"{name}.log") as srv:
            for c in clients:
                r = asyncio.run(run_load("127.0.0.1", srv.port, load_queries, c, seconds, warmup))
                row = {
                    "clients": c,
                    "qps": r.qps,
                    "p50": r.pct(50),
                    "p99": r.pct(99),
                    "rejected": r.rejected,
                    "errors": r.errors,
                }
                report[name].append(row)
                print(
                    f"{name:8s} clients={c:4d} q/s={r.qps:8.1f} p50={row['p50']:8.1f} ms "
                    f"p99={row['p99']:8.1f} ms 503={r.rejected} errors={r.errors}",
                    flush=True,
                )
    ceiling = max(report["ceiling"].values())
    at64 = [(o, b) for o, b in zip(report["ours"], report["baseline"], strict=True) if o["clients"] == 64]
    if at64:
        o, b = at64[0]
        report["target"] = {
            "speedup": o["qps"] / max(b["qps"], 1e-9),
            "ceiling_pct": 100 * o["qps"] / ceiling,
            "p99_ours": o["p99"],
            "p99_base": b["p99"],
        }
    report["load_after"] = f"{os.getloadavg()[0]:.2f}" if hasattr(os, "getloadavg") else "nan"
    text = render(report)
    print("\n" + text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    (args.out.with_suffix(".json")).write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")
    errors = sum(r["errors"] for r in report["ours"] + report["baseline"])
    return 1 if errors else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
