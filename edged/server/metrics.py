"""Prometheus metrics: engine gauges/counters read from Engine.stats() at scrape time, latency
histograms observed by the server as tokens stream out."""

from __future__ import annotations

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

disable_created_metrics()  # no *_created series: they double the output and help no dashboard

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.5, 5)
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)
_LOAD_BUCKETS = (0.5, 1, 2, 5, 10, 20, 40, 80, 160, 320, 640)


class _EngineCollector:
    """Reads each loaded model's engine counters when Prometheus scrapes (nothing to keep in
    sync); every series has a `model` label."""

    def __init__(self, get_slots):
        self._get_slots = get_slots  # () -> the loaded ModelSlots

    def describe(self):
        return []  # the series come and go with the models: nothing to check at registration

    def collect(self):
        slots = [(s.model_name, s.engine) for s in self._get_slots()]
        g = GaugeMetricFamily("edged_models_loaded", "Models loaded (engines running).")
        g.add_metric([], sum(1 for _, e in slots if e is not None))
        yield g
        families: dict = {}
        for name, eng in slots:
            if eng is not None:
                self._add(families, name, eng.stats())
        yield from families.values()

    def _add(self, families: dict, model: str, s):
        def gauge(name, doc, value):
            f = families.setdefault(name, GaugeMetricFamily(name, doc, labels=["model"]))
            f.add_metric([model], value)

        def counter(name, doc, value):
            f = families.setdefault(name, CounterMetricFamily(name, doc, labels=["model"]))
            f.add_metric([model], value)

        gauge("edged_requests_running", "Requests scheduled in the running batch.", s.running)
        gauge("edged_requests_waiting", "Requests queued for admission.", s.waiting)
        counter("edged_prompt_tokens", "Prompt tokens admitted to the engine.", s.prompt_tokens)
        counter("edged_generation_tokens", "Tokens generated.", s.generated_tokens)
        counter("edged_preemptions", "Requests preempted (recomputed) for lack of KV blocks.",
                s.preemptions)
        counter("edged_engine_steps", "Engine steps run.", s.steps)
        counter("edged_embedding_inputs", "Embedding inputs completed (/v1/embeddings).",
                s.embedding_inputs)
        counter("edged_embedding_tokens", "Tokens of the completed embedding inputs.",
                s.embedding_tokens)
        counter("edged_nonfinite_logits", "Sampled rows whose logits were not finite (NaN or inf); "
                "each failed its request.", s.nonfinite_rows)
        # speculative decoding (--spec): all zero when it is off
        counter("edged_spec_draft_tokens", "Draft tokens verified (speculative decoding).",
                s.spec_draft_tokens)
        counter("edged_spec_accepted_tokens", "Draft tokens accepted: the model chose them too.",
                s.spec_accepted_tokens)
        gauge("edged_spec_acceptance_ratio", "Accepted / verified draft tokens since the model "
              "loaded (0 before any).", s.spec_accepted_tokens / s.spec_draft_tokens
              if s.spec_draft_tokens else 0.0)
        counter("edged_spec_skipped_steps", "Decode steps run without drafts (--draft with --spec-adaptive: "
                "while measuring, or where drafting measured slower at their batch size).",
                s.spec_skipped_steps)
        ratio = s.blocks_used / s.blocks_total if s.blocks_total else 0.0
        gauge("edged_kv_usage_ratio", "Share of KV blocks held by requests (0..1).", ratio)
        gauge("edged_kv_blocks_total", "KV blocks in the pool.", s.blocks_total)
        gauge("edged_kv_blocks_used", "KV blocks held by requests.", s.blocks_used)
        gauge("edged_kv_blocks_free", "KV blocks not held by any request (cached included).",
              s.blocks_free)
        gauge("edged_kv_blocks_cached", "Free KV blocks still holding a reusable prefix.",
              s.blocks_cached_free)
        # the sliding-window layers' own pool (all zero for a model without one)
        gauge("edged_kv_window_blocks_total", "KV blocks in the sliding-window layers' pool.",
              s.window_blocks_total)
        gauge("edged_kv_window_blocks_used", "Sliding-window KV blocks held by requests.",
              s.window_blocks_used)
        gauge("edged_kv_window_blocks_free", "Sliding-window KV blocks not held by any request "
              "(cached included).", s.window_blocks_free)
        gauge("edged_kv_window_blocks_cached", "Free sliding-window KV blocks still holding a "
              "reusable prefix.", s.window_blocks_cached_free)
        gauge("edged_kv_bytes_used", "Bytes of the KV blocks held by requests, all pools.",
              s.kv_bytes_used)
        gauge("edged_kv_bytes_total", "Bytes of K and V the KV pools allocated, all pools.",
              s.kv_bytes_total)
        f = families.setdefault("edged_kv_type", GaugeMetricFamily(
            "edged_kv_type", "The KV cache's element type (--kv-type), as a label; always 1.",
            labels=["model", "kv_type"]))
        f.add_metric([model, s.kv_type], 1)
        gauge("edged_prefix_cache_hit_ratio", "Share of prompt tokens served from the prefix "
              "cache.", s.prefix_hit_rate)


class ServerMetrics:
    """One registry per server (tests run several in one process)."""

    def __init__(self, get_slots):
        self.registry = CollectorRegistry(auto_describe=True)
        self.registry.register(_EngineCollector(get_slots))
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
        self.model_loads = Counter("edged_model_loads", "Model loads by outcome (ok, failed, "
                                   "no_room).", ["model", "outcome"], registry=r)
        self.model_load_seconds = Histogram("edged_model_load_seconds", "Seconds a model took to "
                                            "load (weights, engine, kernels).", ["model"],
                                            buckets=_LOAD_BUCKETS, registry=r)
        self.model_unloads = Counter("edged_model_unloads", "Model unloads by reason (expired: "
                                     "keep_alive ran out; evicted: room for another).",
                                     ["model", "reason"], registry=r)

        # faults (docs/SERVER.md "Faults"): what clients that stop reading hold
        self.stream_buffered = Gauge("edged_stream_buffered_deltas", "Generated deltas queued for "
                                     "responses and not yet sent, all requests.", registry=r)
        self.streams_stalled = Counter("edged_streams_stalled", "Streams aborted because the client "
                                       "stopped reading (buffer full or --stream-stall-timeout).",
                                       registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)
