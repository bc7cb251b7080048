"""The adaptation objective, Eq. (active generalization loss), and the frozen low-rank factors."""

from __future__ import annotations

import torch
from torch.func import functional_call

from ...model import posteriors as P
from .config import AdaptConfig
from .recorrupted import recorrupted_objective


def adaptation_objective(
    model,
    params: dict | None,
    frozen: dict | None,
    Y: torch.Tensor,
    cfg: AdaptConfig,
    sample: bool,
    factors: tuple | None = None,
    target: torch.Tensor | None = None,
):
    """Eq. (active generalization loss) per sample and per element, or, given ``target`` (for a
    recorrupted ``Y``, the other recorrupted copy: recorrupted.recorrupted_pair), Eq. (recorrupted
    objective) per sample; and the output L + S.

    ``params`` None: the model runs with its own weights (one adaptation; bf16 through autocast
    where ``cfg.precision`` says so).  Otherwise ``params`` (the trainable weights) and
    ``frozen`` (the others) go to the network functionally, so that several copies of the weights
    can run at once under ``torch.vmap``.  ``factors``: the frozen low-rank module's outputs for
    ``Y`` (:func:`lowrank_factors`).  f_thetaM, which adaptation never reads, is skipped."""
    kwargs = {"sample": sample, "factors": factors, "with_support": False}
    if params is None:
        with torch.autocast(Y.device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
            d = model(Y, **kwargs)
    else:
        d = functional_call(model, {**params, **frozen}, (Y,), kwargs)
    d = d.float()
    X = d.L_hat + d.mu_S
    if target is not None:
        return recorrupted_objective(X, target), X
    obj = P.collapsed_objective(d, Y.float(), cfg.modules, model.cfg.priors, cfg.noise_precision == "image")
    return obj / float(Y[0].numel()), X


def grouped_recorrupted_objective(
    model, params: dict, Y: torch.Tensor, factors: tuple, target: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (recorrupted objective) per sample for K copies of f_thetaS at once, without torch.vmap: what
    :func:`adaptation_objective` gives under ``vmap`` with ``target`` and the cached ``factors`` (posterior
    means, no sampling), f_thetaS's convolutions as grouped calls (``InDeed.sparse.grouped``).
    ``params``: every parameter of f_thetaS by its name in the model ("sparse. ..."), each (K, ...);
    ``Y``, ``target`` (K, n, C, h, w); ``factors`` (mu_A, sigma_A, mu_B, sigma_B), each (K, n, ...).
    Returns the objective (K, n) and the output L + S (K, n, C, h, w)."""
    weights = {name.removeprefix("sparse."): v for name, v in params.items()}
    mu_A, _, mu_B, _ = factors
    L_hat = P.low_rank(mu_A, mu_B)
    mu_S, _ = model.sparse.grouped(Y - L_hat, L_hat, weights)
    X = L_hat.float() + mu_S
    return recorrupted_objective(X, target), X


def grouped_objective_applies(model, names: list[str], cached: bool, r2r: bool) -> bool:
    """Whether :func:`grouped_recorrupted_objective` can replace the vmapped objective: the recorrupted
    objective with the low-rank module frozen and cached, all of f_thetaS (and nothing else) adapted,
    and f_thetaS without normalisation (``UNet.groupable``)."""
    sparse = [f"sparse.{n}" for n, _ in model.sparse.named_parameters()]
    return r2r and cached and sorted(names) == sorted(sparse) and model.sparse.groupable()


def lowrank_factors(model, tiles: torch.Tensor, cfg: AdaptConfig, chunk: int = 256) -> tuple[torch.Tensor, ...]:
    """(mu_A, sigma_A, mu_B, sigma_B) of every tile (leading dims kept), from the frozen low-rank
    module, computed once: when only f_thetaS adapts they do not change between steps, and
    recomputing them took about 14% of a forward pass (docs/reports/2026-11-26-adaptation.md).  Same precision as the
    adaptation's forward passes, so that the objective is the one without the cache."""
    flat = tiles.reshape(-1, *tiles.shape[-3:])
    with torch.no_grad(), torch.autocast(tiles.device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
        parts = [model.lowrank(flat[i : i + chunk]) for i in range(0, len(flat), chunk)]
    return tuple(torch.cat(p).reshape(*tiles.shape[:-3], *p[0].shape[1:]) for p in zip(*parts))


def take(factors: tuple | None, fn) -> tuple | None:
    """``fn`` applied to each cached factor tensor (None stays None)."""
    return None if factors is None else tuple(fn(f) for f in factors)
