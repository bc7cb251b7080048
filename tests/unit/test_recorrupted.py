"""The recorrupted-to-recorrupted adaptation: the noise spectrum, its sampler, and the runner."""

import numpy as np
import pytest
import torch
from conftest import tiny_model

from indeed_cli.model import Checkpoint
from indeed_cli.tasks.adaptation import AdaptConfig, adapt_each
from indeed_cli.tasks.adaptation.recorrupted import (
    correlated_noise,
    noise_gain,
    noise_spectrum,
    recorrupted_pair,
    spectrum_root,
)


def _coloured_noise(rng, n=1, size=128, sigma=0.05):
    """White noise filtered by a 2 x 2 box and mixed across channels: a known covariance (lag-1
    correlation 0.5 along rows and columns; channel 1 = 0.8 channel 0 + 0.6 of its own)."""
    w = rng.normal(0, sigma, (n, 3, size + 1, size + 1))
    h = (w[..., 1:, 1:] + w[..., 1:, :-1] + w[..., :-1, 1:] + w[..., :-1, :-1]) / 2
    mix = np.array([[1, 0, 0], [0.8, 0.6, 0], [0, 0, 1.0]])
    return np.einsum("ij,njxy->nixy", mix, h)


def _moments(x):
    """Per channel variance, horizontal and vertical lag-1 correlation, and the 0-1 channel correlation."""
    x = x - x.mean(axis=(-2, -1), keepdims=True)
    var = (x**2).mean(axis=(0, 2, 3))
    lag_h = (x[..., 1:] * x[..., :-1]).mean(axis=(0, 2, 3)) / var
    lag_v = (x[..., 1:, :] * x[..., :-1, :]).mean(axis=(0, 2, 3)) / var
    cross = (x[:, 0] * x[:, 1]).mean() / np.sqrt(var[0] * var[1])
    return var, lag_h, lag_v, cross


def test_noise_spectrum_of_white_noise_is_flat_and_has_its_variance(rng):
    n = rng.normal(0, 0.1, (3, 256, 256))
    P = noise_spectrum(n)
    diag = np.stack([P[c, c].real for c in range(3)])
    assert np.allclose(diag[:, 1:, 1:].mean(), 0.01, rtol=0.05)  # the block means (DC) are removed
    assert np.abs(diag[:, 1:, 1:] / 0.01 - 1).mean() < 0.2  # flat: every frequency near sigma^2
    assert abs(P[0, 1].mean()) < 0.05 * 0.01  # independent channels: no covariance at lag 0


def test_sampled_noise_has_the_covariance_it_was_estimated_from(rng):
    noise = _coloured_noise(rng, n=1, size=256)[0]
    root = spectrum_root(noise_spectrum(noise), 64)
    z = correlated_noise(root[None].repeat(64, 1, 1, 1, 1), torch.Generator().manual_seed(0)).numpy()
    want, got = _moments(noise[None]), _moments(z)
    assert np.allclose(got[0], want[0], rtol=0.15)  # variance
    assert np.allclose(got[1], want[1], atol=0.06) and np.allclose(got[1], 0.5, atol=0.08)  # horizontal lag 1
    assert np.allclose(got[2], want[2], atol=0.06) and np.allclose(got[2], 0.5, atol=0.08)  # vertical lag 1
    assert abs(got[3] - want[3]) < 0.06 and got[3] > 0.7  # channels 0 and 1


