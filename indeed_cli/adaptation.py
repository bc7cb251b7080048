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

Several independent adaptations (OAG on a folder) run at once: their weights are stacked
and the network runs under ``torch.vmap`` (``AdaptConfig.group`` at a time), each with its
own batches, Adam state (Adam is element-wise, so one optimizer over stacked weights is K
independent ones) and early stopping.  On a GPU this amortises the kernel launches that
dominate one small adaptation (docs/benchmarks.md); the result for an image does not
depend on which others share its group (tested).
"""
from __future__ import annotations

import copy
import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np
import torch
from torch.func import functional_call, vmap

from . import posteriors as P
from .checkpoint import Checkpoint
from .tiling import TileGrid


# Learning rates measured for the shipped colour model (docs/adapt.md): one adaptation on a whole
# folder (AG) needs smaller steps than one per image (OAG) to stay inside the trust region.
AG_LR = 1e-5
OAG_LR = 3e-5
# Most steps: per image (OAG), 12 scored at least as well as 20 on both halves of PolyU100 and
# ran about 25% faster (docs/adapt.md); AG keeps the 20 it was measured with.
AG_STEPS = 20
OAG_STEPS = 12


@dataclass
class AdaptConfig:
    modules: str = "S"
    steps: int | None = None  # None: AG_STEPS in adapt() (InDeedAG), OAG_STEPS in adapt_each() (InDeedOAG)
    lr: float | None = None  # None: AG_LR in adapt() (InDeedAG), OAG_LR in adapt_each()/adapt_images() (InDeedOAG)
    batch: int = 8
    eval_every: int = 2
    patience: int = 6
    eval_tiles: int = 16
    max_tiles: int = 512
    train_stride: int | None = None  # step between training tiles; None: the tile size (no overlap)
    max_change: float = 2.5  # RMS change of L + S on the evaluation tiles, 8-bit units
    collapse_ratio: float = 0.2
    noise_precision: str = "image"  # "image" (one Lambda per image) or "pixel" (the paper's)
    precision: str = "fp32"  # "bf16": the network runs under bf16 autocast, the objective in fp32
    sample: bool = True  # reparameterised A, B, S in the steps (the paper's Monte-Carlo ELBO)
    group: int | None = None  # adaptations run at once (adapt_each); None: 32 on a GPU, 1 on a CPU
    seed: int = 0

    def check(self) -> None:
        if self.noise_precision not in ("image", "pixel"):
            raise ValueError(f"noise_precision must be image or pixel, got {self.noise_precision!r}")
        if self.precision not in ("fp32", "bf16"):
            raise ValueError(f"precision must be fp32 or bf16, got {self.precision!r}")
        if self.group is not None and self.group < 1:
            raise ValueError(f"group must be at least 1, got {self.group}")


@dataclass
class AdaptResult:
    checkpoint: Checkpoint
    history: list[dict] = field(default_factory=list)
    best_step: int = 0
    stop: str = "steps"


def adaptation_objective(model, params: dict | None, frozen: dict | None, Y: torch.Tensor, cfg: AdaptConfig,
                         sample: bool, factors: tuple | None = None):
    """Eq. (active generalization loss) per sample and per element, and the output L + S.

    ``params`` None: the model runs with its own weights (one adaptation).  Otherwise
    ``params`` (the trainable weights) and ``frozen`` (the others) go to the network
    functionally, so that several copies of the weights can run at once under ``torch.vmap``.
    ``factors``: the frozen low-rank module's outputs for ``Y`` (:func:`lowrank_factors`).
    """
    if params is None:
        with torch.autocast(Y.device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
            d = model(Y, sample=sample, factors=factors)
    else:
        d = functional_call(model, {**params, **frozen}, (Y,), {"sample": sample, "factors": factors})
    d = d.float()
    obj = P.collapsed_objective(d, Y.float(), cfg.modules, model.cfg.priors, cfg.noise_precision == "image")
    return obj / float(Y[0].numel()), d.L_hat + d.mu_S


def lowrank_factors(model, tiles: torch.Tensor, cfg: AdaptConfig, chunk: int = 256) -> tuple[torch.Tensor, ...]:
    """(mu_A, sigma_A, mu_B, sigma_B) of every tile (leading dims kept), from the frozen low-rank
    module, computed once: when only f_thetaS adapts they do not change between steps, and
    recomputing them took about 14% of a forward pass (docs/adapt.md).  Same precision as the
    adaptation's forward passes, so that the objective is the one without the cache."""
    flat = tiles.reshape(-1, *tiles.shape[-3:])
    with torch.no_grad(), torch.autocast(tiles.device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
        parts = [model.lowrank(flat[i:i + chunk]) for i in range(0, len(flat), chunk)]
    return tuple(torch.cat(p).reshape(*tiles.shape[:-3], *p[0].shape[1:]) for p in zip(*parts))


def take(factors: tuple | None, fn) -> tuple | None:
    """``fn`` applied to each cached factor tensor (None stays None)."""
    return None if factors is None else tuple(fn(f) for f in factors)


def as_model_channels(data: np.ndarray, channels: int) -> list[np.ndarray]:
    """A (C, h, w) image as inputs of a ``channels``-channel model: gray is replicated for a
    colour model; a gray model adapts on each colour channel as a separate image."""
    if data.shape[0] == channels:
        return [data]
    if channels == 3:
        return [np.repeat(data, 3, 0)]
    return [c[None] for c in data]


def tiles_of(images: list[np.ndarray], tile: int, max_tiles: int, gen: torch.Generator,
             stride: int | None = None) -> torch.Tensor:
    """Reflected tiles of all images at ``stride`` (default ``tile``: non-overlapping), a random
    subset of at most ``max_tiles`` when there are more (chosen before cutting)."""
    grids = [TileGrid(im.shape[1], im.shape[2], tile, tile - (stride or tile)) for im in images]
    spots = [(i, y, x) for i, g in enumerate(grids) for y, x in g.positions()]
    if len(spots) > max_tiles:
        spots = [spots[j] for j in torch.randperm(len(spots), generator=gen)[:max_tiles].tolist()]
    tensors: dict[int, torch.Tensor] = {}
    out = []
    for i, y, x in spots:
        if i not in tensors:
            tensors[i] = torch.from_numpy(np.ascontiguousarray(images[i], dtype=np.float32))
        out.append(grids[i].cut(tensors[i], y, x))
    return torch.stack(out)


def default_group(device: torch.device) -> int:
    """Adaptations run at once when AdaptConfig.group is unset: batching pays on a GPU (32 was
    the fastest of 1-64 per image on an H100, docs/benchmarks.md) and costs ~10% on a CPU."""
    return 32 if device.type == "cuda" else 1


def adapt(ckpt: Checkpoint, images: list[np.ndarray], cfg: AdaptConfig = AdaptConfig(), tile: int = 128,
          log=None) -> AdaptResult:
    """InDeedAG: fine-tune one copy of ``ckpt`` on all ``images`` ((C, h, w) floats in [0, 1],
    the model's channels)."""
    if cfg.lr is None:
        cfg = replace(cfg, lr=AG_LR)
    if cfg.steps is None:
        cfg = replace(cfg, steps=AG_STEPS)
    return adapt_each(ckpt, [images], cfg, tile, log)[0]


def adapt_each(ckpt: Checkpoint, image_sets: list[list[np.ndarray]], cfg: AdaptConfig = AdaptConfig(),
               tile: int = 128, log=None) -> list[AdaptResult]:
    """One independent adaptation of ``ckpt`` per entry of ``image_sets`` (InDeedOAG: one entry
    per image), ``cfg.group`` entries at a time as one batched network.

    The tiles of every entry and one adapted model per entry are held on the device until the
    call returns, so pass a bounded number of entries (the CLI passes one group at a time).
    """
    cfg.check()
    if cfg.lr is None:
        cfg = replace(cfg, lr=OAG_LR)
    if cfg.steps is None:
        cfg = replace(cfg, steps=OAG_STEPS)
    device = next(ckpt.model.parameters()).device
    model = ckpt.model.detached_copy()
    model.requires_grad_(False)
    trainable = {id(p) for m in model.modules_for(cfg.modules) for p in m.parameters()}
    names = [n for n, p in model.named_parameters() if id(p) in trainable]
    frozen = {n: t for n, t in [*model.named_parameters(), *model.named_buffers()] if n not in names}
    torch.manual_seed(cfg.seed)
    jobs = []
    for images in image_sets:
        gen = torch.Generator().manual_seed(cfg.seed)
        pool = tiles_of(images, tile, cfg.max_tiles, gen).to(device)
        # at least one evaluation tile per image (up to 128): with many images (AG), 16 tiles
        # misjudged the objective and stopped adaptation early (docs/adapt.md)
        eval_set = pool[: max(cfg.eval_tiles, min(len(images), 128))]
        if cfg.train_stride and cfg.train_stride < tile:  # overlapping training tiles (off: docs/adapt.md)
            pool = tiles_of(images, tile, cfg.max_tiles, gen, cfg.train_stride).to(device)
        jobs.append({"pool": pool, "eval": eval_set, "gen": gen, "batch": min(cfg.batch, len(pool))})
    group = cfg.group or default_group(device)
    by_shape: dict[tuple, list[int]] = {}
    for i, j in enumerate(jobs):  # entries batch together when their tensors have the same shapes
        by_shape.setdefault((j["batch"], *j["eval"].shape), []).append(i)
    results: list[AdaptResult | None] = [None] * len(jobs)
    for members in by_shape.values():
        for c in range(0, len(members), group):
            chunk = members[c:c + group]
            outcome = _adapt_group(model, names, frozen, [jobs[i] for i in chunk], cfg, log)
            for i, (best, history, best_step, stop) in zip(chunk, outcome):
                adapted = copy.deepcopy(model)
                with torch.no_grad():
                    for n, v in best.items():
                        adapted.get_parameter(n).copy_(v)
                adapted.eval()
                training = {**ckpt.training, "adapted": {"parent": ckpt.source, **asdict(cfg), "best_step": best_step,
                                                         "stop": stop, "loss_curve": history}}
                results[i] = AdaptResult(Checkpoint(adapted, ckpt.config, training, dict(ckpt.extra),
                                                    ckpt.source + " (adapted)"), history, best_step, stop)
    return results


def adapt_images(items: list[tuple[Checkpoint, np.ndarray]], cfg: AdaptConfig = AdaptConfig(),
                 tile: int = 128) -> tuple[list[AdaptResult], list[int]]:
    """InDeedOAG on (checkpoint, (C, h, w) image) pairs, those sharing a checkpoint in one
    :func:`adapt_each` call, each image shaped for its model (:func:`as_model_channels`).

    Returns the results in input order and, per image, how many were adapted together.
    """
    by_model: dict[int, list[int]] = {}
    for i, (ckpt, _) in enumerate(items):
        by_model.setdefault(id(ckpt), []).append(i)
    results: list = [None] * len(items)
    together = [1] * len(items)
    for members in by_model.values():
        ckpt = items[members[0]][0]
        sets = [as_model_channels(items[i][1], ckpt.config.channels) for i in members]
        for i, res in zip(members, adapt_each(ckpt, sets, cfg, tile)):
            results[i], together[i] = res, len(members)
    return results, together


def _adapt_group(model, names: list[str], frozen: dict, jobs: list[dict], cfg: AdaptConfig, log):
    """The adaptation loop for K entries whose batches have the same shapes (see module doc).

    One entry runs the network directly on a working copy; several run under ``torch.vmap``
    with stacked weights, and entries that stop are dropped from the stack (with their Adam
    state) so that the others run alone.  Returns per entry: its best trainable weights,
    history, best step and stop reason.
    """
    K = len(jobs)
    device = jobs[0]["pool"].device
    cached = cfg.modules == "S"  # the frozen low-rank module's outputs are computed once
    if K == 1:  # the plain network: no functional_call or vmap overhead for a single adaptation
        work = copy.deepcopy(model)
        params = {n: work.get_parameter(n).requires_grad_(True) for n in names}

        def run(p, Y, sample, F):
            obj, X = adaptation_objective(work, None, None, Y[0], cfg, sample, take(F, lambda f: f[0]))
            return obj[None], X[None]
        view = {n: v.unsqueeze(0) for n, v in params.items()}  # (1, ...) views of the live weights
    else:
        # Autocast does not reach convolutions with vmapped weights.  bf16 is therefore done by
        # hand where it is safe: f_thetaS alone, fp32 master weights cast to bf16 in each pass
        # (their gradients flow back to fp32 Adam), the image and the objective kept in fp32
        # (f_thetaS casts its input); the cached low-rank factors come from autocast, as in a
        # single adaptation.  Rounding the image itself to bf16 had cost 0.6 dB on PolyU100
        # (docs/adapt.md).  Otherwise fp32.
        half = cfg.precision == "bf16" and cached
        if not half:
            cfg = replace(cfg, precision="fp32")
        base = dict(model.named_parameters())
        params = {n: base[n].detach().unsqueeze(0).repeat(K, *[1] * base[n].dim()).requires_grad_(True) for n in names}

        def objective(p, Y, F, s):
            if half:
                p = {n: v.to(torch.bfloat16) for n, v in p.items()}
            return adaptation_objective(model, p, frozen, Y, cfg, s, F)
        vmapped = {s: vmap(lambda p, Y, F, s=s: objective(p, Y, F, s), in_dims=(0, 0, 0 if cached else None),
                           randomness="different") for s in (True, False)}

        def run(p, Y, sample, F):
            return vmapped[sample](p, Y, F)
        view = params
    best_params = {n: v.detach().clone() for n, v in view.items()}
    opt = torch.optim.Adam(list(params.values()), lr=cfg.lr)
    E = torch.stack([j["eval"] for j in jobs])  # (K, n_eval, C, t, t)
    size = max(len(j["pool"]) for j in jobs)
    pools = torch.zeros((K * size, *jobs[0]["pool"].shape[1:]), device=device)
    for k, j in enumerate(jobs):
        pools[k * size:k * size + len(j["pool"])] = j["pool"]
    b = jobs[0]["batch"]
    pool_factors = lowrank_factors(model, pools, cfg) if cached else None
    eval_factors = lowrank_factors(model, E, cfg) if cached else None
    alive = list(range(K))  # entries still adapting, in stack order

    def evaluate(X0=None):
        with torch.no_grad():
            obj, X = run(params, E, False, eval_factors)
            loss, abs_N = obj.mean(1), (E - X).abs().flatten(1).mean(1)
            change = 255 * (X - X0).square().flatten(1).mean(1).sqrt() if X0 is not None else torch.zeros_like(loss)
            rows = torch.stack([loss, abs_N, change], 1).tolist()  # one host sync per evaluation
        return [dict(zip(("loss", "abs_N", "change"), r)) for r in rows], X

    start, X0 = evaluate()
    history = [[{"step": 0, **s}] for s in start]
    best = [s["loss"] for s in start]
    best_step, bad, stop = [0] * K, [0] * K, ["steps"] * K
    for step in range(1, cfg.steps + 1):
        idx = torch.stack([torch.randint(len(jobs[k]["pool"]), (b,), generator=jobs[k]["gen"]) for k in alive])
        rows = (idx + torch.tensor(alive)[:, None] * size).flatten().to(device)
        obj, _ = run(params, pools[rows].view(len(alive), b, *pools.shape[1:]), cfg.sample,
                     take(pool_factors, lambda f: f[rows].view(len(alive), b, *f.shape[1:])))
        opt.zero_grad(set_to_none=True)
        obj.mean(1).sum().backward()  # entries are independent: the sum gives each its own gradient
        opt.step()
        if step % cfg.eval_every and step != cfg.steps:
            continue
        recs, _ = evaluate(X0)
        improved, keep = [], []
        for pos, (k, rec) in enumerate(zip(alive, recs)):
            rec = {"step": step, **rec}
            history[k].append(rec)
            if log:
                log(rec if K == 1 else {"entry": k, **rec})
            if not math.isfinite(rec["loss"]):
                stop[k] = "non-finite loss"
            elif rec["change"] > cfg.max_change:
                stop[k] = "trust region"
            elif rec["abs_N"] < cfg.collapse_ratio * start[k]["abs_N"]:
                stop[k] = "collapse"
            elif rec["loss"] < best[k] - 1e-6 * abs(best[k]):
                best[k], best_step[k], bad[k] = rec["loss"], step, 0
                improved.append((pos, k))
            else:
                bad[k] += 1
                if bad[k] >= cfg.patience:
                    stop[k] = "no improvement"
            if stop[k] == "steps":
                keep.append(pos)
        if improved:
            src = torch.tensor([p for p, _ in improved], device=device)
            dst = torch.tensor([k for _, k in improved], device=device)
            with torch.no_grad():
                for n, v in view.items():
                    best_params[n].index_copy_(0, dst, v.detach().index_select(0, src))
        if not keep:
            break
        if len(keep) < len(alive):  # drop the stopped entries from the stack (never when K == 1)
            sel = torch.tensor(keep, device=device)
            old, params = params, {n: v.detach().index_select(0, sel).requires_grad_(True) for n, v in params.items()}
            state = {n: {key: (t.index_select(0, sel) if torch.is_tensor(t) and t.dim() else t)
                         for key, t in opt.state[old[n]].items()} for n in names}
            opt = torch.optim.Adam(list(params.values()), lr=cfg.lr)
            for n, v in params.items():
                opt.state[v] = state[n]
            view, E, X0 = params, E[sel], X0[sel]
            eval_factors = take(eval_factors, lambda f: f[sel])
            alive = [alive[p] for p in keep]
    return [({n: v[k] for n, v in best_params.items()}, history[k], best_step[k], stop[k]) for k in range(K)]
