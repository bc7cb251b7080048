# Issue 3, eighth session: the next round after sigma_weight_x1.sh: two runs with --sigma0-noise-ref 25 (seeds 8, 9)
# from its weighted run g8w7 (put at weights/indeed-denoise-gray.safetensors for the call), to be averaged.
export PYTHONPATH=. OMP_NUM_THREADS=8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/summary.txt
G="--data .carry/train400 --data .carry/bsds/CBSD432_list.txt --channels 1 --scales 1,0.75,0.5"
COMMON="--steps 1000000 --batch 64 --lr 1e-4 --time-budget 420 --time-limit 420 --quiet --log-every 250 --val-every 1000 --ood-samples 0"
python3 -m indeed_cli train $G $COMMON --init weights/indeed-denoise-gray.safetensors --sparse-blocks 4 \
    --seed 8 --sigma0-noise-ref 25 --out runs/g8w8 > runs_g8w8.log 2>&1 &
python3 -m indeed_cli train $G $COMMON --init weights/indeed-denoise-gray.safetensors --sparse-blocks 4 \
    --seed 9 --sigma0-noise-ref 25 --out runs/g8w9 > runs_g8w9.log 2>&1 &
wait
for v in g8w8 g8w9; do echo "== $v"; tail -n 3 runs_$v.log; done >> $OUT/summary.txt 2>&1
for v in g8w8 g8w9; do python3 benchmarks/explore/split_safetensors.py split runs/$v/model.safetensors $OUT/$v; done