def test_noise_filters_of_a_group_at_once_equal_each_alone(rng, monkeypatch):
    """spectrum_roots batches the filters of residuals of one spectrum shape (in runs of ROOTS_AT_ONCE);
    each is the one spectrum_root gives its residual alone, and a smaller residual keeps its own."""
    import indeed_cli.tasks.adaptation.recorrupted as R

    residuals = [
        rng.normal(0, 0.1, (3, 96, 80)),
        _coloured_noise(rng, n=1, size=128)[0],
        rng.normal(0, 0.2, (3, 40, 48)),
    ]
    residuals.append(residuals[1] * 0.5)
    monkeypatch.setattr(R, "ROOTS_AT_ONCE", 2)
    roots = R.spectrum_roots(residuals, 32)
    for r, root in zip(residuals, roots):
        alone = spectrum_root(noise_spectrum(r), 32)
        assert root.shape == alone.shape == (32, 32, 3, 3)
        torch.testing.assert_close(root, alone, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(roots[1], roots[3])  # the filters are each residual's own


def test_noise_filters_solve_their_eigenproblems_in_bounded_runs(rng, monkeypatch):
    """spectrum_root hands the eigensolver at most EIGH_AT_ONCE of its C x C problems per call (a GPU's
    batched solver ran out of memory on a whole OAG group's), and the filters are those of one call."""
    import indeed_cli.tasks.adaptation.recorrupted as R

    spectra = torch.stack([noise_spectrum(rng.normal(0, 0.1, (3, 64, 64))) for _ in range(3)])
    whole = R.spectrum_root(spectra, 32)  # 3 x 32 x 32 = 3072 problems, under the default bound
    sizes = []
    eigh = torch.linalg.eigh
    monkeypatch.setattr(torch.linalg, "eigh", lambda a: sizes.append(a.shape[0]) or eigh(a))
    monkeypatch.setattr(R, "EIGH_AT_ONCE", 1000)
    split = R.spectrum_root(spectra, 32)
    assert sizes == [1000, 1000, 1000, 72]
    torch.testing.assert_close(split, whole)
    # a device without room for a run: that run and the rest go in halves, and the filters are the same
    sizes.clear()

    def tight(a):
        if a.shape[0] > 400:
            raise torch.OutOfMemoryError("no room")
        sizes.append(a.shape[0])
        return eigh(a)

    monkeypatch.setattr(torch.linalg, "eigh", tight)
    halved = R.spectrum_root(spectra, 32)
    assert max(sizes) <= 400 and sum(sizes) == 3072 and sizes[0] == 250
    torch.testing.assert_close(halved, whole)
    monkeypatch.setattr(torch.linalg, "eigh", lambda a: (_ for _ in ()).throw(torch.OutOfMemoryError("none")))
    with pytest.raises(torch.OutOfMemoryError):
        R.spectrum_root(spectra, 32)


def test_recorrupted_copies_have_independent_noises_when_z_matches_the_noise(rng):
    """Eq. (recorrupted pair): cov(n + a z, n - z / a) = cov(n) - cov(z) = 0, per pixel and at lag 1."""
    n = torch.from_numpy(_coloured_noise(rng, n=64, size=64)).float()
    root = spectrum_root(noise_spectrum(n[0].numpy()), 64)
    z = correlated_noise(root[None].repeat(64, 1, 1, 1, 1), torch.Generator().manual_seed(1))
    noisier, target = recorrupted_pair(torch.zeros_like(n) + n, z, 0.5)
    a, b = noisier.numpy(), target.numpy()
    same = (a * b).mean() / np.sqrt((a**2).mean() * (b**2).mean())
    lag = (a[..., 1:] * b[..., :-1]).mean() / np.sqrt((a**2).mean() * (b**2).mean())
    assert abs(same) < 0.08 and abs(lag) < 0.08
    # with a z of twice the noise's level they are clearly dependent: the test can fail
    a2, b2 = (t.numpy() for t in recorrupted_pair(n, 2 * z, 0.5))
    assert abs((a2 * b2).mean() / np.sqrt((a2**2).mean() * (b2**2).mean())) > 0.3


def test_noise_gain_follows_the_noise_level_of_each_intensity(rng):
    """Eq. (signal-dependent noise): noise whose level grows with the intensity (0.02 to 0.12, as shot
    noise does) gives gains that follow that level, relative to its RMS; noise of one level gives ~1."""
    u = rng.random((3, 200, 300)).astype(np.float32)
    sd = 0.02 + 0.1 * u
    g = noise_gain(u, rng.standard_normal(u.shape).astype(np.float32) * sd).numpy()
    want = sd / np.sqrt((sd**2).mean(axis=(1, 2), keepdims=True))
    assert g.shape == u.shape and np.allclose((g**2).mean(axis=(1, 2)), 1, atol=1e-4)
    assert np.median(np.abs(g / want - 1)) < 0.03  # within the bins; the extremes are held constant
    assert np.corrcoef(g.ravel(), want.ravel())[0, 1] > 0.99
    flat = noise_gain(u, rng.normal(0, 0.05, u.shape).astype(np.float32)).numpy()
    assert np.abs(flat - 1).max() < 0.1
    # a small image is one bin: one level
    assert torch.allclose(noise_gain(u[:, :4, :4], u[:, :4, :4]), torch.ones(3, 4, 4))


def test_recorruption_levels_of_many_images_are_each_images_own(rng, monkeypatch):
    """The level maps are made for all images at once (by size, in chunks): each is its image's own
    noise_gain, and an image the gate refused has none."""
    from indeed_cli.tasks.adaptation import runner

    monkeypatch.setattr(runner, "GATE_PIXELS", 2 * 32 * 32)  # two 32 x 32 images per call
    images = [rng.random((3, 32, 32)).astype(np.float32) for _ in range(4)] + [
        rng.random((3, 16, 48)).astype(np.float32)
    ]
    gated = [(k != 1, 0.5, rng.normal(0, 0.01 * (k + 1), im.shape).astype(np.float32)) for k, im in enumerate(images)]
    levels = runner.recorruption_levels(images, gated, "cpu")
    assert levels[1] is None
    for k in (0, 2, 3, 4):
        np.testing.assert_array_equal(levels[k], noise_gain(images[k] - gated[k][2], gated[k][2]).numpy())


@pytest.mark.parametrize("noise", ["signal", "stationary"])
def test_recorruption_noise_level_follows_the_intensity_of_each_tile(rng, noise):
    """The evaluation noise of a recorrupted job: with ``recorruption_noise="signal"`` each tile's z has
    the level of the image's noise at that tile's intensity; "stationary" gives every tile one level."""
    from indeed_cli.tasks.adaptation.recorrupted import ALPHA
    from indeed_cli.tasks.adaptation.runner import _recorrupted_job, recorrupted_settings

    levels = {0.1: 0.01, 0.4: 0.03, 0.7: 0.06, 0.9: 0.1}  # band intensity: its noise's sigma
    clean = np.repeat(np.array(list(levels), np.float32), 32)[None, None, :].repeat(128, 1).repeat(3, 0)
    sd = np.repeat(np.array(list(levels.values()), np.float32), 32)[None, None, :]
    n = (rng.standard_normal(clean.shape) * sd).astype(np.float32)
    cfg = recorrupted_settings(AdaptConfig(objective="recorrupted", recorruption_noise=noise, eval_tiles=16))
    job, admitted, _ = _recorrupted_job(_ckpt(), [clean + n], [(True, 0.5, n)], cfg, 32)
    Y = (job["eval"] + ALPHA**2 * job["target"]) / (1 + ALPHA**2)  # the tiles the noise was added to
    z = (job["eval"] - job["target"]) / (ALPHA + 1 / ALPHA)
    band = Y.mean(dim=(1, 2, 3)).numpy()
    want = np.array([levels[min(levels, key=lambda k: abs(k - b))] for b in band])
    ratio = z.square().mean(dim=(1, 2, 3)).sqrt().numpy() / want
    if noise == "signal":
        assert np.all((ratio > 0.75) & (ratio < 1.3)), ratio
    else:  # one level (the RMS over the image) everywhere: far too strong on the dark band
        assert ratio[want == 0.01].min() > 3


def _ckpt(c=3):
    m = tiny_model(c)
    return Checkpoint(m, m.cfg, {}, {}, "tiny")


def _gate_readout(monkeypatch, readout):
    """Let the gate's pixel-shuffled read-out of images ``ys`` be ``readout(ys)`` (an untrained model's is
    no denoiser): its residuals and their correlations as shuffled_residuals computes them."""
    from indeed_cli.inference.decomposition import removed_noise_correlation
    from indeed_cli.tasks.adaptation import runner

    def residuals(ck, ys, stride, *a, keep_on_device=False):
        wrap = torch.from_numpy if keep_on_device else np.asarray
        return [(wrap(y - x), removed_noise_correlation(y, x)) for y, x in zip(ys, readout(ys))]

    monkeypatch.setattr(runner, "shuffled_residuals", residuals)


def _clean(c=3, size=64):
    return (0.5 + 0.1 * np.sin(np.arange(size) / 5)[None, :, None] * np.ones((c, size, size))).astype(np.float32)


def _noisy(rng, c=3, size=64):
    return [np.clip(_clean(c, size) + _coloured_noise(rng, 1, size)[0][:c], 0, 1).astype(np.float32)]


@pytest.mark.parametrize("objective", ["recorrupted", "auto"])
def test_recorrupted_adaptation_changes_only_f_theta_s_and_records_itself(rng, objective, monkeypatch):

    # an untrained model's pixel-shuffled read-out is no denoiser: let it return the clean image, so
    # that the noise estimate is the noise itself
    _gate_readout(monkeypatch, lambda ys: [_clean() for _ in ys])
    ck = _ckpt()
    cfg = AdaptConfig(
        objective=objective,
        lr=1e-2,
        decide="always" if objective == "auto" else None,
        max_change=1e-9,
    )
    res = adapt_each(ck, [_noisy(rng)], cfg, tile=32)[0]
    before, after = ck.model.state_dict(), res.checkpoint.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if not k.startswith("sparse."))
    # on this noise the validation loss falls: the recorrupted weights are kept (auto: after the ELBO
    # kept its start, its trust region being ~0)
    assert res.objective == "recorrupted" and res.best_step > 0
    assert res.checkpoint.training["adapted"]["objective"] == "recorrupted"
    losses = {h["step"]: h["loss"] for h in res.history}
    assert losses[res.best_step] == min(losses.values()) < losses[0]
    assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("sparse."))
    facts = res.recorrupted
    assert facts["stop"] == "steps" and facts["best_step"] == res.best_step and facts["correlation"][0] >= 0.3
    # auto: the ELBO's first change over its residual stays with the result; recorrupted alone: no ELBO ran
    assert (res.first_change_ratio is None) == (objective == "recorrupted")
    assert objective == "recorrupted" or res.first_change_ratio > 0
    # the noise drawn has the level of the noise added (sigma 0.05: 12.75 grey levels)
    assert facts["noise_sigma"] == pytest.approx(12.75, rel=0.25)


def test_refused_recorruption_leaves_the_elbo_result_and_says_why(rng, monkeypatch):
    """White noise: the gate refuses; the ELBO's result stays, with the gate's correlation."""

    _gate_readout(monkeypatch, lambda ys: [np.full_like(y, 0.5) for y in ys])
    white = [np.clip(0.5 + rng.normal(0, 0.05, (3, 64, 64)), 0, 1).astype(np.float32)]
    cfg = AdaptConfig(objective="auto", decide="always", max_change=1e-9)
    res = adapt_each(_ckpt(), [white], cfg, tile=32)[0]
    assert res.best_step == 0 and res.objective == "elbo"
    assert res.recorrupted["stop"] == "uncorrelated noise" and abs(res.recorrupted["correlation"][0]) < 0.3


def test_recorrupted_adaptation_of_a_gray_model(rng, monkeypatch):

    _gate_readout(monkeypatch, lambda ys: [_clean(1) for _ in ys])
    ck = _ckpt(1)
    res = adapt_each(ck, [_noisy(rng, c=1)], AdaptConfig(objective="recorrupted", lr=1e-2), tile=32)[0]
    assert res.objective == "recorrupted" and res.best_step > 0
    assert res.checkpoint.model(torch.zeros(1, 1, 32, 32)).mu_S.shape == (1, 1, 32, 32)


