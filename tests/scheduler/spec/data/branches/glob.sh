MODEL=meta-llama/Llama-3.1-8B-Instruct
BS=8
EXTRA=""
if [[ "$MODEL" == *8B* ]]; then
  BS=1
  EXTRA="--gradient_checkpointing"
fi
torchrun --nproc_per_node 8 train.py --model_name_or_path $MODEL --bf16 --fsdp "full_shard auto_wrap" \
  --per_device_train_batch_size $BS $EXTRA --max_seq_length 4096 --output_dir out
