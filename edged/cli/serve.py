"""`edged serve [MODEL]`: the OpenAI-compatible HTTP server. Every flag is also an EDGED_*
environment variable (e.g. EDGED_PORT=9000, EDGED_API_KEY=...)."""

from __future__ import annotations

import logging
import sys

import click

from edged.cli.options import kv_type_option

from edged.cli.options import spec_options, spec_setting


def _split(values) -> tuple[str, ...]:
    """Repeated flags, or one env var holding a comma/space separated list."""
    out = []
    for v in values or ():
        out.extend(p for p in v.replace(",", " ").split() if p)
    return tuple(out)


def _opt(*decls, env: str, **kw):
    return click.option(*decls, envvar=f"EDGED_{env}", show_envvar=True, **kw)


@click.command("serve")
@click.argument("model", required=False, envvar="EDGED_MODEL")
@_opt("--host", env="HOST", default="127.0.0.1", show_default=True,
      help="Address to bind. Anything but loopback needs --api-key (or --insecure).")
@_opt("--port", env="PORT", type=int, default=8080, show_default=True, help="TCP port.")
@_opt("--ctx", env="CTX", type=int, default=4096, show_default=True,
      help="Most tokens (prompt + output) per request (capped at the model's context).")
@_opt("--max-seqs", env="MAX_SEQS", type=int, default=8, show_default=True,
      help="Requests generating at once; more wait in the queue.")
@_opt("--max-batch-tokens", env="MAX_BATCH_TOKENS", type=int, default=512, show_default=True,
      help="Tokens per engine step (prefill chunks + decodes).")
@_opt("--kv-memory", env="KV_MEMORY", default=None,
      help="KV cache budget: 2GiB, 512MB, or a fraction of free RAM (0.25). Default: ctx x max-seqs.")
@kv_type_option(envvar="EDGED_KV_TYPE")
@_opt("--block-size", env="BLOCK_SIZE", type=int, default=16, show_default=True,
      help="Tokens per KV block.")
@_opt("--no-prefix-cache", env="NO_PREFIX_CACHE", is_flag=True, help="Disable prefix caching.")
@_opt("--model-alias", env="MODEL_ALIAS", default=None,
      help="Model id reported by /v1/models and accepted in requests.")
@_opt("--api-key", env="API_KEY", default=None, help="Require 'Authorization: Bearer KEY'.")
@_opt("--api-key-file", env="API_KEY_FILE", default=None, type=click.Path(dir_okay=False),
      help="File with API keys, one per line.")
@_opt("--cors-origin", env="CORS_ORIGIN", multiple=True,
      help="Origin allowed by CORS (repeatable; none by default: no CORS headers).")
@_opt("--allowed-host", env="ALLOWED_HOST", multiple=True,
      help="Extra Host header value accepted (repeatable; '*' accepts any).")
@_opt("--max-queue", env="MAX_QUEUE", type=int, default=64, show_default=True,
      help="Requests queued beyond --max-seqs before answering 503.")
@_opt("--drain-timeout", env="DRAIN_TIMEOUT", type=float, default=30.0, show_default=True,
      help="Seconds in-flight requests may finish after SIGTERM/SIGINT.")
@_opt("--body-timeout", env="BODY_TIMEOUT", type=float, default=30.0, show_default=True,
      help="Seconds a request body may take to arrive before a 408 and the connection closed.")
@_opt("--stream-stall-timeout", env="STREAM_STALL_TIMEOUT", type=float, default=30.0, show_default=True,
      help="Seconds a stream may wait on a client that stopped reading before it is aborted.")
@_opt("--log-level", env="LOG_LEVEL", default="info", show_default=True,
      type=click.Choice(["critical", "error", "warning", "info", "debug"], case_sensitive=False))
@_opt("--insecure", env="INSECURE", is_flag=True,
      help="Allow a non-loopback bind without an API key.")
@_opt("--chat-template", env="CHAT_TEMPLATE", default=None,
      help="Chat template: a built-in name or Jinja source (default: the model's).")
@_opt("--reasoning-format", env="REASONING_FORMAT", type=click.Choice(["none", "auto"]),
      default="auto", show_default=True,
      help="auto: a thinking template's <think> block goes to message.reasoning_content; none: left in content.")
@_opt("--max-body-bytes", env="MAX_BODY_BYTES", type=int, default=8 * 2**20, show_default=True,
      help="Largest request body accepted (else 413).")
@_opt("--backend", env="BACKEND", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
      show_default=True, help="Where kernels run: auto = cuda when a usable GPU is present, else cpu.")
@_opt("--gpu-layers", "-ngl", env="GPU_LAYERS", default="auto", show_default=True,
      help="Layers on the GPU (first N; N >= layer count adds the output projection) or auto (as many as fit).")
