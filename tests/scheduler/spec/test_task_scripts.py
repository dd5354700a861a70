"""transformers' task example scripts, Unsloth's CLI and Lightning's Trainer flags, read from real commands (the
review of session 28: /work/drafts/review_s28_parse in the session's notes). Each test names what was read before."""

from __future__ import annotations

from scheduler.spec.document import ParsedJob
from tests.scheduler.spec.helpers import one_job, pod, scan

BERT = "bert-large-uncased"


def _job(*argv: str, gpus: int = 1, annotations: dict[str, str] | None = None) -> ParsedJob:
    return one_job(pod(list(argv), gpus=gpus, annotations=annotations))


def test_a_data_file_is_not_taken_for_an_unread_trainer_config() -> None:
    """transformers' README command for run_ner.py on one's own files (`--train_file train.json`): the .json data
    file counted as a trainer config vramfit could not read, which switched off TrainingArguments' defaults
    (batch 8, fp32): batch 1 in bf16, 0.57x the true peak and a bound below it."""
    job = _job("python", "run_ner.py", "--model_name_or_path", BERT, "--train_file", "path_to_train_file.json",
               "--validation_file=dev.json", "--output_dir", "/tmp/out", "--do_train", "--do_eval")
    s = job.spec
    assert (s.task, s.micro_batch_size, s.precision) == ("token-classification", 8, "32-true")
    # a model's config.json (--config_name) and a Hydra-style data key are no trainer configs either
    named = _job("python", "run_ner.py", "--model_name_or_path", BERT, "--config_name", "bert/config.json",
                 "data.train_file=train.yaml", "--do_train").spec
    assert (named.micro_batch_size, named.precision) == (8, "32-true")
    # an accelerate config the manifest does not carry still counts as unread: it may set the precision
    unread = _job("accelerate", "launch", "--config_file", "fsdp.yaml", "run_ner.py", "--model_name_or_path", BERT,
                  "--train_file", "train.json", "--do_train").spec
    assert unread.precision == "bf16-mixed"  # the TrainingSpec default, not TrainingArguments' fp32


def test_question_answering_trains_a_span_head_not_vocabulary_logits() -> None:
    """run_qa.py read as causal-lm priced vocabulary logits the model never computes (mDeBERTa: 47.4 against 14.5
    GiB); AutoModelForQuestionAnswering puts a 2-output head on every token. Its default length is 384."""
    s = _job("python", "run_qa.py", "--model_name_or_path", BERT, "--dataset_name", "squad", "--do_train",
             "--per_device_train_batch_size", "12").spec
    assert (s.task, s.seq_len, s.micro_batch_size) == ("token-classification", 384, 12)


def test_multiple_choice_scores_every_ending_and_accelerate_defaults_to_fp32() -> None:
    """transformers' SWAG README command (accelerate launch run_swag_no_trainer.py, no --mixed_precision): read as
    causal-lm at batch 32 in bf16, 5.2 GiB against 13.6; each example is four sequences, and accelerate's
    mixed_precision defaults to "no"."""
    s = _job("accelerate", "launch", "run_swag_no_trainer.py", "--model_name_or_path", "bert-base-uncased",
             "--dataset_name", "swag", "--max_seq_length", "128", "--per_device_train_batch_size", "32").spec
    assert (s.task, s.micro_batch_size, s.precision, s.seq_len) == ("seq-classification", 128, "32-true", 128)
    mixed = _job("accelerate", "launch", "--mixed_precision", "fp16", "run_swag_no_trainer.py",
                 "--model_name_or_path", "bert-base-uncased", "--per_device_train_batch_size", "8").spec
    assert (mixed.precision, mixed.micro_batch_size) == ("16-mixed", 32)


def test_task_scripts_default_lengths_and_seq2seq_source_length() -> None:
    """Without a length flag run_glue.py pads to 128 (read as BERT's 512: an A100-80GB for an L40S job);
    run_summarization/run_translation take --max_source_length (default 1024) as the encoder's input, which was
    read as the TrainingSpec's 2,048 (t5-11b at 64 source tokens: 360 GiB, unschedulable, against 87)."""
    glue = _job("python", "run_glue.py", "--model_name_or_path", BERT, "--task_name", "mrpc", "--do_train").spec
    assert (glue.task, glue.seq_len) == ("seq-classification", 128)
    short = _job("python", "run_translation.py", "--model_name_or_path", "t5-base", "--do_train",
                 "--max_source_length", "64", "--source_lang", "en", "--target_lang", "ro").spec
    assert short.seq_len == 64
    default = _job("python", "run_summarization.py", "--model_name_or_path", "t5-base", "--do_train",
                   "--adafactor").spec
    assert (default.seq_len, default.optimizer) == (1024, "adafactor")  # --adafactor: TrainingArguments' optim


