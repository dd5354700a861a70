"""Physics of the analytic VRAM model on paths the dev reference runs do not cover (MoE, encoder-decoder, eager
attention outside the dev families, selective checkpointing with eager attention, SHARD_GRAD_OP with adapters).

Each test derives the expected bytes by hand on a tiny model, isolating one term by a difference of two predictions.
"""

from __future__ import annotations

from typing import Any

import pytest

from predictors.architecture import architecture_from_config
from predictors.errors import SpecError
from predictors.spec import parse_training_spec
from predictors.vram import VramPrediction, predict_vram

TINY: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000, "tie_word_embeddings": False,
}
H, L, HEADS = 64, 2, 4


def predict(config: dict[str, Any], **fields: Any) -> VramPrediction:
    spec = parse_training_spec({"model": {"config": config}, **fields})
    return predict_vram(spec, architecture_from_config(config, "tiny"))


def activations(config: dict[str, Any], **fields: Any) -> int:
    return predict(config, **fields).breakdown_bytes["activations"]


# ---- MoE ---------------------------------------------------------------------------------------------------
MOE = {**TINY, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2}


def test_moe_expert_adapters_only_see_the_tokens_routed_to_them() -> None:
    """Every adapted linear a token passes through keeps its own fp32 copy of the input (PEFT casts it to the
    adapter's dtype), after dropout when there is one: top-k experts per token, not all of them. Dropout adds its
    1-byte mask per input feature; the 4-byte copy is there either way."""
    tokens = 256
    fields = {"method": "lora", "precision": "bf16-true", "seq_len": tokens}
    with_dropout = activations(MOE, **fields, lora={"target_modules": "all-linear", "dropout": 0.1})
    without = activations(MOE, **fields, lora={"target_modules": "all-linear", "dropout": 0.0})
    attention_inputs = 4 * H  # q, k, v, o: each reads 64 features
    expert_inputs = 2 * (H + H + 128)  # top-2 experts x (gate 64 + up 64 + down 128)
    assert with_dropout - without == L * tokens * (attention_inputs + expert_inputs) * 1


def test_moe_dispatch_and_router_terms_only_in_moe_layers() -> None:
    """DeepSeek's first_k_dense_replace layers are dense: no router softmax (fp32, one value per expert) there.
    Doubling the expert count changes only that term of the activations."""
    base = {**TINY, "model_type": "deepseek_v2", "n_routed_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "first_k_dense_replace": 1, "moe_layer_freq": 1}
    tokens = 128
    four = activations(base, precision="bf16-true", seq_len=tokens)
    eight = activations({**base, "n_routed_experts": 8}, precision="bf16-true", seq_len=tokens)
    assert eight - four == 1 * tokens * 4 * (8 - 4)  # one MoE layer of the two


@pytest.mark.parametrize(("first_dense", "freq", "moe_layers"), [(0, 1, 4), (0, 2, 2), (1, 2, 1), (1, 1, 3)])
def test_deepseek_moe_layer_freq_counts_from_layer_zero(first_dense: int, freq: int, moe_layers: int) -> None:
    """DeepseekV2DecoderLayer: MoE when layer_idx >= first_k_dense_replace and layer_idx % moe_layer_freq == 0."""
    cfg = {**TINY, "model_type": "deepseek_v2", "num_hidden_layers": 4, "n_routed_experts": 4,
           "num_experts_per_tok": 2, "moe_intermediate_size": 32, "first_k_dense_replace": first_dense,
           "moe_layer_freq": freq}
    arch = architecture_from_config(cfg, "tiny-deepseek")
    assert arch.num_moe_layers == moe_layers
    experts = next(g for g in arch.linears if g.expert and g.role == "up_proj")
    assert experts.count == moe_layers * 4
    dense = [g for g in arch.linears if not g.expert and g.role == "up_proj"]
    assert sum(g.count for g in dense) == 4 - moe_layers


def test_qwen_moe_decoder_sparse_step_counts_from_layer_one() -> None:
    """Qwen2MoeDecoderLayer: MoE when (layer_idx + 1) % decoder_sparse_step == 0 (unchanged by moe_layer_freq)."""
    cfg = {**TINY, "model_type": "qwen2_moe", "num_hidden_layers": 4, "num_experts": 4, "num_experts_per_tok": 2,
           "moe_intermediate_size": 32, "decoder_sparse_step": 2}
    assert architecture_from_config(cfg, "tiny-qwen-moe").num_moe_layers == 2


def test_real_moe_lora_activations_stay_below_the_dense_equivalent() -> None:
    """Qwen3-30B-A3B with all-linear LoRA at 2k tokens: 190 GiB of activations before the audit (adapters of all
    128 experts per token), three times Qwen3-32B's (dense, 64 layers, a wider MLP; 62 GiB); 29 GiB after. Since
    each adapter keeps its own fp32 input copy (2026-11-26: 36.5 GiB against 68.1 GiB) the top-8 experts' copies
    weigh more, still about half the dense model's."""
    from predictors.catalog import resolve_model

    def act(model: str) -> int:
        spec = parse_training_spec({"model": model, "method": "lora", "precision": "bf16-true", "seq_len": 2048,
                                    "lora": {"target_modules": "all-linear", "dropout": 0.05}})
        return predict_vram(spec, resolve_model(spec).architecture).breakdown_bytes["activations"]

    assert act("qwen3-30b-a3b") < act("qwen3-32b") * 0.6


# ---- eager attention ---------------------------------------------------------------------------------------
def _eager_minus_sdpa_per_token(config: dict[str, Any], seq: int, **fields: Any) -> float:
    eager = activations(config, seq_len=seq, attention="eager", **fields)
    sdpa = activations(config, seq_len=seq, attention="sdpa", **fields)
    return (eager - sdpa) / seq


@pytest.mark.parametrize(("precision", "per_score"), [
    ("bf16-true", 4 + 2),  # softmax(dtype=float32) keeps its fp32 output, P @ V keeps the bf16 cast
    ("bf16-mixed", 4 + 2),  # autocast: softmax in fp32, P cast to bf16 for the matmul
    ("32-true", 4),  # one fp32 tensor serves both
])
def test_eager_scores_of_an_upcasting_decoder(precision: str, per_score: int) -> None:
    seq = 256
    lse = 4 * HEADS  # what sdpa keeps per row instead
    assert _eager_minus_sdpa_per_token(TINY, seq, precision=precision) == L * (HEADS * seq * per_score - lse)


def test_eager_scores_of_gemma2_keep_the_softcapping_tanh() -> None:
    gemma2 = {**TINY, "model_type": "gemma2", "head_dim": 16, "attn_logit_softcapping": 50.0}
    seq = 256
    assert _eager_minus_sdpa_per_token(gemma2, seq, precision="bf16-true") == L * (HEADS * seq * (4 + 2 + 2)
                                                                                  - 4 * HEADS)
    assert architecture_from_config({**gemma2, "attn_logit_softcapping": None}, "g").attn_logit_softcapping is False
    with pytest.raises(SpecError, match="attn_logit_softcapping"):
        architecture_from_config({**gemma2, "attn_logit_softcapping": "high"}, "g")


def test_eager_scores_of_gpt2_softmax_in_input_dtype_with_dropout() -> None:
    """GPT-2 (attention dropout 0.1): bf16 softmax output, 1-byte mask, bf16 dropped probabilities."""
    gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 1000, "n_positions": 1024}
    seq = 256
    assert _eager_minus_sdpa_per_token(gpt2, seq, precision="bf16-true") == L * (HEADS * seq * (2 + 1 + 2)
                                                                                - 4 * HEADS)


