"""Closed-form leaf updates against direct numerical minimisation, and the ELBO terms
against the textbook KL divergences they stand for."""

import math

import numpy as np
import pytest
import torch

from indeed_cli.model import Priors
from indeed_cli.model import posteriors as P


@pytest.fixture(autouse=True)
def float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def kl_gamma(a, b, a0, b0):
    """KL(Gamma(a, b) || Gamma(a0, b0)), rate parameterisation."""
    return (
        (a - a0) * torch.special.digamma(a)
        - torch.lgamma(a)
        + torch.lgamma(torch.tensor(a0))
        + a0 * (torch.log(b) - math.log(b0))
        + a * (b0 - b) / b
    )


def minimise_gamma_objective(objective, a_init=3.0, b_init=1.0):
    """Minimise objective(alpha, beta) over log-parameters with LBFGS."""
    la = torch.tensor(math.log(a_init), requires_grad=True)
    lb = torch.tensor(math.log(b_init), requires_grad=True)
    opt = torch.optim.LBFGS(
        [la, lb], lr=0.5, max_iter=500, tolerance_grad=1e-12, tolerance_change=1e-14, line_search_fn="strong_wolfe"
    )

    def closure():
        opt.zero_grad()
        loss = objective(la.exp(), lb.exp())
        loss.backward()
        return loss

    for _ in range(5):
        opt.step(closure)
    return la.exp().item(), lb.exp().item()


def test_gamma_update_minimises_rank_plus_prior_term():
    torch.manual_seed(0)
    pr = Priors(alpha0=2.0, beta0_gamma=0.05)  # larger beta0 keeps the optimiser well conditioned
    h, w = 6, 5
    mu_A, s_A = torch.randn(1, 1, h, 1), torch.rand(1, 1, h, 1) + 0.1
    mu_B, s_B = torch.randn(1, 1, w, 1), torch.rand(1, 1, w, 1) + 0.1
    energy = float((mu_A**2 + s_A**2).sum() + (mu_B**2 + s_B**2).sum())

    def objective(a, b):  # E_q[-log p(A|g) - log p(B|g)] + KL(q(g)||p(g)), constants dropped
        e_log = torch.special.digamma(a) - torch.log(b)
        return -(h + w) / 2 * e_log + a / b * energy / 2 + kl_gamma(a, b, pr.alpha0, pr.beta0_gamma)

    a_num, b_num = minimise_gamma_objective(objective)
    a, b = P.gamma_posterior(mu_A, s_A, mu_B, s_B, pr)
    assert a.item() == pytest.approx(a_num, rel=1e-4)
    assert b.item() == pytest.approx(b_num, rel=1e-4)
    # the paper's doubled parameterisation has the same mean
    assert (a / b).item() == pytest.approx((2 * pr.alpha0 + h + w) / (2 * pr.beta0_gamma + energy))


def test_omega_update_minimises_sparse_plus_prior_term():
    pr = Priors(alpha0=2.0, beta0_omega=0.03)
    mu, sd = torch.tensor([[0.7]]), torch.tensor([[0.2]])
    m2 = float(mu**2 + sd**2)

    def objective(a, b):
        e_log = torch.special.digamma(a) - torch.log(b)
        return -0.5 * e_log + a / b * m2 / 2 + kl_gamma(a, b, pr.alpha0, pr.beta0_omega)

    a_num, b_num = minimise_gamma_objective(objective)
    a, b = P.omega_posterior(mu, sd, pr)
    assert a.item() == pytest.approx(a_num, rel=1e-4)
    assert b.item() == pytest.approx(b_num, rel=1e-4)


def test_lambda_update_minimises_fidelity_plus_prior_term():
    pr = Priors(alpha0=2.0, beta0_lambda=0.02)
    r = torch.tensor([[0.3]])

    def objective(a, b):
        e_log = torch.special.digamma(a) - torch.log(b)
        return -0.5 * e_log + a / b * float(r**2) / 2 + kl_gamma(a, b, pr.alpha0, pr.beta0_lambda)

    a_num, b_num = minimise_gamma_objective(objective)
    a, b = P.lambda_posterior(r, pr)
    assert a.item() == pytest.approx(a_num, rel=1e-4)
    assert b.item() == pytest.approx(b_num, rel=1e-4)


def gaussian_kl(mu, var, prior_prec):
    """KL(N(mu, var) || N(0, 1/prior_prec)), elementwise."""
    return 0.5 * (prior_prec * (mu**2 + var) - 1 - torch.log(var * prior_prec))


