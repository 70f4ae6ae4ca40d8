"""schemathesis over the server's own OpenAPI document: generated requests for every route (valid and
deliberately invalid) never get a 5xx, and every response conforms to the document (status codes,
content types, headers, bodies). Bounded: a few dozen cases per route, completions capped at a few
tokens by `_cap_generation`, about a minute on stories260K.

The cases are the same on every run (derandomized), so that CI does not fail on whichever input a
random run happens to find; TRAM_FUZZ_EXPLORE=1 draws new ones, which is how the server's 5xx
defects were found (a billion samples on /generate; a schema integer beyond 64 bits)."""
from __future__ import annotations

import os
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance, negative_data_rejection, response_headers_conformance, response_schema_conformance,
    status_code_conformance,
)

from conftest import STORIES
from server_utils import RemoteServer, module_server

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance, negative_data_rejection]
# The field that bounds each route's generation: schemathesis picks lengths up to 2**63, or none,
# which means the rest of the context (times n samples).
_LENGTH_FIELD = {"/v1/completions": "max_tokens", "/v1/chat/completions": "max_completion_tokens",
                 "/v1/responses": "max_output_tokens", "/generate": "max_tokens"}
_MAX_LENGTH = 8


@pytest.fixture(scope="module")
def server():
    yield from module_server(STORIES)


@pytest.fixture(scope="module")
def api_schema(server: RemoteServer) -> Any:
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


def _cap_generation(path: str, body: Any) -> None:
    field = _LENGTH_FIELD.get(path)
    if field is None or not isinstance(body, dict):
        return
    body.pop("max_tokens", None) if field != "max_tokens" else None
    value = body.get(field)
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > _MAX_LENGTH):
        body[field] = _MAX_LENGTH


@schema.parametrize()
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck),
          derandomize=os.environ.get("TRAM_FUZZ_EXPLORE", "") != "1")
def test_the_server_conforms_to_its_openapi_document(case: schemathesis.Case) -> None:
    _cap_generation(case.path, case.body)
    case.call_and_validate(checks=CHECKS, timeout=60)
