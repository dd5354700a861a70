"""What a client may post is bounded so that every stored record can be read, scored and exported again."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from scheduler.integrations.records import ActualIn, DecisionIn, merge_same_source


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
