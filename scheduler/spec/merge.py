"""From what a job kind parser found to one TrainingSpec: the merge of every source, in one place.

Sources, later wins, each field recorded with where it came from (``ParsedJob.provenance``):

0. the object itself: GPU count (replicas x GPUs per pod across the roles that get GPUs), a GPU
   model pinned by a nodeSelector/affinity, a model named by a Kubeflow model initializer;
1. the trainer command line (``scheduler.spec.trainer_args``), after trainer configs written inline
   in env vars (axolotl / LLaMA-Factory YAML), which the command line overrides;
2. environment variables the trainers read (accelerate's ``ACCELERATE_*`` / ``FSDP_*``) and the
   conventional ``MODEL_ID``-style names, from the container env and the script's ``export``s;
3. the annotation ``vramfit.io/spec``: a (partial) TrainingSpec in YAML, the explicit way. One exception:
   the ``gpus`` of a kind whose pods are the trainers (``TRAINING_PODS_KINDS``) is what the pods request,
   since that is what they get; a different count in the annotation is noted and ignored (``auto`` is kept).

Fields that no source gives fall back to the TrainingSpec defaults and are listed as assumptions.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from predictors.architecture import Architecture, architecture_from_config
from predictors.catalog import lookup_model
from predictors.errors import FieldProblem, SpecError
from predictors.spec import HYBRID_SHARDING, TrainingSpec, keeps_zero_gradient_buffer, parse_training_spec
from scheduler.spec.document import NoTrainingJob, ParsedJob, PodTemplateRef
from scheduler.spec.litgpt import FSDP_WHEN_SEVERAL_GPUS
from scheduler.spec.pods import Container, ObjectRef, Path, Role, dotted, pointer
from scheduler.spec.trainer_args import (
    HYBRID_MARKERS,
    MICRO_BATCH_CAP,
    TORCHTUNE_ALLOCATOR_SOURCE,
    TRAINING_WORLD,
    ZERO_STAGE_MARKERS,
    Launch,
    Reading,
    Setting,
    Settings,
    config_flavour,
    framework_setting,
    launch_count,
    llamafactory_v1_launch,
    looks_like_trainer_config,
    read_command,
    read_pairs,
    read_trainer_config,
    resolve,
)
from scheduler.spec.yamltext import YAML_ERRORS, TextBudget, safe_load, too_long, yaml_error_text

ANNOTATION = "vramfit.io/spec"
# Kinds whose pods are the training processes, each with the GPUs it requests
# (not a TrainJob: its node count may be a default standing in for a runtime the webhook cannot read)
TRAINING_PODS_KINDS = ("Pod", "Job", "JobSet", "PyTorchJob")
NO_GPU_REQUEST = "no GPU request in the job"  # provenance of gpus: auto when neither the job nor the annotation sets it
ANNOTATION_HINT = (
    f'add the annotation {ANNOTATION}: "model: meta-llama/Llama-3.1-8B" (any TrainingSpec '
    "fields, as YAML) to the object's metadata.annotations"
)

# Environment variables trainers read -> the trainer key they stand for (see trainer_args.KEYS).
ENV_KEYS: dict[str, str] = {
    "ACCELERATE_MIXED_PRECISION": "mixed_precision",
    "ACCELERATE_USE_DEEPSPEED": "use_deepspeed",
    "ACCELERATE_DEEPSPEED_ZERO_STAGE": "zero_stage",
    "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "offload_optimizer_device",
    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "offload_param_device",
    "ACCELERATE_DEEPSPEED_CONFIG_FILE": "deepspeed_config_file",
    "ACCELERATE_USE_FSDP": "use_fsdp",
    "FSDP_SHARDING_STRATEGY": "fsdp_sharding_strategy",
    "FSDP_OFFLOAD_PARAMS": "fsdp_offload_params",
    "FSDP_RESHARD_AFTER_FORWARD": "fsdp_reshard_after_forward",  # accelerate FSDP2 (fsdp_version 2)
    "FSDP_ACTIVATION_CHECKPOINTING": "fsdp_activation_checkpointing",
    "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "gradient_accumulation_steps",
    "PARALLELISM_CONFIG_TP_SIZE": "parallelism_config_tp_size",  # accelerate ND parallelism (what its launcher sets)
    "PARALLELISM_CONFIG_CP_SIZE": "parallelism_config_cp_size",
    "PARALLELISM_CONFIG_SP_SIZE": "parallelism_config_sp_size",
    "PARALLELISM_CONFIG_DP_SHARD_SIZE": "parallelism_config_dp_shard_size",
    "PARALLELISM_CONFIG_DP_REPLICATE_SIZE": "parallelism_config_dp_replicate_size",
    "ACCELERATE_USE_PARALLELISM_CONFIG": "use_parallelism_config",
    # Not read by a library but by most training scripts; the last one set wins.
    "MODEL_NAME": "model_name_or_path",
    "BASE_MODEL": "model_name_or_path",
    "MODEL_ID": "model_name_or_path",
    "HF_MODEL_ID": "model_name_or_path",
    "MODEL_NAME_OR_PATH": "model_name_or_path",
    # the trainer arguments as env vars (Kubeflow Trainer's GRPO trainer, cmd/trainers/grpo/train.py, passes them
    # into its GRPOConfig; many training images read the same names)
    "PER_DEVICE_TRAIN_BATCH_SIZE": "per_device_train_batch_size",
    "GRADIENT_ACCUMULATION_STEPS": "gradient_accumulation_steps",
    # its GRPO lengths (cmd/trainers/grpo/train.py: MAX_PROMPT_LENGTH 512, MAX_COMPLETION_LENGTH 256, NUM_GENERATIONS
    # 4 by default)
    "MAX_PROMPT_LENGTH": "max_prompt_length",
    "MAX_COMPLETION_LENGTH": "max_completion_length",
    "NUM_GENERATIONS": "num_generations",
    # the LoRA settings and the length as tutorial images take them (GKE's Gemma QLoRA tutorial: LORA_R, LORA_ALPHA,
    # MAX_SEQ_LENGTH); a LoRA rank alone reads as LoRA, with a note
    "LORA_R": "lora_r",
    "LORA_ALPHA": "lora_alpha",
    "LORA_DROPOUT": "lora_dropout",
    "MAX_SEQ_LENGTH": "max_seq_length",
    # PyTorch's caching allocator settings (expandable_segments); PYTORCH_ALLOC_CONF is torch >= 2.9's name for it
    "PYTORCH_CUDA_ALLOC_CONF": "pytorch_cuda_alloc_conf",
    "PYTORCH_ALLOC_CONF": "pytorch_cuda_alloc_conf",
}

# Defaults shown as assumptions when no source sets the field (TrainingSpec v1 defaults).
_DEFAULTS: tuple[tuple[str, Any], ...] = (
    ("task", "causal-lm"),
    ("method", "full"),
    ("precision", "bf16-mixed"),
    ("optimizer", "adamw"),
    ("micro_batch_size", 1),
    ("seq_len", 2048),
    ("gradient_checkpointing", "none"),
    ("attention", "sdpa"),
    ("offload", "none"),
)
# Name suffixes of re-releases with the base model's shapes: tuned variants (instruct, chat, Gemma's -it, Qwen's
# -thinking), dated refreshes (Qwen3-4B-Instruct-2507), and re-uploads in another dtype (llama-3-70b-fp16); taken
# off one at a time. Not a quantized checkpoint's (-awq, -gptq, -bnb-4bit): it stores other weights.
_VARIANT_SUFFIX = re.compile(r"-(?:instruct|chat|it|base|hf|fp16|bf16|fp32|thinking|\d{4})$", re.IGNORECASE)


@dataclass
class Context:
    """What a kind parser may use besides its object: the file, and the file's other documents."""

    source: str = ""
    files: dict[str, str] = field(default_factory=dict)  # ConfigMap data by key (file name)
    configmaps: dict[str, dict[str, str]] = field(default_factory=dict)  # the same data by ConfigMap name, then key
    runtimes: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # (kind, name) -> object


