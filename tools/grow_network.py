#!/usr/bin/env python3
"""Grow a checkpoint's f_thetaS to more residual blocks per U-Net scale, computing the same function
(indeed_cli.model.surgery.grow_sparse_blocks); fine-tune the result with `indeed train --init`.

    python tools/grow_network.py --weights gray --blocks 4 --out grown.safetensors
"""

import argparse

import torch

from indeed_cli.model import load_checkpoint, resolve_weights, save_checkpoint
from indeed_cli.model.surgery import grow_sparse_blocks


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--weights", default="gray", help="bundled name, path or hf:// reference")
    ap.add_argument("--channels", type=int, default=1, help="without --weights: the bundled model with these channels")
    ap.add_argument("--blocks", type=int, required=True, help="residual blocks per U-Net scale after growing")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    src = load_checkpoint(resolve_weights(a.weights, a.channels))
    grown = grow_sparse_blocks(src, a.blocks)
    x = torch.rand(2, src.config.channels, 128, 128)
    with torch.no_grad():
        d0, d1 = src.model(x), grown.model(x)
    diff = max(float((d0.mu_S - d1.mu_S).abs().max()), float((d0.L_hat - d1.L_hat).abs().max()))
    if diff > 1e-5:
        raise SystemExit(f"the grown network computes something else (max difference {diff:.2e}); not saved")
    # float32: the zeroed blocks must stay exact identities until fine-tuning moves them
    save_checkpoint(a.out, grown.model, grown.training, grown.extra, dtype=torch.float32)
    print(f"{a.out}: {src.config.sparse_blocks} -> {a.blocks} blocks per scale, max output difference {diff:.2e}")


if __name__ == "__main__":
    main()
