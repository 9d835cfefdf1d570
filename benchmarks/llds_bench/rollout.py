"""``llds bench rollout``: the asynchronous loop against Search-R1's synchronous turn-batched loop,
engine utilisation, and live weight swap against an engine restart. Writes a markdown report.

    llds bench rollout --model DIR [--engine vllm|transformers] [--trajectories 64]
        [--concurrency 16] [--latency-ms 50] [--out docs/rollout_bench.md]

Workload: each trajectory follows a seeded plan (0..max_turns searches, a token budget per turn),
because neither a random test model nor the un-warm-started policy emits search calls; the engine,
the token flow (context as ids, observations appended as ids) and the retriever (a real HTTP server
with injected latency) are the real ones. Both loops run the same plans on the same engine.
- async: every trajectory advances on its own (generate, retrieve, generate), ``--concurrency`` in
  flight; one that finishes is replaced by the next prompt at once, as in the service.
- sync: prompts in batches of ``--concurrency``; per turn, generate for every live trajectory of the
  batch and wait for the slowest, then one batched retrieval for all of them (Search-R1's scheme),
  then the next turn; the next batch starts when the whole batch is done.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import math
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

QUESTION = "who wrote the play hamlet"
DOCS = [
    {
        "id": str(i),
        "contents": f'"Doc {i}"\n' + "Hamlet is a tragedy by William Shakespeare, set in Denmark. " * 6,
    }
    for i in range(3)
]


@dataclass(frozen=True)
class Plan:
    """What one trajectory does: generate ``tokens[i]`` in turn i; turns before the last search."""

    tokens: list[int]


def make_plans(n: int, max_turns: int, lo: int, hi: int, seed: int) -> list[Plan]:
    rng = random.Random(seed)
    return [Plan([rng.randint(lo, hi) for _ in range(rng.randint(0, max_turns) + 1)]) for _ in range(n)]


def tok_s_at(scaling: dict[int, float], n: int) -> float:
    """Engine tokens/s with ``n`` sequences decoding, interpolated (linear in log n) between the
    measured points and held flat outside them."""
    pts = sorted(scaling.items())
    if n <= pts[0][0]:
        return pts[0][1]
    for (a, va), (b, vb) in itertools.pairwise(pts):
        if n <= b:
            w = (math.log(n) - math.log(a)) / (math.log(b) - math.log(a))
            return va + w * (vb - va)
    return pts[-1][1]


def ideal_speedup(plans: list[Plan], concurrency: int, scaling: dict[int, float], latency_s: float) -> float:
    """Async / sync speed-up a perfect implementation of each loop would get on an engine whose
    throughput at each batch size is ``scaling`` (prefill ignored).

    sync: per batch and turn, decode steps while sequences finish one by one (each step costs
    ``n / tok_s(n)`` for ``n`` live sequences), then one retrieval; async: every token at the
    throughput of ``concurrency`` sequences, retrieval hidden.
    """
    sync_s = 0.0
    for start in range(0, len(plans), concurrency):
        batch = plans[start : start + concurrency]
        for turn in range(max(len(p.tokens) for p in batch)):
            budgets = sorted(p.tokens[turn] for p in batch if turn < len(p.tokens))
            done = 0
            for i, b in enumerate(budgets):  # steps done..b run with len(budgets) - i sequences
                n = len(budgets) - i
                sync_s += (b - done) * n / tok_s_at(scaling, n)
                done = b
            if any(turn < len(p.tokens) - 1 for p in batch):
                sync_s += latency_s
    tokens = sum(sum(p.tokens) for p in plans)
    return sync_s / (tokens / tok_s_at(scaling, concurrency))


def retriever_app(latency_s: float) -> Any:
    """A /retrieve that sleeps ``latency_s`` per request, then returns fixed documents."""
    from fastapi import FastAPI

    app = FastAPI()

    @app.post("/retrieve")
    async def retrieve(body: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(latency_s)
        return {
            "result": [
                [{"document": d, "score": 1.0} for d in DOCS[: body.get("topk", 3)]] for _ in body["queries"]
            ]
        }

    return app


class Workload:
    def __init__(self, engine: Any, tokenizer: Any, retriever_url: str, obs_tokens: int) -> None:
        from llds_proto.search_protocol import observation_ids, prompt_ids

        self.engine = engine
        self.url = retriever_url
        self.prompt = prompt_ids(tokenizer, QUESTION)
        self.obs = observation_ids(tokenizer, DOCS, obs_tokens)
        self.failed = 0
        self.requests: list[tuple[list[int], int]] = []
        """(context ids, max tokens) of every generation, to replay for plain throughput."""

    async def _gen(self, ctx: list[int], n: int) -> list[int]:
        from llds_rollout.engine.base import GenerationRequest

        self.requests.append((list(ctx), n))
        try:
            res = await self.engine.generate(GenerationRequest(ctx, max_tokens=n, temperature=1.0))
        except Exception:
            self.failed += 1
            raise
        return res.token_ids

    async def _trajectory(self, client: Any, p: Plan) -> int:
        ctx, gen = list(self.prompt), 0
        for i, n in enumerate(p.tokens):
            out = await self._gen(ctx, n)
            ctx += out
            gen += len(out)
            if i < len(p.tokens) - 1:
                r = await client.post(f"{self.url}/retrieve", json={"queries": ["hamlet"], "topk": 3})
                r.raise_for_status()
                ctx += self.obs
        return gen

    async def run_async(self, plans: list[Plan], concurrency: int) -> tuple[float, int]:
        """``concurrency`` trajectories in flight; each one that finishes is replaced by the next
        (the service draws prompts continuously)."""
        import httpx

        async with httpx.AsyncClient(timeout=30) as client:
            todo = iter(plans)
            total = 0

            async def worker() -> None:
                nonlocal total
                for p in todo:  # shared iterator: each plan runs once
                    n = await self._trajectory(client, p)
                    total += n

            t0 = time.perf_counter()
            await asyncio.gather(*[worker() for _ in range(min(concurrency, len(plans)))])
            return time.perf_counter() - t0, total

    async def run_sync(self, plans: list[Plan], concurrency: int) -> tuple[float, int]:
        """Batches of ``concurrency`` prompts; within a batch, per turn: generate for every live
        trajectory and wait for the slowest, then one batched retrieval, then the next turn."""
        import httpx

        async with httpx.AsyncClient(timeout=30) as client:
            total = 0
            t0 = time.perf_counter()
            for start in range(0, len(plans), concurrency):
                batch = plans[start : start + concurrency]
                ctxs = [list(self.prompt) for _ in batch]
                for turn in range(max(len(p.tokens) for p in batch)):
                    live = [i for i, p in enumerate(batch) if turn < len(p.tokens)]
                    outs = await asyncio.gather(*[self._gen(ctxs[i], batch[i].tokens[turn]) for i in live])
                    for i, out in zip(live, outs, strict=True):
                        ctxs[i] += out
                        total += len(out)
                    searching = [i for i in live if turn < len(batch[i].tokens) - 1]
                    if searching:
                        body = {"queries": ["hamlet"] * len(searching), "topk": 3}
                        (await client.post(f"{self.url}/retrieve", json=body)).raise_for_status()
                        for i in searching:
                            ctxs[i] += self.obs
            return time.perf_counter() - t0, total

    async def run_plain(self, requests: list[tuple[list[int], int]], concurrency: int) -> tuple[float, int]:
        """The same generations (the same contexts, the same token budgets, in the same order) with no
        agent loop around them, at most ``concurrency`` at once, after the prefix cache is cleared:
        the engine's own throughput on the rollout's work."""
        from llds_rollout.engine.base import GenerationRequest

        await self.engine.reset_cache()
        todo = iter([GenerationRequest(ctx, max_tokens=n, temperature=1.0) for ctx, n in requests])
        total = 0

        async def worker() -> None:
            nonlocal total
            for r in todo:
                out = await self.engine.generate(r)
                total += len(out.token_ids)

        t0 = time.perf_counter()
        await asyncio.gather(*[worker() for _ in range(concurrency)])
        return time.perf_counter() - t0, total


def _publish_copy(model_dir: Path, root: Path, version: int) -> Path:
    """A published folder (trainer layout + COMPLETE marker) holding perturbed weights of the model."""
    import torch
    from safetensors.torch import load_file, save_file

    from llds_rollout.weights import write_marker

    folder = root / f"v{version:06d}"
    folder.mkdir(parents=True)
    for f in model_dir.iterdir():
        if f.is_file() and not f.name.endswith(".safetensors") and not f.name.startswith("."):
            shutil.copy(f, folder / f.name)
    for st in model_dir.glob("*.safetensors"):
        tensors = {k: v + 1e-3 * torch.randn_like(v) for k, v in load_file(str(st)).items()}
        save_file(tensors, str(folder / st.name))
    write_marker(folder, version)
    return folder


def _has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _build_engine(args: argparse.Namespace, model: str) -> Any:
    from llds_rollout.config import TransformersEngineSettings, VLLMEngineSettings
    from llds_rollout.engine import build_engine

    if args.engine == "vllm":
        return build_engine(model, VLLMEngineSettings(max_batch_size=args.batch, max_model_len=2048))
    return build_engine(
        model, TransformersEngineSettings(max_batch_size=args.batch, torch_threads=args.threads)
    )


async def _swap_during_rollout(
    work: Workload, engine: Any, folder: Path, plans: list[Plan], concurrency: int
) -> dict[str, float]:
    from llds_rollout.weights import load_tensors, verify_published

    async def swap() -> dict[str, float]:
        await asyncio.sleep(0.5)
        t0 = time.perf_counter()
        pub = await asyncio.to_thread(verify_published, folder.parent, folder.name, 1)
        t1 = time.perf_counter()
        tensors = await asyncio.to_thread(load_tensors, pub)
        t2 = time.perf_counter()
        await engine.update_weights(tensors, pub.folder, 1)
        t3 = time.perf_counter()
        return {"swap_s": t3 - t0, "verify_s": t1 - t0, "read_s": t2 - t1, "drain_swap_s": t3 - t2}

    (_, _), times = await asyncio.gather(work.run_async(plans, concurrency), swap())
    return times


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="llds bench rollout", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="model folder (the default policy: SmolLM2-135M)")
    p.add_argument("--engine", choices=["vllm", "transformers"], default="vllm")
    p.add_argument("--trajectories", type=int, default=64)
    p.add_argument(
        "--concurrency",
        type=int,
        default=16,
        help="trajectories in flight (async) / prompts per batch (sync)",
    )
    p.add_argument("--max-turns", type=int, default=3, help="most searches per trajectory")
    p.add_argument("--tokens", default="16,64", help="token budget per turn: LO,HI (uniform)")
    p.add_argument("--obs-tokens", type=int, default=120, help="observation tokens per search")
    p.add_argument("--latency-ms", type=float, default=50.0, help="injected retriever latency")
    p.add_argument("--batch", type=int, default=32, help="engine max batch size")
    p.add_argument("--threads", type=int, default=0, help="torch threads, transformers backend (0 = default)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each loop (best is kept)")
    p.add_argument("--no-swap", action="store_true", help="skip the weight-swap measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default="docs/rollout_bench.md", help="markdown report")
    args = p.parse_args(argv)
    lo, hi = (int(x) for x in args.tokens.split(","))
    model_dir = Path(args.model)
    if not (model_dir / "config.json").is_file():
        print(f"error: {model_dir} is not a model folder", file=sys.stderr)
        return 2

    from transformers import AutoTokenizer

    from llds_server.http import BackgroundServer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    plans = make_plans(args.trajectories, args.max_turns, lo, hi, args.seed)
    print(f"[bench] engine={args.engine} model={model_dir.name} trajectories={len(plans)}", flush=True)
    t0 = time.perf_counter()
    engine = _build_engine(args, str(model_dir))
    engine.start()
    start_s = time.perf_counter() - t0
    rows: dict[str, Any] = {"engine_start_s": start_s, "load": os.getloadavg()[0], "gpu": _has_gpu()}
    with BackgroundServer(retriever_app(args.latency_ms / 1000)) as srv:
        work = Workload(engine, tok, srv.url, args.obs_tokens)
        asyncio.run(work.run_plain([(work.prompt, 8)] * 4, 4))  # warm-up (vLLM compiles here)
        best: dict[str, tuple[float, int]] = {}
        for rep in range(args.repeats):
            for mode in ("sync", "async"):
                work.requests = []
                run = work.run_async if mode == "async" else work.run_sync
                wall, toks = asyncio.run(run(plans, args.concurrency))
                print(
                    f"[bench] {mode} run {rep + 1}: {wall:.1f} s, {len(plans) / wall:.2f} traj/s", flush=True
                )
                if mode not in best or wall < best[mode][0]:
                    best[mode] = (wall, toks)
                if mode == "async":
                    replay = list(work.requests)
        plain_wall, plain_toks = asyncio.run(work.run_plain(replay, args.concurrency))
        print(f"[bench] plain generation: {plain_toks / plain_wall:.1f} tok/s", flush=True)
        # How the engine's throughput grows with the batch: what any batching or overlap can win.
        scaling = {}
        for c in sorted({1, 4, args.concurrency}):
            first = replay[: max(16, 6 * c)]
            wall, toks = asyncio.run(work.run_plain(first, c))
            scaling[c] = toks / wall
            print(f"[bench] plain generation, {c} at once: {scaling[c]:.1f} tok/s", flush=True)
        rows["scaling"] = scaling
        rows.update(
            sync_tps=len(plans) / best["sync"][0],
            async_tps=len(plans) / best["async"][0],
            async_tok_s=best["async"][1] / best["async"][0],
            sync_tok_s=best["sync"][1] / best["sync"][0],
            plain_tok_s=plain_toks / plain_wall,
        )
        if not args.no_swap:
            with tempfile.TemporaryDirectory() as tmp:
                folder = _publish_copy(model_dir, Path(tmp), 1)
                work.failed = 0
                times = asyncio.run(_swap_during_rollout(work, engine, folder, plans, args.concurrency))
                rows.update(times, failed_during_swap=work.failed, version_after=engine.version)
                print(f"[bench] swap {times}, failed requests {work.failed}", flush=True)
                engine.shutdown()
                t0 = time.perf_counter()
                engine = _build_engine(args, str(folder))
                engine.start()
                asyncio.run(
                    work.__class__(engine, tok, srv.url, args.obs_tokens).run_plain([(work.prompt, 1)], 1)
                )
                rows["restart_s"] = time.perf_counter() - t0
                print(f"[bench] restart {rows['restart_s']:.2f} s", flush=True)
        engine.shutdown()
    report = _report(args, rows, plans)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(report)
    print(report)
    return 0


def _report(args: argparse.Namespace, r: dict[str, Any], plans: list[Plan]) -> str:
    turns = sum(len(p.tokens) for p in plans) / len(plans)
    cmd = "llds bench rollout " + " ".join(
        [f"--model {args.model}", f"--engine {args.engine}", f"--trajectories {args.trajectories}",
         f"--concurrency {args.concurrency}",
         f"--max-turns {args.max_turns}", f"--tokens {args.tokens}", f"--obs-tokens {args.obs_tokens}",
         f"--latency-ms {args.latency_ms:g}", f"--batch {args.batch}", f"--threads {args.threads}",
         f"--repeats {args.repeats}"]
    )  # fmt: skip
    lines = [
        f"# Rollout benchmark ({args.engine} backend)",
        "",
        f"Command: `{cmd}`",
        "",
        f"Workload: {len(plans)} trajectories, {args.concurrency} in flight (async) or per batch (sync), "
        f"{turns:.2f} turns each on average, {args.tokens.replace(',', '-')} "
        f"tokens per turn, {args.obs_tokens}-token observations, retriever latency {args.latency_ms:g} ms.",
        f"Machine: {os.cpu_count()} CPU cores, load average {r.get('load', 0.0):.2f} at the start; "
        f"{'GPU' if r.get('gpu') else 'no GPU'}.",
        "",
        "The ideal speed-ups model each loop done perfectly (prefill ignored): the synchronous loop's "
        "decode steps run with fewer and fewer live sequences as a turn's shorter ones finish, each step "
        "costing what the measured batch scaling says; the asynchronous loop keeps the engine at "
        f"{args.concurrency} sequences. An engine whose throughput barely grows with the batch leaves "
        "little for asynchrony to win; one whose step time is flat in the batch (a GPU at these sizes) "
        "leaves the second figure.",
        "",
        "| metric | value | target |",
        "|---|---|---|",
        f"| trajectories/s, async loop | {r['async_tps']:.2f} | |",
        f"| trajectories/s, synchronous turn-batched loop | {r['sync_tps']:.2f} | |",
        f"| speed-up async / sync | {r['async_tps'] / r['sync_tps']:.2f}x | >= 2x |",
        f"| generated tokens/s during async rollout | {r['async_tok_s']:.1f} | |",
        f"| plain generation tokens/s, same requests, same concurrency | {r['plain_tok_s']:.1f} | |",
        f"| engine utilisation (async / plain) | {100 * r['async_tok_s'] / r['plain_tok_s']:.0f}% | >= 80% |",
        f"| engine start | {r['engine_start_s']:.1f} s | |",
    ]
    ideal = ideal_speedup(plans, args.concurrency, r["scaling"], args.latency_ms / 1000)
    measured = r["async_tps"] / r["sync_tps"]
    lines.insert(
        lines.index(next(x for x in lines if x.startswith("| speed-up async / sync"))) + 1,
        f"| ideal speed-up on this engine (from its batch scaling below) | {ideal:.2f}x; measured = "
        f"{100 * measured / ideal:.0f}% of it | |",
    )
    c1 = r["scaling"][min(r["scaling"])]
    linear = {n: c1 * n for n in r["scaling"]}
    lines.insert(
        lines.index(next(x for x in lines if x.startswith("| ideal speed-up on this engine"))) + 1,
        f"| ideal speed-up if throughput grew linearly with the batch (GPU-like; a model, not a "
        f"measurement) | {ideal_speedup(plans, args.concurrency, linear, args.latency_ms / 1000):.2f}x | |",
    )
    base = r["scaling"][min(r["scaling"])]
    lines += [
        f"| plain generation tokens/s with {c} request(s) at once | {v:.1f} ({v / base:.1f}x one at a time) | |"
        for c, v in sorted(r["scaling"].items())
    ]
    if "swap_s" in r:
        lines += [
            f"| weight swap, publish to serving | {r['swap_s']:.2f} s | |",
            f"| of which: sha256 verification / reading safetensors | {r['verify_s']:.2f} s / {r['read_s']:.2f} s | |",
            f"| of which: in-flight requests finishing, then the swap | {r['drain_swap_s']:.2f} s | |",
            f"| engine restart with the new weights, to first token | {r['restart_s']:.2f} s | |",
            f"| restart / swap | {r['restart_s'] / r['swap_s']:.1f}x | |",
            f"| requests failed during the swap | {r['failed_during_swap']} | 0 |",
        ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # vLLM spawns processes: the guard keeps them from running this again
    raise SystemExit(main(sys.argv[1:]))
