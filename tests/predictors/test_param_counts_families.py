"""Exact parameter counts of model families that are not in the catalog (audit: /work/drafts/arch_audit.md).

Each config in ``data/family_configs/`` carries its ``_source``. ``EXPECTED`` is what the Hugging Face class reports
(``model.num_parameters()``, tied weights once). Unless noted, the number was checked by building the transformers
5.24.0 class from the same config on the meta device and counting its parameters ("meta count"); the remote-code
families (no transformers class) are derived by hand from their modeling file, formula in the comment.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from predictors.architecture import architecture_from_config
from predictors.errors import SpecError

CONFIGS = Path(__file__).parent / "data" / "family_configs"

EXPECTED: dict[str, int] = {
    # remote code, LLaMA-shaped (gate/up/down, RMSNorm, no biases, untied head): L*(4h^2 + 3h*i) + (2L+1)h + 2Vh
    "aquila-7b": 7_295_537_152,  # BAAI/Aquila-7B modeling_aquila.py
    "xverse-7b": 7_299_846_144,  # xverse/XVERSE-7B modeling_xverse.py
    "baichuan2-7b": 7_505_973_248,  # Baichuan2-7B modeling_baichuan.py: W_pack h->3h and o_proj without bias, NormHead
    "baichuan2-13b-base": 13_896_668_160,  # Baichuan2-13B: same layout (ALiBi, no position parameters)
    # InternLM: q/k/v/o with bias (config.bias=True): L*(4(h^2+h) + 3h*i) + (2L+1)h + 2Vh
    "internlm-7b": 7_321_948_160,
    # InternLM2: wqkv h->(heads+2kv)*d and wo, bias=config.bias (false here)
    "internlm2-7b": 7_737_708_544,
    "internlm2.5-7b": 7_737_708_544,
    # DeepSeekMoE 16B (deepseek-ai modeling_deepseek.py): layer 0 dense (i=10944), 27 MoE layers of 64 experts
    # (1408) + shared MLP (2 x 1408) + MoEGate weight (64 x h, no bias); model card: 16.4B
    "deepseek-moe-16b": 16_375_728_128,
    # meta counts (transformers 5.24.0); model-card round figures in brackets
    "aya-23-8b": 8_028_033_024,  # cohere: tied head, one weight-only LayerNorm per layer [8B]
    "c4ai-command-r-v01": 34_980_831_232,  # [35B]
    "codegen-350m-mono": 356_712_448,  # qkv/out without bias, fc_in/fc_out and lm_head with bias, ln_1 only
    "dbrx-base": 131_596_523_520,  # nested attn_config / ffn_config, LayerNorm without bias [132B]
    "exaone-3.0-7.8b": 7_818_448_896,  # gated MLP [7.8B]
    "gpt-j-6b": 6_050_882_784,  # attention without bias, lm_head with bias [6B]
    "gpt-neo-125m": 125_198_592,  # q/k/v without bias, out_proj with bias, learned positions, tied [125M]
    "granite-3.0-2b-base": 2_533_531_648,
    "mistral-nemo-base-2407": 12_247_782_400,  # head_dim 128 != 5120 / 32 [12B]
    "mpt-7b": 6_649_286_656,  # no_bias, ALiBi (no position table), tied [6.7B]
    "nemotron-mini-4b": 4_190_509_056,  # LayerNorm1P with bias, plain relu2 MLP
    "olmo-1b-hf": 1_176_764_416,  # OlmoLayerNorm has no parameters
    "olmo-7b-hf": 6_888_095_744,
    "olmo-2-1124-7b": 7_298_617_344,  # q_norm / k_norm over all heads [7.3B]
    "olmoe-1b-7b-0924": 6_919_161_856,  # 64 gated experts, q/k norm over all heads [6.9B]
    "opt-125m": 125_239_296,
    "opt-350m": 331_196_416,  # word_embed_proj_dim 512 (project_in / project_out), no final LayerNorm
    "opt-1.3b": 1_315_758_080,
    "persimmon-8b-base": 9_397_175_296,  # biases everywhere, q/k LayerNorm per head
    "phi-3.5-moe-instruct": 41_873_153_344,  # LayerNorm with bias, attention biases, lm_head bias [41.9B]
    "pythia-160m": 162_322_944,  # rotary_pct has no parameters
    "qwen1.5-moe-a2.7b": 14_315_784_192,  # [14.3B]
    "redpajama-incite-3b": 2_775_864_320,
    "santacoder-gpt_bigcode": 1_124_886_528,  # multi_query: one key/value head [1.1B]
    "stablelm-3b-4e1t": 2_795_443_200,
    "starcoder2-7b": 7_173_923_840,
    # encoders: the AutoModel base class (BERT-style pooler only for BERT / RoBERTa / XLM-R)
    "roberta-base": 124_645_632,
    "xlm-roberta-base": 278_043_648,
    "distilbert-base-uncased": 66_362_880,  # no token types, no pooler
    "electra-base-discriminator": 108_891_648,  # no pooler
    "electra-small-discriminator": 13_483_008,  # embedding_size 128 + embeddings_project
    "deberta-v3-base": 183_831_552,  # no absolute positions, rel_embeddings 512 x h + LayerNorm, no pooler
    # encoder-decoders
    "bart-base": 139_420_416,  # shared table, 2 learned position tables of 1026 rows, layernorm_embedding x 2
    "mbart-large-cc25": 610_851_840,  # BART + a final LayerNorm per stack
    # T5 v1.1 / UMT5 checkpoints ship an untied lm_head (config tie_word_embeddings=false); transformers 5.24's
    # T5Config forces tying, so the meta count is lower by V*d — this is the untied count the checkpoints hold
    "t5-v1_1-base": 247_577_856,
    "umt5-small": 306_601_984,  # a relative-position table in every layer
}

# Structures the canonical shape cannot represent: the count comes with a warning that says so.
WARNED = ("jamba-v0.1", "llama-3.2-11b-vision", "phi-3-small-8k-instruct")


def _config(name: str) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return config


def test_every_config_is_sourced_and_pinned() -> None:
    names = sorted(p.stem for p in CONFIGS.glob("*.json"))
    assert sorted([*EXPECTED, *WARNED, "mamba-130m-hf"]) == names
    for name in names:
        assert _config(name).get("_source"), name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_family_params_total(name: str) -> None:
    arch = architecture_from_config(_config(name), name)
    assert arch.params_total == EXPECTED[name]
    assert arch.warnings == ()


@pytest.mark.parametrize("name", WARNED)
def test_unrepresentable_structure_warns(name: str) -> None:
    assert architecture_from_config(_config(name), name).warnings


def test_hybrid_ssm_warning_names_the_problem() -> None:
    (warning,) = architecture_from_config(_config("jamba-v0.1")).warnings
    assert "state-space" in warning and "model.params" in warning


def test_pure_ssm_is_a_spec_error() -> None:
    with pytest.raises(SpecError, match=r"model\.config\.model_type"):
        architecture_from_config(_config("mamba-130m-hf"))


def test_deberta_v2_relative_table_falls_back_to_max_positions_without_absolute_positions() -> None:
    """DebertaV2Encoder sizes rel_embeddings from max_position_embeddings when max_relative_positions < 1 and there
    are no position buckets, whatever position_biased_input says; dropping the absolute table (position_biased_input
    false) removes max_position_embeddings x hidden and nothing else (it fell back to 512 rows before)."""
    config = {"model_type": "deberta-v2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 1024,
              "relative_attention": True, "pos_att_type": ["c2p", "p2c"]}
    with_abs = architecture_from_config({**config, "position_biased_input": True}).params_total
    without = architecture_from_config({**config, "position_biased_input": False}).params_total
    assert with_abs - without == 1024 * 64
