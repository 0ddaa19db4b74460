"""The service's Prometheus metrics (kvtier_serve_*), in a registry of its own
(two services in one process do not clash, and nothing else lands in theirs).
prometheus_client's metrics are thread-safe."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

# Time to first token, seconds: a histogram, so that the several service processes of a host
# aggregate (histogram_quantile over their sum) where per-process quantiles would not.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self, cache_connected: Callable[[], bool], in_progress: Callable[[], int]) -> None:
        """cache_connected and in_progress are read at each scrape (render)."""
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("kvtier_serve_requests", "Chat completion requests by outcome (ok, error_<status>)",
                                ["outcome"], registry=r)
        self.prompt_tokens = Counter("kvtier_serve_prompt_tokens", "Prompt tokens served", registry=r)
        self.cached_tokens = Counter("kvtier_serve_cached_tokens", "Prompt tokens that came from the cache",
                                     registry=r)
        self.completion_tokens = Counter("kvtier_serve_completion_tokens", "Tokens generated", registry=r)
        self.ttft = Histogram("kvtier_serve_ttft_seconds", "Time to first token", buckets=TTFT_BUCKETS, registry=r)
        Gauge("kvtier_serve_cache_connected", "1 while kvtierd is reachable",
              registry=r).set_function(lambda: float(cache_connected()))
        Gauge("kvtier_serve_requests_in_progress", "Requests admitted and not yet answered",
              registry=r).set_function(lambda: float(in_progress()))

    def completed(self, prompt_tokens: int, cached_tokens: int, completion_tokens: int, ttft: float) -> None:
        self.requests.labels(outcome="ok").inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.cached_tokens.inc(cached_tokens)
        self.completion_tokens.inc(completion_tokens)
        self.ttft.observe(ttft)

    def failed(self, status: int) -> None:
        self.requests.labels(outcome=f"error_{status}").inc()

    def render(self) -> bytes:
        """The text exposition format. Blocks (asks whether kvtierd answers): call it off the event loop."""
        return generate_latest(self.registry)
