"""``llds dashboard serve``: the live training dashboard.

Flags override ``--config FILE.toml``, which overrides env ``LLDS_DASHBOARD_<FIELD>``.
"""

from __future__ import annotations

import argparse
import logging
import sys

from llds.dashboard.app import create_app
from llds.dashboard.config import DashboardConfig
from llds_server.cli import add_settings_flags


def build_parser() -> argparse.ArgumentParser:
    """``llds dashboard serve``'s flags: one per :class:`DashboardConfig` field, ``--config``, ``--set``."""
    p = argparse.ArgumentParser(prog="llds dashboard serve", description=__doc__.split("\n\n")[0])
    add_settings_flags(
        p,
        DashboardConfig,
        aliases={"poll_interval_s": ["--poll-interval"], "timeout_s": ["--timeout"]},
        config_help="TOML file with DashboardConfig fields",
    )
    return p


def parse_args(argv: list[str]) -> DashboardConfig:
    return DashboardConfig.from_cli(build_parser(), argv)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per poll request is noise
    import uvicorn

    from llds_server.http import uvicorn_config

    app = create_app(cfg)
    print(
        f"dashboard  http://{cfg.host}:{cfg.port}/  polling {', '.join(cfg.service_urls()) or 'no services'}"
    )
    uvicorn.Server(uvicorn_config(app, cfg.host, cfg.port, log_level="warning")).run()
    return 0
