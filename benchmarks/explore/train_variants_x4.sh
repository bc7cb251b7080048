# The eight-variant comparison of docs/model.md (NVIDIA H100 x4, device tool, 2026-11-26): two runs per GPU,
# 470 s each. Data copied to .carry/ (BSDS500 with CBSD432_list.txt, Train400). Logs: runs/*/log.jsonl.
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total --format=csv > $OUT/gpu.txt
mkdir -p runs
C="--data .carry/bsds/CBSD432_list.txt --channels 3"
G="--data .carry/train400 --data .carry/bsds/CBSD432_list.txt --channels 1"
COMMON="--steps 1000000 --batch 64 --time-limit 470 --time-budget 1500 --quiet --log-every 250 --val-every 1000 --ood-samples 0"
run() { gpu=$1; name=$2; shift 2; CUDA_VISIBLE_DEVICES=$gpu python3 -m indeed_cli train "$@" --out runs/$name $COMMON > runs/$name.err 2>&1 & }
run 0 c_w64    $C --sparse-width 64
run 0 c_w64L   $C --sparse-width 64 --sparse-input residual+lowrank
run 1 c_w96    $C --sparse-width 96
run 1 c_w96L   $C --sparse-width 96 --sparse-input residual+lowrank
run 2 c_w64b4  $C --sparse-width 64 --sparse-blocks 4
run 2 c_w64l4  $C --sparse-width 64 --sparse-levels 4
run 3 g_w64    $G --sparse-width 64
run 3 g_w64L   $G --sparse-width 64 --sparse-input residual+lowrank
sleep 60; nvidia-smi > runs/smi.txt
wait
tar czf $OUT/logs.tgz runs/*.err runs/*/log.jsonl runs/smi.txt
du -sh runs/* > $OUT/sizes.txt
