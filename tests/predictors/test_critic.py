"""PPO's critic (``critic_model``): a value model trained in turn with the policy on the same GPUs. Each update peaks
with the other model's states resident; checked by hand against the two models predicted alone."""

from __future__ import annotations

from typing import Any

import pytest

from predictors.architecture import architecture_from_config
from predictors.errors import SpecError
from predictors.hardware import lookup_gpu
from predictors.predict import predict
from predictors.runtime import predict_runtime
from predictors.spec import TrainingSpec, parse_training_spec
from predictors.vram import predict_vram
from tests.predictors.test_vram import ARCH, TINY

CRITIC_CONFIG = {**TINY, "num_hidden_layers": 1}
CRITIC = architecture_from_config(CRITIC_CONFIG, "tiny-critic")
STATES = ("weights", "master_weights", "optimizer_states", "lora_adapters", "reference_weights",
          "communication_buffers", "secondary_weights", "saved_modules", "teacher_weights", "paged_optimizer_states")


def _spec(**fields: Any) -> TrainingSpec:
    return parse_training_spec({"model": {"name": "tiny", "config": TINY},
                                "critic_model": {"name": "tiny-critic", "config": CRITIC_CONFIG},
                                "precision": "bf16-mixed", "micro_batch_size": 2, "seq_len": 64, "gpus": 4,
                                "sharding": "fsdp", "gradient_checkpointing": "full", **fields})


def _alone(spec: TrainingSpec) -> TrainingSpec:
    return spec.model_copy(update={"critic_model": None, "critic_micro_batch_size": None,
                                   "critic_gradient_checkpointing": None})


def _states(breakdown: dict[str, int]) -> int:
    return sum(breakdown.get(k, 0) for k in STATES)


def test_the_critic_step_is_its_own_training_step() -> None:
    spec = _spec(method="lora", critic_micro_batch_size=8, critic_gradient_checkpointing="none",
                 reference_model=True)
    critic = spec.critic_spec()
    assert critic is not None
    assert (critic.task, critic.method, critic.lora, critic.micro_batch_size, critic.gradient_checkpointing) == (
        "token-classification", "full", None, 8, "none")
    assert (critic.sharding, critic.gpus, critic.seq_len, critic.precision) == ("fsdp", 4, 64, "bf16-mixed")
    assert critic.reference_model is None and critic.critic_model is None
    assert _spec().critic_spec().micro_batch_size == 2  # type: ignore[union-attr]  # the policy's by default
    assert _alone(spec).critic_spec() is None


def test_each_update_peaks_with_the_other_models_states() -> None:
    gpu = lookup_gpu("A100-80GB")
    spec = _spec()
    both = predict_vram(spec, ARCH, gpu, critic=CRITIC)
    policy = predict_vram(_alone(spec), ARCH, gpu)
    critic_spec = spec.critic_spec()
    assert critic_spec is not None
    critic = predict_vram(critic_spec, CRITIC, gpu)
    critic_states, policy_states = _states(critic.breakdown_bytes), _states(policy.breakdown_bytes)
    assert critic_states > 0 and policy_states > 0
    expected = max(policy.peak_vram_bytes + critic_states, critic.peak_vram_bytes + policy_states)
    assert both.peak_vram_bytes == expected
    assert sum(both.breakdown_bytes.values()) == both.peak_vram_bytes
    # the policy's step is the larger here (a tiny critic, the same micro-batch): its breakdown, the critic's states
    assert both.breakdown_bytes["critic_states"] == critic_states
    assert both.peak_allocated_bytes == policy.peak_allocated_bytes + critic_states
    assert both.params_total == policy.params_total  # the job's model is the policy
    assert any("critic_model tiny-critic" in n for n in both.notes)


def test_megatrons_fp32_gradient_buffer_stays_while_the_other_model_trains() -> None:
    """fp32_gradients (Megatron-Core's main_grad buffer, allocated whole when the model is wrapped): the critic's
    gradients are resident while the policy trains, beside its weights and optimizer states."""
    gpu = lookup_gpu("A100-80GB")
    spec = _spec(sharding="zero1", fp32_gradients=True)
    critic_spec = spec.critic_spec()
    assert critic_spec is not None and critic_spec.fp32_gradients is True
    critic = predict_vram(critic_spec, CRITIC, gpu)
    assert critic.breakdown_bytes["gradients"] == critic.params_trainable * 4  # whole on every rank, in fp32
    both = predict_vram(spec, ARCH, gpu, critic=CRITIC)
    assert both.breakdown_bytes["critic_states"] == _states(critic.breakdown_bytes) + critic.breakdown_bytes[
        "gradients"]
    without = predict_vram(_spec(sharding="zero1"), ARCH, gpu, critic=CRITIC)
    critic_16 = predict_vram(_spec(sharding="zero1").critic_spec(), CRITIC, gpu)  # type: ignore[arg-type]
    assert without.breakdown_bytes["critic_states"] == _states(critic_16.breakdown_bytes)


