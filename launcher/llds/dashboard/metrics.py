"""The dashboard's own Prometheus metrics (``llds_dashboard_*``)."""

from __future__ import annotations


class DashboardMetrics:
    """The dashboard's own Prometheus metrics, in a registry of its own."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.polls = Counter(
            "llds_dashboard_polls",
            "Service polls, by service and outcome",
            ["service", "outcome"],
            registry=r,
        )
        self.poll_seconds = Histogram("llds_dashboard_poll_duration_seconds", "Time to poll one service", ["service"],
                                      registry=r, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))  # fmt: skip
        self.up = Gauge(
            "llds_dashboard_service_up", "1 when the service's /health said ok", ["service"], registry=r
        )
        self.samples = Gauge(
            "llds_dashboard_buffered_samples", "Metric samples in the ring buffer", registry=r
        )
        self.history = Gauge("llds_dashboard_history_records", "Trainer step records held", registry=r)
        self.api = Counter("llds_dashboard_api_requests", "Requests to GET /api/state", registry=r)
