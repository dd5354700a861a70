MODEL_SIZE=8B
while [[ $# -gt 0 ]]; do
  case $1 in
    --size) MODEL_SIZE=$2; shift 2 ;;
    *) shift ;;
  esac
done
if [ "$MODEL_SIZE" = "8B" ]; then
  MODEL=meta-llama/Llama-3.1-8B
  BS=8
elif [ "$MODEL_SIZE" = "70B" ]; then
  MODEL=meta-llama/Llama-3.1-70B
  BS=1
fi
torchrun --nproc_per_node 8 train.py --model_name_or_path $MODEL --bf16 --fsdp "full_shard auto_wrap" --per_device_train_batch_size $BS --gradient_checkpointing --max_seq_length 4096 --output_dir out