def test_elbo_objective_never_runs_the_recorrupted_one(rng, monkeypatch):
    from indeed_cli.tasks.adaptation import runner

    monkeypatch.setattr(runner, "adapt_recorrupted", lambda *a, **k: pytest.fail("recorrupted adaptation ran"))
    cfg = AdaptConfig(objective="elbo", max_change=1e-9, decide="always")  # the ELBO keeps the start
    res = adapt_each(_ckpt(), [_noisy(rng)], cfg, tile=32)[0]
    assert res.best_step == 0 and res.objective == "elbo"


def test_gate_admits_correlated_noise_and_refuses_white_noise(rng, monkeypatch):
    """Eq. (recorruption gate) on read-outs that return the clean image: its residual is the noise."""
    from indeed_cli.inference import decomposition as D
    from indeed_cli.tasks.adaptation import runner

    clean = np.full((3, 64, 64), 0.5, np.float32)
    calls = []
    monkeypatch.setattr(D, "_plain_batch", lambda ck, ys, *a, **k: [clean for _ in ys])
    monkeypatch.setattr(D, "shuffled_readouts", lambda ck, ys, *a, **k: calls.append(len(ys)) or [clean for _ in ys])
    coloured = clean + _coloured_noise(rng, 1, 64)[0].astype(np.float32)
    white = clean + rng.normal(0, 0.05, clean.shape).astype(np.float32)
    (ok, correlation, residual), refused = runner.recorruption_gates(_ckpt(), [coloured, white])
    assert ok and correlation > 0.4 and np.allclose(residual, np.clip(coloured, 0, 1) - clean, atol=1e-7)
    assert not refused[0]
    calls.clear()
    monkeypatch.setattr(runner, "GATE_PIXELS", 2 * 64 * 64)  # read-outs of at most two images together
    again = runner.recorruption_gates(_ckpt(), [coloured, white, coloured])
    assert calls == [2, 1] and [g[:2] for g in again] == [(ok, correlation), refused[:2], (ok, correlation)]


def test_recorrupted_adaptation_is_the_same_with_its_maps_on_the_host(rng, monkeypatch):
    """Images above GATE_PIXELS (AG on a large folder) keep the gate's residuals and level maps on the host:
    the adaptation is the one made with them on the device."""
    from indeed_cli.tasks.adaptation import runner

    _gate_readout(monkeypatch, lambda ys: [_clean() for _ in ys])
    images = [_noisy(rng), _noisy(rng)]
    cfg = AdaptConfig(objective="recorrupted", steps=3, lr=1e-3)
    assert runner.fits_on_device([im for ims in images for im in ims])
    on_device = adapt_each(_ckpt(), images, cfg, tile=32)
    monkeypatch.setattr(runner, "GATE_PIXELS", 64 * 64)  # one image at a time, nothing kept on the device
    assert not runner.fits_on_device([im for ims in images for im in ims])
    on_host = adapt_each(_ckpt(), images, cfg, tile=32)
    for a, b in zip(on_device, on_host):
        assert a.best_step == b.best_step > 0 and a.history == b.history
        for (n, p), (_, q) in zip(a.checkpoint.model.named_parameters(), b.checkpoint.model.named_parameters()):
            assert torch.equal(p, q), n


def test_pixel_chunks_keep_the_order_and_the_bound():
    from indeed_cli.tasks.adaptation.runner import _pixel_chunks

    ims = [np.zeros((3, h, w)) for h, w in [(10, 10), (10, 10), (20, 20), (5, 5), (10, 10)]]
    chunks = _pixel_chunks(ims, 250)
    assert [[im.shape[1] for im in c] for c in chunks] == [[10, 10], [20], [5, 10]]  # 400 > 250: alone
    assert [id(im) for c in chunks for im in c] == [id(im) for im in ims]


def test_ag_recorrupted_adapts_once_for_the_images_its_gate_admits(rng, monkeypatch):
    """InDeedAG with objective "recorrupted": one adaptation; adapted_images marks the images whose
    pixel-shuffled residual is correlated (the white-noise image is left out)."""
    from indeed_cli.tasks.adaptation import adapt

    _gate_readout(monkeypatch, lambda ys: [_clean() for _ in ys])
    white = np.clip(_clean() + rng.normal(0, 0.05, (3, 64, 64)), 0, 1).astype(np.float32)
    cfg = AdaptConfig(objective="recorrupted", lr=1e-3)
    res = adapt(_ckpt(), [_noisy(rng)[0], white, _noisy(rng)[0]], cfg, tile=32)
    assert res.objective == "recorrupted" and res.best_step > 0
    assert res.adapted_images == [True, False, True]
    assert [c >= 0.3 for c in res.recorrupted["correlation"]] == [True, False, True]


def test_ag_learning_rate_default_follows_the_objective(monkeypatch):
    from indeed_cli.tasks.adaptation import adapt, runner
    from indeed_cli.tasks.adaptation.config import AG_LR, R2R_LR

    monkeypatch.setattr(runner, "adapt_each", lambda ck, sets, cfg, tile, log: [cfg])
    assert AG_LR != R2R_LR
    assert adapt(None, [], AdaptConfig(objective="recorrupted")).lr == R2R_LR
    assert adapt(None, [], AdaptConfig(objective="elbo")).lr == AG_LR
    assert adapt(None, [], AdaptConfig(objective="recorrupted", lr=1e-4)).lr == 1e-4


def test_recorruption_noise_defaults_per_mode_and_is_checked(monkeypatch):
    """AG draws noise of one level per image, OAG noise whose level follows the intensity, unless told."""
    from indeed_cli.tasks.adaptation import adapt, runner
    from indeed_cli.tasks.adaptation.config import OAG_DEFAULTS, with_defaults

    monkeypatch.setattr(runner, "adapt_each", lambda ck, sets, cfg, tile, log: [cfg])
    assert adapt(None, [], AdaptConfig(objective="recorrupted")).recorruption_noise == "stationary"
    assert adapt(None, [], AdaptConfig(objective="recorrupted", recorruption_noise="signal")).recorruption_noise == (
        "signal"
    )
    assert with_defaults(AdaptConfig(), OAG_DEFAULTS).recorruption_noise == "signal"
    with pytest.raises(ValueError, match="recorruption_noise"):
        AdaptConfig(recorruption_noise="poisson").check()


def test_tiles_and_owners_name_the_image_each_tile_was_cut_from(rng):
    from indeed_cli.tasks.adaptation.runner import tiles_and_owners, tiles_of

    images = [np.full((1, 64, 64), k, np.float32) + rng.random((1, 64, 64), np.float32) * 0.1 for k in range(3)]
    for max_tiles in (12, 5):  # all tiles, and a random subset
        tiles, owners = tiles_and_owners(images, 32, max_tiles, torch.Generator().manual_seed(0))
        assert len(tiles) == len(owners) == min(12, max_tiles)
        assert torch.equal(tiles.floor().flatten(1).amin(1).long(), owners)  # image k holds values in [k, k + 0.1)
        assert torch.equal(tiles, tiles_of(images, 32, max_tiles, torch.Generator().manual_seed(0)))


def test_objective_is_checked():
    with pytest.raises(ValueError, match="objective"):
        AdaptConfig(objective="r2r").check()


