# Issue 4: detector recipes side by side, one per H100 of the device tool's H100 x4 machine
# (2026-11-26, fourth session; results in docs/detect.md).  bash train_detect_x4.sh 1|2|3
#   call 1 (as first run: 470 s each, no OMP_NUM_THREADS): only d_ctrl came back. The three
#     pyramid runs started training about 150 s after d_ctrl (cause not isolated; four
#     processes with 64 OpenMP threads each on 64 cores is the likeliest), the call hit its
#     590 s limit before they ended, and the machine was released before they could be
#     fetched. Calls 2 and 3 set OMP_NUM_THREADS=16 (the delay did not recur), use shorter
#     limits, and score each model on its GPU in the same call.
#   call 2: d_surf1, d_pyr, d_surf, d_surfL, 400 s each; call 3: n_pyr, d_pyrL, d_pyrS, d_pyr2, 340 s.
# Carry: .carry/mt .carry/dtd (46 MB; benchmarks/mt_split.py --copy) and, for calls 2-3,
# .carry/mteval (the five defect folders + the 79 MT_Free eval images in normal/): move
# weights/*.safetensors out of the tree first (64 MiB limit).
export PYTHONPATH=. NCCL_NVLS_ENABLE=0
CALL=${1:-2}
[ "$CALL" != 1 ] && export OMP_NUM_THREADS=16
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt
mkdir -p runs
LIMIT=$([ "$CALL" = 1 ] && echo 470 || ([ "$CALL" = 2 ] && echo 400 || echo 340))
D="--task detect --data .carry/mt/train.txt --val .carry/mt/calib.txt --textures .carry/dtd --channels 1 --sparse-width 64 --batch 32"
COMMON="--steps 1000000 --time-limit $LIMIT --time-budget $LIMIT --quiet --log-every 250"
E="--data .carry/mteval --normal .carry/mteval/normal --device cuda"
# (--scales 1 is spelled out: it was the default when call 1 ran, 1,0.5,0.25 is now)
run() { gpu=$1; name=$2; shift 2; ( export CUDA_VISIBLE_DEVICES=$gpu
  python3 -m indeed_cli train $D "$@" --out runs/$name $COMMON > runs/$name.err 2>&1
  cp runs/$name/model.safetensors $OUT/$name.safetensors
  [ "$CALL" != 1 ] && python3 benchmarks/detect.py $E --weights $name=runs/$name/model.safetensors --methods $name > runs/eval_$name.md 2>&1 ) & }
case $CALL in
1) run 0 d_ctrl  --scales 1
   run 1 d_pyr   --scales 1,0.5,0.25
   run 2 d_surf  --scales 1,0.5,0.25 --anomalies surface
   run 3 d_surfL --scales 1,0.5,0.25 --anomalies surface --sparse-input residual+lowrank ;;
2) run 0 d_surf1 --scales 1 --anomalies surface
   run 1 d_pyr   --scales 1,0.5,0.25
   run 2 d_surf  --scales 1,0.5,0.25 --anomalies surface
   run 3 d_surfL --scales 1,0.5,0.25 --anomalies surface --sparse-input residual+lowrank ;;
3) run 0 n_pyr   --scales 1,0.5,0.25 --no-bayes
   run 1 d_pyrL  --scales 1,0.5,0.25 --sparse-input residual+lowrank
   run 2 d_pyrS  --scales 1,0.5,0.25 --anomalies subtle
   run 3 d_pyr2  --scales 1,0.5,0.25 --seed 1 ;;
esac
wait
tar czf $OUT/logs.tgz runs/*.err runs/*/log.jsonl runs/*.md
