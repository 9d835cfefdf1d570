"""Access logs without the polling noise.

The dashboard (and ``llds up``, Prometheus, Kubernetes probes) poll every service's ``/health`` and
``/metrics`` about once a second; logged, those requests bury the lines that matter. Servers started
with :func:`uvicorn_log_config` log every other request as uvicorn would.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

POLLING_ROUTES = frozenset({"/health", "/metrics"})
"""Paths whose GET requests leave no access-log line."""


class PollingRouteFilter(logging.Filter):
    """Drops uvicorn access records of ``GET`` on :data:`POLLING_ROUTES` (query strings included)."""

    def filter(self, record: logging.LogRecord) -> bool:
        # uvicorn.access records carry (client, method, full path, http version, status) as args.
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and args[1] == "GET":
            path = str(args[2]).split("?", 1)[0]
            return path not in POLLING_ROUTES
        return True


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's default logging config with :class:`PollingRouteFilter` on its access handler (pass
    as ``log_config=`` to ``uvicorn.run`` or ``uvicorn.Config``)."""
    from uvicorn.config import LOGGING_CONFIG

    cfg = copy.deepcopy(LOGGING_CONFIG)
    cfg.setdefault("filters", {})["polling"] = {"()": f"{__name__}.PollingRouteFilter"}
    cfg["handlers"]["access"].setdefault("filters", []).append("polling")
    return cfg
