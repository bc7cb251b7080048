"""The training objective, Eq. (network loss function), and its weights."""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass

import torch

from ...model import posteriors as P


@dataclass(frozen=True)
class LossWeights:
    """Weights of the training objective Eq. (network loss function).

    ``sigma0`` is the precision of the supervision likelihood p(U|Z_m), which the
    paper leaves to the user (§3.6); ``tau`` balances l_orth (paper: 1).
    ``bayesian`` switches l_fid, l_rank and l_sparse off together: that is the
    paper's ablation #9 and our anomaly-detection baseline.
    """

    sigma0: float = 1e5
    tau: float = 1.0
    bayesian: bool = True
    # denoising: > 0 scales each patch's sigma0 by ref / max(sigma, ref / 5) (sigma in 8-bit units),
    # so that low-noise patches, whose errors are small, weigh more; 0 = the paper's constant sigma0
    sigma0_noise_ref: float = 0.0
    # denoising: w_L, the weight of ||L - U||^2 in l_sup|DEN (paper: 1)
    lowrank_sup: float = 1.0
    # denoising: > 0 gives each patch its own sigma0, the batch's mean supervision error over the
    # patch's own (capped at this factor): every patch weighs alike, as in a mean PSNR; 0 = off
    patch_precision: float = 0.0
    # detection with f_thetaM: weight of its focal loss l_M (its inputs are detached, so this only
    # scales f_thetaM's gradient against the clipping norm; Adam is invariant to it otherwise)
    support: float = 1.0
    # denoising: weight of l_n, the rank supervision (docs/model.md): asks the rank index n to equal the
    # clean patch's SVD rank; 0 = off (the paper)
    rank_sup: float = 0.0


def noise_level_weights(sigma: torch.Tensor, ref: float) -> torch.Tensor:
    """Per-patch factors of sigma0 (``--sigma0-noise-ref``): ref / max(sigma, ref / 5), sigma and ref in
    8-bit units.  Under a constant sigma0 the squared error of a patch at sigma = 75 is about seven
    times that of one at sigma = 15, so low noise levels get little of the gradient; this gives
    them weight in proportion to 1/sigma, capped at 5 (docs/reports/2026-11-26-measurements.md measured it)."""
    s = sigma * 255.0
    return ref / torch.clamp(s, min=ref / 5.0)


def patch_precision_weights(sup: torch.Tensor, cap: float) -> torch.Tensor:
    """Per-patch factors of sigma0 (``--patch-precision CAP``), docs/model.md Eq. (per-patch precision):
    mean_k(e_k) / e_i for the supervision error e_i of patch i, at most ``cap``, held constant in the
    gradient.  sigma0_i = n / e_i is the maximum-likelihood precision of a Gaussian supervision
    likelihood on patch i; with it the gradient of patch i is that of log e_i, so a flat patch, whose
    error is a fiftieth of a textured one's at the same noise, weighs as much as the textured one
    (the mean PSNR that benchmarks report weighs images that way).  Each weighted error is at most
    the batch's mean error, so the weighted l_sup is no larger than the unweighted one, which keeps
    its scale against the other terms (the factors themselves average one or more)."""
    e = sup.detach().clamp_min(1e-12)
    return (e.mean() / e).clamp(max=cap)


def clean_rank(targets: dict) -> torch.Tensor:
    """The clean patches' SVD rank (k, C) for l_n, of the first k <= N patches: ``targets["rank"]`` (a
    tensor, or a future that :class:`~indeed_cli.tasks.training.batches.RankedBatches` computes on the
    CPU while the model trains on the batch before), else computed here from all of ``targets["clean"]``."""
    r = targets.get("rank")
    if r is None:
        return P.energy_rank(targets["clean"])
    return r.result() if isinstance(r, Future) else r


def training_loss(
    model: torch.nn.Module, Y: torch.Tensor, targets: dict[str, torch.Tensor], task: str, weights: LossWeights, priors
) -> tuple[torch.Tensor, dict[str, float]]:
    """Eq. (network loss function): l_fid + l_sup + l_rank + l_sparse + tau * l_orth, per pixel.

    All terms are divided by the same element count C*h*w, which keeps their balance.
    """
    d = model(Y, sample=True).float()
    terms = P.elbo_terms(d, Y.float(), priors)
    rank_sup = None
    if task == "denoise":
        sup = P.denoise_supervision_loss(d.L_hat, d.S_hat, targets["clean"], weights.sigma0, weights.lowrank_sup)
        if weights.sigma0_noise_ref > 0:
            sup = sup * noise_level_weights(targets["sigma"].to(sup.device), weights.sigma0_noise_ref)
        if weights.patch_precision > 0:
            sup = sup * patch_precision_weights(sup, weights.patch_precision)
        if weights.rank_sup > 0:
            _, beta_gamma = P.gamma_posterior(d.mu_A, d.sigma_A, d.mu_B, d.sigma_B, priors)
            n_star = clean_rank(targets).to(Y.device).clamp(1, d.mu_A.shape[-1])  # of the first k patches
            rank_sup = weights.rank_sup * P.rank_supervision_loss(beta_gamma[: len(n_star)], n_star)
    else:
        sup = P.anomaly_supervision_loss(d.L_hat, d.S_hat, targets["normal"], targets["anomaly"], weights.sigma0)
    per_px = float(Y[0].numel())
    parts = {"sup": sup.mean() / per_px, "orth": weights.tau * terms["orth"].mean() / per_px}
    if rank_sup is not None:
        parts["rank_sup"] = rank_sup.mean()  # already a mean over components: no per-pixel scale
    if d.support_logit is not None:
        z = P.support_target(targets["mask"].to(Y.device), targets["anomaly"])
        parts["support"] = weights.support * P.support_focal_loss(d.support_logit, z).mean() / Y[0, 0].numel()
    if weights.bayesian:
        parts.update(
            fid=terms["fid"].mean() / per_px, rank=terms["rank"].mean() / per_px, sparse=terms["sparse"].mean() / per_px
        )
    total = sum(parts.values())
    return total, {k: float(v.detach()) for k, v in parts.items()}
