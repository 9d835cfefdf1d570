"""The FastAPI app: the page, its static files, ``GET /api/state``, ``/health`` and ``/metrics``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from llds.dashboard.config import DashboardConfig
from llds.dashboard.metrics import DashboardMetrics
from llds.dashboard.poller import Poller
from llds.dashboard.store import Store
from llds_proto.messages import HealthResponse

log = logging.getLogger("llds.dashboard")
STATIC_DIR = Path(__file__).resolve().parents[1] / "dashboard_static"
"""The page's files (``llds/dashboard_static``, shipped as package data)."""


def create_app(cfg: DashboardConfig, transport: Any = None, poll: bool = True) -> Any:
    """The FastAPI app. ``transport``: an httpx transport for tests; ``poll=False``: no background
    polling (tests drive ``app.state.poller.poll_once()`` themselves)."""
    from fastapi import FastAPI, Query
    from fastapi.responses import FileResponse, JSONResponse, Response
    from fastapi.staticfiles import StaticFiles
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    store = Store(cfg.service_urls(), cfg.max_samples, cfg.max_history)
    metrics = DashboardMetrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        poller = Poller(cfg, store, metrics, transport=transport)
        app.state.poller = poller
        task = asyncio.create_task(poller.run()) if poll else None
        log.info("dashboard polling %s every %.1f s", cfg.service_urls(), cfg.poll_interval_s)
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
            await poller.aclose()

    app = FastAPI(title="llds dashboard", lifespan=lifespan)
    app.state.store = store
    app.state.metrics = metrics
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    @app.get("/", include_in_schema=False)
    async def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> Response:
        return Response(status_code=204)

    @app.get("/health")
    async def health() -> HealthResponse:
        detail: dict[str, object] = {"services": {n: s.status for n, s in store.services.items()},
                                     "samples": len(store.samples), "history_records": store.history_total}  # fmt: skip
        return HealthResponse(status="ok", service="dashboard", detail=detail)

    @app.get("/metrics", include_in_schema=False)
    async def prom() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/api/state", response_model=None)
    async def api_state(
        since: int = Query(0, ge=0, description="last sample seq the client holds"),
        history_since: int = Query(0, ge=0, description="number of step records the client holds"),
        boot_id: str | None = Query(None, description="boot id the client's data came from"),
    ) -> JSONResponse:
        metrics.api.inc()
        return JSONResponse(store.state(since, history_since, boot_id), headers={"Cache-Control": "no-store"})

    return app
