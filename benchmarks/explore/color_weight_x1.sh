# NOT RUN YET: its one attempt (eighth session) was cut off when the session's device time ran out.
# Issue 3, eighth session: does --sigma0-noise-ref 25 help the colour model as it helped the gray one?
# Two fine-tunes of the shipped colour model, 420 s each, with and without it, side by side on ONE H100
# (device tool, nvidia-h100-x1), the colour control recipe of scales_ft_x1.sh (peak lr 2e-4) otherwise.
# Carry .carry/bsds. Scored on the CPU with gray_variants_eval.py --channels 3 --sets CBSD68,Kodak24.
export PYTHONPATH=. OMP_NUM_THREADS=8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/summary.txt
C="--data .carry/bsds/CBSD432_list.txt --channels 3 --init weights/indeed-denoise-color.safetensors"
COMMON="--steps 1000000 --batch 64 --lr 2e-4 --time-budget 420 --time-limit 420 --quiet --log-every 250 --val-every 1000 --ood-samples 0"
python3 -m indeed_cli train $C $COMMON --seed 0 --out runs/c8ctrl > runs_c8ctrl.log 2>&1 &
python3 -m indeed_cli train $C $COMMON --seed 1 --sigma0-noise-ref 25 --out runs/c8w > runs_c8w.log 2>&1 &
wait
for v in c8ctrl c8w; do echo "== $v"; tail -n 2 runs_$v.log; cp runs/$v/model.safetensors $OUT/$v.safetensors; done >> $OUT/summary.txt 2>&1