def test_rank_loss_is_the_kl_up_to_a_constant():
    torch.manual_seed(1)
    g = torch.rand(2, 3, 4) + 0.5

    def both(seed):
        torch.manual_seed(seed)
        mA, sA = torch.randn(2, 3, 6, 4), torch.rand(2, 3, 6, 4) + 0.1
        mB, sB = torch.randn(2, 3, 5, 4), torch.rand(2, 3, 5, 4) + 0.1
        gg = g.unsqueeze(-2)
        kl = gaussian_kl(mA, sA**2, gg).flatten(1).sum(1) + gaussian_kl(mB, sB**2, gg).flatten(1).sum(1)
        return P.rank_loss(mA, sA, mB, sB, g), kl

    (l1, k1), (l2, k2) = both(2), both(3)
    assert torch.allclose(l1 - k1, l2 - k2)  # same constant for any q(A), q(B)
    assert not torch.allclose(l1, l2)


def test_sparse_loss_is_the_kl_up_to_a_constant():
    om = torch.rand(2, 1, 4, 4) + 0.2
    diffs = []
    for seed in (0, 1):
        torch.manual_seed(seed)
        mu, sd = torch.randn(2, 1, 4, 4), torch.rand(2, 1, 4, 4) + 0.05
        diffs.append(P.sparse_loss(mu, sd, om) - gaussian_kl(mu, sd**2, om).flatten(1).sum(1))
    assert torch.allclose(diffs[0], diffs[1])


def test_fidelity_orth_and_supervision_terms():
    torch.manual_seed(4)
    Y, L, S, U = (torch.randn(2, 1, 3, 3) for _ in range(4))
    lam = torch.rand(2, 1, 3, 3)
    assert torch.allclose(P.fidelity_loss(Y, L, S, lam), 0.5 * (lam * (Y - L - S) ** 2).sum((1, 2, 3)))
    q, _ = torch.linalg.qr(torch.randn(8, 3))
    A = q.expand(2, 1, 8, 3)
    assert torch.allclose(P.orth_loss(A, A), torch.zeros(2), atol=1e-12)
    assert P.orth_loss(2 * A, A)[0] > 1
    den = P.denoise_supervision_loss(L, S, U, 3.0)
    assert torch.allclose(den, 1.5 * (((L + S - U) ** 2) + (L - U) ** 2).sum((1, 2, 3)))
    den10 = P.denoise_supervision_loss(L, S, U, 3.0, lowrank_weight=10.0)  # w_L weighs ||L - U||^2 only
    assert torch.allclose(den10 - den, 1.5 * 9 * ((L - U) ** 2).sum((1, 2, 3)))
    uad = P.anomaly_supervision_loss(L, S, U, Y - U, 3.0)
    assert torch.allclose(uad, 1.5 * (((L - U) ** 2) + (S - (Y - U)) ** 2).sum((1, 2, 3)))


def test_low_rank_moments_match_monte_carlo():
    torch.manual_seed(5)
    mA, sA = torch.randn(1, 1, 4, 3), torch.rand(1, 1, 4, 3) * 0.5
    mB, sB = torch.randn(1, 1, 5, 3), torch.rand(1, 1, 5, 3) * 0.5
    mean, sd = P.low_rank_moments(mA, sA, mB, sB)
    n = 200_000
    A = mA + sA * torch.randn(n, 1, 4, 3)
    B = mB + sB * torch.randn(n, 1, 5, 3)
    L = P.low_rank(A, B)
    assert torch.allclose(mean[0], L.mean(0), atol=0.02)
    assert torch.allclose(sd[0], L.std(0), rtol=0.03, atol=0.01)


def test_rank_index_counts_active_components():
    torch.manual_seed(6)
    h, w, r, k = 16, 12, 8, 3
    mA = torch.zeros(1, 1, h, r)
    mB = torch.zeros(1, 1, w, r)
    mA[..., :k] = torch.randn(h, k)
    mB[..., :k] = torch.randn(w, k)
    small = torch.full_like(mA, 1e-4), torch.full_like(mB, 1e-4)
    a, b = P.gamma_posterior(mA, small[0], mB, small[1])
    assert P.rank_index(a, b).item() == k


