"""``llds eval``: exact match, F1 and substring match of a policy with the published protocol.

Greedy decoding, at most 4 search turns, top-3 retrieval (the rollout's ``/answer``), per dataset and
averaged, written as JSON and Markdown. Either point it at a running rollout service
(``--rollout-url``) or give a model (``--model``): then it starts a rollout service (and, without
``--retriever-url``, a retriever over the synthetic world's BM25 index) for the run and stops them.

    llds eval --model ~/.cache/llds/models/smollm2-135m-warmstart-s0 --data synthworld-eval
    llds eval --rollout-url http://127.0.0.1:8001 --data nq.jsonl --data hotpotqa.jsonl --limit 500
    llds eval --rollout-url http://127.0.0.1:8001 --data data/search-r1/nq_hotpotqa_train/test.jsonl \
        --split-by data_source

``--split-by data_source`` reports each ``data_source`` of a file on its own row (Search-R1's merged
test file holds all seven sets); whenever any of the seven sets is evaluated, the report also gives
them in the layout of Search-R1's results table (one column per set, then the average).

Datasets: ``synthworld-eval`` / ``synthworld-train`` (built in), ``nq-bigbench`` (17.5k Natural
Questions restored from the ``bigbench`` package, with their 13.8k Wikipedia passages as the corpus:
evaluation only, never training data), or files in the FlashRAG/Search-R1 formats: JSONL rows with ``question`` and ``golden_answers`` (FlashRAG), or Search-R1 parquet/JSONL rows
with ``reward_model.ground_truth.target`` (``llds data fetch search-r1 --only train eval`` fetches
both forms).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from tqdm import tqdm

from llds.data_fetch import SEARCH_R1_EVAL
from llds_proto.reward import exact_match, f1_score, substring_match

PROTOCOL_MAX_TURNS = 4
"""Search turns in the published evaluation (search-protocol spec)."""

SPLIT_KEYS = ("data_source",)
"""Row fields ``--split-by`` can group a file's questions by."""

PAPER_LABELS = {"nq": "NQ†", "triviaqa": "TriviaQA*", "popqa": "PopQA*", "hotpotqa": "HotpotQA†",
                "2wikimultihopqa": "2wiki*", "musique": "Musique*", "bamboogle": "Bamboogle*"}  # fmt: skip
"""Column headings of Search-R1's results table by data set name (the ``data_source`` values and
the ``llds data fetch`` file names); † marks the sets in the training data, * the others."""


class EvalError(RuntimeError):
    """A dataset or service the evaluation cannot use; the message names it."""


@dataclass
class Example:
    id: str
    question: str
    golds: list[str]
    source: str | None = None
    """The row's ``data_source`` (Search-R1 files), if it has one."""


def _question_from_prompt(prompt: object) -> str:
    text = prompt[0]["content"] if isinstance(prompt, list) and prompt else str(prompt)  # type: ignore[index]
    marker = "Question: "
    return text.rsplit(marker, 1)[-1].strip() if marker in text else text.strip()


def row_to_example(row: dict[str, object], i: int) -> Example:
    """One dataset row in FlashRAG or Search-R1 form."""
    question = row.get("question") or _question_from_prompt(row.get("prompt", ""))
    golds = row.get("golden_answers")
    if golds is None:
        rm = row.get("reward_model") or {}
        golds = (rm.get("ground_truth") or {}).get("target") if isinstance(rm, dict) else None  # type: ignore[union-attr]
    if not question or golds is None:
        raise EvalError(f"row {i} has no question or gold answers (keys: {sorted(row)})")
    if isinstance(golds, str):
        golds = [golds]
    source = row.get("data_source")
    return Example(str(row.get("id", i)), str(question), [str(g) for g in golds],  # type: ignore[union-attr]
                   None if source is None else str(source))  # fmt: skip


NQ_BIGBENCH = "nq-bigbench"


def index_for(spec: str, world_seed: int) -> Path | None:
    """BM25 index a built-in set is evaluated against (built on first use); None for files."""
    from llds.up import ensure_world_index, run_tool

    if spec.startswith("synthworld"):
        return ensure_world_index(world_seed)
    if spec == NQ_BIGBENCH:
        from llds import assets
        from llds_retriever.nq import load_nq

        corpus, _ = load_nq()
        index = assets.cache_dir() / "indexes" / "nq-bigbench-bm25"
        if not (index / "COMPLETE").exists():
            run_tool(["index", "build", "--corpus", str(corpus), "--kind", "bm25", "--out", str(index)])
            (index / "COMPLETE").write_text("ok\n")
        return index
    return None


