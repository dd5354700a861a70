"""Accuracy regression guard: the analytic model on the dev reference runs must not get worse.

The figures are the ones reported in docs/accuracy.md (``vramfit evaluate`` on runs-dev.jsonl, quality high and
medium, per-GPU scope). Improving them is welcome: lower the limits in the same commit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from predictors.accuracy import ape_summary
from predictors.evaluation import evaluate, select_runs
from predictors.reference import parse_runs

# measured 2026-11-26 (PEFT adapters' own input copies; the logits' blocks cached at an optimizer-step peak; a tied
# head's gradient; transformers' Adafactor stepping one parameter at a time): median 11.4 %, p90 42.3 %, OOM 6/7
# (small float tolerance); 11.7 % before Adafactor's per-parameter temporaries; 2026-11-24: 13.0 % / 41.2 %, OOM 5/7;
# 2026-11-26 (session 17), the reserved peak the larger of the two phases': 11.5 % / 41.9 %; session 24, DeepSpeed's
# ZeRO-2/3 gradient bucket at its full size: 11.4 % / 41.6 %
MEDIAN_APE_LIMIT = 0.115
P90_APE_LIMIT = 0.418
OOM_RIGHT_MIN = 6


def test_dev_set_accuracy_does_not_regress(dev_runs_path: Path) -> None:
    runs = select_runs(parse_runs(dev_runs_path.read_text()), {"high", "medium"})
    ev = evaluate(runs)
    s = ev.summary()
    assert s["n"] >= 190
    assert s["median_ape"] <= MEDIAN_APE_LIMIT, s
    assert s["p90_ape"] <= P90_APE_LIMIT, s
    assert ev.oom_right >= OOM_RIGHT_MIN


def test_ape_summary_by_hand() -> None:
    s = ape_summary([(110, 100), (90, 100), (150, 100), (100, 100)])
    assert s["n"] == 4
    assert abs(s["median_ape"] - 0.10) < 1e-12
    assert abs(s["max_ape"] - 0.5) < 1e-12
    assert s["under_fraction"] == 0.25
    assert ape_summary([])["n"] == 0


# vramfit's own calibration rows (predictors/data/measured/, measured 2026-11-25/26 with transformers 5.17, PEFT
# 0.21, bitsandbytes 0.50; their specs say framework: transformers). H200, 119 configs + 2 OOM: peak allocated
# median 1.8 %, p90 4.1 %; with --all-levels reserved 4.2 % / 11.1 % and NVML 3.8 % / 10.3 % (4.7 % / 12.9 % and
# 4.4 % / 12.2 % before the reserved peak became the larger of the backward's and the optimizer step's); throughput
# 14.4 % / 41.9 %. H100 80GB HBM3, 38 configs: allocated 1.1 % / 3.9 %, reserved 4.8 % / 11.0 %, NVML 4.6 % / 10.7 %
# (6.6 % / 18.0 % and 6.4 % / 17.0 % before; its own measured context), throughput 17.6 % / 48.3 %; 97 rows
# (2026-11-27, the QLoRA and optimizer configs added): allocated 1.8 % / 4.1 %, reserved 4.7 % / 13.5 %, NVML 4.3 % /
# 12.9 %, throughput 18.4 % / 51.6 %.
MEASURED_DIR = Path(__file__).resolve().parents[2] / "predictors" / "data" / "measured"
OWN_ROWS = {
    # file: (rows at least, OOM rows at least, allocated, reserved, nvml, throughput as (median, p90) ceilings)
    "H200.jsonl": (121, 2, (0.019, 0.041), (0.043, 0.112), (0.039, 0.104), (0.145, 0.420)),
    "H100-80GB.jsonl": (97, 1, (0.019, 0.041), (0.048, 0.135), (0.044, 0.129), (0.194, 0.535)),
}


@pytest.mark.parametrize("name", sorted(OWN_ROWS))
def test_own_calibration_rows_do_not_regress(name: str) -> None:
    from predictors.evaluation import evaluate as evaluate_vram
    from predictors.reference import with_extra_levels
    from predictors.runtime_eval import evaluate_runtime

    rows, ooms, allocated, reserved, nvml, throughput = OWN_ROWS[name]
    runs = select_runs(parse_runs((MEASURED_DIR / name).read_text()), {"high", "medium"})
    assert len(runs) >= rows
    assert all(run.spec.framework == "transformers" for run in runs)
    ev = evaluate_vram(runs)
    s = ev.summary()
    assert s["median_ape"] <= allocated[0] and s["p90_ape"] <= allocated[1], s
    assert ev.oom_right >= ooms
    levels = evaluate_vram(with_extra_levels(runs))
    by_metric = levels.by(lambda r: r.run.measured.metric)
    assert by_metric["allocated"]["n"] == by_metric["reserved"]["n"] == by_metric["nvml"]["n"] == s["n"]
    assert by_metric["reserved"]["median_ape"] <= reserved[0] and by_metric["reserved"]["p90_ape"] <= reserved[1]
    assert by_metric["nvml"]["median_ape"] <= nvml[0] and by_metric["nvml"]["p90_ape"] <= nvml[1]
    runtime = evaluate_runtime(runs)
    assert (runtime.median_ape() or 1.0) <= throughput[0] and (runtime.p90_ape() or 1.0) <= throughput[1]


# Published measurements from sources outside the dev set (bench/data/external_runs.jsonl: Answer.AI's fsdp_qlora
# benchmarks, torchtune's LoRA tutorial, PEFT's DeepSpeed and FSDP docs, litgpt's resource tables; compiled
# 2026-11-26 with the settings each source states and the assumptions each row's notes list). The analytic model was
# not tuned on them: 30 rows, median 5.6 %, p90 13.2 %, OOM 2/2, every row under the residual's bound.
EXTERNAL_RUNS = Path(__file__).resolve().parents[2] / "bench" / "data" / "external_runs.jsonl"


def test_external_runs_accuracy_does_not_regress() -> None:
    runs = select_runs(parse_runs(EXTERNAL_RUNS.read_text()), {"high", "medium"})
    ev = evaluate(runs)
    s = ev.summary()
    assert s["n"] == 30
    assert s["median_ape"] <= 0.057, s
    assert s["p90_ape"] <= 0.133, s
    assert ev.oom_right == 2


# A second out-of-sample set (bench/data/external_runs_2.jsonl, compiled 2026-11-27, again not tuned on): ms-swift's
# LLM benchmark page in two versions (X09: its first runs, 1,000 samples cut to max_length from the left; X06: the
# later runs of the same configurations over the whole dataset, samples longer than max_length dropped, so batch
# lengths vary), torchao's float8 README (the bf16 baseline) and PEFT's MetaMathQA method comparison. 100 rows:
# median 10.5 %, p90 47.0 %, OOM 3/3; without X06 (47 rows) 3.9 % / 23.0 %; X06 alone 24.1 % under (docs/accuracy.md).
# With the rows' sequence_lengths (X06, and X09 at 8,192 tokens where 5 % of samples reach max_length: variable) and
# the allocator fragmentation that vramfit's H100 bench measured (bench/data/variable_lengths-H100.jsonl):
# 5.3 % / 23.8 %; without X06 3.9 % / 23.3 %; X06 alone 7.8 % / 24.3 %. With that cache cut to what the A100's
# 80 GiB holds (the allocator frees cached segments and retries before it fails): 5.0 % / 23.1 %; X06 5.7 % / 19.5 %.
EXTERNAL_RUNS_2 = EXTERNAL_RUNS.with_name("external_runs_2.jsonl")


def test_second_external_set_does_not_regress() -> None:
    runs = select_runs(parse_runs(EXTERNAL_RUNS_2.read_text()), {"high", "medium"})
    ev = evaluate(runs)
    s = ev.summary()
    assert s["n"] == 100
    assert s["median_ape"] <= 0.051 and s["p90_ape"] <= 0.232, s
    assert ev.oom_right == 3
    steady = evaluate([run for run in runs if not run.id.startswith("X06-")]).summary()
    assert steady["n"] == 47
    assert steady["median_ape"] <= 0.039 and steady["p90_ape"] <= 0.234, steady
    varying = evaluate([run for run in runs if run.id.startswith("X06-")]).summary()
    assert varying["median_ape"] <= 0.058 and varying["p90_ape"] <= 0.196, varying


# Published throughput measurements outside the dev set (bench/data/external_runtime.jsonl, compiled 2026-11-27):
# llm-foundry's MPT benchmark tables (125m-70b on 8-128 A100-40/80GB and H100s, FSDP) and NeMo Automodel's LoRA
# performance summary (DGX-H100). 38 rows: median 6.9 %, p90 29.3 % (before the NICs of a node were pooled for
# ring collectives across nodes: 7.0 % / 29.9 %, MPT-13b on 64 H100s -70 %).
EXTERNAL_RUNTIME = EXTERNAL_RUNS.with_name("external_runtime.jsonl")


def test_external_throughput_does_not_regress() -> None:
    from predictors.runtime_eval import evaluate_runtime

    runs = select_runs(parse_runs(EXTERNAL_RUNTIME.read_text()), {"high", "medium"})
    assert len(runs) == 38
    runtime = evaluate_runtime(runs)
    assert (runtime.median_ape() or 1.0) <= 0.070 and (runtime.p90_ape() or 1.0) <= 0.293


# A third, small out-of-sample set (bench/data/external_runs_3.jsonl, 2026-11-27): Colossal-AI's Lightning GPT2-XL
# benchmark (DDP and ZeRO-3 on A100-40GB), GaLore's single-GPU Llama-7B scripts, torchtune's QLoRA tutorial and
# Colossal-AI's OPT-13B ZeRO-3 offload log. 7 rows: median 6.1 %, p90 32.1 % (torchtune QLoRA 42 % under: its
# reserved figure keeps what quantizing the checkpoint at load left cached, 9.13 GB before training began). Plus one
# OOM row (X17-001: DeepSeek-Math-7B full, ZeRO-2 with the optimizer offloaded, 2 x RTX 4090, 1 x 512 tokens), which
# vramfit misses: 19.3 GiB expected against the card's 24 (23.1 before ZeRO-Offload's gradients left the GPU, a miss
# too); its upper bound, 26.5 GiB, keeps the job off the card.
EXTERNAL_RUNS_3 = EXTERNAL_RUNS.with_name("external_runs_3.jsonl")



# A fourth out-of-sample set (bench/data/external_runs_4.jsonl, transcribed 2026-11-27 before vramfit's predictions were
# looked at): the optimisation steps of LLMs-from-scratch's GPT-124M training-speed chapter (X18, plain PyTorch on an
# A100) and a DistilBERT fine-tune at five Fabric precisions (X19). 14 rows: median 22.2 %, p90 34.8 %, bias +18 %.
# X18's two fp32 rows are within 1 %; its bf16 rows are 23-48 % over: the script takes the cross-entropy of the bf16
# logits as they are, where vramfit assumes the fp32 upcast that transformers, torchtune and most trainers make.
EXTERNAL_RUNS_4 = EXTERNAL_RUNS.with_name("external_runs_4.jsonl")



# A fifth out-of-sample set (bench/data/external_runs_5.jsonl, transcribed 2026-11-27 by a helper that did not look at
# vramfit's predictions): Giles Thomas's memory sweeps (X20: Llama-3-8B full fine-tuning, HF Trainer, fp16, ZeRO-2
# with the optimizer offloaded on 8 x A100-80GB, batch 1-17 at 2,048 tokens and 101-2,001 tokens at batch 1; Qwen1.5-
# 0.5B on one 24 GB card, ZeRO-3 and ZeRO-2 offload; torch's active-bytes peak) and the Lightning Fabric FSDP guide's
# 1B-parameter nn.Transformer on 2 x A100-40GB (X21). Blind, it was 22.2 % / 35.0 % with 0 of 5 OOM rows above the
# card: X20 sat 22.7 % under at the median and grew by 11.4 bytes per logit per sample where vramfit counted 6,
# because transformers' own models upcast their logits to fp32 before the loss even under DeepSpeed (vram.py
# _REMOTE_CODE_16BIT_LOSS). With that: 31 rows, median 6.2 %, p90 15.8 %, 5 of 5 OOM rows above the card.
EXTERNAL_RUNS_5 = EXTERNAL_RUNS.with_name("external_runs_5.jsonl")



# A sixth, small out-of-sample set (bench/data/external_runs_6.jsonl, transcribed blind 2026-11-27): Liger-Kernel's
# Hugging Face example, its baseline logs without Liger (X22: full fine-tuning of Llama-3-8B, Mistral-7B, Gemma-7B,
# Gemma-2-2B, Qwen2-7B and Phi-3.5-mini with SFTTrainer under FSDP on 4 x A100-80GB, padded batches of Alpaca up to
# 512 tokens). 7 rows at the allocated level: median 4.8 %, p90 24.0 %, bias +4.8 %, every row under the bound.
EXTERNAL_RUNS_6 = EXTERNAL_RUNS.with_name("external_runs_6.jsonl")
# A seventh and an eighth, transcribed blind 2026-11-27 (session 27; notes in their .md files). Seventh: IBM's
# fms-acceleration A100-80GB benchmark table (X23: full, LoRA and QLoRA of SantaCoder, Mistral-7B, Mixtral-8x7B and
# Llama-2-70B, 1 GPU or 2 under FSDP, 4,096-token packed batches; exact max_memory_allocated bytes). Blind: 11.9 % /
# 21.2 %, 3 of 5 OOM rows above the card; its single-GPU QLoRA rows ran through TRL's prepare_model_for_kbit_training,
# which the notes state and the spec now says (kbit_prepared): 2.1 % / 17.7 %, 4 of 5. Eighth: DeepSpeedExamples'
# bf16_master_weight tables (X30), axolotl example READMEs (X31) and a DeepSpeed blog row (X32), 6 rows of quality
# medium or better: 12.8 % / 23.2 %, blind.
EXTERNAL_RUNS_7 = EXTERNAL_RUNS.with_name("external_runs_7.jsonl")
EXTERNAL_RUNS_8 = EXTERNAL_RUNS.with_name("external_runs_8.jsonl")
# A ninth, transcribed blind 2026-11-27 (session 28; notes in its .md): lightning-thunder's lit-gpt Eager rows (X40:
# open_llama_3b, 1 GPU and FSDP on 2, exact max_memory_allocated), a personal trainer's GPU table (X41: Llama, Gemma
# full/LoRA/QLoRA, whole GiB, metric not named) and an ms-swift ZeRO row (X42): 20 rows of quality medium or better,
# median 5.0 %, p90 43.5 %, 3 of 3 OOM rows above the card. X40: 1.0 % / 1.2 %. X41's LoRA rows are 32-63 % over:
# its own loop takes the cross-entropy of the bf16 logits, without the fp32 upcast of transformers' loss. Since
# session 29 those rows say so (cross_entropy 16-bit), as set 4's bf16 rows of Raschka's GPT (X18) do: set 4 22.2 % /
# 34.8 % -> 10.3 % / 16.7 %, set 9 5.0 % / 43.5 % -> 5.1 % / 11.0 %.
EXTERNAL_RUNS_9 = EXTERNAL_RUNS.with_name("external_runs_9.jsonl")
# A tenth, transcribed blind 2026-11-27 (session 29; notes in its .md): litgpt's Thunder-extension Eager rows (X50:
# TinyLlama pretraining on A100-40GB, exact max_memory_allocated), litgpt's LoRA tutorial tables (X51: StableLM 3B and
# Llama 2 7B, LoRA and QLoRA), the HF 4-bit blog's T4 OOM rows (X52) and a llama-recipes FSDP LoRA PR (X53): 11 rows
# of quality medium or better, median 4.0 %, p90 11.4 %, 1 of 3 OOM rows above the card (X52-001 and X52-007, LLaMA
# 7B int8 and 13B NF4 on a T4, are predicted at 10.4 and 11.8 GiB expected, their bounds 17.1 and 19.3 GiB above it).
EXTERNAL_RUNS_10 = EXTERNAL_RUNS.with_name("external_runs_10.jsonl")
# An eleventh, transcribed blind 2026-11-27 (session 29; notes in its .md): Megatron-LM training logs, each with its
# argument dump and "max allocated" memory line (X60-X62: GPT-345M on A800 and V100, Llama-3.2-1B via Megatron-Bridge
# on H100; X63: Megatron-LM's CI reference values and test configs; X64 low). Blind 36.5 % / 77.5 % over: vramfit
# read *-mixed without sharding as autocast over an fp32 model, and priced transformers' loss. The rows now say
# framework megatron (a 16-bit model with fp32 main parameters, its gradient buffer, vocab_parallel_cross_entropy's
# in-place fp32 softmax, fused bias-GeLU, softmax and norms) and sequence_parallel, as their logs show: 15 rows,
# 5.4 % / 10.9 %, bias -5.4 %.
EXTERNAL_RUNS_11 = EXTERNAL_RUNS.with_name("external_runs_11.jsonl")
# A twelfth, transcribed blind 2026-11-27 (session 29; notes in its .md): torchtitan logs (X70-X73, max reserved) and
# DeepSpeed-Chat's training logs (X74, MaxMemAllocated): 6 rows of quality medium, blind 24.9 % / 53.9 %; with
# DeepSpeed's stage-0 FP16 optimizer (master_weights, stated by X74-002/003) and torchtitan's compiled loss read as
# the fused kernel it is: 14.2 % / 27.3 %.
EXTERNAL_RUNS_12 = EXTERNAL_RUNS.with_name("external_runs_12.jsonl")
# A thirteenth, fourteenth and fifteenth, transcribed blind 2026-11-28 (session 30; notes in their .md files).
# Thirteenth: TRL's 1M-token Qwen3-8B example (X80), PEFT's MetaMathQA DoRA and rsLoRA rows (X81), a QLoRA/FSDP
# notebook (X82, low): 3 rows of quality medium, blind 4.6 % / 216.8 %; X80 restated with the loss its docs describe
# (the logits computed a chunk of rows at a time: fused-linear, not torchtune's chunked): 4.6 % / 20.0 %. Fourteenth:
# Megatron-DeepSpeed and Megatron-Core logs (X90, X91) and an OOM from a Megatron-LM issue (X92-001): 2 rows, 18.7 % /
# 30.2 %, the OOM missed blind; X92-001 restated with the dropout its argument dump shows (0.1, Megatron's default,
# lost when the model was written as a llama config): above the card. Fifteenth: OOM outcomes from stanford_alpaca,
# litgpt, llama-recipes and xtuner issues and docs (Y10-Y14): 4 of 5 of quality medium above the card (Y10-002, a
# FSDP Llama-2-7B full fine-tune on 4 A100-40GB that ran out of memory after 8,402 steps, is expected at 35.6 GiB of
# 39.4 and bounded at 48.9).
EXTERNAL_RUNS_13 = EXTERNAL_RUNS.with_name("external_runs_13.jsonl")
EXTERNAL_RUNS_14 = EXTERNAL_RUNS.with_name("external_runs_14.jsonl")
EXTERNAL_RUNS_15 = EXTERNAL_RUNS.with_name("external_runs_15.jsonl")
# A sixteenth, transcribed blind 2026-11-28 (session 30; notes in its .md): torchtune pull requests' peak-memory
# tables (Z10-Z13): 2 rows of quality medium, blind 289.6 % / 516.5 %: Z10-001 (Llama-2-7B full, paged AdamW in
# backward) -5.9 %, Z12-001 (Qwen3-1.7B full on 4 GPUs, batch 16, unpadded Alpaca) +573 % with activation
# checkpointing off, which the transcription took from one stored config version while an older one has it on (in
# its unknowns; with it on, +12 % allocated and -22 % reserved). Not restated: the PR does not say.
EXTERNAL_RUNS_16 = EXTERNAL_RUNS.with_name("external_runs_16.jsonl")
# A seventeenth and an eighteenth, transcribed blind 2026-11-28 (session 31; notes in their .md). Seventeenth: a
# low-memory fine-tuning repository's nvidia-smi readings (Z20), ms-swift's long-context and Megatron example headers
# (Z21, Z22), ColossalChat's SFT hardware table (Z23): 14 rows of quality medium, blind 6.8 % / 21.5 %; Z21-005 (LoRA
# at 256K tokens with --use_liger_kernel true) was transcribed without the fused loss the flag states (+99.5 %) and
# is restated with it (+5.5 %): 6.2 % / 13.1 %. Eighteenth: OOM outcomes from OpenRLHF, axolotl, LLaMA-Factory and
# llama-recipes issues (Z30-Z35): 3 of the 5 of quality medium above the card blind (Z32-001, SmolLM2-1.7B at 16K
# tokens without checkpointing on an H100, expected 63.7 GiB and bounded at 87.4; Z33-001, Qwen1.5-7B ZeRO-2 fp16
# on 8 A100-40GB, expected 33.9 GiB and bounded at 46.4: both kept off the card by the bound only).
EXTERNAL_RUNS_17 = EXTERNAL_RUNS.with_name("external_runs_17.jsonl")
EXTERNAL_RUNS_18 = EXTERNAL_RUNS.with_name("external_runs_18.jsonl")
# A twentieth, transcribed blind 2026-11-28 (session 31): pull requests' before/after memory tables and logs
# (torchtitan's chunked loss, Liger-Kernel's DeepSeek-V3 and HF-example logs, a TRL Liger PR's OOM, a PyTorch blog
# OOM): 8 rows of quality medium, blind 4.5 % / 14.0 %, 3 of 3 OOM rows above the card.
EXTERNAL_RUNS_20 = EXTERNAL_RUNS.with_name("external_runs_20.jsonl")
# A nineteenth, transcribed blind the same day: web pages with measured peaks (a BERT-large notebook, Raschka's
# DistilBERT ZeRO-2 / FSDP-offload logs, a QLoRA blog's nvidia-smi reading; a cloud report's rows are of quality
# low): 4 rows of quality medium, blind 32.6 % / 50.5 % (DistilBERT under Lightning's DeepSpeed and FSDP offload
# -20 % and -53 % of 3.7 and 1.1 GiB; the QLoRA reading a mid-training nvidia-smi snapshot, +46 %).
EXTERNAL_RUNS_19 = EXTERNAL_RUNS.with_name("external_runs_19.jsonl")
# A twenty-first, transcribed blind 2026-11-28 (session 32): IBM fms-acceleration's PowerLM-3B table (exact
# max_memory_allocated bytes: full, LoRA and QLoRA, 1 and 2 GPUs) and torchao's MX-formats README (Llama-3-8B in
# torchtitan on B200, max reserved): 9 rows of quality high or medium, blind 1.2 % / 3.1 %.
EXTERNAL_RUNS_21 = EXTERNAL_RUNS.with_name("external_runs_21.jsonl")


# Sets 3-14, 16, 17 and 19-21 (their comments above): rows, the median and p90 they reach today, and the OOM rows
# above the card (None: the set has none). X17-001 of set 3 is missed (above); a fix that predicts it above the card
# should raise its 0.
@pytest.mark.parametrize(("path", "rows", "median", "p90", "ooms"), [
    (EXTERNAL_RUNS_3, 7, 0.062, 0.322, 0),
    (EXTERNAL_RUNS_4, 14, 0.073, 0.150, None),
    (EXTERNAL_RUNS_5, 31, 0.063, 0.158, 5),
    (EXTERNAL_RUNS_6, 7, 0.049, 0.241, None),
    (EXTERNAL_RUNS_7, 23, 0.021, 0.177, 4),
    (EXTERNAL_RUNS_8, 6, 0.129, 0.232, None),
    (EXTERNAL_RUNS_9, 20, 0.052, 0.111, 3),
    (EXTERNAL_RUNS_10, 11, 0.040, 0.115, 1),
    (EXTERNAL_RUNS_11, 15, 0.055, 0.110, None),
    (EXTERNAL_RUNS_12, 6, 0.143, 0.279, None),
    (EXTERNAL_RUNS_13, 3, 0.047, 0.200, None),
    (EXTERNAL_RUNS_14, 2, 0.188, 0.302, 1),
    (EXTERNAL_RUNS_16, 2, 2.897, 5.166, None),
    (EXTERNAL_RUNS_17, 14, 0.062, 0.132, None),
    (EXTERNAL_RUNS_19, 4, 0.327, 0.506, None),
    (EXTERNAL_RUNS_20, 8, 0.046, 0.141, 3),
    (EXTERNAL_RUNS_21, 9, 0.013, 0.032, None),
], ids=["third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth", "eleventh", "twelfth",
        "thirteenth", "fourteenth", "sixteenth", "seventeenth", "nineteenth", "twentieth", "twenty-first"])
def test_later_external_sets_do_not_regress(path: Path, rows: int, median: float, p90: float,
                                            ooms: int | None) -> None:
    ev = evaluate(select_runs(parse_runs(path.read_text()), {"high", "medium"}))
    s = ev.summary()
    assert s["n"] == rows
    assert s["median_ape"] <= median and s["p90_ape"] <= p90, s
    if ooms is not None:
        assert ev.oom_right == ooms


def test_fifteenth_set_oom_outcomes_stay_above_the_card() -> None:
    """The fifteenth set is OOM outcomes only: 4 of its 5 of quality medium are predicted above the card."""
    ev = evaluate(select_runs(parse_runs(EXTERNAL_RUNS_15.read_text()), {"high", "medium"}))
    assert ev.oom_total == 5 and ev.oom_right == 4


def test_eighteenth_set_oom_outcomes() -> None:
    """The eighteenth set is OOM outcomes only: 3 of its 5 of quality medium are expected above the card."""
    ev = evaluate(select_runs(parse_runs(EXTERNAL_RUNS_18.read_text()), {"high", "medium"}))
    assert ev.oom_total == 5 and ev.oom_right == 3
