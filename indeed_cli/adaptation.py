"""Active generalization (paper §3.5): fine-tune one module on out-of-distribution images.

  InDeedAG  (mode "ag"):  one adaptation on all images of a folder, then inference on each;
  InDeedOAG (mode "oag"): a fresh copy of the weights adapted on each image alone.

Objective (the unsupervised part of the ELBO; other modules frozen), as
:func:`indeed_cli.posteriors.collapsed_objective`:
  S  -> l_fid + l_sparse   Eq. (active generalization loss)
  L  -> l_fid + l_rank     Eq. (active generalization loss:L)
  LS -> l_fid + l_rank + l_sparse   Eq. (active generalization loss:LS)
with one noise precision per image by default (``noise_precision="image"``): with the
paper's pixel-wise Lambda the objective is minimised by N = 0, i.e. by copying the noisy
input (measured in docs/adapt.md).

Early stopping (docs/adapt.md): every ``eval_every`` steps the objective and the output
L + S are evaluated with the posterior means on a fixed set of tiles.  Adaptation stops
  - when the output has moved more than ``max_change`` (RMS, 8-bit units) from the output of
    the starting weights: the trust region that bounds how far the network's function (its
    Lipschitz behaviour, in the paper's words) may drift; the objective keeps falling beyond
    it while the image is being smoothed away;
  - after ``patience`` evaluations without improvement of the objective;
  - on a non-finite loss, or on collapse (mean |N| below ``collapse_ratio`` of its start).
The weights returned are the best evaluated ones inside the trust region, the starting
weights if nothing improved: adaptation never makes the objective worse than where it started.
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from . import posteriors as P
from .checkpoint import Checkpoint
from .tiling import TileGrid


@dataclass
class AdaptConfig:
    modules: str = "S"
    steps: int = 20
    lr: float = 1e-4
    batch: int = 8
    eval_every: int = 2
    patience: int = 6
    eval_tiles: int = 16
    max_tiles: int = 512
    max_change: float = 2.5  # RMS change of L + S on the evaluation tiles, 8-bit units
    collapse_ratio: float = 0.2
    noise_precision: str = "image"  # "image" (one Lambda per image) or "pixel" (the paper's)
    precision: str = "fp32"  # "bf16": the network runs under bf16 autocast, the objective in fp32
    seed: int = 0


@dataclass
class AdaptResult:
    checkpoint: Checkpoint
    history: list[dict] = field(default_factory=list)
    best_step: int = 0
    stop: str = "steps"


def adaptation_loss(model, Y: torch.Tensor, cfg: AdaptConfig, sample: bool = True):
    """Per-element objective of Eq. (active generalization loss) and the output L + S."""
    with torch.autocast(Y.device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
        d = model(Y, sample=sample)
    d = d.float()
    obj = P.collapsed_objective(d, Y.float(), cfg.modules, model.cfg.priors, cfg.noise_precision == "image")
    return obj.mean() / float(Y[0].numel()), d.L_hat + d.mu_S


def as_model_channels(data: np.ndarray, channels: int) -> list[np.ndarray]:
    """A (C, h, w) image as inputs of a ``channels``-channel model: gray is replicated for a
    colour model; a gray model adapts on each colour channel as a separate image."""
    if data.shape[0] == channels:
        return [data]
    if channels == 3:
        return [np.repeat(data, 3, 0)]
    return [c[None] for c in data]


def tiles_of(images: list[np.ndarray], tile: int, max_tiles: int, gen: torch.Generator) -> torch.Tensor:
    """Non-overlapping reflected tiles of all images (a random subset when there are many)."""
    out = []
    for im in images:
        t = torch.from_numpy(np.ascontiguousarray(im, dtype=np.float32))
        g = TileGrid(t.shape[1], t.shape[2], tile, 0)
        out.extend(g.cut(t, y, x) for y, x in g.positions())
    pool = torch.stack(out)
    if len(pool) > max_tiles:
        pool = pool[torch.randperm(len(pool), generator=gen)[:max_tiles]]
    return pool


def adapt(ckpt: Checkpoint, images: list[np.ndarray], cfg: AdaptConfig = AdaptConfig(), tile: int = 128,
          log=None) -> AdaptResult:
    """Fine-tune a copy of ``ckpt`` on ``images`` ((C, h, w) floats in [0, 1], the model's channels)."""
    if cfg.noise_precision not in ("image", "pixel"):
        raise ValueError(f"noise_precision must be image or pixel, got {cfg.noise_precision!r}")
    if cfg.precision not in ("fp32", "bf16"):
        raise ValueError(f"precision must be fp32 or bf16, got {cfg.precision!r}")
    device = next(ckpt.model.parameters()).device
    model = copy.deepcopy(ckpt.model).float()
    model.__dict__.pop("forward", None)  # a compiled forward (--compile) would run the original's weights
    model.requires_grad_(False)
    trainable = [p for m in model.modules_for(cfg.modules) for p in m.parameters()]
    for p in trainable:
        p.requires_grad_(True)
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    pool = tiles_of(images, tile, cfg.max_tiles, gen).to(device)
    # at least one evaluation tile per image (up to 128): with many images (AG), 16 tiles
    # misjudged the objective and stopped adaptation early (docs/adapt.md)
    eval_set = pool[: max(cfg.eval_tiles, min(len(images), 128))]
    opt = torch.optim.Adam(trainable, lr=cfg.lr)

    def evaluate(X0=None) -> tuple[dict, torch.Tensor]:
        model.eval()
        with torch.no_grad():
            loss, X = adaptation_loss(model, eval_set, cfg, sample=False)
            rec = {"loss": loss, "abs_N": (eval_set - X).abs().mean(),
                   "change": 255 * (X - X0).square().mean().sqrt() if X0 is not None else torch.zeros(())}
        return {k: float(v) for k, v in rec.items()}, X  # one host sync per evaluation

    start, X0 = evaluate()
    best, best_state, best_step, bad, stop = start["loss"], copy.deepcopy(model.state_dict()), 0, 0, "steps"
    history = [{"step": 0, **start}]
    for step in range(1, cfg.steps + 1):
        model.train()
        idx = torch.randint(len(pool), (min(cfg.batch, len(pool)),), generator=gen)
        loss, _ = adaptation_loss(model, pool[idx.to(device)], cfg, sample=True)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % cfg.eval_every and step != cfg.steps:
            continue
        rec, _ = evaluate(X0)
        rec = {"step": step, **rec}
        history.append(rec)
        if log:
            log(rec)
        if not math.isfinite(rec["loss"]):
            stop = "non-finite loss"
            break
        if rec["change"] > cfg.max_change:
            stop = "trust region"
            break
        if rec["abs_N"] < cfg.collapse_ratio * start["abs_N"]:
            stop = "collapse"
            break
        if rec["loss"] < best - 1e-6 * abs(best):
            best, best_state, best_step, bad = rec["loss"], copy.deepcopy(model.state_dict()), step, 0
        else:
            bad += 1
            if bad >= cfg.patience:
                stop = "no improvement"
                break
    model.load_state_dict(best_state)
    model.requires_grad_(False)
    model.eval()
    training = {**ckpt.training, "adapted": {"parent": ckpt.source, **asdict(cfg), "best_step": best_step,
                                             "stop": stop, "loss_curve": history}}
    return AdaptResult(Checkpoint(model, ckpt.config, training, dict(ckpt.extra), ckpt.source + " (adapted)"),
                       history, best_step, stop)
