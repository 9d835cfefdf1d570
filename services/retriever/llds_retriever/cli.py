"""Command lines of the retriever: ``llds index build|info`` and ``llds retriever serve``.

    llds index build --corpus corpus.jsonl --kind bm25 --out runs/index
    llds index build --corpus corpus.jsonl --kind hybrid --encoder minilm --index-type hnsw --out runs/idx
    llds index info runs/index
    llds retriever serve --index runs/index --host 127.0.0.1 --port 8000
    llds retriever serve --faiss-index e5_Flat.index --corpus wiki-18.jsonl --encoder intfloat/e5-base-v2

Arguments and the config are validated before torch or FAISS are imported, so ``--help`` and a bad
flag answer at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tomllib
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from llds_retriever.config import RetrieverConfig
from llds_server.cli import add_settings_flags, settings_overrides
from llds_server.settings import ConfigError


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr
    )


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def _build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="llds index", description="Build or inspect a retriever index.")
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="build (or resume building) an index folder")
    b.add_argument("--corpus", type=Path, required=True, help="corpus JSONL ({id, contents} per line)")
    b.add_argument("--kind", choices=["bm25", "dense", "hybrid"], required=True)
    b.add_argument("--out", type=Path, required=True, help="index folder to write")
    b.add_argument("--encoder", default="minilm", help="HF encoder name or path (default: offline MiniLM)")
    b.add_argument("--index-type", choices=["flat", "hnsw", "ivfpq"], default="flat")
    b.add_argument("--shards", type=int, default=1, help="split the dense index into N corpus slices")
    b.add_argument("--chunk-size", type=int, default=65_536, help="passages per resumable vector file")
    b.add_argument("--batch-size", type=int, default=64, help="passages per encoder call")
    b.add_argument("--max-length", type=int, default=256, help="passage length limit in tokens")
    b.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    b.add_argument("--hnsw-m", type=int, default=32)
    b.add_argument("--ivf-nlist", type=int, default=0, help="IVF lists (0 = 4 * sqrt(n))")
    b.add_argument("--ivf-m", type=int, default=0, help="PQ sub-quantizers (0 = a divisor of the dimension)")
    b.add_argument("--no-progress", action="store_true", help="no progress bars")
    i = sub.add_parser("info", help="print what an index folder holds")
    i.add_argument("dir", type=Path)
    return p


def index_main(argv: list[str]) -> int:
    """``llds index build|info``; returns the exit status."""
    args = _build_parser().parse_args(argv)
    _setup_logging("info")
    from llds_retriever.errors import RetrieverError
    from llds_retriever.index import BuildOptions, build_index, index_info

    try:
        if args.cmd == "info":
            print(json.dumps(index_info(args.dir), indent=2))
            return 0
        if args.shards < 1 or args.chunk_size < 1 or args.batch_size < 1:
            return _fail("--shards, --chunk-size and --batch-size must be >= 1")
        opts = BuildOptions(
            corpus=args.corpus,
            kind=args.kind,
            out=args.out,
            encoder=args.encoder,
            index_type=args.index_type,
            shards=args.shards,
            chunk_size=args.chunk_size,
            batch_size=args.batch_size,
            device=args.device,
            max_length=args.max_length,
            hnsw_m=args.hnsw_m,
            ivf_nlist=args.ivf_nlist,
            ivf_m=args.ivf_m,
            progress=not args.no_progress,
        )
        manifest = build_index(opts)
    except RetrieverError as e:
        return _fail(str(e))
    dense = manifest.get("dense")
    print(
        f"index {args.out}: kind={manifest['kind']} docs={manifest['num_docs']}"
        + (f" encoder={dense['encoder']} dim={dense['dim']} type={dense['index_type']}" if dense else "")
        + (f" shards={len(dense['shards'])}" if dense else "")
        + f" in {manifest['build_seconds']:.1f}s"
    )
    return 0


def serve_parser() -> argparse.ArgumentParser:
    """``llds retriever serve``'s flags: one per :class:`RetrieverConfig` field, ``--config``, ``--set``."""
    p = argparse.ArgumentParser(prog="llds retriever serve", description="Serve /retrieve over an index.")
    add_settings_flags(
        p,
        RetrieverConfig,
        aliases={
            "index_dir": ["--index"],
            "backend.type": ["--type"],
            "backend.encoder": ["--encoder"],
            "backend.device": ["--device"],
        },
        config_help="TOML file (its [retriever] table, or the whole file)",
    )
    return p


def load_config(toml_path: Path | None, overrides: dict[str, Any]) -> RetrieverConfig:
    """Resolve the config: defaults < TOML < env < ``overrides``.

    A TOML file with tables (a whole-system config) contributes its ``[retriever]`` table only; a flat
    file is the retriever's own config.
    """
    section = None
    if toml_path is not None and toml_path.is_file():
        try:
            data = tomllib.loads(toml_path.read_text())
            if {k for k, v in data.items() if isinstance(v, dict)} - set(RetrieverConfig.model_fields):
                section = "retriever"
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {toml_path} is not valid TOML: {e}") from e
    return RetrieverConfig.load(toml_path, overrides=overrides, section=section)


def serve_main(argv: list[str]) -> int:
    """``llds retriever serve``; blocks until interrupted; returns the exit status."""
    args = serve_parser().parse_args(argv)
    try:
        config = load_config(args.config, settings_overrides(args, RetrieverConfig))
        config.require_source()
    except (ConfigError, ValidationError, ValueError) as e:
        return _fail(f"invalid retriever config: {e}")
    _setup_logging(config.log_level)
    log = logging.getLogger("llds.retriever")
    log.info("event=config %s", config.model_dump_json(exclude_none=True))

    import uvicorn

    from llds_retriever.app import create_app
    from llds_server.http import uvicorn_config

    failed: list[BaseException] = []
    server: uvicorn.Server | None = None

    def on_load_error(e: BaseException) -> None:
        failed.append(e)
        if server is not None:
            server.should_exit = True

    app = create_app(config, on_load_error=on_load_error)
    server = uvicorn.Server(
        uvicorn_config(
            app,
            host=config.host,
            port=config.port,
            log_level=config.log_level,
            access_log=False,
            timeout_graceful_shutdown=5,
        )
    )
    server.run()
    if failed:
        print(f"error: index failed to load: {failed[0]}", file=sys.stderr)
        return 1
    return 0