def load_dataset(spec: str, world_seed: int = 0) -> tuple[str, list[Example]]:
    """(name, examples) for a built-in set name or a file path."""
    if spec == NQ_BIGBENCH:
        from llds_retriever.nq import load_nq

        _, questions = load_nq()
        rows = [json.loads(line) for line in questions.read_text().splitlines() if line.strip()]
        return spec, [row_to_example(r, i) for i, r in enumerate(rows)]
    if spec in ("synthworld-eval", "synthworld-train"):
        from llds import assets, world

        world_dir = assets.cache_dir() / "worlds" / f"synthworld-s{world_seed}"
        if not (world_dir / "meta.json").exists():
            world.build(world_dir, seed=world_seed)
        path = world_dir / f"{spec.split('-')[1]}.jsonl"
    else:
        path = Path(spec)
    if not path.exists():
        raise EvalError(f"dataset {spec!r}: no such built-in set or file")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise EvalError("reading parquet needs pyarrow: pip install pyarrow") from e
        rows = pq.read_table(path).to_pylist()
    else:
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return (spec if spec.startswith("synthworld") else path.stem), [
        row_to_example(r, i) for i, r in enumerate(rows)
    ]


async def _ask_all(
    url: str, examples: list[Example], max_turns: int, concurrency: int
) -> list[dict[str, object]]:
    sem = asyncio.Semaphore(concurrency)
    out: list[dict[str, object]] = [{} for _ in examples]
    bar = tqdm(total=len(examples), desc="eval", unit="q")
    async with httpx.AsyncClient(timeout=600.0) as client:

        async def one(i: int, ex: Example) -> None:
            async with sem:
                r = await client.post(f"{url}/answer", json={"question": ex.question, "max_turns": max_turns})
            if r.status_code != 200:
                raise EvalError(f"/answer failed for {ex.id}: {r.status_code} {r.text[:200]}")
            body = r.json()
            pred = body.get("answer")
            out[i] = {
                "id": ex.id,
                "data_source": ex.source,
                "question": ex.question,
                "golds": ex.golds,
                "prediction": pred,
                "em": exact_match(pred, ex.golds),
                "f1": f1_score(pred, ex.golds),
                "substring": substring_match(pred, ex.golds),
                "searches": sum(1 for t in body.get("turns", []) if t.get("search_query")),
                "turns": len(body.get("turns", [])),
                "weights_version": body.get("weights_version"),
            }
            bar.update(1)

        await asyncio.gather(*(one(i, ex) for i, ex in enumerate(examples)))
    bar.close()
    return out


def summarize(name: str, results: list[dict[str, object]]) -> dict[str, float | int | str]:
    """Mean metrics of one dataset."""
    n = len(results)

    def mean(k: str) -> float:
        return sum(float(r[k]) for r in results) / n if n else 0.0  # type: ignore[arg-type]

    return {"dataset": name, "n": n, "em": mean("em"), "f1": mean("f1"), "substring": mean("substring"),
            "searches": mean("searches"), "turns": mean("turns")}  # fmt: skip


def split_examples(name: str, examples: list[Example], key: str | None) -> list[tuple[str, list[Example]]]:
    """A data set as (name, examples) groups: itself without a key, else one group per value of
    ``key`` (Search-R1's seven sets in its table's order, then any others by name)."""
    if key is None:
        return [(name, examples)]
    groups: dict[str, list[Example]] = {}
    for i, ex in enumerate(examples):
        if ex.source is None:
            raise EvalError(f"--split-by {key}: row {i} ({ex.id}) of {name} has no {key}")
        groups.setdefault(ex.source, []).append(ex)
    order = {n: i for i, (n, _) in enumerate(SEARCH_R1_EVAL)}
    return sorted(groups.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))


