"""How many KV blocks to allocate: from --kv-memory (bytes or a fraction of free RAM) or
--ctx x --max-seqs."""

from __future__ import annotations

import re

_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "t": 1e12, "tb": 1e12}


def available_memory() -> int:
    """Bytes of RAM the OS reports available (MemAvailable), or 4 GiB if it cannot tell."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 4 * 2**30


def parse_memory(spec: str) -> int:
    """'2GiB', '512MB', '1073741824' -> bytes; '0.25' (a fraction in (0, 1]) -> that share of free RAM."""
    s = str(spec).strip().lower()
    m = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([a-z]*)", s)
    if not m or m.group(2) not in _UNITS:
        raise ValueError(f"cannot parse memory size {spec!r} (examples: 2GiB, 512MB, 0.5)")
    value, unit = float(m.group(1)), m.group(2)
    if not unit and value <= 1.0 and "." in s:
        if value <= 0:
            raise ValueError(f"memory fraction must be in (0, 1], got {spec!r}")
        return int(available_memory() * value)
    return int(value * _UNITS[unit])


def plan_num_blocks(bytes_per_token: int, block_size: int, *, kv_memory: str | None = None,
                    ctx: int = 4096, max_seqs: int = 16) -> int:
    """Blocks for the KV pool: the memory budget if given, else room for max_seqs x ctx tokens."""
    if kv_memory is not None:
        budget = parse_memory(kv_memory)
        n = budget // (bytes_per_token * block_size)
        if n < 1:
            raise ValueError(f"--kv-memory {kv_memory} holds no {block_size}-token block "
                             f"({bytes_per_token * block_size} bytes each)")
        return int(n)
    if ctx < 1 or max_seqs < 1:
        raise ValueError("ctx and max_seqs must be >= 1")
    return -(-ctx * max_seqs // block_size)