def test_energy_rank_counts_singular_values_holding_the_energy():
    """energy_rank against a direct count on numpy's SVD, an exact rank-k matrix and the cap."""
    torch.manual_seed(2)
    U = torch.rand(3, 2, 20, 24)
    U[0, 0] = torch.randn(20, 3) @ torch.randn(3, 24)  # exactly rank 3
    U[1, 1] = 0.0
    r = P.energy_rank(U)
    for i in range(3):
        for c in range(2):
            s2 = np.linalg.svd(U[i, c].double().numpy(), compute_uv=False) ** 2
            share = np.cumsum(s2) / max(s2.sum(), 1e-300)
            expected = int(np.searchsorted(share, 0.999)) + 1 if s2.sum() > 0 else 0
            assert int(r[i, c]) == expected
    assert int(r[0, 0]) <= 3 and int(r[1, 1]) == 0
    assert int(P.energy_rank(U, cap=2).max()) == 2


def test_rank_supervision_is_zero_exactly_when_the_rank_index_equals_the_target():
    """l_n vanishes when the n* strongest components stand a margin above the index's threshold and the
    others a margin below; then rank_index == n*.  Off by one component, it is positive, and its gradient
    moves the offending component's rate the right way."""
    r, k = 8, 3
    beta = torch.full((1, 1, r), 1e-5)
    beta[..., :k] = torch.tensor([1.0, 0.5, 0.05])
    alpha = torch.full_like(beta, 2.0 + 0.5 * 256)
    assert P.rank_index(alpha, beta).item() == k
    assert float(P.rank_supervision_loss(beta, torch.tensor([[k]]))) == 0.0
    b = beta.clone().requires_grad_(True)
    loss = P.rank_supervision_loss(b, torch.tensor([[k + 1]]))  # one more component should be on
    assert float(loss.detach()) > 0
    (g,) = torch.autograd.grad(loss, b)
    assert float(g[0, 0, k]) < 0 and float(g[0, 0, k + 1 :].abs().sum()) == 0  # raise the 4th strongest only
    loss = P.rank_supervision_loss(b, torch.tensor([[k - 1]]))  # one fewer
    (g,) = torch.autograd.grad(loss, b)
    assert float(g[0, 0, k - 1]) > 0  # lower the 3rd strongest


def test_leaf_means_are_detached_and_positive():
    from conftest import tiny_model

    torch.set_default_dtype(torch.float32)
    m = tiny_model(1).train()
    Y = torch.rand(2, 1, 16, 16)
    d = m(Y, sample=True)
    terms = P.elbo_terms(d, Y)
    for k in ("mu_gamma", "mu_omega", "mu_lambda"):
        assert not terms[k].requires_grad and (terms[k] > 0).all()
    for k in ("fid", "rank", "sparse", "orth"):
        assert terms[k].shape == (2,) and terms[k].requires_grad


def test_pooled_lambda_update_minimises_fidelity_plus_prior_term():
    pr = Priors(alpha0=2.0, beta0_lambda=0.02)
    r = torch.tensor([[[[0.3, -0.1], [0.2, 0.05]]]])
    m, ss = r.numel(), float(r.square().sum())

    def objective(a, b):  # one precision shared by the m residuals of the sample
        e_log = torch.special.digamma(a) - torch.log(b)
        return -0.5 * m * e_log + a / b * ss / 2 + kl_gamma(a, b, pr.alpha0, pr.beta0_lambda)

    a_num, b_num = minimise_gamma_objective(objective)
    a, b = P.pooled_lambda_posterior(r, pr)
    assert a.shape == (1,)
    assert a.item() == pytest.approx(a_num, rel=1e-4)
    assert b.item() == pytest.approx(b_num, rel=1e-4)


def _decomposition(seed, n=2, c=1, h=6, w=5, r=3, requires_grad=False):
    from indeed_cli.model import Decomposition

    g = torch.Generator().manual_seed(seed)
    t = {
        k: torch.randn(n, c, *shape, generator=g) for k, shape in (("mu_A", (h, r)), ("mu_B", (w, r)), ("mu_S", (h, w)))
    }
    t.update(
        {
            k: torch.rand(n, c, *shape, generator=g) + 0.1
            for k, shape in (("sigma_A", (h, r)), ("sigma_B", (w, r)), ("sigma_S", (h, w)))
        }
    )
    for v in t.values():
        v.requires_grad_(requires_grad)
    L = P.low_rank(t["mu_A"], t["mu_B"])
    return Decomposition(A_hat=t["mu_A"], B_hat=t["mu_B"], L_hat=L, S_hat=t["mu_S"], **t), torch.randn(
        n, c, h, w, generator=g
    )


