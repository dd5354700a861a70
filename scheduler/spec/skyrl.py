"""SkyRL jobs: ``python -m skyrl_train.entrypoints.main_base key=value ...`` (often behind ``uv run ... --``).

SkyRL (github.com/NovaSky-AI/SkyRL, skyrl-train) trains a policy with PPO/GRPO on Ray from one Hydra config,
``skyrl_train/config/ppo_base_config.yaml`` (read at NovaSky-AI/SkyRL 00d10c0), overridden by ``key=value`` words:

* ``trainer.policy.model.path`` the model (default Qwen/Qwen2.5-1.5B-Instruct); ``trainer.max_prompt_length`` (512)
  plus ``generator.sampling_params.max_generate_length`` (1024) the trained length (the policy trains on prompt and
  response); ``trainer.micro_train_batch_size_per_gpu`` (1) the micro-batch;
* ``trainer.strategy`` fsdp2 (default) or fsdp: FSDP with bf16 compute over fp32 parameters (``trainer.bf16``),
  ``trainer.policy.fsdp_config.fsdp_size`` (-1: every GPU) the shard group, ``cpu_offload`` FSDP's CPU offload;
  deepspeed and megatron strategies are named, not read;
* ``trainer.gradient_checkpointing`` (true), ``trainer.flash_attn`` (true), ``trainer.policy.sequence_parallel_size``
  (Ulysses, read as context parallelism);
* ``trainer.policy.model.lora.rank`` > 0: LoRA (``alpha``, ``dropout``) on ``trainer.target_modules``
  (all-linear);
* ``trainer.placement.policy_num_nodes`` x ``policy_num_gpus_per_node`` (1 x 4) the GPUs that train;
* the KL term's reference model (``trainer.algorithm.use_kl_loss``, on by default) lives in host memory
  (``trainer.ref.fsdp_config.cpu_offload``, true by default); with ``colocate_all`` (true by default) the inference
  engines sleep while the policy trains.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from scheduler.spec.trainer_args import TRAINING_WORLD, Setting, hydra_overrides, launch_count, to_bool

_DEFAULT_MODEL = "Qwen/Qwen2.5-1.5B-Instruct"


def is_skyrl(tokens: Sequence[str]) -> bool:
    """SkyRL's trainer entry point (``skyrl_train.entrypoints.main_base`` as a module or a path), or any entry point
    given SkyRL's policy-model override (examples ship their own ``main_*.py`` over the same config)."""
    return any(t.endswith(("skyrl_train.entrypoints.main_base", "skyrl_train/entrypoints/main_base.py"))
               or t.startswith("trainer.policy.model.path=") for t in tokens)


