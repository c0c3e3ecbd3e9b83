"""What a chat-template render may spend, and the checks that hold it to that: the per-render
:class:`RenderBudget` (steps, deadline, output), logical sizes of values, and size estimates made
*before* each operation that can amplify data (see edged.chat_sandbox, which installs them)."""

from __future__ import annotations

import contextlib
import contextvars
import re
import time
from dataclasses import dataclass, field
from typing import Any

MAX_TEMPLATE_CHARS = 256 * 1024  # real chat templates are a few KiB; the largest known ~30 KiB
DEFAULT_TIMEOUT_S = 1.0
DEFAULT_MAX_OUTPUT_CHARS = 1 << 20  # 1 MiB of rendered prompt
WORK_FACTOR = 8  # all output chunks (buffers included) may total WORK_FACTOR × the output limit
MAX_ITERATIONS = 1 << 20  # loop iterations + calls + operators per render
MAX_INT_ARG = 1 << 20  # largest integer a template may pass to a function or filter
MAX_FORMAT_WIDTH = 4096  # widths / precisions in % and str.format specs
MAX_RANGE = 1 << 16
MAX_POW_BITS = 4096  # integer results of ** beyond this many bits are refused


class ChatTemplateError(ValueError):
    """A chat template is malformed, unsafe, raised an error itself, or exceeded its bounds."""


@dataclass
class RenderBudget:
    """Work and size limits of one render; ``tick`` is called on every counted step."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    deadline: float = field(init=False)
    steps: int = field(default=0, init=False)
    produced: int = field(default=0, init=False)
    # id -> (object, weight): keeps the object alive so its id cannot be reused within the render
    weights: dict = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.deadline = time.perf_counter() + self.timeout_s

    @property
    def size_limit(self) -> int:
        """Largest logical size of any single value the template may build."""
        return self.max_output_chars

    def tick(self, n: int = 1) -> None:
        self.steps += n
        if self.steps > MAX_ITERATIONS:
            raise ChatTemplateError(f"chat template exceeded {MAX_ITERATIONS} steps")
        if time.perf_counter() > self.deadline:
            raise ChatTemplateError(f"chat template exceeded its time limit of {self.timeout_s} s")

    def produce(self, n_chars: int) -> None:
        self.produced += n_chars
        if self.produced > WORK_FACTOR * self.max_output_chars:
            raise ChatTemplateError("chat template produced too much text")
        self.tick()


_BUDGET: contextvars.ContextVar[RenderBudget | None] = contextvars.ContextVar(
    "edged_chat_budget", default=None
)


@contextlib.contextmanager
def render_budget(timeout_s: float, max_output_chars: int):
    """The budget of one render, current in this context (thread or task) until the block ends."""
    budget = RenderBudget(timeout_s=timeout_s, max_output_chars=max_output_chars)
    token = _BUDGET.set(budget)
    try:
        yield budget
    finally:
        _BUDGET.reset(token)


def current_budget() -> RenderBudget:
    b = _BUDGET.get()
    # Outside a render (jinja folding constants at compile time) the default limits apply.
    return b if b is not None else RenderBudget()


def refuse(msg: str) -> None:
    raise ChatTemplateError(msg)


# ---------------------------------------------------------------------------------------------
# Size estimates

def weight(obj: Any, limit: int) -> int:
    """Logical size of ``obj``: characters of strings plus one per container element, counted
    through repeated references (``[x] * 1000`` weighs 1000 × x). Stops once past ``limit``."""
    budget = _BUDGET.get()
    if isinstance(obj, str):
        return len(obj)
    if not isinstance(obj, (list, tuple, dict, set, frozenset)):
        return 1
    if budget is not None:
        hit = budget.weights.get(id(obj))
        if hit is not None and hit[0] is obj:
            return hit[1]
    total = 0
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, str):
            total += len(o)
        elif isinstance(o, (list, tuple, set, frozenset)):
            total += len(o) + 1
            if total > limit:
                break
            stack.extend(o)
        elif isinstance(o, dict):
            total += 2 * len(o) + 1
            if total > limit:
                break
            stack.extend(o.keys())
            stack.extend(o.values())
        else:
            total += 1
        if total > limit:
            break
    if budget is not None:
        budget.weights[id(obj)] = (obj, total)
    return total


def check_weight(obj: Any, what: str) -> None:
    limit = current_budget().size_limit
    if weight(obj, limit) > limit:
        refuse(f"chat template built a value too large for {what}")


def check_len(n: int, what: str) -> None:
    if n > current_budget().size_limit:
        refuse(f"chat template would build {n} characters/items in {what}")


def check_int(v: Any, what: str) -> None:
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT_ARG:
        refuse(f"chat template passed an integer too large ({v}) to {what}")


_PCT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_BRACE_FIELD = re.compile(r"\{[^{}]*\{")  # a replacement field nested inside another's spec
_DIGITS = re.compile(r"\d+")


def check_percent_format(fmt: str) -> None:
    for m in _PCT_SPEC.finditer(fmt):
        for g in m.groups():
            if g == "*":
                refuse("chat template used a '*' width in a % format")
            if g is not None and int(g) > MAX_FORMAT_WIDTH:
                refuse(f"chat template used a format width over {MAX_FORMAT_WIDTH}")


def check_brace_format(fmt: str) -> None:
    if _BRACE_FIELD.search(fmt):
        refuse("chat template used a nested replacement field in str.format")
    for m in _DIGITS.finditer(fmt):
        if len(m.group()) > 4 or int(m.group()) > MAX_FORMAT_WIDTH:
            # Also catches positional indices, which real templates never push that far.
            refuse(f"chat template used a format width over {MAX_FORMAT_WIDTH}")


def check_args(args: tuple, kwargs: dict, what: str, *, ints: bool = True) -> None:
    for v in (*args, *kwargs.values()):
        if ints:
            check_int(v, what)
        if isinstance(v, (list, tuple, dict, set, frozenset)):
            check_weight(v, what)


def estimate_replace(s: str, old: Any, new: Any, count: Any = None) -> None:
    if not (isinstance(old, str) and isinstance(new, str)):
        return
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    check_len(len(s) + n * max(0, len(new) - len(old)), "replace")


def pre_check_str_method(target: Any, args: tuple, kwargs: dict) -> None:
    """Size checks for the str methods whose result can be much larger than their inputs."""
    s = target.__self__
    name = target.__name__
    if name == "replace" and len(args) >= 2:
        estimate_replace(s, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count"))
    elif name in ("ljust", "rjust", "center", "zfill") and args and isinstance(args[0], int):
        check_len(max(len(s), args[0]), name)
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            check_len(len(s) + s.count("\t") * max(0, size), name)
    elif name == "join" and args:
        seq = args[0]
        if isinstance(seq, (list, tuple, set, frozenset, dict)):
            check_len(weight(seq, current_budget().size_limit) + len(s) * len(seq), name)
    elif name in ("format", "format_map"):
        check_brace_format(s)
    elif name == "translate" and args and isinstance(args[0], dict):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
        check_len(len(s) * max(1, longest), name)
