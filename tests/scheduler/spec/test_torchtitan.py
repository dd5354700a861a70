"""torchtitan jobs: the TOML config the manifest carries, dotted flags over it, torchtitan's defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from predictors.errors import SpecError
from scheduler.spec.document import ParsedJob
from scheduler.spec.torchtitan import is_torchtitan
from tests.scheduler.spec.helpers import one_job, pod, scan

CONFIG_8B = """[model]
name = "llama3"
flavor = "8B"
[training]
local_batch_size = 2
seq_len = 8192
steps = 1000
[parallelism]
data_parallel_shard_degree = -1
[activation_checkpoint]
mode = "selective"
selective_ac_option = "op"
[compile]
enable = true
[optimizer]
name = "AdamW"
implementation = "fused"
"""
MODELS_DIR = Path(__file__).resolve().parents[3] / "predictors" / "data" / "models"
TITAN = ["torchrun", "--nproc_per_node=8", "-m", "torchtitan.train"]


def _heredoc(config: str, command: str, path: str = "/tmp/llama3_8b.toml") -> list[str]:
    return ["bash", "-c", f"cat > {path} <<EOF\n{config}EOF\n{command}"]


def test_config_in_the_manifest_then_flags_over_it() -> None:
    job = one_job(pod(_heredoc(CONFIG_8B, " ".join([*TITAN, "--job.config_file", "/tmp/llama3_8b.toml",
                                                    "--training.local_batch_size", "4",
                                                    "--parallelism.tensor_parallel_degree=2"])), gpus=8))
    s = job.spec
    assert (s.model, s.micro_batch_size, s.seq_len, s.steps) == ("llama-3.1-8b", 4, 8192, 1000)
    assert (s.tensor_parallel, s.sharding, s.precision, s.gradient_checkpointing) == (2, "fsdp", "bf16-mixed",
                                                                                      "selective")
    assert (s.optimizer, s.fused_optimizer, s.torch_compile, s.framework) == ("adamw", True, True, None)
    assert job.provenance["micro_batch_size"] == "flag --training.local_batch_size"
    assert job.provenance["seq_len"] == "torchtitan config /tmp/llama3_8b.toml [training] seq_len"
    assert job.provenance["precision"] == "torchtitan mixed_precision_param default bfloat16"


def test_flags_only_take_torchtitans_defaults_and_the_pipeline_microbatch() -> None:
    """No config file: torchtitan's defaults (selective AC every 2nd block, bf16 mixed precision, FSDP over the
    rest); under pipeline parallelism the micro-batch is the pipeline's (default 1), not the local batch."""
    job = one_job(pod([*TITAN, "--model.name", "llama3", "--model.flavor", "70B", "--training.local_batch_size",
                       "8", "--training.seq_len", "4096", "--parallelism.tensor_parallel_degree", "8",
                       "--parallelism.pipeline_parallel_degree", "2", "--compile.enable"], gpus=16))
    s = job.spec
    assert (s.model, s.seq_len, s.micro_batch_size, s.tensor_parallel, s.pipeline_parallel) == (
        "llama-3.1-70b", 4096, 1, 8, 2)
    assert (s.gradient_checkpointing, s.checkpoint_every_n_layers) == ("full", 2)
    assert job.provenance["checkpoint_every_n_layers"] == "torchtitan selective_ac_option default 2"
    # under pipeline parallelism torchtitan's reshard_after_forward "default" is False (apply_fsdp: not pp_enabled):
    # the stage keeps its gathered parameters from forward to backward, as SHARD_GRAD_OP; its Adam is fused by default
    assert (s.precision, s.sharding, s.torch_compile, s.fused_optimizer) == ("bf16-mixed", "fsdp-grad-op", True, True)
    assert job.provenance["micro_batch_size"] == "torchtitan pipeline_parallel_microbatch_size default 1"
    resharded = one_job(pod([*TITAN, "--model.name", "llama3", "--model.flavor", "70B",
                             "--parallelism.pipeline_parallel_degree", "2",
                             "--parallelism.fsdp_reshard_after_forward", "always", "--optimizer.implementation",
                             "foreach"], gpus=16)).spec
    assert (resharded.sharding, resharded.fused_optimizer) == ("fsdp", False)


def test_options_that_change_the_model_states() -> None:
    job = one_job(pod([*TITAN, "--model.name=qwen3", "--model.flavor=1.7B", "--training.dtype=bfloat16",
                       "--parallelism.fsdp_reshard_after_forward=never", "--activation_checkpoint.mode=selective",
                       "--activation_checkpoint.selective_ac_option=4", "--optimizer.early_step_in_backward",
                       "--model.converters=float8"], gpus=4))
    s = job.spec
    assert (s.model, s.precision, s.sharding) == ("qwen3-1.7b", "bf16-true", "fsdp-grad-op")
    assert (s.gradient_checkpointing, s.checkpoint_every_n_layers, s.optimizer_in_backward) == ("full", 4, True)
    assert any("Float8" in a for a in job.assumptions), job.assumptions


def test_a_config_the_manifest_does_not_carry_leaves_its_settings_unknown() -> None:
    job = one_job(pod(["bash", "-c", "CONFIG_FILE=./train_configs/llama3_8b.toml ./run_train.sh "
                                     "--model.name llama3 --model.flavor 8B --training.seq_len 2048"], gpus=8))
    assert job.spec.model == "llama-3.1-8b" and job.spec.seq_len == 2048
    assert job.spec.gradient_checkpointing == "none"  # no torchtitan default: the config may set it
    assert any("llama3_8b.toml is not in the manifest" in a for a in job.assumptions), job.assumptions