def paper_table(rows: list[dict[str, float | int | str]]) -> str:
    """Search-R1's results layout (a column per data set, then the average) for those of ``rows``
    that are among its seven sets; "" if none is."""
    by_name = {str(r["dataset"]): r for r in rows}
    present = [n for n, _ in SEARCH_R1_EVAL if n in by_name]
    if not present:
        return ""
    avg = "Avg." if len(present) == len(SEARCH_R1_EVAL) else f"Avg. ({len(present)} of {len(SEARCH_R1_EVAL)})"
    lines = ["| | " + " | ".join(PAPER_LABELS[n] for n, _ in SEARCH_R1_EVAL) + f" | {avg} |",
             "|---" * (len(SEARCH_R1_EVAL) + 2) + "|"]  # fmt: skip
    for metric, label in (("em", "EM"), ("f1", "F1")):
        cells = [f"{float(by_name[n][metric]):.3f}" if n in by_name else "–" for n, _ in SEARCH_R1_EVAL]
        mean = sum(float(by_name[n][metric]) for n in present) / len(present)
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {mean:.3f} |")
    counts = [str(by_name[n]["n"]) if n in by_name else "–" for n, _ in SEARCH_R1_EVAL]
    lines.append("| n | " + " | ".join(counts) + f" | {sum(int(by_name[n]['n']) for n in present)} |")
    return (
        "\n".join(lines)
        + "\n\n† in the training data (NQ, HotpotQA), * not; the average is over data sets.\n"
    )


def markdown(rows: list[dict[str, float | int | str]], meta: dict[str, object]) -> str:
    shape = meta.get("shape") or {}
    where = f" (rollout config {meta['rollout_config']})" if meta.get("rollout_config") else ""
    lines = [f"# Evaluation: {meta['model']}", "", f"Greedy, max {meta['max_turns']} search turns, top-"
             f"{shape.get('topk', 3)} retrieval, at most {shape.get('max_tokens_per_turn', '?')} tokens a turn and "
             f"{shape.get('max_obs_tokens', '?')} per search{where}; weights version {meta['weights_version']}; "
             f"{meta['seconds']:.0f} s.", "",
             "| dataset | n | EM | F1 | substring | searches/q | turns/q |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['dataset']} | {r['n']} | {r['em']:.3f} | {r['f1']:.3f} | {r['substring']:.3f} "
                     f"| {r['searches']:.2f} | {r['turns']:.2f} |")  # fmt: skip
    wide = paper_table(rows)
    if wide:
        lines += ["", "## In Search-R1's table layout", "", wide.rstrip("\n")]
    return "\n".join(lines) + "\n"


class _Services:
    """Retriever + rollout started for a ``--model`` evaluation, stopped afterwards."""

    def __init__(
        self,
        model: str,
        retriever_url: str | None,
        index: Path | None,
        log_dir: Path,
        engine: str = "vllm",
        rollout_config: Path | None = None,
    ):
        self.model, self.retriever_url, self.index, self.log_dir = (
            model,
            retriever_url,
            index,
            log_dir,
        )
        self.engine = engine
        self.rollout_config = rollout_config
        self.children: list = []

    def __enter__(self) -> str:
        from llds.supervisor import Child, wait_healthy
        from llds_server.http import free_port

        py = [sys.executable, "-m", "llds.cli"]
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        if self.retriever_url is None:
            assert self.index is not None
            port = free_port()
            c = Child("retriever", [*py, "retriever", "serve", "--index", str(self.index), "--port", str(port)],
                      self.log_dir / "retriever.log", env).start(echo=False)  # fmt: skip
            self.children.append(c)
            self.retriever_url = f"http://127.0.0.1:{port}"
            wait_healthy(c, f"{self.retriever_url}/health", 300)
        port = free_port()
        config = ["--config", str(self.rollout_config)] if self.rollout_config else []
        c = Child("rollout", [*py, "rollout", "serve", *config, "--no-train", "--engine", self.engine, "--model",
                              self.model, "--retriever-url", self.retriever_url, "--port", str(port)],
                  self.log_dir / "rollout.log", env).start(echo=False)  # fmt: skip
        self.children.append(c)
        url = f"http://127.0.0.1:{port}"
        wait_healthy(c, f"{url}/health", 600)
        return url

    def __exit__(self, *exc: object) -> None:
        for c in reversed(self.children):
            c.stop()


