"""keep_alive values as Ollama takes them: how long a model stays loaded after its last request.
A number is seconds, a string a Go duration ("5m", "1h30m", "45s", "500ms") or seconds ("300");
0 unloads once the request finishes; any negative value keeps the model loaded for good."""

from __future__ import annotations

import math
import re

FOREVER = math.inf

_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_keep_alive(value) -> float:
    """Seconds to stay loaded (FOREVER for a negative value); ValueError for anything else."""
    if isinstance(value, bool):
        raise ValueError(f"keep_alive must be a duration such as \"5m\" or a number of seconds, got {value}")
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise ValueError(f"keep_alive must be finite, got {value}")
        return FOREVER if value < 0 else float(value)
    if not isinstance(value, str):
        raise ValueError("keep_alive must be a duration string such as \"5m\" or a number of seconds")
    s = value.strip()
    try:
        return parse_keep_alive(float(s))
    except ValueError:
        pass
    sign, body = (-1, s[1:]) if s[:1] == "-" else (1, s[1:] if s[:1] == "+" else s)
    pos, total = 0, 0.0
    for m in _PART.finditer(body):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if not body or pos != len(body):
        raise ValueError(f"keep_alive {value!r} is not a duration (examples: \"5m\", \"1h30m\", \"30s\", "
                         "0, -1)")
    return FOREVER if sign < 0 and total > 0 else total


def describe(seconds: float) -> str:
    if seconds == FOREVER:
        return "forever"
    return f"{seconds:g} s"
