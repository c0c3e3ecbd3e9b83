"""edged: a local LLM inference daemon (GGUF models, paged KV, continuous batching, OpenAI API)."""

__version__ = "0.1.0"

from edged._numba_env import configure_numba as _configure_numba

# Must run before numba is first imported anywhere in the process (quant/ and backends/ import it).
_configure_numba()
