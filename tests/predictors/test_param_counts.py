"""Exact parameter counts of every catalog model, and catalog lookup / resolution.

``EXPECTED`` pins ``architecture_from_config(config).params_total`` (what ``model.num_parameters()`` of the
Hugging Face class reports: tied output heads counted once). Family formulas are re-derived by hand below
so that the table is not just a snapshot of the code.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from predictors.architecture import Architecture, architecture_from_config
from predictors.catalog import catalog, lookup_model, resolve_model
from predictors.errors import SpecError
from predictors.predict import predict
from predictors.spec import ModelRef, TrainingSpec

EXPECTED: dict[str, int] = {
    "bert-base-uncased": 109_482_240,
    "bert-base-cased": 108_310_272,  # session 28: the total transformers reports for the base model
    "roberta-base": 124_645_632,  # session 28: the total transformers reports for the base model
    "roberta-large": 355_359_744,  # session 28: the total transformers reports for the base model
    "t5-small": 60_506_624,  # session 28: the total transformers reports for the base model
    "t5-large": 737_668_096,  # session 28: the total transformers reports for the base model
    "bart-large": 406_291_456,  # session 28: the total transformers reports for the base model
    "bert-large-uncased": 335_141_888,
    "bloomz-7b1": 7_069_016_064,
    "chatglm3-6b": 6_243_584_000,
    "codellama-34b": 33_743_970_304,
    "codellama-7b": 6_738_546_688,  # session 30: Llama 2 7B (6,738,415,616) + 2 x 16 x 4096 vocabulary rows
    "gpt-oss-20b": 20_914_757_184,  # session 30: the model card's 20.91B
    "gpt-oss-120b": 116_829_156_672,  # session 30: the model card's 116.83B
    "deepseek-llm-7b-base": 6_910_365_696,
    "deepseek-v2-lite": 15_706_484_224,
    "deepseek-v3": 671_026_404_352,
    "falcon-40b": 41_303_293_952,
    "falcon-7b": 6_921_720_704,
    "flan-t5-large": 783_150_080,
    "gemma-2-27b": 27_227_128_320,
    "gemma-2-2b": 2_614_341_888,
    "gemma-2-9b": 9_241_705_984,
    "gemma-2b": 2_506_172_416,
    "gemma-3-12b": 11_766_034_176,
    "gemma-3-1b": 999_885_952,
    "gemma-3-27b": 27_009_346_304,
    "gemma-3-4b": 3_880_263_168,
    "gemma-7b": 8_537_680_896,
    "glm-4-9b-chat": 9_399_951_360,
    "gpt2": 124_439_808,
    "gpt2-large": 774_030_080,
    "gpt2-medium": 354_823_168,
    "gpt2-xl": 1_557_611_200,
    "llama-2-13b": 13_015_864_320,
    "llama-2-70b": 68_976_648_192,
    "llama-2-7b": 6_738_415_616,
    "llama-3-8b": 8_030_261_248,
    "llama-3-70b": 70_553_706_496,
    "llama-3.1-405b": 405_853_388_800,
    "llama-3.1-70b": 70_553_706_496,
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.2-1b": 1_235_814_400,
    "llama-3.2-3b": 3_212_749_824,
    "llama-3.3-70b": 70_553_706_496,
    "minicpm-2b-sft-bf16": 2_724_880_896,
    "mistral-7b-v0.1": 7_241_732_096,
    "mistral-7b-v0.2": 7_241_732_096,
    "mistral-7b-v0.3": 7_248_023_552,
    "mixtral-8x22b": 140_630_071_296,
    "mixtral-8x7b": 46_702_792_704,
    "mt0-xxl": 12_921_057_280,
    "mt5-base": 582_401_280,
    "phi-1_5": 1_418_270_720,
    "phi-2": 2_779_683_840,
    "phi-3-medium-4k-instruct": 13_960_238_080,
    "phi-3-mini-4k-instruct": 3_821_079_552,
    "phi-3.5-mini-instruct": 3_821_079_552,
    "phi-4": 14_659_507_200,
    "qwen-14b": 14_167_290_880,
    "qwen-1_8b": 1_836_828_672,
    "qwen-72b": 72_287_920_128,
    "qwen-7b": 7_721_324_544,
    "qwen2-0.5b": 494_032_768,  # Qwen2-0.5B model card: 0.49B; same shape as Qwen2.5-0.5B
    "qwen2-1.5b": 1_543_714_304,  # Qwen2-1.5B: same shape as Qwen2.5-1.5B
    "qwen2-7b": 7_615_616_512,
    "qwen2.5-0.5b": 494_032_768,
    "qwen2.5-1.5b": 1_543_714_304,
    "qwen2.5-14b": 14_770_033_664,
    "qwen2.5-32b": 32_763_876_352,
    "qwen2.5-3b": 3_085_938_688,
    "qwen2.5-72b": 72_706_203_648,
    "qwen2.5-7b": 7_615_616_512,
    "qwen3-0.6b": 596_049_920,
    "qwen3-1.7b": 1_720_574_976,
    "qwen3-14b": 14_768_307_200,
    "qwen3-30b-a3b": 30_532_122_624,
    "qwen3-32b": 32_762_123_264,
    "qwen3-4b": 4_022_468_096,
    "qwen3-8b": 8_190_735_360,
    "stablelm-2-1.6b": 1_644_515_328,
    "stablelm-base-alpha-3b": 3_637_321_728,
    "t0_3b": 2_849_757_184,
    "t5-base": 222_903_552,
    "tinyllama-1.1b": 1_100_048_384,
    "yi-34b": 34_388_917_248,
    "yi-6b": 6_061_035_520,
}

# A public total that differs from ``params_total`` on purpose, with the reason (none so far: every
# ``_params_published`` in the catalog is an exact text-model count).
PUBLISHED_DIFFERS: dict[str, str] = {}


def _arch(name: str) -> Architecture:
    return architecture_from_config(catalog()[name].config, name)


def test_every_catalog_model_is_pinned() -> None:
    assert sorted(EXPECTED) == sorted(catalog())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_params_total(name: str) -> None:
    assert _arch(name).params_total == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(n for n, m in catalog().items() if m.params_published))
def test_params_published(name: str) -> None:
    published = catalog()[name].params_published
    if name in PUBLISHED_DIFFERS:
        assert published != _arch(name).params_total, PUBLISHED_DIFFERS[name]
    else:
        assert published == _arch(name).params_total


@pytest.mark.parametrize("name", sorted(catalog()))
def test_catalog_entry_is_sourced(name: str) -> None:
    entry = catalog()[name]
    assert entry.source, "every catalog file needs _source"
    assert entry.hf_ids, "every catalog file needs _hf_ids"
    assert name == name.lower()


# ---- hand-derived formulas per family -----------------------------------------------------------------
def _dense_llama(h: int, layers: int, heads: int, kv: int, head_dim: int, inter: int, vocab: int, tied: bool,
                 qkv_bias: bool = False, qk_norm: bool = False, norms_per_layer: int = 2) -> int:
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2 + (heads + 2 * kv) * head_dim * qkv_bias
    mlp = 3 * h * inter
    norms = (norms_per_layer * layers + 1) * h + (2 * head_dim * layers if qk_norm else 0)
    return layers * (attn + mlp) + norms + vocab * h * (1 if tied else 2)


@pytest.mark.parametrize(("name", "expected"), [
    ("llama-3.3-70b", _dense_llama(8192, 80, 64, 8, 128, 28672, 128256, False)),
    ("mistral-7b-v0.3", _dense_llama(4096, 32, 32, 8, 128, 14336, 32768, False)),
    ("qwen2.5-7b", _dense_llama(3584, 28, 28, 4, 128, 18944, 152064, False, qkv_bias=True)),
    ("qwen2.5-0.5b", _dense_llama(896, 24, 14, 2, 64, 4864, 151936, True, qkv_bias=True)),
    ("qwen3-8b", _dense_llama(4096, 36, 32, 8, 128, 12288, 151936, False, qk_norm=True)),
    ("qwen3-0.6b", _dense_llama(1024, 28, 16, 8, 128, 3072, 151936, True, qk_norm=True)),
    ("gemma-3-1b", _dense_llama(1152, 26, 4, 1, 256, 6912, 262144, True, qk_norm=True, norms_per_layer=4)),
    ("gemma-3-27b",
     _dense_llama(5376, 62, 32, 16, 128, 21504, 262208, True, qk_norm=True, norms_per_layer=4)),
    ("gemma-2-27b", _dense_llama(4608, 46, 32, 16, 128, 36864, 256000, True, norms_per_layer=4)),
    ("phi-4", _dense_llama(5120, 40, 40, 10, 128, 17920, 100352, False)),
    ("yi-6b", _dense_llama(4096, 32, 32, 4, 128, 11008, 64000, False)),
])
def test_dense_formula(name: str, expected: int) -> None:
    assert _arch(name).params_total == expected


def test_mixtral_experts_and_active_params() -> None:
    arch = _arch("mixtral-8x7b")
    h, layers, inter, vocab = 4096, 32, 14336, 32000
    attn = layers * (2 * h * h + 2 * h * 1024)
    experts = layers * 8 * 3 * h * inter
    router = layers * h * 8
    total = attn + experts + router + (2 * layers + 1) * h + 2 * vocab * h
    assert arch.params_total == total
    assert arch.params_active_per_token == total - experts + experts * 2 // 8
    assert (arch.num_experts, arch.num_experts_per_tok, arch.num_moe_layers) == (8, 2, 32)


def test_qwen3_moe_has_no_dense_mlp() -> None:
    arch = _arch("qwen3-30b-a3b")
    assert (arch.num_experts, arch.num_experts_per_tok, arch.moe_intermediate_size) == (128, 8, 768)
    assert arch.num_moe_layers == 48
    assert not any(g.role in ("gate_proj", "up_proj", "down_proj") and not g.expert for g in arch.linears)
    assert "q/k RMSNorm per head" in arch.notes


def test_deepseek_v2_lite_mla_and_shared_experts() -> None:
    arch = _arch("deepseek-v2-lite")
    h, layers, heads = 2048, 27, 16
    attn = layers * (h * heads * 192 + h * (512 + 64) + 512 * heads * 256 + heads * 128 * h)
    dense_mlp = 3 * h * 10944  # layer 0
    moe = 26 * (64 * 3 * h * 1408 + h * 64 + 3 * h * 2 * 1408)
    norms = (2 * layers + 1) * h + layers * 512  # + kv_a_layernorm
    assert arch.params_total == attn + dense_mlp + moe + norms + 2 * 102400 * h
    assert (arch.kv_lora_rank, arch.v_head_dim, arch.head_dim) == (512, 128, 192)
    assert arch.num_moe_layers == 26 and arch.shared_expert_intermediate_size == 2 * 1408


def test_deepseek_v3_q_lora_and_three_dense_layers() -> None:
    """671B in all (the technical report's total), of which about 37B run per token (its activated count)."""
    arch = _arch("deepseek-v3")
    h, layers, heads = 7168, 61, 128
    attn = layers * (h * 1536 + 1536 * heads * 192 + h * (512 + 64) + 512 * heads * 256 + heads * 128 * h)
    dense_mlp = 3 * 3 * h * 18432  # layers 0-2
    expert = 3 * h * 2048
    moe = 58 * (256 * expert + h * 256 + expert)  # 256 routed + 1 shared, the router
    norms = (2 * layers + 1) * h + layers * (512 + 1536)  # + kv_a_layernorm and q_a_layernorm
    embeddings = 2 * 129280 * h
    assert arch.params_total == attn + dense_mlp + moe + norms + embeddings
    assert round(arch.params_total / 1e9) == 671
    # a token runs its 8 routed experts and the shared one; its input embedding is a row lookup (not counted)
    activated = attn + dense_mlp + 58 * (9 * expert + h * 256) + norms + 129280 * h
    assert round(activated / 1e9) == 37
    assert (arch.num_moe_layers, arch.num_experts, arch.num_experts_per_tok) == (58, 256, 8)


def test_stablelm2_layernorm_with_bias_and_qkv_bias() -> None:
    arch = _arch("stablelm-2-1.6b")
    assert arch.layernorm and arch.gated_mlp
    assert [g.bias for g in arch.linears if g.role in ("q_proj", "k_proj", "v_proj", "o_proj")] == [
        True, True, True, False]
    assert arch.norm_params == (2 * 24 + 1) * 2 * 2048


def test_falcon_40b_grouped_kv_two_norms() -> None:
    arch = _arch("falcon-40b")
    assert (arch.num_kv_heads, arch.norms_per_layer, arch.gated_mlp) == (8, 2, False)


def test_gemma3_text_config_is_unwrapped() -> None:
    wrapped = catalog()["gemma-3-4b"].config
    flat = dict(wrapped["text_config"])
    assert architecture_from_config(flat).params_total == architecture_from_config(wrapped).params_total
    arch = _arch("gemma-3-4b")
    assert (arch.num_layers, arch.hidden_size, arch.vocab_size, arch.norms_per_layer) == (34, 2560, 262208, 4)


def test_t5_families() -> None:
    t5 = _arch("t5-base")
    assert (t5.num_encoder_layers, t5.gated_mlp, t5.tie_word_embeddings) == (12, False, True)
    flan = _arch("flan-t5-large")
    assert (flan.num_encoder_layers, flan.gated_mlp, flan.tie_word_embeddings) == (24, True, False)
    assert _arch("mt5-base").embedding_params == 250112 * 768


# ---- lookup and resolution ----------------------------------------------------------------------------
@pytest.mark.parametrize(("query", "name"), [
    ("Qwen/Qwen2.5-7B-Instruct", "qwen2.5-7b"),
    ("qwen2.5-7b-instruct", "qwen2.5-7b"),
    ("meta-llama/Llama-3.2-1B-Instruct", "llama-3.2-1b"),
    ("llama-3.2-3b-instruct", "llama-3.2-3b"),
    ("meta-llama/Llama-3.3-70B-Instruct", "llama-3.3-70b"),
    ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
    ("google/gemma-3-27b-it", "gemma-3-27b"),
    ("Qwen/Qwen3-30B-A3B", "qwen3-30b-a3b"),
    ("deepseek-ai/DeepSeek-V2-Lite-Chat", "deepseek-v2-lite"),
    ("deepseek-ai/DeepSeek-R1", "deepseek-v3"),
    ("meta-llama/Meta-Llama-3-70B-Instruct", "llama-3-70b"),
    ("stabilityai/stablelm-2-1_6b", "stablelm-2-1.6b"),
    ("google/flan-t5-large", "flan-t5-large"),
    ("phi4", "phi-4"),
    ("Mixtral-8x22B-v0.1", "mixtral-8x22b"),
    ("  QWEN3_8B ", "qwen3-8b"),
])
def test_lookup_resolves_ids_and_aliases(query: str, name: str) -> None:
    assert lookup_model(query).name == name




def test_hf_ids_and_aliases_are_unambiguous() -> None:
    owner: dict[str, str] = {}
    for name, entry in catalog().items():
        for key in (name, *entry.aliases, *entry.hf_ids):
            norm = key.strip().lower().replace("_", "-")
            assert owner.setdefault(norm, name) == name, f"{key!r} claimed by {owner[norm]} and {name}"


def test_unknown_model_suggests_close_names() -> None:
    with pytest.raises(SpecError) as err:
        lookup_model("qwen2.5-8b")
    text = str(err.value)
    assert "unknown model 'qwen2.5-8b'" in text
    assert "did you mean" in text and "qwen2.5-7b" in text
    assert err.value.problems[0].path == "spec.model"


def test_unknown_model_without_close_names_still_hints() -> None:
    with pytest.raises(SpecError) as err:
        lookup_model("zzzz-unheard-of")
    assert "config_path" in str(err.value)


def test_resolve_catalog_name() -> None:
    resolved = resolve_model(TrainingSpec(model="Qwen/Qwen3-8B"))
    assert (resolved.label, resolved.source) == ("qwen3-8b", "catalog:qwen3-8b")
    assert resolved.params_total == EXPECTED["qwen3-8b"]


def test_resolve_inline_config() -> None:
    config = dict(catalog()["llama-3.2-1b"].config)
    resolved = resolve_model(TrainingSpec(model=ModelRef(name="my-llama", config=config)))
    assert (resolved.label, resolved.source) == ("my-llama", "inline config")
    assert resolved.params_total == EXPECTED["llama-3.2-1b"]


def test_resolve_config_path_relative_to_base_dir(tmp_path: Path) -> None:
    model_dir = tmp_path / "phi-4"
    model_dir.mkdir()
    config: dict[str, Any] = dict(catalog()["phi-4"].config)
    (model_dir / "config.json").write_text(json.dumps(config), encoding="utf-8")
    resolved = resolve_model(TrainingSpec(model=ModelRef(config_path="phi-4/config.json")), base_dir=tmp_path)
    assert resolved.label == "phi-4"
    assert resolved.source == str(model_dir / "config.json")
    assert resolved.params_total == EXPECTED["phi-4"]


def test_resolve_params_override() -> None:
    ref = ModelRef(name="gpt2", params=1.5e8)
    assert resolve_model(TrainingSpec(model=ref)).params_total == 150_000_000


def test_resolve_missing_config_path(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as err:
        resolve_model(TrainingSpec(model=ModelRef(config_path="nope/config.json")), base_dir=tmp_path)
    assert err.value.problems[0].path == "spec.model.config_path"


_SMALL: dict[str, Any] = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                          "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 1000}


@pytest.mark.parametrize(
    ("change", "path", "fragment"),
    [
        ({"num_key_value_heads": []}, "model.config.num_key_value_heads", "must be a positive integer; got []"),
        ({"num_key_value_heads": 3}, "model.config.num_key_value_heads", "must divide num_attention_heads (4)"),
        ({"head_dim": 1.5}, "model.config.head_dim", "must be a positive integer"),
        ({"intermediate_size": "x"}, "model.config.intermediate_size", "must be a positive integer"),
        ({"intermediate_size": 0}, "model.config.intermediate_size", "must be a positive integer"),
        ({"model_type": "gpt2", "n_positions": "x"}, "model.config.n_positions", "must be an integer >= 0"),
        ({"model_type": "mixtral", "num_local_experts": 1.5}, "model.config.num_local_experts", "integer >= 0"),
        ({"model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 8},
         "model.config.num_experts_per_tok", "only 4"),
        ({"model_type": "qwen2_moe", "num_experts": 4, "mlp_only_layers": "0,1"}, "model.config.mlp_only_layers",
         "list of layer indices"),
        ({"kv_lora_rank": 16, "v_head_dim": {}}, "model.config.v_head_dim", "must be a positive integer"),
        ({"model_type": "bert", "type_vocab_size": -1}, "model.config.type_vocab_size", "integer >= 0"),
        ({"model_type": "t5", "d_model": 64, "num_heads": 4, "d_ff": 128, "num_layers": 2, "d_kv": True},
         "model.config.d_kv", "must be a positive integer"),
    ],
)
def test_config_values_of_the_wrong_type_or_size_are_named(change: dict[str, Any], path: str, fragment: str) -> None:
    """Every config.json number the parameter count reads is checked where it is read: a wrong type or size is
    a SpecError naming the key, not a TypeError or a ZeroDivisionError further down."""
    with pytest.raises(SpecError) as err:
        architecture_from_config({**_SMALL, **change}, "bad")
    assert err.value.problems[0].path == path and fragment in str(err.value), str(err.value)


@pytest.mark.parametrize("content", [b"{not json", b"\xff\xfe", b'{"hidden_size": ' + b"9" * 5000 + b"}"])
def test_an_unreadable_config_path_is_a_named_error(tmp_path: Path, content: bytes) -> None:
    (tmp_path / "config.json").write_bytes(content)  # bad JSON, bad UTF-8, an int Python will not convert
    with pytest.raises(SpecError) as err:
        resolve_model(TrainingSpec(model=ModelRef(config_path="config.json")), base_dir=tmp_path)
    assert err.value.problems[0].path == "spec.model.config_path" and "cannot read" in err.value.problems[0].message


@pytest.mark.parametrize("key", ["num_hidden_layers", "num_decoder_layers"])
def test_a_layer_count_beyond_any_model_is_refused_before_walking_the_blocks(key: str) -> None:
    """A MoE config with 10**40 layers walked every block to find the MoE ones (the server hung on one request); a
    layer count above MAX_LAYERS is an input error naming the key, before any per-block bookkeeping."""
    from predictors.architecture import MAX_LAYERS

    base = "qwen3-30b-a3b" if key == "num_hidden_layers" else "t5-base"
    config = dict(catalog()[base].config)
    for layers in (10**40, MAX_LAYERS + 1):
        with pytest.raises(SpecError) as info:
            architecture_from_config({**config, key: layers})
        assert f"model.config.{key}" in str(info.value) and "beyond any trainable model" in str(info.value)
    assert architecture_from_config({**config, key: 4}).params_total > 0


@pytest.mark.parametrize(("base", "key"), [
    ("bert-base-uncased", "num_attention_heads"),  # BERT's head count does not enter the parameter count
    ("qwen3-30b-a3b", "intermediate_size"),  # every block MoE: the dense MLP width is not in the count
    ("deepseek-v2-lite", "q_lora_rank"),  # in the count: 10**400 parameters could not be formatted as 1e400
])
def test_a_config_size_beyond_any_model_is_a_named_error(base: str, key: str) -> None:
    """Config sizes that escaped the parameter cap (BERT's heads, the unused dense width of an all-MoE model) made the
    activation terms infinite, and a parameter count past float's range could not be written in the cap's message:
    each was an OverflowError traceback from `predict` and `place`. Every size a config gives is capped as the
    parameter count is, and the error names the key."""
    config = dict(catalog()[base].config)
    for value in (10**300, 10**400, 10**15 + 1):  # the last just above architecture.MAX_CONFIG_VALUE
        with pytest.raises(SpecError) as info:
            predict(TrainingSpec(model=ModelRef(config={**config, key: value}), attention="eager", gpu="H100-80GB"))
        assert info.value.problems[0].path == f"model.config.{key}", str(info.value)
        assert "beyond any trainable model" in str(info.value)
    assert predict(TrainingSpec(model=ModelRef(config=config), gpu="H100-80GB")).vram.peak_vram_bytes > 0


def test_config_switches_as_strings_are_read_as_written() -> None:
    """A quoted "false" (easy in a YAML spec's inline config) was any non-empty string, so true: Llama-3.1-8B's head
    tied, 7.50B parameters instead of 8.03B, with no error. Now "true"/"false" mean what they say and anything else
    names the key."""
    import pytest

    from predictors.architecture import architecture_from_config
    from predictors.errors import SpecError

    cfg = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256}
    untied = architecture_from_config({**cfg, "tie_word_embeddings": False})
    assert architecture_from_config({**cfg, "tie_word_embeddings": "false"}).params_total == untied.params_total
    assert architecture_from_config({**cfg, "tie_word_embeddings": "True"}).tie_word_embeddings is True
    with pytest.raises(SpecError, match="tie_word_embeddings"):
        architecture_from_config({**cfg, "tie_word_embeddings": "no"})


@pytest.mark.parametrize(("hf_id", "base"), [
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-7B", "qwen2.5-7b"), ("Qwen/Qwen2.5-Math-7B", "qwen2.5-7b"),
    ("Qwen/Qwen2.5-Coder-7B-Instruct", "qwen2.5-7b"), ("deepseek-ai/DeepSeek-R1-Distill-Qwen-14B", "qwen2.5-14b"),
    ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "qwen2.5-32b"), ("Qwen/Qwen2.5-Coder-32B", "qwen2.5-32b"),
])
def test_the_common_rl_bases_resolve_to_their_shapes(hf_id: str, base: str) -> None:
    """open-r1's and most R1-style RL recipes start from R1-Distill-Qwen or Qwen2.5-Math/Coder checkpoints, which the
    catalog refused (no "did you mean"); they have their Qwen2.5 base's shapes (7,615,616,512 parameters for the 7B)."""
    from predictors.catalog import resolve_model
    from predictors.spec import TrainingSpec

    got = resolve_model(TrainingSpec.model_validate({"model": hf_id})).architecture.params_total
    assert got == resolve_model(TrainingSpec.model_validate({"model": base})).architecture.params_total
