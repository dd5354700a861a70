#!/usr/bin/env bash
# One call on a lent GPU machine: measure as much of the default calibration sweep as a wall-clock budget allows,
# most useful groups first, and leave the rows and the log under $OUT (or ./calibrate-out).
#
#   bash bench/gpu_calibrate.sh [BUDGET_SECONDS]        # default 480
#
# Python packages the machine lacks (pydantic, skops, bitsandbytes, ...) may be carried as wheels in .whl/
# (bench/fetch_calibration_wheels.sh downloads them); they are installed to /tmp/site. The sweep stops at the
# budget (SIGTERM: the running worker is killed, its config is not recorded, every finished row is kept), and it
# stops early if three configs in a row crash (a broken setup, not a measurement).
set -u
BUDGET_SECONDS=${1:-480}
OUT_DIR=${OUT:-$PWD/calibrate-out}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/calibrate.log"
start=$SECONDS
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "installing the carried wheels failed"; exit 3; }
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.max.sm --format=csv | tee "$OUT_DIR/gpu.txt"
GPU=$(python3 -c "
import torch
from predictors.hardware import lookup_gpu
print(lookup_gpu(torch.cuda.get_device_name(0)).name)") || { echo "no catalog GPU found"; exit 3; }
ROWS="$OUT_DIR/$GPU.jsonl"
echo "GPU $GPU -> $ROWS (setup $((SECONDS - start)) s)"
# Continue the committed rows of this GPU (resume skips the configs they hold): a second lease measures new configs.
if [ -s "predictors/data/measured/$GPU.jsonl" ] && [ ! -s "$ROWS" ]; then
  cp "predictors/data/measured/$GPU.jsonl" "$ROWS"
  echo "resuming from predictors/data/measured/$GPU.jsonl ($(wc -l < "$ROWS") rows)"
fi
# Priority: LoRA on 3B-8B, per-layer depth scaling, sub-2B full fine-tuning, micro-batch, sequence/attention,
# optimizers, QLoRA (slower: checkpoint + quantized reload; the dev set's largest unmeasured method), the
# the open questions of the H200 rows (checkpointed logits, 4-bit layers' inputs, Phi's GELU), the hand-picked
# configs, 70B-width LoRA, Gemma-2, GPT-2. On the H200 all 122 are measured (2026-11-25/26); on the H100 80GB the
# first 38 (2026-11-26: same allocated bytes as the H200 on every one, so another GPU adds throughput and the
# reserved/NVML levels, not allocated-memory information). The memory-saving switches (open-switches*, 16 configs,
# none measured yet) and DoRA (open-dora, 8) go first: they test terms no GPU has checked.
GROUPS_IN_ORDER=(open-switches open-switches-fused-adamw open-switches-lora open-dora
                 lora-targets scaled-layers small-full micro-batch seq-attention optimizers qlora
                 open-ckpt-logits open-qlora-inputs open-phi-gelu configs scaled-layers-lora scaled-layers-gemma2
                 gpt2-full open-switches-layered)
only=()
for g in "${GROUPS_IN_ORDER[@]}"; do only+=(--only "$g"); done
left=$((BUDGET_SECONDS - (SECONDS - start)))
timeout --signal=TERM "$left" python3 -m scheduler.cli calibrate --sweep bench/sweeps/default.yaml "${only[@]}" \
  --out "$ROWS" --resume --device cuda --timeout-seconds 150 > "$LOG" 2>&1 &
pid=$!
while kill -0 "$pid" 2> /dev/null; do
  sleep 3
  if [ "$(wc -l < "$ROWS" 2> /dev/null || echo 0)" -ge 3 ] \
     && [ "$(tail -3 "$ROWS" | grep -c '"outcome":"crash"')" -eq 3 ]; then
    echo "three configs in a row crashed: stopping"; kill -TERM "$pid"; break
  fi
done
wait "$pid"; rc=$?
tail -n 200 "$LOG"
python3 - "$ROWS" <<'PY'
import collections, json, sys
rows = [json.loads(line) for line in open(sys.argv[1], encoding="utf-8") if line.strip()]
print(f"{len(rows)} rows:", dict(collections.Counter(r["calibration"]["outcome"] for r in rows)))
for r in rows:
    if r["calibration"]["outcome"] in ("crash", "timeout"):
        print(r["calibration"]["config_id"], r["calibration"]["reason"][:300])
PY
echo "calibrate exit $rc after $((SECONDS - start)) s"