def test_transformers_own_deepspeed_test_configs_are_read_as_shipped() -> None:
    """The DeepSpeed guide's examples name transformers' tests/deepspeed/ds_config_zero{2,3}.json, which offload the
    optimizer (and at stage 3 the parameters); read from the file name, the offload was lost."""
    s = _job("deepspeed", "--num_gpus=2", "examples/pytorch/translation/run_translation.py", "--deepspeed",
             "tests/deepspeed/ds_config_zero3.json", "--model_name_or_path", "t5-base", "--do_train", "--fp16",
             gpus=2).spec
    assert (s.sharding, s.offload) == ("zero3", "params+optimizer")
    two = _job("deepspeed", "--num_gpus=2", "run_translation.py", "--deepspeed", "tests/deepspeed/ds_config_zero2.json",
               "--model_name_or_path", "t5-base", "--do_train", gpus=2).spec
    assert (two.sharding, two.offload) == ("zero2", "optimizer")
    # another project's file of the same name is not transformers' (its folder differs): read from the name only
    other = _job("deepspeed", "--num_gpus=2", "run_translation.py", "--deepspeed", "configs/ds_config_zero3.json",
                 "--model_name_or_path", "t5-base", "--do_train", gpus=2).spec
    assert other.offload == "none"


def test_unsloth_cli_reads_its_rank_targets_and_offloaded_checkpointing() -> None:
    """unsloth-cli.py's docstring command: `--r 64` was not read (PEFT's rank 8 on q/v instead) and
    `--use_gradient_checkpointing unsloth` not either: 247 GiB, unschedulable, against 68 GiB."""
    s = _job("python", "unsloth-cli.py", "--model_name", "meta-llama/Meta-Llama-3-8B", "--max_seq_length", "8192",
             "--load_in_4bit", "--r", "64", "--lora_alpha", "32", "--use_gradient_checkpointing", "unsloth",
             "--per_device_train_batch_size", "4", "--optim", "adamw_8bit").spec
    assert s.lora is not None
    assert (s.method, s.lora.rank, s.lora.target_modules, s.gradient_checkpointing, s.activation_offloading) == (
        "qlora", 64, ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], "full", True)
    defaults = _job("python", "unsloth-cli.py", "--model_name", "meta-llama/Meta-Llama-3-8B").spec
    assert defaults.lora is not None
    assert (defaults.method, defaults.lora.rank, defaults.micro_batch_size, defaults.grad_accum_steps,
            defaults.optimizer, defaults.seq_len, defaults.precision) == (
        "lora", 16, 2, 4, "adamw-8bit", 2048, "bf16-mixed")
    off = _job("python", "unsloth-cli.py", "--model_name", "meta-llama/Meta-Llama-3-8B",
               "--use_gradient_checkpointing", "False").spec
    assert (off.gradient_checkpointing, off.activation_offloading) == ("none", None)


def test_lightning_trainer_precision_and_strategy() -> None:
    """A Lightning script's `--precision 16 --strategy deepspeed_stage_2` was not read ("the job does not say")."""
    s = _job("python", "-m", "my_project.train", "--model_name_or_path", BERT, "--precision", "16",
             "--strategy", "deepspeed_stage_2_offload", "--accumulate_grad_batches", "4", gpus=2).spec
    assert (s.precision, s.sharding, s.offload, s.grad_accum_steps) == ("16-mixed", "zero2", "optimizer", 4)
    cli = _job("python", "main.py", "fit", "--model_name_or_path", BERT, "--trainer.precision", "bf16-true",
               "--trainer.strategy", "fsdp", gpus=2).spec
    assert (cli.precision, cli.sharding) == ("bf16-true", "fsdp")
    # another tool's --precision (not one of Lightning's values, no Lightning strategy) is left alone
    other = _job("python", "train.py", "--model_name_or_path", BERT, "--precision", "fp8", "--strategy", "auto").spec
    assert other.precision == "bf16-mixed"  # the TrainingSpec default, as before


def test_lightning_deepspeed_strategy_takes_lightnings_zero_defaults() -> None:
    """Lightning's DeepSpeedStrategy writes its own ZeRO section: overlap_comm on and 2e8-element buckets
    (strategies/deepspeed.py __init__), not DeepSpeed's 5e8 with overlap off at ZeRO-2, which vramfit assumed."""
    s = _job("python", "train.py", "--model_name_or_path", BERT, "--precision", "16-mixed", "--strategy",
             "deepspeed_stage_2", gpus=4).spec
    assert (s.sharding, s.zero_overlap_comm, s.zero_reduce_bucket_elements) == ("zero2", True, 200_000_000)


_LLM_FOUNDRY_YAML = """\
variables:
  max_seq_len: 2048
max_seq_len: ${variables.max_seq_len}
model:
  name: hf_causal_lm
  pretrained: true
  pretrained_model_name_or_path: meta-llama/Meta-Llama-3-8B
optimizer:
  name: decoupled_adamw
  lr: 5.0e-6
global_train_batch_size: 48
device_train_microbatch_size: 8
precision: amp_bf16
fsdp_config:
  sharding_strategy: FULL_SHARD
  mixed_precision: PURE
  activation_checkpointing: true
"""


def _llm_foundry_job(*overrides: str, gpus: int = 8) -> ParsedJob:
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
              "data": {"llama-3-8b_dolly_sft.yaml": _LLM_FOUNDRY_YAML}}
    job = pod(["composer", "scripts/train/train.py", "/config/llama-3-8b_dolly_sft.yaml", *overrides], gpus=gpus,
              volumes=[{"name": "cfg", "configMap": {"name": "cfg"}}])
    job["spec"]["containers"][0]["volumeMounts"] = [{"name": "cfg", "mountPath": "/config"}]
    return one_job(config, job)


