"""Merge order (object < trainer args < env < annotation), provenance and assumptions."""

from __future__ import annotations

from typing import Any

import pytest

from predictors.errors import SpecError
from scheduler.spec.document import NoTrainingJob, read_jobs_text
from scheduler.spec.merge import ANNOTATION
from scheduler.spec.pods import ObjectRef, read_container
from scheduler.spec.yamltext import MAX_EMBEDDED_CHARS
from tests.scheduler.spec.helpers import dump, one_job, pod, scan

ARGS = [
    "python",
    "train.py",
    "--model_name_or_path",
    "gpt2",
    "--per_device_train_batch_size",
    "2",
    "--bf16",
    "--use_peft",
    "--lora_r",
    "8",
]

CASES = [
    # (id, env, annotation, field, value, source)
    ("args-only", {}, None, "micro_batch_size", 2, "flag --per_device_train_batch_size"),
    (
        "env-beats-args",
        {"ACCELERATE_MIXED_PRECISION": "fp16"},
        None,
        "precision",
        "16-mixed",
        "env ACCELERATE_MIXED_PRECISION",
    ),
    (
        "annotation-beats-args",
        {},
        "micro_batch_size: 16",
        "micro_batch_size",
        16,
        "annotation vramfit.io/spec",
    ),
    (
        "annotation-beats-env",
        {"ACCELERATE_MIXED_PRECISION": "fp16"},
        "precision: 32-true",
        "precision",
        "32-true",
        "annotation vramfit.io/spec",
    ),
    (
        "annotation-beats-env-model",
        {"MODEL_ID": "bert-base-uncased"},
        "model: gpt2-medium",
        "model",
        "gpt2-medium",
        "annotation vramfit.io/spec",
    ),
    ("env-model-beats-args", {"MODEL_ID": "gpt2-medium"}, None, "model", "gpt2-medium", "env MODEL_ID"),
    # the one exception: a pod gets the GPUs it requests, whatever the annotation says (a note says so)
    ("resources-beat-annotation-gpus", {}, "gpus: 4", "gpus", 2, "pod 1 pod x 2 GPU (nvidia.com/gpu limits)"),
    ("annotation-gpus-auto-beats-resources", {}, "gpus: auto", "gpus", "auto", "annotation vramfit.io/spec"),
    (
        "annotation-lora-merges-with-args",
        {},
        "lora: {alpha: 64}",
        "lora",
        {"rank": 8, "alpha": 64.0, "target_modules": ["q_proj", "v_proj"], "dropout": 0.05},
        "annotation vramfit.io/spec",
    ),
]


