# Issue 3, eighth session: does weighting low-noise patches more (--sigma0-noise-ref 25) help Set12 at
# sigma = 15 more than plain continuation?  Both continue the gray model put at
# weights/indeed-denoise-gray.safetensors for the call (the third soup of soup_ft2_x1.sh), 420 s each,
# side by side on ONE H100 (device tool, nvidia-h100-x1), recipe of soup_ft_x1.sh otherwise.
# Carry .carry/train400 .carry/bsds, detector weights moved out.
export PYTHONPATH=. OMP_NUM_THREADS=8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/summary.txt
G="--data .carry/train400 --data .carry/bsds/CBSD432_list.txt --channels 1 --scales 1,0.75,0.5"
COMMON="--steps 1000000 --batch 64 --lr 1e-4 --time-budget 420 --time-limit 420 --quiet --log-every 250 --val-every 1000 --ood-samples 0"
python3 -m indeed_cli train $G $COMMON --init weights/indeed-denoise-gray.safetensors --sparse-blocks 4 \
    --seed 6 --out runs/g8s6 > runs_g8s6.log 2>&1 &
python3 -m indeed_cli train $G $COMMON --init weights/indeed-denoise-gray.safetensors --sparse-blocks 4 \
    --seed 7 --sigma0-noise-ref 25 --out runs/g8w7 > runs_g8w7.log 2>&1 &
wait
for v in g8s6 g8w7; do echo "== $v"; tail -n 3 runs_$v.log; done >> $OUT/summary.txt 2>&1
for v in g8s6 g8w7; do python3 benchmarks/explore/split_safetensors.py split runs/$v/model.safetensors $OUT/$v; done
