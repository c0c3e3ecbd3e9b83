"""/openapi.json: every route of the app documented, the document well formed, and the request
validator agreeing with it: bodies built from the published schemas pass Body.read, and each
boundary, wrong type or enum miss the schema (checked by jsonschema) forbids is a 400 naming the
field, while each one it allows is accepted."""

import copy

import jsonschema
import pytest
from starlette.testclient import TestClient

from edged.loader import load
from edged.server.app import ROUTES, create_app
from edged.server.config import ServerConfig
from edged.server.errors import APIError
from edged.server.lifecycle import ServerState
from edged.server.openapi import MissingOperation, build_document
from edged.server.spec import VOCAB, Body, Field, Integer, Object, String, fields, operations_of
from tests.helpers.tiny_models import write_tiny_model
from tests.server.stub_model import StubModel

VOCAB_SIZE = 10**6  # large: the model's own limits are not what these tests are about


@pytest.fixture(scope="module")
def doc():
    return build_document(ROUTES, "test")


def _bodies() -> list[Body]:
    seen = {}
    for r in ROUTES:
        for op in operations_of(r.endpoint).values():
            if op is not None and op.body is not None:
                seen[op.body.name] = op.body
    return list(seen.values())


# -- the document ----------------------------------------------------------------------------------

def test_every_route_and_method_is_documented(doc):
    for r in ROUTES:
        ops = operations_of(r.endpoint)
        assert ops is not None, f"{r.path} has no Operation"
        path = r.path.replace(":path}", "}")
        for method in r.methods - {"HEAD"}:
            op = ops.get(method, ops.get("*"))
            assert op is not None, f"{method} {r.path} is left out of the document"
            entry = doc["paths"][path][method.lower()]
            assert entry["summary"] == op.summary and "200" in entry["responses"]
            if op.body is not None:
                ref = entry["requestBody"]["content"]["application/json"]["schema"]["$ref"]
                assert doc["components"]["schemas"][ref.rsplit("/", 1)[1]] == op.body.schema()
    ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids))


def test_a_route_without_an_operation_fails_the_build():
    from starlette.routing import Route

    async def undocumented(request):
        return None

    with pytest.raises(MissingOperation, match="/v1/new has no Operation"):
        build_document([*ROUTES, Route("/v1/new", undocumented, methods=["POST"])], "test")


