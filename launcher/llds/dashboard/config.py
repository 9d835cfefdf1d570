"""The dashboard's settings (``DashboardConfig``, env prefix ``LLDS_DASHBOARD_``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from llds_server.settings import ServiceSettings


class DashboardConfig(ServiceSettings):
    """Everything the dashboard decides; env prefix ``LLDS_DASHBOARD_``."""

    model_config = SettingsConfigDict(env_prefix="LLDS_DASHBOARD_", extra="forbid")

    host: str = "127.0.0.1"
    """Interface to bind."""
    port: int = Field(default=8003, ge=0, le=65535)
    """Port to bind."""
    retriever_url: str | None = None
    """Base URL of the retriever (none: not shown)."""
    rollout_url: str | None = None
    """Base URL of the rollout service (none: not shown)."""
    trainer_url: str | None = None
    """Base URL of the trainer (none: not shown)."""
    poll_interval_s: float = Field(default=1.0, gt=0.05, le=60.0)
    """Seconds between two polls of every service."""
    timeout_s: float = Field(default=2.0, gt=0.0, le=60.0)
    """Per-request timeout of a poll."""
    max_samples: int = Field(default=3600, ge=10)
    """Metric samples kept in the ring buffer (one per poll)."""
    max_history: int = Field(default=100_000, ge=10)
    """Trainer step records kept."""
    train_log: Path | None = None
    """The trainer's ``train_log.jsonl``, read as it grows: a second source of step records that
    still has the last steps after the trainer has exited (records are merged by ``step``)."""

    def service_urls(self) -> dict[str, str]:
        """Configured services, name -> base URL without a trailing slash."""
        urls = {"retriever": self.retriever_url, "rollout": self.rollout_url, "trainer": self.trainer_url}
        return {name: url.rstrip("/") for name, url in urls.items() if url}
