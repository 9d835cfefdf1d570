"""``llds dashboard serve``: the live training dashboard.

Flags override ``--config FILE.toml``, which overrides env ``LLDS_DASHBOARD_<FIELD>``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from llds.dashboard.app import create_app
from llds.dashboard.config import SERVICES, DashboardConfig


def parse_args(argv: list[str]) -> DashboardConfig:
    p = argparse.ArgumentParser(prog="llds dashboard serve", description=__doc__.split("\n\n")[0])
    p.add_argument("--config", type=Path, help="TOML file with DashboardConfig fields")
    p.add_argument("--host", help="bind address")
    p.add_argument("--port", type=int, help="port")
    for svc in SERVICES:
        p.add_argument(f"--{svc}-url", dest=f"{svc}_url", help=f"base URL of the {svc}")
    p.add_argument("--poll-interval", type=float, dest="poll_interval_s", help="seconds between polls")
    p.add_argument("--timeout", type=float, dest="timeout_s", help="per-request poll timeout (s)")
    p.add_argument("--max-samples", type=int, help="metric samples kept")
    p.add_argument("--train-log", type=Path, help="the trainer's train_log.jsonl (also read, merged by step)")
    return DashboardConfig.from_cli(p, argv)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll request is noise
    import uvicorn

    app = create_app(cfg)
    print(
        f"dashboard  http://{cfg.host}:{cfg.port}/  polling {', '.join(cfg.service_urls()) or 'no services'}"
    )
    uvicorn.run(app, host=cfg.host, port=cfg.port, log_level="warning")
    return 0
