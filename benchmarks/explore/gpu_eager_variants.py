"""Where eager bf16 GPU inference loses time, and what removes it without changing results much
(issue 3: gray 4-block model at 91.7 MP/s eager against the 100 MP/s target).  One-off.

    python benchmarks/explore/gpu_eager_variants.py --images .carry/dtest/Set12

Variants (each adds to the one before, except the last, which replaces them):
  base       what `indeed denoise --precision bf16` did before: fp32 weights under autocast,
             which casts them on every call
  convbf16   convolution weights cast to bf16 once (autocast's per-call casts become no-ops;
             the convolutions compute exactly what they did)
  cudnnbench cuDNN autotuning on
  gnbf16     GroupNorm of the low-rank module on bf16 activations (autocast runs it in fp32,
             with a cast in and out around every call)
  purebf16   no autocast: a bf16 copy of the whole network (Checkpoint.network), which is what
             `--precision bf16` runs since this measurement; the tiles stay fp32
Prints MP/s on a 4096x4096 gray image, max |difference| to base, and PSNR on the given images.
"""
import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from indeed_cli import InferenceOptions, denoise, load_model  # noqa: E402
from indeed_cli.imageio import read_image  # noqa: E402
from indeed_cli.inference import _tile_decompose  # noqa: E402
from indeed_cli.metrics import add_awgn, image_seed, psnr  # noqa: E402
from indeed_cli.tiling import tiled_apply  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("--images", required=True)
ap.add_argument("--weights", default="gray")
ap.add_argument("--channels", type=int, default=1)
ap.add_argument("--sigma", type=float, default=15)
a = ap.parse_args()


class GroupNormBF16(nn.Module):
    def __init__(self, gn: nn.GroupNorm):
        super().__init__()
        self.gn = gn

    def forward(self, x):
        with torch.autocast("cuda", enabled=False):
            x = x.to(torch.bfloat16)
            return F.group_norm(x, self.gn.num_groups, self.gn.weight.to(x.dtype), self.gn.bias.to(x.dtype), self.gn.eps)


def apply(model, variant):
    if variant == "convbf16":
        for m in model.modules():
            if isinstance(m, (nn.Conv1d, nn.Conv2d, nn.ConvTranspose2d)):
                m.to(torch.bfloat16)
    if variant == "gnbf16":
        for m in list(model.modules()):  # a list first: the wrappers are modules too
            for name, child in list(m.named_children()):
                if isinstance(child, nn.GroupNorm):
                    setattr(m, name, GroupNormBF16(child))
    if variant == "cudnnbench":
        torch.backends.cudnn.benchmark = True


ck = load_model(a.weights, a.channels, "cuda")  # modified in place by the autocast variants
fresh = load_model(a.weights, a.channels, "cuda")  # for purebf16: what --precision bf16 runs now


def denoise_autocast(ck, data, _):
    """The bf16 path before the change: the fp32 network under autocast."""
    fn = _tile_decompose(ck, a.channels, "denoise", "fp32")
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
        maps, _ = tiled_apply(fn, torch.from_numpy(data), 128, 32, 256, device="cuda")
    return maps["X"].numpy()


def denoise_copy(_, data, opts):
    return denoise(fresh, data, opts)


run = denoise_autocast
opts = InferenceOptions(precision="bf16")
big = np.random.default_rng(0).random((a.channels, 4096, 4096), dtype=np.float32)
files = sorted(Path(a.images).iterdir())
clean = [read_image(p).data for p in files]
noisy = [add_awgn(x, a.sigma, image_seed(p.name, a.sigma)) for p, x in zip(files, clean)]
print(f"Command: python {' '.join(sys.argv)}  \nDevice: {torch.cuda.get_device_name()}, torch {torch.__version__}\n")
print("| variant | s / 4096² image | MP/s | max abs diff to base | PSNR σ%g |" % a.sigma)
print("|---|---|---|---|---|")
ref = None
for variant in ("base", "convbf16", "cudnnbench", "gnbf16", "purebf16"):
    apply(ck.model, variant)
    if variant == "purebf16":
        run = denoise_copy
    run(ck, big, opts)
    ts = []
    for _ in range(5):
        torch.cuda.synchronize()
        t = time.perf_counter()
        run(ck, big, opts)
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t)
    outs = [run(ck, y, opts) for y in noisy]
    if ref is None:
        ref = outs
    diff = max(float(np.abs(o - r).max()) for o, r in zip(outs, ref))
    p = np.mean([psnr(o, x) for o, x in zip(outs, clean)])
    s = float(np.median(ts))
    print(f"| {variant} | {s:.3f} | {4096 * 4096 / s / 1e6:.1f} | {diff:.2e} | {p:.4f} |", flush=True)
    if variant == "base":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            run(ck, big, opts)
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12), file=sys.stderr)
