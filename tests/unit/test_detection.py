"""Synthetic anomalies, detection metrics against brute force, and detect training end to end."""

import numpy as np
import pytest
import torch

from indeed_cli.metrics import auroc, average_precision
from indeed_cli.tasks.detection import gaussian_blur, image_score
from indeed_cli.tasks.detection.synthesis import AnomalyConfig, perlin, synthesize


def test_synthesis_is_exact_deterministic_and_local():
    x = torch.rand(12, 1, 64, 64) * 0.5 + 0.25
    tex = [torch.randint(0, 256, (3, 80, 90), dtype=torch.uint8)]
    Y, UA, M = synthesize(x, torch.Generator().manual_seed(3), tex)
    Y2, _, _ = synthesize(x, torch.Generator().manual_seed(3), tex)
    assert torch.equal(Y, Y2)
    assert torch.allclose(Y, x + UA)
    assert (UA * (1 - M)).abs().max() == 0  # nothing changes outside the mask
    assert 0 <= Y.min() and Y.max() <= 1
    cover = M.flatten(1).mean(1)
    assert (cover == 0).any() and (cover > 0).sum() >= 6  # some normal patches, mostly anomalous ones


def test_subtle_preset_adds_faint_soft_edged_anomalies():
    from indeed_cli.tasks.detection.synthesis import PRESETS

    x = torch.rand(48, 1, 64, 64) * 0.5 + 0.25
    Y, UA, M = synthesize(x, torch.Generator().manual_seed(5), None, PRESETS["subtle"])
    Y2, _, _ = synthesize(x, torch.Generator().manual_seed(5), None, PRESETS["subtle"])
    assert torch.equal(Y, Y2) and torch.allclose(Y, x + UA)
    assert (UA * (M == 0)).abs().max() == 0  # nothing changes where the mask is zero
    soft = ((M > 0.05) & (M < 0.95)).flatten(1).float().mean(1)
    assert (soft > 0.02).sum() >= 5  # several anomalies with gradual edges
    _, _, M_strong = synthesize(x, torch.Generator().manual_seed(5), None, PRESETS["strong"])
    assert ((M_strong > 0) & (M_strong < 1)).sum() == 0  # the strong preset keeps hard masks


def test_surface_preset_adds_bands_and_other_surfaces():
    from indeed_cli.tasks.detection.synthesis import PRESETS, band_mask, filtered

    # each patch a constant level: a fill from another patch is recognisable by its value
    x = torch.linspace(0.2, 0.8, 32).view(32, 1, 1, 1).expand(32, 1, 48, 48).contiguous()
    Y, UA, M = synthesize(x, torch.Generator().manual_seed(2), None, PRESETS["surface"])
    Y2, _, _ = synthesize(x, torch.Generator().manual_seed(2), None, PRESETS["surface"])
    assert torch.equal(Y, Y2) and torch.allclose(Y, x + UA) and 0 <= Y.min() and Y.max() <= 1
    assert (UA * (M == 0)).abs().max() == 0
    # some anomaly fills a whole side (a band or a large blob) and some patch took another's level
    full_side = [
        (M[i, 0, 0] > 0.99).all()
        or (M[i, 0, -1] > 0.99).all()
        or (M[i, 0, :, 0] > 0.99).all()
        or (M[i, 0, :, -1] > 0.99).all()
        for i in range(32)
    ]
    assert sum(full_side) >= 2
    core = M[:, 0] > 0.99
    foreign = [
        core[i].any() and not torch.isclose(Y[i, 0][core[i]].mean(), x[i, 0, 0, 0], atol=1e-3) and UA[i].abs().max() > 0
        for i in range(32)
    ]
    assert sum(foreign) >= 3
    b = band_mask((40, 40), torch.Generator().manual_seed(0), "cpu")
    assert set(b.unique().tolist()) <= {0.0, 1.0} and 0.05 < b.mean() < 0.8
    tex = torch.rand(3, 1, 32, 32)
    f = filtered(tex, torch.Generator().manual_seed(1))
    assert f.shape == tex.shape and not torch.allclose(f, tex)