@pytest.mark.parametrize(
    ("env", "annotation", "name", "value", "source"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_merge_order(
    env: dict[str, str], annotation: str | None, name: str, value: object, source: str
) -> None:
    annotations = {"vramfit.io/spec": annotation} if annotation else None
    job = one_job(pod(ARGS, env, gpus=2, annotations=annotations))
    assert job.spec.model_dump()[name] == value
    key = "lora.alpha" if name == "lora" else name
    assert job.provenance[key] == source


def test_annotation_gpus_that_disagree_with_the_pods_request_are_noted() -> None:
    job = one_job(pod(ARGS, gpus=2, annotations={"vramfit.io/spec": "gpus: 4"}))
    assert any(a.startswith("gpus 4 in vramfit.io/spec ignored: the job requests 2 GPUs") for a in job.assumptions)


def test_full_method_from_annotation_drops_lora_settings_with_a_note() -> None:
    job = one_job(pod(ARGS, annotations={"vramfit.io/spec": "method: full"}))
    assert job.spec.method == "full" and job.spec.lora is None
    assert any(a.startswith("lora.rank from flag --lora_r ignored: method is full") for a in job.assumptions)


def test_defaults_are_listed_as_assumptions() -> None:
    job = one_job(pod(["python", "train.py", "--model_name_or_path", "Qwen/Qwen2.5-0.5B"], gpus=4))
    assert job.provenance == {
        "gpus": "pod 1 pod x 4 GPU (nvidia.com/gpu limits)",
        "model": "flag --model_name_or_path",
    }
    assert "seq_len = 2048 (TrainingSpec default; the job does not say)" in job.assumptions
    assert "sharding = ddp (default for gpus = 4)" in job.assumptions
    assert len([a for a in job.assumptions if "default" in a]) == 10


def test_an_unstated_sequence_stops_at_a_learned_position_table() -> None:
    """GPT-2 has 1,024 learned positions and BERT 512: a job that states no length runs at most that long (the
    TrainingSpec default 2,048 would size a sequence the model cannot take); a stated length is kept."""
    gpt2 = one_job(pod(["python", "train.py", "--model_name_or_path", "gpt2"]))
    assert gpt2.spec.seq_len == 1024
    assert "seq_len = 1024: the job sets none, and gpt2 has 1024 learned positions" in gpt2.assumptions
    assert one_job(pod(["python", "train.py", "--model_name_or_path", "bert-base-uncased"])).spec.seq_len == 512
    stated = one_job(pod(["python", "train.py", "--model_name_or_path", "gpt2", "--max_seq_length", "256"]))
    assert stated.spec.seq_len == 256
    assert one_job(pod(["python", "train.py", "--model_name_or_path", "t5-base"])).spec.seq_len == 2048  # relative


def test_hf_trainer_scripts_get_training_arguments_defaults() -> None:
    """transformers' run_clm.py with --do_train and no batch or precision flag trains 8 sequences per device in fp32
    (TrainingArguments defaults), not the TrainingSpec's 1 in bf16."""
    job = one_job(pod(["python", "run_clm.py", "--model_name_or_path", "gpt2", "--dataset_name", "wikitext",
                       "--do_train", "--output_dir", "/tmp/out"]))
    assert (job.spec.micro_batch_size, job.spec.precision, job.spec.seq_len) == (8, "32-true", 1024)
    assert any("HF Trainer defaults" in a for a in job.assumptions), job.assumptions
    flagged = one_job(pod(["python", "run_clm.py", "--model_name_or_path", "gpt2", "--do_train", "--bf16",
                           "--per_device_train_batch_size", "2"]))
    assert (flagged.spec.micro_batch_size, flagged.spec.precision) == (2, "bf16-mixed")


def test_instruct_variant_is_read_as_its_base_model() -> None:
    job = one_job(pod(["python", "t.py", "--model_name_or_path", "tiiuae/falcon-7b-chat"]))
    assert job.spec.model == "tiiuae/falcon-7b"
    assert any("falcon-7b-chat read as tiiuae/falcon-7b" in a for a in job.assumptions)


@pytest.mark.parametrize(("given", "base"), [
    ("Qwen/Qwen3-4B-Instruct-2507", "Qwen/Qwen3-4B"),  # LLaMA-Factory's examples/train_lora/qwen3_lora_sft.yaml
    ("Qwen/Qwen3-30B-A3B-Thinking-2507", "Qwen/Qwen3-30B-A3B"),
    ("casperhansen/llama-3-70b-fp16", "casperhansen/llama-3-70b"),  # axolotl's examples/llama-3/qlora-fsdp-70b
])
def test_dated_and_dtype_re_releases_are_read_as_their_base_model(given: str, base: str) -> None:
    job = one_job(pod(["python", "t.py", "--model_name_or_path", given]))
    assert job.spec.model == base
    assert any(f"{given.split('/')[-1]} read as {base}" in a for a in job.assumptions), job.assumptions


def test_a_quantized_checkpoint_is_not_read_as_its_base_model() -> None:
    """A 4-bit re-upload stores other weights than its base: the error names the base model to annotate."""
    outcomes = scan(pod(["python", "t.py", "--model_name_or_path", "unsloth/llama-3-8b-bnb-4bit"]))
    assert isinstance(outcomes[0], SpecError) and "did you mean llama-3-8b" in str(outcomes[0])


@pytest.mark.parametrize(("argv", "base"), [
    (["python", "unsloth-cli.py", "--model_name", "unsloth/llama-3-8b-bnb-4bit", "--r", "16"], "unsloth/llama-3-8b"),
    (["trl", "sft", "--model_name_or_path", "unsloth/Qwen2.5-7B-Instruct-unsloth-bnb-4bit", "--use_peft",
      "--dataset_name", "x"], "unsloth/Qwen2.5-7B-Instruct"),
])
def test_lora_over_a_bnb_4bit_checkpoint_is_qlora_of_its_base(argv: list[str], base: str) -> None:
    """Unsloth's notebooks and scripts train LoRA over its bitsandbytes re-uploads (``-bnb-4bit``): the job was refused
    for a model not in the catalog. Read as QLoRA (NF4, double quantization) of the base, said so."""
    job = one_job(pod(argv))
    assert (job.spec.model, job.spec.method, job.spec.resolved_quantization) == (base, "qlora", "nf4-dq")
    assert "over the 4-bit checkpoint" in job.provenance["method"]
    assert any("bitsandbytes 4-bit checkpoint" in a for a in job.assumptions)


def test_an_fp8_re_upload_is_read_as_its_base_with_a_note() -> None:
    job = one_job(pod(["trl", "sft", "--model_name_or_path", "Qwen/Qwen3-30B-A3B-Thinking-2507-FP8", "--use_peft",
                       "--dataset_name", "x"]))
    assert (job.spec.model, job.spec.method) == ("Qwen/Qwen3-30B-A3B", "lora")
    assert any("an FP8 checkpoint, its weights counted as 16-bit" in a for a in job.assumptions)


def test_catalogued_instruct_id_resolves_directly() -> None:
    job = one_job(pod(["python", "t.py", "--model_name_or_path", "meta-llama/Llama-3.2-1B-Instruct"]))
    assert job.spec.model == "meta-llama/Llama-3.2-1B-Instruct"
    assert not any("read as" in a for a in job.assumptions)


def test_affinity_pin_and_uncatalogued_label() -> None:
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "karpenter.k8s.aws/instance-gpu-name", "operator": "In", "values": ["l4"]}
                        ]
                    }
                ]
            }
        }
    }
    job = one_job(pod(ARGS, affinity=affinity))
    assert (job.pinned_gpu, job.spec.gpu) == ("L4", "L4")
    assert job.provenance["gpu"] == "node label karpenter.k8s.aws/instance-gpu-name=l4"
    odd = one_job(pod(ARGS, nodeSelector={"cloud.google.com/gke-accelerator": "nvidia-tesla-k80"}))
    assert odd.pinned_gpu is None and odd.spec.gpu is None
    assert any("not in the catalog; not pinned" in a for a in odd.assumptions)


