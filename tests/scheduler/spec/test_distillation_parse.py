"""Distillation jobs read with their teacher: torchtune's KD recipes (shipped configs, carried configs) and TRL's
GKD script. Before, the teacher was only noted, and the 8B teacher of torchtune's 8B_to_1B configs (16 GB of bf16
weights) was missing from the prediction."""

from __future__ import annotations

from typing import Any

import yaml

from tests.scheduler.spec.helpers import one_job, pod


def _notes(job: Any) -> str:
    return "\n".join(job.assumptions)


def test_torchtune_shipped_kd_config_reads_student_and_teacher() -> None:
    job = one_job(pod(["tune", "run", "knowledge_distillation_single_device", "--config",
                       "llama3_2/8B_to_1B_KD_lora_single_device"]))
    s = job.spec
    assert (s.model, s.teacher_model, s.method, s.micro_batch_size, s.cross_entropy) == (
        "llama-3.2-1b", "llama-3.1-8b", "lora", 4, "chunked")
    assert s.lora is not None and s.lora.rank == 64
    assert "8B_to_1B_KD_lora_single_device (shipped" in job.provenance["teacher_model"]
    qwen = one_job(pod(["tune", "run", "--nproc_per_node", "2", "knowledge_distillation_distributed", "--config",
                        "qwen2/1.5_to_0.5B_KD_lora_distributed"], gpus=2)).spec
    assert (qwen.model, qwen.teacher_model, qwen.sharding) == ("qwen2-0.5b", "qwen2-1.5b", "fsdp")


def test_an_unknown_kd_config_names_the_student_not_the_teacher() -> None:
    """A KD config vramfit does not ship is named teacher size first: 8B_to_1B is a 1B student."""
    job = one_job(pod(["tune", "run", "knowledge_distillation_single_device", "--config",
                       "llama3_2/8B_to_1B_KD_single_device_custom"]))
    assert job.spec.model == "llama-3.2-1b"
    assert job.spec.teacher_model is None
    assert "its teacher is not known" in _notes(job)


def test_torchtune_carried_config_teacher_component() -> None:
    config = {"model": {"_component_": "torchtune.models.qwen2_5.lora_qwen2_5_1_5b_instruct",
                        "lora_attn_modules": ["q_proj", "v_proj"], "lora_rank": 16, "lora_alpha": 32},
              "teacher_model": {"_component_": "torchtune.models.qwen2_5.qwen2_5_7b_instruct"},
              "batch_size": 2, "dtype": "bf16", "tokenizer": {"max_seq_len": 2048}}
    cfg = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
           "data": {"kd.yaml": yaml.safe_dump(config)}}
    job = one_job(cfg, pod(["tune", "run", "knowledge_distillation_single_device", "--config", "/cfg/kd.yaml"]))
    assert (job.spec.model, job.spec.teacher_model) == ("qwen2.5-1.5b", "qwen2.5-7b")
    unknown = {**config, "teacher_model": {"_component_": "my_models.build_teacher"}}
    cfg["data"] = {"kd.yaml": yaml.safe_dump(unknown)}
    job = one_job(cfg, pod(["tune", "run", "knowledge_distillation_single_device", "--config", "/cfg/kd.yaml"]))
    assert job.spec.teacher_model is None
    assert "the teacher build_teacher" in _notes(job) and "set teacher_model" in _notes(job)


def test_trl_gkd_teacher_flag() -> None:
    """TRL's examples/scripts/gkd.py: --teacher_model_name_or_path, loaded by GKDTrainer beside the student."""
    job = one_job(pod(["python", "examples/scripts/gkd.py", "--model_name_or_path", "Qwen/Qwen2-0.5B-Instruct",
                       "--teacher_model_name_or_path", "Qwen/Qwen2-1.5B-Instruct", "--per_device_train_batch_size",
                       "16", "--gradient_checkpointing", "--bf16"]))
    assert (job.spec.model, job.spec.teacher_model) == ("Qwen/Qwen2-0.5B-Instruct", "Qwen/Qwen2-1.5B-Instruct")
    assert "float32 before transformers 5" in _notes(job)