def only(kind: str, **kw) -> AnomalyConfig:
    """The ``defects`` preset drawing one kind of anomaly on every patch."""
    from dataclasses import replace

    from indeed_cli.tasks.detection.synthesis import PRESETS

    kinds = ("p_texture", "p_cutpaste", "p_intensity", "p_other", "p_filter")
    kinds += ("p_illumination", "p_poisson", "p_crack", "p_break")
    return replace(PRESETS["defects"], normal_prob=0.0, **{k: float(k == kind) for k in kinds}, **kw)


@pytest.mark.parametrize("kind", ["p_illumination", "p_poisson", "p_crack", "p_break"])
def test_defect_kinds_are_seeded_exact_and_local(kind):
    x = torch.rand(8, 1, 64, 64) * 0.5 + 0.25
    Y, UA, M = synthesize(x, torch.Generator().manual_seed(4), None, only(kind))
    Y2, _, M2 = synthesize(x, torch.Generator().manual_seed(4), None, only(kind))
    assert torch.equal(Y, Y2) and torch.equal(M, M2)
    assert torch.allclose(Y, x + UA) and 0 <= Y.min() and Y.max() <= 1
    assert (UA * (M == 0)).abs().max() == 0  # nothing changes where the mask is zero
    assert (M.flatten(1).amax(1) > 0.5).all()  # every patch got one
    Y3, _, _ = synthesize(x, torch.Generator().manual_seed(5), None, only(kind))
    assert not torch.equal(Y, Y3)


def test_illumination_is_large_and_soft_edged():
    x = torch.full((8, 1, 96, 96), 0.5)
    _, UA, M = synthesize(x, torch.Generator().manual_seed(1), None, only("p_illumination"))
    assert (M.flatten(1).mean(1) > 0.02).all()  # regions, not specks
    step = torch.maximum(
        (M[..., 1:, :] - M[..., :-1, :]).abs().amax((-2, -1)), (M[..., 1:] - M[..., :-1]).abs().amax((-2, -1))
    )
    assert (step < 0.35).all()  # feathered over several pixels: no hard edge
    assert (UA.abs().flatten(1).amax(1) > 0.01).sum() >= 6  # and visible on most patches


def test_cracks_and_breaks_are_thin_or_at_the_side_and_dark():
    x = torch.rand(8, 1, 64, 64) * 0.5 + 0.25
    Y, UA, M = synthesize(x, torch.Generator().manual_seed(2), None, only("p_crack"))
    assert (M.flatten(1).mean(1) < 0.08).all()  # thin curves
    assert (UA[M > 0.5] < 0).float().mean() > 0.95  # darker than the surface
    Y, UA, M = synthesize(x, torch.Generator().manual_seed(2), None, only("p_break"))
    assert (UA[M > 0.5] < 0).float().mean() > 0.95
    sides = torch.stack([M[:, 0, 0].amax(1), M[:, 0, -1].amax(1), M[:, 0, :, 0].amax(1), M[:, 0, :, -1].amax(1)])
    assert (sides.amax(0) > 0.5).all()  # every chip touches a side of the patch


def test_cracks_preset_adds_cracks_and_breaks_that_strong_lacks():
    from indeed_cli.tasks.detection.synthesis import PRESETS

    x = torch.rand(128, 1, 64, 64, generator=torch.Generator().manual_seed(0)) * 0.5 + 0.25

    def darkened(cfg):
        """Patches whose anomaly scales the surface by one factor < 0.6 (a crack or a break; a
        scratch shifts it by a constant instead, a texture or cut-paste replaces it)."""
        Y, UA, M = synthesize(x, torch.Generator().manual_seed(6), None, cfg)
        assert torch.allclose(Y, x + UA) and (UA * (M == 0)).abs().max() == 0
        out = []
        for i in range(len(x)):
            core = M[i] == 1
            if core.sum() >= 3:
                ratio = Y[i][core] / x[i][core]
                out.append(bool(ratio.std() < 1e-4 and ratio.mean() < 0.6))
        return sum(out)

    assert darkened(PRESETS["strong"]) == 0
    assert darkened(PRESETS["cracks"]) >= 4  # about 12% of the 96 anomalous patches


