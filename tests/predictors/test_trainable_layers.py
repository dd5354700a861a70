"""Freeze tuning (``trainable_layers``): only some transformer blocks train. Their parameters get gradients and
optimizer states (and, under mixed precision, fp32 weights); the embeddings, the other blocks and the output head
stay frozen in the compute dtype; backward runs from the loss down to the lowest trained block only."""

from __future__ import annotations

from typing import Any

import pytest

from predictors.catalog import resolve_model
from predictors.errors import SpecError
from predictors.hardware import lookup_gpu
from predictors.runtime import _attention_forward_flops, flops_per_token, predict_runtime
from predictors.spec import TrainingSpec, parse_training_spec
from predictors.vram import trained_blocks
from tests.predictors.test_vram import ARCH, PARAMS, PER_LAYER, run


def test_states_of_the_trained_blocks_only() -> None:
    """bf16-true AdamW on the tiny model (2 blocks), the last block trains: gradients 2 bytes and states 4 bytes per
    trained parameter (the block plus its share of the final norm), all weights 2 bytes."""
    p = run(precision="bf16-true", trainable_layers=1)
    block = (ARCH.body_linear_params + ARCH.norm_params + ARCH.other_params) / 2
    assert block == pytest.approx(PER_LAYER + 64 / 2)  # the final norm's 64 weights shared between the 2 blocks
    assert p.params_trainable == int(block)
    assert p.breakdown_bytes["weights"] == pytest.approx(PARAMS * 2, abs=1)
    assert p.breakdown_bytes["optimizer_states"] == pytest.approx(block * 4, abs=1)
    assert any("the last 1 of 2 blocks train" in n for n in p.notes)


def test_mixed_precision_upcasts_what_trains_only() -> None:
    """bf16-mixed (an fp32 model under autocast): the trained block's weights in fp32, the frozen rest in bf16; the
    frozen output head casts nothing, so only the trained block's 16-bit copies are kept."""
    frozen = run(precision="bf16-mixed", trainable_layers=1)
    full = run(precision="bf16-mixed")
    block = (ARCH.body_linear_params + ARCH.norm_params + ARCH.other_params) / 2
    assert frozen.breakdown_bytes["weights"] == pytest.approx(block * 4 + (PARAMS - block) * 2, abs=1)
    assert full.breakdown_bytes["weights"] == pytest.approx(PARAMS * 4, abs=1)
    assert frozen.breakdown_bytes["autocast_weight_copies"] == pytest.approx(ARCH.body_linear_params / 2 * 2, abs=1)


def test_backward_stops_at_the_lowest_trained_block() -> None:
    """Llama-3.1-8B, 32 blocks, no checkpointing, 8 x 4,096 tokens (a backward-phase peak): the last 4 blocks keep
    activations (1/8 of every block's), the first 4 train with backward running through all 32, whose frozen blocks
    keep less than trained ones."""
    def vram(**kw: Any) -> Any:
        spec = TrainingSpec.model_validate({"model": "llama-3.1-8b", "precision": "bf16-true", "seq_len": 4096,
                                            "micro_batch_size": 8, **kw})
        p = predict_vram_of(spec)
        assert p.peak_phase == "backward"
        return spec, p
    spec_all, every = vram()
    spec_last, last = vram(trainable_layers=4)
    spec_first, first = vram(trainable_layers=-4)
    arch = resolve_model(spec_all).architecture
    assert trained_blocks(spec_last, arch) == (4, 4)
    assert trained_blocks(spec_first, arch) == (4, 32)
    final_norm = every.breakdown_bytes["activations"] - 32 * _per_block(every, last)
    assert last.breakdown_bytes["activations"] == pytest.approx(4 * _per_block(every, last) + final_norm, rel=1e-9)
    # the 28 frozen blocks above the first 4 keep what a block keeps, less their linears' inputs (q/k/v and
    # gate/up share one 4,096-wide input each, down's is 14,336 wide) and their norms' normalised outputs (two per
    # block), in bf16: the frozen weights need no gradient
    frozen_less = 2 * 4096 * 2 + 2 * 14336 + 2 * 4096 * 2
    assert every.breakdown_bytes["activations"] - first.breakdown_bytes["activations"] == 28 * 8 * 4096 * frozen_less
    assert last.params_trainable == first.params_trainable < every.params_trainable / 7
    assert last.peak_allocated_bytes < first.peak_allocated_bytes < every.peak_allocated_bytes


def _per_block(every: Any, last: Any) -> float:
    """One block's saved activations: the difference between 32 and 4 blocks, over 28."""
    return (every.breakdown_bytes["activations"] - last.breakdown_bytes["activations"]) / 28


def predict_vram_of(spec: TrainingSpec) -> Any:
    from predictors.vram import predict_vram
    return predict_vram(spec, resolve_model(spec).architecture, lookup_gpu("H100-80GB"))