@pytest.mark.parametrize(("label", "value", "gpu"), [
    ("gpu.nvidia.com/class", "A100_NVLINK_80GB", "A100-80GB"),  # CoreWeave
    ("gpu.nvidia.com/class", "A100_NVLINK", "A100-40GB"),  # its 40 GB card: not the catalog's plain "A100" (80 GB)
    ("gpu.nvidia.com/class", "A100_PCIE_40GB", "A100-40GB"),
    ("gpu.nvidia.com/class", "A100_PCIE_80GB", "A100-80GB-PCIe"),
    ("gpu.nvidia.com/model", "A40", "A40"),
    ("eks.amazonaws.com/instance-gpu-name", "l40s", "L40S"),  # EKS Auto Mode
    ("node.kubernetes.io/instance-type", "p5.48xlarge", "H100-80GB"),  # the cloud machine type
    ("node.kubernetes.io/instance-type", "a3-ultragpu-8g", "H200"),
    ("node.kubernetes.io/instance-type", "Standard_ND96amsr_A100_v4", "A100-80GB"),
    # session 30, from a review of real manifests: SageMaker HyperPod's ml. types, Oracle's bare-metal shapes, Nebius
    # platforms and Karpenter's instance family were ignored (a note, no pin)
    ("node.kubernetes.io/instance-type", "ml.p5.48xlarge", "H100-80GB"),
    ("node.kubernetes.io/instance-type", "BM.GPU.H100.8", "H100-80GB"),
    ("node.kubernetes.io/instance-type", "BM.GPU4.8", "A100-40GB"),
    ("node.kubernetes.io/instance-type", "BM.GPU.L40S-NC.4", "L40S"),
    ("node.kubernetes.io/instance-type", "gpu-h200-sxm.8gpu-128vcpu-1600gb", "H200"),
    ("karpenter.k8s.aws/instance-family", "p5", "H100-80GB"),
    ("karpenter.k8s.aws/instance-family", "p5en", "H200"),
    ("karpenter.k8s.aws/instance-family", "g6e", "L40S"),
])
def test_gpu_labels_of_more_clouds_pin_the_gpu(label: str, value: str, gpu: str) -> None:
    """The GPU-type labels of CoreWeave, EKS Auto Mode and the machine types of AWS, GCP and Azure pin the job's GPU;
    they were ignored without a note, so placement could pick another GPU than the one the job is bound to."""
    job = one_job(pod(ARGS, nodeSelector={label: value}))
    assert (job.pinned_gpu, job.spec.gpu) == (gpu, gpu)
    cpu = one_job(pod(ARGS, nodeSelector={"node.kubernetes.io/instance-type": "m5.large"}))
    assert cpu.pinned_gpu is None


