# Issue 4, fifth session: the shipped detector recipe with --rank 8 and --rank 16, one GPU each of the
# device tool's H100 x2 machine; results in docs/detect.md. Carry .carry/mt .carry/mteval .carry/dtd
# (benchmarks/mt_split.py --copy) with weights/*.safetensors moved out of the tree (64 MiB limit).
# The shipped detector's recipe (docs/detect.md, d_pyr) with --rank 8 and --rank 16, one GPU each, 380 s.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=16
O=$OUT; mkdir -p runs
nvidia-smi -L > $O/gpu.txt
D="--task detect --data .carry/mt/train.txt --val .carry/mt/calib.txt --textures .carry/dtd --channels 1 --sparse-width 64 --batch 32 --scales 1,0.5,0.25"
COMMON="--steps 1000000 --time-limit 380 --time-budget 380 --quiet --log-every 250"
E="--data .carry/mteval --normal .carry/mteval/normal --device cuda"
run() { gpu=$1; name=$2; shift 2; ( export CUDA_VISIBLE_DEVICES=$gpu
  python3 -m indeed_cli train $D "$@" --out runs/$name $COMMON > runs/$name.err 2>&1
  cp runs/$name/model.safetensors $O/$name.safetensors
  python3 benchmarks/detect.py $E --weights $name=runs/$name/model.safetensors --methods $name > $O/eval_$name.md 2>&1 ) & }
run 0 r8  --rank 8
run 1 r16 --rank 16
wait
tail -n 3 runs/r8.err runs/r16.err > $O/train_tail.txt
