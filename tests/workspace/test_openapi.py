"""GET /v1/openapi.json describes every endpoint, and the API holds to it under schemathesis
(generated valid and invalid requests: no 5xx, documented statuses, content types and shapes;
invalid input rejected)."""

from __future__ import annotations

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import positive_data_acceptance

from tests.workspace.conftest import Workspace

EXAMPLES = 12  # per operation and generation mode

EXPECTED = {
    ("get", "/v1/space"),
    ("get", "/v1/space/list"),
    ("post", "/v1/space/create"),
    ("get", "/v1/table"),
    ("post", "/v1/table/create"),
    ("get", "/v1/table/list"),
    ("post", "/v1/table/init"),
    ("post", "/v1/table/columns/update"),
    ("post", "/v1/table/columns/validate"),
    ("post", "/v1/table/indexes/update"),
    ("post", "/v1/table/view/update"),
    ("get", "/v1/table/id_types"),
    ("get", "/v1/table/templates"),
    ("get", "/v1/table/instance/list"),
    ("get", "/v1/table/start_height/editable"),
    ("post", "/v1/table/start_height/update"),
    ("get", "/v1/table/stats/block"),
    ("get", "/v1/table/stats/daily"),
    ("get", "/v1/table/stats/minute"),
    ("post", "/v1/table/row/create"),
    ("post", "/v1/table/row/update"),
    ("post", "/v1/table/row/delete"),
    ("post", "/v1/table/row/get"),
    ("get", "/v1/table/row/list"),
    ("post", "/v1/table/row/query"),
    ("post", "/v1/chainstate/{chain_id}"),
}


def test_document_lists_every_endpoint(ws: Workspace) -> None:
    doc = requests.get(ws.base + "/v1/openapi.json", timeout=10).json()
    assert doc["openapi"].startswith("3.")
    have = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert have >= EXPECTED
    limit = doc["paths"]["/v1/space/list"]["get"]["parameters"]
    by_name = {p["name"]: p["schema"] for p in limit}
    assert by_name["limit"] == {"type": "integer", "minimum": 1, "maximum": 1000, "default": 100}
    assert "accessKey" in str(doc["paths"]["/v1/chainstate/{chain_id}"]["post"]["security"])
    assert "accessKey" not in str(doc["paths"]["/v1/space"]["get"]["security"])


def fuzz_operation(op: schemathesis.APIOperation, mode: GenerationMode, ws: Workspace) -> None:
    @given(case=op.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None
    )
    def run(case: schemathesis.Case) -> None:
        # Valid requests may still name missing resources (404): positive acceptance is off.
        case.call_and_validate(
            base_url=ws.base,
            headers=dict(ws.alice.headers),
            excluded_checks=[positive_data_acceptance],
        )

    run()


@pytest.mark.parametrize("mode", list(GenerationMode), ids=lambda m: m.value)
def test_api_conforms(ws: Workspace, mode: GenerationMode) -> None:
    a = ws.alice  # a Space and a table so generated ids sometimes hit real resources
    if a.get("/v1/space", id="fuzz")[1]["data"] is None:
        a.ok("POST", "/v1/space/create", {"id": "fuzz", "visibility": "public"})
        a.ok("POST", "/v1/table/create", {"space": "fuzz", "name": "t", "table_type": "normal"})
        a.ok("POST", "/v1/table/init", {"id": "fuzz.t"})
    schema = schemathesis.openapi.from_url(ws.base + "/v1/openapi.json")
    failures = []
    for result in schema.get_all_operations():
        op = result.ok()
        if (op.method.lower(), op.path) not in EXPECTED:
            continue  # other modules' endpoints (functions, notebooks) are tested there
        try:
            fuzz_operation(op, mode, ws)
        except Exception as exc:  # collect all operations' failures, then report
            failures.append(f"{op.method.upper()} {op.path}: {exc}")
    assert not failures, "\n\n".join(failures)