def skyrl_settings(tokens: Sequence[str], raw: dict[str, Setting], notes: list[str], where: str) -> None:
    pairs = hydra_overrides(tokens)

    def given(key: str, default: str) -> tuple[str, str]:
        if key in pairs:
            return pairs[key], f"SkyRL override {key}={pairs[key]}"
        return default, f"SkyRL default {key} {default}"

    def put(field: str, key: str, default: str, value: Any = None) -> None:
        text, source = given(key, default)
        raw.setdefault(field, Setting(text if value is None else value, source, where))

    put("model", "trainer.policy.model.path", _DEFAULT_MODEL)
    prompt_text, prompt_source = given("trainer.max_prompt_length", "512")
    response_text, response_source = given("generator.sampling_params.max_generate_length", "1024")
    prompt, response = launch_count(prompt_text), launch_count(response_text)
    if prompt and response:
        raw.setdefault("seq_len", Setting(prompt + response, f"{prompt_source} + {response_source} (the policy "
                                                             "trains on prompt and response)", where))
    else:
        notes.append(f"SkyRL lengths not read (max_prompt_length {prompt_text}, max_generate_length "
                     f"{response_text}): set seq_len in the vramfit.io/spec annotation")
    turns = launch_count(pairs.get("generator.max_turns", "1"))
    if turns and turns > 1:
        notes.append(f"SkyRL generator.max_turns={turns}: a multi-turn trajectory may be longer than one prompt and "
                     "one response (generator.max_input_length caps its prompt side); set seq_len if it is")
    micro_text, micro_source = given("trainer.micro_train_batch_size_per_gpu", "1")
    if (micro := launch_count(micro_text)) is not None:
        raw.setdefault("micro_batch_size", Setting(micro, micro_source, where))
    nodes = launch_count(pairs.get("trainer.placement.policy_num_nodes", "1")) or 1
    per_node = launch_count(pairs.get("trainer.placement.policy_num_gpus_per_node", "4")) or 4
    world = nodes * per_node
    raw.setdefault(TRAINING_WORLD, Setting(world, f"SkyRL trainer.placement policy_num_nodes {nodes} x "
                                                  f"policy_num_gpus_per_node {per_node} (the GPUs the policy trains "
                                                  "on)", where))
    strategy = pairs.get("trainer.strategy", "fsdp2").strip().lower()
    if strategy in ("fsdp", "fsdp2"):
        raw.setdefault("_use_fsdp", Setting(True, f"SkyRL trainer.strategy {strategy}", where))
        group = launch_count(pairs.get("trainer.policy.fsdp_config.fsdp_size", "-1"))
        if group is not None and 0 < group < world:
            raw.setdefault("_shard_group", Setting(group, f"SkyRL override trainer.policy.fsdp_config.fsdp_size="
                                                          f"{group} (shard groups of {group} GPUs)", where))
        if to_bool(pairs.get("trainer.policy.fsdp_config.cpu_offload", "false")) is True:
            raw.setdefault("offload", Setting("params+optimizer", "SkyRL override trainer.policy.fsdp_config."
                                                                  "cpu_offload=true", where))
    else:
        notes.append(f"SkyRL trainer.strategy {strategy}: its sharding is not read (set sharding in the "
                     "vramfit.io/spec annotation)")
    checkpointing = to_bool(pairs.get("trainer.gradient_checkpointing", "true"))
    put("gradient_checkpointing", "trainer.gradient_checkpointing", "true", checkpointing is not False)
    if to_bool(pairs.get("trainer.flash_attn", "true")) is not False:
        put("attention", "trainer.flash_attn", "true", "flash")
    if to_bool(pairs.get("trainer.bf16", "true")) is not False:
        raw.setdefault("_bf16", Setting(True, "SkyRL trainer.bf16 (bf16 compute over fp32 FSDP parameters)", where))
    sp = launch_count(pairs.get("trainer.policy.sequence_parallel_size", "1")) or 1
    if sp > 1:
        raw.setdefault("context_parallel", Setting(sp, f"SkyRL override trainer.policy.sequence_parallel_size={sp} "
                                                       f"(Ulysses: each GPU holds 1/{sp} of a sequence)", where))
    rank = launch_count(pairs.get("trainer.policy.model.lora.rank", "0"))
    if rank:
        put("lora.rank", "trainer.policy.model.lora.rank", "0", rank)
        raw.setdefault("_finetuning_type", Setting("lora", f"SkyRL override trainer.policy.model.lora.rank={rank}",
                                                   where))
        if "trainer.policy.model.lora.alpha" in pairs:
            put("lora.alpha", "trainer.policy.model.lora.alpha", "16")
        if "trainer.policy.model.lora.dropout" in pairs:
            put("lora.dropout", "trainer.policy.model.lora.dropout", "0")
        put("lora.target_modules", "trainer.target_modules", "all-linear")
    kl = [k for k in ("trainer.algorithm.use_kl_loss", "trainer.algorithm.use_kl_in_reward")
          if to_bool(pairs.get(k, "true" if k.endswith("use_kl_loss") else "false")) is True]
    if kl:
        if to_bool(pairs.get("trainer.ref.fsdp_config.cpu_offload", "true")) is False:
            raw.setdefault("reference_model", Setting(True, f"SkyRL {kl[0]} with trainer.ref.fsdp_config."
                                                            "cpu_offload=false (the reference model on the GPUs)",
                                                      where))
        else:
            notes.append(f"SkyRL {kl[0]}: the reference model's parameters live in host memory "
                         "(trainer.ref.fsdp_config.cpu_offload, true by default): not on the GPUs while the policy "
                         "trains")
    if to_bool(pairs.get("trainer.placement.colocate_all", "true")) is not False:
        notes.append("SkyRL colocate_all: the inference engines share the training GPUs and sleep while the policy "
                     "trains (not in the prediction)")
    else:
        notes.append("SkyRL colocate_all=false: the inference engines run on GPUs of their own, not in the "
                     "prediction")
    estimator = pairs.get("trainer.algorithm.advantage_estimator", "grpo").strip().strip("'\"").lower()
    if estimator == "gae":
        notes.append("SkyRL advantage_estimator gae: the critic (trainer.critic.model.path) trains on GPUs of its own "
                     "placement; not in the prediction")
