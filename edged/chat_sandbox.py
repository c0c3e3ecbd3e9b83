"""A bounded jinja2 sandbox for chat templates taken from untrusted GGUF files.

Chat templates come from model files downloaded from anywhere, so rendering one must neither reach
Python internals nor run for long or allocate without bound. jinja2's
``ImmutableSandboxedEnvironment`` already refuses underscore attributes and mutation of lists and
dicts; on top of it this module:

- refuses templates statically before anything runs: underscore attributes (``__globals__``,
  ``self._TemplateReference__context``), dunder string constants, ``include``/``extends``/``import``
  and templates larger than ``MAX_TEMPLATE_CHARS``;
- raises instead of returning an undefined value when a template reaches an unsafe attribute at
  run time (jinja2 would otherwise let ``{% if x.__class__ %}`` pass silently);
- counts work in a per-render :class:`RenderBudget` (held in a ``ContextVar``, so concurrent
  renders in several threads do not share it): every loop iteration, call, intercepted operator
  and output chunk ticks it, and it checks the deadline;
- checks sizes *before* the operations that can amplify data: ``*``, ``+``, ``**``, ``%``, ``~``,
  ``str.replace``/``ljust``/``format``…, the ``indent``/``center``/``join``/``format`` filters, and
  every stringification of a container (its logical size counts repeated references);
- counts every output chunk, including those written into macro and ``{% set %}`` buffers, against
  a total work limit, so no buffer can grow past it.

The generated Python code is hooked through a ``CodeGenerator`` subclass; :func:`build_environment`
checks once that the hooks are present in jinja2's output (fail closed if jinja2 changes).
"""

from __future__ import annotations

import contextvars
import math
import re
import time
import types
from dataclasses import dataclass, field
from typing import Any

from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

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


def _budget() -> RenderBudget:
    b = _BUDGET.get()
    # Outside a render (jinja folding constants at compile time) the default limits apply.
    return b if b is not None else RenderBudget()


def _refuse(msg: str) -> None:
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


def _check_weight(obj: Any, what: str) -> None:
    limit = _budget().size_limit
    if weight(obj, limit) > limit:
        _refuse(f"chat template built a value too large for {what}")


def _check_len(n: int, what: str) -> None:
    if n > _budget().size_limit:
        _refuse(f"chat template would build {n} characters/items in {what}")


def _check_int(v: Any, what: str) -> None:
    if isinstance(v, int) and not isinstance(v, bool) and abs(v) > MAX_INT_ARG:
        _refuse(f"chat template passed an integer too large ({v}) to {what}")


_PCT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")
_BRACE_FIELD = re.compile(r"\{[^{}]*\{")  # a replacement field nested inside another's spec
_DIGITS = re.compile(r"\d+")


def _check_percent_format(fmt: str) -> None:
    for m in _PCT_SPEC.finditer(fmt):
        for g in m.groups():
            if g == "*":
                _refuse("chat template used a '*' width in a % format")
            if g is not None and int(g) > MAX_FORMAT_WIDTH:
                _refuse(f"chat template used a format width over {MAX_FORMAT_WIDTH}")


def _check_brace_format(fmt: str) -> None:
    if _BRACE_FIELD.search(fmt):
        _refuse("chat template used a nested replacement field in str.format")
    for m in _DIGITS.finditer(fmt):
        if len(m.group()) > 4 or int(m.group()) > MAX_FORMAT_WIDTH:
            # Also catches positional indices, which real templates never push that far.
            _refuse(f"chat template used a format width over {MAX_FORMAT_WIDTH}")


def _check_args(args: tuple, kwargs: dict, what: str, *, ints: bool = True) -> None:
    for v in (*args, *kwargs.values()):
        if ints:
            _check_int(v, what)
        if isinstance(v, (list, tuple, dict, set, frozenset)):
            _check_weight(v, what)


def _estimate_replace(s: str, old: Any, new: Any, count: Any = None) -> None:
    if not (isinstance(old, str) and isinstance(new, str)):
        return
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    _check_len(len(s) + n * max(0, len(new) - len(old)), "replace")