@dataclass
class Workload:
    """What a job kind parser found: the object, its roles (sets of identical pods) and extra sources."""

    obj: ObjectRef
    annotations: dict[str, str]
    roles: list[Role]
    annotation_path: Path = ("metadata", "annotations")
    base: Settings = field(default_factory=dict)  # object-level facts (source 0)
    entrypoint: tuple[tuple[str, ...], str] | None = None  # (argv, where): a Ray entrypoint
    extra_env: dict[str, str] = field(default_factory=dict)  # e.g. a Ray runtime_env's env_vars
    extra_env_where: str = ""
    gpus: int | Literal["auto"] | None = None  # set by kinds whose GPUs are not pod resources
    gpus_source: str = ""
    no_gpu_reason: str = ""
    notes: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # ConfigMap data of the same file, by key
    configmaps: dict[str, dict[str, str]] = field(default_factory=dict)  # by ConfigMap name, then key

    def files_of(self, containers: Sequence[Container]) -> dict[str, str]:
        """The files these containers see: every ConfigMap key of the manifest by its own name, then the keys their
        volumes mount under another name (``items`` paths, ``subPath`` mounts; the first container's first)."""
        renamed = {m.name: self.configmaps[m.config_map][m.key] for c in reversed(containers)
                   for m in reversed(c.mounted) if m.key in self.configmaps.get(m.config_map, {})}
        return {**self.files, **renamed} if renamed else self.files


def _fsdp_when_several_gpus(merged: Settings, notes: list[str]) -> None:
    """A trainer that shards with FSDP and checkpoints every block only on more than one GPU, whose process count is
    every GPU it sees (litgpt with devices auto): decided from the pods' GPU count."""
    marker = merged.pop(FSDP_WHEN_SEVERAL_GPUS, None)
    if marker is None:
        return
    gpus = launch_count(merged["gpus"].value) if "gpus" in merged else None
    if gpus is None:
        notes.append(f"{marker.source}: the GPU count is not known here, so neither FSDP nor checkpointing is set")
        return
    several = gpus > 1
    for name, value in (("sharding", "fsdp" if several else "none"),
                        ("gradient_checkpointing", "full" if several else "none")):
        if name not in merged:
            merged[name] = Setting(value, f"{marker.source}: {gpus} GPU{'s' if several else ''}", marker.where)


def _training_world(merged: Settings, notes: list[str]) -> None:
    """The GPUs a trainer trains its model on, when it places other roles on GPUs of their own (OpenRLHF's actor
    world beside its vLLM engines): ``training_gpus`` when fewer than the job's GPUs; more than the job holds is
    noted and read as all of them."""
    world = merged.pop(TRAINING_WORLD, None)
    gpus = merged.get("gpus")
    if world is None or gpus is None or "training_gpus" in merged:
        return
    count, total = launch_count(world.value), launch_count(gpus.value)
    if count is not None and total is None and str(gpus.value) == "auto":
        # a Ray Jobs submission says no GPU count of its own: the trainer's workers are the job's GPUs
        merged["gpus"] = Setting(count, f"{world.source} (the submission gives no GPU count)", world.where)
        return
    if count is None or total is None or count == total:
        return
    if count > total:
        notes.append(f"{world.source}: {count} GPUs, more than the job's {total} ({gpus.source}); predicted as "
                     f"training on all {total}")
        return
    merged["training_gpus"] = Setting(count, f"{world.source}; the job's other {total - count} GPUs run other "
                                      "roles", world.where)