def test_an_unknown_flavor_is_named_in_the_error_and_the_model_asked_for() -> None:
    outcomes = scan(pod([*TITAN, "--model.name", "deepseek_v3", "--model.flavor", "236B"], gpus=8))
    assert not any(isinstance(o, ParsedJob) for o in outcomes)
    message = str(outcomes[0])
    assert isinstance(outcomes[0], SpecError) and "no model found" in message
    assert "torchtitan model deepseek_v3 flavor 236B (flag --model.name) is not in vramfit's table" in message
    assert "deepseek_v3 16B" in message and "vramfit.io/spec" in message


# torchtitan's flavors (torchtitan/models/<name>/flavors.py) and the shapes the catalog entry must have
FLAVOR_SHAPES = {
    ("llama3", "1B"): {"hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
                       "num_key_value_heads": 8, "intermediate_size": 8192, "tie_word_embeddings": True},
    ("llama3", "3B"): {"hidden_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 24,
                       "num_key_value_heads": 8, "intermediate_size": 8192, "tie_word_embeddings": True},
    ("qwen3", "30B-A3B"): {"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
                           "num_key_value_heads": 4, "head_dim": 128, "moe_intermediate_size": 768,
                           "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936},
    ("deepseek_v3", "16B"): {"hidden_size": 2048, "num_hidden_layers": 27, "num_attention_heads": 16,
                             "q_lora_rank": None, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                             "qk_rope_head_dim": 64, "v_head_dim": 128, "intermediate_size": 10944,
                             "moe_intermediate_size": 1408, "n_routed_experts": 64, "n_shared_experts": 2,
                             "num_experts_per_tok": 6, "first_k_dense_replace": 1, "vocab_size": 102400},
    ("deepseek_v3", "671B"): {"hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
                              "q_lora_rank": 1536, "kv_lora_rank": 512, "intermediate_size": 18432,
                              "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
                              "num_experts_per_tok": 8, "first_k_dense_replace": 3, "vocab_size": 129280},
}


@pytest.mark.parametrize(("name", "flavor"), sorted(FLAVOR_SHAPES))
def test_flavors_resolve_to_catalog_models_of_the_same_shape(name: str, flavor: str) -> None:
    job = one_job(pod([*TITAN, "--model.name", name, "--model.flavor", flavor], gpus=8))
    config = json.loads((MODELS_DIR / f"{job.spec.model}.json").read_text())
    assert {key: config.get(key) for key in FLAVOR_SHAPES[(name, flavor)]} == FLAVOR_SHAPES[(name, flavor)]


def test_float8_only_when_a_converter_or_the_old_switch_turns_it_on() -> None:
    """The presets carry a [float8] (or [quantize.linear.float8]) table of all-gather options with the converter
    commented out: that is bf16 training. A converter naming float8, or 2024's enable_float8_linear, turns it on."""
    base = [*TITAN, "--model.name", "llama3", "--model.flavor", "8B"]
    options_only = one_job(pod([*base, "--float8.enable_fsdp_float8_all_gather", "false",
                                "--quantize.linear.float8.filter_fqns", "output"], gpus=8))
    assert not any("Float8" in a for a in options_only.assumptions), options_only.assumptions
    for switch in (["--model.converters", "quantize.linear.float8"], ["--float8.enable_float8_linear"]):
        job = one_job(pod([*base, *switch], gpus=8))
        assert any("Float8" in a for a in job.assumptions), (switch, job.assumptions)


def test_expert_parallelism_is_noted() -> None:
    job = one_job(pod([*TITAN, "--model.name", "qwen3", "--model.flavor", "30B-A3B",
                       "--parallelism.expert_parallel_degree", "2"], gpus=8))
    assert job.spec.model == "qwen3-30b-a3b" and job.spec.sharding == "fsdp"
    assert any("expert_parallel_degree 2" in a for a in job.assumptions), job.assumptions


def test_detection() -> None:
    assert is_torchtitan(["python", "-m", "torchtitan.train"])
    assert is_torchtitan(["python", "/workspace/torchtitan/train.py"])
    assert is_torchtitan(["./run_train.sh"])
    assert not is_torchtitan(["torchrun", "train.py", "--model_name_or_path", "x"])


def test_global_batch_becomes_gradient_accumulation() -> None:
    """global_batch_size 64 on 8 GPUs with TP 2 (4 data-parallel ranks) at local batch 4: 64 / (4 x 4) = 4."""
    job = one_job(pod([*TITAN, "--model.name", "llama3", "--model.flavor", "8B", "--training.local_batch_size", "4",
                       "--training.global_batch_size", "64", "--parallelism.tensor_parallel_degree", "2"], gpus=8))
    assert job.spec.grad_accum_steps == 4
    assert job.provenance["grad_accum_steps"].startswith("flag --training.global_batch_size")
    odd = one_job(pod([*TITAN, "--model.name", "llama3", "--model.flavor", "8B", "--training.local_batch_size", "3",
                       "--training.global_batch_size", "64"], gpus=8))
    assert odd.spec.grad_accum_steps == 1
    assert any("not a whole multiple" in a for a in odd.assumptions), odd.assumptions


@pytest.mark.parametrize("option", ["1:4", "0", "²", "op"])
def test_a_selective_option_that_is_no_block_count_is_not_read_as_one(option: str) -> None:
    """"1:4" (a launcher's range, which the shared count reader accepts) crashed int(); none of these is a count."""
    outcomes = scan(pod([*TITAN, "--model.name=qwen3", "--model.flavor=1.7B", "--activation_checkpoint.mode=selective",
                         f"--activation_checkpoint.selective_ac_option={option}"], gpus=4))
    jobs = [o for o in outcomes if isinstance(o, ParsedJob)]
    assert len(jobs) == 1 and jobs[0].spec.checkpoint_every_n_layers is None