def _pre_check_str_method(target: Any, args: tuple, kwargs: dict) -> None:
    """Size checks for the str methods whose result can be much larger than their inputs."""
    s = target.__self__
    name = target.__name__
    if name == "replace" and len(args) >= 2:
        _estimate_replace(s, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count"))
    elif name in ("ljust", "rjust", "center", "zfill") and args and isinstance(args[0], int):
        _check_len(max(len(s), args[0]), name)
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            _check_len(len(s) + s.count("\t") * max(0, size), name)
    elif name == "join" and args:
        seq = args[0]
        if isinstance(seq, (list, tuple, set, frozenset, dict)):
            _check_len(weight(seq, _budget().size_limit) + len(s) * len(seq), name)
    elif name in ("format", "format_map"):
        _check_brace_format(s)
    elif name == "translate" and args and isinstance(args[0], dict):
        longest = max((len(v) for v in args[0].values() if isinstance(v, str)), default=1)
        _check_len(len(s) * max(1, longest), name)


# ---------------------------------------------------------------------------------------------
# Guarded helpers installed as globals / filters

def _guard_range(*args: int) -> range:
    for a in args:
        _check_int(a, "range")
    r = range(*args)
    if len(r) > MAX_RANGE:
        _refuse(f"chat template asked for a range of {len(r)} items (limit {MAX_RANGE})")
    return r


def _guard_iter(iterable: Any):
    """Counts every loop iteration against the render budget and its deadline."""
    b = _budget()
    if iterable is None or isinstance(iterable, (int, float)):
        # Let jinja raise its usual TypeError for non-iterables.
        iter(iterable)
    for item in iterable:
        b.tick()
        yield item


def _wrap_filter(name: str, func: Any) -> Any:
    """Wraps a jinja filter with argument checks, per-filter size estimates and a result check,
    keeping its pass_context/pass_environment marker."""

    passes_arg = hasattr(func, "jinja_pass_arg")

    def guarded(*args: Any, **kwargs: Any) -> Any:
        b = _budget()
        b.tick()
        # pass_context / pass_environment filters get that object first: it is not data.
        data = list(args[1:] if passes_arg else args)
        value = data[0] if data else None
        rest = data[1:]
        # Integer caps apply to the filter's arguments (widths, counts), not to the filtered value.
        _check_args((value,), {}, f"filter {name!r}", ints=False)
        _check_args(tuple(rest), kwargs, f"filter {name!r}")
        if name == "indent" and isinstance(value, str):
            width = rest[0] if rest else kwargs.get("width", 4)
            w = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
            _check_len(len(value) + (value.count("\n") + 1) * max(0, w), "indent")
        elif name == "center" and rest and isinstance(rest[0], int):
            _check_len(rest[0], "center")
        elif name == "replace" and isinstance(value, str) and len(rest) >= 2:
            _estimate_replace(value, rest[0], rest[1], rest[2] if len(rest) > 2 else kwargs.get("count"))
        elif name == "join" and value is not None and hasattr(value, "__len__"):
            sep = rest[0] if rest else kwargs.get("d", "")
            sep_len = len(sep) if isinstance(sep, str) else 0
            _check_len(weight(value, b.size_limit) + sep_len * len(value), "join")
        elif name == "format" and isinstance(value, str):
            _check_percent_format(value)
        elif name == "tojson":
            indent = rest[1] if len(rest) > 1 else kwargs.get("indent")
            if isinstance(indent, int) and indent > 64:
                _refuse("chat template asked tojson for an indent over 64")
        elif name in ("batch", "slice") and rest and isinstance(rest[0], int):
            _check_len(rest[0], name)
        result = func(*args, **kwargs)
        _check_result(result, f"filter {name!r}")
        return result

    for attr in ("jinja_pass_arg",):
        if hasattr(func, attr):
            setattr(guarded, attr, getattr(func, attr))
    guarded.__name__ = getattr(func, "__name__", name)
    guarded.__doc__ = getattr(func, "__doc__", None)
    return guarded


def _check_result(result: Any, what: str) -> None:
    if isinstance(result, str):
        _check_len(len(result), what)
    elif isinstance(result, (list, tuple)):
        _check_len(len(result), what)


# ---------------------------------------------------------------------------------------------
# Static refusal

class _StaticGuard(NodeTransformer):
    """Refuses unsafe constructs before rendering and wraps loop iterables in the iteration guard."""

    def visit_Getattr(self, node: nodes.Getattr) -> nodes.Node:
        if node.attr.startswith("_"):
            _refuse(f"chat template accesses the private attribute {node.attr!r}")
        return self.generic_visit(node)

    def visit_Const(self, node: nodes.Const) -> nodes.Node:
        v = node.value
        if isinstance(v, str) and v.startswith("_") and "__" in v and v.isidentifier() and len(v) > 2:
            _refuse(f"chat template uses the private name {node.value!r}")
        return node

    def visit_Name(self, node: nodes.Name) -> nodes.Node:
        if node.name.startswith("__"):
            _refuse(f"chat template uses the private name {node.name!r}")
        return node

    def visit_Filter(self, node: nodes.Filter) -> nodes.Node:
        if node.name.startswith("edged_"):
            _refuse(f"chat template uses the internal filter {node.name!r}")
        return self.generic_visit(node)

    def _refuse_node(self, node: nodes.Node) -> nodes.Node:
        _refuse(f"chat templates may not use {type(node).__name__.lower()}")
        return node

    visit_Include = visit_Extends = visit_Import = visit_FromImport = _refuse_node

    def visit_For(self, node: nodes.For) -> nodes.Node:
        node = self.generic_visit(node)
        # Recursive loops re-enter through loop(...) calls, which tick the budget themselves.
        node.iter = nodes.Filter(node.iter, "edged_guard_iter", [], [], None, None,
                                 lineno=node.lineno)
        return node


class _GuardedCodeGenerator(CodeGenerator):
    """Routes every output chunk and every ``~`` concatenation through the render budget."""

    def _output_const_repr(self, group: Any) -> str:
        return f"environment.edged_out({super()._output_const_repr(group)})"

    def _output_child_pre(self, node: Any, frame: Any, finalize: Any) -> None:
        self.write("environment.edged_out(")
        super()._output_child_pre(node, frame, finalize)

    def _output_child_post(self, node: Any, frame: Any, finalize: Any) -> None:
        super()._output_child_post(node, frame, finalize)
        self.write(")")

    def visit_Concat(self, node: nodes.Concat, frame: Any) -> None:
        self.write("environment.edged_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class _GenerationTag(Extension):
    """HF's ``{% generation %}…{% endgeneration %}`` marks assistant text for training masks;
    for rendering it is a no-op around its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


_BUILTIN_CALLABLES = (types.BuiltinMethodType, types.BuiltinFunctionType, types.MethodWrapperType,
                      types.MethodDescriptorType, types.WrapperDescriptorType)


class GuardedEnvironment(ImmutableSandboxedEnvironment):
    """ImmutableSandboxedEnvironment with the budget hooks described in the module docstring."""

    code_generator_class = _GuardedCodeGenerator
    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
        raise ChatTemplateError(
            f"chat template tried to access the unsafe attribute {attribute!r} of a "
            f"{type(obj).__name__} object")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        b = _budget()
        b.tick()
        seqs = (str, list, tuple)
        if operator == "*":
            seq, n = (left, right) if isinstance(left, seqs) else (right, left)
            if isinstance(seq, seqs) and isinstance(n, int) and n > 0:
                _check_len(weight(seq, b.size_limit) * n, "'*'")
        elif operator == "+":
            if isinstance(left, seqs) and isinstance(right, seqs):
                _check_len(weight(left, b.size_limit) + weight(right, b.size_limit), "'+'")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
                if right * math.log2(abs(left)) > MAX_POW_BITS:
                    _refuse("chat template computed a power too large")
            elif isinstance(right, (int, float)) and abs(right) > MAX_INT_ARG:
                _refuse("chat template computed a power too large")
        elif operator == "%" and isinstance(left, str):
            _check_percent_format(left)  # widths come from the format; argument values are data
            _check_args(right if isinstance(right, tuple) else (right,), {}, "'%'", ints=False)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        b = _budget()
        b.tick()
        target = getattr(__obj, "__wrapped__", __obj)
        # Integer caps for built-in methods (ljust, zfill, …: where amplifiers live), not for
        # macros, namespace() or dict() whose integer arguments are plain data.
        _check_args(args, kwargs, "a call", ints=isinstance(target, _BUILTIN_CALLABLES))
        if isinstance(target, types.BuiltinMethodType) and isinstance(
            getattr(target, "__self__", None), str
        ):
            _pre_check_str_method(target, args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        _check_result(result, "a call")
        return result

    def edged_out(self, s: Any) -> Any:
        """Every output chunk passes here: counted, size-checked, deadline-checked."""
        _budget().produce(len(s))
        return s

    def edged_concat(self, parts: tuple) -> str:
        b = _budget()
        total = 0
        for p in parts:
            total += weight(p, b.size_limit) if not isinstance(p, str) else len(p)
        _check_len(total, "'~'")
        b.tick()
        return "".join(str(p) for p in parts)


def _finalize(value: Any) -> Any:
    # Called on every {{ expression }} before str(): a container is measured before it is printed.
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        _check_weight(value, "output")
    return value


def build_environment(filters: dict, globals_: dict) -> GuardedEnvironment:
    """Creates the guarded environment with HF's options (trim_blocks, lstrip_blocks,
    loopcontrols) plus the given filters/globals, every filter wrapped by the size guard."""
    env = GuardedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[loopcontrols, _GenerationTag],
        finalize=_finalize,
        autoescape=False,
    )
    env.globals.pop("lipsum", None)  # generates text of a requested size; no chat template needs it
    env.globals["range"] = _guard_range
    env.globals.update(globals_)
    env.filters.update(filters)
    env.filters = {name: _wrap_filter(name, f) for name, f in env.filters.items()}
    env.filters["edged_guard_iter"] = _guard_iter
    # Fail closed if a jinja2 release stops calling our code-generator hooks.
    probe = _StaticGuard().visit(env.parse("a{{ b }}{{ c ~ d }}{% for x in y %}{% endfor %}"))
    src = env.compile(probe, raw=True)
    for hook in ("edged_out", "edged_concat", "edged_guard_iter"):
        if hook not in src:
            raise RuntimeError(f"jinja2's code generator no longer calls {hook}; update edged.chat_sandbox")
    return env


def compile_template(env: GuardedEnvironment, source: str) -> Any:
    """Parses, statically checks and compiles a template; every failure is ChatTemplateError."""
    if not isinstance(source, str):
        raise ChatTemplateError(f"chat template must be a string, got {type(source).__name__}")
    if len(source) > MAX_TEMPLATE_CHARS:
        raise ChatTemplateError(
            f"chat template is {len(source)} characters long (limit {MAX_TEMPLATE_CHARS})")
    try:
        ast = env.parse(source)
        ast = _StaticGuard().visit(ast)
        return env.from_string(ast)
    except ChatTemplateError:
        raise
    except TemplateSyntaxError as e:
        raise ChatTemplateError(f"chat template syntax error (line {e.lineno}): {e.message}") from None
    except (TemplateError, RecursionError, MemoryError, ValueError, TypeError) as e:
        raise ChatTemplateError(f"chat template could not be compiled: {e}") from None


def render_bounded(template: Any, variables: dict, *, timeout_s: float,
                   max_output_chars: int) -> str:
    """Renders with a fresh budget, streaming so that output past ``max_output_chars`` or time past
    ``timeout_s`` stops the render. Every failure is ChatTemplateError."""
    budget = RenderBudget(timeout_s=timeout_s, max_output_chars=max_output_chars)
    token = _BUDGET.set(budget)
    out: list[str] = []
    n = 0
    try:
        for chunk in template.generate(variables):
            n += len(chunk)
            if n > max_output_chars:
                raise ChatTemplateError(
                    f"rendered chat prompt exceeds {max_output_chars} characters")
            budget.tick()
            out.append(chunk)
    except ChatTemplateError:
        raise
    except SecurityError as e:
        raise ChatTemplateError(f"chat template refused by the sandbox: {e}") from None
    except TemplateError as e:
        raise ChatTemplateError(f"chat template error: {e}") from None
    except RecursionError:
        raise ChatTemplateError("chat template recursed too deeply") from None
    except MemoryError:
        raise ChatTemplateError("chat template ran out of memory") from None
    except Exception as e:  # noqa: BLE001 - any template-side failure is the template's error
        raise ChatTemplateError(f"chat template failed: {type(e).__name__}: {e}") from None
    finally:
        _BUDGET.reset(token)
    return "".join(out)
