# Issue 3, eighth session, first call: (1) gray/colour GPU speed with and without cuDNN autotuning
# (GPU otherwise idle), then (2) two continued fine-tunes of the shipped 4-block gray model (g7b4c),
# same recipe, seeds 0 and 1, side by side on ONE H100 (device tool, nvidia-h100-x1), to be
# averaged into one model ("model soup", average_weights.py) and scored on the CPU with
# gray_variants_eval.py. Carry .carry/train400 .carry/bsds with the detector weights moved out.
export PYTHONPATH=. OMP_NUM_THREADS=8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/summary.txt
S="python3 benchmarks/speed.py --device cuda --size 4096 --batch 256 --precision bf16 --reps 3"
{ timeout 60 $S --channels 1; timeout 60 $S --channels 1 --cudnn-benchmark;
  timeout 60 $S --channels 3; timeout 60 $S --channels 3 --cudnn-benchmark; } > $OUT/speed.txt 2>&1
G="--data .carry/train400 --data .carry/bsds/CBSD432_list.txt --channels 1 --scales 1,0.75,0.5"
COMMON="--steps 1000000 --batch 64 --lr 1e-4 --time-budget 420 --time-limit 420 --quiet --log-every 250 --val-every 1000 --ood-samples 0"
for seed in 0 1; do
  python3 -m indeed_cli train $G $COMMON --init weights/indeed-denoise-gray.safetensors --sparse-blocks 4 \
      --seed $seed --out runs/g8s$seed > runs_g8s$seed.log 2>&1 &
done
wait
for v in g8s0 g8s1; do echo "== $v"; tail -n 3 runs_$v.log; done >> $OUT/summary.txt 2>&1
for v in g8s0 g8s1; do python3 benchmarks/explore/split_safetensors.py split runs/$v/model.safetensors $OUT/$v; done