def test_annotation_without_gpu_request_makes_gpus_auto() -> None:
    job = one_job(pod(["python", "t.py"], gpus=0, annotations={"vramfit.io/spec": "model: gpt2"}))
    assert job.spec.gpus == "auto" and job.pod_templates == []


def test_read_jobs_skips_configmaps_and_reports_a_file_without_jobs() -> None:
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}}
    jobs = read_jobs_text(dump(configmap, pod(ARGS)), "f.yaml")
    assert [j.ref for j in jobs] == ["Pod trainer"]
    with pytest.raises(NoTrainingJob) as info:
        read_jobs_text(dump(configmap, pod(ARGS, gpus=0)), "f.yaml")
    assert "ConfigMap c: is not a workload" in str(info.value)
    assert "Pod trainer: no container requests nvidia.com/gpu" in str(info.value)


def test_objects_that_travel_with_gpu_jobs_do_not_fail_the_file() -> None:
    """A GB200 job as NVIDIA documents it (a ComputeDomain beside the pods), a DRA job's ResourceClaimTemplate, a
    Kueue ProvisioningRequest with its PodTemplate: reported as no training job, so the file's pod is still predicted
    (they failed the whole file as unsupported kinds before)."""
    companions = [
        {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain", "metadata": {"name": "imex"}},
        {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaimTemplate", "metadata": {"name": "claim"}},
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "tpl"}},
        {"apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest", "metadata": {"name": "req"}},
    ]
    jobs = read_jobs_text(dump(*companions, pod(ARGS)), "f.yaml")
    assert [j.ref for j in jobs] == ["Pod trainer"]
    with pytest.raises(NoTrainingJob) as info:
        read_jobs_text(dump(*companions), "f.yaml")
    assert "ComputeDomain imex: is not a workload" in str(info.value)


def test_plain_training_spec_still_reads() -> None:
    jobs = read_jobs_text("model: llama-2-7b\nmethod: lora\n", "spec.yaml")
    assert jobs[0].kind == "TrainingSpec" and jobs[0].pod_templates == [] and jobs[0].pinned_gpu is None


