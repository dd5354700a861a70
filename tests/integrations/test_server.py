from __future__ import annotations

import json
import logging
import sqlite3

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from scheduler.integrations.ledger import LedgerError, SqliteLedger
from scheduler.integrations.metrics import MAX_POOL_LABELS
from scheduler.integrations.records import STORED, DecisionIn
from scheduler.integrations.server import JsonFormatter, ServerSettings, create_app, store_decision
from tests.integrations.payloads import GIB, decision_payload


def actual_body(decision_id: str, peak_gib: float, **extra):  # type: ignore[no-untyped-def]
    return {"decision_id": decision_id, "peak_vram_bytes": int(peak_gib * GIB), "runtime_seconds": 3000.0,
            "oom": False, "source": "reporter"} | extra


def samples(client: TestClient) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = client.get("/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(client: TestClient, name: str, **labels: str) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples(client).items() if n == name and want <= set(ls))


@pytest.fixture
def client(ledger_path):  # type: ignore[no-untyped-def]
    with TestClient(create_app(SqliteLedger(ledger_path))) as c:
        yield c


def test_health_ready_metrics(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    assert client.get("/readyz").json() == {"status": "ready"}
    text = client.get("/metrics").text
    assert "vramfit_build_info{" in text
    assert 'vramfit_ledger_records{table="decisions"} 0.0' in text


def test_decision_then_actual_scores_the_prediction(client):
    body = decision_payload("d1")
    first = client.post("/v1/decisions", json=body)
    assert first.status_code == 201 and first.json()["created"]
    assert client.post("/v1/decisions", json=body).status_code == 200
    predicted = body["peak_vram_bytes"]
    r = client.post("/v1/actuals", json=actual_body("d1", predicted * 1.1 / GIB))
    assert r.status_code == 202
    assert r.json()["decision_id"] == "d1" and r.json()["actual"]["source"] == "reporter"
    assert value(client, "vramfit_placements_total", pool="a100", outcome="placed") == 1
    assert value(client, "vramfit_predicted_cost_usd_total", pool="a100") == pytest.approx(4.1)
    assert value(client, "vramfit_vram_prediction_ratio_count", pool="a100", method="lora") == 1
    assert value(client, "vramfit_vram_prediction_ratio_sum") == pytest.approx(1.1, rel=1e-6)
    assert value(client, "vramfit_vram_under_predictions_total", bound="point") == 1
    assert value(client, "vramfit_vram_under_predictions_total", bound="upper") == 0
    assert value(client, "vramfit_runtime_prediction_ratio_sum") == pytest.approx(3000 / 3600)
    # A retried post is stored once and scored once.
    again = client.post("/v1/actuals", json=actual_body("d1", predicted * 1.1 / GIB))
    assert again.status_code == 202 and not again.json()["created"]
    assert value(client, "vramfit_vram_prediction_ratio_count") == 1
    assert value(client, "vramfit_actuals_received_total", source="reporter") == 2
    assert value(client, "vramfit_ledger_records", table="actuals") == 1

    joined = client.get("/v1/decisions/d1").json()
    assert joined["actual"]["peak_vram_bytes"] == int(predicted * 1.1)
    assert client.get("/v1/decisions/nope").status_code == 404


def test_outcome_series_are_exported_at_zero_from_the_placement_on(client):
    # A series that first appears at 1 is invisible to increase(): the first OOM would raise no alert.
    assert client.post("/v1/decisions", json=decision_payload("z1")).status_code == 201
    series = samples(client)
    ooms = [ls for (n, ls) in series if n == "vramfit_ooms_total"]
    assert ooms == [(("method", "lora"), ("pool", "a100"))] and value(client, "vramfit_ooms_total") == 0
    under = {dict(ls)["source"] + "/" + dict(ls)["bound"] for (n, ls) in series
             if n == "vramfit_vram_under_predictions_total"}
    assert under == {f"{s}/{b}" for s in ("reporter", "dcgm", "kubernetes", "manual") for b in ("point", "upper")}
    assert value(client, "vramfit_vram_prediction_ratio_count", pool="a100", method="lora") == 0


def test_actual_before_decision_is_scored_when_the_decision_arrives(client):
    body = decision_payload("late")
    r = client.post("/v1/actuals", json=actual_body("late", body["peak_vram_upper_bytes"] * 1.2 / GIB, oom=True))
    assert r.status_code == 202 and r.json()["decision_id"] is None
    assert value(client, "vramfit_vram_prediction_ratio_count") == 0
    assert client.post("/v1/decisions", json=body).json()["joined_actuals"] == 1
    assert value(client, "vramfit_vram_prediction_ratio_count") == 1
    assert value(client, "vramfit_vram_under_predictions_total", bound="upper") == 1
    assert value(client, "vramfit_ooms_total", pool="a100") == 1


def test_no_job_id_in_any_label(client):
    for i in range(3):
        client.post("/v1/decisions", json=decision_payload(f"job-{i}-uid"))
        client.post("/v1/actuals", json=actual_body(f"job-{i}-uid", 10))
    assert "job-" not in client.get("/metrics").text


def test_pool_and_method_labels_stay_bounded_whatever_clients_post(client):
    # Every new pool name would be a new series for the process's life; the first 64 keep their own.
    for i in range(MAX_POOL_LABELS + 16):
        client.post("/v1/decisions", json=decision_payload(f"d{i}", pool=f"pool-{i}", method="lora"))
    client.post("/v1/decisions", json=decision_payload("odd", pool="pool-0", method="sparse-magic"))
    placed = {dict(ls)["pool"]: v for (n, ls), v in samples(client).items() if n == "vramfit_placements_total"}
    assert len(placed) == MAX_POOL_LABELS + 1 and placed["other"] == 16 and placed["pool-0"] == 2
    methods = {dict(ls)["method"] for (n, ls), _ in samples(client).items()
               if n == "vramfit_predicted_peak_vram_bytes_count"}
    assert methods == {"lora", "other"}


@pytest.mark.parametrize(
    ("body", "status", "needles"),
    [
        (b"{not json", 400, ["not valid JSON"]),
        (b"[1, 2]", 422, ["JSON object", "list"]),
        (json.dumps({"decision_id": "d", "runtime_seconds": 1, "oom": False, "source": "reporter"}).encode(), 422,
         ["peak_vram_bytes", "Field required"]),
        (json.dumps(actual_body("d", 1, peak_vram_bytes="lots")).encode(), 422, ["peak_vram_bytes"]),
        (json.dumps(actual_body("d", 1, runtime_seconds=-5)).encode(), 422, ["runtime_seconds"]),
        (json.dumps(actual_body("d", 1, peak_vram_gib=3)).encode(), 422, ["peak_vram_gib", "Extra inputs"]),
        (json.dumps(actual_body("d", 1, source="guess")).encode(), 422, ["source"]),
        (b"\xff\xfe", 400, ["not valid JSON"]),
        (b"", 400, ["not valid JSON"]),
        (b"[" * 5000 + b"]" * 5000, 400, ["nested too deeply"]),
        (b'{"peak_vram_bytes": ' + b"9" * 5000 + b"}", 400, ["not valid JSON", "4300 digits"]),  # was a 500
    ],
)
def test_bad_actuals_are_4xx_naming_the_field(client, body, status, needles):
    r = client.post("/v1/actuals", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    for needle in needles:
        assert needle in r.json()["error"]


def test_bad_decision_lists_every_problem(client):
    body = decision_payload("d1") | {"peak_vram_bytes": -1, "pool_name": "x"}
    r = client.post("/v1/decisions", json=body)
    assert r.status_code == 422
    fields = {p["field"] for p in r.json()["problems"]}
    assert fields == {"peak_vram_bytes", "pool_name"}


def test_a_key_given_twice_is_refused_not_the_last_one_kept(client):
    """Python's json keeps the last of a key given twice: an actual naming decision_id twice was stored for the
    second one. Now the body is refused naming the key."""
    body = '{"decision_id": "a", "decision_id": "b", "peak_vram_bytes": null, "runtime_seconds": 60, "oom": false,' \
           ' "source": "reporter"}'
    r = client.post("/v1/actuals", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "'decision_id' twice" in r.json()["error"]


def test_too_large_body_is_413(ledger_path):
    app = create_app(SqliteLedger(ledger_path), ServerSettings(max_body_bytes=100))
    with TestClient(app) as c:
        r = c.post("/v1/decisions", json=decision_payload("d1"))
    assert r.status_code == 413 and "larger than 100 bytes" in r.json()["error"]


def test_a_chunked_body_is_stopped_at_the_cap_not_read_whole(ledger_path):
    def chunks():  # no Content-Length: the server only learns the size while the body streams in
        for _ in range(10_000):
            yield b" " * 1024

    app = create_app(SqliteLedger(ledger_path), ServerSettings(max_body_bytes=4096))
    with TestClient(app) as c:
        r = c.post("/v1/actuals", content=chunks(), headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "larger than 4096 bytes" in r.json()["error"]


def test_bearer_token(ledger_path):
    app = create_app(SqliteLedger(ledger_path), ServerSettings(token="s3cret"))
    with TestClient(app) as c:
        body = actual_body("d1", 10)
        assert c.post("/v1/actuals", json=body).status_code == 401
        wrong = c.post("/v1/actuals", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        assert c.post("/v1/actuals", json=body, headers={"Authorization": "Bearer s3cret"}).status_code == 202
        assert c.get("/healthz").status_code == 200 and c.get("/metrics").status_code == 200


def test_unknown_route_and_method_are_json(client):
    assert client.get("/nope").status_code == 404
    r = client.get("/v1/actuals")
    assert r.status_code == 405 and "error" in r.json()


class BrokenLedger(SqliteLedger):
    def record_actual(self, actual):  # type: ignore[no-untyped-def]
        raise LedgerError("disk I/O error")

    def ping(self) -> None:
        raise LedgerError("disk I/O error")


def test_ledger_failure_is_503_so_clients_retry(ledger_path):
    with TestClient(create_app(BrokenLedger(ledger_path))) as c:
        r = c.post("/v1/actuals", json=actual_body("d1", 10))
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert c.get("/readyz").status_code == 503


def test_extra_routes_extend_the_server(ledger_path):
    async def mutate(request: Request) -> JSONResponse:
        state = request.app.state
        with state.metrics.time_admission("mutate") as obs:
            decision = DecisionIn.model_validate(decision_payload("from-webhook"))
            store_decision(state.ledger, state.metrics, decision)
            obs["outcome"] = "allowed"
        return JSONResponse({"allowed": True})

    app = create_app(SqliteLedger(ledger_path), extra_routes=[Route("/mutate", mutate, methods=["POST"])])
    with TestClient(app) as c:
        assert c.post("/mutate", json={}).json() == {"allowed": True}
        assert c.get("/v1/decisions/from-webhook").status_code == 200
        assert value(c, "vramfit_admission_request_duration_seconds_count", operation="mutate",
                     outcome="allowed") == 1


def test_logs_are_json_lines(client, caplog):
    caplog.set_level(logging.INFO, logger="vramfit.server")
    client.post("/v1/actuals", json=actual_body("d1", 10))
    records = [r for r in caplog.records if r.getMessage() == "request"]
    line = json.loads(JsonFormatter().format(records[-1]))
    assert line["path"] == "/v1/actuals" and line["status"] == 202 and line["level"] == "info"
    assert "duration_seconds" in line


def test_a_job_that_stopped_early_scores_no_runtime(client):
    """An OOM or a failed job ran for less than its work: its memory is scored, its runtime is not."""
    for name, extra in (("oom", {"oom": True, "exit_reason": "CudaOOM"}), ("failed", {"exit_reason": "Error"}),
                        ("done", {"exit_reason": "Completed"})):
        client.post("/v1/decisions", json=decision_payload(name))
        assert client.post("/v1/actuals", json=actual_body(name, 5, **extra)).status_code == 202
    assert value(client, "vramfit_vram_prediction_ratio_count") == 3
    assert value(client, "vramfit_runtime_prediction_ratio_count") == 1


def test_a_job_predicted_at_microseconds_is_recorded_but_its_ratio_not_observed(client):
    """`train_tokens: 1` is a valid spec predicted at a few microseconds: its decision is stored; the
    measured/predicted runtime ratio (about 1e9) would swamp the histogram's `_sum` and is left out."""
    assert client.post("/v1/decisions", json=decision_payload("tiny", runtime_seconds=2.3e-6,
                                                      predicted_runtime_seconds=2.3e-6)).status_code == 201
    assert client.post("/v1/actuals", json=actual_body("tiny", 5, exit_reason="Completed")).status_code == 202
    assert client.get("/v1/decisions/tiny").status_code == 200
    assert value(client, "vramfit_runtime_prediction_ratio_count") == 0
    assert value(client, "vramfit_vram_prediction_ratio_count") == 1


@pytest.mark.parametrize(("field", "bad"), [("predicted_cost_usd", 1e308), ("predicted_runtime_seconds", 1e308),
                                            ("runtime_upper_seconds", 1e12)])
def test_implausible_predictions_are_422_naming_the_field(client, field, bad):
    r = client.post("/v1/decisions", json=decision_payload("absurd") | {field: bad})
    assert r.status_code == 422, r.text
    assert [p["field"] for p in r.json()["problems"]] == [field]
    assert f"`{field}` must be at" in r.json()["error"]
    assert value(client, "vramfit_placements_total") == 0 and client.get("/v1/decisions/absurd").status_code == 404


def test_a_rotated_token_file_is_followed_without_a_restart(ledger_path, tmp_path):
    """A Kubernetes Secret is updated by swapping a symlink: the collector follows the new token, and a broken new
    content keeps the last good one (logged)."""
    from scheduler.integrations.token_file import TokenFile

    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "v1").write_text("first-token\n")
    link = secret / "token"
    link.symlink_to(secret / "v1")
    token = TokenFile(link, "first-token", check_seconds=0.0)
    app = create_app(SqliteLedger(ledger_path), ServerSettings(token=token))

    def post(given: str) -> int:
        return c.post("/v1/actuals", json=actual_body("d1", 10), headers={"Authorization": f"Bearer {given}"}
                      ).status_code

    with TestClient(app) as c:
        assert post("first-token") == 202
        (secret / "v2").write_text("second-token\n")
        (secret / "next").symlink_to(secret / "v2")
        (secret / "next").replace(link)  # the atomic swap the kubelet does
        assert post("second-token") == 202 and post("first-token") == 401
        (secret / "v3").write_text("two\nlines\n")
        (secret / "next").symlink_to(secret / "v3")
        (secret / "next").replace(link)
        assert post("second-token") == 202  # the last good token is kept



def _nested(levels: int) -> object:
    """``levels`` lists and mappings, one inside the other."""
    value: object = 1
    for i in range(levels):
        value = [value] if i % 2 else {"a": value}
    return value


def _with(body: dict[str, object], marker: str, raw: str) -> bytes:
    """``body`` as JSON with the string ``marker`` written as ``raw`` (a JSON escape json.dumps would not write)."""
    return json.dumps(body).replace(json.dumps(marker), raw).encode()


@pytest.mark.parametrize(("route", "body", "field", "needle"), [
    # before: a 500 (model_dump_json raised UnicodeEncodeError) for notes and features
    ("/v1/decisions", _with(decision_payload("u1", notes=["fine", "XX"]), "XX", '"\\ud800"'), "notes",
     "`notes` has a string at `notes[1]` that is not valid Unicode: it holds a lone UTF-16 surrogate (U+D800)"),
    ("/v1/decisions", _with(decision_payload("u1") | {"features": {"model": "XX"}}, "XX", '"\\udfff"'), "features",
     "`features` has a string at `features.model` that is not valid Unicode"),
    ("/v1/decisions", _with(decision_payload("u1") | {"features": {"XX": 1}}, "XX", '"\\udc00"'), "features",
     "`features` has a key at `features.\\udc00` that is not valid Unicode"),
    # before: stored, the key silently turned into U+FFFD
    ("/v1/decisions", _with(decision_payload("u1", breakdown_bytes={"XX": 1}), "XX", '"\\ud800"'), "breakdown_bytes",
     "`breakdown_bytes` has a key at `breakdown_bytes.\\ud800` that is not valid Unicode"),
    ("/v1/decisions", _with(decision_payload("u1") | {"XX": 1}, "XX", '"\\ud800"'), "(body)",
     "has a key at `(body).\\ud800` that is not valid Unicode"),
    ("/v1/actuals", _with(actual_body("u1", 10, exit_reason="XX"), "XX", '"\\ud800"'), "exit_reason",
     "`exit_reason` is not valid Unicode"),
])
def test_a_string_that_is_not_unicode_is_422_naming_where_and_nothing_is_stored(client, route, body, field, needle):
    r = client.post(route, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert [p["field"] for p in r.json()["problems"]] == [field]
    assert needle in r.json()["error"]
    assert client.get("/readyz").status_code == 200
    assert value(client, "vramfit_ledger_records", table="decisions") == 0
    assert value(client, "vramfit_ledger_records", table="actuals") == 0
    assert client.post("/v1/decisions", json=decision_payload("u1")).status_code == 201  # the server keeps working


@pytest.mark.parametrize(("features", "needle"), [
    ({"x": _nested(400)}, "`features` is nested deeper than 32 levels"),  # before: a 500
    ({"x": _nested(250)}, "`features` is nested deeper than 32 levels"),  # before: stored, then never read back
    ({"x": _nested(32)}, "`features` is nested deeper than 32 levels"),  # 33 levels with features itself
    ({"x": [1.0, float("nan")]}, "`features` has a number that is not finite at `features.x[1]` (nan)"),  # was null
    ({"x": float("inf")}, "`features` has a number that is not finite at `features.x` (inf)"),
    ({f"k{i}": i for i in range(6000)}, "`features` has more than 10000 values"),
    ({"x": "y" * 70_000}, "`features` has a string at `features.x` that is longer than 65536 characters"),
])
def test_features_that_could_not_be_read_back_are_422(client, features, needle):
    body = json.dumps(decision_payload("deep") | {"features": features})  # NaN and Infinity as Python writes them
    r = client.post("/v1/decisions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    assert needle in r.json()["error"] and [p["field"] for p in r.json()["problems"]] == ["features"]
    assert client.get("/v1/decisions/deep").status_code == 404


def test_features_32_levels_deep_are_kept_and_33_are_422(client):
    too_deep = client.post("/v1/decisions", json=decision_payload("d32") | {"features": {"x": {"y": _nested(31)}}})
    assert too_deep.status_code == 422 and "nested deeper than 32 levels" in too_deep.json()["error"]
    features = {"x": _nested(31)}  # 32 levels with features itself
    assert client.post("/v1/decisions", json=decision_payload("d32") | {"features": features}).status_code == 201
    r = client.post("/v1/actuals", json=actual_body("d32", 10))
    assert r.status_code == 202 and r.json()["decision_id"] == "d32"
    joined = client.get("/v1/decisions/d32").json()
    assert joined["decision"]["features"] == features and joined["actual"]["peak_vram_bytes"] == 10 * GIB


@pytest.mark.parametrize("runtime_seconds", [1e-320, 5e-4])
def test_a_measured_runtime_under_a_millisecond_is_422(client, runtime_seconds):
    """1e-320 s was stored; `vramfit report` then printed inf% (and `Infinity`, invalid JSON, with --format json)."""
    r = client.post("/v1/actuals", json=actual_body("d1", 10, runtime_seconds=runtime_seconds))
    assert r.status_code == 422, r.text
    assert "`runtime_seconds` must be 0" in r.json()["error"] and "at least 0.001 seconds (1 ms)" in r.json()["error"]
    assert client.post("/v1/actuals", json=actual_body("d1", 10, runtime_seconds=0.0)).status_code == 202


def test_an_unreadable_stored_decision_loses_no_actual(client, ledger_path):
    """Features 250 levels deep were accepted before their bound and then could never be read back: the job's
    actual was answered 500 and lost, and GET /v1/decisions/{id} was a 500. Now the actual is stored (unjoined) and
    the decision is left out of reads, with a warning naming it."""
    stored_before = DecisionIn.model_validate(decision_payload("old") | {"features": {"x": _nested(250)}},
                                              context=STORED)  # what the older vramfit stored
    SqliteLedger(ledger_path).record_decision(stored_before)
    r = client.post("/v1/actuals", json=actual_body("old", 10))
    assert r.status_code == 202, r.text
    assert r.json()["decision_id"] is None and r.json()["actual"]["peak_vram_bytes"] == 10 * GIB
    assert value(client, "vramfit_ledger_records", table="actuals") == 1
    assert client.get("/v1/decisions/old").status_code == 404
    assert client.post("/v1/decisions", json=decision_payload("new")).status_code == 201
    assert client.post("/v1/actuals", json=actual_body("new", 10)).json()["decision_id"] == "new"


@pytest.mark.parametrize("column", ["decided_at", "recorded_at"])
def test_a_decision_with_a_damaged_timestamp_loses_no_actual_and_a_repost_repairs_it(client, ledger_path, column):
    assert client.post("/v1/decisions", json=decision_payload("dmg")).status_code == 201
    with sqlite3.connect(ledger_path) as db:
        db.execute(f"UPDATE decisions SET {column} = 1e17")  # before: OSError (Value too large), a 500
    db.close()
    r = client.post("/v1/actuals", json=actual_body("dmg", 10))
    assert r.status_code == 202 and r.json()["decision_id"] is None
    assert client.get("/v1/decisions/dmg").status_code == 404
    assert client.post("/v1/decisions", json=decision_payload("dmg")).status_code == 200  # the same decision again
    assert client.get("/v1/decisions/dmg").json()["actual"]["peak_vram_bytes"] == 10 * GIB


def test_a_client_gone_mid_body_is_its_request_not_a_server_error():
    """A client that closed its connection half-way through the body was logged as a 500 with a traceback."""
    import anyio
    from starlette.exceptions import HTTPException
    from starlette.requests import ClientDisconnect

    from scheduler.integrations.http_body import read_body

    class Gone:
        def __init__(self) -> None:
            self.headers: dict[str, str] = {}

        async def stream(self):  # type: ignore[no-untyped-def]
            yield b'{"decision_id": '
            raise ClientDisconnect()

    with pytest.raises(HTTPException) as info:
        anyio.run(read_body, Gone(), 1000)
    assert info.value.status_code == 400 and "client disconnected after 16 bytes" in info.value.detail
