"""schemathesis over /openapi.json against a live `edged serve` of a tiny model: for bodies the
document allows and bodies it forbids, on every operation, no 5xx, every status, content type,
reply and stream event (SSE events; NDJSON lines, checked here) as the document says, and every
forbidden body refused with a 4xx. EDGED_SCHEMATHESIS_EXAMPLES sets the examples per operation."""

import json
import os

import jsonschema
import pytest

schemathesis = pytest.importorskip("schemathesis")  # the dev extra

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402 (schemathesis brings it)
from schemathesis import GenerationMode  # noqa: E402
from schemathesis import checks as core_checks  # noqa: E402
from schemathesis.specs.openapi import checks as openapi_checks  # noqa: E402

from edged.server.app import ROUTES  # noqa: E402
from edged.server.openapi import build_document  # noqa: E402
from tests.helpers.tiny_models import write_tiny_model  # noqa: E402
from tests.server.server_proc import running_server  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KEY = "schemathesis-key"
EXAMPLES = int(os.environ.get("EDGED_SCHEMATHESIS_EXAMPLES", "25"))
CHECKS = [core_checks.not_a_server_error, openapi_checks.status_code_conformance,
          openapi_checks.content_type_conformance, openapi_checks.response_schema_conformance,
          openapi_checks.negative_data_rejection]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("schemathesis")
    model = write_tiny_model(d / "tiny.gguf", "gemma3")
    # a small context bounds every generation; the key makes the document's security real
    with running_server([str(model), "--ctx", "128", "--max-seqs", "4", "--log-level", "warning"],
                        d / "serve.log", api_key=KEY) as proc:
        yield proc


@pytest.fixture(scope="module")
def document(server):
    import httpx

    return httpx.get(f"{server.url}/openapi.json", headers=server.headers, timeout=30).json()


@pytest.fixture(scope="module")
def live_schema(server):
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json", headers=server.headers)
    schema.config.update(base_url=server.url, headers=server.headers, request_timeout=120)
    return schema


def _ndjson_lines_conform(case, response, document) -> None:
    """Each line of an NDJSON reply against the document's line schema (schemathesis has no
    reader for application/x-ndjson)."""
    if not response.headers.get("content-type", [""])[0].startswith("application/x-ndjson"):
        return
    op = document["paths"][case.operation.path][case.method.lower()]
    line_schema = op["responses"][str(response.status_code)]["content"]["application/x-ndjson"]["schema"]
    lines = [x for x in response.content.decode().split("\n") if x]
    assert lines, "an NDJSON reply without a line"
    for line in lines:
        jsonschema.validate(json.loads(line), line_schema)


# the operations, from the same code the server documents itself with (no server needed to list);
# forbidden inputs only where there is a body to break (a path's string cannot be)
_PATHS = build_document(ROUTES, "0")["paths"]
CASES = [(m.upper(), p, mode) for p, item in _PATHS.items() for m, op in item.items()
         for mode in ("positive", "negative") if mode == "positive" or "requestBody" in op]


# positive cases that can only miss: a random model id, response id or catalogue name
NEVER_FOUND = {"/v1/models/{model_id}", "/v1/responses/{response_id}", "/api/pull"}


def _served_model(case, model: str):
    """A body the document allows, naming the served model: a random `model` would stop nearly
    every request at the 404 before validation and generation."""
    if isinstance(case.body, dict):
        for key in ("model", "name"):
            if isinstance(case.body.get(key), str):
                case.body[key] = model
    return case


@pytest.mark.parametrize("method,path,mode", CASES, ids=[" ".join(c) for c in CASES])
def test_replies_follow_the_document(live_schema, document, method, path, mode):
    operation = live_schema[path][method]
    strategy = operation.as_strategy(generation_mode=GenerationMode(mode))
    if mode == "positive":
        strategy = strategy.map(lambda c: _served_model(c, "tiny"))
    statuses = []

    @given(case=strategy)
    @settings(deadline=None, max_examples=EXAMPLES, suppress_health_check=list(HealthCheck),
              database=None, phases=[Phase.explicit, Phase.generate])
    def run(case):
        response = case.call_and_validate(checks=CHECKS)
        _ndjson_lines_conform(case, response, document)
        statuses.append(response.status_code)

    run()
    if mode == "positive" and path not in NEVER_FOUND:  # allowed bodies are served, not all refused
        assert any(200 <= s < 300 for s in statuses), sorted(set(statuses))
