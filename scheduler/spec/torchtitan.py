"""torchtitan jobs: ``torchrun ... -m torchtitan.train --job.config_file CONFIG.toml --section.key value ...``.

torchtitan (github.com/pytorch/torchtitan) reads a TOML job config and dotted command-line overrides of it
(``--training.local_batch_size 4``, ``--parallelism.tensor_parallel_degree=2``, ``--compile.enable``). The config
file is read when the manifest carries it (a heredoc or a ConfigMap key of that file name), then the flags, which
win. What maps to the TrainingSpec:

* ``[model] name`` + ``flavor`` (``llama3`` ``1B`` ... ``405B``, ``qwen3`` ``0.6B`` ... ``32B`` and ``30B-A3B``,
  ``deepseek_v3`` ``16B`` and ``671B``; :data:`_MODELS`): the catalog model; another flavor is named in the error
  that asks for the model (the ``vramfit.io/spec`` annotation can say which);
* ``[training] local_batch_size`` (``batch_size`` in older configs): the per-rank batch; under pipeline parallelism
  the micro-batch is ``[parallelism] pipeline_parallel_microbatch_size`` (torchtitan's default 1);
  ``global_batch_size`` (-1: local x data-parallel ranks) gives the gradient accumulation once the merge knows the
  GPU count; ``seq_len``,
  ``steps``; ``mixed_precision_param`` ``float32`` (no 16-bit compute: ``32-true``), ``bfloat16`` (the default:
  FSDP2 mixed precision with fp32 sharded parameters, ``bf16-mixed``); ``dtype`` ``bfloat16`` (parameters held in
  bf16: ``bf16-true``);
* ``[parallelism]`` degrees: ``data_parallel_shard_degree`` (``-1``, the default, or > 1: FSDP),
  ``fsdp_reshard_after_forward`` ``never`` (SHARD_GRAD_OP-like: ``fsdp-grad-op``), ``tensor_parallel_degree``,
  ``pipeline_parallel_degree``, ``context_parallel_degree``;
* ``[activation_checkpoint] mode`` ``none`` / ``full`` / ``selective``: selective with ``selective_ac_option``
  ``op`` is op-level selective checkpointing, with a number N it checkpoints every N-th block in full
  (``checkpoint_every_n_layers``);
* ``[optimizer] name`` (AdamW / Adam: ``adamw``), ``implementation`` ``fused`` (``fused_optimizer``),
  ``early_step_in_backward`` (``optimizer_in_backward``); ``[compile] enable`` (``torch_compile``); Float8
  (``model.converters``, or ``[float8] enable_float8_linear``) and ``expert_parallel_degree`` cannot be expressed
  and are noted.

Where the config is read (or none is named), torchtitan's own defaults fill what neither it nor a flag sets
(torchtitan/config/job_config.py: ``activation_checkpoint.mode`` selective with ``selective_ac_option`` "2", every
2nd block; ``mixed_precision_param`` bfloat16; ``data_parallel_shard_degree`` -1); a config the manifest does not
carry leaves them unknown, and a note says so.

The framework stays unset: torchtitan's PyTorch-native blocks are what the published-runs model describes (its S11
and S12 rows).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.spec.litgpt import dashed_arguments
from scheduler.spec.trainer_args import (
    Reading,
    Setting,
    Settings,
    basename,
    hybrid_markers,
    launch_count,
    launch_layout,
    to_bool,
)

# torchtitan model name + flavor -> vramfit catalog model (torchtitan/models/<name>/flavors.py MODEL_FLAVORS, or
# __init__.py in older releases): the same shapes. llama3 1B/3B are the tied Llama 3.2 models; deepseek_v3 16B is
# DeepSeek-V2-Lite's shape (dim 2048, 27 layers, MLA without a q LoRA, kv_lora_rank 512, 64 routed experts of 1408
# + 2 shared, top-6, one dense layer of 10944, vocabulary 102400), which torchtitan trains with the
# deepseek-moe-16b-base tokenizer; deepseek_v3 671B is DeepSeek-V3.
_MODELS: dict[tuple[str, str], str] = {
    ("llama3", "1B"): "llama-3.2-1b",
    ("llama3", "3B"): "llama-3.2-3b",
    ("llama3", "8B"): "llama-3.1-8b",
    ("llama3", "70B"): "llama-3.1-70b",
    ("llama3", "405B"): "llama-3.1-405b",
    ("qwen3", "0.6B"): "qwen3-0.6b",
    ("qwen3", "1.7B"): "qwen3-1.7b",
    ("qwen3", "4B"): "qwen3-4b",
    ("qwen3", "8B"): "qwen3-8b",
    ("qwen3", "14B"): "qwen3-14b",
    ("qwen3", "32B"): "qwen3-32b",
    ("qwen3", "30B-A3B"): "qwen3-30b-a3b",
    ("deepseek_v3", "16B"): "deepseek-v2-lite",
    ("deepseek_v3", "671B"): "deepseek-v3",
}


def is_torchtitan(tokens: Sequence[str]) -> bool:
    """Whether a command runs torchtitan's trainer (``-m torchtitan.train``, ``torchtitan/train.py``,
    ``run_train.sh``)."""
    for token in tokens:
        if token in ("torchtitan.train", "torchtitan.train.main") or token.endswith("torchtitan/train.py") \
                or basename(token) == "run_train.sh":
            return True
    return False


def _flags(tokens: Sequence[str]) -> list[tuple[str, str | bool]]:
    """``--section.key value`` / ``--section.key=value`` / a lone ``--section.key`` (true), in order."""
    return [(k, v) for k, v in dashed_arguments(tokens)[0] if "." in k]


def _toml(text: str) -> dict[str, Any] | None:
    try:
        import tomllib  # Python >= 3.11
    except ModuleNotFoundError:  # pragma: no cover - Python 3.10
        try:
            import tomli as tomllib  # type: ignore[no-redef]
        except ModuleNotFoundError:
            return None
    try:
        data = tomllib.loads(text)
    except (tomllib.TOMLDecodeError, TypeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_torchtitan(tokens: Sequence[str], where: str, files: Mapping[str, str],
                    env: Mapping[str, str] | None = None) -> Reading:
    """Settings of a torchtitan command line and the TOML config it names, where the manifest carries it."""
    env = env or {}
    flags = _flags(tokens)
    notes: list[str] = []
    unresolved = ""
    values: dict[str, tuple[Any, str]] = {}  # dotted key -> (value, source)
    config = next((str(v) for k, v in flags if k == "job.config_file"), env.get("CONFIG_FILE", ""))
    known = True  # every setting in view: torchtitan's defaults fill what neither the config nor a flag sets
    if config:
        content = files.get(basename(config))
        data = _toml(content) if content is not None else None
        known = data is not None
        if data is None:
            notes.append(f"torchtitan config {config} is "
                         + ("not in the manifest" if content is None else "not readable TOML here")
                         + "; its settings are unknown (inline it, or set them in the vramfit.io/spec annotation)")
        else:
            for section, table in data.items():
                if isinstance(table, dict):
                    for key, value in table.items():
                        values[f"{section}.{key}"] = (value, f"torchtitan config {config} [{section}] {key}")
    for key, value in flags:
        values[key] = (value, f"flag --{key}")
    out: Settings = {}

    def put(field: str, value: Any, source: str) -> None:
        out[field] = Setting(value, source, where)

    def get(*keys: str) -> tuple[Any, str] | None:
        for key in keys:
            if key in values:
                return values[key]
        return None

    name, flavor = get("model.name"), get("model.flavor")
    if name is not None and flavor is not None:
        model = _MODELS.get((str(name[0]).lower(), str(flavor[0])))
        if model is not None:
            put("model", model, f"{name[1]}, {flavor[1]}")
        else:
            unresolved = (f"torchtitan model {name[0]} flavor {flavor[0]} ({name[1]}) is not in vramfit's table of "
                          f"torchtitan flavors ({', '.join(f'{n} {f}' for n, f in _MODELS)})")
    pp_degree = get("parallelism.pipeline_parallel_degree", "experimental.pipeline_parallel_degree")
    pipelined = pp_degree is not None and str(pp_degree[0]).strip() not in ("", "1")
    batch = get("training.local_batch_size", "training.batch_size")
    micro = get("parallelism.pipeline_parallel_microbatch_size")
    if pipelined:
        put("micro_batch_size", micro[0] if micro else 1,
            micro[1] if micro else "torchtitan pipeline_parallel_microbatch_size default 1")
    elif batch is not None:
        put("micro_batch_size", batch[0], batch[1])
    global_batch = get("training.global_batch_size")
    if global_batch is not None and str(global_batch[0]).strip() not in ("", "-1"):
        # gradient accumulation = global / (local x data-parallel ranks): the merge works it out once the GPU
        # count is known (scheduler.spec.merge)
        put("_global_batch_size", global_batch[0], global_batch[1])
    # torchtitan before its [parallelism] section (2024-early 2025) named the degrees training.* and experimental.*
    for field, keys in (("seq_len", ("training.seq_len",)), ("steps", ("training.steps",)),
                        ("tensor_parallel", ("parallelism.tensor_parallel_degree", "training.tensor_parallel_degree")),
                        ("pipeline_parallel", ("parallelism.pipeline_parallel_degree",
                                               "experimental.pipeline_parallel_degree")),
                        ("context_parallel", ("parallelism.context_parallel_degree",
                                              "experimental.context_parallel_degree"))):
        found = get(*keys)
        if found is not None:
            put(field, found[0], found[1])
    dtype, param = get("training.dtype"), get("training.mixed_precision_param")
    if dtype is not None and str(dtype[0]).lower() in ("bfloat16", "bf16"):
        put("precision", "bf16-true", dtype[1])
    elif param is not None and str(param[0]).lower() in ("float32", "fp32"):
        put("precision", "32-true", param[1])
    elif param is not None and str(param[0]).lower() in ("float16", "fp16"):
        put("precision", "16-mixed", param[1])
    elif param is not None or known:
        put("precision", "bf16-mixed", param[1] if param else "torchtitan mixed_precision_param default bfloat16")
    shard = get("parallelism.data_parallel_shard_degree", "training.data_parallel_shard_degree",
                "training.data_parallel_degree")
    reshard = get("parallelism.fsdp_reshard_after_forward")
    context = get("parallelism.context_parallel_degree", "experimental.context_parallel_degree")
    # FSDP (HSDP with a replicate degree) is applied over dp_shard x cp whenever either is > 1
    # (torchtitan models/llama3/infra/parallelize.py: `if parallel_dims.dp_shard_enabled or parallel_dims.cp_enabled`)
    context_on = context is not None and (launch_count(context[0]) or 0) > 1
    if (shard is not None or known) and (shard is None or str(shard[0]).strip() not in ("1", "0") or context_on):
        source = shard[1] if shard else "torchtitan data_parallel_shard_degree default -1 (FSDP over the rest)"
        if shard is not None and str(shard[0]).strip() in ("1", "0") and context is not None:
            source = f"{context[1]} (torchtitan applies FSDP over the context-parallel ranks)"
        if reshard is not None and str(reshard[0]).lower() == "never":
            put("sharding", "fsdp-grad-op", reshard[1])
        elif pipelined and pp_degree is not None and (reshard is None or str(reshard[0]).lower() == "default"):
            # parallelize.py apply_fsdp: reshard_after_forward "default" is `not pp_enabled`, so a pipeline stage keeps
            # its gathered parameters from forward to backward, as SHARD_GRAD_OP does
            put("sharding", "fsdp-grad-op", f"{pp_degree[1]} (torchtitan's fsdp_reshard_after_forward default: no "
                                            "reshard under pipeline parallelism)")
        else:
            put("sharding", "fsdp", source)
        # HSDP: data_parallel_replicate_degree copies of the dp_shard x cp ranks' states (torchtitan ParallelDims);
        # the merge turns the degrees into shard_group_size once the GPU count is known
        replicate = get("parallelism.data_parallel_replicate_degree", "training.data_parallel_replicate_degree")
        stated_shard = shard if shard is not None and str(shard[0]).strip() != "-1" else None
        for key, setting in hybrid_markers(
                Setting(stated_shard[0], stated_shard[1], where) if stated_shard else None,
                Setting(replicate[0], replicate[1], where) if replicate else None).items():
            put(key, setting.value, setting.source)
    mode, option = get("activation_checkpoint.mode"), get("activation_checkpoint.selective_ac_option")
    if mode is None and known:  # torchtitan's ActivationCheckpoint default: selective, every 2nd block
        mode = ("selective", "torchtitan activation_checkpoint default mode selective")
    if mode is not None:
        text = str(mode[0]).lower()
        choice = str(option[0]).strip() if option else "2"  # torchtitan's default selective_ac_option: "2"
        # a block count ("op" checkpoints by operator); launch_count also reads a launcher's range "1:4", which is
        # no option value here
        every = launch_count(choice) if ":" not in choice else None
        if text == "selective" and every is not None:
            put("gradient_checkpointing", "full", f"{mode[1]} (every {choice} blocks in full)")
            put("checkpoint_every_n_layers", every, option[1] if option else
                "torchtitan selective_ac_option default 2")
        elif text in ("none", "full", "selective"):
            put("gradient_checkpointing", text, mode[1])
    optimizer, implementation = get("optimizer.name"), get("optimizer.implementation")
    if optimizer is not None and str(optimizer[0]).lower() in ("adamw", "adam"):
        put("optimizer", "adamw", optimizer[1])
    elif optimizer is not None:
        notes.append(f"torchtitan optimizer {optimizer[0]} ({optimizer[1]}) is read as AdamW's two states")
    if implementation is not None:
        put("fused_optimizer", str(implementation[0]).lower() == "fused", implementation[1])
    elif known:  # torchtitan's Optimizer.implementation default "fused" (config/job_config.py)
        put("fused_optimizer", True, "torchtitan optimizer.implementation default fused")
    in_backward = get("optimizer.early_step_in_backward")
    if in_backward is not None and to_bool(in_backward[0]) is True:
        put("optimizer_in_backward", True, in_backward[1])
    compiled = get("compile.enable", "training.compile")
    if compiled is not None and to_bool(compiled[0]) is True:
        put("torch_compile", True, compiled[1])
    # Float8 is on when a converter names it (model.converters "float8", or "quantize.linear.float8" in newer
    # releases) or, in 2024 releases, with [float8] enable_float8_linear; a [float8] table of all-gather options
    # alone, as the presets carry with the converter commented out, changes nothing
    converters = get("model.converters")
    legacy_float8 = get("float8.enable_float8_linear")
    if (converters is not None and "float8" in str(converters[0]).lower()) or \
            (legacy_float8 is not None and to_bool(legacy_float8[0]) is True):
        notes.append("torchtitan Float8 linears: not expressible in the TrainingSpec; the prediction is for bf16 "
                     "matmuls (Float8 keeps less per block and runs faster)")
    expert_parallel = get("parallelism.expert_parallel_degree")
    if expert_parallel is not None and str(expert_parallel[0]).strip() not in ("", "1"):
        notes.append(f"torchtitan expert_parallel_degree {expert_parallel[0]}: the experts are split over that many "
                     "ranks and sharded over the rest, as many bytes per GPU as FSDP alone gives them; the "
                     "all-to-all buffers are not in the prediction")
    reading = Reading(out, notes, trainer="torchtitan" if out or notes or unresolved else "",
                      unresolved_model=unresolved)
    reading.launch = launch_layout(list(tokens), None, env)
    return reading