@pytest.mark.parametrize("grouped_convolutions", [False, True])
def test_grouped_recorrupted_adaptations_match_separate_ones(rng, monkeypatch, grouped_convolutions):
    """OAG groups the recorrupted adaptations as it groups the ELBO's: each image gets what it gets
    alone (its own tiles, noise draws and kept step), the white-noise image the gate refuses too;
    under torch.vmap and as grouped convolutions (runner.GROUPED_RECORRUPTED)."""
    from dataclasses import replace

    from indeed_cli.tasks.adaptation import runner

    monkeypatch.setattr(runner, "GROUPED_RECORRUPTED", grouped_convolutions)

    clean = {}

    _gate_readout(monkeypatch, lambda ys: [clean[y.tobytes()] for y in ys])  # the images the noisy ones were made from
    images = []
    for k, sigma in enumerate([0.05, 0.08, 0.03]):
        base = (_clean() * (0.6 + 0.2 * k)).astype(np.float32)
        y = np.clip(base + _coloured_noise(rng, 1, 64, sigma)[0], 0, 1).astype(np.float32)
        clean[y.tobytes()] = base
        images.append(y)
    white = np.clip(_clean() + rng.normal(0, 0.05, (3, 64, 64)), 0, 1).astype(np.float32)
    clean[white.tobytes()] = _clean()
    images.append(white)
    cfg = AdaptConfig(objective="recorrupted", lr=3e-3, batch=4)
    ck = _ckpt()
    together = adapt_each(ck, [[y] for y in images], replace(cfg, group=3), tile=32)
    alone = [adapt_each(ck, [[y]], replace(cfg, group=1), tile=32)[0] for y in images]
    assert [r.recorrupted["stop"] for r in alone][-1] == "uncorrelated noise"
    assert sum(r.best_step > 0 for r in alone) >= 2  # the weights really moved
    for a, b in zip(together, alone):
        assert (a.best_step, a.objective, a.adapted_images) == (b.best_step, b.objective, b.adapted_images)
        np.testing.assert_allclose([h["loss"] for h in a.history], [h["loss"] for h in b.history], rtol=1e-4)
        assert a.recorrupted.keys() == b.recorrupted.keys()
        assert a.recorrupted.get("noise_sigma", 0) == pytest.approx(b.recorrupted.get("noise_sigma", 0), rel=1e-5)
        sa, sb = a.checkpoint.model.state_dict(), b.checkpoint.model.state_dict()
        assert all(torch.allclose(sa[k], sb[k], atol=1e-5) for k in sb)
    first, second = (together[i].checkpoint.model.state_dict() for i in (0, 1))
    assert any(not torch.equal(first[k], second[k]) for k in first if k.startswith("sparse."))


def test_grouped_entries_of_several_images_draw_each_tiles_noise_from_its_own_image(rng, monkeypatch):
    """Entries of several images grouped together: every tile's noise comes from the filter of the image
    it was cut from (the group's filters are stacked, so an entry's image indices are offset by the
    images of the entries before it), as when each entry adapts alone."""
    from dataclasses import replace

    clean = {}
    _gate_readout(monkeypatch, lambda ys: [clean[y.tobytes()] for y in ys])
    entries = []
    for k, sigmas in enumerate([(0.02, 0.09), (0.08, 0.03)]):
        entry = []
        for j, sigma in enumerate(sigmas):
            base = (_clean() * (0.5 + 0.2 * k + 0.1 * j)).astype(np.float32)
            y = np.clip(base + _coloured_noise(rng, 1, 64, sigma)[0], 0, 1).astype(np.float32)
            clean[y.tobytes()] = base
            entry.append(y)
        entries.append(entry)
    cfg = AdaptConfig(objective="recorrupted", lr=3e-3, batch=4)
    ck = _ckpt()
    together = adapt_each(ck, entries, replace(cfg, group=2), tile=32)
    alone = [adapt_each(ck, [entry], replace(cfg, group=1), tile=32)[0] for entry in entries]
    assert all(r.best_step > 0 for r in alone)
    for a, b in zip(together, alone):
        np.testing.assert_allclose([h["loss"] for h in a.history], [h["loss"] for h in b.history], rtol=1e-4)
        sa, sb = a.checkpoint.model.state_dict(), b.checkpoint.model.state_dict()
        assert all(torch.allclose(sa[k], sb[k], atol=1e-5) for k in sb)


def test_ag_auto_keeps_a_recorrupted_fallback_for_images_the_elbo_output_leaves(rng, monkeypatch):
    """InDeedAG with objective "auto": the ELBO's adaptation, and the recorrupted one on the same images
    as its fallback; per image (ag_image_result) the ELBO's output where the choice keeps it, else the
    fallback's where its gate admitted the image, else the plain model's."""
    from indeed_cli.tasks.adaptation import adapt, ag_image_result

    _gate_readout(monkeypatch, lambda ys: [_clean() for _ in ys])
    white = np.clip(_clean() + rng.normal(0, 0.05, (3, 64, 64)), 0, 1).astype(np.float32)
    images = [_noisy(rng)[0], white]
    ck = _ckpt()
    res = adapt(ck, images, AdaptConfig(objective="auto", lr=1e-3, max_change=0.0), tile=32)
    assert res.objective == "elbo" and res.best_step > 0 and res.adapted_images == [True, True]
    fb = res.fallback
    assert fb.objective == "recorrupted" and fb.best_step > 0 and fb.adapted_images == [True, False]
    sd = {n: t for n, t in fb.checkpoint.model.state_dict().items() if n.startswith("sparse.")}
    assert any(not torch.equal(t, res.checkpoint.model.state_dict()[n]) for n, t in sd.items())  # two adaptations
    y = images[0]
    kept, choice = ag_image_result(ck, res, y, True, None, 0.0, 0.0, fallback_used=True)  # no bound: ELBO kept
    assert kept is res and choice.adapted
    left, choice = ag_image_result(ck, res, y, True, None, 1e9, 0.0, fallback_used=True)  # ELBO output left
    assert left is fb and choice is None
    plain, choice = ag_image_result(ck, res, white, True, None, 1e9, 0.0, fallback_used=False)  # gate refused
    assert plain.best_step == 0 and plain.checkpoint is ck and not choice.adapted
    unused, choice = ag_image_result(ck, res, y, False, 0.5, 1e9, 0.0, fallback_used=False)
    assert unused.best_step == 0 and unused.adapted_images == [False] and choice is None
    # the ELBO alone (AG's default) has no fallback
    assert adapt(ck, images, AdaptConfig(objective="elbo", steps=2), tile=32).fallback is None


def test_recorrupted_tile_and_batch_settings_reach_its_job(rng, monkeypatch):
    from dataclasses import replace

    from indeed_cli.tasks.adaptation import runner

    _gate_readout(monkeypatch, lambda ys: [_clean() for _ in ys])
    seen = []
    job_of = runner._recorrupted_job

    def spy(ckpt, images, gated, cfg, tile, levels=None, roots=None):
        out = job_of(ckpt, images, gated, cfg, tile, levels, roots)
        seen.append((tile, out[0]["pool"].shape[-1], out[0]["batch"], out[0]["roots"].shape[1]))
        return out

    monkeypatch.setattr(runner, "_recorrupted_job", spy)
    cfg = AdaptConfig(objective="recorrupted", steps=2, lr=1e-3)
    adapt_each(_ckpt(), [_noisy(rng)], cfg, tile=32)
    monkeypatch.setattr(runner, "R2R_BATCH", 3)
    adapt_each(_ckpt(), [_noisy(rng)], replace(cfg, recorrupted_tile=16), tile=32)
    # unset: the ELBO's tile and AdaptConfig.batch (8, capped by the image's 4 tiles of 32); set: its
    # own tiles, noise filters and batch
    assert seen == [(32, 32, 4, 32), (16, 16, 3, 16)]
    from indeed_cli.tasks.adaptation import adapt, config

    monkeypatch.setattr(runner, "R2R_BATCH", None)
    monkeypatch.setattr(config, "CPU_OAG_RECORRUPTED_TILE", 16)
    seen.clear()
    adapt_each(_ckpt(), [_noisy(rng)], cfg, tile=32)  # OAG on a CPU: CPU_OAG_RECORRUPTED_TILE
    adapt(_ckpt(), _noisy(rng), cfg, tile=32)  # AG: the ELBO's tile
    adapt_each(_ckpt(), [_noisy(rng)], replace(cfg, recorrupted_tile=8), tile=32)  # as asked
    assert [t for t, *_ in seen] == [16, 32, 8] and [p for _, p, *_ in seen] == [16, 32, 8]
    assert config.recorrupted_tile_for(AdaptConfig(), "cuda", 128) == 128  # elsewhere: the ELBO's
    assert config.recorrupted_tile_for(AdaptConfig(), "cpu", 48) == 16
    with pytest.raises(ValueError, match="recorrupted_tile"):
        AdaptConfig(recorrupted_tile=-1).check()


