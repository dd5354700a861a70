"""What a client may post is bounded so that every stored record can be read, scored and exported again."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from scheduler.integrations.records import STORED, ActualIn, DecisionIn, merge_same_source, ran_to_end


@pytest.mark.parametrize("fields", [
    {"decided_at": "0001-01-01T00:00:00+14:00"},  # stored before, then no read of it had a UTC form
    {"decided_at": "1900-01-01T00:00:00Z"},
    {"peak_vram_bytes": 10**400},  # stored before, then the metrics overflowed and `report` crashed
    {"breakdown_bytes": {"weights": 10**30}},
    {"gpus": 10**12},
])
def test_decisions_out_of_range_are_refused(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        DecisionIn.model_validate({"decision_id": "d1", **fields})


def actual(peak: int | None, **fields: object) -> ActualIn:
    return ActualIn.model_validate({"decision_id": "d1", "peak_vram_bytes": peak, "runtime_seconds": 10.0,
                                    "oom": False, "source": "reporter", **fields})


def test_actuals_out_of_range_are_refused() -> None:
    for fields in ({"finished_at": "0001-01-01T00:00:00+14:00"}, {"exit_code": 10**20}):
        with pytest.raises(ValidationError):
            actual(1, **fields)
    with pytest.raises(ValidationError):
        actual(10**400)


def test_repeated_reports_of_one_source_keep_the_largest_peak() -> None:
    # two ranks of one job: the job's peak is the most loaded GPU's, whichever reports last
    merged = merge_same_source(actual(500, peak_reserved_bytes=520), actual(400, peak_reserved_bytes=410,
                                                                            runtime_seconds=20.0))
    assert (merged.peak_vram_bytes, merged.peak_reserved_bytes, merged.runtime_seconds) == (500, 520, 20.0)
    assert merge_same_source(actual(None), actual(300)).peak_vram_bytes == 300


@pytest.mark.parametrize(("fields", "needle"), [
    ({"predicted_cost_usd": 1e308}, "at most 1e+12 USD"),  # took the cost counter to +Inf before
    ({"predicted_cost_usd": 2e12}, "at most 1e+12 USD"),
    ({"runtime_upper_seconds": 1e11}, "at most 3.15576e+10 seconds (1000 years)"),
    ({"predicted_runtime_seconds": 1e308}, "at most 3.15576e+10 seconds"),
])
def test_implausible_predicted_costs_and_runtimes_are_refused_naming_the_field(
        fields: dict[str, object], needle: str) -> None:
    with pytest.raises(ValidationError) as raised:
        DecisionIn.model_validate({"decision_id": "d1", **fields})
    (error,) = raised.value.errors()
    assert error["loc"] == (next(iter(fields)),) and needle in error["msg"]


def test_a_tiny_predicted_runtime_is_a_valid_prediction() -> None:
    # `train_tokens: 1` is predicted at a few microseconds; the metrics, not the record, leave its ratio out
    assert DecisionIn.model_validate({"decision_id": "d1", "runtime_seconds": 2.3e-6}).runtime_seconds == 2.3e-6


def test_real_predictions_are_within_the_bounds() -> None:
    # Llama-3.1-8B full fine-tuning on 15e12 tokens (Llama 3's corpus) on 8 H100s: 6 years, upper bound 11
    decision = DecisionIn.model_validate({"decision_id": "d1", "runtime_seconds": 1.99e8,
                                          "runtime_upper_seconds": 3.44e8, "predicted_cost_usd": 5.6e7})
    assert decision.runtime_upper_seconds == 3.44e8


def test_a_measured_runtime_is_0_or_between_a_millisecond_and_1000_years() -> None:
    assert actual(1, runtime_seconds=0.0).runtime_seconds == 0.0  # Kubernetes times are whole seconds
    assert actual(1, runtime_seconds=0.001).runtime_seconds == 0.001
    with pytest.raises(ValidationError, match="runtime_seconds"):
        actual(1, runtime_seconds=1e308)
    for tiny in (1e-320, 9.99e-4):  # 1e-320 s was stored, then the report's runtime error was infinite
        with pytest.raises(ValidationError) as raised:
            actual(1, runtime_seconds=tiny)
        (error,) = raised.value.errors()
        assert error["loc"] == ("runtime_seconds",) and "or at least 0.001 seconds (1 ms)" in error["msg"]


def test_a_runtime_stored_before_its_lower_bound_reads_back_and_is_no_whole_jobs() -> None:
    stored = ActualIn.model_validate({"decision_id": "d1", "peak_vram_bytes": 1, "runtime_seconds": 1e-320,
                                      "oom": False, "source": "reporter"}, context=STORED)
    assert stored.runtime_seconds == 1e-320
    assert not ran_to_end(stored.oom, stored.exit_reason, stored.runtime_seconds)
    assert ran_to_end(False, "Completed", 0.001)


def _nested(levels: int) -> object:
    value: object = "leaf"
    for _ in range(levels):
        value = {"k": [value]}
    return value


@pytest.mark.parametrize(("fields", "field", "needle"), [
    ({"notes": ["ok", "\ud800"]}, "notes", "has a string at `notes[1]` that is not valid Unicode"),
    ({"features": {"model": "\udfff"}}, "features", "has a string at `features.model` that is not valid Unicode"),
    ({"features": {"\ud800": 1}}, "features", "has a key at `features.\\ud800` that is not valid Unicode"),
    ({"breakdown_bytes": {"\udbff": 1}}, "breakdown_bytes", "has a key at `breakdown_bytes.\\udbff` that is"),
    ({"pool": "a\ud800"}, "pool", "is not valid Unicode: it holds a lone UTF-16 surrogate (U+D800)"),
    ({"features": {"x": _nested(16)}}, "features", "is nested deeper than 32 levels"),  # 33 with features itself
    ({"features": {"x": [0.5, float("nan")]}}, "features", "has a number that is not finite at `features.x[1]`"),
    ({"features": {"x": {"y": -float("inf")}}}, "features", "has a number that is not finite at `features.x.y`"),
    ({"notes": ["n"] * 10_000}, "notes", "has more than 10000 values"),
    ({"features": {"x": "y" * 65_537}}, "features", "has a string at `features.x` that is longer than 65536"),
])
def test_free_form_values_that_cannot_be_stored_and_read_back_are_refused(
        fields: dict[str, object], field: str, needle: str) -> None:
    """Before: a lone surrogate or 400 levels of nesting made the ledger's write raise (a 500); 250 levels were
    written and never read back; NaN was stored as null; a surrogate key of breakdown_bytes became U+FFFD."""
    with pytest.raises(ValidationError) as raised:
        DecisionIn.model_validate({"decision_id": "d1", **fields})
    (error,) = raised.value.errors()
    assert error["loc"] == (field,) and needle in error["msg"], error


def test_free_form_values_within_the_bounds_are_kept() -> None:
    features = {"x": [_nested(15)], "emoji": "\U0001f600", "n": [1.5, 2, None, True]}  # 32 levels with features
    decision = DecisionIn.model_validate({"decision_id": "d1", "features": features, "notes": ["n"] * 9_999})
    assert DecisionIn.model_validate_json(decision.model_dump_json(), context=STORED).features == features
    with pytest.raises(ValidationError, match="nested deeper than 32 levels"):  # one level more
        DecisionIn.model_validate({"decision_id": "d1", "features": {"y": features}})


def test_records_stored_before_the_bounds_still_read_back() -> None:
    stored = DecisionIn.model_validate_json('{"decision_id": "d1", "predicted_cost_usd": 1e308, '
                                            '"runtime_seconds": 1e-300}', context=STORED)
    assert (stored.predicted_cost_usd, stored.runtime_seconds) == (1e308, 1e-300)
    old = ActualIn.model_validate({"decision_id": "d1", "peak_vram_bytes": 1, "runtime_seconds": 1e308,
                                   "oom": False, "source": "reporter"}, context=STORED)
    merged = merge_same_source(old, actual(2, runtime_seconds=None))  # a new report of that job is still stored
    assert (merged.peak_vram_bytes, merged.runtime_seconds) == (2, 1e308)
