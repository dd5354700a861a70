USE_LORA=false
if [ "$USE_LORA" = "true" ]; then
  EXTRA="--use_peft --lora_r 16"
  BS=16
else  # full fine-tuning needs a smaller batch and checkpointing
  EXTRA="--gradient_checkpointing"
  BS=2
fi
torchrun --nproc_per_node 8 train.py --model_name_or_path meta-llama/Llama-3.1-8B --bf16 --fsdp "full_shard auto_wrap" --per_device_train_batch_size $BS $EXTRA --max_seq_length 4096 --output_dir out
