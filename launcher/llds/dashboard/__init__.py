"""``llds dashboard serve``: the live training dashboard.

A small FastAPI app. Its backend polls every service's ``/health`` and ``/metrics`` and the trainer's
``/history`` and ``/status`` (server-side, so the browser needs no CORS), keeps a bounded ring buffer
of samples, turns counters into rates and histograms into mean / p95 latency, and serves it all as
JSON at ``GET /api/state``. The page (``dashboard_static/``: one HTML, one JS, one CSS file and the
vendored uPlot chart library, no CDN) polls that and draws the charts. Known signals go into named
panels; every other ``llds_*`` metric or history key still gets a panel of its own.

    llds dashboard serve --trainer-url http://127.0.0.1:8002 --rollout-url http://127.0.0.1:8001 \\
        --retriever-url http://127.0.0.1:8000 --port 8003 [--train-log RUN_DIR/trainer/train_log.jsonl]
    # then open http://127.0.0.1:8003/

Modules: ``config`` (settings), ``scrape`` (Prometheus text -> one sample's values), ``panels`` (the
panel catalogue and layout), ``store`` (the buffers behind ``/api/state``), ``poller`` (fetches the
services, tails the train log), ``metrics`` (the dashboard's own), ``app`` (FastAPI), ``cli``.
"""

from llds.dashboard.app import create_app
from llds.dashboard.cli import main
from llds.dashboard.config import DashboardConfig

__all__ = ["DashboardConfig", "create_app", "main"]