@_opt("--keep-alive", env="KEEP_ALIVE", default="5m", show_default=True,
      help="How long an idle model stays loaded: a duration (5m, 1h30m, 30s) or seconds; 0 unloads "
           "after each request, -1 never. A request's keep_alive overrides it.")
@_opt("--load-timeout", env="LOAD_TIMEOUT", type=float, default=300.0, show_default=True,
      help="Seconds a request waits for its model to load before a 503.")
@_opt("--max-loaded-models", env="MAX_LOADED_MODELS", type=int, default=3, show_default=True,
      help="Models loaded at once (0: no limit); loading one more unloads the least recently used idle one.")
@_opt("--max-memory", env="MAX_MEMORY", default=None,
      help="Memory the loaded models may use (weights + KV + workspace, estimated before loading): "
           "8GiB, 512MB, or a fraction of RAM (0.5). Default: no limit.")
@_opt("--preload", env="PRELOAD", multiple=True,
      help="Store model to start loading at startup (repeatable; without MODEL only).")
@_opt("--pooling", env="POOLING", type=click.Choice(["mean", "last", "cls"]), default=None,
      help="/v1/embeddings pooling (overrides the file's <arch>.pooling_type; without either: mean).")
@spec_options(envvar_prefix="EDGED_")
def command(model, host, port, ctx, max_seqs, max_batch_tokens, kv_memory, kv_type, block_size,
            no_prefix_cache, model_alias, api_key, api_key_file, cors_origin, allowed_host,
            max_queue, drain_timeout, body_timeout, stream_stall_timeout, log_level, insecure, chat_template, reasoning_format,
            max_body_bytes, backend, gpu_layers, keep_alive, load_timeout, max_loaded_models,
            max_memory, preload, pooling, spec, spec_max, draft, draft_p_min, spec_adaptive):
    """Serve MODEL (a .gguf path or a store name, loaded at start) over an OpenAI-compatible API.
    Without MODEL, serve every model of the store, each loaded on first use (an empty store:
    the installed Gemma 3 270M, loaded at start)."""
    from edged.server.app import create_app
    from edged.server.config import ServerConfig, read_api_key_file
    from edged.server.keep_alive import parse_keep_alive
    from edged.server.lifecycle import ServerState, run_server
    from edged.store import ModelStore

    keys = tuple(k for k in (api_key,) if k)
    try:
        if preload and model:
            raise ValueError("--preload is for serving the store (no MODEL): MODEL is loaded at start")
        if draft and not model:
            raise ValueError("--draft needs MODEL: the draft model proposes for the one model served")
        try:
            keep_alive_s = parse_keep_alive(keep_alive)
        except ValueError as e:
            raise ValueError(f"--keep-alive: {e}") from None
        if api_key_file:
            keys += read_api_key_file(api_key_file)
        config = ServerConfig(
            model=model, host=host, port=port, ctx=ctx, max_seqs=max_seqs,
            max_batch_tokens=max_batch_tokens, kv_memory=kv_memory, kv_type=kv_type, block_size=block_size,
            prefix_cache=not no_prefix_cache, model_alias=model_alias, api_keys=keys,
            cors_origins=_split(cors_origin), allowed_hosts=_split(allowed_host),
            max_queue=max_queue, drain_timeout=drain_timeout, body_timeout=body_timeout,
            stream_stall_timeout=stream_stall_timeout, log_level=log_level.lower(),
            insecure=insecure, chat_template=chat_template, reasoning_format=reasoning_format,
            max_body_bytes=max_body_bytes,
            backend=backend, gpu_layers=gpu_layers, keep_alive=keep_alive_s,
            load_timeout=load_timeout, max_loaded_models=max_loaded_models, max_memory=max_memory,
            preload=_split(preload), pooling=pooling, spec=spec_setting(spec, draft), spec_max=spec_max,
            draft=draft, draft_p_min=draft_p_min, spec_adaptive=spec_adaptive)
        config.validate()
        if kv_memory is not None:
            from edged.engine.sizing import parse_memory

            parse_memory(kv_memory)  # fail on a typo now, not after loading
    except (OSError, ValueError) as e:
        raise click.UsageError(str(e)) from None
    _setup_logging(config.log_level)
    state = ServerState(config, store=ModelStore())
    url = f"http://{host if ':' not in host else f'[{host}]'}:{port}"

    def announce(st):
        logging.getLogger("edged.server").info(
            "ready: %s at %s (OpenAI API under %s/v1)%s", st.model_name, url, url,
            "; API key required" if keys else "")

    state.on_ready = announce
    sys.exit(run_server(state, create_app(state)))


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("edged: %(message)s"))
    lg = logging.getLogger("edged")
    lg.handlers[:] = [handler]
    lg.setLevel(level.upper())
    lg.propagate = False
