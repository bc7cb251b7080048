# Issue 4, sixth session: is r0 = 8 better than the shipped r0 = 64? The shipped detector recipe
# (docs/detect.md, d_pyr) four times side by side on ONE H100 (device tool, nvidia-h100-x1), 330 s
# each: r0 64 seed 2 (control), r0 8 seeds 1 and 2, r0 4 seed 1; then all four
# scored in the same call. Carry .carry/mt .carry/mteval .carry/dtd (benchmarks/mt_split.py --copy)
# with weights/*.safetensors moved out of the tree (64 MiB limit); the shipped detector scores
# the same on GPU and CPU (docs/detect.md), so it is not rerun here.
export PYTHONPATH=. OMP_NUM_THREADS=4
O=$OUT; mkdir -p runs
nvidia-smi -L > $O/summary.txt
D="--task detect --data .carry/mt/train.txt --val .carry/mt/calib.txt --textures .carry/dtd --channels 1 --sparse-width 64 --batch 32 --scales 1,0.5,0.25"
COMMON="--steps 1000000 --time-limit 330 --time-budget 330 --quiet --log-every 250"
run() { name=$1; shift; python3 -m indeed_cli train $D "$@" --out runs/$name $COMMON > runs/$name.err 2>&1 & }
run r64s2 --rank 64 --seed 2
run r8s1 --rank 8 --seed 1
run r8s2 --rank 8 --seed 2
run r4s1 --rank 4 --seed 1
wait
for n in r64s2 r8s1 r8s2 r4s1; do echo "== $n"; tail -n 2 runs/$n.err; tail -n 1 runs/$n/log.jsonl; done >> $O/summary.txt
W=
for n in r64s2 r8s1 r8s2 r4s1; do W=$W${W:+,}$n=runs/$n/model.safetensors; cp runs/$n/model.safetensors $O/$n.safetensors; done
python3 benchmarks/detect.py --data .carry/mteval --normal .carry/mteval/normal --device cuda --weights $W \
  --methods r64s2,r8s1,r8s2,r4s1 >> $O/summary.txt 2>&1
