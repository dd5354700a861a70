"""Specs that cannot run as written are refused with the field and the fix, not predicted: parameter offload
without a sharded engine, model-parallel sizes the architecture cannot take, GPU counts that break them; and
the head a classification task puts on a decoder is the one counted."""

from __future__ import annotations

from pathlib import Path

import pytest

from predictors.catalog import resolve_model
from predictors.errors import SpecError
from predictors.predict import predict
from predictors.spec import TrainingSpec, parse_training_spec
from scheduler.cli import main
from scheduler.placement import place
from scheduler.pools import parse_pools

REPO = Path(__file__).resolve().parents[2]


def spec(**fields: object) -> TrainingSpec:
    return parse_training_spec({"model": "llama-3.1-8b", **fields})


@pytest.mark.parametrize("sharding", [None, "none", "ddp", "zero1", "zero2"])
def test_parameter_offload_needs_zero3_or_fsdp(sharding: str | None) -> None:
    fields = {"offload": "params+optimizer", "gpus": 2} | ({"sharding": sharding} if sharding else {})
    with pytest.raises(SpecError) as caught:
        spec(**fields)
    assert "`spec.offload` params+optimizer needs sharding zero3, fsdp, fsdp-grad-op" in str(caught.value)


@pytest.mark.parametrize("sharding", ["zero3", "fsdp", "fsdp-grad-op"])
def test_parameter_offload_with_a_sharded_engine_and_optimizer_offload_alone_are_fine(sharding: str) -> None:
    assert spec(offload="params+optimizer", sharding=sharding, gpus=2).offload == "params+optimizer"
    assert spec(offload="optimizer").offload == "optimizer"  # torchao's CPUOffloadOptimizer on one GPU


def test_what_if_parameter_offload_comes_with_a_sharded_engine() -> None:
    pools = parse_pools({"pools": [{"name": "l40s", "gpu": "L40S", "gpus_per_node": 8, "nodes": 1,
                                    "price_usd_per_gpu_hour": 1.5}]})
    too_big = parse_training_spec({"model": "llama-3.1-70b", "method": "full", "gpus": 8, "sharding": "ddp"})
    decision = place(too_big, pools)
    assert decision.decision == "unschedulable"
    for s in decision.suggestions:
        update = s.spec_update
        if update.get("offload") == "params+optimizer":
            assert update.get("sharding", too_big.sharding) in ("zero3", "fsdp", "fsdp-grad-op"), s.change
        parse_training_spec({**too_big.model_dump(exclude_none=True), **update})  # every suggestion is a valid spec


@pytest.mark.parametrize(("fields", "fragment"), [
    ({"gpus": 3, "tensor_parallel": 3}, "`tensor_parallel` must divide the model's 32 attention heads; got 3"),
    ({"gpus": 16, "tensor_parallel": 16}, "`tensor_parallel` must divide the model's 8 key/value heads; got 16"),
    ({"gpus": 64, "pipeline_parallel": 64}, "`pipeline_parallel` exceeds the model's 32 blocks; got 64"),
])
def test_model_parallel_sizes_the_model_cannot_take(fields: dict[str, object], fragment: str) -> None:
    with pytest.raises(SpecError) as caught:
        predict(spec(**fields))
    assert fragment in str(caught.value)


def test_tensor_parallel_the_model_can_take() -> None:
    assert predict(spec(gpus=8, tensor_parallel=8)).vram.gpus == 8


