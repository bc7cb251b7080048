# Issue 3, seventh session, second call: does the 4-block gray model (shipped, grow_ft_x1.sh's g7b4) gain
# more from another 540 s fine-tune, or from growing again to 6 blocks per scale?  Two runs side by side on
# ONE H100 (device tool, nvidia-h100-x1), the recipe of grow_ft_x1.sh. Carry .carry/train400 .carry/bsds
# with the colour and detector weights moved out of the tree. Scored on the CPU with gray_variants_eval.py.
export PYTHONPATH=. OMP_NUM_THREADS=8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/summary.txt
python3 benchmarks/explore/grow_blocks.py --weights weights/indeed-denoise-gray.safetensors --blocks 6 --out runs/grown6.safetensors >> $OUT/summary.txt 2>&1
G="--data .carry/train400 --data .carry/bsds/CBSD432_list.txt --channels 1 --scales 1,0.75,0.5"
COMMON="--steps 1000000 --batch 64 --lr 1e-4 --time-budget 540 --time-limit 540 --quiet --log-every 250 --val-every 1000 --ood-samples 0"
python3 -m indeed_cli train $G $COMMON --init weights/indeed-denoise-gray.safetensors --sparse-blocks 4 --out runs/g7b4c > runs_g7b4c.log 2>&1 &
python3 -m indeed_cli train $G $COMMON --init runs/grown6.safetensors --sparse-blocks 6 --out runs/g7b6 > runs_g7b6.log 2>&1 &
wait
for v in g7b4c g7b6; do echo "== $v"; tail -n 3 runs_$v.log; done >> $OUT/summary.txt 2>&1
# files come back only below 16 MiB: each checkpoint in two halves (tensors split, metadata on both);
# join them with split_safetensors.py join
for v in g7b4c g7b6; do python3 benchmarks/explore/split_safetensors.py split runs/$v/model.safetensors $OUT/$v; done
