"""One-off (2026-11-26): export the x4 runs' resumable state as checkpoints (the GPU call that would
have exported them ran past its limit), with the facts indeed train writes, then OOD-calibrate.

    python benchmarks/explore/export_state.py color 3 STATE_DIR runs/c_w64L/log.jsonl OUT.safetensors
    python benchmarks/explore/export_state.py gray 1 STATE_DIR runs/g_w64L/log.jsonl OUT.safetensors
"""
import json, sys
from pathlib import Path
import torch
from indeed_cli.config import ModelConfig, LossWeights
from indeed_cli.networks import InDeed
from indeed_cli.training import load_state, list_images
from indeed_cli.checkpoint import save_checkpoint
from indeed_cli.cli.calibrate import calibrate_checkpoint
from dataclasses import asdict

name, channels, state_dir, log, out = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], Path(sys.argv[5])
data = [".carry/bsds/CBSD432_list.txt"] if channels == 3 else [".carry/train400", ".carry/bsds/CBSD432_list.txt"]
paths = [p for d in data for p in list_images(d)][:-8]
cfg = ModelConfig(channels=channels, sparse_width=64, sparse_input="residual+lowrank")
model = InDeed(cfg)
opt = torch.optim.Adam(model.parameters())
step, elapsed = load_state(state_dir, model, opt, torch.Generator())
final = [json.loads(l) for l in open(log)][-1]
assert final["step"] == step, (final, step)
facts = {"task": "denoise", "data": data, "n_train": len(paths), "n_val": 8, "steps": step, "init": None,
         "train_seconds": round(elapsed), "device": "NVIDIA H100 80GB HBM3",
         "schedule": "470 s sharing one GPU with another run (batch 64), then 2 x ~510 s with DDP on 2 GPUs (2 x 64)",
         "batch": 64, "patch": 128, "sigma_max": 75.0, "clip_prob": 0.5, "lr": 4e-4,
         "losses": asdict(LossWeights()), "validation": {k: v for k, v in final.items() if k.startswith("psnr")}}
save_checkpoint(out, model, facts)
calibrate_checkpoint(out, out, paths, "cpu", 256, 0, {"data": data})
print(name, step, elapsed, facts["validation"])