def test_selective_checkpointing_recomputes_eager_scores() -> None:
    """Selective recomputation always recomputes the attention core (Korthikanti et al. 2022): no layer keeps its
    s x s scores; the layer in backward recomputes its own once."""
    deep = {**TINY, "num_hidden_layers": 8}
    seq = 1024
    diff = _eager_minus_sdpa_per_token(deep, seq, precision="bf16-true", gradient_checkpointing="selective")
    # one layer's scores, minus the 40 % of the per-row log-sum-exp sdpa keeps in each of the 8 layers
    assert diff == pytest.approx(HEADS * seq * 6 - 0.4 * 8 * 4 * HEADS)


# ---- encoder-decoder ----------------------------------------------------------------------------------------
T5 = {"model_type": "t5", "d_model": 64, "num_layers": 2, "num_decoder_layers": 1, "num_heads": 4, "d_kv": 16,
      "d_ff": 128, "vocab_size": 1000}


def _one_more_decoder_block(seq: int, **fields: Any) -> int:
    one = activations(T5, seq_len=seq, precision="bf16-true", **fields)
    two = activations({**T5, "num_decoder_layers": 2}, seq_len=seq, precision="bf16-true", **fields)
    return two - one


def test_cross_attention_keys_and_values_have_the_encoder_length() -> None:
    """Each decoder block projects k and v from the encoder output: 2 x heads x d_kv bf16 values per ENCODER token
    per block. The decoder length stays 128 (seq_len is the input length), so only those grow with seq_len."""
    grown = _one_more_decoder_block(512) - _one_more_decoder_block(256)
    assert grown == 2 * 2 * HEADS * 16 * (512 - 256)


def test_eager_encoder_decoder_scores_are_dec_by_dec_and_dec_by_enc() -> None:
    """T5 eager attention (softmax(scores.float()), dropout 0.1): fp32 softmax output + mask + bf16 dropped
    probabilities = 7 bytes per score. A decoder block adds self-attention scores 128 x 128 and cross-attention
    scores 128 x seq_len, in place of the two rows of fused-kernel log-sum-exp."""
    seq, dec = 512, 128
    eager = _one_more_decoder_block(seq, attention="eager")
    sdpa = _one_more_decoder_block(seq, attention="sdpa")
    assert eager - sdpa == HEADS * 7 * dec * (dec + seq) - 2 * 4 * HEADS * dec