def test_document_shape_security_and_schemas_are_valid(doc):
    assert doc["openapi"] == "3.1.0"
    assert doc["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    health = doc["paths"]["/health"]["get"]
    assert health["security"] == [] and "401" not in health["responses"]
    chat = doc["paths"]["/v1/chat/completions"]["post"]
    assert {"400", "401", "404", "413", "503"} <= set(chat["responses"])
    assert set(chat["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    gen = doc["paths"]["/api/generate"]["post"]["responses"]
    assert "application/x-ndjson" in gen["200"]["content"]
    assert doc["paths"]["/v1/models/{model_id}"]["get"]["parameters"][0]["name"] == "model_id"
    for item in doc["paths"].values():
        for op in item.values():
            for resp in op["responses"].values():
                for media in resp["content"].values():
                    jsonschema.Draft202012Validator.check_schema(media["schema"])
    for s in doc["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(s)


def test_schemathesis_loads_the_document(doc):
    schemathesis = pytest.importorskip("schemathesis")
    schema = schemathesis.openapi.from_dict(doc)
    n = sum(1 for r in schema.get_all_operations() if r.ok())
    assert n == sum(len(item) for item in doc["paths"].values())


# -- validator and document agree --------------------------------------------------------------------

def _sample(s: dict):
    """A small value the JSON schema `s` allows (required members only)."""
    if "anyOf" in s:
        return _sample(next(b for b in s["anyOf"] if b.get("type") != "null"))
    if "enum" in s:
        return s["enum"][0]
    t = s.get("type")
    t = next((x for x in t if x != "null"), None) if isinstance(t, list) else t
    if t == "object":
        return {k: _sample(s["properties"][k]) for k in s.get("required", [])}
    if t == "array":
        return [_sample(s["items"]) for _ in range(max(1, s.get("minItems", 0)))] if "items" in s else []
    if t == "string":
        return "a" * max(1, s.get("minLength", 0))
    if t == "integer":
        return s.get("minimum", 1)
    if t == "number":
        return s.get("minimum", 0.5)
    if t == "boolean":
        return True
    return {}


def _mutations(s: dict, path: tuple):
    """(path, value) pairs around what `s` allows: bounds and one past them, enum misses, wrong
    types, null; into every declared object member and array item."""
    branches = [b for b in s.get("anyOf", [s]) if b.get("type") != "null"]
    yield path, None
    for wrong in (True, 7, 2.5, "x", [], {}):
        yield path, wrong
    for b in branches:
        t = b.get("type")
        t = next((x for x in t if x != "null"), None) if isinstance(t, list) else t
        if "enum" in b:
            yield from ((path, e) for e in b["enum"])
            yield path, "not-" + str(b["enum"][0])
        if t in ("integer", "number"):
            for k, d in (("minimum", -1), ("maximum", 1), ("exclusiveMinimum", 0)):
                if k in b:
                    yield path, b[k]
                    yield path, b[k] + d * (1 if t == "integer" else 0.001)
        if t == "string":
            for k, v in (("minLength", b.get("minLength", 0) - 1), ("maxLength", b.get("maxLength", 0) + 1)):
                if k in b and v >= 0:
                    yield path, "a" * v
        if t == "array" and "items" in b:
            if "maxItems" in b:
                yield path, [_sample(b["items"])] * (b["maxItems"] + 1)
            yield from _mutations(b["items"], path + (0,))
        if t == "object":
            for name, sub in b.get("properties", {}).items():
                yield from _mutations(sub, path + (name,))


def _set(body, path, value):
    """`body` with the member at `path` set (containers on the way made from samples)."""
    out = copy.deepcopy(body)
    cur = out
    for key in path[:-1]:
        if isinstance(key, int):
            if not isinstance(cur, list) or not cur:
                return None
        elif not isinstance(cur, dict):
            return None
        elif not isinstance(cur.get(key), (dict, list)):
            cur[key] = {} if isinstance(path[path.index(key) + 1], str) else [{}]
        cur = cur[key]
    if isinstance(path[-1], int):
        if not isinstance(cur, list):
            return None
        cur[:] = [value]
    elif isinstance(cur, dict):
        if value is None:
            cur.pop(path[-1], None)
            cur[path[-1]] = None
        else:
            cur[path[-1]] = value
    else:
        return None
    return out


# fields whose rule the document cannot state in full (a duration's syntax, a model's limit)
REFINED = {"keep_alive", "logit_bias"}


@pytest.mark.parametrize("body", _bodies(), ids=lambda b: b.name)
def test_a_body_built_from_the_schema_passes(body):
    sample = _sample(body.schema())
    jsonschema.validate(sample, body.schema())
    body.read(sample, vocab_size=VOCAB_SIZE)


@pytest.mark.parametrize("body", _bodies(), ids=lambda b: b.name)
def test_validator_and_schema_agree_on_mutations(body):
    schema = body.schema()
    base = _sample(schema)
    checker = jsonschema.Draft202012Validator(schema)
    tried = 0
    for name, sub in schema["properties"].items():
        if name in REFINED:
            continue
        for path, value in _mutations(sub, (name,)):
            mutated = _set(base, path, value)
            if mutated is None:
                continue
            allowed = checker.is_valid(mutated)
            try:
                body.read(mutated, vocab_size=VOCAB_SIZE)
                accepted = True
            except APIError as e:
                accepted = False
                assert e.status == 400 and e.param and e.param.split(".")[0].split("[")[0] == path[0], \
                    (path, value, e.message)
                assert e.param in e.message, e.message
            assert accepted == allowed, f"{body.name} {path} = {value!r}: schema allows {allowed}, " \
                                        f"validator accepts {accepted}"
            tried += 1
    assert tried > 5 * len(schema["properties"]) // 2


def test_spec_nodes_state_their_rules():
    b = Body("T", fields(Field("n", Integer(1, 8), default=1), Field("k", Integer(-1, VOCAB)),
                         Field("o", Object(fields=(Field("s", String(enum=("a", "b")), required=True),)))))
    s = b.schema()
    assert s["properties"]["n"] == {"type": ["integer", "null"], "minimum": 1, "maximum": 8, "default": 1}
    assert "maximum" not in s["properties"]["k"]
    assert s["properties"]["o"]["required"] == ["s"]
    assert b.read({"n": 2.0}) == {"n": 2, "k": None, "o": None}
    with pytest.raises(APIError, match=r"'k' must be <= 100, got 101") as e:
        b.read({"k": 101}, vocab_size=100)
    assert e.value.param == "k"
    with pytest.raises(APIError, match=r"'o.s' must be one of 'a', 'b', got 'c'"):
        b.read({"o": {"s": "c"}})
    with pytest.raises(APIError, match=r"'o.s' is required"):
        b.read({"o": {}})
    with pytest.raises(ValueError, match="declared twice"):
        fields(Field("n", Integer()), Field("n", Integer()))


# -- the route ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("oa") / "tiny.gguf", "gemma3")
    return load(str(path), warmup=False, quiet=True)


def test_openapi_route_serves_the_document_behind_the_key(tiny):
    config = ServerConfig(model=str(tiny.path), ctx=256, max_seqs=4, block_size=4, api_keys=("k",))
    state = ServerState(config)
    app = create_app(state, load_in_background=False)
    state.attach(StubModel(tiny.tokenizer.vocab_size), tiny.tokenizer, tiny.chat, str(tiny.path))
    with TestClient(app, base_url="http://localhost") as c:
        assert c.get("/openapi.json").status_code == 401
        r = c.get("/openapi.json", headers={"authorization": "Bearer k"})
        assert r.status_code == 200 and r.json() == build_document(app.routes, r.json()["info"]["version"])
        # a document-forbidden body is a 400 naming the field, as the document's error shape says
        err = c.post("/v1/chat/completions", headers={"authorization": "Bearer k"},
                     json={"messages": [{"role": "user", "content": "x"}], "n": 9}).json()
        jsonschema.validate(err, r.json()["paths"]["/v1/chat/completions"]["post"]["responses"]["400"]
                            ["content"]["application/json"]["schema"])
        assert err["error"]["param"] == "n"
