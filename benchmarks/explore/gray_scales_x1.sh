# Issue 3, sixth session: scale augmentation for the gray denoiser (DnCNN trained on its images at
# scales 1, 0.9, 0.8, 0.7). Four fine-tunes of the shipped gray model side by side on ONE H100 (device
# tool, nvidia-h100-x1), 390 s each, as in gray_variants_x1.sh: control, --scales 1,0.9,0.8,0.7 (seeds 0
# and 1: the seed spread of such a fine-tune), --scales 1,0.75,0.5; then all and the shipped model on
# Set12 / BSD68. Carry .carry/train400 .carry/bsds .carry/dtest (Set12, BSD68) with the colour and
# detect weights moved out of the tree (64 MiB limit). docs/benchmarks.md reads the table.
export PYTHONPATH=. OMP_NUM_THREADS=4
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/summary.txt
G="--data .carry/train400 --data .carry/bsds/CBSD432_list.txt --channels 1"
COMMON="--init weights/indeed-denoise-gray.safetensors --steps 1000000 --batch 64 --lr 2e-4 --time-budget 390 --time-limit 390 --quiet --log-every 250 --val-every 1000 --ood-samples 0"
python3 -m indeed_cli train $G $COMMON --out runs/ctrl > runs_ctrl.log 2>&1 &
python3 -m indeed_cli train $G $COMMON --out runs/sc7 --scales 1,0.9,0.8,0.7 > runs_sc7.log 2>&1 &
python3 -m indeed_cli train $G $COMMON --out runs/sc7s1 --scales 1,0.9,0.8,0.7 --seed 1 > runs_sc7s1.log 2>&1 &
python3 -m indeed_cli train $G $COMMON --out runs/sc5 --scales 1,0.75,0.5 > runs_sc5.log 2>&1 &
wait
for v in ctrl sc7 sc7s1 sc5; do echo "== $v"; tail -n 2 runs_$v.log; tail -n 1 runs/$v/log.jsonl; cp runs/$v/model.safetensors $OUT/$v.safetensors; done >> $OUT/summary.txt 2>&1
python3 benchmarks/explore/gray_variants_eval.py --data .carry/dtest --device cuda --weights ship=weights/indeed-denoise-gray.safetensors \
  --weights ctrl=runs/ctrl/model.safetensors --weights sc7=runs/sc7/model.safetensors --weights sc7s1=runs/sc7s1/model.safetensors \
  --weights sc5=runs/sc5/model.safetensors >> $OUT/summary.txt 2>&1
