# The GPU call behind docs/benchmarks.md "Fine-tunes aimed at the Set12 gap" (sixth session of 2026-11-26):
# one NVIDIA H100 (device tool, nvidia-h100-x1), the four runs sharing it; .carry/ held Train400, BSDS500 and
# Set12 + BSD68 (dtest). Needs the code of commit c0df07a, which added this file (--noise-level-input and
# --sparse-top-blocks were removed afterwards because they did not help).
export PYTHONPATH=. OMP_NUM_THREADS=4
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/summary.txt
G="--data .carry/train400 --data .carry/bsds/CBSD432_list.txt --channels 1"
COMMON="--init weights/indeed-denoise-gray.safetensors --steps 1000000 --batch 64 --lr 2e-4 --time-budget 390 --time-limit 390 --quiet --log-every 250 --val-every 1000 --ood-samples 0"
python3 -m indeed_cli train $G $COMMON --out runs/v0 > runs_v0.log 2>&1 &
python3 -m indeed_cli train $G $COMMON --out runs/v1 --noise-level-input > runs_v1.log 2>&1 &
python3 -m indeed_cli train $G $COMMON --out runs/v2 --sparse-top-blocks 2 > runs_v2.log 2>&1 &
python3 -m indeed_cli train $G $COMMON --out runs/v3 --noise-level-input --sparse-top-blocks 2 > runs_v3.log 2>&1 &
wait
for v in v0 v1 v2 v3; do echo "== $v"; tail -n 3 runs_$v.log; grep psnr_s15 runs/$v/log.jsonl | tail -n 4; cp runs/$v/model.safetensors $OUT/$v.safetensors; done >> $OUT/summary.txt 2>&1
python3 benchmarks/explore/gray_variants_eval.py --data .carry/dtest --device cuda --weights ship=weights/indeed-denoise-gray.safetensors \
  --weights v0=runs/v0/model.safetensors --weights v1=runs/v1/model.safetensors --weights v2=runs/v2/model.safetensors \
  --weights v3=runs/v3/model.safetensors >> $OUT/summary.txt 2>&1