def test_a_larger_critic_batch_makes_the_critic_step_the_peak() -> None:
    gpu = lookup_gpu("A100-80GB")
    spec = _spec(critic_micro_batch_size=64, critic_gradient_checkpointing="none")
    both = predict_vram(spec, ARCH, gpu, critic=CRITIC)
    policy = predict_vram(_alone(spec), ARCH, gpu)
    critic_spec = spec.critic_spec()
    assert critic_spec is not None
    critic = predict_vram(critic_spec, CRITIC, gpu)
    assert "policy_states" in both.breakdown_bytes and "critic_states" not in both.breakdown_bytes
    assert both.breakdown_bytes["policy_states"] == _states(policy.breakdown_bytes)
    assert both.peak_vram_bytes == critic.peak_vram_bytes + _states(policy.breakdown_bytes)
    assert both.breakdown_bytes["activations"] == critic.breakdown_bytes["activations"]
    assert any("the critic's update peaks" in n for n in both.notes)


def test_the_critic_is_required_and_checked() -> None:
    with pytest.raises(ValueError, match="critic_model needs its architecture"):
        predict_vram(_spec(), ARCH, None)
    with pytest.raises(SpecError) as info:
        parse_training_spec({"model": "llama-3-8b", "critic_micro_batch_size": 4})
    assert "critic_micro_batch_size is set but critic_model is not" in str(info.value)
    # Megatron PPO (verl's ppo_megatron_trainer) pipelines both models: each is predicted at its higher end
    piped = predict(parse_training_spec({"model": "llama-3-8b", "critic_model": "llama-3-8b",
                                         "pipeline_parallel": 2, "gpus": 8, "sharding": "zero1"})).to_dict()
    assert piped["breakdown_bytes"].get("critic_states", 0) or piped["breakdown_bytes"].get("policy_states", 0)
    with pytest.raises(SpecError) as info:
        predict(parse_training_spec({"model": "llama-3-8b", "critic_model": "no-such-critic-9b"}))
    assert "critic_model" in str(info.value) and "no-such-critic-9b" in str(info.value)
    # a layout the policy takes but the critic's model does not: the error says it is the critic's
    odd = {"name": "odd-critic", "config": {**CRITIC_CONFIG, "num_attention_heads": 3, "num_key_value_heads": 3,
                                            "hidden_size": 96}}
    with pytest.raises(SpecError) as info:
        predict(parse_training_spec({"model": {"name": "tiny", "config": TINY}, "critic_model": odd,
                                     "tensor_parallel": 2, "gpus": 2}))
    assert "3 attention heads" in str(info.value) and "(critic_model odd-critic)" in str(info.value)


def test_the_critic_update_adds_to_every_step() -> None:
    gpu = lookup_gpu("H100-80GB")
    spec = _spec(critic_micro_batch_size=4, steps=10)
    both = predict_runtime(spec, ARCH, gpu, critic=CRITIC)
    policy = predict_runtime(_alone(spec), ARCH, gpu)
    critic_spec = spec.critic_spec()
    assert critic_spec is not None
    critic = predict_runtime(critic_spec, CRITIC, gpu)
    # the critic trains on the policy's tokens of the step, at its own throughput
    critic_s = policy.tokens_per_step / critic.tokens_per_second
    assert both.components_seconds["critic_update"] == pytest.approx(critic_s)
    assert both.step_time_seconds == pytest.approx(policy.step_time_seconds + critic_s)
    assert both.tokens_per_step == policy.tokens_per_step
    assert both.runtime_seconds == pytest.approx(10 * both.step_time_seconds)
    parts, _ = both.step_breakdown()
    assert sum(parts.values()) == pytest.approx(both.step_time_seconds)


