RESUME=
GC=""
if [ -n $RESUME ]; then
  GC="--gradient_checkpointing"
fi
torchrun --nproc_per_node 8 train.py --model_name_or_path meta-llama/Llama-3.1-8B --bf16 --fsdp "full_shard auto_wrap" --per_device_train_batch_size 2 $GC --max_seq_length 4096 --output_dir out
