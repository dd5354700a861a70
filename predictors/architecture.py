"""Model architectures read from Hugging Face ``config.json`` fields, with exact parameter counts.

One canonical shape serves every family: a list of linear-layer groups (with Llama-style role names, so
that LoRA ``target_modules`` and quantization can be applied uniformly) plus the parameters that are not
linear weights (embeddings, norms, position tables). Families differ only in how their config maps onto
that shape (:func:`architecture_from_config`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import Any

from predictors.errors import SpecError

# Output width of the classification head a classification task puts on a decoder (transformers'
# num_labels default, 2; the head is hidden x labels either way, a rounding error next to the LM head).
CLASSIFICATION_LABELS = 2
CLASSIFICATION_TASKS = ("seq-classification", "token-classification")

# Llama-style role names used by LoRA target_modules (see shared TRAINING_SPEC / reference README).
ATTENTION_ROLES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_ROLES = ("gate_proj", "up_proj", "down_proj")

# Families whose MLP is gated (SwiGLU / GeGLU: three matrices).
_GATED = {
    "llama", "mistral", "mixtral", "qwen", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma", "gemma2",
    "gemma3", "gemma3_text", "phi3", "chatglm", "glm", "glm4", "minicpm", "yi", "deepseek", "deepseek_v2",
    "deepseek_v3", "internlm", "internlm2", "baichuan", "olmo", "olmo2", "cohere", "granite", "stablelm",
    "starcoder2_gated", "phimoe", "dbrx", "jamba", "nemotron_gated",
    # OlmoeMLP / expert gate_up_proj (transformers models/olmoe/modeling_olmoe.py); EXAONE-3 c_fc_0 / c_fc_1 / c_proj
    # (LGAI-EXAONE modeling_exaone.py); XVERSE and Aquila are LLaMA copies (xverse/XVERSE-7B modeling_xverse.py,
    # BAAI/Aquila-7B modeling_aquila.py: gate/up/down_proj)
    "olmoe", "exaone", "xverse", "aquila",
    # GptOssExperts gate_up_proj (transformers models/gpt_oss/modeling_gpt_oss.py: a gated SwiGLU-style expert)
    "gpt_oss",
}
# Families whose linear layers all carry biases (GPT-2, BERT, BLOOM, GPT-NeoX, Phi-1/2, OPT, StarCoder2).
_ALL_BIAS = {"gpt2", "bert", "roberta", "bloom", "gpt_neox", "phi", "opt", "gpt_bigcode", "starcoder2", "gptj"}
# Families normalised with LayerNorm (weight + bias) rather than RMSNorm (weight only).
_LAYERNORM = {"gpt2", "bert", "roberta", "bloom", "gpt_neox", "phi", "falcon", "opt", "gpt_bigcode",
              "starcoder2", "gptj", "stablelm",
              # nn.LayerNorm with weight and bias: GPTNeoBlock ln_1/ln_2 (models/gpt_neo/modeling_gpt_neo.py),
              # CodeGenBlock ln_1 (models/codegen/modeling_codegen.py), PersimmonDecoderLayer (models/persimmon/
              # modeling_persimmon.py), NemotronLayerNorm1P (models/nemotron/modeling_nemotron.py: a LayerNorm with
              # bias), PhimoeDecoderLayer input/post_attention_layernorm (models/phimoe/modeling_phimoe.py)
              "gpt_neo", "codegen", "persimmon", "nemotron", "phimoe"}
# LayerNorm with a weight and no bias: CohereLayerNorm (models/cohere/modeling_cohere.py), DbrxBlock norm_1/norm_2 and
# norm_f (nn.LayerNorm(bias=False), models/dbrx/modeling_dbrx.py), MptBlock norm_1/norm_2 with config.no_bias (bias
# set to None, models/mpt/modeling_mpt.py; handled where MPT's no_bias is read)
_LAYERNORM_NO_BIAS = {"cohere", "dbrx"}
# OlmoLayerNorm has neither weight nor bias (F.layer_norm without affine, models/olmo/modeling_olmo.py)
_NORM_WITHOUT_PARAMS = {"olmo"}
# Models without attention layers: state-space (Mamba, Mamba-2, FalconMamba) and RNN (RWKV, xLSTM) stacks
_SSM_ONLY = {"mamba", "mamba2", "falcon_mamba", "rwkv", "rwkv5", "rwkv6", "xlstm"}
# Hybrid stacks that interleave attention with state-space / linear-recurrent layers (Jamba, Zamba, Bamba,
# Nemotron-H, Falcon-H1, Granite-4 hybrid, RecurrentGemma, LFM2, Qwen3-Next, Kimi-Linear): the canonical shape has
# no place for the recurrent layers, so they are sized as attention blocks and the prediction says so
_HYBRID_SSM = {"jamba", "zamba", "zamba2", "bamba", "nemotron_h", "falcon_h1", "granitemoehybrid", "recurrent_gemma",
               "lfm2", "lfm2_moe", "qwen3_next", "kimi_linear", "olmo_hybrid", "bailing_hybrid"}
# Decoder families this module has read the modeling code of (the rest get the generic decoder, with a warning).
_KNOWN_DECODERS = {
    *_GATED, *_ALL_BIAS, *_LAYERNORM, *_LAYERNORM_NO_BIAS, *_NORM_WITHOUT_PARAMS, "refinedwebmodel", "qwen2_moe",
    "mpt", "olmo2",
} - _HYBRID_SSM
# config-class defaults of the activation when config.json names none (GPT2Config.activation_function,
# GPTJConfig / GPTNeoConfig / CodeGenConfig / PhiConfig hidden_act or activation_function; LlamaConfig and most
# decoders: silu)
_ACTIVATION_DEFAULT = {"gpt2": "gelu_new", "gptj": "gelu_new", "gpt_neo": "gelu_new", "codegen": "gelu_new",
                       "phi": "gelu_new", "gemma": "gelu_pytorch_tanh", "gemma2": "gelu_pytorch_tanh",
                       "gemma3": "gelu_pytorch_tanh", "gemma3_text": "gelu_pytorch_tanh", "falcon": "gelu",
                       "bloom": "gelu", "opt": "relu", "gpt_neox": "gelu", "gpt_bigcode": "gelu_pytorch_tanh",
                       "starcoder2": "gelu_pytorch_tanh", "mpt": "gelu", "persimmon": "relu2", "nemotron": "relu2"}
# config-class defaults of tie_word_embeddings when config.json has no key (transformers' classes).
_TIE_DEFAULT = {"gemma": True, "gemma2": True, "gemma3": True, "gemma3_text": True, "gpt2": True,
                "bert": True, "roberta": True, "bloom": True, "falcon": True, "minicpm": True, "t5": True,
                "mt5": False, "opt": True, "gpt_bigcode": True, "starcoder2": True,
                # CohereConfig / GPTNeoConfig / MptConfig default tie_word_embeddings=True (MptForCausalLM
                # _tied_weights_keys ties lm_head to transformer.wte; models/*/configuration_*.py)
                "cohere": True, "gpt_neo": True, "mpt": True,
                # BartForConditionalGeneration / MBart tie lm_head to the shared embedding
                "bart": True, "mbart": True}


@dataclass(frozen=True)
class LinearGroup:
    """``count`` identical linear layers of one role across the whole model."""

    role: str  # q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head, router, other
    in_features: int
    out_features: int
    count: int
    bias: bool = False
    expert: bool = False  # a routed MoE expert: only ``experts_per_tok`` of ``num_experts`` run per token
    tied: bool = False  # shares its weight with the input embedding (no parameters of its own)

    @property
    def weight_params(self) -> int:
        return 0 if self.tied else self.in_features * self.out_features * self.count

    @property
    def bias_params(self) -> int:
        return 0 if self.tied or not self.bias else self.out_features * self.count

    @property
    def params(self) -> int:
        return self.weight_params + self.bias_params


@dataclass(frozen=True)
class Architecture:
    """The numbers of a transformer that memory and FLOPs depend on."""

    name: str
    model_type: str
    hidden_size: int
    num_layers: int  # blocks that see the full sequence: decoder blocks, or encoder blocks if encoder-only
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # per-branch width of a dense MLP
    gated_mlp: bool
    vocab_size: int
    tie_word_embeddings: bool
    linears: tuple[LinearGroup, ...]
    embedding_params: int  # input token embeddings (+ learned position / token-type tables)
    norm_params: int  # all norm weights and biases
    other_params: int = 0  # anything else (relative position buckets, MoE shared-expert gates, ...)
    num_encoder_layers: int = 0  # encoder blocks of an encoder-decoder model
    is_encoder_only: bool = False
    norms_per_layer: int = 2
    qk_norm: bool = False  # an RMSNorm over each head of q and k (Qwen3, Gemma 3, OLMo 2)
    layernorm: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_moe_layers: int = 0
    shared_expert_intermediate_size: int = 0
    kv_lora_rank: int = 0  # multi-head latent attention (DeepSeek-V2/V3); 0 otherwise
    v_head_dim: int = 0
    max_position_embeddings: int = 0
    # Gemma 2's tanh soft-capping of the attention scores (config attn_logit_softcapping): in eager attention the
    # tanh keeps its s x s output for backward
    attn_logit_softcapping: bool = False
    # Gemma 2's soft-capping of the output logits (config final_logit_softcapping: tanh(logits / cap) * cap)
    final_logit_softcapping: bool = False
    # the MLP's activation function as config.json names it (hidden_act / activation_function / dense_act_fn);
    # what it keeps for backward differs (see vram._activation_function_bytes)
    activation: str = ""
    # dropout probabilities the config states (None: the family's usual training default, vram._dropout): attention
    # dropout keeps a mask of eager attention's scores, hidden (residual) dropout a mask per block output
    attention_dropout: float | None = None
    hidden_dropout: float | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    # what a prediction for this model must say (an unknown family sized by the generic decoder)
    warnings: tuple[str, ...] = field(default_factory=tuple)

    # ---- counts ------------------------------------------------------------------------------------
    @property
    def is_encoder_decoder(self) -> bool:
        return self.num_encoder_layers > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @cached_property
    def linear_params(self) -> int:
        return sum(g.params for g in self.linears)

    @cached_property
    def params_total(self) -> int:
        return self.linear_params + self.embedding_params + self.norm_params + self.other_params

    @cached_property
    def params_active_per_token(self) -> int:
        """Parameters a token passes through (MoE: only the routed top-k experts)."""
        total = self.params_total
        if not self.is_moe:
            return total
        expert = sum(g.params for g in self.linears if g.expert)
        return total - expert + expert * self.num_experts_per_tok // self.num_experts

    def for_task(self, task: str) -> Architecture:
        """The model with the head ``task`` puts on it: a classification task replaces the vocab-sized LM head
        by a ``hidden x CLASSIFICATION_LABELS`` one (transformers' ``*ForSequenceClassification.score`` /
        ``*ForTokenClassification.classifier``); any other task, or a model without an LM head, is unchanged."""
        if task not in CLASSIFICATION_TASKS or self.lm_head is None:
            return self
        return self._classification_head

    @cached_property
    def _classification_head(self) -> Architecture:
        head = self.lm_head
        assert head is not None
        classifier = LinearGroup("classifier", self.hidden_size, CLASSIFICATION_LABELS, 1)
        return replace(self, linears=tuple(classifier if g is head else g for g in self.linears))

    @cached_property
    def lm_head(self) -> LinearGroup | None:
        return next((g for g in self.linears if g.role == "lm_head"), None)

    @cached_property
    def body_linear_params(self) -> int:
        """Weights and biases of every linear layer but the output head."""
        return sum(g.weight_params + g.bias_params for g in self.linears if g.role != "lm_head")

    def quantizable_params(self) -> int:
        return self._quantizable_params

    @cached_property
    def _quantizable_params(self) -> int:
        """Weights a 4/8-bit loader quantizes: every linear weight except the output head.

        bitsandbytes keeps ``lm_head`` in the compute dtype (``llm_int8_skip_modules`` defaults to the
        output embedding; transformers' ``get_keys_to_not_convert``); embeddings and norms are not linear.
        """
        return sum(g.weight_params for g in self.linears if g.role != "lm_head")

    @cached_property
    def _lora_groups_memo(self) -> dict[tuple[str, ...] | str, tuple[LinearGroup, ...]]:
        return {}

    def lora_groups(self, target_modules: list[str] | str) -> tuple[LinearGroup, ...]:
        """The linear groups a LoRA adapter attaches to (memoised: the predictors ask several times per
        prediction)."""
        key = target_modules if isinstance(target_modules, str) else tuple(target_modules)
        memo = self._lora_groups_memo
        hit = memo.get(key)
        if hit is None:
            if target_modules == "all-linear":
                # PEFT's "all-linear": every linear layer except the output layer.
                hit = tuple(g for g in self.linears if g.role not in ("lm_head", "router"))
            else:
                found: list[LinearGroup] = []
                patterns = 0
                for name in target_modules:
                    if set(name) & _REGEX_CHARS:
                        patterns += 1
                        if patterns <= _MAX_PATTERNS:
                            found += [g for g in self._pattern_groups(name) if g not in found]
                        continue
                    if name in FUSED_MODULES:
                        # one adapter on the fused projection (GPT-2 c_attn, Falcon query_key_value): in x the
                        # parts' outputs together, as the role the parts have in this canonical shape
                        parts = [g for g in self.linears if g.role in FUSED_MODULES[name]]
                        if parts:
                            found.append(LinearGroup(name, parts[0].in_features, sum(g.out_features for g in parts),
                                                     parts[0].count, expert=parts[0].expert))
                        continue
                    roles = _MULTI_ROLE_ALIASES.get(name) or (_ROLE_ALIASES.get(name, name),)
                    found += [g for g in self.linears if g.role in roles and g not in found]
                hit = tuple(found)
            memo[key] = hit
        return hit

    def _pattern_groups(self, name: str) -> list[LinearGroup]:
        """The linear groups a regular-expression target adapts: every block's, or a layer-restricted share."""
        layers = max(self.num_layers, 1)
        groups: list[LinearGroup] = []
        for role, hit in _pattern_layers(name, layers):
            for g in self.linears:
                if g.role == role:
                    groups.append(g if hit >= layers else replace(g, count=max(1, round(g.count * hit / layers))))
        return groups

    def lora_roles(self, target_modules: list[str] | str) -> set[str]:
        """The canonical roles whose inputs a LoRA adapter on ``target_modules`` reads (fused ones split)."""
        return {role for g in self.lora_groups(target_modules) for role in FUSED_MODULES.get(g.role, (g.role,))}


def saved_module_params(arch: Architecture, modules: list[str]) -> dict[str, int]:
    """Parameters of the full trainable copy PEFT's ``modules_to_save`` makes of each named module, by role.

    The copy of the token embedding and of the output head is ``vocab x hidden`` each, also when the model ties
    them: the copy is a module of its own (learned position tables are not part of ``embed_tokens``).
    """
    table = arch.vocab_size * arch.hidden_size
    return {role: table for role in modules if role in ("embed_tokens", "lm_head")}


# Fused projections of other families, which PEFT adapts as one module: their parts in the canonical shape
# (GPT-2 c_attn, Falcon/BLOOM/GPT-NeoX/ChatGLM query_key_value, Phi-3 qkv_proj and gate_up_proj, Baichuan
# W_pack, MPT Wqkv).
FUSED_MODULES: dict[str, tuple[str, ...]] = {
    "c_attn": ATTENTION_ROLES[:3], "query_key_value": ATTENTION_ROLES[:3], "qkv_proj": ATTENTION_ROLES[:3],
    "W_pack": ATTENTION_ROLES[:3], "Wqkv": ATTENTION_ROLES[:3], "gate_up_proj": ("gate_proj", "up_proj"),
}
# A name that two different layers carry (GPT-2's attention and MLP output projections are both c_proj).
_MULTI_ROLE_ALIASES: dict[str, tuple[str, ...]] = {"c_proj": ("o_proj", "down_proj")}
# Other names users write for the roles (HF module names of other families).
_ROLE_ALIASES = {
    "query": "q_proj", "key": "k_proj", "value": "v_proj", "q": "q_proj", "k": "k_proj", "v": "v_proj",
    "o": "o_proj", "wq": "q_proj", "wk": "k_proj", "wv": "v_proj", "wo": "o_proj", "out_proj": "o_proj",
    "output_proj": "o_proj",  # torchtune's attention output projection
    "dense": "o_proj", "w1": "gate_proj", "w3": "up_proj", "w2": "down_proj", "wi_0": "gate_proj",
    "wi_1": "up_proj", "wi": "up_proj", "fc1": "up_proj", "fc2": "down_proj", "c_fc": "up_proj",
    "dense_h_to_4h": "up_proj", "dense_4h_to_h": "down_proj", "output": "lm_head", "embed_out": "lm_head",
}


# A target written as a regular expression over module paths, as PEFT takes a string target_modules (re.fullmatch
# against each module's full name; axolotl's multimodal docs write 'model.language_model.layers.[\d]+.(mlp|
# self_attn).(up|down|gate|q|k|v|o)_proj'): matched against the paths a Llama-style block's linears have under the
# common layouts (attention roles under attention blocks, MLP roles under MLP blocks), layer by layer, so that a
# pattern restricted to some layers adapts only those.
_REGEX_CHARS = frozenset("[](){}|*+?\\^$")
_PATH_PREFIXES = ("model.layers", "model.language_model.layers", "language_model.model.layers", "model.model.layers")
_ATTENTION_BLOCKS = ("self_attn", "attn", "attention", "self_attention", "cross_attn")
_MLP_BLOCKS = ("mlp", "feed_forward", "block_sparse_moe")
# What an expression from a spec may be before it is run (a spec reaches the webhook from any user, and Python's re
# backtracks): at most this long, no quantified group ("(a+)+", "(?:x)*"), at most two unbounded quantifiers (the
# work grows as the path's length to their number), no repeat count past this.
_MAX_PATTERN_CHARS = 300
_MAX_UNBOUNDED = 2  # *, + and {m,n} with n past _SMALL_REPEAT (a module path is short: that is unbounded there)
_MAX_QUANTIFIERS = 4  # of any kind (each ? doubles the ways to match)
_MAX_PATTERNS = 4  # expressions a spec's targets may hold: the rest match nothing
_MAX_WAYS = 5000  # two unbounded quantifiers and a ? at most: a pattern then costs well under a second
_SMALL_REPEAT = 9
_QUANTIFIED_GROUP = re.compile(r"\)[*+?{]")
_QUANTIFIERS = re.compile(r"(?<!\\)[*+?]|\{(\d*)(,?)(\d*)\}")


def _safe_pattern(name: str) -> re.Pattern[str] | None:
    """``name`` compiled when it may be run against module paths (see :data:`_MAX_UNBOUNDED`), else None."""
    if len(name) > _MAX_PATTERN_CHARS or _QUANTIFIED_GROUP.search(name):
        return None
    quantifiers = list(_QUANTIFIERS.finditer(name))
    unbounded = sum(1 for m in quantifiers if m.group(0) in ("*", "+") or (
        m.group(0).startswith("{") and (
            (m.group(2) and not m.group(3)) or int(m.group(3) or m.group(1) or 0) > _SMALL_REPEAT)))
    if len(quantifiers) > _MAX_QUANTIFIERS or unbounded > _MAX_UNBOUNDED:
        return None
    # the ways a path of ~45 characters can be matched: each unbounded quantifier ~45, each {m,n} n + 1, each ? 2
    ways = 1
    for m in quantifiers:
        text = m.group(0)
        if text in ("*", "+") or (text.startswith("{") and m.group(2) and not m.group(3)):
            ways *= 45
        elif text == "?":
            ways *= 2
        else:
            ways *= int(m.group(3) or m.group(1) or 0) + 1
    if ways > _MAX_WAYS:
        return None
    try:
        return re.compile(name)
    except (re.error, OverflowError, RecursionError, ValueError):
        return None


@lru_cache(maxsize=256)
def _pattern_layers(name: str, layers: int) -> tuple[tuple[str, int], ...]:
    """Each canonical role the expression ``name`` matches, with the number of the ``layers`` blocks it matches in
    (the layout that matches most); empty when it matches none or may not be run."""
    pattern = _safe_pattern(name)
    if pattern is None:
        return ()
    # a pattern that names no digit matches every layer alike: one layer tells; else each layer is tried
    by_layer = bool(re.search(r"\\d|\[[^\]]*[0-9]|[0-9]", name))
    indices = range(layers) if by_layer else range(1)
    out: list[tuple[str, int]] = []
    for role in (*ATTENTION_ROLES, *MLP_ROLES):
        blocks = _ATTENTION_BLOCKS if role in ATTENTION_ROLES else _MLP_BLOCKS
        best = 0
        for prefix in _PATH_PREFIXES:
            for block in blocks:
                hit = sum(1 for i in indices if pattern.fullmatch(f"{prefix}.{i}.{block}.{role}"))
                best = max(best, hit if by_layer else hit * layers)
            if best == layers:
                break
        if best:
            out.append((role, best))
    return tuple(out)


def _get(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        value = cfg.get(key)
        if value is not None:
            return value
    return default


# Far above any published model's block count (a few hundred); beyond it a config is a typo, and the per-layer
# bookkeeping (which blocks are MoE, which are checkpointed) would walk that many blocks one by one.
MAX_LAYERS = 100_000
# Any size a config gives (heads, widths, experts, vocabulary): as MAX_PARAMS. A size that does not enter the parameter
# count (BERT's head count, the dense MLP width of a model whose every block is MoE) escaped that cap, and 10^300 made
# the activation terms infinite (an OverflowError traceback instead of an error naming the key).
MAX_CONFIG_VALUE = 10**15


def _flag(cfg: dict[str, Any], key: str, default: bool) -> bool:
    """A config switch: a JSON boolean, 0/1, or the strings true/false (a YAML config quotes them easily: "false" was
    read as true, as any non-empty string is, tying Llama-3.1-8B's head and losing 0.5B parameters); ``default`` when
    unset; anything else is an error naming the key."""
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise SpecError.one(f"model.config.{key}", f"must be true or false; got {value!r}")


def _need(cfg: dict[str, Any], name: str, *keys: str, maximum: int = MAX_CONFIG_VALUE) -> int:
    value = _get(cfg, *keys)
    if value is None:
        raise SpecError.one(
            f"model.config.{keys[0]}", f"is missing (needed to size {name})",
            f"add `{keys[0]}` to the config (also accepted: {', '.join(keys[1:]) or 'no alias'})",
        )
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise SpecError.one(f"model.config.{keys[0]}", f"must be a positive integer; got {value!r}")
    _at_most(keys[0], value, maximum)
    return value


def _at_most(key: str, value: int, maximum: int) -> None:
    if value > maximum:
        raise SpecError.one(f"model.config.{key}", f"is {value:,}, beyond any trainable model (at most {maximum:,})",
                            "check the config's layer counts" if maximum == MAX_LAYERS else "check the config's sizes")


def _int(cfg: dict[str, Any], *keys: str, default: int, minimum: int = 1, maximum: int = MAX_CONFIG_VALUE) -> int:
    """The first of ``keys`` that is set, as a whole number of at least ``minimum`` (and at most ``maximum``);
    ``default`` when none is set (a config value of the wrong type or size is an error naming the key, not a crash
    or a hang further down)."""
    for key in keys:
        value = cfg.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise SpecError.one(f"model.config.{key}", f"must be {kind}; got {value!r}")
        _at_most(key, value, maximum)
        return value
    return default


# Far above any model trained so far (the largest published are a few 10^12); beyond it a config is a typo,
# and byte counts leave the range where float arithmetic keeps allocated <= reserved <= device.
MAX_PARAMS = 10**15


def architecture_from_config(config: dict[str, Any], name: str = "custom") -> Architecture:
    """Build an :class:`Architecture` from Hugging Face ``config.json`` fields (native names accepted)."""
    arch = _architecture_from_config(config, name)
    if arch.params_total > MAX_PARAMS:
        # an int past float's range (10^400 from a 401-digit value) cannot take the `g` format: its exponent only
        total = arch.params_total
        shown = f"{total:.3g}" if total < 1e300 else f"about 1e{math.floor(math.log10(total))}"
        raise SpecError.one("model.config", f"describes {shown} parameters, beyond any trainable "
                            f"model (at most {MAX_PARAMS:.0e})", "check hidden_size, num_hidden_layers, "
                            "intermediate_size and vocab_size")
    return arch


def _architecture_from_config(config: dict[str, Any], name: str) -> Architecture:
    if not isinstance(config, dict):
        raise SpecError.one("model.config", "must be a mapping of config.json fields")
    cfg = {k: v for k, v in config.items() if not str(k).startswith("_")}
    if isinstance(cfg.get("text_config"), dict):  # multimodal wrappers (Gemma 3, Llava): the text stack
        merged = dict(cfg["text_config"])
        merged.setdefault("model_type", cfg.get("model_type", ""))
        cfg = merged
    model_type = str(cfg.get("model_type") or "llama").lower()
    if model_type in _SSM_ONLY:
        raise SpecError.one(
            "model.config.model_type", f"is {model_type!r}, a state-space / recurrent model without attention layers: "
            "vramfit cannot size it", "vramfit models transformer stacks (attention + MLP blocks) only")
    if model_type in ("mt5", "t5", "umt5"):
        arch = _t5(cfg, name, model_type)
    elif model_type in ("bart", "mbart"):
        arch = _bart(cfg, name, model_type)
    elif model_type in ("bert", "roberta", "xlm-roberta", "deberta", "distilbert", "deberta-v2", "electra"):
        arch = _bert(cfg, name, model_type)
    else:
        arch = _decoder(_dbrx_flat(cfg) if model_type == "dbrx" else cfg, name, model_type)
    attention, hidden = _stated_dropout(cfg, _ATTENTION_DROPOUT_KEYS), _stated_dropout(cfg, _HIDDEN_DROPOUT_KEYS)
    if attention is None and hidden is None:
        return arch
    return replace(arch, attention_dropout=attention, hidden_dropout=hidden)


# config.json's dropout probabilities, by the names the families give them: attention (Llama/Mistral/Qwen2/OPT/BART/
# DistilBERT/Falcon/BLOOM attention_dropout, GPT-2/GPT-J/Phi attn_pdrop, BERT/RoBERTa attention_probs_dropout_prob,
# Qwen 1 attn_dropout_prob, T5 dropout_rate) and hidden/residual (BLOOM/Falcon hidden_dropout, GPT-2/GPT-J/Phi
# resid_pdrop, BERT hidden_dropout_prob, OPT/BART/DistilBERT dropout, T5 dropout_rate)
_ATTENTION_DROPOUT_KEYS = ("attention_dropout", "attn_pdrop", "attention_probs_dropout_prob", "attn_dropout_prob",
                           "dropout_rate")
_HIDDEN_DROPOUT_KEYS = ("hidden_dropout", "resid_pdrop", "hidden_dropout_prob", "dropout", "dropout_rate")


def _stated_dropout(cfg: dict[str, Any], keys: tuple[str, ...]) -> float | None:
    """The largest of the dropout probabilities ``cfg`` states under ``keys`` (None when it states none)."""
    found: list[float] = []
    for key in keys:
        value = cfg.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
            raise SpecError.one(f"model.config.{key}", f"must be a dropout probability in [0, 1); got {value!r}")
        found.append(float(value))
    return max(found) if found else None


def _dbrx_flat(cfg: dict[str, Any]) -> dict[str, Any]:
    """DBRX keeps its attention and MoE sizes in nested ``attn_config`` / ``ffn_config`` (DbrxAttentionConfig /
    DbrxFFNConfig in transformers models/dbrx/configuration_dbrx.py, defaults kv_n_heads=1, ffn_hidden_size=3584,
    moe_num_experts=4, moe_top_k=1): lift them to the flat names the decoder reads."""
    attn, ffn = cfg.get("attn_config") or {}, cfg.get("ffn_config") or {}
    for key, value in (("attn_config", attn), ("ffn_config", ffn)):
        if not isinstance(value, dict):
            raise SpecError.one(f"model.config.{key}", f"must be a mapping; got {value!r}")
    flat = dict(cfg)
    flat.setdefault("num_key_value_heads", attn.get("kv_n_heads", 1))
    flat.setdefault("intermediate_size", ffn.get("ffn_hidden_size", 3584))
    flat.setdefault("num_local_experts", ffn.get("moe_num_experts", 4))
    flat.setdefault("num_experts_per_tok", ffn.get("moe_top_k", 1))
    return flat


def _decoder(cfg: dict[str, Any], name: str, model_type: str) -> Architecture:
    h = _need(cfg, "the hidden size", "hidden_size", "n_embd", "d_model", "dim")
    layers = _need(cfg, "the layer count", "num_hidden_layers", "n_layer", "num_layers", "n_layers",
                   maximum=MAX_LAYERS)
    heads = _need(cfg, "attention heads", "num_attention_heads", "n_head", "num_heads", "n_heads")
    notes: list[str] = []
    if model_type == "falcon" or model_type == "refinedwebmodel":
        if cfg.get("new_decoder_architecture"):
            kv = _int(cfg, "num_kv_heads", "num_key_value_heads", default=heads)
        elif cfg.get("multi_query", True):
            kv = 1
        else:
            kv = heads
    elif model_type == "chatglm":
        kv = _int(cfg, "multi_query_group_num", "num_key_value_heads", default=heads) if cfg.get(
            "multi_query_attention", True) else heads
    elif model_type == "gpt_bigcode":
        # GPTBigCodeConfig.multi_query defaults to True: one key/value head (num_key_value_heads = 1 if multi_query,
        # models/gpt_bigcode/configuration_gpt_bigcode.py; c_attn is hidden -> hidden + 2 * head_dim)
        kv = 1 if cfg.get("multi_query", True) else heads
    else:
        kv = _int(cfg, "num_key_value_heads", "num_kv_heads", "n_head_kv", default=heads)
    if heads % kv:
        raise SpecError.one("model.config.num_key_value_heads", f"must divide num_attention_heads ({heads}); got {kv}",
                            "grouped-query attention shares each key/value head among the same number of query heads")
    head_dim = _int(cfg, "head_dim", "kv_channels", default=max(h // heads, 1))
    vocab = _need(cfg, "the vocabulary", "padded_vocab_size", "vocab_size") if model_type == "chatglm" else \
        _need(cfg, "the vocabulary", "vocab_size", "padded_vocab_size")
    inter = _int(cfg, "intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim", default=4 * h)
    if model_type == "qwen":  # Qwen-1 stores twice the SwiGLU branch width (see reference/models/_notes)
        inter //= 2
    if model_type == "mpt":  # MPT's MLP is expansion_ratio x d_model wide (mosaicml/mpt-7b modeling_mpt.py MPTMLP)
        inter = _int(cfg, "expansion_ratio", default=4) * h
    # MPT: no_bias (MptConfig default True) drops every linear bias and the LayerNorm biases (mosaicml/mpt-7b
    # modeling_mpt.py: nn.Linear(..., bias=not no_bias); transformers models/mpt/modeling_mpt.py norm_1.bias = None)
    mpt_bias = model_type == "mpt" and not cfg.get("no_bias", True)
    gated = model_type in _GATED
    if model_type == "stablelm" and "use_parallel_residual" in cfg and cfg.get("use_qkv_bias") is None:
        gated = True
    all_bias = model_type in _ALL_BIAS
    layernorm = model_type in _LAYERNORM or model_type in _LAYERNORM_NO_BIAS or model_type in _NORM_WITHOUT_PARAMS \
        or model_type == "mpt"
    tie = _flag(cfg, "tie_word_embeddings", _TIE_DEFAULT.get(model_type, False))

    # biases on attention projections
    if model_type in ("gptj", "codegen"):
        # GPTJAttention q/k/v/out_proj and CodeGenAttention qkv_proj/out_proj have bias=False; their MLPs (fc_in,
        # fc_out) keep biases (models/gptj/modeling_gptj.py, models/codegen/modeling_codegen.py)
        qkv_bias = out_bias = False
        mlp_bias = True
    elif model_type == "gpt_neo":
        # GPTNeoSelfAttention: q/k/v_proj bias=False, out_proj bias=True; GPTNeoMLP c_fc/c_proj with bias
        # (models/gpt_neo/modeling_gpt_neo.py)
        qkv_bias, out_bias, mlp_bias = False, True, True
    elif model_type == "opt":
        # OPTAttention / OPTDecoderLayer: every projection has bias=config.enable_bias (default True)
        qkv_bias = out_bias = mlp_bias = bool(cfg.get("enable_bias", True))
    elif model_type == "persimmon":
        # PersimmonAttention query_key_value / dense and PersimmonMLP dense_h_to_4h / dense_4h_to_h: bias=True
        # (models/persimmon/modeling_persimmon.py)
        qkv_bias = out_bias = mlp_bias = True
    elif model_type == "mpt":
        qkv_bias = out_bias = mlp_bias = mpt_bias
    elif model_type in ("internlm", "internlm2"):
        # InternLM: q/k/v/o_proj bias=config.bias (internlm/internlm-7b modeling_internlm.py); InternLM2: wqkv and wo
        # bias=config.bias (internlm/internlm2-7b modeling_internlm2.py; InternLM2Config bias defaults to True); the
        # MLPs have no bias in both
        qkv_bias = out_bias = bool(cfg.get("bias", True))
        mlp_bias = False
    elif all_bias:
        qkv_bias = out_bias = mlp_bias = True
    elif model_type == "qwen" or model_type in ("qwen2", "qwen2_moe"):
        qkv_bias, out_bias, mlp_bias = True, False, False
    elif model_type == "chatglm":
        qkv_bias = bool(cfg.get("add_qkv_bias", True))
        out_bias = mlp_bias = bool(cfg.get("add_bias_linear", False))
    elif model_type == "falcon":
        qkv_bias = out_bias = mlp_bias = bool(cfg.get("bias", False))
    elif model_type == "stablelm":
        qkv_bias = bool(cfg.get("use_qkv_bias", False))
        out_bias = mlp_bias = False
    elif model_type == "gpt_oss":
        # GptOssAttention q/k/v/o_proj bias=config.attention_bias (default True); GptOssExperts keep gate_up_proj_bias
        # and down_proj_bias (models/gpt_oss/modeling_gpt_oss.py)
        qkv_bias = out_bias = bool(cfg.get("attention_bias", True))
        mlp_bias = True
    else:
        qkv_bias = bool(cfg.get("attention_bias", cfg.get("qkv_bias", False)))
        out_bias = bool(cfg.get("attention_bias", False)) if model_type not in ("qwen3",) else False
        mlp_bias = bool(cfg.get("mlp_bias", False))

    # norms per block
    if model_type == "falcon":
        per_layer_norms = 2 if cfg.get("new_decoder_architecture") else 1
    elif model_type in ("phi", "gptj", "codegen", "cohere"):
        # one norm feeding parallel attention and MLP: CodeGenBlock ln_1, CohereDecoderLayer input_layernorm
        per_layer_norms = 1
    elif model_type in ("gemma2", "gemma3", "gemma3_text"):
        per_layer_norms = 4
    else:
        per_layer_norms = 2
    norm_width = 2 * h if model_type in _LAYERNORM or mpt_bias else h
    if model_type in _NORM_WITHOUT_PARAMS or (
            model_type == "opt" and cfg.get("layer_norm_elementwise_affine") is False):
        norm_width = 0
    final_norm = 1
    if model_type == "opt" and (not cfg.get("do_layer_norm_before", True) or cfg.get("_remove_final_layer_norm")):
        # OPTDecoder has a final_layer_norm only with do_layer_norm_before and not _remove_final_layer_norm
        # (models/opt/modeling_opt.py; OPT-350m is post-norm and has none)
        final_norm = 0
    norm_params = (layers * per_layer_norms + final_norm) * norm_width
    qk_norm = model_type in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text")
    if qk_norm:
        norm_params += layers * 2 * head_dim  # q_norm and k_norm over the head dimension
        notes.append("q/k RMSNorm per head")
    elif model_type in ("olmo2", "olmoe") or (model_type == "cohere" and cfg.get("use_qk_norm")):
        # one norm over all query heads and one over all key heads: Olmo2Attention q_norm RMSNorm(heads * head_dim),
        # k_norm RMSNorm(kv * head_dim) (models/olmo2/modeling_olmo2.py; OlmoeAttention the same, models/olmoe/
        # modeling_olmoe.py); CohereAttention q_norm / k_norm CohereLayerNorm((heads, head_dim)) / ((kv, head_dim)),
        # weight only (models/cohere/modeling_cohere.py)
        qk_norm = True
        norm_params += layers * (heads + kv) * head_dim
        notes.append("q/k norm over all heads")
    elif model_type == "persimmon" and cfg.get("qk_layernorm", True):
        # PersimmonAttention q_layernorm / k_layernorm: nn.LayerNorm(head_dim) with weight and bias each
        qk_norm = True
        norm_params += layers * 4 * head_dim
        notes.append("q/k LayerNorm per head")
    if model_type == "bloom":
        norm_params += norm_width  # word_embeddings_layernorm

    # embeddings
    embedding = vocab * h
    linears: list[LinearGroup] = []
    head_in = h
    if model_type in ("gpt2", "gpt_bigcode", "opt"):
        positions = _int(cfg, "n_positions", "max_position_embeddings", default=1024, minimum=0)
        embedding += (positions + (2 if model_type == "opt" else 0)) * h
    elif model_type == "gpt_neo":  # GPTNeoModel.wpe: max_position_embeddings (default 2048) x hidden
        embedding += _int(cfg, "max_position_embeddings", default=2048, minimum=0) * h
    elif model_type == "mpt":
        attn_cfg = cfg.get("attn_config") or {}
        if cfg.get("learned_pos_emb", True) and not (isinstance(attn_cfg, dict) and attn_cfg.get("alibi", False)):
            # MPTModel.wpe exists when learned_pos_emb and not alibi (mosaicml/mpt-7b modeling_mpt.py)
            embedding += _int(cfg, "max_seq_len", default=2048, minimum=0) * h
    if model_type == "opt":
        proj = _int(cfg, "word_embed_proj_dim", default=h)
        if proj != h:
            # OPT-350m: token embeddings and the tied head are word_embed_proj_dim wide, with project_in /
            # project_out (bias=False) between them and the hidden size (OPTDecoder, models/opt/modeling_opt.py)
            embedding += (proj - h) * vocab
            linears += [LinearGroup("other", proj, h, 1), LinearGroup("other", h, proj, 1)]
            head_in = proj

    v_head = 0
    kv_lora = _int(cfg, "kv_lora_rank", default=0, minimum=0)
    if kv_lora:  # DeepSeek-V2/V3 multi-head latent attention
        q_lora = _int(cfg, "q_lora_rank", default=0, minimum=0)
        rope_d = _int(cfg, "qk_rope_head_dim", default=64)
        nope_d = _int(cfg, "qk_nope_head_dim", default=128, minimum=0)
        v_head = _int(cfg, "v_head_dim", default=128)
        head_dim = rope_d + nope_d
        if q_lora:
            linears += [LinearGroup("q_proj", h, q_lora, layers), LinearGroup("q_proj", q_lora, heads * head_dim,
                                                                                layers)]
            norm_params += layers * q_lora
        else:
            linears.append(LinearGroup("q_proj", h, heads * head_dim, layers))
        linears += [
            LinearGroup("k_proj", h, kv_lora + rope_d, layers),  # kv_a_proj_with_mqa
            LinearGroup("v_proj", kv_lora, heads * (nope_d + v_head), layers),  # kv_b_proj
            LinearGroup("o_proj", heads * v_head, h, layers),
        ]
        norm_params += layers * kv_lora
        kv = heads
        notes.append("multi-head latent attention")
    else:
        linears += [
            LinearGroup("q_proj", h, heads * head_dim, layers, qkv_bias),
            LinearGroup("k_proj", h, kv * head_dim, layers, qkv_bias),
            LinearGroup("v_proj", h, kv * head_dim, layers, qkv_bias),
            LinearGroup("o_proj", heads * head_dim, h, layers, out_bias),
        ]

    # MLP: dense layers and MoE layers
    n_experts = _int(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0, minimum=0)
    top_k = _int(cfg, "num_experts_per_tok", "moe_top_k", default=0, minimum=0)
    if n_experts and top_k > n_experts:
        raise SpecError.one("model.config.num_experts_per_tok",
                            f"routes each token to {top_k} experts, but the model has only {n_experts}")
    moe_inter = _int(cfg, "moe_intermediate_size", default=inter)
    shared_inter = 0
    moe_layers = 0
    if n_experts:
        first_dense = _int(cfg, "first_k_dense_replace", default=0, minimum=0)
        step = _int(cfg, "decoder_sparse_step", default=1)
        only_dense_layers = cfg.get("mlp_only_layers") or []
        if not isinstance(only_dense_layers, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) for i in only_dense_layers):
            raise SpecError.one("model.config.mlp_only_layers", f"must be a list of layer indices; got "
                                f"{only_dense_layers!r}")
        only_dense = set(only_dense_layers)
        if "moe_layer_freq" in cfg:
            # DeepSeek-MoE/V2/V3 count from layer 0: a block is MoE when layer_idx >= first_k_dense_replace and
            # layer_idx % moe_layer_freq == 0 (DeepseekV2DecoderLayer in deepseek-ai's modeling_deepseek.py);
            # Qwen-MoE's decoder_sparse_step counts from 1: (layer_idx + 1) % step == 0 (Qwen2MoeDecoderLayer)
            freq = _int(cfg, "moe_layer_freq", default=1)
            moe_layers = sum(1 for i in range(first_dense, layers) if i % freq == 0 and i not in only_dense)
        else:
            moe_layers = sum(1 for i in range(first_dense, layers) if (i + 1) % step == 0 and i not in only_dense)
        dense_layers = layers - moe_layers
        shared_inter = (_int(cfg, "shared_expert_intermediate_size", default=0, minimum=0)
                        or _int(cfg, "n_shared_experts", default=0, minimum=0) * moe_inter)
        linears += _mlp(h, moe_inter, moe_layers * n_experts, gated, mlp_bias, expert=True)
        # GptOssTopKRouter's linear has a bias (models/gpt_oss/modeling_gpt_oss.py); the other routers none
        linears.append(LinearGroup("router", h, n_experts, moe_layers, model_type == "gpt_oss"))
        if shared_inter:
            linears += _mlp(h, shared_inter, moe_layers, gated, mlp_bias)
            if model_type == "qwen2_moe":
                linears.append(LinearGroup("router", h, 1, moe_layers))  # shared_expert_gate
        if dense_layers:
            linears += _mlp(h, inter, dense_layers, gated, mlp_bias)
        notes.append(f"MoE: {n_experts} experts, top-{top_k}, {moe_layers} MoE layers")
    else:
        linears += _mlp(h, inter, layers, gated, mlp_bias)

    # lm_head with bias: PhiForCausalLM; GPTJForCausalLM and CodeGenForCausalLM (nn.Linear default bias=True,
    # models/gptj/modeling_gptj.py, models/codegen/modeling_codegen.py); PhimoeForCausalLM with
    # config.lm_head_bias (models/phimoe/modeling_phimoe.py)
    lm_bias = model_type in ("phi", "gptj", "codegen") or (model_type == "phimoe" and _flag(cfg, "lm_head_bias", False))
    linears.append(LinearGroup("lm_head", head_in, vocab, 1, lm_bias and not tie, tied=tie))
    other = vocab if (lm_bias and tie) else 0
    if model_type == "gpt_oss":
        other += layers * heads  # GptOssAttention.sinks: one learned logit per head
        notes.append("attention sinks (a learned logit per head)")
    return Architecture(
        name=name, model_type=model_type, hidden_size=h, num_layers=layers, num_attention_heads=heads,
        num_kv_heads=kv, head_dim=head_dim, intermediate_size=inter, gated_mlp=gated, vocab_size=vocab,
        tie_word_embeddings=tie, linears=tuple(linears), embedding_params=embedding, norm_params=norm_params,
        other_params=other, norms_per_layer=per_layer_norms, qk_norm=qk_norm, layernorm=layernorm,
        num_experts=n_experts,
        num_experts_per_tok=top_k, moe_intermediate_size=moe_inter if n_experts else 0,
        num_moe_layers=moe_layers, shared_expert_intermediate_size=shared_inter, kv_lora_rank=kv_lora,
        v_head_dim=v_head, max_position_embeddings=_int(cfg, "max_position_embeddings", "n_positions", "seq_length",
                                                         default=0, minimum=0),
        attn_logit_softcapping=_softcapping(cfg),
        final_logit_softcapping=_softcapping(cfg, "final_logit_softcapping"),
        activation=_activation_name(cfg, _ACTIVATION_DEFAULT.get(model_type, "silu")),
        notes=tuple(notes),
        warnings=_decoder_warnings(model_type, gated, layernorm, all_bias),
    )


def _decoder_warnings(model_type: str, gated: bool, layernorm: bool, all_bias: bool) -> tuple[str, ...]:
    if model_type in _HYBRID_SSM:
        return (f"model_type {model_type!r} interleaves attention with state-space / recurrent layers, which vramfit "
                "cannot represent: every layer is sized as an attention + MLP block, so the parameter count and the "
                "activation memory are not exact; pass model.params to pin the parameter count",)
    if model_type in _KNOWN_DECODERS:
        return ()
    return (f"model_type {model_type!r} is not a family vramfit knows: sized as a generic decoder from the config's "
            f"sizes ({'gated' if gated else 'plain'} MLP, {'LayerNorm' if layernorm else 'RMSNorm'}, "
            f"{'biases' if all_bias else 'no biases'}); pass model.params to pin the parameter count",)


def _activation_name(cfg: dict[str, Any], default: str = "") -> str:
    """The MLP activation's name: ``hidden_act`` (most families), ``activation_function`` (GPT-2, GPT-J),
    ``hidden_activation`` (Gemma 2/3), ``dense_act_fn`` (T5); ``default`` when none is given."""
    for key in ("hidden_activation", "hidden_act", "activation_function", "dense_act_fn"):
        value = cfg.get(key)
        if isinstance(value, str) and value:
            return value.lower()
    return default


def _softcapping(cfg: dict[str, Any], key: str = "attn_logit_softcapping") -> bool:
    """Whether attention scores (or, with ``key="final_logit_softcapping"``, the output logits) are soft-capped
    (Gemma 2: ``attn_logit_softcapping: 50.0``, ``final_logit_softcapping: 30.0``; null or absent: no)."""
    value = cfg.get(key)
    if value is None:
        return False
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise SpecError.one(f"model.config.{key}", f"must be a positive number or null; got {value!r}")
    return value > 0


def _mlp(h: int, inter: int, count: int, gated: bool, bias: bool, expert: bool = False) -> list[LinearGroup]:
    if count <= 0:
        return []
    groups = [LinearGroup("up_proj", h, inter, count, bias, expert),
              LinearGroup("down_proj", inter, h, count, bias, expert)]
    if gated:
        groups.insert(0, LinearGroup("gate_proj", h, inter, count, bias, expert))
    return groups


def _bert(cfg: dict[str, Any], name: str, model_type: str) -> Architecture:
    h = _need(cfg, "the hidden size", "hidden_size", "dim")
    layers = _need(cfg, "the layer count", "num_hidden_layers", "n_layers", maximum=MAX_LAYERS)
    heads = _need(cfg, "attention heads", "num_attention_heads", "n_heads")
    inter = _int(cfg, "intermediate_size", "hidden_dim", default=4 * h)
    vocab = _need(cfg, "the vocabulary", "vocab_size")
    positions = _int(cfg, "max_position_embeddings", default=512, minimum=0)
    types = _int(cfg, "type_vocab_size", default=2, minimum=0)
    if model_type in ("roberta", "xlm-roberta"):
        types = _int(cfg, "type_vocab_size", default=1, minimum=0)
    if model_type == "distilbert":
        types = 0  # DistilBERT's Embeddings: word and position tables only (models/distilbert/modeling_distilbert.py)
    # the base model each family's AutoModel builds: BertModel / RobertaModel add a pooler (dense hidden x hidden with
    # bias); DistilBertModel, ElectraModel and DebertaV2Model have none (models/*/modeling_*.py)
    pooler = model_type not in ("distilbert", "electra", "deberta-v2")
    # ELECTRA and DeBERTa-v2 embed at embedding_size and project to the hidden size with a Linear (bias) when it
    # differs (ElectraEmbeddings + ElectraModel.embeddings_project; DebertaV2Embeddings.embed_proj, bias=False);
    # ElectraConfig.embedding_size defaults to 128, DebertaV2Config's to hidden_size
    emb = _int(cfg, "embedding_size", default=128 if model_type == "electra" else h)
    other = 0
    norms = (2 * layers + 1) * 2 * h
    linears = [
        LinearGroup("q_proj", h, h, layers, True), LinearGroup("k_proj", h, h, layers, True),
        LinearGroup("v_proj", h, h, layers, True), LinearGroup("o_proj", h, h, layers, True),
        LinearGroup("up_proj", h, inter, layers, True), LinearGroup("down_proj", inter, h, layers, True),
    ]
    if pooler:
        linears.append(LinearGroup("other", h, h, 1, True))  # pooler dense (BertModel's default add_pooling_layer)
    if emb != h:
        linears.append(LinearGroup("other", emb, h, 1, model_type == "electra"))
    if model_type == "electra":
        norms = 2 * layers * 2 * h + 2 * emb  # ElectraEmbeddings.LayerNorm is embedding_size wide
    if model_type == "deberta-v2":
        # DebertaV2Embeddings: absolute positions only with position_biased_input (default True); the encoder's
        # rel_embeddings (position_buckets * 2 rows, or max_relative_positions * 2, max_position_embeddings when
        # < 1) with a LayerNorm when norm_rel_ebd has "layer_norm"; unshared c2p / p2c attention adds pos_key_proj /
        # pos_query_proj (hidden x hidden, bias) per layer (models/deberta_v2/modeling_deberta_v2.py)
        types = _int(cfg, "type_vocab_size", default=0, minimum=0)
        if not cfg.get("position_biased_input", True):
            positions = 0
        if cfg.get("relative_attention", False):
            buckets = _int(cfg, "position_buckets", default=-1, minimum=-1)
            span = _int(cfg, "max_relative_positions", default=-1, minimum=-1)
            # DebertaV2Encoder: max_relative_positions < 1 falls back to max_position_embeddings, whatever
            # position_biased_input says (the absolute table above may be gone)
            max_positions = _int(cfg, "max_position_embeddings", default=512, minimum=0)
            rows = 2 * buckets if buckets > 0 else 2 * (span if span >= 1 else max_positions)
            other += rows * h
            if "layer_norm" in str(cfg.get("norm_rel_ebd", "none")):
                norms += 2 * h
            pos_att = cfg.get("pos_att_type") or []
            if not cfg.get("share_att_key", False):
                for kind, role in (("c2p", "k_proj"), ("p2c", "q_proj")):
                    if kind in pos_att:
                        linears.append(LinearGroup(role, h, h, layers, True))
        if _int(cfg, "conv_kernel_size", default=0, minimum=0):
            kernel = _int(cfg, "conv_kernel_size", default=0, minimum=0)
            other += h * h * kernel + h  # ConvLayer Conv1d(hidden, hidden, kernel, groups=conv_groups=1) + bias
            norms += 2 * h
    return Architecture(
        name=name, model_type=model_type, hidden_size=h, num_layers=layers, num_attention_heads=heads,
        num_kv_heads=heads, head_dim=h // heads, intermediate_size=inter, gated_mlp=False, vocab_size=vocab,
        tie_word_embeddings=True, linears=tuple(linears),
        embedding_params=(vocab + positions + types) * emb,
        norm_params=norms, other_params=other, is_encoder_only=True, layernorm=True,
        max_position_embeddings=positions, activation=_activation_name(cfg, "gelu"),
        notes=(f"encoder-only; counts the {'model with pooler' if pooler else 'base model'}",),
    )


def _bart(cfg: dict[str, Any], name: str, model_type: str) -> Architecture:
    """BART / mBART (models/bart/modeling_bart.py, models/mbart/modeling_mbart.py): a shared token table that the
    encoder, the decoder and the LM head use; learned positions with 2 offset rows per stack; every projection with
    bias; LayerNorm (weight and bias) after the embeddings of each stack, two per encoder layer and three per decoder
    layer; mBART adds a final LayerNorm to each stack. ``final_logits_bias`` is a buffer, not a parameter."""
    h = _need(cfg, "the hidden size", "d_model", "hidden_size")
    enc_layers = _need(cfg, "the layer count", "encoder_layers", "num_hidden_layers", maximum=MAX_LAYERS)
    dec_layers = _int(cfg, "decoder_layers", default=enc_layers, maximum=MAX_LAYERS)
    heads = _need(cfg, "attention heads", "decoder_attention_heads", "encoder_attention_heads", "num_attention_heads")
    enc_ffn = _int(cfg, "encoder_ffn_dim", default=4 * h)
    dec_ffn = _int(cfg, "decoder_ffn_dim", default=enc_ffn)
    vocab = _need(cfg, "the vocabulary", "vocab_size")
    positions = _int(cfg, "max_position_embeddings", default=1024, minimum=0)
    tie = _flag(cfg, "tie_word_embeddings", True)
    attn_blocks = enc_layers + 2 * dec_layers  # encoder self, decoder self + cross
    linears = [
        LinearGroup("q_proj", h, h, attn_blocks, True), LinearGroup("k_proj", h, h, attn_blocks, True),
        LinearGroup("v_proj", h, h, attn_blocks, True), LinearGroup("o_proj", h, h, attn_blocks, True),
        *_mlp(h, enc_ffn, enc_layers, False, True), *_mlp(h, dec_ffn, dec_layers, False, True),
        LinearGroup("lm_head", h, vocab, 1, tied=tie),
    ]
    norms = (2 * enc_layers + 3 * dec_layers + 2 + (2 if model_type == "mbart" else 0)) * 2 * h
    return Architecture(
        name=name, model_type=model_type, hidden_size=h, num_layers=dec_layers, num_attention_heads=heads,
        num_kv_heads=heads, head_dim=h // heads, intermediate_size=dec_ffn, gated_mlp=False, vocab_size=vocab,
        tie_word_embeddings=tie, linears=tuple(linears), embedding_params=vocab * h + 2 * (positions + 2) * h,
        norm_params=norms, num_encoder_layers=enc_layers, layernorm=True, max_position_embeddings=positions,
        activation=_activation_name(cfg, "gelu"),
        notes=("encoder-decoder; seq_len is the encoder input, the decoder length min(seq_len, 128)",),
    )


def _t5(cfg: dict[str, Any], name: str, model_type: str) -> Architecture:
    h = _need(cfg, "the hidden size", "d_model", "hidden_size")
    enc_layers = _need(cfg, "the layer count", "num_layers", "num_hidden_layers", maximum=MAX_LAYERS)
    dec_layers = _int(cfg, "num_decoder_layers", default=enc_layers, maximum=MAX_LAYERS)
    heads = _need(cfg, "attention heads", "num_heads", "num_attention_heads")
    d_kv = _int(cfg, "d_kv", "head_dim", default=max(h // heads, 1))
    d_ff = _need(cfg, "the MLP width", "d_ff", "intermediate_size")
    vocab = _need(cfg, "the vocabulary", "vocab_size")
    proj = str(cfg.get("feed_forward_proj", "relu"))
    gated = proj.startswith("gated") or _flag(cfg, "is_gated_act", False)
    tie = _flag(cfg, "tie_word_embeddings", _TIE_DEFAULT.get(model_type, True))
    inner = heads * d_kv
    attn_blocks = enc_layers + 2 * dec_layers  # encoder self, decoder self + cross
    linears = [
        LinearGroup("q_proj", h, inner, attn_blocks), LinearGroup("k_proj", h, inner, attn_blocks),
        LinearGroup("v_proj", h, inner, attn_blocks), LinearGroup("o_proj", inner, h, attn_blocks),
        *_mlp(h, d_ff, enc_layers + dec_layers, gated, False),
        LinearGroup("lm_head", h, vocab, 1, tied=tie),
    ]
    buckets = _int(cfg, "relative_attention_num_buckets", default=32, minimum=0)
    relative = 2 * buckets * heads  # one table in the first block of each stack
    if model_type == "umt5":
        relative = (enc_layers + dec_layers) * buckets * heads
    norms = (enc_layers * 2 + dec_layers * 3 + 2) * h
    return Architecture(
        name=name, model_type=model_type, hidden_size=h, num_layers=dec_layers, num_attention_heads=heads,
        num_kv_heads=heads, head_dim=d_kv, intermediate_size=d_ff, gated_mlp=gated, vocab_size=vocab,
        tie_word_embeddings=tie, linears=tuple(linears), embedding_params=vocab * h, norm_params=norms,
        other_params=relative, num_encoder_layers=enc_layers,
        # T5Config derives dense_act_fn from feed_forward_proj (whatever config.json says): the part after the
        # last "-", except that "gated-gelu" means gelu_new
        activation="gelu_new" if proj == "gated-gelu" else proj.split("-")[-1].lower(),
        notes=("encoder-decoder; seq_len is the encoder input, the decoder length min(seq_len, 128)",),
    )
