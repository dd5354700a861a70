MODEL=meta-llama/Llama-3.1-8B
DEBUG=0
if [ "$DEBUG" = "1" ]; then
  export NCCL_DEBUG=INFO
fi  # debug
torchrun --nproc_per_node 8 train.py --model_name_or_path $MODEL --bf16 --fsdp "full_shard auto_wrap" --per_device_train_batch_size 2 --gradient_checkpointing --max_seq_length 4096 --output_dir out
