"""Prometheus metrics: engine gauges/counters read from Engine.stats() at scrape time, latency
histograms observed by the server as tokens stream out."""

from __future__ import annotations

from prometheus_client import (CollectorRegistry, Counter, Histogram, disable_created_metrics,
                               generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

disable_created_metrics()  # no *_created series: they double the output and help no dashboard

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.5, 5)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)


class _EngineCollector:
    """Reads the engine's counters when Prometheus scrapes (nothing to keep in sync)."""

    def __init__(self, get_engine):
        self._get_engine = get_engine

    def collect(self):
        eng = self._get_engine()
        if eng is None:  # still loading
            return
        s = eng.stats()

        def gauge(name, doc, value):
            g = GaugeMetricFamily(name, doc)
            g.add_metric([], value)
            return g

        def counter(name, doc, value):
            c = CounterMetricFamily(name, doc)
            c.add_metric([], value)
            return c

        yield gauge("edged_requests_running", "Requests scheduled in the running batch.", s.running)
        yield gauge("edged_requests_waiting", "Requests queued for admission.", s.waiting)
        yield counter("edged_prompt_tokens", "Prompt tokens admitted to the engine.", s.prompt_tokens)
        yield counter("edged_generation_tokens", "Tokens generated.", s.generated_tokens)
        yield counter("edged_preemptions", "Requests preempted (recomputed) for lack of KV blocks.",
                      s.preemptions)
        yield counter("edged_engine_steps", "Engine steps run.", s.steps)
        ratio = s.blocks_used / s.blocks_total if s.blocks_total else 0.0
        yield gauge("edged_kv_usage_ratio", "Share of KV blocks held by requests (0..1).", ratio)
        yield gauge("edged_kv_blocks_total", "KV blocks in the pool.", s.blocks_total)
        yield gauge("edged_kv_blocks_used", "KV blocks held by requests.", s.blocks_used)
        yield gauge("edged_kv_blocks_free", "KV blocks not held by any request (cached included).",
                    s.blocks_free)
        yield gauge("edged_kv_blocks_cached", "Free KV blocks still holding a reusable prefix.",
                    s.blocks_cached_free)
        # the sliding-window layers' own pool (all zero for a model without one)
        yield gauge("edged_kv_window_blocks_total", "KV blocks in the sliding-window layers' pool.",
                    s.window_blocks_total)
        yield gauge("edged_kv_window_blocks_used", "Sliding-window KV blocks held by requests.",
                    s.window_blocks_used)
        yield gauge("edged_kv_window_blocks_free", "Sliding-window KV blocks not held by any request "
                    "(cached included).", s.window_blocks_free)
        yield gauge("edged_kv_window_blocks_cached", "Free sliding-window KV blocks still holding a "
                    "reusable prefix.", s.window_blocks_cached_free)
        yield gauge("edged_kv_bytes_used", "Bytes of the KV blocks held by requests, all pools.",
                    s.kv_bytes_used)
        yield gauge("edged_prefix_cache_hit_ratio", "Share of prompt tokens served from the prefix "
                    "cache.", s.prefix_hit_rate)


class ServerMetrics:
    """One registry per server (tests run several in one process)."""

    def __init__(self, get_engine):
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_EngineCollector(get_engine))
        r = self.registry
        self.ttft = Histogram("edged_time_to_first_token_seconds", "Arrival to first token.",
                              buckets=_TTFT_BUCKETS, registry=r)
        self.itl = Histogram("edged_inter_token_latency_seconds", "Time between tokens of one "
                             "request.", buckets=_ITL_BUCKETS, registry=r)
        self.e2e = Histogram("edged_e2e_request_latency_seconds", "Arrival to last token.",
                             buckets=_E2E_BUCKETS, registry=r)
        self.requests = Counter("edged_http_requests", "HTTP requests by route and status.",
                                ["route", "status"], registry=r)
        self.finished = Counter("edged_requests_finished", "Generations by finish reason.",
                                ["finish_reason"], registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