def test_poisson_blend_against_closed_forms():
    from indeed_cli.tasks.detection.synthesis import poisson_blend

    g = torch.Generator().manual_seed(0)
    target = torch.rand(2, 1, 64, 64, generator=g)
    mask = torch.zeros(2, 1, 64, 64)
    mask[:, :, 16:48, 20:44] = 1
    # a source that differs from the target by a constant (or any harmonic function: a plane) has
    # the target's gradients: the blend gives back the target
    yy, xx = torch.meshgrid(torch.arange(64.0), torch.arange(64.0), indexing="ij")
    plane = 0.3 + 0.01 * yy - 0.004 * xx
    out = poisson_blend(target, target + plane, mask)
    assert (out - target).abs().max() < 5e-3
    # a textured source: its gradients inside, the target outside and on the boundary
    source = torch.rand(2, 1, 64, 64, generator=g)
    out = poisson_blend(target, source, mask)
    assert torch.equal(out[mask == 0], target[mask == 0])
    inner = out[:, :, 18:46, 22:42] - source[:, :, 18:46, 22:42]
    lap = (
        inner[..., 1:-1, 1:-1] * 4
        - inner[..., :-2, 1:-1]
        - inner[..., 2:, 1:-1]
        - inner[..., 1:-1, :-2]
        - inner[..., 1:-1, 2:]
    )
    assert lap.abs().max() < 0.02  # out - source is harmonic inside the mask


def test_normal_only_config_gives_no_anomaly():
    x = torch.rand(4, 1, 32, 32)
    Y, UA, M = synthesize(x, torch.Generator().manual_seed(0), None, AnomalyConfig(normal_prob=1.0))
    assert torch.equal(Y, x) and M.sum() == 0


def test_perlin_range_and_smoothness():
    n = perlin((64, 64), 4, torch.Generator().manual_seed(1), "cpu")
    assert n.abs().max() <= 1.5 and n.std() > 0.1
    assert (n[1:] - n[:-1]).abs().max() < 0.3  # continuous at pixel scale


def brute_auroc(s, y):
    pos, neg = s[y], s[~y]
    return ((pos[:, None] > neg[None]).sum() + 0.5 * (pos[:, None] == neg[None]).sum()) / (len(pos) * len(neg))


def brute_ap(s, y):
    ap, prev_r = 0.0, 0.0
    for t in np.unique(s)[::-1]:
        pred = s >= t
        p, r = (pred & y).sum() / pred.sum(), (pred & y).sum() / y.sum()
        ap += (r - prev_r) * p
        prev_r = r
    return ap


def test_metrics_match_brute_force():
    rng = np.random.default_rng(0)
    s = np.round(rng.random(300), 1)
    y = rng.random(300) < 0.2 + 0.5 * s
    assert auroc(s, y) == pytest.approx(brute_auroc(s, y))
    assert average_precision(s, y) == pytest.approx(brute_ap(s, y))
    assert auroc(np.r_[0.1, 0.9], np.r_[False, True]) == 1.0


def test_image_scores_against_direct_computation():
    from indeed_cli.model import Checkpoint, ModelConfig
    from indeed_cli.tasks.detection import score_kind

    m = np.arange(200, dtype=np.float32).reshape(10, 20) / 200
    assert image_score(m) == pytest.approx(np.sort(m.ravel())[-10:].mean())  # top 5% of 200 pixels = 10
    assert image_score(m, "max_g4") == pytest.approx(gaussian_blur(m, 4).max())
    with pytest.raises(ValueError):
        image_score(m, "median")
    # pool21: the largest mean over 21 x 21 windows (windows cut at the border average what they hold)
    big = np.random.default_rng(0).random((30, 40)).astype(np.float32)
    direct = max(big[max(0, y - 10) : y + 11, max(0, x - 10) : x + 11].mean() for y in range(30) for x in range(40))
    assert image_score(big, "pool21") == pytest.approx(direct, rel=1e-5)
    # the score a threshold was learned on: stored name; legacy calibrated detectors max_g4; else the
    # default, top5, whatever the map
    sparse_cfg = ModelConfig(channels=1, task="detect")
    support_cfg = ModelConfig(channels=1, task="detect", support_width=8)
    ck = lambda extra, cfg=sparse_cfg: Checkpoint(None, cfg, {}, extra, "x")
    assert score_kind(ck({"detect": {"threshold": 0.1, "score_kind": "top5"}})) == "top5"
    assert score_kind(ck({"detect": {"threshold": 0.1}})) == "max_g4"
    assert score_kind(ck({})) == "top5"
    assert score_kind(ck({}, support_cfg)) == "top5"