def test_an_inline_trainer_config_above_the_cap_is_noted_and_skipped() -> None:
    config = "base_model: mistralai/Mistral-7B-v0.1\nadapter: lora\n" + "# padding\n" * (MAX_EMBEDDED_CHARS // 10)
    job = one_job(pod(env={"AXOLOTL_CONFIG": config}, annotations={ANNOTATION: "model: llama-3.2-1b"}))
    assert job.spec.model == "llama-3.2-1b" and job.spec.method != "lora"
    note = "env.AXOLOTL_CONFIG is 65,582 characters long; vramfit reads at most 65,536 (64 KiB) here; it was not read"
    assert any(note in a for a in job.assumptions), job.assumptions


def test_a_spec_annotation_above_the_cap_is_a_named_error() -> None:
    outcomes = scan(pod(annotations={ANNOTATION: "model: llama-3.2-1b\n" + "x: 1\n" * 20_000}))
    text = str(outcomes[0])
    assert 'metadata.annotations["vramfit.io/spec"]' in text
    assert "is 100,020 characters long; vramfit reads at most 65,536 (64 KiB)" in text


def test_scripts_and_inline_configs_of_all_containers_share_one_budget() -> None:
    # Three containers, each with a 50,000-character env value: the first two fit the job's 131,072; the third is
    # noted, not parsed (before the budget, 100 such containers cost 50 s of YAML parsing in one review).
    obj = pod(annotations={ANNOTATION: "model: llama-3.2-1b"})
    value = "{x: [" + "1," * 25_000 + "1]}"
    obj["spec"]["containers"] = [
        {"name": f"c{i}", "image": "i", "resources": {"limits": {"nvidia.com/gpu": 1}},
         "env": [{"name": "CFG", "value": value}]} for i in range(3)]
    job = one_job(obj)
    past = [a for a in job.assumptions if "past the 131,072 characters of scripts and configs" in a]
    assert len(past) == 1 and past[0].startswith("spec.containers[2].env.CFG is 50,008 characters long"), past


def test_kubernetes_var_expansion_is_bounded_per_object() -> None:
    # Env values may name earlier ones: ten references each make 10**9 characters of nine values, and every arg
    # of every container may name the largest. Expansion stops at 256 KiB added to the object; the rest stays.
    env = {"L0": "x" * 10, **{f"L{i}": f"$(L{i - 1})" * 10 for i in range(1, 10)}}
    obj = pod(["python", "train.py", "--model_name_or_path", "$(L9)"], env=env,
              annotations={ANNOTATION: "model: llama-3.2-1b"})
    obj["spec"]["containers"] = [dict(obj["spec"]["containers"][0], name=f"c{i}", args=["$(L4)"] * 50)
                                 for i in range(20)]
    job = one_job(obj)
    assert job.spec.model == "llama-3.2-1b"
    ref = ObjectRef("Pod", "p", "", "")
    container = read_container(ref, obj["spec"]["containers"][0], ("spec", "containers", 0))
    assert container.env["L4"] == "x" * 100_000 and container.env["L5"] == "x" * 100_000 + "$(L4)" * 9
    assert sum(map(len, container.env.values())) + sum(map(len, container.argv)) < 300_000
    assert ref.expansion.left < 256 * 1024 - 100_000


def test_hf_trainer_batch_under_deepspeed_and_fsdp_and_no_trainer_scripts() -> None:
    """Under DeepSpeed an HF Trainer fills "auto" (and must match any stated batch) with TrainingArguments'
    per_device_train_batch_size, 8 by default; FSDP takes the Trainer's batch too. transformers' *_no_trainer
    scripts build torch.optim.AdamW themselves: not the Trainer's fused default. A DeepSpeed config under another
    flag (Ray's template: --ds-config) is read as --deepspeed is, "auto" values included (it used to fail)."""
    import json

    ds = {"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": "auto",
          "gradient_accumulation_steps": "auto", "fp16": {"enabled": "auto"}}
    base = ["deepspeed", "run_clm.py", "--model_name_or_path", "gpt2", "--do_train", "--fp16"]
    inline = one_job(pod([*base, "--deepspeed", json.dumps(ds)], gpus=8))
    assert (inline.spec.micro_batch_size, inline.spec.sharding, inline.spec.precision) == (8, "zero3", "16-mixed")
    uncarried = one_job(pod([*base, "--deepspeed", "/cfg/ds_zero3.json"], gpus=8))
    assert uncarried.spec.micro_batch_size == 8
    fsdp = one_job(pod(["torchrun", "--nproc_per_node", "2", "run_clm.py", "--model_name_or_path", "gpt2",
                        "--do_train", "--fsdp", "full_shard auto_wrap"], gpus=2))
    assert (fsdp.spec.micro_batch_size, fsdp.spec.sharding, fsdp.spec.precision) == (8, "fsdp", "32-true")
    no_trainer = one_job(pod(["accelerate", "launch", "run_clm_no_trainer.py", "--model_name_or_path", "gpt2",
                              "--per_device_train_batch_size", "2"]))
    assert no_trainer.spec.fused_optimizer is False
    cfg = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ds"},
           "data": {"zero_3.json": json.dumps(ds)}}
    ray_style = scan(cfg, pod(["python", "finetune.py", "--model_name", "meta-llama/Llama-2-7b-hf",
                               "--ds-config", "./deepspeed_configs/zero_3.json"], gpus=8))
    jobs = [o for o in ray_style if not isinstance(o, Exception) and hasattr(o, "spec")]
    assert jobs and jobs[0].spec.sharding == "zero3", ray_style