def _micro_batch_within_global(merged: Settings) -> None:
    """llm-foundry's micro-batch is at most each GPU's share of the global batch (Composer splits
    ``global_train_batch_size`` over the data-parallel ranks, then each share into ``device_train_microbatch_size``
    micro-batches): the smaller of the two, once the GPU count is known."""
    total = merged.pop(MICRO_BATCH_CAP, None)
    micro = merged.get("micro_batch_size")
    if total is None or micro is None or "device_train_microbatch_size" not in micro.source:
        return  # a micro-batch the annotation (or anything but llm-foundry's own key) states is taken as it is
    sizes = [launch_count(merged[name].value) if name in merged else 1
             for name in ("gpus", "tensor_parallel", "context_parallel")]
    count, global_count = launch_count(micro.value), launch_count(total.value)
    if None in sizes or count is None or global_count is None:
        return
    ranks = max(1, sizes[0] // (sizes[1] * sizes[2]))  # type: ignore[operator]
    share = global_count // ranks
    if 1 <= share < count:
        merged["micro_batch_size"] = Setting(share, f"{total.source} {global_count} over {ranks} data-parallel ranks "
                                             f"(below {micro.source} {count})", total.where)


def _accumulation_from_global_batch(merged: Settings, notes: list[str]) -> None:
    """A global batch (torchtitan ``training.global_batch_size``) as gradient accumulation: global / (micro-batch x
    data-parallel ranks), when that is a whole number and nothing else sets ``grad_accum_steps``."""
    global_batch = merged.pop("_global_batch_size", None)
    if global_batch is None or "grad_accum_steps" in merged:
        return
    sizes = {name: launch_count(merged[name].value) if name in merged else default for name, default in (
        ("gpus", None), ("micro_batch_size", 1), ("tensor_parallel", 1), ("pipeline_parallel", 1),
        ("context_parallel", 1))}
    total = launch_count(global_batch.value)
    if total is None or None in sizes.values():
        notes.append(f"global batch {global_batch.value} ({global_batch.source}) not read as gradient accumulation "
                     "(GPU count, micro-batch or pipeline schedule not known here); set grad_accum_steps in "
                     f"{ANNOTATION}")
        return
    if "training_gpus" in merged and (training := launch_count(merged["training_gpus"].value)) is not None:
        sizes["gpus"] = training
    # data-parallel replicas: the GPUs over tensor x pipeline x context parallel (Megatron's num_microbatches =
    # global batch / (micro-batch x data parallel), which a pipeline runs through its stages)
    ranks = sizes["gpus"] // (sizes["tensor_parallel"] * sizes["context_parallel"] * sizes["pipeline_parallel"])
    steps, rest = divmod(total, sizes["micro_batch_size"] * ranks) if ranks else (0, 1)
    if steps < 1 or rest:
        notes.append(f"global batch {total} ({global_batch.source}) is not a whole multiple of micro-batch "
                     f"{sizes['micro_batch_size']} x {ranks} data-parallel ranks; gradient accumulation not set")
        return
    merged["grad_accum_steps"] = Setting(steps, f"{global_batch.source} / (micro-batch {sizes['micro_batch_size']} "
                                         f"x {ranks} data-parallel ranks)", global_batch.where)


def build_job(w: Workload, base_dir: Any = None) -> ParsedJob:
    """Merge every source into a TrainingSpec, or raise NoTrainingJob / SpecError (naming the field)."""
    annotation = read_annotation(w)
    training = [r for r in w.roles if r.gpus_per_pod > 0]
    gpus, gpus_source = _gpu_total(w, training)
    if gpus == 0 and not annotation:
        raise NoTrainingJob(w.obj.ref, w.no_gpu_reason or _no_gpu_reason(w), w.obj.source)
    notes = list(w.notes)
    stages: list[Settings] = [dict(w.base), {}, {}, annotation]
    if gpus:
        stages[0]["gpus"] = Setting(gpus, gpus_source, dotted(training[0].path) if training else "spec")
    elif "gpus" not in annotation:
        stages[0]["gpus"] = Setting("auto", NO_GPU_REQUEST, "spec")
        notes.append(f"no role requests a GPU; gpus: auto (placement chooses). Set gpus in {ANNOTATION}")
    pin_notes = _pin(training, stages[0])
    launchers = [r for r in w.roles if r not in training]  # an MPI/deepspeed launcher holds the command
    command, env = _command_and_env(w, [*training, *launchers])
    if w.gpus == "auto" and not command.settings and not annotation:
        raise NoTrainingJob(
            w.obj.ref,
            w.no_gpu_reason or "no GPU requested and no trainer command line recognised",
            w.obj.source,
        )
    stages[1].update(command.settings)
    stages[2].update(env)
    notes += pin_notes + command.notes
    if w.gpus is None and w.obj.kind in TRAINING_PODS_KINDS:
        notes += _launch_notes(command.launch, training, gpus)
    merged, provenance = _merge(stages, notes)
    stated = annotation.get("gpus")
    if (gpus and stated is not None and stated.value not in (gpus, "auto")
            and w.obj.kind in TRAINING_PODS_KINDS and w.gpus is None):
        # the pods get the GPUs they request whatever the annotation says; predicting for another count would
        # size the wrong job (fewer GPUs than the annotation's: more memory per GPU under sharding). Ray is not
        # among these kinds: its workers take what the trainer asks of the cluster, which the annotation states.
        notes.append(f"gpus {stated.value} in {ANNOTATION} ignored: the job requests {gpus} GPUs ({gpus_source}), "
                     "which is what its pods get")
        merged["gpus"] = stages[0]["gpus"]
        provenance["gpus"] = stages[0]["gpus"].source
    notes += _shard_group_size(merged, training)
    if "shard_group_size" in merged:
        provenance["shard_group_size"] = merged["shard_group_size"].source
    notes += _zero_stage_settings(merged)
    for name in ("zero_reduce_bucket_elements", "zero_overlap_comm", "secondary_shard_size", "master_weights",
                 "sharding", "fp32_gradients",
                 "zero3_max_live_parameters", "zero3_max_reuse_distance"):
        if name in merged:
            provenance[name] = merged[name].source
    if "model" not in merged and command.not_training and not annotation:
        # the command runs a trainer's tool that trains nothing (llamafactory-cli export / chat: the LoRA merge Job
        # teams ship beside the training Job): no training job, as for a ConfigMap, not an error for the whole file
        raise NoTrainingJob(w.obj.ref, command.unresolved_model, w.obj.source)
    if "model" not in merged:
        raise w.obj.error(
            dotted(w.annotation_path),
            f"no model found in the job ({_summary(w, gpus)}); "
            + (f"{command.unresolved_model}; " if command.unresolved_model else "")
            # the scripts the command runs: read (what they run names no model) or not carried by the manifest
            + "".join(f"{note.split(': ', 1)[-1]}; " for note in command.notes if "the command runs " in note)
            + "looked for --model_name_or_path-style flags, torchtune configs, inline axolotl / "
            "LLaMA-Factory configs, MODEL_ID-style env vars and the annotation",
            ANNOTATION_HINT,
        )
    notes += _check_model(w.obj, merged)
    notes += _check_teacher(merged)
    notes += _check_critic(merged)
    provenance.update({k: merged[k].source for k in ("model", "method", "quantization") if k in merged})
    notes += _cap_default_seq_len(merged, dotted(w.annotation_path))
    notes += _freeze_tuning_moe_notes(merged)
    spec = _validate(w.obj, merged)
    provenance = {k: v for k, v in provenance.items() if k.split(".")[0] in TrainingSpec.model_fields}
    return ParsedJob(
        spec=spec,
        kind=w.obj.kind,
        name=w.obj.name,
        namespace=w.obj.namespace,
        provenance=provenance,
        assumptions=notes + _defaults_assumed(spec, merged),
        base_dir=base_dir,
        pod_templates=[PodTemplateRef(pointer(r.path), r.name, r.replicas, r.gpus_per_pod) for r in training],
        pinned_gpu=next((r.pin.gpu for r in training if r.pin and r.pin.gpu), None),
        annotations=dict(w.annotations),
    )


# --- GPUs ----------------------------------------------------------------------------------------


def _shard_group_size(merged: Settings, training: Sequence[Role]) -> list[str]:
    """Hybrid sharding's group as ``shard_group_size``, from the markers the trainers' settings leave: a stated
    group size (``_shard_group``), a replica count (``_dp_replicate``: the data-parallel ranks / that), or FSDP1's
    HYBRID_SHARD (``_hybrid_node``: the GPUs of one pod, a node, over the model-parallel size). Set only when it
    divides the data-parallel ranks into more than one group; otherwise a note says why not (sharding over every
    rank, which under-estimates the memory per GPU when the states really are replicated)."""
    markers = {key: merged.pop(key) for key in HYBRID_MARKERS if key in merged}
    if not markers or "shard_group_size" in merged:
        return []
    key, marker = next(iter(markers.items()))
    sharding = merged.get("sharding")
    if sharding is None or sharding.value not in HYBRID_SHARDING:
        return [f"hybrid sharding ({marker.source}) not read: it splits ZeRO-3/FSDP states, and sharding is "
                f"{sharding.value if sharding else 'not set'}"]
    model_parallel = 1
    for name in ("tensor_parallel", "pipeline_parallel", "context_parallel"):
        model_parallel *= (launch_count(merged[name].value) or 1) if name in merged else 1
    gpus = launch_count(merged["gpus"].value) if "gpus" in merged else None
    ranks = gpus // model_parallel if gpus else None
    size: int | None = None
    if key == "_shard_group":
        size = launch_count(marker.value)
        why = marker.source
    elif key == "_dp_replicate":
        copies = launch_count(marker.value)
        size = ranks // copies if ranks and copies and ranks % copies == 0 else None
        why = f"{ranks} data-parallel ranks / {marker.source} {copies}"
    else:
        per_pod = {r.gpus_per_pod for r in training}
        pipeline = (launch_count(merged["pipeline_parallel"].value) or 1) if "pipeline_parallel" in merged else 1
        spread = model_parallel // pipeline  # tensor x context parallel: the ranks of one replica on a node
        node = next(iter(per_pod)) if len(per_pod) == 1 else None
        size = node // spread if node and node % spread == 0 else None
        why = f"{marker.source}: FSDP {marker.value} shards within a node ({node} GPUs per pod)"
    if size is not None and ranks is None and key == "_shard_group":  # gpus: auto; placement keeps it whole
        merged["shard_group_size"] = Setting(size, why, marker.where)
        return [f"hybrid sharding ({why}): states sharded over {size} data-parallel ranks, replicated across the rest"]
    if size is None or ranks is None or ranks % size or size == ranks:
        if size is not None and size == ranks:
            return [f"hybrid sharding ({why}): one group of all {ranks} data-parallel ranks, sharded as usual"]
        return [f"hybrid sharding ({marker.source}) not read: its shard group does not divide the "
                f"{ranks if ranks is not None else 'unknown number of'} data-parallel ranks; read as sharding over "
                "every rank, which under-estimates the memory per GPU. To fix: set shard_group_size in "
                f"{ANNOTATION}"]
    merged["shard_group_size"] = Setting(size, why, marker.where)
    return [f"hybrid sharding ({why}): states sharded over {size} data-parallel ranks and replicated across "
            f"{ranks // size} groups"]


def _zero_stage_settings(merged: Settings) -> list[str]:
    """A DeepSpeed config's ``reduce_bucket_size``, ``overlap_comm``, ``zero_hpz_partition_size`` and ZeRO-3 live /
    reuse limits (``_zero_bucket``, ``_zero_overlap``, ``_secondary_shard``, ``_zero3_live``, ``_zero3_reuse``) as the
    spec's ``zero_reduce_bucket_elements``, ``zero_overlap_comm``, ``secondary_shard_size``,
    ``zero3_max_live_parameters`` and ``zero3_max_reuse_distance``, once the job's ZeRO stage is final: the bucket
    where the optimizer keeps the buffer (ZeRO-2/3, and ZeRO-1 with an offloaded optimizer), ``overlap_comm`` at
    ZeRO-2 only (ZeRO-3 keeps one buffer either way; stage 1 turns it off), hpZ and the limits at ZeRO-3. Values the
    job states otherwise (the annotation) stay."""
    markers = {key: merged.pop(key) for key in ZERO_STAGE_MARKERS if key in merged}
    if not markers:
        return []
    sharding = merged["sharding"].value if "sharding" in merged else None
    offload = merged["offload"].value if "offload" in merged else None
    keeps = keeps_zero_gradient_buffer(sharding, offload)
    bucket, overlap = markers.get("_zero_bucket"), markers.get("_zero_overlap")
    notes: list[str] = []
    if bucket is not None and "zero_reduce_bucket_elements" not in merged:
        if keeps:
            merged["zero_reduce_bucket_elements"] = Setting(
                bucket.value, f"{bucket.source} reduce_bucket_size", bucket.where)
        else:
            notes.append(f"{bucket.source} reduce_bucket_size not read: the job runs "
                         f"{sharding or 'without sharding'}, whose optimizer keeps no contiguous gradient buffer")
    if overlap is not None and "zero_overlap_comm" not in merged and sharding == "zero2":
        merged["zero_overlap_comm"] = Setting(overlap.value, f"{overlap.source} overlap_comm", overlap.where)
    # ZeRO stage 0 under *-mixed: DeepSpeed's 16-bit model with fp32 masters, not autocast over an fp32 model
    stage0, precision = markers.get("_zero0"), merged.get("precision")
    if stage0 is not None and sharding == "ddp" and precision is not None and precision.value == "bf16-mixed":
        # bf16 at stage 0 is DeepSpeed's BF16_Optimizer (engine.py _configure_bf16_optimizer; bf16_optimizer.py):
        # fp32 masters partitioned over the data-parallel ranks, the whole model's gradients accumulated in fp32
        merged["sharding"] = Setting("zero1", f"{stage0.source} (ZeRO stage 0 with bf16: DeepSpeed's BF16_Optimizer "
                                     "partitions the fp32 masters and Adam states as ZeRO-1 does)", stage0.where)
        merged.setdefault("fp32_gradients", Setting(True, f"{stage0.source} (BF16_Optimizer accumulates the gradients "
                                                          "in an fp32 buffer of the whole model)", stage0.where))
    elif stage0 is not None and sharding in ("ddp", "none") and "master_weights" not in merged \
            and (precision is None or str(precision.value).endswith("mixed")):  # unset: the spec's bf16-mixed
        merged["master_weights"] = Setting(True, f"{stage0.source} (ZeRO stage 0: DeepSpeed's FP16 optimizer keeps "
                                           "fp32 masters of a 16-bit model)", stage0.where)
    # the ZeRO-3-only settings
    for marker, name, why in (("_secondary_shard", "secondary_shard_size", "has no parameter shards to copy"),
                              ("_zero3_live", "zero3_max_live_parameters", "gathers no parameters"),
                              ("_zero3_reuse", "zero3_max_reuse_distance", "gathers no parameters")):
        setting = markers.get(marker)
        if setting is None or name in merged:
            continue
        if sharding == "zero3":
            merged[name] = setting
        else:
            notes.append(f"{setting.source} not read: the job runs {sharding or 'without sharding'}, which {why}")
    return notes


def _gpu_total(w: Workload, training: Sequence[Role]) -> tuple[int | Literal["auto"], str]:
    if w.gpus is not None:
        return w.gpus, w.gpus_source
    total = sum(r.gpus for r in training)
    parts = [
        f"{r.name} {r.replicas} pod{'s' if r.replicas != 1 else ''} x {r.gpus_per_pod} GPU ({r.gpu_source})"
        for r in training
    ]
    return total, " + ".join(parts)


def _summary(w: Workload, gpus: int | str) -> str:
    return f"{gpus} GPU{'s' if gpus != 1 else ''}" + (
        f": {', '.join(f'{r.name} {r.replicas}x{r.gpus_per_pod}' for r in w.roles if r.gpus_per_pod)}"
        if any(r.gpus_per_pod for r in w.roles)
        else ""
    )


def _launch_notes(launch: Launch | None, training: Sequence[Role], gpus: int | str) -> list[str]:
    """Where the processes the launcher starts differ from the pods' GPUs: the prediction is for the GPUs the pods
    request (what placement reserves), one process each, so fewer processes mean idle GPUs and, under ZeRO/FSDP,
    larger shards per process than predicted."""
    if launch is None or not training:
        return []
    notes: list[str] = []
    per_pod = {r.gpus_per_pod for r in training}
    pods = sum(r.replicas for r in training)
    if launch.per_node and len(per_pod) == 1:
        requested = next(iter(per_pod))
        if launch.per_node < requested:
            notes.append(
                f"{launch.source} starts {launch.per_node} process{'es' if launch.per_node != 1 else ''} per pod but "
                f"each pod requests {requested} GPUs: {requested - launch.per_node} per pod stay idle, and the "
                f"prediction for {gpus} GPUs under-estimates the memory per GPU of sharded (ZeRO/FSDP) training. "
                "To fix: request as many GPUs per pod as processes")
        elif launch.per_node > requested:
            notes.append(
                f"{launch.source} starts {launch.per_node} processes per pod but each pod requests {requested} "
                f"GPU{'s' if requested != 1 else ''}: processes would share a GPU (the prediction is one process "
                "per GPU)")
    if launch.nodes and launch.nodes != pods:
        notes.append(f"{launch.source} names {launch.nodes} node{'s' if launch.nodes != 1 else ''} but the job "
                     f"has {pods} training pod{'s' if pods != 1 else ''}; the prediction uses the pods' {gpus} GPUs")
    return notes


_SHARING_ANNOTATIONS = ("gpu-memory", "gpu-fraction")  # KAI scheduler GPU sharing


def _no_gpu_reason(w: Workload) -> str:
    shared = [f"{k}={w.annotations[k]}" for k in _SHARING_ANNOTATIONS if k in w.annotations]
    if shared:
        return (
            f"asks for a share of a GPU through the annotation {', '.join(shared)} and no whole GPUs "
            "(nvidia.com/gpu); vramfit sizes whole-GPU training jobs"
        )
    roles = ", ".join(f"{r.name} ({r.replicas} pod{'s' if r.replicas != 1 else ''})" for r in w.roles)
    return f"no container requests nvidia.com/gpu (roles: {roles or 'none'}), so it is not a GPU training job"


def _pin(training: Sequence[Role], base: Settings) -> list[str]:
    notes: list[str] = []
    pins = [r.pin for r in training if r.pin is not None]
    for pin in pins:
        if pin.gpu is None:
            notes.append(
                f"{dotted(pin.path)} = {pin.value} names a GPU that is not in the catalog; not pinned"
            )
    known = [p for p in pins if p.gpu]
    if known:
        first = known[0]
        base["gpu"] = Setting(first.gpu, f"node label {first.label}={first.value}", dotted(first.path))
        if len({p.gpu for p in known}) > 1:
            notes.append(
                f"roles pin different GPUs ({', '.join(sorted({str(p.gpu) for p in known}))}); "
                f"{first.gpu} used"
            )
    return notes


# --- sources 1 and 2 -----------------------------------------------------------------------------

# the containers whose commands are read, in the order the roles list them, until one names trainer settings: a
# training pod has a few (the trainer, sidecars); thousands of containers without one each took a few ms to read
# (bench/hostile_reviews.py "containers: exponential $(VAR)": 2,850 containers, 15.8 s)
MAX_COMMANDS_READ = 64


def _command_and_env(w: Workload, roles: Sequence[Role]) -> tuple[Reading, Settings]:
    """Settings of the first command line that names trainer settings (the Ray entrypoint first, then
    the containers of the roles that train), and the env settings of the same container."""
    candidates: list[tuple[tuple[str, ...], dict[str, str], str, dict[str, str]]] = []
    containers: list[Container] = [c for r in roles for c in r.containers]
    if w.entrypoint is not None:  # a Ray entrypoint runs in the head pod: its mounts first, then the workers'
        heads = [c for r in roles if r.name == "head" for c in r.containers]
        candidates.append((w.entrypoint[0], dict(w.extra_env), w.entrypoint[1],
                           w.files_of([*heads, *(c for c in containers if c not in heads)])))
    candidates += [(c.argv, {**w.extra_env, **c.env}, dotted(c.path), w.files_of([c])) for c in containers]
    chosen: tuple[Reading, dict[str, str], str] | None = None
    budget = TextBudget()
    unread = len(candidates) - MAX_COMMANDS_READ
    for argv, env, where, files in candidates[:MAX_COMMANDS_READ]:
        try:
            inline = _inline_configs(env, where, budget, files)
            reading, script = read_command(argv, env, where, files, budget)
        except SpecError as exc:
            if exc.source or len(exc.problems) != 1:
                raise
            # a config value the trainer itself rejects (trainer_args raises without knowing the object): name the
            # object and the container, as the other input errors do
            problem = exc.problems[0]
            raise w.obj.error(problem.path or where, problem.message, problem.hint) from None
        if reading.not_training and not reading.settings:
            # llamafactory-cli chat with its config inline in an env var: the config describes no training here
            inline = Reading(notes=[f"{where}: a trainer config written in an env var is not read, as the command "
                                    "does not train"] if inline.settings else [])
        reading.settings = {**inline.settings, **reading.settings}
        reading.notes = inline.notes + reading.notes
        if chosen is None or (reading.settings and not chosen[0].settings):
            chosen = (reading, {**env, **script.env}, where)
        if reading.settings:
            break
    if chosen is None:
        return Reading(), {}
    reading, env, where = chosen
    reading.notes += [note for note in budget.notes if note not in reading.notes]  # from every container
    if unread > 0 and not reading.settings:
        reading.notes.append(f"the commands of the first {MAX_COMMANDS_READ} containers were read, not those of the "
                             f"{unread:,} others")
    env_where = (
        w.extra_env_where if w.entrypoint and where == w.entrypoint[1] and w.extra_env_where else where
    )
    from_env = read_env_settings(env, env_where)
    reading.notes += [note for note in from_env.notes if note not in reading.notes]  # e.g. an ignored offload
    tune = reading.settings.get("expandable_segments")
    if tune is not None and tune.source == TORCHTUNE_ALLOCATOR_SOURCE:
        # importing torchtune sets the allocator after the environment is read (read_torchtune checked the one
        # variable that stops it), so the environment's value does not win here
        from_env.settings.pop("expandable_segments", None)
    return reading, from_env.settings


def _inline_configs(env: Mapping[str, str], where: str, budget: TextBudget,
                    files: Mapping[str, str] | None = None) -> Reading:
    """Trainer configs (axolotl, LLaMA-Factory, DeepSpeed) written inline in an env var's value; ``files``: those the
    manifest carries, which a DeepSpeed config named there may be."""
    raw: Settings = {}
    notes: list[str] = []
    for name, value in env.items():
        if "\n" not in value and not value.lstrip().startswith("{"):
            continue
        if (note := budget.refuse(value, f"{where}.env.{name}")) is not None:
            notes.append(note)
            continue
        try:
            data = safe_load(value, unique_keys=False)  # as the trainer reads it
        except YAML_ERRORS:
            continue
        # a LLaMA-Factory v1 config is read as one only with USE_V1 on (no launcher is in view here)
        v1 = llamafactory_v1_launch((), env)
        if looks_like_trainer_config(data, v1):
            label, at = f"{config_flavour(data, v1)} in env {name}", f"{where}.env.{name}"
            settings, config_notes = read_trainer_config(data, label, at, v1)
            raw.update(settings)
            notes += config_notes
    reading = resolve(raw, files)
    framework = framework_setting("", raw, where)
    if framework is not None and reading.settings:
        reading.settings.setdefault("framework", framework)
    reading.notes = notes + reading.notes
    return reading


def read_env_settings(env: Mapping[str, str], where: str) -> Reading:
    """Settings (and notes) from the environment variables trainers read (:data:`ENV_KEYS`)."""
    pairs = [(ENV_KEYS[name], value, f"env {name}") for name, value in env.items() if name in ENV_KEYS]
    at = f"{where}.env" if where else "env"
    raw = read_pairs(pairs, at)
    completion, prompt = raw.get("_max_completion_length"), raw.get("_max_prompt_length")
    if completion is not None and prompt is not None:
        # GRPO lengths as env (Kubeflow Trainer's GRPO trainer): the policy trains on prompt + completion and scores
        # the completion only
        new, old = launch_count(str(completion.value)), launch_count(str(prompt.value))
        if new and old:
            raw.setdefault("seq_len", Setting(old + new, f"{prompt.source} + {completion.source} (GRPO trains on "
                                              "prompt and completion)", at))
            raw.setdefault("logits_tokens", Setting(new, f"{completion.source} (GRPO scores the completion only)", at))
    return resolve(raw)


# --- source 3: the annotation ----------------------------------------------------------------------


def _spec_fields() -> set[str]:
    return {f.alias or name for name, f in TrainingSpec.model_fields.items()}


def read_annotation(w: Workload) -> Settings:
    """The ``vramfit.io/spec`` annotation: a partial TrainingSpec in YAML (strict: unknown fields are
    errors, all reported at once)."""
    text = w.annotations.get(ANNOTATION)
    if text is None:
        return {}
    path = (*w.annotation_path, ANNOTATION)
    if (long := too_long(text)) is not None:
        raise w.obj.error(path, f"{long} (Kubernetes allows 256 KiB for all annotations of an object)",
                          "keep only TrainingSpec fields in it, e.g. model, method, seq_len")
    try:
        data = safe_load(text)
    except YAML_ERRORS as exc:
        raise w.obj.error(
            path,
            yaml_error_text(exc),
            f'write TrainingSpec fields as YAML, e.g. {ANNOTATION}: "model: llama-3.1-8b"',
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise w.obj.error(
            path,
            f"must be a YAML mapping of TrainingSpec fields; got {type(data).__name__}",
            f'e.g. {ANNOTATION}: "model: llama-3.1-8b"',
        )
    known = _spec_fields()
    unknown = [str(k) for k in data if str(k) not in known]
    if unknown:
        problems = [
            FieldProblem(
                f"{dotted(path)}.{k}",
                "is not a known TrainingSpec field",
                f"remove it; known fields: {', '.join(sorted(known))}",
            )
            for k in unknown
        ]
        raise SpecError(problems, source=f"{w.obj.source}: {w.obj.ref}" if w.obj.source else w.obj.ref)
    out: Settings = {}
    source = f"annotation {ANNOTATION}"
    for key, value in data.items():
        if key in ("apiVersion", "kind"):
            continue
        if key == "lora" and isinstance(value, dict):
            for sub, sub_value in value.items():
                out[f"lora.{sub}"] = Setting(sub_value, source, f"{dotted(path)}.lora.{sub}")
        else:
            out[str(key)] = Setting(value, source, f"{dotted(path)}.{key}")
    return out


# --- merge, model, validation, assumptions -----------------------------------------------------------


def _merge(stages: Sequence[Settings], notes: list[str]) -> tuple[Settings, dict[str, str]]:
    merged: Settings = {}
    for stage in stages:
        merged.update(stage)
    method = merged.get("method")
    final = method.value if method else "full"
    # Settings that only make sense for another method than the one that won are dropped, not errors.
    dropped = [
        k
        for k in merged
        if (final == "full" and k.startswith("lora.")) or (final in ("full", "lora") and k == "quantization")
    ]
    for key in dropped:
        notes.append(
            f"{key} from {merged[key].source} ignored: method is {final} "
            f"({method.source if method else 'default'})"
        )
        del merged[key]
    framework = merged.get("framework")
    # LLaMA-Factory v1 builds torch.optim.AdamW itself, never from TrainingArguments (src/llamafactory/v1/core/
    # base_trainer.py _init_optimizer, plugins/trainer_plugins/optimizer.py): transformers' default is not its
    v1 = any("LLaMA-Factory v1 config" in setting.source for setting in merged.values())
    if (framework is not None and framework.value == "transformers" and "optimizer" not in merged
            and "fused_optimizer" not in merged and not v1):
        # TrainingArguments' default optim is adamw_torch_fused with torch >= 2.8 (transformers PR #37358, merged
        # 2025-07; axolotl's default since its PR #2293): one fused kernel, no state-sized step temporary
        merged["fused_optimizer"] = Setting(True, "transformers' default optim adamw_torch_fused (torch >= 2.8)",
                                            framework.where)
        notes.append("optimizer: the trainer's default, adamw_torch_fused with torch >= 2.8 (fused AdamW: no "
                     "state-sized step temporary); an image with older torch or transformers runs the foreach "
                     "AdamW, whose step holds one more state-sized buffer: pass --optim adamw_torch to predict that")
    _fsdp_when_several_gpus(merged, notes)
    _training_world(merged, notes)
    _micro_batch_within_global(merged)
    _accumulation_from_global_batch(merged, notes)
    every = merged.get("checkpoint_every_n_layers")
    checkpointing = merged.get("gradient_checkpointing")
    if every is not None and not (checkpointing is not None and str(checkpointing.value).strip().lower() in
                                  ("true", "full")):
        # transformers reads activation_checkpointing_kwargs only when activation checkpointing is on
        notes.append(f"checkpoint_every_n_layers from {every.source} ignored: gradient checkpointing is off "
                     f"({checkpointing.source if checkpointing else 'default'})")
        del merged["checkpoint_every_n_layers"]
    only_trained = merged.get("checkpoint_trained_blocks_only")
    if only_trained is not None and not (checkpointing is not None and str(checkpointing.value).strip().lower() in
                                         ("true", "full")):
        del merged["checkpoint_trained_blocks_only"]  # implied by LLaMA-Factory's checkpointing: off, nothing to say
    return merged, {k: s.source for k, s in merged.items()}


def _catalog_name(merged: Settings, field: str) -> tuple[bool, list[str]]:
    """Whether ``merged[field]`` names a catalog model, as written or as a variant of one (an ``-Instruct``, a dated
    refresh: the name is then replaced by the base's, with a note); ``(True, notes)``, else ``(False, [the catalog's
    hint])``."""
    setting = merged[field]
    name = setting.value
    try:
        lookup_model(name)
        return True, []
    except SpecError as exc:
        hint = exc.problems[0].hint if exc.problems else ""
    base = name
    while (stripped := _VARIANT_SUFFIX.sub("", base)) != base:
        base = stripped
        try:
            lookup_model(base)
        except SpecError:
            continue
        merged[field] = Setting(base, setting.source, setting.where)
        return True, [f"{field} {name} read as {base} (same architecture; the catalog lists the base model)"]
    return False, [hint] if hint else []


def _check_teacher(merged: Settings) -> list[str]:
    """A distillation teacher a command names that vramfit cannot size (an API model such as gpt-4o-mini, a local
    checkpoint) is dropped with a note: it refused the whole job at prediction time. One the annotation names stays
    (an error there is the annotation's to fix)."""
    setting = merged.get("teacher_model")
    if setting is None or not isinstance(setting.value, str) or ANNOTATION in setting.source:
        return []
    name = setting.value
    known, notes = _catalog_name(merged, "teacher_model")
    if known:
        return notes
    del merged["teacher_model"]
    return [f"teacher_model {name!r} ({setting.source}) is no model vramfit can size (an API model or a local "
            "checkpoint): a teacher on these GPUs is not in the prediction; name it in the vramfit.io/spec annotation "
            "(teacher_model: a catalog name or a config)"]


def _check_critic(merged: Settings) -> list[str]:
    """A PPO critic a command names that vramfit cannot size (most often a local checkpoint of a reward model) is
    predicted as the policy's model, the usual starting point of a critic, with a note: dropping it would leave a
    second trained model out of the prediction, and refusing it refused the whole job. One the annotation names
    stays (an error there is the annotation's to fix)."""
    setting = merged.get("critic_model")
    if setting is None or not isinstance(setting.value, str) or ANNOTATION in setting.source:
        return []
    known, notes = _catalog_name(merged, "critic_model")
    if known:
        return notes
    policy = merged.get("model")
    if policy is None:
        for key in [k for k in merged if k.startswith("critic_")]:
            del merged[key]
        return [f"critic_model {setting.value!r} ({setting.source}) is no model vramfit can size: the critic is not "
                "in the prediction"]
    merged["critic_model"] = Setting(policy.value, f"{setting.source}; no model vramfit can size (a local "
                                     "checkpoint?), predicted as the policy's model", setting.where)
    return [f"critic_model {setting.value!r} ({setting.source}) is no model vramfit can size (a local checkpoint?): "
            "predicted as the policy's model; name it in the vramfit.io/spec annotation (critic_model: a catalog name "
            "or a config)"]


def _check_model(obj: ObjectRef, merged: Settings) -> list[str]:
    """Validate a model name against the catalog; keep the name, or a catalog-known variant of it."""
    setting = merged["model"]
    name = setting.value
    if not isinstance(name, str):
        return []
    known, notes = _catalog_name(merged, "model")
    if known:
        return notes
    hint = notes[0] if notes else ""
    local = name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or (name.startswith("$") and "/" in name)
    if local and (found := _catalog_tail(name)) is not None:
        # a checkpoint directory laid out as the Hub names it ($HOME/models/Qwen/Qwen2.5-7B-Instruct,
        # /mnt/models/Meta-Llama-3-8B): read as that catalog model, said so (a fine-tune of it has its shape)
        merged["model"] = Setting(found, f"{setting.source} {name} (its last path components)", setting.where)
        return [f"model {name!r} is a local path: read as the catalog model {found!r} its last components name (the "
                "same architecture if it is that model or a fine-tune of it); name the model in the vramfit.io/spec "
                "annotation if not"]
    if not local and (read := _prequantized_base(merged)) is not None:
        return read
    what = "is a local path, which vramfit cannot read" if local else "is not in the model catalog"
    quantized = _QUANTIZED_CHECKPOINT.search(name)
    if quantized:  # the base model alone would be read as 16-bit weights: say how to give the quantization too
        what += (f"; it is a {quantized.group(1).upper()} checkpoint: annotate its base model with method: qlora and "
                 f"quantization: {'nf4' if quantized.group(1).lower() == 'bnb' else 'gptq-int4'}")
    raise obj.error(
        setting.where,
        f"{setting.source} names the model {name!r}, which {what}",
        f"{ANNOTATION_HINT}; {hint}" if hint and not local else ANNOTATION_HINT,
    )


def _catalog_tail(path: str) -> str | None:
    """The catalog model a local path's last two components (``org/name``) or last component name, if any."""
    # ModelScope's snapshot_download writes a name's '.' as '___' (Qwen/Qwen2___5-7B-Instruct)
    parts = [p.replace("___", ".") for p in path.rstrip("/").split("/") if p]
    for candidate in (["/".join(parts[-2:])] if len(parts) >= 2 else []) + parts[-1:]:
        if candidate.startswith(("$", "~", ".")):
            continue
        if (found := _base_in_catalog(candidate)) is not None:
            return found
    return None


# Name parts of a quantized checkpoint (hugging-quants/...-GPTQ-INT4, ...-AWQ, unsloth/...-bnb-4bit)
_QUANTIZED_CHECKPOINT = re.compile(r"[-_](gptq|awq|bnb)(?:[-_]|$)", re.IGNORECASE)
# Re-uploads of a model quantized ahead of time, by their name's ending: bitsandbytes 4-bit (unsloth/...-bnb-4bit,
# ...-unsloth-bnb-4bit: NF4 with double quantization in their quantization_config) and FP8 (Qwen's ...-FP8, fine-grained
# FP8 blocks: transformers dequantizes them to train, so the weights are read as the base's 16-bit ones)
_BNB_4BIT_SUFFIX = re.compile(r"(?:-unsloth)?-bnb-4bit$", re.IGNORECASE)
_FP8_SUFFIX = re.compile(r"-fp8(?:-dynamic)?$", re.IGNORECASE)


def _base_in_catalog(name: str) -> str | None:
    """``name`` or the first of its variant-suffix-stripped forms (``-Instruct``, ``-2507``) that the catalog knows."""
    base = name
    while True:
        try:
            lookup_model(base)
            return base
        except SpecError:
            pass
        stripped = _VARIANT_SUFFIX.sub("", base)
        if stripped == base:
            return None
        base = stripped


def _prequantized_base(merged: Settings) -> list[str] | None:
    """A Hub checkpoint quantized ahead of time whose base model the catalog knows: read as that base, with LoRA over
    a bitsandbytes 4-bit checkpoint being QLoRA (the stored NF4 weights stay frozen: Unsloth's and PEFT's loaders keep
    them); None when the name is no such re-upload, its base is unknown, or the job trains it in full (the 4-bit
    weights cannot be trained: the error then says how to annotate it)."""
    setting = merged["model"]
    name = str(setting.value)
    if (bnb := _BNB_4BIT_SUFFIX.search(name)) is not None:
        base = _base_in_catalog(name[:bnb.start()])
        method = merged.get("method")
        if base is None or method is None or method.value not in ("lora", "qlora"):
            return None
        merged["model"] = Setting(base, f"{setting.source} {name} (a bitsandbytes 4-bit re-upload of {base})",
                                  setting.where)
        notes = [f"model {name} read as {base} with its weights in 4 bits (NF4, double quantization): a "
                 "bitsandbytes 4-bit checkpoint"]
        if method.value == "lora":
            merged["method"] = Setting("qlora", f"{method.source}, over the 4-bit checkpoint {name}", method.where)
            notes[0] += f"; LoRA over it ({method.source}) is QLoRA"
        merged.setdefault("quantization", Setting("nf4-dq", f"{name} (bnb-4bit: NF4, double quantization)",
                                                  setting.where))
        return notes
    if (fp8 := _FP8_SUFFIX.search(name)) is not None and (base := _base_in_catalog(name[:fp8.start()])) is not None:
        merged["model"] = Setting(base, f"{setting.source} {name} (an FP8 re-upload of {base})", setting.where)
        return [f"model {name} read as {base}: an FP8 checkpoint, its weights counted as 16-bit (transformers "
                "dequantizes fine-grained FP8 weights to train; an over-estimate of the frozen weights if they stay "
                "FP8)"]
    return None


# Families whose positions are a learned table (GPT-2, GPT-BigCode, OPT; the BERT-style encoders): no sequence longer
# than the table trains, so a job that states no length runs at most that long (transformers' run_clm, for one, takes
# min(1024, the tokenizer's limit) as its block size)
_LEARNED_POSITIONS = ("gpt2", "gpt_bigcode", "opt")


def _architecture(merged: Settings) -> Architecture | None:
    """The merged model's architecture (a catalog name or an inline config), or None when it cannot be built."""
    value = merged["model"].value
    if not isinstance(value, (str, dict)):
        return None
    try:
        config = lookup_model(value).config if isinstance(value, str) else dict(value.get("config") or {})
        return architecture_from_config(config)
    except (SpecError, ValueError, TypeError, KeyError):
        return None


def _cap_default_seq_len(merged: Settings, where: str) -> list[str]:
    """When no source sets ``seq_len`` and the TrainingSpec default is longer than a learned position table the model
    has, the table's length instead (noted)."""
    if "seq_len" in merged:
        return []
    arch = _architecture(merged)
    if arch is None:
        return []
    default = TrainingSpec.model_fields["seq_len"].default
    learned = arch.model_type in _LEARNED_POSITIONS or arch.is_encoder_only
    limit = arch.max_position_embeddings
    if not learned or not 0 < limit < default:
        return []
    merged["seq_len"] = Setting(limit, f"the model's {limit} learned positions (the TrainingSpec default {default} "
                                       "is longer)", where)
    return [f"seq_len = {limit}: the job sets none, and {arch.model_type} has {limit} learned positions"]


# The trainable_layers sources of LLaMA-Factory's freeze tuning (scheduler.spec.trainer_args.llamafactory_freeze)
_LLAMAFACTORY_FREEZE_KEYS = ("freeze_trainable_layers", "num_layer_trainable", "freeze_extra_modules",
                             "use_llama_pro")


def _freeze_tuning_moe_notes(merged: Settings) -> list[str]:
    """LLaMA-Factory's freeze tuning on a Mixture-of-Experts model. It picks the trained blocks by the substring
    ``.{i}.`` of parameter names (model/adapter.py _setup_freeze_tuning; v1 plugins/model_plugins/peft.py
    get_freeze_model), which also matches expert i of every MoE block where transformers keeps the experts as a
    ModuleList (``mlp.experts.{i}.gate_proj``, transformers 4.x): those experts train too, and backward runs down to
    the lowest block holding one. Not modelled (transformers releases that fuse the experts into one tensor per block
    have no such match): noted as an under-estimate."""
    setting, method = merged.get("trainable_layers"), merged.get("method")
    if setting is None or (method is not None and method.value != "full") or \
            not any(key in setting.source for key in _LLAMAFACTORY_FREEZE_KEYS):
        return []
    arch = _architecture(merged)
    count = launch_count(abs(setting.value)) if isinstance(setting.value, int) else None
    if arch is None or not arch.is_moe or count is None or not arch.num_moe_layers:
        return []
    layers = arch.num_layers
    if "use_llama_pro" in setting.source:
        stride = max(layers // count, 1)
        ids = list(range(stride - 1, layers, stride))
    else:
        ids = list(range(max(0, layers - count), layers)) if setting.value > 0 else list(range(min(count, layers)))
    matched = [i for i in ids if i < arch.num_experts]
    if not matched:
        return []
    expert_params = sum(g.params for g in arch.linears if g.expert) / (arch.num_experts * arch.num_moe_layers)
    extra = len(matched) * arch.num_moe_layers * expert_params
    path = ("backward, which vramfit stops at the lowest trained block, runs down to the first MoE block"
            if setting.value > 0 and "use_llama_pro" not in setting.source else
            "backward already runs through every block as read")
    shown = ", ".join(str(i) for i in matched[:8]) + (", ..." if len(matched) > 8 else "")
    return [f"trainable_layers from {setting.source}: LLaMA-Factory picks the trained blocks by the substring '.i.' "
            f"of parameter names, which in this MoE model also matches expert {shown} of each of its "
            f"{arch.num_moe_layers} MoE blocks where transformers keeps the experts as separate modules (4.x): up to "
            f"{extra / 1e9:.2f}B more parameters train with gradients and optimizer states not counted, and {path}: "
            "an under-estimate (none where the experts are one fused tensor per block)"]


def _validate(obj: ObjectRef, merged: Settings) -> TrainingSpec:
    data: dict[str, Any] = {}
    for key, setting in merged.items():
        if key.startswith("lora."):
            data.setdefault("lora", {})[key.split(".", 1)[1]] = setting.value
        else:
            data[key] = setting.value
    try:
        return parse_training_spec(data, source=obj.source, prefix="spec")
    except SpecError as exc:
        problems = []
        for p in exc.problems:
            name = p.path.removeprefix("spec.").split(".")[0].split("[")[0]
            if name == "lora" and p.path.count(".") >= 2:
                name = "lora." + p.path.split(".")[2].split("[")[0]
            setting = merged.get(name)
            if setting is None:
                problems.append(p)
            else:
                problems.append(FieldProblem(setting.where, f"{setting.source}: {name} {p.message}", p.hint))
        raise SpecError(problems, source=f"{obj.source}: {obj.ref}" if obj.source else obj.ref) from None


def _defaults_assumed(spec: TrainingSpec, merged: Settings) -> list[str]:
    out = [
        f"{name} = {value} (TrainingSpec default; the job does not say)"
        for name, value in _DEFAULTS
        if name not in merged
    ]
    if "sharding" not in merged:
        out.append(f"sharding = {spec.resolved_sharding()} (default for gpus = {spec.gpus})")
    if spec.method == "qlora" and "quantization" not in merged:
        out.append(f"quantization = {spec.resolved_quantization} (default for qlora)")
    if spec.method != "full":
        lora = spec.resolved_lora
        assert lora is not None
        if not any(k.startswith("lora.") for k in merged):
            out.append(
                f"lora rank {lora.rank}, alpha {lora.alpha:g}, target_modules {lora.target_modules} (defaults)"
            )
        else:  # some set (LORA_R alone in the env): the others are the TrainingSpec's defaults, said as such
            unset = [f"{name} {getattr(lora, name)}" for name in ("rank", "alpha", "target_modules", "dropout")
                     if f"lora.{name}" not in merged]
            if unset:
                out.append(f"lora {', '.join(unset)} (TrainingSpec defaults; the job does not say)")
    return out
