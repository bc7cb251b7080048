# Issue 3, eighth session, later calls: two more continued fine-tunes (seeds $1 and $2) of the gray
# model now at weights/indeed-denoise-gray.safetensors (the previous round's best, put there for the
# call), side by side on ONE H100 (device tool, nvidia-h100-x1), 420 s each, the recipe of
# soup_ft_x1.sh; averaged and scored on the CPU as before. Then the speed of the bf16 network copy
# (Checkpoint.network) against fp32, gray and colour. Carry .carry/train400 .carry/bsds, detector
# weights moved out.
export PYTHONPATH=. OMP_NUM_THREADS=8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/summary.txt
G="--data .carry/train400 --data .carry/bsds/CBSD432_list.txt --channels 1 --scales 1,0.75,0.5"
COMMON="--steps 1000000 --batch 64 --lr 1e-4 --time-budget 420 --time-limit 420 --quiet --log-every 250 --val-every 1000 --ood-samples 0"
for seed in $1 $2; do
  python3 -m indeed_cli train $G $COMMON --init weights/indeed-denoise-gray.safetensors --sparse-blocks 4 \
      --seed $seed --out runs/g8s$seed > runs_g8s$seed.log 2>&1 &
done
wait
for seed in $1 $2; do echo "== g8s$seed"; tail -n 3 runs_g8s$seed.log; done >> $OUT/summary.txt 2>&1
for seed in $1 $2; do python3 benchmarks/explore/split_safetensors.py split runs/g8s$seed/model.safetensors $OUT/g8s$seed; done
S="python3 benchmarks/speed.py --device cuda --size 4096 --batch 256 --precision bf16,fp32 --reps 3"
{ timeout 50 $S --channels 1; timeout 50 $S --channels 3; } > $OUT/speed.txt 2>&1
