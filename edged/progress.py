"""A minimal stderr progress bar: drawn only on a TTY, silent otherwise."""

from __future__ import annotations

import sys


class Progress:
    """`with Progress("compiling", total) as p: p.advance()`; prints nothing unless stderr is a TTY."""

    def __init__(self, label: str, total: int, stream=None):
        self.label = label
        self.total = max(total, 1)
        self.done = 0
        self.stream = stream or sys.stderr
        self.enabled = bool(getattr(self.stream, "isatty", lambda: False)())

    def advance(self, n: int = 1, note: str = "") -> None:
        self.done = min(self.done + n, self.total)
        if self.enabled:
            frac = self.done / self.total
            bar = "#" * int(frac * 30)
            self.stream.write(f"\r{self.label:<22} [{bar:<30}] {frac:4.0%} {note[:30]:<30}")
            self.stream.flush()

    def __enter__(self):
        self.advance(0)
        return self

    def __exit__(self, *exc):
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
