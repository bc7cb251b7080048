"""CPU time of a 512x512 colour denoise for larger sparse modules (random weights), to size the
next f_thetaS against the 3 s CPU target (docs/model.md).  One-off exploration, this CPU:

    python benchmarks/explore/capacity_cpu.py

It ran against commit 15ac554.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import time, torch, numpy as np
from dataclasses import replace
from indeed_cli.config import ModelConfig
from indeed_cli.networks import InDeed
from indeed_cli.checkpoint import Checkpoint
from indeed_cli import denoise, InferenceOptions
torch.manual_seed(0)
y = np.random.rand(3, 512, 512).astype(np.float32)
for w, b, lv in [(64, 2, 3), (96, 2, 3), (64, 4, 3), (96, 3, 3), (128, 2, 3), (64, 2, 4)]:
    cfg = ModelConfig(channels=3, sparse_width=w, sparse_blocks=b, sparse_levels=lv)
    m = InDeed(cfg).eval()
    ck = Checkpoint(m, cfg, {}, {}, "rand")
    denoise(ck, y)
    ts = []
    for _ in range(3):
        t = time.perf_counter(); denoise(ck, y); ts.append(time.perf_counter() - t)
    print(f"width {w} blocks {b} levels {lv}: params {sum(p.numel() for p in m.sparse.parameters())/1e6:.2f} M, 512x512 colour fp32 {min(ts):.2f} s", flush=True)
