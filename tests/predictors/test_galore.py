"""GaLore (``galore_rank``): the targeted matrices keep states of the rank-r projected gradient and a projector, the
rest full states; checked by hand on the tiny model of test_vram.py."""

from __future__ import annotations

from typing import Any

import pytest

from predictors.errors import SpecError
from predictors.spec import parse_training_spec
from tests.predictors.test_vram import INTER, PARAMS, H, L, run

# the tiny model's block linears (out x in): q 64x64, k 32x64, v 32x64, o 64x64, gate/up 128x64, down 64x128
MATRICES = [(64, 64), (32, 64), (32, 64), (64, 64), (INTER, H), (INTER, H), (H, INTER)]


def _galore_bytes(r: int, per_element: float, projector_bytes: float) -> float:
    per_layer = sum(min(r, m, n) * max(m, n) * per_element + min(r, m, n) * min(m, n) * projector_bytes
                    for m, n in MATRICES)
    return L * per_layer


def test_projected_states_and_projectors_by_hand() -> None:
    r = 16
    p = run(precision="bf16-true", optimizer="adamw", galore_rank=r, seq_len=8)
    targeted = L * sum(m * n for m, n in MATRICES)
    # AdamW's two bf16 states on r x max(m, n), a bf16 projector r x min(m, n); the embedding, head and norms in full
    expected = _galore_bytes(r, 2 * 2, 2) + (PARAMS - targeted) * 2 * 2
    assert p.breakdown_bytes["optimizer_states"] == pytest.approx(expected, abs=1)
    # the projector update's SVD of the largest targeted gradient (gate/up/down: 128 x 64), 12 bytes per element
    assert p.breakdown_bytes["optimizer_step_workspace"] == INTER * H * 12
    eight = run(precision="bf16-true", optimizer="adamw-8bit", galore_rank=r, seq_len=8)
    per_8bit = 2 * (1 + 4 / 2048)
    assert eight.breakdown_bytes["optimizer_states"] == pytest.approx(
        _galore_bytes(r, per_8bit, 2) + (PARAMS - targeted) * per_8bit, abs=1)


def test_a_higher_rank_or_more_targets_never_needs_less() -> None:
    ranks = [run(precision="bf16-true", galore_rank=r, seq_len=8).peak_vram_bytes for r in (4, 8, 16, 32, 64)]
    assert ranks == sorted(ranks)
    attention = run(precision="bf16-true", galore_rank=8, galore_target_modules=["q_proj", "v_proj"], seq_len=8)
    every = run(precision="bf16-true", galore_rank=8, seq_len=8)
    assert attention.breakdown_bytes["optimizer_states"] > every.breakdown_bytes["optimizer_states"]
    full = run(precision="bf16-true", seq_len=8)
    assert every.breakdown_bytes["optimizer_states"] < full.breakdown_bytes["optimizer_states"]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"method": "lora", "galore_rank": 8}, "method is lora"),
        ({"optimizer": "lion", "galore_rank": 8}, "optimizer is lion"),
        ({"galore_target_modules": ["q_proj"]}, "galore_rank is not"),
        ({"galore_rank": 0}, "galore_rank"),
    ],
    ids=["lora", "lion", "targets-alone", "zero"],
)
def test_bad_galore_specs_are_named(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_training_spec({"model": "llama-2-7b", **fields})
    assert message in str(err.value)