def test_llm_foundry_reads_its_carried_yaml_and_overrides() -> None:
    """llm-foundry's llama-3-8b_dolly_sft.yaml carried in a ConfigMap was ignored (no model found: refused); with
    the model annotated it read DDP, batch 1, no checkpointing: 191 GiB, unschedulable, against 37.6 GiB."""
    s = _llm_foundry_job().spec
    # the micro-batch is each of the 8 GPUs' share of the global 48, 6, below device_train_microbatch_size 8
    assert (s.model, s.seq_len, s.micro_batch_size, s.precision, s.sharding, s.gradient_checkpointing,
            s.optimizer) == ("meta-llama/Meta-Llama-3-8B", 2048, 6, "bf16-mixed", "fsdp", "full", "adamw")
    two = _llm_foundry_job("max_seq_len=4096", "device_train_microbatch_size=2", gpus=2).spec
    assert (two.seq_len, two.micro_batch_size) == (4096, 2)  # OmegaConf overrides after the YAML win


def test_nemo_hydra_overrides_and_its_carried_config() -> None:
    """NeMo 1's Megatron scripts were refused (no model found); annotated, LoRA read as full fine-tuning and the
    micro-batch, tensor parallelism and distributed optimizer dropped (133 against 89.5 GiB; 191 against 56.5)."""
    peft = one_job(pod(["torchrun", "--nproc_per_node=1",
                        "/opt/NeMo/examples/nlp/language_modeling/tuning/megatron_gpt_finetuning.py",
                        "trainer.devices=1", "trainer.precision=bf16-mixed", "model.tensor_model_parallel_size=1",
                        "model.micro_batch_size=4", "model.restore_from_path=/workspace/models/Llama-2-7b-chat.nemo",
                        "model.peft.peft_scheme=lora"])).spec
    assert peft.lora is not None
    assert (peft.model, peft.method, peft.lora.rank, peft.lora.target_modules, peft.micro_batch_size,
            peft.precision) == ("Llama-2-7b", "lora", 32, ["q_proj", "k_proj", "v_proj"], 4, "bf16-mixed")
    config = ("trainer:\n  precision: bf16\nmodel:\n  micro_batch_size: 1\n  tensor_model_parallel_size: 2\n"
              "  encoder_seq_length: 8192\n  num_layers: 32\n  hidden_size: 4096\n  ffn_hidden_size: 14336\n"
              "  num_attention_heads: 32\n  num_query_groups: 8\n  activations_checkpoint_granularity: selective\n"
              "  tokenizer:\n    type: meta-llama/Llama-3-8b-hf\n  optim:\n    name: distributed_fused_adam\n")
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "training-config"},
          "data": {"config.yaml": config}}
    job = pod(["python3", "/opt/NeMo/examples/nlp/language_modeling/megatron_gpt_pretraining.py",
               "--config-path=/config", "--config-name=config.yaml", "model.micro_batch_size=2"], gpus=8,
              volumes=[{"name": "cfg", "configMap": {"name": "training-config"}}])
    job["spec"]["containers"][0]["volumeMounts"] = [{"name": "cfg", "mountPath": "/config"}]
    s = one_job(cm, job).spec
    assert not isinstance(s.model, str) and s.model.config is not None
    assert (s.model.config["num_key_value_heads"], s.model.config["vocab_size"]) == (8, 128256)
    assert (s.micro_batch_size, s.tensor_parallel, s.seq_len, s.gradient_checkpointing, s.sharding,
            s.precision) == (2, 2, 8192, "selective", "zero1", "bf16-mixed")  # the override wins over the config


def test_llm_foundry_leaves_an_annotated_batch_alone_and_survives_a_word_for_the_model() -> None:
    """The global batch's per-GPU share capped a micro-batch the annotation states (the annotation wins over what
    is read); a `model=NAME` override replacing the model mapping crashed the reader (AttributeError)."""
    annotated = one_job(*_llm_foundry_docs(annotations={"vramfit.io/spec": "micro_batch_size: 16"})).spec
    assert annotated.micro_batch_size == 16
    scan_outcomes = scan(*_llm_foundry_docs("model=mpt"))
    assert not any(isinstance(o, ParsedJob) for o in scan_outcomes)  # refused with the no-model error, no traceback


def _llm_foundry_docs(*overrides: str, annotations: dict[str, str] | None = None) -> tuple[dict, dict]:
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
              "data": {"llama-3-8b_dolly_sft.yaml": _LLM_FOUNDRY_YAML}}
    job = pod(["composer", "scripts/train/train.py", "/config/llama-3-8b_dolly_sft.yaml", *overrides], gpus=8,
              annotations=annotations, volumes=[{"name": "cfg", "configMap": {"name": "cfg"}}])
    job["spec"]["containers"][0]["volumeMounts"] = [{"name": "cfg", "mountPath": "/config"}]
    return config, job
