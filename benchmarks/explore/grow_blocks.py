"""Grow a checkpoint's f_thetaS to more residual blocks per U-Net scale, computing the same function
(issue 3, seventh session: is the gray model's f_thetaS too small once trained as long as the shipped
one?).  New blocks are appended to every encoder, middle and decoder stage with their second
convolution zeroed, so each is the identity (ResBlock: x + conv2(relu(conv1(x)))); the script checks
that the grown model's output equals the original's before it saves it (float32, for --init).

    python benchmarks/explore/grow_blocks.py --weights gray --blocks 4 --out grown4.safetensors
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from indeed_cli.checkpoint import load_checkpoint, resolve_weights, save_checkpoint  # noqa: E402
from indeed_cli.networks import InDeed  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", default="gray")
    ap.add_argument("--blocks", type=int, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    src = load_checkpoint(resolve_weights(a.weights, 1))
    src.model.float().eval()
    cfg = dataclasses.replace(src.config, sparse_blocks=a.blocks)
    grown = InDeed(cfg).eval()
    missing, unexpected = grown.load_state_dict(src.model.state_dict(), strict=False)
    assert not unexpected, unexpected
    assert all(k.startswith("sparse.") for k in missing), missing
    new_blocks = {k.rsplit(".", 2)[0] for k in missing}
    with torch.no_grad():
        for name, mod in grown.named_modules():
            if name in new_blocks:
                mod.conv2.weight.zero_()
                mod.conv2.bias.zero_()
    x = torch.rand(2, cfg.channels, 128, 128)
    with torch.no_grad():
        d0, d1 = src.model(x), grown(x)
    diff = max(float((d0.mu_S - d1.mu_S).abs().max()), float((d0.L_hat - d1.L_hat).abs().max()))
    assert diff < 1e-5, diff
    save_checkpoint(a.out, grown, {**src.training, "grown_from": str(a.weights), "grown_blocks": a.blocks},
                    src.extra, dtype=torch.float32)
    print(f"{len(new_blocks)} new blocks, max output difference {diff:.2e}, saved {a.out}")


if __name__ == "__main__":
    main()
