"""When speculation pays at a batch size. A draft token is nearly free in a one-sequence decode
step (the weights are read once for all its rows) but costs compute in a wide one, which already
reads the weights for many tokens: a draft model drafting at every step measured 1.24x at
c = 1 and 0.65x at c = 16 (docs/SERVER.md). So per number of running sequences the governor keeps
the tokens a second of the latest decode steps that drafted and of those that did not, measured
on this machine and model, and drafts where drafting was faster. It tries the other way now and
then, so it follows a change of text, context length or load. Outputs never depend on it: drafts
only change how many tokens a step yields.
"""

from __future__ import annotations

from collections import deque

SETTLE = 3  # steps each way at a batch size before the governor trusts its figures
EXPLORE_EVERY = 16  # while drafting, a step without drafts this often
# while not drafting, a try of drafting this often at one sequence, up to TRY_DRAFTS_FACTOR times as
# rarely for more: a try first pays for the draft reading every running sequence's tokens since
# its last proposal (at c = 16 that catch-up cost more than the drafts won)
TRY_DRAFTS_FACTOR = 16
CATCH_UP_STEPS = 4  # a drafting step after this many without drafts pays a catch-up: not counted
WIDE_GAP = 1.25  # either way's tries four times as rarely once one way is this much faster
WINDOW = 8  # the latest steps each way that the figures hold


class _Way:
    """The latest steps one way at one batch size: tokens a second over them, the one slowest a
    token left out (a page fault, another process: one step must not decide for hundreds)."""

    __slots__ = ("window", "steps")

    def __init__(self):
        self.window: deque[tuple[int, float]] = deque(maxlen=WINDOW)  # (tokens, seconds)
        self.steps = 0

    def add(self, tokens: int, seconds: float) -> None:
        self.window.append((tokens, seconds))
        self.steps += 1

    @property
    def rate(self) -> float:
        steps = sorted(self.window, key=lambda ts: ts[1] / max(ts[0], 1))
        if len(steps) >= 3:
            steps = steps[:-1]
        seconds = sum(s for _, s in steps)
        return sum(t for t, _ in steps) / seconds if seconds > 0 else 0.0


class SpecGovernor:
    """drafting(batch) says whether this decode step of `batch` running sequences drafts; after
    it, record(batch, drafted, tokens, seconds) gives what the step yielded and took.

    A batch size without figures of its own follows a measured one: no drafts where a smaller batch
    went without, drafts where a larger one drafted (a wider step leaves drafts less room); else it
    tries both ways. The first drafting step after several without drafts is not counted: it pays
    the draft's catch-up once, which drafting on would not pay again."""

    def __init__(self, explore_every: int = EXPLORE_EVERY, settle: int = SETTLE):
        if explore_every < 2 or settle < 1:
            raise ValueError(f"explore_every must be >= 2 and settle >= 1, got {explore_every}, {settle}")
        self.explore_every = explore_every
        self.settle = settle
        self._ways: dict[int, tuple[_Way, _Way]] = {}  # batch -> (without drafts, with drafts)
        self._asked: dict[int, int] = {}  # batch -> decisions made there from figures (own or inferred)
        self._plain_run = 0  # steps recorded without drafts since the last one with drafts
        self._trying: int | None = None  # a batch whose try of drafting wants its measured step
        self.skipped = 0  # decode steps it ran without drafts

    def drafting(self, batch: int) -> bool:
        choice = self._choose(batch)
        self.skipped += not choice
        return choice

    def _choose(self, batch: int) -> bool:
        if self._trying is not None:
            if self._trying == batch:
                return True  # the try goes on until a caught-up step of it is measured
            self._trying = None
        plain, spec = self._ways.setdefault(batch, (_Way(), _Way()))
        best = self._best(batch)
        if best is None:
            return spec.steps < self.settle  # measure drafting first, then without
        hi, lo = max(spec.rate, plain.rate), min(spec.rate, plain.rate)
        rare = 1 if best else min(batch, TRY_DRAFTS_FACTOR)
        every = self.explore_every * rare * (4 if hi > WIDE_GAP * lo else 1)
        n = self._asked[batch] = self._asked.get(batch, 0) + 1
        if n % every:
            return best
        if not best:
            self._trying = batch
        return not best

    def prefers_drafts(self, batch: int) -> bool:
        """What the figures say of drafting at `batch` (True where nothing says), for a step it
        does not measure (a prompt chunk in it): no try, no count."""
        best = self._best(batch)
        return True if best is None else best

    def _best(self, batch: int) -> bool | None:
        """Whether drafting is the faster way at `batch`: by its own figures once both ways are
        settled, else as the measured batch sizes say (_inferred); None when nothing says."""
        ways = self._ways.get(batch)
        if ways is not None and min(w.steps for w in ways) >= self.settle:
            return ways[1].rate >= ways[0].rate
        return self._inferred(batch)

    def _inferred(self, batch: int) -> bool | None:
        """What measured batch sizes say of `batch`: False where a smaller one drafts no more,
        True where a larger one still drafts; None when none settled says either."""
        settled = {b: s.rate >= p.rate for b, (p, s) in self._ways.items()
                   if p.steps >= self.settle and s.steps >= self.settle}
        if any(not d for b, d in settled.items() if b < batch):
            return False
        if any(d for b, d in settled.items() if b > batch):
            return True
        return None

    def record(self, batch: int, drafted: bool, tokens: int, seconds: float) -> None:
        """A decode step of `batch` sequences (no prompt chunk in it) that drafted or not
        (as drafting(batch) said) yielded `tokens` in `seconds`, drafting included."""
        behind, self._plain_run = self._plain_run, 0 if drafted else self._plain_run + 1
        if drafted and behind >= CATCH_UP_STEPS:
            return  # the draft's catch-up: paid once per switch, not per drafting step
        ways = self._ways.setdefault(batch, (_Way(), _Way()))
        if drafted and self._trying == batch:  # a try's measured step: drafting now, not long ago
            self._trying = None
            ways[1].window.clear()
        ways[bool(drafted)].add(tokens, seconds)

    def rates(self) -> dict[int, tuple[float, float]]:
        """batch -> (tokens a second without drafts, with them), as measured so far."""
        return {b: (p.rate, s.rate) for b, (p, s) in sorted(self._ways.items())}
