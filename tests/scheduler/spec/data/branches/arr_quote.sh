ARGS=(
  --model_name_or_path meta-llama/Llama-3.1-70B
  --bf16
  --fsdp "full_shard offload auto_wrap"
  --per_device_train_batch_size 1
  --gradient_checkpointing
  --max_seq_length 4096
  --output_dir out
)
torchrun --nproc_per_node 8 train.py "${ARGS[@]}"