def test_blur_keeps_mass_and_score_finds_the_blob():
    m = np.zeros((40, 60), np.float32)
    m[10:14, 30:34] = 1
    b = gaussian_blur(m, 2)
    assert b.sum() == pytest.approx(m.sum(), rel=1e-4)
    assert image_score(m) > image_score(np.zeros_like(m))


def test_multiscale_readout_is_the_mean_of_the_scaled_maps():
    from conftest import tiny_model

    from indeed_cli.inference import sparse_mean
    from indeed_cli.model import Checkpoint
    from indeed_cli.tasks.detection import anomaly_map_from_sparse, calibrate, detect, readout_scales, resize

    model = tiny_model(1, task="detect")
    ck = Checkpoint(model, model.cfg, {}, {}, "x")
    img = np.random.default_rng(0).random((1, 45, 61)).astype(np.float32)
    assert readout_scales(ck) == (1.0,)
    one = detect(ck, img)
    assert np.allclose(one.anomaly_map, anomaly_map_from_sparse(sparse_mean(ck, img)))
    ck2 = Checkpoint(ck.model, ck.config, {"scales": [1.0, 0.5]}, {}, "x")
    assert readout_scales(ck2) == (1.0, 0.5)
    two = detect(ck2, img)
    half = anomaly_map_from_sparse(sparse_mean(ck2, np.clip(resize(img, (22, 30)), 0, 1)))
    expect = (one.anomaly_map + resize(half[None], (45, 61))[0]) / 2
    assert two.anomaly_map.shape == (45, 61) and np.allclose(two.anomaly_map, expect, atol=1e-6)
    from indeed_cli.tasks.detection import scale_maps

    per = scale_maps(ck2, img)
    assert per.shape == (2, 45, 61) and np.allclose(per[1], resize(half[None], (45, 61))[0], atol=1e-6)
    assert two.score == pytest.approx(image_score(expect), rel=1e-5)
    facts = calibrate(ck2, [img, img * 0.5])
    assert facts["scales"] == [1.0, 0.5] and facts["score_kind"] == "top5"
    assert facts["threshold"] == pytest.approx(np.quantile([two.score, detect(ck2, img * 0.5).score], 0.99))
    ck3 = Checkpoint(ck.model, ck.config, {"scales": [1.0, 0.5]}, {"detect": {"scales": [0.5]}}, "x")
    assert readout_scales(ck3) == (0.5,)  # the calibrated scales win over the training pyramid


def test_support_focal_loss_against_direct_computation():
    import torch.nn.functional as F

    from indeed_cli.model.posteriors import support_focal_loss, support_target

    logit = torch.tensor([[[[2.0, -1.0], [0.0, -4.0]]]])
    z = torch.tensor([[[[1.0, 0.0], [0.5, 1.0]]]])
    p = torch.sigmoid(logit)
    direct = -(z * (1 - p) ** 2 * torch.log(p) + (1 - z) * p**2 * torch.log(1 - p)).sum()
    assert support_focal_loss(logit, z).item() == pytest.approx(direct.item(), rel=1e-6)
    # gamma = 0 is the binary cross-entropy
    bce = F.binary_cross_entropy_with_logits(logit, z, reduction="sum")
    assert support_focal_loss(logit, z, gamma=0.0).item() == pytest.approx(bce.item(), rel=1e-6)
    # an anomaly that barely changes the image is not in the support
    mask = torch.zeros(2, 1, 8, 8)
    mask[:, :, 2:6, 2:6] = 1
    U_A = torch.zeros(2, 1, 8, 8)
    U_A[0] = 0.1 * mask[0]
    U_A[1] = 0.001 * mask[1]
    z = support_target(mask, U_A)
    assert torch.equal(z[0], mask[0]) and z[1].sum() == 0


def test_support_module_reads_l_and_s_without_changing_them():
    from conftest import tiny_model

    from indeed_cli.model.posteriors import support_focal_loss

    plain = tiny_model(1, task="detect")
    model = tiny_model(1, task="detect", support_width=8, support_levels=4)
    assert model.cfg.multiple == 16 and plain.cfg.multiple == 8 and plain.support is None
    Y = torch.rand(2, 1, 32, 48)
    d = model(Y, sample=True)
    assert d.support_logit.shape == (2, 1, 32, 48) and plain(Y).support_logit is None
    support_focal_loss(d.support_logit, torch.zeros(2, 1, 32, 48)).sum().backward()
    assert all(p.grad is None for m in (model.lowrank, model.sparse) for p in m.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.support.parameters())
    with pytest.raises(ValueError, match="detection"):
        tiny_model(1, task="denoise", support_width=8)


