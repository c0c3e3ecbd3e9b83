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

import math
import types
from typing import Any

from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError, TemplateError, TemplateSyntaxError
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from edged.chat_limits import (
    ChatTemplateError,
    MAX_INT_ARG,
    MAX_POW_BITS,
    MAX_RANGE,
    MAX_TEMPLATE_CHARS,
    check_args,
    check_int,
    check_len,
    check_percent_format,
    check_weight,
    current_budget,
    estimate_replace,
    pre_check_str_method,
    refuse,
    render_budget,
    weight,
)


# ---------------------------------------------------------------------------------------------
# Guarded helpers installed as globals / filters

def _guard_range(*args: int) -> range:
    for a in args:
        check_int(a, "range")
    r = range(*args)
    if len(r) > MAX_RANGE:
        refuse(f"chat template asked for a range of {len(r)} items (limit {MAX_RANGE})")
    return r


def _guard_iter(iterable: Any):
    """Counts every loop iteration against the render budget and its deadline."""
    b = current_budget()
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
        b = current_budget()
        b.tick()
        # pass_context / pass_environment filters get that object first: it is not data.
        data = list(args[1:] if passes_arg else args)
        value = data[0] if data else None
        rest = data[1:]
        # Integer caps apply to the filter's arguments (widths, counts), not to the filtered value.
        check_args((value,), {}, f"filter {name!r}", ints=False)
        check_args(tuple(rest), kwargs, f"filter {name!r}")
        if name == "indent" and isinstance(value, str):
            width = rest[0] if rest else kwargs.get("width", 4)
            w = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
            check_len(len(value) + (value.count("\n") + 1) * max(0, w), "indent")
        elif name == "center" and rest and isinstance(rest[0], int):
            check_len(rest[0], "center")
        elif name == "replace" and isinstance(value, str) and len(rest) >= 2:
            estimate_replace(value, rest[0], rest[1], rest[2] if len(rest) > 2 else kwargs.get("count"))
        elif name == "join" and value is not None and hasattr(value, "__len__"):
            sep = rest[0] if rest else kwargs.get("d", "")
            sep_len = len(sep) if isinstance(sep, str) else 0
            check_len(weight(value, b.size_limit) + sep_len * len(value), "join")
        elif name == "format" and isinstance(value, str):
            check_percent_format(value)
        elif name == "tojson":
            indent = rest[1] if len(rest) > 1 else kwargs.get("indent")
            if isinstance(indent, int) and indent > 64:
                refuse("chat template asked tojson for an indent over 64")
        elif name in ("batch", "slice") and rest and isinstance(rest[0], int):
            check_len(rest[0], name)
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
        check_len(len(result), what)
    elif isinstance(result, (list, tuple)):
        check_len(len(result), what)


# ---------------------------------------------------------------------------------------------
# Static refusal

class _StaticGuard(NodeTransformer):
    """Refuses unsafe constructs before rendering and wraps loop iterables in the iteration guard."""

    def visit_Getattr(self, node: nodes.Getattr) -> nodes.Node:
        if node.attr.startswith("_"):
            refuse(f"chat template accesses the private attribute {node.attr!r}")
        return self.generic_visit(node)

    def visit_Const(self, node: nodes.Const) -> nodes.Node:
        v = node.value
        if isinstance(v, str) and v.startswith("_") and "__" in v and v.isidentifier() and len(v) > 2:
            refuse(f"chat template uses the private name {node.value!r}")
        return node

    def visit_Name(self, node: nodes.Name) -> nodes.Node:
        if node.name.startswith("__"):
            refuse(f"chat template uses the private name {node.name!r}")
        return node

    def visit_Filter(self, node: nodes.Filter) -> nodes.Node:
        if node.name.startswith("edged_"):
            refuse(f"chat template uses the internal filter {node.name!r}")
        return self.generic_visit(node)

    def _refuse_node(self, node: nodes.Node) -> nodes.Node:
        refuse(f"chat templates may not use {type(node).__name__.lower()}")
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
        b = current_budget()
        b.tick()
        seqs = (str, list, tuple)
        if operator == "*":
            seq, n = (left, right) if isinstance(left, seqs) else (right, left)
            if isinstance(seq, seqs) and isinstance(n, int) and n > 0:
                check_len(weight(seq, b.size_limit) * n, "'*'")
        elif operator == "+":
            if isinstance(left, seqs) and isinstance(right, seqs):
                check_len(weight(left, b.size_limit) + weight(right, b.size_limit), "'+'")
        elif operator == "**":
            if isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
                if right * math.log2(abs(left)) > MAX_POW_BITS:
                    refuse("chat template computed a power too large")
            elif isinstance(right, (int, float)) and abs(right) > MAX_INT_ARG:
                refuse("chat template computed a power too large")
        elif operator == "%" and isinstance(left, str):
            check_percent_format(left)  # widths come from the format; argument values are data
            check_args(right if isinstance(right, tuple) else (right,), {}, "'%'", ints=False)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        b = current_budget()
        b.tick()
        target = getattr(__obj, "__wrapped__", __obj)
        # Integer caps for built-in methods (ljust, zfill, …: where amplifiers live), not for
        # macros, namespace() or dict() whose integer arguments are plain data.
        check_args(args, kwargs, "a call", ints=isinstance(target, _BUILTIN_CALLABLES))
        if isinstance(target, types.BuiltinMethodType) and isinstance(
            getattr(target, "__self__", None), str
        ):
            pre_check_str_method(target, args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        _check_result(result, "a call")
        return result

    def edged_out(self, s: Any) -> Any:
        """Every output chunk passes here: counted, size-checked, deadline-checked."""
        current_budget().produce(len(s))
        return s

    def edged_concat(self, parts: tuple) -> str:
        b = current_budget()
        total = 0
        for p in parts:
            total += weight(p, b.size_limit) if not isinstance(p, str) else len(p)
        check_len(total, "'~'")
        b.tick()
        return "".join(str(p) for p in parts)


def _finalize(value: Any) -> Any:
    # Called on every {{ expression }} before str(): a container is measured before it is printed.
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        check_weight(value, "output")
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
    out: list[str] = []
    n = 0
    try:
        with render_budget(timeout_s, max_output_chars) as budget:
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
    return "".join(out)