def test_recorrupted_steps_scale_the_learning_rate_and_reach_the_loop(rng, monkeypatch):
    """Eq. (recorrupted steps): N steps at lr * R2R_REFERENCE_STEPS / N; the loop runs exactly N and evaluates
    the start and the last step only (config.R2R_EVAL_EVERY 0)."""
    from dataclasses import replace

    from indeed_cli.tasks.adaptation import config, runner

    ref = config.R2R_REFERENCE_STEPS
    assert config.recorrupted_steps_and_lr(AdaptConfig(lr=3e-5)) == (ref, 3e-5)
    assert config.recorrupted_steps_and_lr(AdaptConfig(lr=3e-5, recorrupted_steps=ref)) == (ref, 3e-5)
    steps, lr = config.recorrupted_steps_and_lr(AdaptConfig(lr=3e-5, recorrupted_steps=ref // 2))
    assert steps == ref // 2 and lr == pytest.approx(6e-5)
    _gate_readout(monkeypatch, lambda ys: [_clean() for _ in ys])
    seen = []
    loop = runner._adapt_group

    def spy(model, names, frozen, jobs, cfg, log):
        out = loop(model, names, frozen, jobs, cfg, log)
        seen.append((cfg.steps, cfg.lr, [h["step"] for h in out[0][1]]))
        return out

    monkeypatch.setattr(runner, "_adapt_group", spy)
    cfg = AdaptConfig(objective="recorrupted", lr=1e-3, recorrupted_steps=7)
    adapt_each(_ckpt(), [_noisy(rng)], cfg, tile=32)
    assert seen == [(7, pytest.approx(1e-3 * ref / 7), [0, 7])]
    with pytest.raises(ValueError, match="recorrupted_steps"):
        replace(cfg, recorrupted_steps=0).check()


def test_recorrupted_steps_by_mode_and_device():
    """Left unset, OAG's recorrupted steps are GPU_OAG_RECORRUPTED_STEPS off a CPU and the reference steps on
    one, at the rate Eq. (recorrupted steps) scales; AG's default sets its own on every device."""
    from dataclasses import replace

    from indeed_cli.tasks.adaptation import config
    from indeed_cli.tasks.adaptation.runner import recorrupted_settings

    ref, gpu = config.R2R_REFERENCE_STEPS, config.GPU_OAG_RECORRUPTED_STEPS
    assert gpu != ref
    oag = config.with_defaults(AdaptConfig(objective="recorrupted"), config.OAG_DEFAULTS)
    assert config.recorrupted_steps_and_lr(oag, "cpu") == (ref, config.OAG_LR)
    steps, lr = config.recorrupted_steps_and_lr(oag, "cuda")
    assert steps == gpu and lr == pytest.approx(config.OAG_LR * ref / gpu)
    on_gpu = recorrupted_settings(oag, torch.device("cuda"))  # no GPU needed: only the device's type is read
    assert on_gpu.steps == on_gpu.eval_every == gpu
    ag = config.with_defaults(AdaptConfig(objective="recorrupted"), config.AG_RECORRUPTED_DEFAULTS)
    for device in ("cpu", "cuda"):
        assert config.recorrupted_steps_and_lr(ag, device) == (config.AG_RECORRUPTED_STEPS, config.R2R_LR)
    assert config.recorrupted_steps_and_lr(replace(oag, recorrupted_steps=7), "cuda")[0] == 7


@pytest.mark.parametrize("sparse_input", ["residual", "residual+lowrank"])
def test_grouped_recorrupted_objective_equals_the_vmapped_one(rng, sparse_input):
    """K copies of f_thetaS as channels-last grouped convolutions give the vmapped objective, output
    and weight gradients of each copy (the runner's grouped recorrupted adaptation)."""
    from torch.func import vmap

    from indeed_cli.tasks.adaptation.objective import (
        adaptation_objective,
        grouped_objective_applies,
        grouped_recorrupted_objective,
        lowrank_factors,
    )

    model = tiny_model(sparse_input=sparse_input).requires_grad_(False)
    cfg = AdaptConfig(sample=False)
    names = [f"sparse.{n}" for n, _ in model.sparse.named_parameters()]
    assert grouped_objective_applies(model, names, cached=True, r2r=True)
    assert not grouped_objective_applies(model, names[:-1], cached=True, r2r=True)
    base = dict(model.named_parameters())
    K, n = 3, 2
    gen = torch.Generator().manual_seed(0)
    stacked = {  # each copy its own weights, so that a mixed-up group would show
        k: (base[k][None] + 0.05 * torch.randn(K, *base[k].shape, generator=gen)).requires_grad_(True) for k in names
    }
    frozen = {k: v for k, v in [*model.named_parameters(), *model.named_buffers()] if k not in names}
    Y = torch.from_numpy(rng.random((K, n, 3, 32, 32)).astype(np.float32))
    T = torch.from_numpy(rng.random((K, n, 3, 32, 32)).astype(np.float32))
    F = lowrank_factors(model, Y, cfg)
    f = vmap(lambda p, y, fa, t: adaptation_objective(model, p, frozen, y, cfg, False, fa, t), in_dims=(0, 0, 0, 0))
    obj_v, X_v = f(stacked, Y, F, T)
    grads_v = torch.autograd.grad(obj_v.sum(), list(stacked.values()))
    obj_g, X_g = grouped_recorrupted_objective(model, stacked, Y, F, T)
    grads_g = torch.autograd.grad(obj_g.sum(), list(stacked.values()))
    assert obj_g.shape == (K, n) and X_g.shape == Y.shape
    torch.testing.assert_close(obj_g, obj_v, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(X_g, X_v, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads_g, grads_v):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)


def _flat_scene(rng, size=128, block=16):
    """Blocks of constant colour (a flat scene), with noise of a luminance part l (the same in every
    channel, variance 4 s^2) and a chroma part c (independent per channel, variance s^2); the residual
    R = c + 0.6 l sees the chroma and a little of the luminance, as the gate's residual of real noise
    does, and the read-out Y - R keeps 0.4 l."""
    s = 0.02
    colours = rng.uniform(0.2, 0.8, (3, size // block, size // block))
    U = np.kron(colours, np.ones((block, block)))
    lum, chroma = 2 * s * rng.standard_normal((1, size, size)), s * rng.standard_normal((3, size, size))
    Y = U + lum + chroma
    R = chroma + 0.6 * lum
    return torch.from_numpy(Y), torch.from_numpy(R)


def test_flat_block_covariances_measure_the_noise_the_residual_missed(rng):
    """Over all blocks of a flat scene: Y's covariance about each block's mean is the whole noise's,
    R's is what R holds, and the read-out's variance over the first's trace is 0.4^2 of the luminance."""
    from indeed_cli.tasks.adaptation.recorrupted import flat_block_covariances

    Y, R = _flat_scene(rng)
    C_y, C_r, activity, _ = flat_block_covariances(Y, R, 16, 1.0)
    s2 = 0.02**2
    np.testing.assert_allclose(C_y.numpy(), 4 * s2 * np.ones((3, 3)) + s2 * np.eye(3), atol=0.08 * s2)
    np.testing.assert_allclose(C_r.numpy(), 0.36 * 4 * s2 * np.ones((3, 3)) + s2 * np.eye(3), atol=0.08 * s2)
    assert activity == pytest.approx(0.16 * 12 / 15, abs=0.01)  # var(0.4 l) x 3 over trace(C_y)
    # the chosen share: the blocks where the read-out varies least
    assert flat_block_covariances(Y, R, 16, 0.1)[2] < activity
    assert flat_block_covariances(Y[:, :8, :8], R[:, :8, :8], 16, 0.25) is None  # smaller than a block


def test_flat_block_recolour_gives_the_residual_the_flat_blocks_channel_covariance(rng):
    """W = chol(C_y) chol(C_r)^-1 maps the residual's covariance in the chosen blocks onto Y's
    (W C_r W^T = C_y).  Left as they are: a residual that holds all the noise (ratio 1), a textured
    image (the read-out varies in every block), a gray image."""
    from indeed_cli.tasks.adaptation.recorrupted import flat_block_covariances, flat_block_recolour

    Y, R = _flat_scene(rng)
    C_y, C_r, _, _ = flat_block_covariances(Y, R, 16, 0.1)
    out, changed = flat_block_recolour(Y, R)
    assert changed and out.shape == R.shape
    W = torch.linalg.lstsq(R.reshape(3, -1).T, out.reshape(3, -1).T).solution.T  # out = W R at every pixel
    torch.testing.assert_close(W @ C_r @ W.T, C_y, rtol=1e-6, atol=1e-12)
    C, h, w = Y.shape
    U = Y.reshape(C, h // 16, 16, w // 16, 16).mean((2, 4)).repeat_interleave(16, 1).repeat_interleave(16, 2)
    assert not flat_block_recolour(Y, Y - U)[1]  # nothing missed
    texture = Y + torch.from_numpy(0.2 * rng.standard_normal((1, h, w)))  # gray texture in every block
    assert not flat_block_recolour(texture, R)[1]
    gray, changed = flat_block_recolour(Y[:1], R[:1])
    assert not changed and torch.equal(gray, R[:1])


def test_the_gate_recolours_the_residuals_it_admits(rng, monkeypatch):
    from indeed_cli.tasks.adaptation import runner
    from indeed_cli.tasks.adaptation.recorrupted import flat_block_recolour

    Y, R = _flat_scene(rng)
    y, r = Y.float().numpy(), R.float().numpy()
    _gate_readout(monkeypatch, lambda ys: [y - r for _ in ys])
    ck = _ckpt()
    monkeypatch.setattr(runner, "R2R_MIN_CORRELATION", -1.0)  # admitted (the residual here is white)
    monkeypatch.setattr(runner, "R2R_MIN_FLAT_CORRELATION", -1.0)
    ((ok, _, got),) = runner.recorruption_gates(ck, [y], keep_on_device=False)
    want, changed = flat_block_recolour(torch.from_numpy(y), torch.from_numpy(y - (y - r)))
    assert ok and changed
    np.testing.assert_allclose(got, want.numpy(), atol=1e-7)
    assert not np.allclose(got, r, atol=1e-3)
    monkeypatch.setattr(runner, "FLAT_RECOLOUR", False)
    ((_, _, got),) = runner.recorruption_gates(ck, [y], keep_on_device=False)
    np.testing.assert_allclose(got, r, atol=1e-7)
    monkeypatch.setattr(runner, "FLAT_RECOLOUR", True)
    monkeypatch.setattr(runner, "R2R_MIN_CORRELATION", 2.0)  # refused: its residual is not used, left as it is
    ((ok, _, got),) = runner.recorruption_gates(ck, [y], keep_on_device=False)
    assert not ok
    np.testing.assert_allclose(got, r, atol=1e-7)


def test_the_gate_reads_the_correlation_where_the_image_is_flat_too(rng, monkeypatch):
    """Eq. (recorruption gate), second condition: white noise on a textured image whose read-out lost part
    of the texture leaves a residual correlated over the image (the texture) but not in its flattest
    blocks; correlated noise is correlated in both and stays admitted."""
    from indeed_cli.tasks.adaptation import runner

    size = 64
    texture = 0.1 * np.sin(np.arange(size) / 1.5)[None, None, :] * np.ones((3, size, 1))
    texture[:, :, : size // 2] = 0  # the left half is flat
    clean = 0.5 + texture
    white = (clean + rng.normal(0, 0.02, clean.shape)).astype(np.float32)
    coloured = (clean + _coloured_noise(rng, 1, size, sigma=0.02)[0]).astype(np.float32)
    readout = (0.5 + 0.5 * texture).astype(np.float32)  # half the texture lost: the flat half varies least
    _gate_readout(monkeypatch, lambda ys: [readout for _ in ys])
    (w_ok, w_corr, _), (c_ok, c_corr, _) = runner.recorruption_gates(_ckpt(), [white, coloured], keep_on_device=False)
    assert min(w_corr, c_corr) >= runner.R2R_MIN_CORRELATION  # both pass the whole image's condition
    assert c_ok and not w_ok
    monkeypatch.setattr(runner, "R2R_MIN_FLAT_CORRELATION", -1.0)
    assert runner.recorruption_gates(_ckpt(), [white], keep_on_device=False)[0][0]  # the flat blocks decided


def test_flat_block_correlation_skips_clipped_blocks(rng):
    """A saturated sky is the flattest part of a photograph and holds no noise: the correlation is read
    in the flattest blocks without clipped pixels, and an image clipped everywhere has none."""
    from indeed_cli.tasks.adaptation.recorrupted import flat_block_correlation, flat_blocks

    size = 64
    noise = _coloured_noise(rng, 1, size, sigma=0.02)[0]
    Y = np.clip(0.5 + noise, 0, 1)
    Y[:, : size // 2] = 1.0  # the top half clipped white
    R = np.where(Y >= 1.0, 0.0, noise)
    Y, R = torch.from_numpy(Y), torch.from_numpy(R)
    assert float(flat_blocks(Y, R, 16, 0.1)[0].mean()) == 1.0  # ranked by flatness alone: the clipped sky
    assert flat_block_correlation(Y, R) > 0.3
    assert flat_block_correlation(torch.ones(3, 64, 64), torch.zeros(3, 64, 64)) is None


def test_flat_block_recolour_reads_noise_kept_by_the_read_out_but_not_smooth_detail(rng):
    """Flat blocks where the read-out varies a little more than FLAT_MAX_ACTIVITY allows: recoloured
    with ``noise_like`` where that variation is white (lag-2 correlation about 0: noise the read-out
    kept), not where it is smooth grey detail of the same variance."""
    from indeed_cli.tasks.adaptation.recorrupted import flat_block_covariances, flat_block_recolour

    s, size = 0.02, 128
    U = np.kron(rng.uniform(0.2, 0.8, (3, 8, 8)), np.ones((16, 16)))
    lum, chroma = 2 * s * rng.standard_normal((1, size, size)), s * rng.standard_normal((3, size, size))
    Y, R = torch.from_numpy(U + lum + chroma), torch.from_numpy(chroma + 0.45 * lum)  # the read-out keeps 0.55 l
    _, _, activity, lag2 = flat_block_covariances(Y, R, 16, 0.1)
    assert 0.2 < activity < 0.3 and abs(lag2) < 0.1
    assert not flat_block_recolour(Y, R, noise_like=None)[1] and flat_block_recolour(Y, R, noise_like=(0.3, 0.2))[1]
    # the same split, with smooth grey detail of the luminance noise's variance in its place
    yy, xx = np.mgrid[0:size, 0:size]
    detail = 2 * s * np.sqrt(2) * np.sin(2 * np.pi * (xx + 2 * yy) / 24)[None]
    Yd, Rd = torch.from_numpy(U + detail + chroma), torch.from_numpy(chroma + 0.45 * detail)
    _, _, activity_d, lag2_d = flat_block_covariances(Yd, Rd, 16, 0.1)
    assert activity_d == pytest.approx(activity, abs=0.05) and lag2_d > 0.5
    assert not flat_block_recolour(Yd, Rd, noise_like=(0.3, 0.2))[1]


def test_lag_correlation_of_white_smooth_and_alternating_images(rng):
    from indeed_cli.tasks.adaptation.recorrupted import lag_correlation

    white = torch.from_numpy(rng.standard_normal((1, 96, 96)))
    assert abs(lag_correlation(white, 3)) < 0.05
    ramp = torch.linspace(0, 1, 96, dtype=torch.float64).expand(1, 96, 96) + torch.linspace(0, 1, 96)[:, None]
    assert lag_correlation(ramp, 3) > 0.9
    diff = white[..., 3:] - white[..., :-3]  # w(x + 3) - w(x) along rows: -0.5 there, 0 down the columns
    assert lag_correlation(diff, 3) == pytest.approx(-0.25, abs=0.04)


def test_gray_luminance_recolour_adds_the_missing_grey_variance(rng):
    """Eq. (gray-luminance recolouring): R keeps its spatial structure and takes the gray model's
    luminance variance along the grey direction, where that is larger and not detail-like."""
    from indeed_cli.tasks.adaptation.recorrupted import gray_luminance_recolour

    n = rng.standard_normal((3, 64, 64))
    grey = 0.1 * rng.standard_normal((1, 64, 64))
    chroma = torch.from_numpy((np.stack([n[0] - n[1], n[1] - n[2], n[2] - n[0]]) + grey) * 0.02)  # little luminance
    lum = torch.from_numpy(0.03 * rng.standard_normal((1, 64, 64)))
    out, changed = gray_luminance_recolour(chroma, lum)
    assert changed
    mean = out.mean((1, 2), keepdim=True)
    assert float((out - mean).mean(0).square().mean()) == pytest.approx(float((lum - lum.mean()).square().mean()))
    # the added variance is grey: the channel differences vary as R's did
    for i, j in ((0, 1), (1, 2), (0, 2)):
        assert float((out[i] - out[j]).var()) == pytest.approx(float((chroma[i] - chroma[j]).var()), rel=1e-6)
    assert not gray_luminance_recolour(chroma, 1e-4 * lum)[1]  # R already holds that much luminance
    detail = lum[..., 3:] - lum[..., :-3]  # anti-correlated at lag 3, as the detail lost at stride 3 is
    assert not gray_luminance_recolour(chroma[..., 3:], detail)[1]
    assert gray_luminance_recolour(chroma[..., 3:], detail, min_lag3=-1.0)[1]
    assert not gray_luminance_recolour(chroma[:1], lum)[1]  # gray images: nothing to recolour


def test_gate_takes_the_gray_models_luminance_where_the_flat_blocks_left_r(monkeypatch, rng):
    """recorruption_gates: with GRAY_LUMINANCE, an admitted colour image that the flat-block rule left
    alone gets the gray model's luminance residual's variance; without it, R as read out."""
    import indeed_cli.tasks.adaptation.runner as runner

    image = rng.random((3, 48, 48)).astype(np.float32)
    R = (0.01 * rng.standard_normal((3, 48, 48))).astype(np.float32)
    r = (0.05 * rng.standard_normal((1, 48, 48))).astype(np.float32)

    def readouts(ckpt, images, stride, opts=None, keep_on_device=False):
        got = r if stride == runner.GRAY_LUMINANCE_STRIDE else R
        return [(torch.from_numpy(got) if keep_on_device else got, 0.5) for _ in images]

    monkeypatch.setattr(runner, "shuffled_residuals", readouts)
    monkeypatch.setattr(runner, "_gray_model", lambda device: object())
    monkeypatch.setattr(runner, "FLAT_RECOLOUR", False)
    monkeypatch.setattr(runner, "R2R_MIN_FLAT_CORRELATION", -1.0)  # R here is white: admitted all the same
    m = tiny_model(3)
    ckpt = Checkpoint(m, m.cfg, {}, {}, "tiny")
    monkeypatch.setattr(runner, "GRAY_LUMINANCE", False)
    ((admitted, _, plain),) = runner.recorruption_gates(ckpt, [image], keep_on_device=False)
    assert admitted and np.array_equal(plain, R)
    monkeypatch.setattr(runner, "GRAY_LUMINANCE", True)
    ((_, _, raised),) = runner.recorruption_gates(ckpt, [image], keep_on_device=False)
    assert raised.mean(0).var() == pytest.approx(r.var(), rel=1e-3)
    monkeypatch.setattr(runner, "_gray_model", lambda device: None)  # no gray model: R as read out
    ((_, _, kept),) = runner.recorruption_gates(ckpt, [image], keep_on_device=False)
    assert np.array_equal(kept, R)


def test_robust_noise_level_is_the_rms_of_noise_and_below_it_where_the_residual_holds_detail(rng):
    """Eq. (robust noise level): Gaussian noise whose level follows the intensity gives about its RMS
    (the count-weighted mean square of the bins' median-based scales); sparse large values (detail lost
    at edges) raise the RMS far more than the level; the scale on R is min(1, level / RMS)."""
    from indeed_cli.tasks.adaptation.recorrupted import robust_level_scale, robust_noise_level

    x = rng.uniform(0, 1, (3, 128, 128))
    noise = rng.standard_normal((3, 128, 128)) * (0.01 + 0.04 * x)  # signal-dependent
    rms = float(np.sqrt(np.mean(noise**2)))
    assert robust_noise_level(x, noise) == pytest.approx(rms, rel=0.03)
    detail = noise.copy()
    edge = rng.uniform(size=noise.shape) < 0.05
    detail[edge] += 0.5 * rng.choice([-1, 1], size=int(edge.sum()))
    level = robust_noise_level(x, detail)
    assert level < 1.15 * rms < float(np.sqrt(np.mean(detail**2))) / 2
    # the scale reads intensities off Y - R, and never raises R
    assert robust_level_scale(x + detail, detail) == pytest.approx(level / float(np.sqrt(np.mean(detail**2))))
    assert robust_level_scale(x + noise, 0.5 * rng.standard_normal((3, 128, 128)) ** 3) < 1.0
    assert robust_level_scale(x, np.zeros_like(x)) == 1.0
    tiny = np.full((3, 4, 4), 0.5)  # fewer pixels than bins: one pixel a bin
    assert robust_level_scale(tiny + 0.01, np.full((3, 4, 4), 0.01)) == pytest.approx(1.0)


def _gate_rms_and_scaled(monkeypatch, y, r, level):
    """recorruption_gates on one image whose pixel-shuffled read-out is y - r, every gate condition open
    and no recolouring: (admitted, the rms residual, the residual at ``level``)."""
    from indeed_cli.tasks.adaptation import runner

    _gate_readout(monkeypatch, lambda ys: [y - r for _ in ys])
    monkeypatch.setattr(runner, "R2R_MIN_CORRELATION", -1.0)
    monkeypatch.setattr(runner, "R2R_MIN_FLAT_CORRELATION", -1.0)
    monkeypatch.setattr(runner, "FLAT_RECOLOUR", False)
    ck = _ckpt()
    ((ok, _, plain),) = runner.recorruption_gates(ck, [y], keep_on_device=False)
    ((_, _, scaled),) = runner.recorruption_gates(ck, [y], keep_on_device=False, level=level)
    return ok, plain, scaled


def test_the_gate_scales_admitted_residuals_to_the_robust_level(rng, monkeypatch):
    """recorruption_gates(level="robust"): an admitted image's residual is the rms gate's times
    robust_level_scale (after the recolouring); a refused image's is left as it is; AdaptConfig checks
    the name."""
    from indeed_cli.tasks.adaptation import runner
    from indeed_cli.tasks.adaptation.recorrupted import robust_level_scale

    y = rng.uniform(0.2, 0.8, (3, 64, 64)).astype(np.float32)
    r = (0.02 * rng.standard_normal((3, 64, 64)) ** 3).astype(np.float32)  # heavy-tailed: scale < 1
    ok, plain, scaled = _gate_rms_and_scaled(monkeypatch, y, r, "robust")
    s = robust_level_scale(y, plain)
    assert ok and s < 0.9
    np.testing.assert_allclose(scaled, s * plain, rtol=1e-6)
    monkeypatch.setattr(runner, "R2R_MIN_CORRELATION", 2.0)  # refused
    ((ok, _, left),) = runner.recorruption_gates(_ckpt(), [y], keep_on_device=False, level="robust")
    assert not ok
    np.testing.assert_allclose(left, r, atol=1e-7)
    with pytest.raises(ValueError, match="recorruption_level"):
        AdaptConfig(recorruption_level="median").check()


def test_quiet_level_scale_reads_the_noise_of_the_quieter_blocks(rng):
    """Eq. (quiet-block noise level): signal-dependent noise alone, white or correlated, gives a scale of
    about 1 (the quantile of a draw of the same noise divides out the spread of the blocks' variances);
    detail added to a third of the blocks raises R's RMS but leaves the level of the quiet blocks, so
    scale * RMS(R) stays near the noise's RMS; clipped blocks (no noise) are left out; too few usable
    blocks, under half of them usable, or R = 0 give 1."""
    from indeed_cli.tasks.adaptation.recorrupted import quiet_level_scale

    x = np.repeat(np.linspace(0.2, 0.8, 128)[None, None, :], 128, 1).repeat(3, 0)  # a smooth ramp
    x = x + 0.05 * np.sin(np.arange(128) / 9.0)[None, :, None]
    noise = rng.standard_normal((3, 128, 128)) * (0.01 + 0.03 * x)  # its level follows the intensity
    rms = float(np.sqrt(np.mean(noise**2)))
    assert quiet_level_scale(x + noise, noise) > 0.98
    # demosaicked-like noise, correlated over a few pixels: its block variances spread more
    white = rng.standard_normal((3, 130, 130))
    smooth = sum(white[:, i : i + 128, j : j + 128] for i in range(3) for j in range(3)) / 3.0
    corr = smooth * (0.01 + 0.03 * x)
    assert quiet_level_scale(x + corr, corr) > 0.97
    assert quiet_level_scale(x + corr, corr, seed=1) == pytest.approx(quiet_level_scale(x + corr, corr), abs=0.03)
    detail = noise.copy()
    blocks = rng.permutation(64)[:21]  # a third of the 16 x 16 blocks hold strong texture
    for b in blocks:
        i, j = divmod(int(b), 8)
        detail[:, 16 * i : 16 * i + 16, 16 * j : 16 * j + 16] += 0.2 * rng.standard_normal((3, 16, 16))
    r_rms = float(np.sqrt(np.mean(detail**2)))
    assert r_rms > 2.5 * rms
    level = quiet_level_scale(x + detail, detail) * r_rms
    assert level == pytest.approx(rms, rel=0.15)
    # half the image clipped white with nothing left in R there: those blocks are not counted
    y, r = x + noise, detail.copy()
    y[:, :64], r[:, :64] = 1.0, 0.0
    assert quiet_level_scale(y, r) < 0.6
    assert quiet_level_scale(y, r, max_clipped=1.0) < 0.1  # counted, the quiet blocks would be the clipped ones
    y[:, :80], r[:, :80] = 1.0, 0.0  # under half the blocks usable: R's own level
    assert quiet_level_scale(y, r) == 1.0
    assert quiet_level_scale(x, np.zeros_like(x)) == 1.0
    small = x[:, :32, :32]  # 4 blocks of 16 x 16, fewer than QUIET_MIN_BLOCKS
    assert quiet_level_scale(small + noise[:, :32, :32], noise[:, :32, :32] * 5) == 1.0


def test_quiet_level_scale_of_a_large_image_draws_noise_for_a_sample_of_its_blocks(rng, monkeypatch):
    """Above QUIET_DRAW_BLOCKS blocks the pure-noise quantile q(z) of Eq. (quiet-block noise level) comes
    from that many usable blocks drawn at random, each with a noise block of its own: noise alone still
    keeps its level, detail is still read down to the noise's, and below the bound nothing changes."""
    from indeed_cli.tasks.adaptation import recorrupted
    from indeed_cli.tasks.adaptation.recorrupted import quiet_level_scale

    x = np.repeat(np.linspace(0.2, 0.8, 256)[None, None, :], 256, 1).repeat(3, 0)
    white = rng.standard_normal((3, 258, 258))
    noise = sum(white[:, i : i + 256, j : j + 256] for i in range(3) for j in range(3)) / 3.0 * (0.01 + 0.03 * x)
    detail = noise.copy()
    detail[:, :96] += 0.1 * rng.standard_normal((3, 96, 256))  # detail in the top 6 of 16 block rows
    whole = [quiet_level_scale(x + a, a) for a in (noise, detail)]
    monkeypatch.setattr(recorrupted, "QUIET_DRAW_BLOCKS", 64)  # 256 blocks: the sampled path
    sampled = [quiet_level_scale(x + a, a) for a in (noise, detail)]
    assert sampled[0] > 0.97 and whole[0] > 0.97
    rms = float(np.sqrt(np.mean(noise**2)))
    assert sampled[1] * float(np.sqrt(np.mean(detail**2))) == pytest.approx(rms, rel=0.15)
    assert sampled[1] == pytest.approx(whole[1], abs=0.05)
    monkeypatch.setattr(recorrupted, "QUIET_DRAW_BLOCKS", 256)  # at the bound: the whole-shape draw
    assert quiet_level_scale(x + detail, detail) == whole[1]


def test_the_gate_scales_admitted_residuals_to_the_quiet_level(rng, monkeypatch):
    """recorruption_gates(level="quiet"): an admitted image's residual is the rms gate's times
    quiet_level_scale; the setting is checked, and is not the default."""
    from indeed_cli.tasks.adaptation.recorrupted import quiet_level_scale

    y = rng.uniform(0.2, 0.8, (3, 64, 64)).astype(np.float32)
    r = (0.01 * rng.standard_normal((3, 64, 64))).astype(np.float32)
    r[:, :32, :32] += (0.2 * rng.standard_normal((3, 32, 32))).astype(np.float32)  # detail in a quarter
    ok, plain, scaled = _gate_rms_and_scaled(monkeypatch, y, r, "quiet")
    s = quiet_level_scale(y, plain)
    assert ok and s < 0.5
    np.testing.assert_allclose(scaled, s * plain, rtol=1e-6)
    AdaptConfig(recorruption_level="quiet").check()
    assert AdaptConfig().recorruption_level == "rms"


def test_images_too_small_for_the_pixel_shuffle_are_refused_by_the_gate_not_an_error(rng, monkeypatch):
    """The gate's read-out is pixel-shuffled (stride 2): an image under 4 pixels on a side has no such
    read-out. The gate refuses it, with no correlation, and judges the others as it would alone; OAG and AG
    on such images keep the ELBO's result instead of raising (`indeed adapt` on a 3 x 3 image failed)."""
    from indeed_cli.tasks.adaptation import adapt, runner

    _gate_readout(monkeypatch, lambda ys: [_clean() if y.shape[-1] == 64 else y for y in ys])
    big, tiny = _noisy(rng)[0], rng.random((3, 3, 3)).astype(np.float32)
    alone = runner.recorruption_gates(_ckpt(), [big], keep_on_device=False)
    mixed = runner.recorruption_gates(_ckpt(), [tiny, big, rng.random((3, 2, 40)).astype(np.float32)], False)
    assert mixed[0] == (False, None, None) and mixed[2] == (False, None, None)
    assert mixed[1][:2] == alone[0][:2] and alone[0][0]
    cfg = AdaptConfig(objective="auto", steps=2, eval_every=1, decide="always")
    (res,) = adapt_each(_ckpt(), [[tiny]], cfg, tile=32)
    assert res.best_step == 0 and res.recorrupted["correlation"] == [None]
    folder = adapt(_ckpt(), [big, tiny], AdaptConfig(objective="recorrupted", steps=2, lr=1e-3))
    assert folder.adapted_images == [True, False] and folder.recorrupted["correlation"][1] is None
    monkeypatch.undo()  # the real read-outs, whose pixel shuffle raises for such an image
    (res,) = adapt_each(_ckpt(), [[tiny]], cfg, tile=32)
    assert res.best_step == 0 and res.recorrupted["correlation"] == [None]
