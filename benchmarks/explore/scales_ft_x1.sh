# Issues 3, sixth session: scale augmentation (--scales 1,0.75,0.5) as a longer fine-tune of both shipped
# denoisers, with a colour control without it; three runs side by side on ONE H100 (device tool,
# nvidia-h100-x1), 540 s each. Carry .carry/train400 .carry/bsds with the detector weights moved out of
# the tree (64 MiB limit). The checkpoints come back and are scored on the CPU
# (benchmarks/explore/gray_variants_eval.py --channels 1|3); docs/benchmarks.md reads the tables.
export PYTHONPATH=. OMP_NUM_THREADS=5
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/summary.txt
G="--data .carry/train400 --data .carry/bsds/CBSD432_list.txt --channels 1 --init weights/indeed-denoise-gray.safetensors"
C="--data .carry/bsds/CBSD432_list.txt --channels 3 --init weights/indeed-denoise-color.safetensors"
COMMON="--steps 1000000 --batch 64 --lr 2e-4 --time-budget 540 --time-limit 540 --quiet --log-every 250 --val-every 1000 --ood-samples 0"
python3 -m indeed_cli train $G $COMMON --out runs/g_sc5 --scales 1,0.75,0.5 > runs_g_sc5.log 2>&1 &
python3 -m indeed_cli train $C $COMMON --out runs/c_sc5 --scales 1,0.75,0.5 > runs_c_sc5.log 2>&1 &
python3 -m indeed_cli train $C $COMMON --out runs/c_ctrl > runs_c_ctrl.log 2>&1 &
wait
for v in g_sc5 c_sc5 c_ctrl; do echo "== $v"; tail -n 2 runs_$v.log; grep psnr_s15 runs/$v/log.jsonl | tail -n 3; cp runs/$v/model.safetensors $OUT/$v.safetensors; done >> $OUT/summary.txt 2>&1
