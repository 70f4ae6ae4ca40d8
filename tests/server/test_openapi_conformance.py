"""schemathesis over the server's own OpenAPI document: generated requests for every route (valid and
deliberately invalid) never get a 5xx, and every response conforms to the document (status codes,
content types, headers, bodies). Bounded: a few dozen cases per route, completions capped at a few
tokens by `_cap_generation`, about a minute on stories260K.

The cases are the same on every run (derandomized), so that CI does not fail on whichever input a
random run happens to find; TRAM_FUZZ_EXPLORE=1 draws new ones, which is how the server's 5xx
defects were found (a billion samples on /generate; a schema integer beyond 64 bits).

The test drives schemathesis through its Python API, not its pytest plugin (`schema.parametrize`):
the plugin reaches into pytest's private attributes and broke on a pytest release. Each route gets
the Hypothesis test schemathesis itself builds for its CLI and its plugin (`create_test`), so the
cases are the ones the plugin drew: the document's examples, the coverage phase's boundary and
invalid values, and fuzzing in both generation modes."""

from __future__ import annotations

import os
import traceback
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.core.result import Err
from schemathesis.generation.hypothesis.builder import HypothesisTestConfig, HypothesisTestMode, create_test
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from server_utils import RemoteServer, shared_server

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
# The field that bounds each route's generation: schemathesis picks lengths up to 2**63, or none,
# which means the rest of the context (times n samples).
_LENGTH_FIELD = {
    "/v1/completions": "max_tokens",
    "/v1/chat/completions": "max_completion_tokens",
    "/v1/responses": "max_output_tokens",
    "/generate": "max_tokens",
}
_MAX_LENGTH = 8


@pytest.fixture(scope="module")
def server(stories_server: RemoteServer):
    yield from shared_server(stories_server)


@pytest.fixture(scope="module")
def api_schema(server: RemoteServer) -> schemathesis.BaseSchema:
    return schemathesis.openapi.from_url(server.url + "/openapi.json")


def _cap_generation(path: str, body: Any) -> None:
    field = _LENGTH_FIELD.get(path)
    if field is None or not isinstance(body, dict):
        return
    body.pop("max_tokens", None) if field != "max_tokens" else None
    value = body.get(field)
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > _MAX_LENGTH):
        body[field] = _MAX_LENGTH


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=os.environ.get("TRAM_FUZZ_EXPLORE", "") != "1",
)
def _call_and_validate(case: schemathesis.Case) -> None:
    _cap_generation(case.path, case.body)
    case.call_and_validate(checks=CHECKS, timeout=60)


def _route_test(schema: schemathesis.BaseSchema, operation: schemathesis.APIOperation) -> Any:
    """The Hypothesis test of one route, in all three of schemathesis' unit phases (examples,
    coverage, fuzzing), under `_call_and_validate`'s settings."""
    config = HypothesisTestConfig(project=schema.config, modes=list(HypothesisTestMode))
    return create_test(operation=operation, test_func=_call_and_validate, config=config)


def _describe(route: str, failure: BaseException) -> str:
    """A route's failure as text: a check's failure says all (the case, the response, a curl that
    reproduces it); anything else needs its traceback."""
    if isinstance(failure, FailureGroup):
        return f"{route}: {failure}"
    return f"{route}: " + "".join(traceback.format_exception(failure))


def test_the_server_conforms_to_its_openapi_document(api_schema: schemathesis.BaseSchema) -> None:
    # Every route runs even after one fails, and each failure names its route, as the plugin's
    # subtests did; a route the document defines wrongly fails too. They are reported as text, not
    # as an exception group: schemathesis' pytest plugin, still loaded, folds a group's exceptions
    # raised from one line into the first.
    failures: list[tuple[str, BaseException]] = []
    routes = 0
    for result in api_schema.get_all_operations():
        routes += 1
        if isinstance(result, Err):
            failures.append((result.err().label, result.err()))
            continue
        operation = result.ok()
        try:
            _route_test(api_schema, operation)()
        except (Exception, FailureGroup) as failure:  # FailureGroup, the checks' failures, is no Exception
            failures.append((operation.label, failure))
    assert routes, "the OpenAPI document defines no routes"
    if failures:
        report = "\n\n".join(_describe(route, failure) for route, failure in failures)
        pytest.fail(f"{len(failures)} of {routes} routes do not conform:\n\n{report}", pytrace=False)
