"""Random specs over every allowed setting and small configs of every architecture family, some with config values
of the wrong type: each is a SpecError, or a prediction and a placement decision whose JSON forms hold finite,
ordered numbers. Seeded and deterministic; it found config values that crashed the parameter count."""

from __future__ import annotations

import copy
import math
import random
from typing import Any

import pytest

from predictors.errors import SpecError
from predictors.predict import predict
from predictors.spec import ALLOWED, parse_training_spec
from scheduler.placement import place
from scheduler.pools import default_pools

CONFIGS: tuple[dict[str, Any], ...] = (
    {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
     "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000},
    {"model_type": "mixtral", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
     "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000, "num_local_experts": 4,
     "num_experts_per_tok": 2},
    {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 1000, "n_positions": 128},
    {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
     "intermediate_size": 128, "vocab_size": 1000},
    {"model_type": "t5", "d_model": 64, "num_layers": 2, "num_heads": 4, "d_ff": 128, "d_kv": 16, "vocab_size": 1000},
    {"model_type": "deepseek_v3", "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
     "intermediate_size": 128, "moe_intermediate_size": 32, "vocab_size": 1000, "n_routed_experts": 4,
     "num_experts_per_tok": 2, "first_k_dense_replace": 1, "q_lora_rank": 16, "kv_lora_rank": 16,
     "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16},
    {"model_type": "qwen", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "kv_channels": 16,
     "intermediate_size": 128, "vocab_size": 1000},
)
WRONG: tuple[Any, ...] = (0, -1, 3, None, "x", 1.5, 10**12, [], {})


def _random_spec(rng: random.Random) -> dict[str, Any]:
    config = copy.deepcopy(rng.choice(CONFIGS))
    for _ in range(rng.choice((0, 0, 1, 2))):
        key = rng.choice([k for k in config if k != "model_type"])
        config[key] = rng.choice(WRONG)
    data: dict[str, Any] = {
        "model": {"name": "random", "config": config}, "method": rng.choice(ALLOWED["method"]),
        "precision": rng.choice(ALLOWED["precision"]), "optimizer": rng.choice(ALLOWED["optimizer"]),
        "micro_batch_size": rng.choice((1, 2, 7)), "seq_len": rng.choice((1, 64, 1000, 4096)),
        "gradient_checkpointing": rng.choice(ALLOWED["gradient_checkpointing"]),
        "attention": rng.choice(ALLOWED["attention"]), "offload": rng.choice(ALLOWED["offload"]),
        "task": rng.choice(ALLOWED["task"]), "gpus": rng.choice((1, 2, 8, "auto", 16)),
        "sharding": rng.choice((*ALLOWED["sharding"], None)), "tensor_parallel": rng.choice((1, 1, 2, 4)),
        "pipeline_parallel": rng.choice((1, 1, 2, 3)), "context_parallel": rng.choice((1, 1, 2)),
        "grad_accum_steps": rng.choice((1, 4)), "train_tokens": rng.choice((None, 1e6, 1)),
    }
    if data["method"] != "full" and rng.random() < 0.5:
        data["lora"] = {"rank": rng.choice((1, 8, 64)),
                        "target_modules": rng.choice(("all-linear", ["q_proj"], ["lm_head"]))}
    return {k: v for k, v in data.items() if v is not None}


def _finite_numbers(node: Any) -> bool:
    if isinstance(node, dict):
        return all(_finite_numbers(v) for v in node.values())
    if isinstance(node, list):
        return all(_finite_numbers(v) for v in node)
    return not isinstance(node, float) or math.isfinite(node)


@pytest.mark.parametrize("seed", range(3))
def test_random_specs_are_an_error_or_a_sound_answer(seed: int) -> None:
    rng = random.Random(seed)
    pools = default_pools()
    answered = 0
    for _ in range(80):  # about three in four are errors (parallel sizes, offload without a sharded engine, ...)
        data = _random_spec(rng)
        try:
            spec = parse_training_spec(data)
            prediction = predict(spec, gpu_name=rng.choice((None, "H100-80GB", "L40S")))
        except SpecError:
            continue
        out = prediction.to_dict()
        assert _finite_numbers(out), data
        assert 0 < out["peak_allocated_bytes"] <= out["peak_reserved_bytes"] <= out["peak_vram_bytes"], data
        assert out["peak_vram_upper_bytes"] >= out["peak_vram_bytes"], data
        decision = place(spec, pools, suggest=False).to_dict()
        assert decision["decision"] in ("placed", "unschedulable") and _finite_numbers(decision), data
        answered += 1
    assert answered >= 10  # the sweep reaches the predictor, not only the validators
