"""litgpt fine-tuning jobs: the CLI's commands, its dotted flags and the YAML config a manifest carries, with
litgpt's own defaults (litgpt/finetune/lora.py and full.py setup()). Before, none of it was read: an 8B QLoRA recipe
was a full fine-tune at batch 1 (159.6 GiB: fits no GPU), and without an annotation no model was found."""

from __future__ import annotations

from typing import Any

import yaml

from predictors.catalog import resolve_model
from predictors.vram import predict_vram
from tests.scheduler.spec.helpers import one_job, pod, scan

# Lightning-AI/litgpt config_hub/finetune/llama-3.1-8b/qlora.yaml (4705387), the keys vramfit reads
QLORA_YAML = {
    "checkpoint_dir": "checkpoints/meta-llama/Meta-Llama-3.1-8B", "out_dir": "out/finetune/qlora-llama3.1-8b",
    "precision": "bf16-true", "quantize": "bnb.nf4", "devices": 1, "num_nodes": 1, "lora_r": 32, "lora_alpha": 16,
    "lora_dropout": 0.05, "lora_query": True, "lora_key": False, "lora_value": True, "lora_projection": False,
    "lora_mlp": False, "lora_head": False,
    "train": {"save_interval": 200, "log_interval": 1, "global_batch_size": 8, "micro_batch_size": 1,
              "lr_warmup_steps": 10, "epochs": 1, "max_seq_length": 512},
    "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.0002, "weight_decay": 0.0}},
}


def _job(command: list[str], gpus: int = 1, config: dict[str, Any] | None = None) -> Any:
    docs: list[Any] = []
    if config is not None:
        docs.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
                     "data": {"qlora.yaml": yaml.safe_dump(config)}})
    docs.append(pod(command, gpus=gpus))
    return one_job(*docs)


def _notes(job: Any) -> str:
    return " | ".join(job.assumptions)


def test_a_config_hub_recipe_the_manifest_carries_is_read() -> None:
    job = _job(["litgpt", "finetune_lora", "--config", "/cfg/qlora.yaml"], config=QLORA_YAML)
    s = job.spec
    assert (s.method, s.quantization, s.precision, s.micro_batch_size, s.seq_len) == (
        "qlora", "nf4", "bf16-true", 1, 512)
    assert s.lora is not None and (s.lora.rank, s.lora.target_modules) == (32, ["q_proj", "v_proj"])
    assert (s.sharding, s.gradient_checkpointing, s.grad_accum_steps) == ("none", "none", 8)
    assert resolve_model(s).architecture.num_layers == 32  # checkpoints/meta-llama/Meta-Llama-3.1-8B
    assert "litgpt config /cfg/qlora.yaml key quantize" in job.provenance["method"]


def test_cli_flags_and_litgpt_defaults() -> None:
    """The positional checkpoint (a Hugging Face id or checkpoints/<org>/<name>), dotted --train.* flags, and litgpt's
    defaults for what the job leaves out: r 8 on query and value, micro-batch 1, global batch 16, bf16-mixed."""
    job = _job(["litgpt", "finetune_lora", "meta-llama/Llama-2-7b-hf", "--quantize", "bnb.nf4-dq", "--precision",
                "bf16-true", "--lora_r", "16", "--lora_mlp", "true", "--train.micro_batch_size=2",
                "--train.max_seq_length", "1024"])
    s = job.spec
    assert (s.method, s.quantization, s.micro_batch_size, s.seq_len, s.grad_accum_steps) == (
        "qlora", "nf4-dq", 2, 1024, 8)
    assert s.lora is not None and s.lora.rank == 16
    assert s.lora.target_modules == ["q_proj", "v_proj", "gate_proj", "up_proj", "down_proj"]
    plain = _job(["litgpt", "finetune", "checkpoints/meta-llama/Llama-2-7b-hf"])
    assert (plain.spec.method, plain.spec.precision, plain.spec.micro_batch_size) == ("lora", "bf16-mixed", 1)
    assert plain.spec.lora is not None and plain.spec.lora.rank == 8
    assert "litgpt train.max_seq_length not set" in _notes(plain)


def test_more_than_one_device_is_fsdp_with_every_block_checkpointed() -> None:
    """finetune_full on 4 devices: Fabric's FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy=
    {Block}); the optimizer from {class_path, init_args}. Before: DDP without checkpointing, 190 GiB per GPU."""
    full = _job(["litgpt", "finetune_full", "meta-llama/Llama-2-7b-hf", "--devices", "4", "--train.micro_batch_size",
                 "1", "--train.max_seq_length", "512", "--optimizer.class_path", "torch.optim.SGD"], gpus=4)
    s = full.spec
    assert (s.method, s.sharding, s.gradient_checkpointing, s.gpus, s.grad_accum_steps, s.optimizer) == (
        "full", "fsdp", "full", 4, 4, "sgd")
    peak = predict_vram(s, resolve_model(s).architecture).peak_reserved_bytes
    assert peak < 60 * 2**30
    # the script form, and devices left at litgpt's default 1 on a pod of 4 GPUs (3 stay idle: noted)
    script = _job(["python", "litgpt/finetune/full.py", "--checkpoint_dir", "checkpoints/meta-llama/Llama-2-7b-hf"],
                  gpus=4)
    assert (script.spec.sharding, script.spec.gradient_checkpointing) == ("none", "none")


def test_what_litgpt_itself_refuses_is_noted_and_unknown_settings_are_not_guessed() -> None:
    no_precision = _job(["litgpt", "finetune_lora", "meta-llama/Llama-2-7b-hf", "--quantize", "bnb.nf4"])
    assert "litgpt refuses with quantization" in _notes(no_precision)
    missing = _job(["litgpt", "finetune_lora", "meta-llama/Llama-2-7b-hf", "--config", "/cfg/elsewhere.yaml"])
    assert "litgpt config /cfg/elsewhere.yaml is not in the manifest" in _notes(missing)
    # adapter fine-tuning and pretraining are not litgpt commands vramfit reads: the model is still asked for
    outcomes = scan(pod(["litgpt", "pretrain", "--model_name", "pythia-14m"]))
    assert not any(getattr(o, "spec", None) is not None and o.spec.method == "qlora" for o in outcomes)


def test_devices_auto_is_every_gpu_of_the_pod() -> None:
    """litgpt's devices auto / -1 is every GPU the process sees (parse_devices: torch.cuda.device_count()): on a
    pod of one GPU that is no FSDP and no checkpointing (it was read as FSDP with every block checkpointed, 18.7 GiB
    where the job needs 57.4), on a pod of four both."""
    command = ["litgpt", "finetune_lora", "meta-llama/Llama-2-7b-hf", "--precision", "bf16-true",
               "--train.max_seq_length", "2048", "--devices"]
    one = _job([*command, "auto"], gpus=1).spec
    assert (one.sharding, one.gradient_checkpointing) == ("none", "none")
    four = _job([*command, "-1"], gpus=4).spec
    assert (four.sharding, four.gradient_checkpointing) == ("fsdp", "full")
