# Issue 3, seventh session: does a deeper f_thetaS help the gray model at full training length?
# The shipped gray model grown to 4 residual blocks per U-Net scale (grow_blocks.py: the same function
# to start with) and fine-tuned 540 s, beside the same fine-tune of the shipped network (control; the
# recipe of scales_ft2_x1.sh's g2a), on ONE H100 (device tool, nvidia-h100-x1). Carry .carry/train400
# .carry/bsds with the colour and detector weights moved out of the tree. Scored on the CPU with
# gray_variants_eval.py; docs/benchmarks.md reads the table.
export PYTHONPATH=. OMP_NUM_THREADS=8
nvidia-smi --query-gpu=name --format=csv,noheader > $OUT/summary.txt
python3 benchmarks/explore/grow_blocks.py --weights weights/indeed-denoise-gray.safetensors --blocks 4 --out runs/grown4.safetensors >> $OUT/summary.txt 2>&1
G="--data .carry/train400 --data .carry/bsds/CBSD432_list.txt --channels 1 --scales 1,0.75,0.5"
COMMON="--steps 1000000 --batch 64 --lr 1e-4 --time-budget 540 --time-limit 540 --quiet --log-every 250 --val-every 1000 --ood-samples 0"
python3 -m indeed_cli train $G $COMMON --init weights/indeed-denoise-gray.safetensors --out runs/g7c > runs_g7c.log 2>&1 &
python3 -m indeed_cli train $G $COMMON --init runs/grown4.safetensors --sparse-blocks 4 --out runs/g7b4 > runs_g7b4.log 2>&1 &
wait
for v in g7c g7b4; do echo "== $v"; tail -n 3 runs_$v.log; cp runs/$v/model.safetensors $OUT/$v.safetensors; done >> $OUT/summary.txt 2>&1
