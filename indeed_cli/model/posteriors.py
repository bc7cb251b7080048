"""Closed-form leaf posteriors (sub-problem 1) and the ELBO terms (sub-problem 2).

Every function maps to one equation of the InDeed paper (shared/paper, §3.3-3.6);
equation names are the paper's LaTeX labels.

Shapes (one factorisation per colour channel, see docs/model.md):
  mu_A, sigma_A : (N, C, h, r)      column factors A, r = r^0
  mu_B, sigma_B : (N, C, w, r)      row factors B
  mu_S, sigma_S : (N, C, h, w)      sparse component
  Y, U          : (N, C, h, w)
Loss terms return one value per sample, shape (N,), summed over the sample's
elements as in the paper; callers that want per-pixel numbers divide all terms
by the same pixel count, which leaves their balance unchanged.

About the factor 2 in Eqs. (gamma/omega/lambda formula): the paper writes
alpha = 2 alpha0 + h + w and beta = 2 beta0 + E||a||^2 + E||b||^2.  Minimising the
sub-problem-1 objective l_rank + l_gamma over a Gamma q(gamma) gives exactly half
of both (alpha0 + (h+w)/2, beta0 + (...)/2); tests/test_posteriors.py checks this
against a direct numerical minimisation.  The posterior means alpha/beta, the only
quantities the losses use, are identical either way.  We return the exact
minimiser; the paper's parameterisation is its double.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from .config import Priors

EPS = 1e-12


# --------------------------------------------------------------- sub-problem 1
def gamma_posterior(
    mu_A: Tensor, sigma_A: Tensor, mu_B: Tensor, sigma_B: Tensor, priors: Priors = Priors()
) -> tuple[Tensor, Tensor]:
    """q(gamma_i) = Gamma(alpha, beta), Eq. (gamma formula), one per rank-one factor.

    Returns (alpha, beta) of shape (N, C, r).  E[gamma_i] = alpha / beta shrinks the
    i-th column pair a_i, b_i towards zero when their energy is small.
    """
    h, w = mu_A.shape[-2], mu_B.shape[-2]
    energy = (mu_A.square() + sigma_A.square()).sum(-2) + (mu_B.square() + sigma_B.square()).sum(-2)
    alpha = torch.full_like(energy, priors.alpha0 + 0.5 * (h + w))
    beta = priors.beta0_gamma + 0.5 * energy
    return alpha, beta


def variational_B(
    Y: Tensor, mu_A: Tensor, sigma_A: Tensor, noise_precision: Tensor, iterations: int = 8, priors: Priors = Priors()
) -> tuple[Tensor, Tensor, Tensor]:
    """q(B) given q(A), docs/model.md Eq. (variational B): with E[A^T A] = mu_A^T mu_A + diag(sum_h sigma_A^2),
    Sigma = (beta E[A^T A] + diag(E[gamma]))^-1 and mu_B^T = beta Sigma mu_A^T Y (each row b_j of B has
    covariance Sigma), alternated ``iterations`` times with the update of gamma_i from the B half of
    Eq. (gamma formula) in MacKay's fixed-point form, gamma_i = (w (1 - gamma_i Sigma_ii) + 2 (alpha0 - 1)) /
    (||mu_b_i||^2 + 2 beta0): components that do not explain Y above the noise get a large gamma and
    vanish (automatic relevance determination).

    Y (N, C, h, w), mu_A / sigma_A (N, C, h, r), noise_precision beta (N, C) in 1/units^2.
    Returns mu_B, sigma_B (N, C, w, r; sigma_B the square root of Sigma's diagonal) and E[gamma] (N, C, r).
    Runs in float32 whatever the caller's precision.
    """
    with torch.autocast(Y.device.type, enabled=False):
        Y, mu_A, sigma_A = Y.float(), mu_A.float(), sigma_A.float()
        beta = noise_precision.float()[..., None, None]
        w, r = Y.shape[-1], mu_A.shape[-1]
        AtA = mu_A.transpose(-1, -2) @ mu_A + torch.diag_embed(sigma_A.square().sum(-2))
        AtY = mu_A.transpose(-1, -2) @ Y  # (N, C, r, w)
        eye = torch.eye(r, device=Y.device, dtype=torch.float32)
        gamma = torch.ones(Y.shape[:2] + (r,), device=Y.device, dtype=torch.float32)
        for _ in range(iterations):
            P = beta * AtA + torch.diag_embed(gamma) + 1e-6 * eye
            Sigma = torch.cholesky_inverse(torch.linalg.cholesky(P))
            M = beta * (Sigma @ AtY)  # (N, C, r, w) = mu_B^T
            var = torch.diagonal(Sigma, dim1=-2, dim2=-1)
            # MacKay's fixed point (w (1 - gamma_i Sigma_ii) counts the well-determined directions): the
            # stationary points of the EM form (alpha0 + w/2) / (beta0 + (||b_i||^2 + w Sigma_ii)/2) up to
            # alpha0 - 1 for alpha0 (the mode of q(gamma_i) for its mean), in a few iterations, not hundreds
            well = (w * (1 - gamma * var)).clamp_min(0) + 2 * (priors.alpha0 - 1)
            gamma = (well / (M.square().sum(-1) + 2 * priors.beta0_gamma)).clamp(max=1e10)
        sigma_B = var.sqrt()[..., None, :].expand(M.shape[:2] + (w, r))
        return M.transpose(-1, -2), sigma_B, gamma


def noise_precision_estimate(Y: Tensor, floor: float = 0.5 / 255) -> Tensor:
    """beta = 1 / sigma^2 per sample and channel (N, C), sigma from the median absolute value of the
    diagonal Haar detail of Y (Donoho's MAD rule, sigma = median |HH| / 0.6745): blind, and robust
    to edges; ``floor`` keeps clean inputs finite.  Detached: a fixed input to the update of q(B)."""
    Y = Y.detach().float()
    hh = (Y[..., 0::2, 0::2] - Y[..., 0::2, 1::2] - Y[..., 1::2, 0::2] + Y[..., 1::2, 1::2]) / 2
    sigma = hh.flatten(-2).abs().median(-1).values / 0.6745
    return sigma.clamp_min(floor).square().reciprocal()


def omega_posterior(mu_S: Tensor, sigma_S: Tensor, priors: Priors = Priors()) -> tuple[Tensor, Tensor]:
    """q(omega_ij) = Gamma(alpha, beta), Eq. (omega formula): the sparsity precision of S."""
    alpha = torch.full_like(mu_S, priors.alpha0 + 0.5)
    beta = priors.beta0_omega + 0.5 * (mu_S.square() + sigma_S.square())
    return alpha, beta


def lambda_posterior(residual: Tensor, priors: Priors = Priors()) -> tuple[Tensor, Tensor]:
    """q(lambda_ij) = Gamma(alpha, beta), Eq. (lambda formula): pixel-wise noise precision.

    ``residual`` is Y - (A_hat B_hat^T + S_hat) for sampled A_hat, B_hat, S_hat
    (the paper's Monte-Carlo form); at inference the posterior means are used.
    """
    alpha = torch.full_like(residual, priors.alpha0 + 0.5)
    beta = priors.beta0_lambda + 0.5 * residual.square()
    return alpha, beta


def pooled_lambda_posterior(residual: Tensor, priors: Priors = Priors()) -> tuple[Tensor, Tensor]:
    """Eq. (lambda formula) with one noise precision per sample instead of one per pixel.

    Used by active generalization (docs/guide/adapt.md): with a pixel-wise Lambda the adaptation
    loss becomes a per-pixel log-penalty on the residual that drives N to zero (L + S copies
    the noisy input); one precision per image keeps the noise model of an RPCA.  Returns
    (alpha, beta) of shape (N,): alpha0 + m/2 and beta0_lambda + ||residual||^2 / 2 over
    the m elements of each sample.
    """
    m = residual[0].numel()
    beta = priors.beta0_lambda + 0.5 * residual.square().flatten(1).sum(1)
    return torch.full_like(beta, priors.alpha0 + 0.5 * m), beta


def gamma_mean(alpha: Tensor, beta: Tensor) -> Tensor:
    """E[x] = alpha / beta of a Gamma(alpha, beta) variable (mu_gamma, mu_Omega, mu_Lambda)."""
    return alpha / beta


# --------------------------------------------------------------- sub-problem 2
def low_rank(A: Tensor, B: Tensor) -> Tensor:
    """L = A B^T per channel, Eq. (expression of L): (N,C,h,r) x (N,C,w,r) -> (N,C,h,w)."""
    return torch.matmul(A, B.transpose(-1, -2))


def fidelity_loss(Y: Tensor, L_hat: Tensor, S_hat: Tensor, mu_lambda: Tensor, per_element: bool = False) -> Tensor:
    """l_fid = 1/2 || sqrt(mu_Lambda) (.) (Y - (A_hat B_hat^T + S_hat)) ||_F^2, Eq. (l_fid);
    ``per_element``: the summands, shaped like Y (a whole-image read-out averages them per tile)."""
    terms = 0.5 * (mu_lambda * (Y - L_hat - S_hat).square())
    return terms if per_element else terms.flatten(1).sum(1)


def rank_loss(mu_A: Tensor, sigma_A: Tensor, mu_B: Tensor, sigma_B: Tensor, mu_gamma: Tensor) -> Tensor:
    """l_rank, Eq. (VI L_rank): KL of q(A)q(B) to p(A|gamma)p(B|gamma) up to constants.

    mu_gamma (N, C, r) is broadcast over the rows of A and of B.
    """
    g = mu_gamma.unsqueeze(-2)

    def part(mu: Tensor, sigma: Tensor) -> Tensor:
        var = sigma.square()
        return (mu.square() * g + var * g - torch.log(var + EPS)).flatten(1).sum(1)

    return 0.5 * (part(mu_A, sigma_A) + part(mu_B, sigma_B))


def sparse_loss(mu_S: Tensor, sigma_S: Tensor, mu_omega: Tensor, per_element: bool = False) -> Tensor:
    """l_sparse, Eq. (VI L_sparse): KL of q(S) to p(S|Omega) up to constants; ``per_element``: the
    summands, shaped like mu_S."""
    var = sigma_S.square()
    terms = 0.5 * (mu_S.square() * mu_omega + mu_omega * var - torch.log(var + EPS))
    return terms if per_element else terms.flatten(1).sum(1)


def orth_loss(A_hat: Tensor, B_hat: Tensor) -> Tensor:
    """l_orth = ||A^T A - I||_F^2 + ||B^T B - I||_F^2 (paper §3.6, before Eq. network loss function).

    Summed over channels; pushes the r rank-one components to carry different content.
    """

    def part(M: Tensor) -> Tensor:
        gram = torch.matmul(M.transpose(-1, -2), M)
        eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
        return (gram - eye).square().flatten(1).sum(1)

    return part(A_hat) + part(B_hat)


def denoise_supervision_loss(
    L_hat: Tensor, S_hat: Tensor, U: Tensor, sigma0: float, lowrank_weight: float = 1.0
) -> Tensor:
    """l_sup|DEN = sigma0/2 (||L + S - U||^2 + w_L ||L - U||^2), Eq. (l_sup_DEN); U is the clean image.
    The paper has w_L = 1; a larger w_L asks L itself to carry more of the image (docs/model.md)."""
    return 0.5 * sigma0 * ((L_hat + S_hat - U).square() + lowrank_weight * (L_hat - U).square()).flatten(1).sum(1)


def anomaly_supervision_loss(L_hat: Tensor, S_hat: Tensor, U_N: Tensor, U_A: Tensor, sigma0: float) -> Tensor:
    """l_sup|UAD = sigma0/2 (||L - U_N||^2 + ||S - U_A||^2), Eq. (AD supervision term).

    U_N is the normal image, U_A = Y - U_N the synthetic anomaly.
    """
    return 0.5 * sigma0 * ((L_hat - U_N).square() + (S_hat - U_A).square()).flatten(1).sum(1)


SUPPORT_FOCAL_GAMMA = 2.0


def support_target(mask: Tensor, U_A: Tensor, min_change: float = 1.5 / 255) -> Tensor:
    """z = 1{S != 0} of a synthetic anomaly: its mask, set to 0 for a patch whose anomaly changes the
    image by less than ``min_change`` on average inside the mask (invisible, so not in the support).
    ``mask`` (N, 1, h, w) in [0, 1] (soft at feathered edges), ``U_A`` (N, C, h, w)."""
    area = mask.flatten(1).sum(1).clamp(min=1.0)
    change = (U_A.abs().mean(1, keepdim=True) * mask).flatten(1).sum(1) / area
    return mask * (change >= min_change).to(mask.dtype)[:, None, None, None]


def support_focal_loss(logit: Tensor, z: Tensor, gamma: float = SUPPORT_FOCAL_GAMMA) -> Tensor:
    """l_M, docs/model.md Eq. (support focal loss), summed over pixels, per sample (N,):

        l_M = -sum_ij [ z (1 - p)^gamma log p + (1 - z) p^gamma log(1 - p) ],  p = q(z_ij = 1) = sigmoid(logit)

    the focal loss (Lin et al. 2017, as DRAEM trains its segmentation network) of f_thetaM's
    support posterior against the synthetic support z (soft at feathered edges)."""
    logit = logit.float()
    p = torch.sigmoid(logit)
    log_p, log_not_p = F.logsigmoid(logit), F.logsigmoid(-logit)
    loss = -(z * (1 - p).pow(gamma) * log_p + (1 - z) * p.pow(gamma) * log_not_p)
    return loss.flatten(1).sum(1)


def energy_rank(U: Tensor, energy: float = 0.999, cap: int = 0) -> Tensor:
    """The SVD rank of each channel of ``U`` (N, C, h, w): how many of its largest singular values
    hold ``energy`` of its squared Frobenius norm (at most ``cap`` when > 0), (N, C) integers on the
    CPU.  The clean image's rank that the rank index n is compared with (benchmarks/lowrank.py,
    128x128 tiles) and that :func:`rank_supervision_loss` asks n to follow.  A channel of zeros has
    rank 0.

    The squared singular values are the eigenvalues of the Gram matrix U U^T (of the shorter side),
    in float64 with numpy on the CPU: GPUs solve 128x128 problems one by one (with the SVDs of a batch
    of 64 colour patches on an H200 a training step took 0.57 s instead of 0.036 s), and numpy's
    single-threaded LAPACK was about twice as fast as torch's on a 2-core AMD EPYC (training computes
    it one batch ahead, :class:`~indeed_cli.tasks.training.batches.RankedBatches`)."""
    X = U.detach().to("cpu", torch.float64).numpy()
    if X.shape[-2] > X.shape[-1]:
        X = X.swapaxes(-1, -2)
    s2 = np.linalg.eigvalsh(X @ X.swapaxes(-1, -2))[..., ::-1].clip(min=0)
    total = s2.sum(-1, keepdims=True)
    share = s2.cumsum(-1) / np.maximum(total, 1e-300)
    r = np.where(total[..., 0] > 0, (share < energy).sum(-1) + 1, 0)
    r = torch.from_numpy(r.astype(np.int64))
    return r.clamp(max=cap) if cap > 0 else r


def rank_supervision_loss(
    beta_gamma: Tensor, target: Tensor, rel_threshold: float = 0.01, margin: float = 2.0
) -> Tensor:
    """l_n, docs/model.md Eq. (rank supervision), per sample (N,):

        l_n = 1/(C r) sum_c [ sum_{k <= n*} relu(log(m t) - log rho_(k))^2
                              + sum_{k > n*} relu(log rho_(k) - log(t/m))^2 ]

    with rho_i = E[1/gamma_i] / max_j E[1/gamma_j] = beta_i / max_j beta_j (q(gamma_i) shares alpha, Eq. gamma
    formula), sorted so that rho_(1) >= rho_(2) >= ..., t the rank index's threshold (:func:`rank_components`,
    1% of the largest E[1/gamma]), m a margin (2: beyond the 95% posterior probability the index asks for
    at alpha = alpha0 + (h + w)/2) and n* the clean patch's SVD rank (:func:`energy_rank`).  It asks the
    n* strongest components to stand above the index's threshold and the others below it, so that n = n*.

    beta_gamma (N, C, r): the rate of q(gamma) from :func:`gamma_posterior` (with its gradient);
    target (N, C) integers."""
    with torch.autocast(beta_gamma.device.type, enabled=False):
        b = beta_gamma.float()
        log_rho = torch.log(b.clamp_min(EPS)) - torch.log(b.amax(-1, keepdim=True).clamp_min(EPS))
        log_rho = log_rho.sort(-1, descending=True).values
        k = torch.arange(b.shape[-1], device=b.device)
        on = k < target.to(b.device)[..., None]
        lo, hi = math.log(margin * rel_threshold), math.log(rel_threshold / margin)
        terms = torch.where(on, F.relu(lo - log_rho), F.relu(log_rho - hi)).square()
        return terms.flatten(1).mean(1)


# --------------------------------------------------------------- interpretation
def low_rank_moments(mu_A: Tensor, sigma_A: Tensor, mu_B: Tensor, sigma_B: Tensor) -> tuple[Tensor, Tensor]:
    """Posterior mean and standard deviation of L = A B^T under q(A) q(B) (paper §4.6).

    Exact moments of a sum of products of independent Gaussians:
      E[l_ij]   = sum_k mu_a_ik mu_b_jk
      Var[l_ij] = sum_k (mu_a^2 s_b^2 + s_a^2 mu_b^2 + s_a^2 s_b^2)_ijk
    (The paper's §4.6 display formula is a product-of-experts heuristic whose mean
    is not E[A B^T]; we use the exact moments so that L + S + N = Y holds for the
    posterior means.)
    """
    mean = low_rank(mu_A, mu_B)
    vA, vB = sigma_A.square(), sigma_B.square()
    var = low_rank(mu_A.square(), vB) + low_rank(vA, mu_B.square()) + low_rank(vA, vB)
    return mean, var.clamp_min(0).sqrt()


def rank_components(alpha: Tensor, beta: Tensor, rel_threshold: float = 0.01, prob: float = 0.95) -> Tensor:
    """The rank-one components the rank index counts: p(gamma_i^-1 > t) > prob (paper §4.6).

    The paper leaves t open; we take t = rel_threshold * max_i E[gamma_i^-1] per
    channel, i.e. a component counts when its variance is at least 1% of the
    strongest one's with 95% posterior probability.  Returns (N, C, r) booleans.
    p(gamma^-1 > t) = p(gamma < 1/t) = P(alpha, beta / t), the regularised lower
    incomplete gamma function.
    """
    inv_mean = beta / (alpha - 1).clamp_min(EPS)  # E[1/gamma] for alpha > 1
    t = rel_threshold * inv_mean.amax(-1, keepdim=True)
    p = torch.special.gammainc(alpha.double(), (beta / t).double())
    return p > prob


def rank_index(alpha: Tensor, beta: Tensor, rel_threshold: float = 0.01, prob: float = 0.95) -> Tensor:
    """Estimated rank n = |{i : p(gamma_i^-1 > t) > prob}| (paper §4.6), (N, C) integers: the
    number of :func:`rank_components`."""
    return rank_components(alpha, beta, rel_threshold, prob).sum(-1)


def collapsed_objective(d, Y: Tensor, modules: str, priors: Priors = Priors(), pooled_noise: bool = True) -> Tensor:
    """Negative ELBO of the unsupervised terms with sub-problem 1 solved, per sample (N,).

    Plugging the closed-form q(Lambda), q(Omega), q(gamma) (Eqs. lambda/omega/gamma formula)
    back into l_fid + l_sparse (+ l_rank) and their Gamma KL terms leaves, up to constants,
      fid:    (alpha0 + m/2) log(beta0_lambda + ||Y - L - S||^2 / 2)   (pooled Lambda), or
              sum_ij (alpha0 + 1/2) log(beta0_lambda + r_ij^2 / 2)     (pixel-wise Lambda);
      sparse: sum_ij (alpha0 + 1/2) log(beta0_omega + (mu_S^2 + sigma_S^2)/2) - log sigma_S;
      rank:   sum_i (alpha0 + (h+w)/2) log(beta_gamma_i) - sum log sigma_A - sum log sigma_B.
    Its gradient equals that of the losses with the leaf means held fixed (the leaf
    posteriors are optimal, so their own variation does not contribute), but unlike those
    losses its value is comparable between weights, which is what early stopping in
    active generalization needs.  ``modules`` picks the
    terms as in Eq. (active generalization loss): "S" -> fid + sparse, "L" -> fid + rank.
    """
    a0 = priors.alpha0
    r = Y - d.L_hat - d.S_hat
    if pooled_noise:
        alpha, beta = pooled_lambda_posterior(r, priors)
        total = alpha * torch.log(beta)
    else:
        total = ((a0 + 0.5) * torch.log(priors.beta0_lambda + 0.5 * r.square())).flatten(1).sum(1)
    if "S" in modules:
        e = 0.5 * (d.mu_S.square() + d.sigma_S.square())
        total = total + ((a0 + 0.5) * torch.log(priors.beta0_omega + e) - torch.log(d.sigma_S + EPS)).flatten(1).sum(1)
    if "L" in modules:
        a_g, b_g = gamma_posterior(d.mu_A, d.sigma_A, d.mu_B, d.sigma_B, priors)
        total = (
            total
            + (a_g * torch.log(b_g)).flatten(1).sum(1)
            - torch.log(d.sigma_A + EPS).flatten(1).sum(1)
            - torch.log(d.sigma_B + EPS).flatten(1).sum(1)
        )
    return total


# --------------------------------------------------------------- one iteration
def leaf_means(d, Y: Tensor, priors: Priors = Priors()) -> dict[str, Tensor]:
    """Sub-problem 1 for one forward pass: detached E[gamma], E[Omega], E[Lambda] and q(gamma).

    ``d`` is a :class:`indeed_cli.networks.Decomposition`.  The leaf posteriors are
    computed from the current network outputs and then held fixed (detached) for
    the loss of sub-problem 2, as in paper §3.1.3.
    """
    with torch.no_grad():
        a_g, b_g = gamma_posterior(d.mu_A, d.sigma_A, d.mu_B, d.sigma_B, priors)
        a_o, b_o = omega_posterior(d.mu_S, d.sigma_S, priors)
        a_l, b_l = lambda_posterior(Y - d.L_hat - d.S_hat, priors)
        return {
            "alpha_gamma": a_g,
            "beta_gamma": b_g,
            "mu_gamma": gamma_mean(a_g, b_g),
            "mu_omega": gamma_mean(a_o, b_o),
            "mu_lambda": gamma_mean(a_l, b_l),
        }


def elbo_terms(d, Y: Tensor, priors: Priors = Priors()) -> dict[str, Tensor]:
    """The unsupervised part of Eq. (ob phi_1) plus l_orth, each of shape (N,).

    Returns l_fid, l_rank, l_sparse, l_orth and the leaf means used for them.
    """
    leaf = leaf_means(d, Y, priors)
    return {
        "fid": fidelity_loss(Y, d.L_hat, d.S_hat, leaf["mu_lambda"]),
        "rank": rank_loss(d.mu_A, d.sigma_A, d.mu_B, d.sigma_B, leaf["mu_gamma"]),
        "sparse": sparse_loss(d.mu_S, d.sigma_S, leaf["mu_omega"]),
        "orth": orth_loss(d.A_hat, d.B_hat),
        **leaf,
    }
