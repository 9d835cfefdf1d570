"""Prometheus metrics of the retriever, in a registry per app so several apps can share a process."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class RetrieverMetrics:
    """Every metric the retriever exports (names ``llds_retriever_<thing>_<unit>``)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "llds_retriever_requests_total", "Requests to /retrieve by HTTP status", ["status"], registry=r
        )
        self.errors = Counter(
            "llds_retriever_errors_total", "Failed /retrieve requests by cause", ["cause"], registry=r
        )
        self.queries = Counter("llds_retriever_queries_total", "Queries answered", registry=r)
        self.latency = Histogram(
            "llds_retriever_request_latency_seconds",
            "Wall time of /retrieve requests answered 200",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "llds_retriever_batch_size_queries",
            "Queries per batched encode + search",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.queue_depth = Gauge(
            "llds_retriever_queue_depth_queries", "Queries admitted and not yet answered", registry=r
        )
        self.cache_hits = Counter(
            "llds_retriever_cache_hits_total", "Queries answered from the cache", registry=r
        )
        self.cache_misses = Counter(
            "llds_retriever_cache_misses_total", "Queries that needed a search", registry=r
        )
        self.truncated = Counter(
            "llds_retriever_truncated_queries_total", "Queries cut to the encoder's length limit", registry=r
        )
        self.ready = Gauge("llds_retriever_ready_bool", "1 once the index is loaded", registry=r)
        self.index_docs = Gauge("llds_retriever_index_documents", "Passages in the served index", registry=r)
