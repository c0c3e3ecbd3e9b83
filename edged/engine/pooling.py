"""Embedding pooling: the final-normed hidden states of an input's tokens reduced to one vector
(mean, last or cls, as llama.cpp's pooling types), and the L2 normalisation clients get."""

from __future__ import annotations

import numpy as np

POOLING_MODES = ("mean", "last", "cls")
# GGUF <arch>.pooling_type (llama.cpp's enum llama_pooling_type)
GGUF_POOLING = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


def pooling_for(file_pooling_type: int | None, flag: str | None) -> str:
    """The pooling an embedding request uses: --pooling when given (it overrides the file, as
    llama.cpp's flag does), else the file's <arch>.pooling_type, else mean. ValueError for a file
    whose type gives no single vector (none, rank) unless --pooling overrides it."""
    if flag is not None:
        if flag not in POOLING_MODES:
            raise ValueError(f"--pooling must be one of {', '.join(POOLING_MODES)}, got {flag!r}")
        return flag
    if file_pooling_type is None:
        return "mean"
    mode = GGUF_POOLING.get(file_pooling_type, str(file_pooling_type))
    if mode not in POOLING_MODES:
        raise ValueError(f"this model's pooling_type is {mode!r}, which gives no single embedding "
                         f"per input; start the server with --pooling {'|'.join(POOLING_MODES)}")
    return mode


class Pool:
    """One embedding request's pooled state, fed the hidden rows its prefill chunks return."""

    def __init__(self, mode: str, n_prompt: int):
        if mode not in POOLING_MODES:
            raise ValueError(f"pooling must be one of {', '.join(POOLING_MODES)}, got {mode!r}")
        self.mode, self.n_prompt = mode, n_prompt
        self._sum: np.ndarray | None = None  # float64 [n_embd]: mean's running sum
        self._rows = 0

    def add(self, hidden: np.ndarray, first_position: int) -> None:
        """hidden float32 [r, n_embd] of positions first_position..; a chunk starting at 0 starts
        over (the request was preempted and is recomputing)."""
        if first_position == 0:
            self._sum, self._rows = None, 0
        s = hidden.sum(axis=0, dtype=np.float64)
        self._sum = s if self._sum is None else self._sum + s
        self._rows += hidden.shape[0]

    def result(self) -> np.ndarray:
        """The pooled float32 [n_embd] vector (not normalised)."""
        want = self.n_prompt if self.mode == "mean" else 1
        if self._sum is None or self._rows != want:
            raise RuntimeError(f"pooling saw {self._rows} of {want} rows")
        return (self._sum / self._rows).astype(np.float32)


def normalize(vec: np.ndarray, dimensions: int | None = None) -> np.ndarray:
    """The first `dimensions` entries (all when None), L2-normalised: float32 [d]. A zero vector
    stays zero."""
    v = np.asarray(vec, dtype=np.float64)[:dimensions]
    norm = float(np.sqrt(np.dot(v, v)))
    return (v / norm if norm > 0 else v).astype(np.float32)
