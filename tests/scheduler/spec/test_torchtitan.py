"""torchtitan jobs: the TOML config the manifest carries, dotted flags over it, torchtitan's defaults."""

from __future__ import annotations

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
    assert (s.precision, s.sharding, s.torch_compile) == ("bf16-mixed", "fsdp", True)
    assert job.provenance["micro_batch_size"] == "torchtitan pipeline_parallel_microbatch_size default 1"


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


def test_an_unknown_flavor_is_noted_and_the_model_asked_for() -> None:
    outcomes = scan(pod([*TITAN, "--model.name", "deepseek_v3", "--model.flavor", "671B"], gpus=8))
    assert not any(isinstance(o, ParsedJob) for o in outcomes)
    assert isinstance(outcomes[0], SpecError) and "no model found" in str(outcomes[0])


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
