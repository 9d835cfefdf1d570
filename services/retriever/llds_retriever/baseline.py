"""The benchmark's baseline: a server built like Search-R1's ``retrieval_server.py``.

Each request is encoded and searched on its own, inside a synchronous FastAPI handler (so Starlette's
thread pool runs up to 40 at once), and the response is a dict serialised by FastAPI. Same encoder,
FAISS index and corpus as our server, so the benchmark measures only the serving design.
Not for production; ``llds bench retriever`` starts it as a subprocess:

    python -m llds_retriever.baseline --index DIR --port 8010 [--torch-threads 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import BaseModel


class QueryRequest(BaseModel):
    """Search-R1's request model, as in its server."""

    queries: list[str]
    topk: int | None = None
    return_scores: bool = False


def main(argv: list[str]) -> int:
    """Load the index, then serve per-request ``/retrieve`` until interrupted."""
    p = argparse.ArgumentParser(prog="python -m llds_retriever.baseline")
    p.add_argument("--index", type=Path, required=True)
    p.add_argument("--type", choices=["bm25", "dense", "hybrid"], default="dense")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8010)
    p.add_argument("--torch-threads", type=int, default=0)
    p.add_argument("--jit", action="store_true", help="TorchScript encoder (Search-R1 runs it eagerly)")
    args = p.parse_args(argv)

    import uvicorn
    from fastapi import FastAPI

    from llds_retriever.config import RetrieverConfig
    from llds_retriever.loader import load

    backend = {"type": args.type, "torch_threads": args.torch_threads, "device": "cpu", "jit": args.jit}
    config = RetrieverConfig(index_dir=args.index, backend=backend)
    loaded = load(config)
    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/retrieve")
    def retrieve_endpoint(request: QueryRequest) -> dict[str, object]:
        topk = request.topk or 3
        hits = loaded.backend.search(request.queries, topk)
        resp: list[object] = []
        for i in range(len(request.queries)):
            rows = [r for r in hits.rows[i].tolist() if r >= 0]
            docs = [loaded.corpus.doc(r) for r in rows]
            if request.return_scores:
                scores = hits.scores[i, : len(rows)].tolist()
                resp.append([{"document": d, "score": s} for d, s in zip(docs, scores, strict=True)])
            else:
                resp.append(docs)
        return {"result": resp}

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