# ---- sharding -----------------------------------------------------------------------------------------------
def test_shard_grad_op_keeps_lora_bases_unsharded_between_forward_and_backward() -> None:
    fields = {"precision": "bf16-true", "seq_len": 64, "sharding": "fsdp-grad-op"}
    arch = architecture_from_config(TINY, "tiny")
    lora = predict(TINY, method="lora", gpus=4, **fields)
    assert lora.breakdown_bytes["weights"] == pytest.approx(arch.params_total * 2 / 4, abs=1)
    assert lora.breakdown_bytes["gathered_params"] == arch.params_total * 2
    # 32-bit full fine-tuning gathers fp32 parameters
    full32 = predict(TINY, gpus=4, **{**fields, "precision": "32-true"})
    assert full32.breakdown_bytes["gathered_params"] == arch.params_total * 4
    # one data-parallel rank shards nothing: the weights are already whole, nothing more is gathered
    single = predict(TINY, gpus=1, **fields)
    assert "gathered_params" not in single.breakdown_bytes
    assert single.breakdown_bytes["weights"] == arch.params_total * 2


# ---- activation functions and the output head ----------------------------------------------------------------
GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 1000, "n_positions": 1024}


@pytest.mark.parametrize(("precision", "per_width"), [
    ("bf16-true", 3 * 2),  # tanh output, 0.5 * x, 1 + tanh in bf16 (pow keeps x itself, already counted)
    ("32-true", 3 * 4),
    ("bf16-mixed", (4 - 2) + 4 + 2 + 4),  # pow's fp32 copy of x replaces x; tanh, 1 + tanh fp32; 0.5 * x bf16
])
def test_gpt2_gelu_new_keeps_three_intermediates(precision: str, per_width: int) -> None:
    """transformers' NewGELUActivation is a chain of element-wise ops; a fused gelu keeps only its input.
    The difference is per_width bytes per element of the MLP (4 x 64 wide) per layer and token."""
    seq = 128
    python_gelu = activations(GPT2, seq_len=seq, precision=precision)  # GPT2Config's default: gelu_new
    fused = activations({**GPT2, "activation_function": "gelu_pytorch_tanh"}, seq_len=seq, precision=precision)
    assert python_gelu - fused == L * seq * 4 * 64 * per_width


def test_activation_names_from_each_family_config() -> None:
    assert architecture_from_config({**GPT2, "activation_function": "gelu_new"}, "g").activation == "gelu_new"
    assert architecture_from_config(GPT2, "g").activation == "gelu_new"  # GPT2Config's default
    assert architecture_from_config(TINY, "t").activation == "silu"
    assert architecture_from_config({**TINY, "hidden_act": "SiLU"}, "t").activation == "silu"
    gemma2 = {**TINY, "model_type": "gemma2", "hidden_act": "gelu", "hidden_activation": "gelu_pytorch_tanh"}
    assert architecture_from_config(gemma2, "g").activation == "gelu_pytorch_tanh"
    t5 = {"model_type": "t5", "d_model": 64, "num_layers": 2, "num_heads": 4, "d_ff": 128, "vocab_size": 1000}
    # T5Config derives the activation from feed_forward_proj, whatever dense_act_fn says
    assert architecture_from_config({**t5, "feed_forward_proj": "gated-gelu", "dense_act_fn": "relu"},
                                    "t").activation == "gelu_new"
    assert architecture_from_config(t5, "t").activation == "relu"
    bert = {"model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "vocab_size": 1000}
    assert architecture_from_config(bert, "b").activation == "gelu"


def test_phi_gelu_new_counts_as_fused() -> None:
    """Phi's public runs are litgpt's, which fuses gelu_new (F.gelu(approximate="tanh"))."""
    phi = {**TINY, "model_type": "phi"}
    assert (activations({**phi, "hidden_act": "gelu_new"}, seq_len=128, precision="bf16-true")
            == activations({**phi, "hidden_act": "gelu_pytorch_tanh"}, seq_len=128, precision="bf16-true"))


@pytest.mark.parametrize(("precision", "e"), [("bf16-true", 2), ("32-true", 4)])
def test_gemma2_final_logit_softcapping_keeps_the_tanh_output(precision: str, e: int) -> None:
    gemma2 = {**TINY, "model_type": "gemma2", "head_dim": 16}
    seq = 128
    capped = predict({**gemma2, "final_logit_softcapping": 30.0}, seq_len=seq, precision=precision)
    plain = predict({**gemma2, "final_logit_softcapping": None}, seq_len=seq, precision=precision)
    assert capped.breakdown_bytes["logits"] - plain.breakdown_bytes["logits"] == seq * 1000 * e
    with pytest.raises(SpecError, match="final_logit_softcapping"):
        architecture_from_config({**gemma2, "final_logit_softcapping": -1}, "g")
