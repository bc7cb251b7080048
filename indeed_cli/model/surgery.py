"""Checkpoints made from other checkpoints: weight averaging and growing f_thetaS.

Both were used to make the shipped gray model (weights/README.md); ``tools/`` has a script for each.
"""

from __future__ import annotations

import dataclasses

import torch

from .checkpoint import Checkpoint
from .network import InDeed


def average_checkpoints(checkpoints: list[Checkpoint]) -> Checkpoint:
    """The mean of the weights of fine-tunes of one model ("model soup", Wortsman et al., ICML 2022).

    Fine-tunes that start from the same model stay in one basin, so their mean is often better than
    each.  The mean is taken in float32; all checkpoints must share one config.  The first one's
    training facts are kept, with the averaged runs' sources and steps listed (``soup_of``, ``soup_steps``).
    """
    if not checkpoints:
        raise ValueError("no checkpoints to average")
    first = checkpoints[0]
    if any(c.config != first.config for c in checkpoints):
        raise ValueError("checkpoints differ in config; only fine-tunes of one model can be averaged")
    states = [c.model.state_dict() for c in checkpoints]
    model = InDeed(first.config)
    with torch.no_grad():
        model.load_state_dict({k: torch.stack([s[k].float() for s in states]).mean(0) for k in states[0]})
    facts = dict(
        first.training,
        soup_of=[c.source for c in checkpoints],
        soup_steps=[c.training.get("steps") for c in checkpoints],
    )
    return Checkpoint(
        model.eval(), first.config, facts, dict(first.extra), "mean of " + ", ".join(c.source for c in checkpoints)
    )


def grow_sparse_blocks(ckpt: Checkpoint, blocks: int) -> Checkpoint:
    """``ckpt`` with ``blocks`` residual blocks per U-Net scale of f_thetaS, computing the same function.

    New blocks are appended to every encoder, middle and decoder stage with their second convolution
    zeroed, so each is the identity (ResBlock: x + conv2(relu(conv1(x)))); fine-tuning then uses them.
    """
    if blocks < ckpt.config.sparse_blocks:
        raise ValueError(f"cannot shrink f_thetaS from {ckpt.config.sparse_blocks} to {blocks} blocks")
    cfg = dataclasses.replace(ckpt.config, sparse_blocks=blocks)
    grown = InDeed(cfg).to(next(ckpt.model.parameters()).device).eval()
    missing, unexpected = grown.load_state_dict(ckpt.model.state_dict(), strict=False)
    if unexpected or not all(k.startswith("sparse.") for k in missing):
        raise ValueError(f"unexpected layout: {sorted(unexpected)[:3]} {sorted(missing)[:3]}")
    new_blocks = {k.rsplit(".", 2)[0] for k in missing}
    with torch.no_grad():
        for name, module in grown.named_modules():
            if name in new_blocks:
                module.conv2.weight.zero_()
                module.conv2.bias.zero_()
    facts = {**ckpt.training, "grown_from": ckpt.source, "grown_blocks": blocks}
    return Checkpoint(grown, cfg, facts, dict(ckpt.extra), f"{ckpt.source} (grown to {blocks} blocks)")
