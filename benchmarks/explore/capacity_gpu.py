"""Training steps per second on a GPU for larger sparse modules (random data, batch 64 of
128x128 colour patches, bf16 autocast, the full loss), to plan the retraining of issue 3.
One-off exploration (device tool):

    python benchmarks/explore/capacity_gpu.py

It ran against commit 15ac554 or the docs commit after it.
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from indeed_cli.config import LossWeights, ModelConfig  # noqa: E402
from indeed_cli.networks import InDeed  # noqa: E402
from indeed_cli.training import training_loss  # noqa: E402

dev = torch.device("cuda")
torch.backends.cudnn.benchmark = True
print(torch.cuda.get_device_name())
for w, b, lv in [(64, 2, 3), (96, 2, 3), (64, 4, 3), (96, 3, 3), (128, 2, 3), (64, 2, 4)]:
    cfg = ModelConfig(channels=3, sparse_width=w, sparse_blocks=b, sparse_levels=lv)
    model = InDeed(cfg).to(dev).to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    clean = torch.rand(64, 3, 128, 128, device=dev)
    Y = (clean + 0.1 * torch.randn_like(clean)).contiguous(memory_format=torch.channels_last)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss, _ = training_loss(model, Y, {"clean": clean}, "denoise", LossWeights(), cfg.priors)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(40):
        step()
    torch.cuda.synchronize()
    print(f"width {w} blocks {b} levels {lv}: {40 / (time.perf_counter() - t):.1f} steps/s (batch 64)", flush=True)