def test_llama_cookbook_flags_lora_env_vars_and_template_variables() -> None:
    """Meta's llama-cookbook finetuning.py (--enable_fsdp, --fsdp_config.pure_bf16, --batch_size_training,
    --context_length, --quantization 4bit), a tutorial image's LORA_R / MAX_SEQ_LENGTH env vars, and an unfilled
    template variable where a count belongs, named as such."""
    from predictors.errors import SpecError as Problem
    from tests.scheduler.spec.helpers import scan

    job = one_job(pod(["torchrun", "--nnodes=2", "--nproc_per_node=8", "finetuning.py", "--enable_fsdp",
                       "--fsdp_config.pure_bf16", "--model_name", "meta-llama/Meta-Llama-3-8B",
                       "--batch_size_training=8", "--context_length", "4096"], gpus=16))
    s = job.spec
    assert (s.sharding, s.precision, s.micro_batch_size, s.seq_len) == ("fsdp", "bf16-true", 8, 4096)
    quantized = one_job(pod(["python", "finetuning.py", "--use_peft", "--peft_method", "lora", "--quantization",
                             "4bit", "--model_name", "meta-llama/Meta-Llama-3-8B"]))
    assert quantized.spec.method == "qlora"
    env = one_job(pod(["python", "/finetune.py"], env={"MODEL_NAME": "google/gemma-2b", "LORA_R": "8",
                                                      "MAX_SEQ_LENGTH": "512"}))
    assert env.spec.method == "lora" and env.spec.lora is not None and env.spec.lora.rank == 8
    assert env.spec.seq_len == 512
    templated = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "t"},
                 "spec": {"pytorchReplicaSpecs": {"Worker": {"replicas": "$NUM_NODES", "template": {"spec": {
                     "containers": [{"name": "pytorch", "image": "x", "command": ["torchrun", "train.py"],
                                     "resources": {"limits": {"nvidia.com/gpu": 8}}}]}}}}}}
    outcome = scan(templated)[0]
    assert isinstance(outcome, Problem) and "unfilled template variable" in str(outcome), outcome
    # the placeholder words repositories leave for a sed to fill get the same hint (aws-samples' verl RayCluster)
    for word in ("PLACEHOLDER_NUM_NODES", "<NUM_NODES>", "__NUM_NODES__"):
        templated["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = word
        outcome = scan(templated)[0]
        assert isinstance(outcome, Problem) and "unfilled template variable" in str(outcome), (word, outcome)


def _ds_configmap(key: str, stage: int, name: str = "ds") -> dict[str, Any]:
    import json

    data = {"zero_optimization": {"stage": stage}, "train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": True}}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {key: json.dumps(data)}}


def _hf_pod(config_path: str, volumes: list[dict[str, Any]], mounts: list[dict[str, Any]]) -> dict[str, Any]:
    job = pod(["deepspeed", "run_clm.py", "--model_name_or_path", "gpt2", "--do_train", "--bf16",
               "--deepspeed", config_path], gpus=8, volumes=volumes)
    job["spec"]["containers"][0]["volumeMounts"] = mounts
    return job


def test_a_configmap_key_mounted_under_another_name_is_read() -> None:
    """A volume's ``items`` (key -> path) and a ``subPath`` mount give a ConfigMap key another file name; the
    command names that file. It used to be missed (the key's own name was the only one looked up)."""
    items = [{"name": "cfg", "configMap": {"name": "ds", "items": [{"key": "ds_config.json", "path": "zero.json"}]}}]
    renamed = one_job(_ds_configmap("ds_config.json", 3),
                      _hf_pod("/etc/ds/zero.json", items, [{"name": "cfg", "mountPath": "/etc/ds"}]))
    assert renamed.spec.sharding == "zero3", renamed.assumptions
    whole = [{"name": "cfg", "configMap": {"name": "ds"}}]
    sub_path = one_job(_ds_configmap("stage-3", 3), _hf_pod(
        "/workspace/deepspeed.json", whole,
        [{"name": "cfg", "mountPath": "/workspace/deepspeed.json", "subPath": "stage-3"}]))
    assert sub_path.spec.sharding == "zero3", sub_path.assumptions
    # an item path in a folder, mounted with subPath at a file of its own, from a projected volume
    projected = [{"name": "cfg", "projected": {"sources": [
        {"configMap": {"name": "other", "items": [{"key": "x", "path": "x"}]}},
        {"configMap": {"name": "ds", "items": [{"key": "ds_config.json", "path": "conf/z.json"}]}}]}}]
    nested = one_job(_ds_configmap("x", 1, name="other"), _ds_configmap("ds_config.json", 2), _hf_pod(
        "/opt/ds.json", projected, [{"name": "cfg", "mountPath": "/opt/ds.json", "subPath": "conf/z.json"}]))
    assert nested.spec.sharding == "zero2", nested.assumptions


