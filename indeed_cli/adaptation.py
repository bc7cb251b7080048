"""Active generalization (paper §3.5): fine-tune one module on out-of-distribution images.

  InDeedAG  (mode "ag"):  one adaptation on all images of a folder, then inference on each;
  InDeedOAG (mode "oag"): a fresh copy of the weights adapted on each image alone.

Losses (the unsupervised part of the ELBO; other modules frozen):
  S  -> l_fid + l_sparse   Eq. (active generalization loss)
  L  -> l_fid + l_rank     Eq. (active generalization loss:L)
  LS -> l_fid + l_rank + l_sparse   Eq. (active generalization loss:LS)

Early stopping (docs/adapt.md): every ``eval_every`` steps the same loss is evaluated with the
posterior means on a fixed set of tiles; the best weights are kept; adaptation stops after
``patience`` evaluations without improvement, on a non-finite loss, or when outputs collapse
(the mean |N| on the evaluation tiles falls under ``collapse_ratio`` of its starting value,
i.e. L + S is turning into a copy of the noisy input).  The weights returned are the best
seen, which is the starting point if nothing improved: adaptation never makes the objective
worse than where it started.
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
    steps: int = 40
    lr: float = 1e-5
    batch: int = 8
    eval_every: int = 5
    patience: int = 2
    eval_tiles: int = 16
    max_tiles: int = 512
    collapse_ratio: float = 0.5
    seed: int = 0


@dataclass
class AdaptResult:
    checkpoint: Checkpoint
    history: list[dict] = field(default_factory=list)
    best_step: int = 0
    stop: str = "steps"


def adaptation_loss(model, Y: torch.Tensor, modules: str, sample: bool = True) -> tuple[torch.Tensor, dict]:
    """Per-pixel l_fid + (l_sparse if S) + (l_rank if L), and |N| for the collapse guard."""
    d = model(Y, sample=sample).float()
    t = P.elbo_terms(d, Y.float(), model.cfg.priors)
    per_px = float(Y[0].numel())
    parts = {"fid": t["fid"].mean() / per_px}
    if "S" in modules:
        parts["sparse"] = t["sparse"].mean() / per_px
    if "L" in modules:
        parts["rank"] = t["rank"].mean() / per_px
    total = sum(parts.values())
    n_abs = (Y - d.L_hat - d.mu_S).abs().mean()
    return total, {**{k: float(v.detach()) for k, v in parts.items()}, "abs_N": float(n_abs.detach())}


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
    device = next(ckpt.model.parameters()).device
    model = copy.deepcopy(ckpt.model).float()
    model.requires_grad_(False)
    trainable = [p for m in model.modules_for(cfg.modules) for p in m.parameters()]
    for p in trainable:
        p.requires_grad_(True)
    gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    pool = tiles_of(images, tile, cfg.max_tiles, gen)
    eval_set = pool[: cfg.eval_tiles].to(device)
    opt = torch.optim.Adam(trainable, lr=cfg.lr)

    def evaluate() -> dict:
        model.eval()
        with torch.no_grad():
            loss, parts = adaptation_loss(model, eval_set, cfg.modules, sample=False)
        return {"loss": float(loss), **parts}

    start = evaluate()
    best, best_state, best_step, bad, stop = start["loss"], copy.deepcopy(model.state_dict()), 0, 0, "steps"
    history = [{"step": 0, **start}]
    for step in range(1, cfg.steps + 1):
        model.train()
        idx = torch.randint(len(pool), (min(cfg.batch, len(pool)),), generator=gen)
        loss, _ = adaptation_loss(model, pool[idx].to(device), cfg.modules, sample=True)
        if not torch.isfinite(loss):
            stop = "non-finite loss"
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % cfg.eval_every and step != cfg.steps:
            continue
        rec = {"step": step, **evaluate()}
        history.append(rec)
        if log:
            log(rec)
        if not math.isfinite(rec["loss"]):
            stop = "non-finite loss"
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
