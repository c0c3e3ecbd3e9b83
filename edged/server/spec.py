"""Request-body specs: one definition per field both validates a request and emits its JSON Schema.

A `Body` lists `Field`s, each a name and a node (Boolean, Integer, Number, String, Array, Object,
AnyOf, Anything, TokenId, Refine). `Body.read` checks every declared field (an APIError 400 whose
message and `param` name the field) and returns a dict of exactly the declared names, so a parser
cannot use a field the document lacks; `Body.schema()` is what /openapi.json publishes. Anything
the document forbids is refused by the node itself; checks the document cannot state (limits set
by the loaded model, cross-field rules, grammar compilation) only narrow it further, in code.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from edged.server.errors import APIError, bad_request

VOCAB = "vocab_size"  # a bound the loaded model sets: Integer(hi=VOCAB) is <= its vocabulary size


def type_name(v: Any) -> str:
    """A value's JSON type, as the error messages say it."""
    return "null" if v is None else {bool: "boolean", int: "integer", float: "number", str: "string",
                                     list: "array", dict: "object"}.get(type(v), type(v).__name__)


def _child(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _error(path: str, what: str, code: str | None = None) -> APIError:
    return bad_request(f"'{path}' {what}", path, code)


def _short(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


class Node:
    """A JSON value's rules. `check` returns the value (converted: 2.0 -> 2 for integers) or raises
    APIError naming `path`; `takes` says whether a value is of this node's JSON type (AnyOf picks
    its branch with it)."""

    description: str = ""

    def check(self, v: Any, path: str, ctx: dict) -> Any:
        raise NotImplementedError

    def takes(self, v: Any) -> bool:
        raise NotImplementedError

    def json_schema(self) -> dict:
        raise NotImplementedError

    def schema(self) -> dict:
        s = self.json_schema()
        if self.description:
            s["description"] = self.description
        return s


@dataclass
class Boolean(Node):
    description: str = ""

    def takes(self, v):
        return isinstance(v, bool)

    def check(self, v, path, ctx):
        if not isinstance(v, bool):
            raise _error(path, f"must be a boolean, got {type_name(v)}")
        return v

    def json_schema(self):
        return {"type": "boolean"}


def _bound(b, ctx: dict, offset: int = 0):
    """A fixed bound, or the model's (VOCAB) when the context knows it (None otherwise)."""
    if isinstance(b, str):
        return ctx[b] + offset if b in ctx else None
    return b


@dataclass
class Integer(Node):
    """An integer (2.0 counts as 2: JSON has one number type; 2.5 and true do not) in [lo, hi];
    hi may be VOCAB, the loaded model's vocabulary size."""

    lo: int | None = None
    hi: int | str | None = None
    description: str = ""

    def takes(self, v):
        return (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer())

    def check(self, v, path, ctx):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise _error(path, f"must be an integer, got {type_name(v)}")
        hi = _bound(self.hi, ctx)
        if self.lo is not None and v < self.lo:
            raise _error(path, f"must be >= {self.lo}, got {v}")
        if hi is not None and v > hi:
            raise _error(path, f"must be <= {hi}, got {v}")
        return v

    def json_schema(self):
        s = {"type": "integer"}
        if self.lo is not None:
            s["minimum"] = self.lo
        if isinstance(self.hi, int):
            s["maximum"] = self.hi
        elif self.hi == VOCAB:
            s["x-maximum"] = "the model's vocabulary size"
        return s


@dataclass
class TokenId(Integer):
    """A token id of the loaded model: 0 .. vocabulary size - 1."""

    lo: int | None = 0

    def check(self, v, path, ctx):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise _error(path, f"must be an integer token id, got {type_name(v)}")
        vocab = ctx.get(VOCAB)
        if v < 0 or (vocab is not None and v >= vocab):
            top = f"0..{vocab - 1}" if vocab is not None else ">= 0"
            raise bad_request(f"token id {v} in '{path}' is outside the vocabulary ({top})", path,
                              code="invalid_token_id")
        return v

    def json_schema(self):
        return {"type": "integer", "minimum": 0, "x-maximum": "the model's vocabulary size - 1"}


@dataclass
class Number(Node):
    """A finite number in [lo, hi] ((lo, hi] with lo_open); either bound may be None."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    description: str = ""

    def takes(self, v):
        return isinstance(v, (int, float)) and not isinstance(v, bool)

    def check(self, v, path, ctx):
        if not self.takes(v) or not math.isfinite(v):
            raise _error(path, f"must be a finite number, got {type_name(v)}")
        lo_bad = self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo)
        hi_bad = self.hi is not None and v > self.hi
        if lo_bad or hi_bad:
            if self.lo is not None and self.hi is not None:
                interval = f"({self.lo}, {self.hi}]" if self.lo_open else f"[{self.lo}, {self.hi}]"
                raise _error(path, f"must be in {interval}, got {v}")
            raise _error(path, f"must be {'>' if self.lo_open else '>='} {self.lo}, got {v}" if lo_bad
                         else f"must be <= {self.hi}, got {v}")
        return float(v)

    def json_schema(self):
        s = {"type": "number"}
        if self.lo is not None:
            s["exclusiveMinimum" if self.lo_open else "minimum"] = self.lo
        if self.hi is not None:
            s["maximum"] = self.hi
        return s


@dataclass
class String(Node):
    """A string of min_len..max_len characters, one of `enum` (`why` explains a refusal) or
    matching `pattern` (whole string; the same regex in JSON Schema's dialect)."""

    min_len: int = 0
    max_len: int | None = None
    enum: tuple[str, ...] | None = None
    pattern: str | None = None
    why: str = ""
    description: str = ""

    def takes(self, v):
        return isinstance(v, str)

    def check(self, v, path, ctx):
        if not isinstance(v, str):
            raise _error(path, f"must be a string, got {type_name(v)}")
        if self.enum is not None and v not in self.enum:
            options = ", ".join(repr(e) for e in self.enum)
            raise _error(path, f"must be one of {options}, got {_short(v)}"
                         + (f" ({self.why})" if self.why else ""))
        if len(v) < self.min_len:
            raise _error(path, "must not be empty" if self.min_len == 1 else
                         f"must have at least {self.min_len} characters")
        if self.max_len is not None and len(v) > self.max_len:
            raise _error(path, f"must have at most {self.max_len} characters, got {len(v)}")
        if self.pattern is not None and not re.fullmatch(self.pattern, v):
            raise _error(path, f"is {_short(v)}: " + (self.why or f"must match {self.pattern}"))
        return v

    def json_schema(self):
        s: dict = {"type": "string"}
        if self.enum is not None:
            s["enum"] = list(self.enum)
        if self.min_len:
            s["minLength"] = self.min_len
        if self.max_len is not None:
            s["maxLength"] = self.max_len
        if self.pattern is not None:
            s["pattern"] = f"^{self.pattern}$"
        return s


@dataclass
class Array(Node):
    """An array of `items` (any JSON value when None), min_items..max_items long."""

    items: Node | None = None
    min_items: int = 0
    max_items: int | None = None
    why: str = ""  # said when max_items refuses (0: the feature is not supported)
    description: str = ""

    def takes(self, v):
        # in an AnyOf of several arrays, the first item's type picks the branch
        return isinstance(v, list) and (not v or self.items is None or self.items.takes(v[0]))

    def check(self, v, path, ctx):
        if not isinstance(v, list):
            raise _error(path, f"must be an array, got {type_name(v)}")
        if len(v) < self.min_items:
            raise _error(path, "must not be empty" if self.min_items == 1 else
                         f"must hold at least {self.min_items} items")
        if self.max_items is not None and len(v) > self.max_items:
            raise _error(path, f"holds at most {self.max_items} items, got {len(v)}"
                         + (f": {self.why}" if self.why else ""))
        if self.items is None:
            return v
        return [self.items.check(x, f"{path}[{i}]", ctx) for i, x in enumerate(v)]

    def json_schema(self):
        s: dict = {"type": "array"}
        if self.items is not None:
            s["items"] = self.items.schema()
        if self.min_items:
            s["minItems"] = self.min_items
        if self.max_items is not None:
            s["maxItems"] = self.max_items
        return s


@dataclass(frozen=True)
class Field:
    """A named member of an Object. An optional field may be null, which means absent (as
    OpenAI's server treats it); `default` is what Body.read gives for it then."""

    name: str
    node: Node
    required: bool = False
    default: Any = None
    description: str = ""

    def schema(self) -> dict:
        s = self.node.schema()
        if not self.required:
            s = _nullable(s)
        if self.default is not None:
            s["default"] = self.default
        if self.description:
            s["description"] = self.description
        return s

    def read(self, obj: dict, path: str, ctx: dict):
        """The field's checked value, or `default` when absent or null."""
        p = _child(path, self.name)
        v = obj.get(self.name)
        if v is None:
            if self.required:
                raise _error(p, "is required")
            return self.default
        return self.node.check(v, p, ctx)


def _nullable(s: dict) -> dict:
    t = s.get("type")
    if t == "null" or (isinstance(t, list) and "null" in t):
        return s
    if "enum" in s:
        s = {**s, "enum": [*s["enum"], None]}
    if isinstance(t, str):
        return {**s, "type": [t, "null"]}
    if isinstance(t, list):
        return {**s, "type": [*t, "null"]}
    if "anyOf" in s:
        return {**s, "anyOf": [*s["anyOf"], {"type": "null"}]}
    if s.keys() - {"description"}:  # oneOf, a $ref ...: either it or null
        return {"anyOf": [s, {"type": "null"}]}
    return s  # no type: any JSON value, null included


@dataclass
class Object(Node):
    """An object with declared `fields`; other members are ignored (OpenAI's rule) unless `values`
    is set: then every other member must be a `values` and its key match `keys`."""

    fields: tuple[Field, ...] = ()
    values: Node | None = None
    keys: str | None = None
    keys_why: str = ""
    description: str = ""

    def takes(self, v):
        return isinstance(v, dict)

    def check(self, v, path, ctx):
        """The object with each declared member checked (absent ones stay absent)."""
        if not isinstance(v, dict):
            raise _error(path, f"must be an object, got {type_name(v)}")
        out = dict(v)
        for f in self.fields:
            value = f.read(v, path, ctx)
            if f.name in v and v[f.name] is not None:
                out[f.name] = value
        if self.values is not None:
            declared = {f.name for f in self.fields}
            for k, x in v.items():
                if k in declared:
                    continue
                if self.keys is not None and not re.fullmatch(self.keys, k):
                    raise _error(path, f"key {_short(k)} " + (self.keys_why or f"must match {self.keys}"))
                out[k] = self.values.check(x, f"{path}[{k!r}]" if self.keys is None else f"{path}.{k}", ctx)
        return out

    def json_schema(self):
        s: dict = {"type": "object"}
        if self.fields:
            s["properties"] = {f.name: f.schema() for f in self.fields}
            required = [f.name for f in self.fields if f.required]
            if required:
                s["required"] = required
        if self.values is not None:
            s["additionalProperties"] = self.values.schema()
        if self.keys is not None:
            s["propertyNames"] = {"pattern": f"^{self.keys}$"}
        return s


@dataclass
class AnyOf(Node):
    """One of several nodes, chosen by the value's JSON type (for arrays, by the first item's):
    the branches must take disjoint values. `what` names the accepted forms in the error."""

    branches: tuple[Node, ...] = ()
    what: str = ""
    description: str = ""

    def takes(self, v):
        return any(b.takes(v) for b in self.branches)

    def check(self, v, path, ctx):
        for b in self.branches:
            if b.takes(v):
                return b.check(v, path, ctx)
        raise _error(path, f"must be {self.what}, got {type_name(v)}")

    def json_schema(self):
        return {"anyOf": [b.schema() for b in self.branches]}


@dataclass
class Anything(Node):
    """Any JSON value of `types` (all types when empty), checked no deeper here: a JSON schema,
    a tool's arguments."""

    types: tuple[str, ...] = ()
    description: str = ""

    def takes(self, v):
        return not self.types or type_name(v) in self.types or (type_name(v) == "integer" and "number" in self.types)

    def check(self, v, path, ctx):
        if not self.takes(v):
            raise _error(path, f"must be {' or '.join(self.types)}, got {type_name(v)}")
        return v

    def json_schema(self):
        if not self.types:
            return {}
        return {"type": list(self.types) if len(self.types) > 1 else self.types[0]}


@dataclass
class Unsupported(Node):
    """A field edged refuses whenever it is given (only null or absence passes)."""

    why: str = ""
    description: str = ""

    def takes(self, v):
        return False

    def check(self, v, path, ctx):
        raise _error(path, "is not supported" + (f": {self.why}" if self.why else ""))

    def json_schema(self):
        return {"type": "null", "description": f"not supported{': ' + self.why if self.why else ''}"}

    def schema(self):
        return self.json_schema()


@dataclass
class Refine(Node):
    """`node`, then `fn(value, ctx)` for what the document cannot state (a duration's syntax, a
    limit of the loaded model); a ValueError from fn is a 400 with its message naming the field.
    `note` says the rule in the document."""

    node: Node = None  # type: ignore[assignment]
    fn: Callable[[Any, dict], Any] = None  # type: ignore[assignment]
    note: str = ""

    def takes(self, v):
        return self.node.takes(v)

    def check(self, v, path, ctx):
        v = self.node.check(v, path, ctx)
        try:
            return self.fn(v, ctx)
        except APIError:
            raise
        except ValueError as e:
            raise bad_request(str(e), path) from None

    def json_schema(self):
        s = self.node.schema()
        if self.note:
            s["description"] = (s.get("description", "") + " " + self.note).strip()
        return s


class Body(Object):
    """A request body: `name` titles it in the document's components."""

    def __init__(self, name: str, fields: tuple[Field, ...], description: str = ""):
        super().__init__(fields=fields, description=description)
        self.name = name

    def read(self, body: Any, **ctx) -> dict:
        """Every declared field's checked value (its default when absent), by name."""
        if not isinstance(body, dict):
            raise bad_request(f"the request body must be a JSON object, got {type_name(body)}")
        return {f.name: f.read(body, "", ctx) for f in self.fields}

    def field(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)

    def json_schema(self):
        s = super().json_schema()
        s["title"] = self.name
        return s


def fields(*groups) -> tuple[Field, ...]:
    """Fields and tuples of fields, flattened (bodies share groups of fields)."""
    out: list[Field] = []
    for g in groups:
        out.extend(g if isinstance(g, tuple) else (g,))
    names = [f.name for f in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"fields declared twice: {sorted(dup)}")
    return tuple(out)


# -- operations ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Operation:
    """What /openapi.json says about one route: its request body, its 200 reply (`response`, a
    JSON schema, in `media`), what it streams when the body's `stream` is true (`stream_media`:
    text/event-stream or application/x-ndjson, each event or line a `stream_item`), its error
    shape ("openai" or "ollama"), the error statuses it answers besides the transport ones (400
    for a bad Host, 401 without the key, 413, 431), and whether it needs the API key."""

    summary: str
    body: Body | None = None
    response: dict | None = None
    media: str = "application/json"
    stream_media: str | None = None
    stream_item: dict | None = None
    errors: str = "openai"
    statuses: tuple[int, ...] = ()
    public: bool = False
    tag: str = "openai"
    description: str = ""
    responses: dict = field(default_factory=dict)  # more OpenAPI responses by status (health's 503)


OPERATION_ATTR = "__edged_operation__"


def operation(op: Operation | None = None, **by_method: Operation):
    """Attach what the document says about an endpoint (functools.wraps keeps it on wrappers):
    `op` for each of its route's methods, or one per method (get=..., delete=...); a method
    with neither is deliberately left out (a catch-all answering 404/405). The OpenAPI builder
    reads it from every route of the app and refuses a route without it."""
    ops = {k.upper(): v for k, v in by_method.items()}
    if op is not None:
        ops["*"] = op

    def mark(fn):
        setattr(fn, OPERATION_ATTR, ops)
        return fn
    return mark


def operations_of(endpoint) -> dict[str, Operation] | None:
    """The endpoint's Operations by method ("*": every method), None when it has none."""
    return getattr(endpoint, OPERATION_ATTR, None)