def test_a_renamed_key_beats_another_configmaps_key_of_that_name() -> None:
    """Two ConfigMaps: one has a key ``zero.json`` (stage 1) that this container does not mount; the one it mounts
    projects its ``stage3`` key to ``zero.json``. The container reads what it mounts."""
    items = [{"name": "cfg", "configMap": {"name": "ds", "items": [{"key": "stage3", "path": "zero.json"}]}}]
    job = one_job(_ds_configmap("zero.json", 1, name="unused"), _ds_configmap("stage3", 3),
                  _hf_pod("/etc/ds/zero.json", items, [{"name": "cfg", "mountPath": "/etc/ds"}]))
    assert job.spec.sharding == "zero3", job.assumptions


def test_mounts_of_configmaps_the_manifest_lacks_or_malformed_volumes_change_nothing() -> None:
    """A mount of a ConfigMap that is not in the file, and volumes the API server would refuse, leave the reading
    as before: the file name alone (no stage in it: a note), no crash."""
    elsewhere = [{"name": "cfg", "configMap": {"name": "not-here", "items": [{"key": "a", "path": "zero.json"}]}}]
    missing = one_job(_hf_pod("/etc/ds/zero.json", elsewhere, [{"name": "cfg", "mountPath": "/etc/ds"}]))
    assert any("zero.json" in n for n in missing.assumptions), missing.assumptions
    for volumes, mounts in (
        ("not a list", [{"name": "cfg", "mountPath": "/etc/ds"}]),
        ([{"name": "cfg", "configMap": {"name": "ds", "items": "x"}}, 7, {"configMap": {}}], "not a list"),
        ([{"name": "cfg", "configMap": {"name": "ds", "items": [{"key": 1}, "x"]}}],
         [{"name": "cfg", "mountPath": 5, "subPath": "a"}, {"name": "cfg"}, None]),
        ([{"name": "cfg", "projected": {"sources": [None, {"configMap": "x"}]}}], [{"name": "cfg", "subPath": "/"}]),
    ):
        job = one_job(_ds_configmap("ds_config.json", 3), _hf_pod("/etc/ds/zero.json", volumes, mounts))
        assert job.spec.sharding != "zero3"


def test_a_rayjob_entrypoint_reads_the_file_its_head_pod_mounts() -> None:
    """A RayJob's entrypoint runs in the head pod: the file name it gives is looked up in the head's mounts
    first. Here the head projects ``stage3`` to ``ds.json`` and the workers project ``stage1`` to the same name."""

    def group(key: str, gpus: int) -> dict[str, Any]:
        spec = {"containers": [{"name": "ray", "image": "rayproject/ray:2.9",
                                "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}],
                                **({"resources": {"limits": {"nvidia.com/gpu": gpus}}} if gpus else {})}],
                "volumes": [{"name": "cfg", "configMap": {"name": "ds", "items": [{"key": key, "path": "ds.json"}]}}]}
        return {"rayStartParams": {}, "template": {"spec": spec}}

    configmap = _ds_configmap("stage3", 3)
    configmap["data"]["stage1"] = configmap["data"]["stage3"].replace('"stage": 3', '"stage": 1')
    rayjob = {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "rj"}, "spec": {
        "entrypoint": "deepspeed run_clm.py --model_name_or_path gpt2 --do_train --bf16 --deepspeed /cfg/ds.json",
        "rayClusterSpec": {"headGroupSpec": group("stage3", 0),
                           "workerGroupSpecs": [{"groupName": "gpu", "replicas": 2, **group("stage1", 4)}]}}}
    job = one_job(configmap, rayjob)
    assert job.spec.sharding == "zero3", job.assumptions


def test_lora_defaults_beside_a_stated_rank_are_said() -> None:
    """GKE's Gemma tutorials set LORA_R and LORA_ALPHA only: the dropout and target modules are the TrainingSpec's
    defaults, which the assumptions now name (they had no provenance and no note)."""
    job = one_job(pod(["python", "finetune.py"], env={"MODEL_ID": "google/gemma-2b", "LORA_R": "16",
                                                      "LORA_ALPHA": "32"}))
    assert job.spec.method == "lora"
    assert any("target_modules ['q_proj', 'v_proj']" in a and "dropout 0.05" in a and "rank" not in a
               for a in job.assumptions), job.assumptions
