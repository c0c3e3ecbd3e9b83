"""A byte-count progress bar for store transfers (pull, import): the store reports (done, total)."""

from __future__ import annotations

from edged.progress import Progress

_MIB = 1 << 20


class TransferProgress:
    """`with TransferProgress("pulling x") as p: store_call(progress=p)`; silent off a TTY."""

    def __init__(self, label: str):
        self.label = label
        self._bar: Progress | None = None
        self._shown = 0

    def __call__(self, done: int, total: int) -> None:
        if self._bar is None:  # the total is known at the first report
            self._bar = Progress(self.label, total).__enter__()
        self._bar.advance(done - self._shown, f"{done / _MIB:.1f}/{total / _MIB:.1f} MiB")
        self._shown = done

    def __enter__(self) -> "TransferProgress":
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)
