"""DeepSpeed ZeRO-3's live-parameter and reuse-distance limits (``zero3_max_live_parameters``,
``zero3_max_reuse_distance``): ZeRO-3 keeps a gathered parameter that is used again within the reuse distance, and
prefetches only while the live limit leaves room (partitioned_param_coordinator.py).
Unset, DeepSpeed's defaults (1e9 each) keep up to 1e9 elements gathered; axolotl's zero3 configs set both to 0."""

from __future__ import annotations

from typing import Any

import pytest

from predictors.catalog import resolve_model
from predictors.errors import SpecError
from predictors.spec import parse_training_spec
from predictors.vram import predict_vram

BASE = {"model": "llama-3.1-8b", "method": "full", "precision": "bf16-mixed", "seq_len": 2048,
        "gradient_checkpointing": "full", "gpus": 8, "sharding": "zero3"}
LAYER = 218_112_000  # one Llama-3.1-8B block's parameters (attention 41.9M + MLP 176.2M)


def gathered(**extra: Any) -> tuple[float, tuple[str, ...]]:
    spec = parse_training_spec({**BASE, **extra})
    vram = predict_vram(spec, resolve_model(spec).architecture)
    return vram.breakdown_bytes["gathered_params"], vram.notes


def test_defaults_keep_a_billion_elements_and_prefetch() -> None:
    default, notes = gathered()
    assert default == pytest.approx(1e9 * 2 + 5e7 * 2)  # 16-bit parameters kept for reuse + the prefetch bucket
    assert not any("stage3_max_live_parameters" in n for n in notes)
    assert gathered(zero3_max_live_parameters="1e9", zero3_max_reuse_distance=1e9)[0] == default


def test_zero_limits_keep_only_the_blocks_being_computed() -> None:
    none_kept, notes = gathered(zero3_max_live_parameters=0, zero3_max_reuse_distance=0)
    assert none_kept == pytest.approx(2 * LAYER * 2, rel=1e-3)  # no reuse, no prefetch
    assert any("released after its module" in n and "no prefetching" in n for n in notes)
    # the reuse distance bounds what is kept; the live limit only what is prefetched beyond it (review, 2026-11-27:
    # partitioned_param_coordinator.py reads __max_n_available_params for the prefetch budget only)
    assert gathered(zero3_max_reuse_distance=0)[0] == pytest.approx(2 * LAYER * 2 + 5e7 * 2, rel=1e-3)
    assert gathered(zero3_max_reuse_distance=int(6e8))[0] == pytest.approx(6e8 * 2 + 5e7 * 2)
    assert gathered(zero3_max_live_parameters=0)[0] == pytest.approx(1e9 * 2)  # kept for reuse, no prefetch
    assert gathered(zero3_max_live_parameters=int(1e7))[0] == pytest.approx(1e9 * 2 + 1e7 * 2)
    # never less than the blocks being computed
    assert gathered(zero3_max_reuse_distance=int(1e8))[0] == pytest.approx(2 * LAYER * 2 + 5e7 * 2, rel=1e-3)


@pytest.mark.parametrize(("extra", "message"), [
    ({"sharding": "zero2", "zero3_max_live_parameters": 0}, "keeps gathered; sharding is zero2"),
    ({"sharding": "fsdp", "zero3_max_reuse_distance": 0}, "keeps gathered; sharding is fsdp"),
    ({"zero3_max_live_parameters": -1}, "zero3_max_live_parameters"),
    ({"zero3_max_live_parameters": "1e16"}, "at most 1e+15"),
    ({"zero3_max_reuse_distance": "lots"}, "zero3_max_reuse_distance"),
])
def test_bad_limits_are_errors_that_say_what_to_do(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_training_spec({**BASE, **extra})
    assert message in str(err.value)


def test_a_v1_spec_serializes_as_before() -> None:
    assert "zero3_max_live_parameters" not in parse_training_spec(BASE).model_dump(exclude_none=True)