@pytest.mark.parametrize(("flag", "fragment"), [
    ("-2", "`--gpus` must be a positive integer; got -2"),
    ("0", "`--gpus` must be a positive integer; got 0"),
    ("1", "`gpus` must be a positive multiple of tensor_parallel x pipeline_parallel x context_parallel (2); got 1"),
])
def test_the_gpus_flag_is_checked_like_the_spec_field(tmp_path: Path, flag: str, fragment: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tp.yaml"
    path.write_text("model: llama-3.1-8b\ngpus: 4\ntensor_parallel: 2\n")
    assert main(["predict", str(path), "--gpus", flag]) == 2
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_gpus_auto_says_what_count_it_predicted_for(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["predict", str(REPO / "examples" / "qwen2.5-1.5b-full-auto.yaml")]) == 0
    assert "note: gpus: auto: predicted for 1 GPU; `vramfit place` chooses the count" in capsys.readouterr().out
    assert not any("gpus: auto" in n for n in predict(spec(gpus="auto"), gpus=4).vram.notes)


@pytest.mark.parametrize("task", ["seq-classification", "token-classification"])
def test_a_classification_task_replaces_the_lm_head(task: str) -> None:
    lm = predict(spec(method="full", precision="bf16-true"))
    classifier = predict(spec(method="full", precision="bf16-true", task=task))
    arch = resolve_model(spec()).architecture
    head = arch.lm_head
    assert head is not None and head.params == 128_256 * 4096
    # LlamaForSequenceClassification: the decoder plus a 4096 x 2 `score` head without bias
    assert classifier.vram.params_total == lm.vram.params_total - head.params + 4096 * 2 == 7_504_932_864
    assert classifier.vram.breakdown_bytes["weights"] < lm.vram.breakdown_bytes["weights"]
    assert classifier.vram.breakdown_bytes.get("logits", 0) == 0
    assert any("classification head replaces the LM head" in n for n in classifier.vram.notes)
    assert arch.for_task("causal-lm") is arch and arch.for_task(task) is arch.for_task(task)


def test_a_task_the_architecture_does_not_have_is_noted() -> None:
    bert = predict(parse_training_spec({"model": "bert-base-uncased", "task": "causal-lm", "seq_len": 512}))
    assert any("encoder-only" in n for n in bert.vram.notes)
    bert_cls = predict(parse_training_spec({"model": "bert-base-uncased", "task": "seq-classification",
                                            "seq_len": 512}))
    assert not bert_cls.vram.notes


def test_a_config_beyond_any_model_is_refused() -> None:
    config = {"model_type": "llama", "hidden_size": 10**12, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 128, "vocab_size": 1000}
    with pytest.raises(SpecError) as caught:
        predict(parse_training_spec({"model": {"config": config}}))
    assert "`model.config` describes 8e+24 parameters, beyond any trainable model" in str(caught.value)


def test_lora_targets_that_match_no_layer_are_refused() -> None:
    with pytest.raises(SpecError) as caught:
        predict(spec(method="lora", lora={"target_modules": ["foo", "bar"]}))
    assert "`lora.target_modules` match no linear layer of this llama model" in str(caught.value)
    assert predict(spec(method="lora", lora={"target_modules": ["q_proj", "foo"]})).vram.params_trainable > 0


def test_an_unknown_family_is_sized_generically_and_says_so() -> None:
    config = {"model_type": "made_up_lm", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
              "intermediate_size": 512, "vocab_size": 1000}
    notes = predict(parse_training_spec({"model": {"config": config}})).vram.notes
    assert any("model_type 'made_up_lm' is not a family vramfit knows" in n for n in notes)
    assert not predict(spec()).vram.notes


def test_the_gpu_is_checked_against_the_catalog_when_the_spec_is_read() -> None:
    assert spec(gpu=4090).gpu == "4090"  # a YAML number: the catalog knows it as RTX-4090
    assert predict(spec(gpu=4090)).gpu.name == "RTX-4090"  # type: ignore[union-attr]
    assert spec(gpu="L40").gpu == "L40"  # in the catalog since 2026-11-26, beside the L40S
    with pytest.raises(SpecError) as caught:
        spec(gpu="L40X")
    assert "`spec.gpu` unknown GPU 'L40X'; did you mean L40" in str(caught.value)


def test_messages_name_no_internal_classes() -> None:
    with pytest.raises(SpecError) as caught:
        parse_training_spec({"model": 7})
    assert "ModelRef" not in str(caught.value) and "must be a model name (a string) or a mapping" in str(caught.value)
    assert parse_training_spec({"model": "hf://meta-llama/Llama-3.1-8B"}).model == "meta-llama/Llama-3.1-8B"


@pytest.mark.parametrize(("model", "targets", "trainable"), [
    # PEFT's own defaults for these families; one adapter per fused projection (r=8)
    ("tiiuae/falcon-7b", ["query_key_value"], 32 * 8 * (4544 + 4544 + 2 * 64)),  # 2,359,296 (PEFT prints it)
    ("gpt2", ["c_attn", "c_proj"], 12 * 8 * ((768 + 3 * 768) + (768 + 768) + (3072 + 768))),
    ("phi-3-mini-4k-instruct", ["qkv_proj", "gate_up_proj"], 32 * 8 * ((3072 + 3 * 3072) + (3072 + 2 * 8192))),
])
def test_fused_projections_take_one_adapter(model: str, targets: list[str], trainable: int) -> None:
    prediction = predict(parse_training_spec({"model": model, "method": "lora",
                                              "lora": {"target_modules": targets, "rank": 8}}))
    assert prediction.vram.params_trainable == trainable


ZERO2_PARAM_OFFLOAD = ('{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}, '
                       '"offload_param": {"device": "cpu"}}}')
ACCELERATE_ZERO2_PARAM_OFFLOAD = {
    "ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_ZERO_STAGE": "2",
    "ACCELERATE_DEEPSPEED_OFFLOAD_PARAM_DEVICE": "cpu", "ACCELERATE_DEEPSPEED_OFFLOAD_OPTIMIZER_DEVICE": "cpu",
}


@pytest.mark.parametrize(("command", "env"), [
    (["deepspeed", "train.py", "--deepspeed", ZERO2_PARAM_OFFLOAD], {}),  # a DeepSpeed config
    (["accelerate", "launch", "train.py"], ACCELERATE_ZERO2_PARAM_OFFLOAD),  # accelerate's environment
])
def test_offload_param_below_stage_3_is_ignored_as_deepspeed_does(command: list[str], env: dict[str, str]) -> None:
    import json

    from scheduler.spec import read_jobs_text

    container = {"name": "t", "image": "x", "resources": {"limits": {"nvidia.com/gpu": 4}},
                 "command": [*command, "--model_name_or_path", "meta-llama/Llama-3.1-8B"],
                 "env": [{"name": k, "value": v} for k, v in env.items()]}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [container]}}
    job = read_jobs_text(json.dumps(pod))[0]
    assert (job.spec.sharding, job.spec.offload) == ("zero2", "optimizer")
    assert any("offload_param ignored" in a for a in job.assumptions)
