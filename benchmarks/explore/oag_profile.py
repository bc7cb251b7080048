"""Where the time of one InDeedOAG goes, and what batching adaptations buys (docs/benchmarks.md).

    python benchmarks/explore/oag_profile.py --data ../shared/data/denoise-real/PolyU100 --device cuda

Prints, on one device, with the shipped colour model and the adaptation defaults: a warm
`denoise` of one 512x512 image; one adaptation step (forward + backward of 8 tiles); one
evaluation (16 tiles); `adapt_each` wall time per image for several group sizes; and a
torch.profiler summary of one warm `denoise` call.  It ran (H100, device tool) against the
tree of the commit that added it.
"""
import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from indeed_cli import InferenceOptions, denoise, load_model  # noqa: E402
from indeed_cli.adaptation import AdaptConfig, adapt_each, adaptation_objective  # noqa: E402
from indeed_cli.imageio import read_image  # noqa: E402


def timed(fn, device, reps=5):
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--groups", default="1,4,16,32,64")
    ap.add_argument("--precision", default="fp32")
    a = ap.parse_args()
    ck = load_model(None, 3, a.device)
    dev = next(ck.model.parameters()).device
    groups = [int(x) for x in a.groups.split(",")]
    imgs = [read_image(p).data for p in sorted(a.data.glob("*_real.*"))[:max(groups)]]
    opts = InferenceOptions(precision=a.precision)
    cfg = AdaptConfig(precision=a.precision)
    print(f"device {torch.cuda.get_device_name() if dev.type == 'cuda' else 'cpu'}, precision {a.precision}")
    print(f"denoise 512x512 (warm): {timed(lambda: denoise(ck, imgs[0], opts), dev):.4f} s")
    import copy
    variants = {"deepcopy": copy.deepcopy(ck.model)}
    variants["no grad flags"] = copy.deepcopy(ck.model).requires_grad_(False)
    variants["NCHW weights"] = copy.deepcopy(ck.model).to(memory_format=torch.contiguous_format)
    variants["NCHW, no grad flags"] = copy.deepcopy(ck.model).to(memory_format=torch.contiguous_format).requires_grad_(False)
    for name, m in variants.items():
        v = replace(ck, model=m)
        print(f"denoise 512x512 (warm), {name}: {timed(lambda: denoise(v, imgs[0], opts), dev):.4f} s")
    model = ck.model.float()
    params = {n: p for n, p in model.named_parameters() if n.startswith("sparse.")}
    for p in params.values():
        p.requires_grad_(True)
    Y8, Y16 = (torch.rand(n, 3, 128, 128, device=dev) for n in (8, 16))

    def step():
        obj, _ = adaptation_objective(model, None, None, Y8, cfg, True)
        obj.mean().backward()

    def evaluation():
        with torch.no_grad():
            adaptation_objective(model, None, None, Y16, cfg, False)
    print(f"one adaptation step, 8 tiles (fwd+bwd): {timed(step, dev):.4f} s")
    print(f"one evaluation, 16 tiles: {timed(evaluation, dev):.4f} s")
    for p in params.values():
        p.requires_grad_(False)
    for g in groups:
        sets = [[y] for y in imgs[:g]]
        g = len(sets)
        t = timed(lambda: adapt_each(ck, sets, replace(cfg, group=g)), dev, reps=2)
        print(f"adapt_each, group {g}: {t / g:.4f} s per image ({t:.3f} s for {g})")
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        denoise(ck, imgs[0], opts)
        if dev.type == "cuda":
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=20))
    print("Command: python " + " ".join(sys.argv))


if __name__ == "__main__":
    main()
