# Next GPU session, issue 4: four detector recipes side by side (not yet run).
# Issue 4, next GPU session: four detector recipes side by side, one per GPU, same 470 s each.
# Carry: .carry/mt .carry/dtd .carry/x4det.sh (46 MB): move weights/*.safetensors out of the tree first (64 MiB limit).
# Evaluate the returned models on this CPU: python benchmarks/detect.py --data ../shared/data/anomaly/magnetic-tile --weights F --methods indeed
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
mkdir -p runs
D="--task detect --data .carry/mt/train.txt --val .carry/mt/calib.txt --textures .carry/dtd --channels 1 --sparse-width 64 --batch 32"
COMMON="--steps 1000000 --time-limit 470 --time-budget 470 --quiet --log-every 250"
run() { gpu=$1; name=$2; shift 2; CUDA_VISIBLE_DEVICES=$gpu python3 -m indeed_cli train $D "$@" --out runs/$name $COMMON > runs/$name.err 2>&1 & }
run 0 d_ctrl
run 1 d_L      --sparse-input residual+lowrank
run 2 d_sub    --anomalies subtle
run 3 d_subL   --anomalies subtle --sparse-input residual+lowrank
wait
for n in d_ctrl d_L d_sub d_subL; do cp runs/$n/model.safetensors $OUT/$n.safetensors; done
tar czf $OUT/logs.tgz runs/*.err runs/*/log.jsonl
