"""GaLore read as the trainers run it: transformers' --optim galore_* with --optim_args rank and
--optim_target_modules (trainer_optimizer.py: rank 128 by default, layer-wise variants stepped in the gradient
hooks), LLaMA-Factory's use_galore (galore_rank 16, galore_target all). Before, GaLore was read as AdamW's full
states: Llama-2-7B on one GPU (bf16-true AdamW, rank 128, 256 tokens, checkpointed) needed 66.6 GiB instead of
29.5."""

from __future__ import annotations

from typing import Any

import yaml

from tests.scheduler.spec.helpers import one_job, pod

M = "meta-llama/Llama-2-7b-hf"
HF = ["python", "train.py", "--model_name_or_path", M, "--bf16", "--per_device_train_batch_size", "1"]


def test_transformers_galore_flags() -> None:
    job = one_job(pod([*HF, "--optim", "galore_adamw_8bit_layerwise", "--optim_target_modules", "attn", "mlp",
                       "--optim_args", "rank=1024, update_proj_gap=500, scale=0.25"]))
    s = job.spec
    assert (s.optimizer, s.galore_rank, s.optimizer_in_backward) == ("adamw-8bit", 1024, True)
    assert s.galore_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    default = one_job(pod([*HF, "--optim", "galore_adamw", "--optim_target_modules", r".*.attn.*"])).spec
    assert (default.galore_rank, default.galore_target_modules, default.optimizer_in_backward) == (
        128, ["q_proj", "k_proj", "v_proj", "o_proj"], None)


def test_llamafactory_use_galore() -> None:
    config = {"model_name_or_path": M, "stage": "sft", "do_train": True, "finetuning_type": "full",
              "use_galore": True, "galore_layerwise": True, "template": "llama2", "cutoff_len": 1024,
              "per_device_train_batch_size": 1, "gradient_accumulation_steps": 1, "bf16": True}
    cfg = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
           "data": {"galore.yaml": yaml.safe_dump(config)}}
    job = one_job(cfg, pod(["llamafactory-cli", "train", "/cfg/galore.yaml"]))
    s = job.spec
    assert (s.method, s.galore_rank, s.galore_target_modules, s.optimizer_in_backward) == (
        "full", 16, "all-linear", True)
    assert "galore_rank default 16" in job.provenance["galore_rank"]


def test_llamafactory_freeze_tuning() -> None:
    """finetuning_type freeze (hparams/finetuning_args.py FreezeArguments): the last freeze_trainable_layers blocks
    train, 2 by default; a module subset or extra modules are noted with the direction of the error."""
    base = {"model_name_or_path": M, "stage": "sft", "do_train": True, "finetuning_type": "freeze",
            "template": "llama2", "cutoff_len": 1024, "per_device_train_batch_size": 1, "bf16": True}

    def job(**extra: object) -> Any:
        cfg = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
               "data": {"freeze.yaml": yaml.safe_dump({**base, **extra})}}
        return one_job(cfg, pod(["llamafactory-cli", "train", "/cfg/freeze.yaml"]))

    default = job()
    assert (default.spec.method, default.spec.trainable_layers) == ("full", 2)
    assert "freeze_trainable_layers default 2" in default.provenance["trainable_layers"]
    assert not any("read as full fine-tuning" in n for n in default.assumptions)
    first = job(freeze_trainable_layers=-4, freeze_trainable_modules="mlp", freeze_extra_modules="embed_tokens")
    assert first.spec.trainable_layers == -4
    notes = " ".join(first.assumptions)
    assert "freeze_trainable_modules mlp" in notes and "an over-estimate" in notes
    assert "freeze_extra_modules embed_tokens" in notes and "an under-estimate" in notes


def test_llamafactory_badam_is_one_block_at_a_time() -> None:
    """BAdam's layer mode trains one decoder block at a time; the worst moment is the first block's turn, backward
    running through every block: trainable_layers -1. Its ratio mode stays full fine-tuning, noted."""
    base = {"model_name_or_path": M, "stage": "sft", "do_train": True, "finetuning_type": "full", "use_badam": True,
            "badam_switch_interval": 50, "template": "llama2", "cutoff_len": 1024, "per_device_train_batch_size": 1,
            "pure_bf16": True}

    def job(**extra: object) -> Any:
        cfg = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
               "data": {"badam.yaml": yaml.safe_dump({**base, **extra})}}
        return one_job(cfg, pod(["llamafactory-cli", "train", "/cfg/badam.yaml"]))

    layer = job()
    assert (layer.spec.method, layer.spec.trainable_layers) == ("full", -1)
    assert "BAdam trains one block at a time" in layer.provenance["trainable_layers"]
    ratio = job(badam_mode="ratio")
    assert ratio.spec.trainable_layers is None
    assert any("badam_mode ratio" in a and "over-estimate" in a for a in ratio.assumptions)


def test_apollo_is_read_as_galores_projected_states() -> None:
    """APOLLO (transformers' apollo_adamw: rank 128 by default, GaLore's _setup_low_rank_optimizer; LLaMA-Factory's
    use_apollo: apollo_rank 16, apollo_target all) keeps AdamW's moments on a random rank-r projection: GaLore's
    states, where before it was AdamW's full states."""
    hf = one_job(pod([*HF, "--optim", "apollo_adamw_layerwise", "--optim_target_modules", "attn", "mlp"])).spec
    assert (hf.optimizer, hf.galore_rank, hf.optimizer_in_backward) == ("adamw", 128, True)
    assert hf.galore_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    ranked = one_job(pod([*HF, "--optim", "apollo_adamw", "--optim_args", "rank=256,proj=random"])).spec
    assert ranked.galore_rank == 256
    config = {"model_name_or_path": M, "stage": "sft", "do_train": True, "finetuning_type": "full",
              "use_apollo": True, "template": "llama2", "cutoff_len": 1024, "per_device_train_batch_size": 1,
              "bf16": True}
    cfg = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
           "data": {"apollo.yaml": yaml.safe_dump(config)}}
    lf = one_job(cfg, pod(["llamafactory-cli", "train", "/cfg/apollo.yaml"]))
    assert (lf.spec.galore_rank, lf.spec.galore_target_modules, lf.spec.optimizer_in_backward) == (
        16, "all-linear", None)
    assert any("use_apollo" in a for a in lf.assumptions)