def run(args: argparse.Namespace) -> dict[str, object]:
    datasets = [
        group for d in args.data for group in split_examples(*load_dataset(d, args.world_seed), args.split_by)
    ]
    names = [n for n, _ in datasets]
    if len(set(names)) != len(names):
        raise EvalError(f"data set names repeat ({', '.join(names)}): evaluate those sets apart")
    if args.limit:
        datasets = [(n, exs[: args.limit]) for n, exs in datasets]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if args.rollout_url:
        url_ctx: object = None
        url = args.rollout_url.rstrip("/")
    else:
        index = None
        if not args.retriever_url:
            indexes = {index_for(d, args.world_seed) for d in args.data}
            if None in indexes or len(indexes) != 1:
                raise EvalError(
                    "these datasets need different retrievers (or a file set needs one): pass --retriever-url"
                )
            index = indexes.pop()
        url_ctx = _Services(
            args.model, args.retriever_url, index, out / "logs", args.engine, args.rollout_config
        )
        url = url_ctx.__enter__()  # type: ignore[attr-defined]
    try:
        rows, per_example = [], {}
        version = None
        for name, exs in datasets:
            results = asyncio.run(_ask_all(url, exs, args.max_turns, args.concurrency))
            per_example[name] = results
            rows.append(summarize(name, results))
            version = results[0]["weights_version"] if results else version
    finally:
        if url_ctx is not None:
            url_ctx.__exit__(None, None, None)  # type: ignore[attr-defined]
    if len(rows) > 1:
        avg = {
            k: sum(float(r[k]) for r in rows) / len(rows)
            for k in ("em", "f1", "substring", "searches", "turns")
        }
        rows.append({"dataset": "average", "n": sum(int(r["n"]) for r in rows), **avg})
    meta = {"model": args.model or args.rollout_url, "max_turns": args.max_turns, "weights_version": version,
            "seconds": time.monotonic() - t0, "split_by": args.split_by}  # fmt: skip
    if args.model:  # the rollout started here: its answer shape (a --rollout-url service's is its own)
        meta["rollout_config"] = str(args.rollout_config) if args.rollout_config else None
        meta["shape"] = answer_shape(args.rollout_config)
    report = {"meta": meta, "summary": rows, "examples": per_example}
    (out / "eval.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "eval.md").write_text(markdown(rows, meta))
    print(markdown(rows, meta))
    print(f"wrote {out / 'eval.json'} and {out / 'eval.md'}")
    return report


def answer_shape(rollout_config: Path | None) -> dict[str, int]:
    """Top-k and token limits of answers from a rollout started with ``rollout_config`` (or defaults)."""
    from llds_rollout.config import RolloutSettings

    s = RolloutSettings.load(rollout_config, {"train": False})
    return {"topk": s.topk, "max_tokens_per_turn": s.max_tokens_per_turn, "max_obs_tokens": s.max_obs_tokens}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llds eval", description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="policy folder or hub name (starts a rollout service for the run)")
    src.add_argument("--rollout-url", help="a running rollout service")
    p.add_argument(
        "--data",
        action="append",
        required=True,
        help="synthworld-eval, synthworld-train, nq-bigbench or a file; repeatable",
    )
    p.add_argument(
        "--retriever-url", help="retriever to use with --model (default: BM25 over the built-in set corpus)"
    )
    p.add_argument(
        "--max-turns", type=int, default=PROTOCOL_MAX_TURNS, help="search turns (published protocol: 4)"
    )
    p.add_argument(
        "--engine",
        choices=["vllm", "transformers"],
        default="vllm",
        help="inference backend of the rollout started for --model",
    )
    p.add_argument(
        "--rollout-config",
        type=Path,
        help="rollout TOML of the rollout started for --model (top-k, document and turn lengths; default: "
        "the rollout's defaults, 3 documents of 500 tokens, 500 tokens a turn)",
    )
    p.add_argument(
        "--split-by",
        choices=SPLIT_KEYS,
        help="report each value of this row field on its own row (data_source: the sets of Search-R1's "
        "merged test file)",
    )
    p.add_argument("--limit", type=int, default=0, help="first N questions of each set (0 = all)")
    p.add_argument("--concurrency", type=int, default=8, help="questions in flight")
    p.add_argument("--world-seed", type=int, default=0, help="seed of the built-in synthetic world")
    p.add_argument("--out", default="runs/eval", help="report folder")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.rollout_config is not None and (args.model is None or not args.rollout_config.is_file()):
        p.error(f"--rollout-config {args.rollout_config}: needs --model and an existing TOML file")
    if args.max_turns < 1 or args.concurrency < 1 or args.limit < 0:
        p.error(
            f"--max-turns ({args.max_turns}) and --concurrency ({args.concurrency}) must be >= 1, --limit >= 0"
        )
    try:
        run(args)
    except EvalError as e:
        print(f"llds eval: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
