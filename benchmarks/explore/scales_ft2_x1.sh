# Issue 3, sixth session: continue the shipped gray model (already fine-tuned with --scales 1,0.75,0.5) for
# another 540 s, with the same scales and with more of them; two runs side by side on ONE H100 (device
# tool, nvidia-h100-x1). Carry .carry/train400 .carry/bsds with the colour and detector weights moved out
# of the tree. Scored on the CPU with gray_variants_eval.py; docs/benchmarks.md reads the table.
export PYTHONPATH=. OMP_NUM_THREADS=8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/summary.txt
G="--data .carry/train400 --data .carry/bsds/CBSD432_list.txt --channels 1 --init weights/indeed-denoise-gray.safetensors"
COMMON="--steps 1000000 --batch 64 --lr 1e-4 --time-budget 540 --time-limit 540 --quiet --log-every 250 --val-every 1000 --ood-samples 0"
python3 -m indeed_cli train $G $COMMON --out runs/g2a --scales 1,0.75,0.5 > runs_g2a.log 2>&1 &
python3 -m indeed_cli train $G $COMMON --out runs/g2b --scales 1,0.9,0.8,0.7,0.6,0.5 > runs_g2b.log 2>&1 &
wait
for v in g2a g2b; do echo "== $v"; tail -n 2 runs_$v.log; cp runs/$v/model.safetensors $OUT/$v.safetensors; done >> $OUT/summary.txt 2>&1
