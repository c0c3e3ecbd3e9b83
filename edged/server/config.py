"""Server settings: one dataclass filled from `edged serve` flags (each also an EDGED_* variable)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

ENV_PREFIX = "EDGED_"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def is_loopback(host: str) -> bool:
    """Whether a bind address only accepts connections from this machine."""
    h = host.strip("[]")
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


@dataclass
class ServerConfig:
    """Everything `edged serve` needs; validate() checks the combination before any loading."""

    model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    ctx: int = 4096  # most tokens (prompt + output) in one request
    max_seqs: int = 8
    max_batch_tokens: int = 512
    kv_memory: str | None = None  # "2GiB", "512MB" or a fraction of free RAM; else ctx x max_seqs
    kv_type: str = "f16"  # KV cache element type: f32 | f16 | q8_0 (edged.backends.base.KV_TYPES)
    block_size: int = 16
    prefix_cache: bool = True
    model_alias: str | None = None
    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    max_queue: int = 64  # requests waiting beyond max_seqs before 503
    drain_timeout: float = 30.0
    # faults (docs/SERVER.md "Faults"): a request body must arrive within body_timeout seconds (408),
    # a stream whose client stops reading is aborted after stream_stall_timeout seconds
    body_timeout: float = 30.0
    stream_stall_timeout: float = 30.0
    log_level: str = "info"
    insecure: bool = False
    chat_template: str | None = None
    reasoning_format: str = "auto"  # none | auto: split a thinking template's <think> block off
    max_body_bytes: int = 8 * 2**20
    max_header_bytes: int = 16 * 2**10
    warmup: bool = True
    backend: str = "auto"  # auto | cpu | cuda
    gpu_layers: str = "auto"  # a layer count or auto
    # several models (edged serve without MODEL serves the model store; docs/SERVER.md)
    keep_alive: float = 300.0  # seconds an idle model stays loaded (math.inf: for good, 0: unload at once)
    load_timeout: float = 300.0  # seconds a request waits for its model to load before a 503
    max_loaded_models: int = 3  # models loaded at once (0: no limit)
    max_memory: str | None = None  # weights + KV + workspace of the loaded models: "8GiB" or 0.5 of RAM
    preload: tuple[str, ...] = ()  # store models to start loading at startup
    pooling: str | None = None  # /v1/embeddings: mean | last | cls; None: the file's, else mean
    spec: str | None = None  # speculative decoding: None (off), "ngram" or "draft" (edged.engine.spec_*)
    spec_max: int = 8  # draft tokens verified per sequence and step
    draft: str | None = None  # spec "draft": the draft model (a .gguf path or a store name)
    draft_p_min: float = 0.0  # the draft stops below this top-token probability (0: never)
    spec_adaptive: bool = True  # draft only at batch sizes where it measured faster (spec_governor)
    extra: dict = field(default_factory=dict)

    def validate(self) -> None:
        """Raise ValueError for a setting that cannot work (or is unsafe without --insecure)."""
        if not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in 0..65535, got {self.port}")
        for name in ("ctx", "max_seqs", "max_batch_tokens", "block_size", "max_body_bytes",
                     "max_header_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1")
        if self.max_queue < 0:
            raise ValueError("--max-queue must be >= 0")
        if self.drain_timeout < 0:
            raise ValueError("--drain-timeout must be >= 0")
        if self.body_timeout <= 0:
            raise ValueError("--body-timeout must be > 0")
        if self.stream_stall_timeout <= 0:
            raise ValueError("--stream-stall-timeout must be > 0")
        if self.load_timeout <= 0:
            raise ValueError("--load-timeout must be > 0")
        if self.max_loaded_models < 0:
            raise ValueError("--max-loaded-models must be >= 0 (0: no limit)")
        from edged.server.model_memory import parse_max_memory

        parse_max_memory(self.max_memory)
        if self.reasoning_format not in ("none", "auto"):
            raise ValueError(f"--reasoning-format must be none or auto, got {self.reasoning_format!r}")
        if self.pooling not in (None, "mean", "last", "cls"):
            raise ValueError(f"--pooling must be mean, last or cls, got {self.pooling!r}")
        if self.spec not in (None, "ngram", "draft"):
            raise ValueError(f"--spec must be off or ngram, got {self.spec!r}")
        if (self.spec == "draft") != bool(self.draft):
            raise ValueError("speculation with a draft model needs --draft, and --draft that speculation")
        if not 0.0 <= self.draft_p_min <= 1.0:
            raise ValueError(f"--draft-p-min must be in [0, 1], got {self.draft_p_min}")
        if not 1 <= self.spec_max <= 64:
            raise ValueError(f"--spec-max must be in 1..64, got {self.spec_max}")
        if self.backend not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--backend must be auto, cpu or cuda, got {self.backend!r}")
        from edged.backends.base import KV_TYPES

        if self.kv_type not in KV_TYPES:
            raise ValueError(f"--kv-type must be one of {', '.join(KV_TYPES)}, got {self.kv_type!r}")
        from edged.offload import parse_gpu_layers

        parse_gpu_layers(self.gpu_layers)
        if any(not k for k in self.api_keys):
            raise ValueError("an API key must not be empty")
        if not is_loopback(self.host) and not self.api_keys and not self.insecure:
            raise ValueError(
                f"refusing to listen on {self.host} (reachable from other machines) without an API "
                f"key: give --api-key / --api-key-file, or --insecure to accept the risk")

    @property
    def served_model_name(self) -> str:
        """The id clients use in `model` (alias, else the file name without .gguf)."""
        if self.model_alias:
            return self.model_alias
        return Path(self.model).stem if self.model else "default"


def read_api_key_file(path: str) -> tuple[str, ...]:
    """API keys from a file, one per line; blank lines and #-comments ignored."""
    keys = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keys.append(line)
    if not keys:
        raise ValueError(f"API key file {path} holds no key")
    return tuple(keys)