def test_flops_of_a_frozen_model() -> None:
    """The last 2 of 32 blocks: backward computes both gradients for 2 blocks, nothing for the 30 below, the input
    gradient of the frozen head; the first 2: input gradients through the 30 frozen blocks above as well."""
    spec = TrainingSpec.model_validate({"model": "llama-3.1-8b", "seq_len": 2048})
    arch = resolve_model(spec).architecture
    full = flops_per_token(spec, arch)
    head = 2.0 * arch.vocab_size * arch.hidden_size
    attention = _attention_forward_flops(arch, 2048)
    blocks = full.forward - head - attention
    assert full.backward == pytest.approx(2 * (blocks + head + attention))
    last = flops_per_token(spec.model_copy(update={"trainable_layers": 2}), arch)
    first = flops_per_token(spec.model_copy(update={"trainable_layers": -2}), arch)
    assert last.forward == full.forward
    assert last.backward == pytest.approx(2 * blocks * 2 / 32 + 2 * attention * 2 / 32 + head, rel=1e-9)
    assert first.backward == pytest.approx(blocks * (2 * 2 + 30) / 32 + 2 * attention + head, rel=1e-9)
    h100 = lookup_gpu("H100-80GB")
    assert predict_runtime(spec.model_copy(update={"trainable_layers": 2}), arch, h100).tokens_per_second > \
        2 * predict_runtime(spec, arch, h100).tokens_per_second


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"trainable_layers": 0}, "trainable_layers 0 trains nothing"),
        ({"method": "lora", "trainable_layers": 2}, "method is lora"),
        ({"trainable_layers": 2, "pipeline_parallel": 2, "gpus": 2}, "pipeline_parallel > 1 is not modelled"),
        ({"trainable_layers": 2, "galore_rank": 128}, "galore_rank is not modelled"),
        ({"trainable_layers": "two"}, "trainable_layers"),
    ],
    ids=["zero", "lora", "pipeline", "galore", "type"],
)
def test_bad_values_are_named(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_training_spec({"model": "llama-3.1-8b", "method": "full", **fields})
    assert message in str(err.value)


def test_more_layers_than_the_model_has_is_every_block_and_encoder_decoders_are_refused() -> None:
    # 9 of the tiny model's 2 blocks: both blocks train (LLaMA-Factory clamps the same way), not the embedding or head
    assert run(precision="bf16-true", trainable_layers=9).params_trainable == pytest.approx(
        ARCH.body_linear_params + ARCH.norm_params + ARCH.other_params, abs=1)
    spec = TrainingSpec.model_validate({"model": "t5-base", "trainable_layers": 2})
    with pytest.raises(SpecError, match="has an encoder and a decoder"):
        predict_vram_of(spec)


def test_checkpointing_the_trained_blocks_only_leaves_the_frozen_ones_whole() -> None:
    """checkpoint_trained_blocks_only (LLaMA-Factory runs a block without trainable parameters unchecked): with the
    first 4 of Llama-3.1-8B's 32 blocks trained, the 28 frozen blocks backward runs through keep what they keep
    without checkpointing instead of their bf16 input; with the last 4 trained nothing changes; only the trained
    blocks' forward runs again."""
    def spec(n: int, ckpt: str, **kw: Any) -> TrainingSpec:
        return TrainingSpec.model_validate({"model": "llama-3.1-8b", "precision": "bf16-true", "seq_len": 4096,
                                            "micro_batch_size": 8, "framework": "transformers", "trainable_layers": n,
                                            "gradient_checkpointing": ckpt, **kw})

    def acts(s: TrainingSpec) -> float:
        return predict_vram_of(s).breakdown_bytes["activations"]

    frozen_block = (acts(spec(-4, "none")) - acts(spec(4, "none"))) / 28
    only = spec(-4, "full", checkpoint_trained_blocks_only=True)
    tokens = 8 * 4096
    assert acts(only) - acts(spec(-4, "full")) == pytest.approx(28 * (frozen_block - 2 * 4096 * tokens), rel=1e-9)
    assert acts(spec(4, "full", checkpoint_trained_blocks_only=True)) == acts(spec(4, "full"))
    assert any("28 frozen blocks backward runs through keep all their activations" in n
               for n in predict_vram_of(only).notes)
    arch = resolve_model(only).architecture
    assert flops_per_token(only, arch).recompute == pytest.approx(
        flops_per_token(spec(-4, "full"), arch).recompute * 4 / 32, rel=1e-12)


@pytest.mark.parametrize(("fields", "part"), [
    ({"gradient_checkpointing": "none"}, "checkpoint_trained_blocks_only applies to full gradient checkpointing"),
    ({"gradient_checkpointing": "full", "checkpoint_every_n_layers": 2}, "checkpoint_every_n_layers > 1 is not"),
])
def test_checkpoint_trained_blocks_only_input_errors(fields: dict[str, Any], part: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_training_spec({"model": "gpt2", "trainable_layers": -2, "checkpoint_trained_blocks_only": True,
                             **fields})
    assert part in str(err.value)


def test_the_recomputed_trained_block_never_meets_the_frozen_blocks_activations() -> None:
    """With the first -n blocks trained, backward frees every frozen block above before it recomputes a trained one:
    checkpointing the trained blocks only never needs more than no checkpointing (framework-neutral, where the
    recomputed block is summed with what is kept)."""
    def peak(n: int, **kw: Any) -> int:
        spec = TrainingSpec.model_validate({"model": "llama-3.1-8b", "precision": "bf16-true", "seq_len": 4096,
                                            "trainable_layers": n, **kw})
        return predict_vram_of(spec).peak_allocated_bytes

    for n in (-1, -4):
        only = peak(n, gradient_checkpointing="full", checkpoint_trained_blocks_only=True)
        assert peak(n, gradient_checkpointing="full") < only < peak(n, gradient_checkpointing="none")
