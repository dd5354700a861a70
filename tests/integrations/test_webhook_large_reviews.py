"""Reviews with bodies above LARGE_BODY_BYTES take the worker-thread path that waits for one token; they are
answered like small ones, and a malformed one is still HTTP 400."""

from __future__ import annotations

import json
from typing import Any

from starlette.testclient import TestClient

from scheduler.integrations.server import create_app
from scheduler.integrations.webhook import LARGE_BODY_BYTES, WebhookState, webhook_routes
from tests.integrations.manifests import admission_review, patch_ops, pod


def large_pod() -> dict[str, Any]:
    obj = pod()
    obj["spec"]["containers"][0]["env"] = [{"name": f"V{i}", "value": "x" * 100} for i in range(3_000)]
    assert len(json.dumps(admission_review(obj))) > LARGE_BODY_BYTES
    return obj


def test_a_large_review_is_answered_like_a_small_one() -> None:
    state = WebhookState()
    with TestClient(create_app(None, extra_routes=webhook_routes(state))) as client:
        large = client.post("/mutate", json=admission_review(large_pod()))
        small = client.post("/mutate", json=admission_review(pod()))
        assert large.status_code == small.status_code == 200
        def placement(reply: Any) -> list[dict[str, Any]]:  # the decision id hashes the object: it differs
            return [op for op in patch_ops(reply.json()) if not op["path"].endswith("decision-id")]

        assert placement(large) == placement(small) and len(placement(large)) >= 3
        malformed = client.post("/mutate", content=b"{" + b" " * LARGE_BODY_BYTES,
                                headers={"content-type": "application/json"})
        assert malformed.status_code == 400 and "not an AdmissionReview" in malformed.json()["error"]