@pytest.mark.parametrize("pooled", [True, False])
def test_collapsed_objective_has_the_gradient_of_the_losses_with_fixed_leaf_means(pooled):
    """Envelope theorem: the leaf posteriors are optimal, so only the explicit terms move."""
    pr = Priors()
    d, Y = _decomposition(3, requires_grad=True)
    P.collapsed_objective(d, Y, "LS", pr, pooled).sum().backward()
    got = {k: getattr(d, k).grad.clone() for k in ("mu_A", "mu_B", "mu_S", "sigma_A", "sigma_B", "sigma_S")}
    d2, _ = _decomposition(3, requires_grad=True)
    leaf = P.leaf_means(d2, Y, pr)
    if pooled:
        a, b = P.pooled_lambda_posterior(Y - d2.L_hat - d2.S_hat, pr)
        leaf["mu_lambda"] = (a / b).view(-1, 1, 1, 1).detach()
    loss = (
        P.fidelity_loss(Y, d2.L_hat, d2.S_hat, leaf["mu_lambda"])
        + P.sparse_loss(d2.mu_S, d2.sigma_S, leaf["mu_omega"])
        + P.rank_loss(d2.mu_A, d2.sigma_A, d2.mu_B, d2.sigma_B, leaf["mu_gamma"])
    )
    loss.sum().backward()
    for k, g in got.items():
        assert torch.allclose(g, getattr(d2, k).grad, rtol=1e-6, atol=1e-9), k


def test_collapsed_objective_terms_follow_modules():
    d, Y = _decomposition(4)
    fid = P.collapsed_objective(d, Y, "", Priors())
    s, l_, ls = (P.collapsed_objective(d, Y, m, Priors()) for m in ("S", "L", "LS"))
    assert torch.allclose(ls - fid, (s - fid) + (l_ - fid))
    assert not torch.allclose(s, fid) and not torch.allclose(l_, fid)


def test_variational_B_is_the_closed_form_posterior_given_A_and_gamma():
    from indeed_cli.model.posteriors import variational_B

    g = torch.Generator().manual_seed(0)
    h, w, r = 24, 20, 5
    A = torch.randn(1, 1, h, r, generator=g, dtype=torch.float64).float()
    sA = 0.1 * torch.rand(1, 1, h, r, generator=g)
    Y = torch.randn(1, 1, h, w, generator=g)
    beta = torch.tensor([[4.0]])
    # one iteration: gamma is still its start (1), so q(B) is the Gaussian posterior of B under the
    # prior N(0, I) and the likelihood N(Y | A B^T, 1/beta) with E[A^T A] = A^T A + diag(sum sigma_A^2)
    mu_B, sigma_B, _ = variational_B(Y, A, sA, beta, iterations=1)
    A64, Y64 = A[0, 0].double(), Y[0, 0].double()
    EAtA = A64.T @ A64 + torch.diag(sA[0, 0].double().square().sum(0))
    Sigma = torch.linalg.inv(4.0 * EAtA + torch.eye(r, dtype=torch.float64))
    assert torch.allclose(mu_B[0, 0].double(), (4.0 * Sigma @ A64.T @ Y64).T, atol=1e-4)
    assert torch.allclose(sigma_B[0, 0].double(), Sigma.diagonal().sqrt().expand(w, r), atol=1e-5)


def test_variational_B_switches_off_components_that_explain_nothing():
    from indeed_cli.model.posteriors import variational_B

    g = torch.Generator().manual_seed(1)
    h, w = 64, 48
    a = torch.randn(h, 2, generator=g)
    b = torch.randn(w, 2, generator=g)
    sigma = 0.05
    Y = (a @ b.T + sigma * torch.randn(h, w, generator=g))[None, None]
    junk = torch.randn(h, 4, generator=g)  # columns of A that the image does not use
    A = torch.cat([a, junk], 1)[None, None]
    mu_B, _, gamma = variational_B(Y, A, torch.zeros_like(A), torch.tensor([[1 / sigma**2]]), iterations=30)
    assert gamma[0, 0, :2].max() < 10 and gamma[0, 0, 2:].min() > 1e3  # kept / switched off
    L = A[0, 0].float() @ mu_B[0, 0].T
    assert (L - (a @ b.T).float()).square().mean() < 0.1 * sigma**2  # the low-rank part, not the noise


def test_noise_precision_estimate_recovers_sigma_of_white_noise():
    from indeed_cli.model.posteriors import noise_precision_estimate

    g = torch.Generator().manual_seed(2)
    smooth = torch.linspace(0, 1, 128).view(1, 1, 1, 128).expand(2, 3, 128, 128)
    for sigma in (5 / 255, 25 / 255):
        Y = smooth + sigma * torch.randn(2, 3, 128, 128, generator=g)
        est = noise_precision_estimate(Y).rsqrt()
        assert est.shape == (2, 3) and ((est / sigma) - 1).abs().max() < 0.1