def test_support_detector_maps_its_posterior():
    from conftest import tiny_model

    from indeed_cli.inference import support_probability
    from indeed_cli.model import Checkpoint
    from indeed_cli.tasks.detection import calibrate, detect, resize

    model = tiny_model(1, task="detect", support_width=8)
    ck = Checkpoint(model, model.cfg, {"scales": [1.0, 0.5]}, {}, "x")
    img = np.random.default_rng(0).random((1, 45, 61)).astype(np.float32)
    p1 = support_probability(ck, img)
    assert p1.shape == (45, 61) and 0 <= p1.min() and p1.max() <= 1
    half = support_probability(ck, np.clip(resize(img, (22, 30)), 0, 1))
    expect = (p1 + resize(half[None], (45, 61))[0]) / 2
    det = detect(ck, img)
    assert np.allclose(det.anomaly_map, expect, atol=1e-6)
    assert det.score == pytest.approx(image_score(expect), rel=1e-5)
    facts = calibrate(ck, [img, img * 0.5])
    assert facts["score_kind"] == "top5" and facts["map"].startswith("q(z = 1)")
    # a gray detector on a colour image: each channel a gray image, their probabilities averaged
    rgb = np.random.default_rng(1).random((3, 40, 56)).astype(np.float32)
    per = [support_probability(ck, c[None]) for c in rgb]
    assert np.allclose(support_probability(ck, rgb), np.mean(per, 0), atol=1e-6)


def test_image_pyramid_and_mirror_padding_match_the_tiler():
    from indeed_cli.inference import reflect_index
    from indeed_cli.tasks.training import image_pyramid
    from indeed_cli.tasks.training import pad_to as _pad_to

    ims = [torch.randint(0, 256, (1, 30, 41), dtype=torch.uint8)]
    pyr = image_pyramid(ims, (1.0, 0.5))
    assert [tuple(p.shape) for p in pyr] == [(1, 30, 41), (1, 15, 20)] and pyr[0] is ims[0]
    small = pyr[1]
    padded = _pad_to(small, 48)  # more than twice the width: repeated reflection
    assert padded.shape == (1, 48, 48)
    assert torch.equal(padded[0], small[0][reflect_index(np.arange(48), 15)][:, reflect_index(np.arange(48), 20)])
    assert torch.equal(_pad_to(ims[0], 16), ims[0])  # large enough: unchanged


def test_support_read_out_on_the_whole_image():
    from conftest import tiny_model

    import indeed_cli.inference.decomposition as D
    from indeed_cli.inference import InferenceOptions, support_probability
    from indeed_cli.model import Checkpoint

    model = tiny_model(1, task="detect", support_width=8)
    ck = Checkpoint(model, model.cfg, {}, {}, "x")
    img = np.random.default_rng(2).random((1, 64, 64)).astype(np.float32)
    # one tile without overlap or padding: tiles and the whole image are the same computation
    one = InferenceOptions(tile=64, overlap=0)
    whole = support_probability(ck, img, one)
    tiled = support_probability(ck, img, InferenceOptions(tile=64, overlap=0, whole_image=False))
    np.testing.assert_allclose(whole, tiled, atol=1e-6)
    # a larger image: f_thetaS and f_thetaM see it whole (no seams), so the tiled read-out differs
    big = np.random.default_rng(3).random((1, 90, 150)).astype(np.float32)
    w = support_probability(ck, big, InferenceOptions(tile=32, overlap=8))
    t = support_probability(ck, big, InferenceOptions(tile=32, overlap=8, whole_image=False))
    assert w.shape == t.shape == (90, 150) and 0 <= w.min() and w.max() <= 1 and not np.allclose(w, t, atol=1e-4)
    # above WHOLE_IMAGE_PIXELS the default falls back to tiles
    old = D.WHOLE_IMAGE_PIXELS
    try:
        D.WHOLE_IMAGE_PIXELS = 90 * 150 - 1
        np.testing.assert_array_equal(support_probability(ck, big, InferenceOptions(tile=32, overlap=8)), t)
    finally:
        D.WHOLE_IMAGE_PIXELS = old