def test_predict_resolves_the_critic_from_the_catalog() -> None:
    spec = parse_training_spec({"model": "qwen2.5-1.5b", "critic_model": "Qwen/Qwen2.5-7B-Instruct",
                                "micro_batch_size": 4, "seq_len": 1024, "gpus": 8, "sharding": "fsdp",
                                "gradient_checkpointing": True, "steps": 5, "gpu": "H100-80GB"})
    with_critic = predict(spec).to_dict()
    alone = predict(spec.model_copy(update={"critic_model": None})).to_dict()
    breakdown = with_critic["breakdown_bytes"]
    # the 7B critic's update (4 x 1,024 tokens through 28 blocks) peaks above the 1.5B policy's: the breakdown is the
    # critic's, its fp32 sharded weights and AdamW states 12 bytes x 7.07e9 / 8 GPUs, with the policy's beside them
    critic_states = breakdown["weights"] + breakdown["optimizer_states"] + breakdown.get("master_weights", 0)
    assert critic_states / 2**30 == pytest.approx(12 * 7.07e9 / 8 / 2**30, rel=0.02)
    assert breakdown["policy_states"] / 2**30 == pytest.approx(12 * 1.544e9 / 8 / 2**30, rel=0.02)
    assert with_critic["peak_vram_bytes"] > alone["peak_vram_bytes"] + 9 * 2**30
    assert with_critic["runtime_seconds"] > alone["runtime_seconds"]


def test_a_model_offloaded_when_idle_is_away_only_while_the_other_trains() -> None:
    """verl moves an offloaded actor or critic to host memory between its calls and back for its own update
    (update_actor / update_critic load both first): its states leave the other model's phase, not its own."""
    gpu = lookup_gpu("A100-80GB")
    spec = _spec(critic_micro_batch_size=64, critic_gradient_checkpointing="none")  # the critic's step peaks higher
    resident = predict_vram(spec, ARCH, gpu, critic=CRITIC)
    policy = predict_vram(_alone(spec), ARCH, gpu)
    critic_spec = spec.critic_spec()
    assert critic_spec is not None
    critic = predict_vram(critic_spec, CRITIC, gpu)
    policy_idle = predict_vram(spec.model_copy(update={"idle_offload": "policy"}), ARCH, gpu, critic=CRITIC)
    assert policy_idle.peak_vram_bytes == max(critic.peak_vram_bytes,
                                              policy.peak_vram_bytes + _states(critic.breakdown_bytes))
    both = predict_vram(spec.model_copy(update={"idle_offload": "both"}), ARCH, gpu, critic=CRITIC)
    assert both.peak_vram_bytes == max(critic.peak_vram_bytes, policy.peak_vram_bytes)
    assert both.peak_vram_bytes <= policy_idle.peak_vram_bytes < resident.peak_vram_bytes
    with pytest.raises(SpecError, match="idle_offload is set but critic_model is not"):
        parse_training_spec({"model": "llama-3-8b", "idle_offload": "both"})


def test_the_critic_has_a_layout_of_its_own() -> None:
    """verl's critic keeps its own Ulysses / Megatron sizes and offload (1, 1, none by default) whatever the actor's:
    it inherited the actor's. A layout the GPUs cannot take is a named error, not a pydantic traceback."""
    spec = _spec(context_parallel=2, critic_context_parallel=1, offload="params+optimizer", sharding="zero3",
                 critic_offload="none")
    critic = spec.critic_spec()
    assert critic is not None and (critic.context_parallel, critic.offload) == (1, "none")
    with pytest.raises(SpecError, match="critic's tensor x pipeline x context parallel"):
        parse_training_spec({"model": "llama-3-8b", "critic_model": "llama-3-8b", "gpus": 4,
                             "critic_tensor_parallel": 3})


def test_an_idle_policy_keeps_its_frozen_reference_and_the_critic_takes_no_params_override() -> None:
    """idle_offload moves the policy's own states, not a frozen reference beside it (verl's Megatron reference stays
    on the GPUs); critic_model.params was accepted and ignored, and is refused now."""
    gpu = lookup_gpu("A100-80GB")
    spec = _spec(reference_model=True, critic_micro_batch_size=64, critic_gradient_checkpointing="none",
                 idle_offload="policy")
    both = predict_vram(spec, ARCH, gpu, critic=CRITIC)
    policy = predict_vram(_alone(spec), ARCH, gpu)
    assert both.breakdown_bytes["policy_states"] == policy.breakdown_bytes["reference_weights"] > 0
    with pytest.raises(SpecError, match=r"critic_model\.params is not read"):
        parse_training_spec({"model": "llama-3-8b", "critic_model": {"name": "llama-3-8b", "params": 8e9}})
