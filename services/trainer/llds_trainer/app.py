"""HTTP surface of the trainer: ``/health``, ``/metrics``, ``/history``, ``/status``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Query, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from llds_proto.messages import HealthResponse
from llds_trainer.protocol import StatusResponse
from llds_trainer.service import TrainerService


def create_app(service: TrainerService) -> FastAPI:
    """Routes reading the live state of ``service`` (training runs in another thread)."""
    app = FastAPI(title="llds trainer", version="1")

    @app.get("/health", response_model=HealthResponse)
    def health() -> JSONResponse:
        st = service.state
        status = (
            "ok" if st in ("waiting", "training", "done") else ("degraded" if st == "failed" else "starting")
        )
        body = HealthResponse(
            status=status,  # type: ignore[arg-type]
            service="trainer",
            detail={"state": st, **({"error": service.error} if service.error else {})},
        )
        if service.trainer is not None:
            body.detail.update(step=service.trainer.state.step, weights_version=service.trainer.state.version)
        return JSONResponse(body.model_dump(), status_code=200 if status == "ok" else 503)

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/history")
    def history(
        since: int = Query(default=0, ge=0, description="Return the records of steps > since."),
    ) -> list[dict[str, Any]]:
        return service.history_since(since)

    @app.get("/status", response_model=StatusResponse)
    def status() -> dict[str, Any]:
        return service.status()

    return app