def test_detect_ensemble_averages_the_maps_of_flips_and_rotations_turned_back():
    from conftest import tiny_model

    from indeed_cli.inference import InferenceOptions, dihedral, n_tiles
    from indeed_cli.model import Checkpoint
    from indeed_cli.tasks.detection import calibrate, detect, detect_tiles, readout_ensemble, scale_maps

    model = tiny_model(1, task="detect", support_width=8)
    ck = Checkpoint(model, model.cfg, {"scales": [1.0, 0.5]}, {}, "x")
    img = np.random.default_rng(0).random((1, 45, 61)).astype(np.float32)
    assert readout_ensemble(ck) == 1
    maps = [dihedral(scale_maps(ck, dihedral(img, k)).mean(0)[None], k, inverse=True)[0] for k in range(4)]
    assert maps[1].shape == (45, 61) and not np.allclose(maps[0], maps[1])  # a turned read-out differs
    for n in (2, 4):
        det = detect(ck, img, ensemble=n)
        assert np.allclose(det.anomaly_map, np.mean(maps[:n], 0), atol=1e-6)
        assert det.score == pytest.approx(image_score(np.mean(maps[:n], 0)), rel=1e-5)
    with pytest.raises(ValueError, match="ensemble"):
        detect(ck, img, ensemble=3)
    # the threshold is learned for the ensemble it names, and the detector then reads out with it
    facts = calibrate(ck, [img, img * 0.5], ensemble=2)
    assert facts["ensemble"] == 2 and calibrate(ck, [img])["ensemble"] == 1
    calibrated = Checkpoint(model, model.cfg, ck.training, {"detect": facts}, "x")
    assert readout_ensemble(calibrated) == 2
    assert np.array_equal(detect(calibrated, img).anomaly_map, detect(ck, img, ensemble=2).anomaly_map)
    assert np.array_equal(detect(calibrated, img, ensemble=1).anomaly_map, detect(ck, img).anomaly_map)
    # progress: each transform reads as many tiles as the image
    opts = InferenceOptions(tile=16, overlap=4)
    assert detect_tiles(ck, 45, 61, opts, (1.0,)) == n_tiles(45, 61, opts) == n_tiles(61, 45, opts)
    assert detect_tiles(ck, 45, 61, opts, (1.0, 0.5), 4) == 4 * detect_tiles(ck, 45, 61, opts, (1.0, 0.5))


def test_detector_with_members_maps_the_mean_of_its_members_maps():
    """docs/model.md Eq. (member mean): each member at its own scales, ``scales`` replacing the first's;
    the threshold is learned on the mean and progress counts every member's tiles."""
    from conftest import tiny_model

    from indeed_cli.inference import InferenceOptions
    from indeed_cli.model import Checkpoint
    from indeed_cli.tasks.detection import calibrate, detect, detect_tiles, scale_maps, with_members

    nets = [tiny_model(1, seed=s, task="detect", support_width=8) for s in (1, 2)]
    a = Checkpoint(nets[0], nets[0].cfg, {"scales": [1.0, 0.5]}, {}, "a")
    b = Checkpoint(nets[1], nets[1].cfg, {"scales": [0.5]}, {}, "b")
    pair = with_members(a, [b])
    img = np.random.default_rng(4).random((1, 45, 61)).astype(np.float32)
    own = [scale_maps(a, img).mean(0), scale_maps(b, img, scales=(0.5,)).mean(0)]
    assert not np.allclose(own[0], own[1], atol=1e-3)
    det = detect(pair, img)
    assert np.allclose(det.anomaly_map, (own[0] + own[1]) / 2, atol=1e-6)
    assert det.score == pytest.approx(image_score((own[0] + own[1]) / 2), rel=1e-5)
    first_at_1 = scale_maps(a, img, scales=(1.0,)).mean(0)
    assert np.allclose(detect(pair, img, scales=(1.0,)).anomaly_map, (first_at_1 + own[1]) / 2, atol=1e-6)
    facts = calibrate(pair, [img, img * 0.5])
    assert facts["map"].endswith("mean over 2 members") and facts["scales"] == [1.0, 0.5]
    opts = InferenceOptions(tile=16, overlap=4)
    assert detect_tiles(pair, 45, 61, opts) == detect_tiles(a, 45, 61, opts) + detect_tiles(b, 45, 61, opts)