def test_kd_recipes_train_lora_and_the_older_shipped_names() -> None:
    """torchtune's knowledge_distillation_* recipes train the student's LoRA adapters (_setup_model:
    get_adapter_params); 8B_to_1B_KD_distributed is the older name of the LoRA config (pytorch/torchtune@082b750)."""
    job = one_job(pod(["tune", "run", "--nproc_per_node", "2", "knowledge_distillation_distributed", "--config",
                       "llama3_2/8B_to_1B_KD_distributed"], gpus=2))
    assert (job.spec.method, job.spec.teacher_model, job.spec.micro_batch_size) == ("lora", "llama-3.1-8b", 4)
    older = one_job(pod(["tune", "run", "knowledge_distillation_single_device", "--config",
                         "qwen2/knowledge_distillation_single_device"])).spec  # pytorch/torchtune@0b3e04a
    assert (older.model, older.teacher_model, older.grad_accum_steps) == ("qwen2-0.5b", "qwen2-1.5b", 2)
    assert older.lora is not None and older.lora.target_modules == ["q_proj", "k_proj", "v_proj"]
    # the older distributed configs (pytorch/torchtune@307791d, @1c3b4ef, @082b750) and the recipe's first name
    # kd_distributed (@0bb49dc): FSDP over the pod's GPUs
    for recipe, config, model, accum in [
        ("knowledge_distillation_distributed", "llama3_2/knowledge_distillation_distributed", "llama-3.2-1b", 32),
        ("knowledge_distillation_distributed", "qwen2/knowledge_distillation_distributed", "qwen2-0.5b", 8),
        ("knowledge_distillation_distributed", "qwen2/1.5_to_0.5B_KD_distributed", "qwen2-0.5b", 8),
        ("kd_distributed", "qwen2/kd_distributed", "qwen2-0.5b", 2),
    ]:
        spec = one_job(pod(["tune", "run", "--nproc_per_node", "2", recipe, "--config", config], gpus=2)).spec
        assert (spec.method, spec.model, spec.grad_accum_steps, spec.sharding) == ("lora", model, accum, "fsdp"), config
        assert spec.teacher_model in ("llama-3.1-8b", "qwen2-1.5b"), config
    assert one_job(pod(["tune", "run", "kd_single_device", "--config", "qwen2/kd_single_device"])).spec.method == "lora"
    unknown = one_job(pod(["tune", "run", "knowledge_distillation_single_device", "--config",
                           "llama3_2/8B_to_1B_KD_mine"]))
    assert unknown.spec.method == "lora"
    assert unknown.provenance["method"].endswith("knowledge_distillation_single_device (trains LoRA adapters)")


def test_axolotl_gkd_teacher_and_trl_distillation_defaults() -> None:
    """axolotl's GKD plugin (examples/gkd/qwen3-0.6B-gkd.yaml: gkd_teacher) holds the teacher in-process; TRL's
    trl/scripts/distillation.py takes --teacher_model_name_or_path with DistillationConfig's defaults
    (gradient checkpointing on, bf16)."""
    config = {"base_model": "Qwen/Qwen3-0.6B", "plugins": ["axolotl.integrations.gkd.GKDPlugin"],
              "gkd_trainer": True, "gkd_teacher": "Qwen/Qwen3-4B", "sequence_len": 2048, "micro_batch_size": 1,
              "bf16": "auto", "gradient_checkpointing": True}
    cfg = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
           "data": {"gkd.yaml": yaml.safe_dump(config)}}
    job = one_job(cfg, pod(["axolotl", "train", "/cfg/gkd.yaml"]))
    assert (job.spec.model, job.spec.teacher_model) == ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-4B")
    trl = one_job(pod(["python", "trl/scripts/distillation.py", "--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct",
                       "--teacher_model_name_or_path", "Qwen/Qwen2.5-1.5B-Instruct", "--use_peft"]))
    assert (trl.spec.teacher_model, trl.spec.gradient_checkpointing, trl.spec.precision) == (
        "Qwen/Qwen2.5-1.5B-Instruct", "full", "bf16-mixed")
    assert "trl distillation defaults" in _notes(trl)
