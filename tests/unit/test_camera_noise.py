"""The camera noise model: seeded, levels in the promised ranges, signal through unchanged without
noise, noise that is correlated between neighbours unlike AWGN."""

import numpy as np
import pytest

from indeed_cli.metrics import psnr
from indeed_cli.tasks.camera_noise import LEVELS, camera_pair, parse_noise


@pytest.fixture
def image():
    """A smooth colour image with an edge: in the cameras' gamut, as photographs mostly are."""
    y, x = np.mgrid[0:96, 0:128] / 128.0
    img = np.stack([0.2 + 0.5 * x, 0.3 + 0.4 * y, 0.6 - 0.3 * x * y]).astype(np.float32)
    img[:, 40:60, 50:90] *= 0.5
    return img


def test_seeded_and_levels_ordered(image):
    a, ref = camera_pair(image, "medium", seed=3)
    b, _ = camera_pair(image, "medium", seed=3)
    c, _ = camera_pair(image, "medium", seed=4)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c) and a.dtype == np.float32 and a.shape == image.shape
    snr = {lv: np.mean([psnr(camera_pair(image, lv, seed=s)[0], ref) for s in range(4)]) for lv in LEVELS}
    assert snr["light"] > snr["medium"] > snr["heavy"]
    assert 33 < snr["light"] < 45 and 17 < snr["heavy"] < 27


def test_without_noise_the_pipeline_returns_the_image(image):
    _, ref = camera_pair(image, "heavy", seed=0)
    assert psnr(ref, image) > 45  # only 8-bit rounding (and colours outside a camera's gamut) differ
    noisy, ref_gray = camera_pair(image[:1], "light", seed=0)
    assert noisy.shape == ref_gray.shape == (1, 96, 128)


def test_noise_is_correlated_between_neighbours_unlike_awgn(image):
    noisy, ref = camera_pair(image, "heavy", seed=1)
    n = (noisy - ref)[1]
    corr = np.corrcoef(n[:, :-1].ravel(), n[:, 1:].ravel())[0, 1]
    assert corr > 0.15  # the demosaic spreads each raw pixel's noise over its neighbours
    noisy_j, _ = camera_pair(image, "heavy", seed=1, jpeg=True)
    assert not np.array_equal(noisy_j, noisy)


def test_noise_spec_parsing():
    assert parse_noise("camera:heavy") == ("heavy", False, "bilinear")
    assert parse_noise("camera:light+jpeg") == ("light", True, "bilinear")
    assert parse_noise("camera:heavy+mhc") == ("heavy", False, "mhc")
    assert parse_noise("camera:medium+mhc+jpeg") == parse_noise("camera:medium+jpeg+mhc") == ("medium", True, "mhc")
    for bad in ("camera", "camera:huge", "gauss:light", "camera:light+png", "camera:light+jpeg+jpeg", "camera:+mhc"):
        with pytest.raises(ValueError):
            parse_noise(bad)
    with pytest.raises(ValueError, match="demosaic"):
        camera_pair(np.zeros((3, 8, 8), np.float32), "light", demosaic="vng")


def test_malvar_he_cutler_demosaic_keeps_linear_images_and_correlates_the_channels():
    """Malvar-He-Cutler interpolation is exact on a linear image away from the border, and it spreads
    a raw pixel's noise into all three channels: white raw noise comes out positively correlated
    between channels, where the bilinear demosaic leaves the channels independent."""
    import torch

    from indeed_cli.tasks.camera_noise import _demosaic, _demosaic_mhc, _mosaic

    yy, xx = torch.meshgrid(
        torch.arange(16.0, dtype=torch.float64), torch.arange(20.0, dtype=torch.float64), indexing="ij"
    )
    ramp = torch.stack([0.2 + 0.01 * xx, 0.5 - 0.01 * yy, 0.3 + 0.02 * yy + 0.005 * xx])
    torch.testing.assert_close(_demosaic_mhc(_mosaic(ramp))[:, 2:-2, 2:-2], ramp[:, 2:-2, 2:-2])
    torch.testing.assert_close(_demosaic_mhc(_mosaic(ramp[None]))[0], _demosaic_mhc(_mosaic(ramp)))  # batched
    white = torch.randn(128, 128, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    mhc, bilinear = (np.corrcoef(f(white).reshape(3, -1).numpy()) for f in (_demosaic_mhc, _demosaic))
    assert mhc[np.triu_indices(3, 1)].min() > 0.4 and np.abs(bilinear[np.triu_indices(3, 1)]).max() < 0.05


def test_camera_noise_with_the_malvar_demosaic(image):
    """The same draws through the other demosaic: the same noiseless reference, a different noisy
    image, and noise whose red and blue channels go together (bilinear: nearly independent)."""
    noisy, ref = camera_pair(image, "heavy", seed=1)
    noisy_m, ref_m = camera_pair(image, "heavy", seed=1, demosaic="mhc")
    np.testing.assert_array_equal(ref, ref_m)
    assert not np.array_equal(noisy, noisy_m)

    def red_blue(a, b):
        return np.corrcoef((a - b)[0].ravel(), (a - b)[2].ravel())[0, 1]

    assert red_blue(noisy_m, ref_m) > 0.2 > red_blue(noisy, ref)


def test_training_batch_one_camera_per_patch(image):
    import torch

    from indeed_cli.tasks.camera_noise import camera_noise_batch

    clean = torch.from_numpy(np.stack([image, image[:, ::-1].copy(), image * 0.8, image]))
    a, ref = camera_noise_batch(clean, torch.Generator().manual_seed(0))
    b, _ = camera_noise_batch(clean, torch.Generator().manual_seed(0))
    assert a.shape == ref.shape == clean.shape and a.dtype == torch.float32
    torch.testing.assert_close(a, b, rtol=0, atol=0)  # seeded
    assert psnr(ref.numpy(), clean.numpy()) > 40  # the reference is the image, up to the cameras' gamut
    rms = (a - ref).pow(2).mean((1, 2, 3)).sqrt()
    assert not torch.allclose(rms[0], rms[3])  # patches 0 and 3 are one image through two cameras
    n = (a - ref)[0, 1].numpy()
    assert np.corrcoef(n[:, :-1].ravel(), n[:, 1:].ravel())[0, 1] > 0.15  # demosaiced, like camera_pair's
    quiet, ref_q = camera_noise_batch(clean, torch.Generator().manual_seed(0), shot=(1e-9, 1e-9))
    assert (quiet - ref_q).abs().max() < 1e-2 < (a - ref).abs().max()  # the noise scales with the shot level


def test_denoise_batches_with_a_camera_share():
    import torch

    from indeed_cli.tasks.training import TrainConfig, denoise_batch

    class Patches:
        def sample(self, n):
            return torch.rand(n, 3, 32, 32, generator=torch.Generator().manual_seed(5)) * 0.6 + 0.2

    tc = TrainConfig(camera_share=1.0, clip_prob=0.0)
    Y, t = denoise_batch(Patches(), 4, tc, torch.Generator().manual_seed(1))
    torch.testing.assert_close(t["sigma"], (Y - t["clean"]).pow(2).mean((1, 2, 3)).sqrt())
    assert not torch.equal(t["clean"], Patches().sample(4))  # the target is the camera's own rendering
    awgn, t0 = denoise_batch(Patches(), 4, TrainConfig(), torch.Generator().manual_seed(1))
    assert torch.equal(t0["clean"], Patches().sample(4))  # share 0: AWGN and the clean patch, as before
    with pytest.raises(ValueError, match="camera-noise"):
        TrainConfig(camera_share=1.5).check()


def test_saturate_scales_chroma_about_the_luma_and_permutes_channels():
    import torch

    from indeed_cli.tasks.training.batches import LUMA, saturate

    g = torch.Generator().manual_seed(0)
    clean = 0.35 + 0.3 * torch.rand(4000, 3, 2, 2, generator=g)  # mid-range: a factor up to 2.5 does not clip
    assert saturate(clean, 0.0, torch.Generator().manual_seed(1)) is clean
    same = saturate(clean, 1.0, torch.Generator().manual_seed(1), max_factor=1.0)
    torch.testing.assert_close(same.sort(1).values, clean.sort(1).values)  # a channel permutation only
    assert (same != clean).any(1).all(1).all(1).float().mean() > 0.7  # five of six orders move channels
    out = saturate(clean, 1.0, torch.Generator().manual_seed(1))
    spread = lambda x: (x.max(1).values - x.min(1).values).mean((1, 2))  # noqa: E731
    ratio = spread(out) / spread(clean)
    assert 0.999 < ratio.min() and ratio.max() < 2.501 and ratio.mean() > 1.5  # f ~ logU[1, 2.5]: mean 1.64
    luma = (clean * torch.tensor(LUMA).view(1, 3, 1, 1)).sum(1, keepdim=True)
    scaled = luma + ratio.view(-1, 1, 1, 1) * (clean - luma)  # Y + f (U - Y), Y the luma, before the order
    torch.testing.assert_close(out.sort(1).values, scaled.sort(1).values, atol=1e-5, rtol=0)
    half = saturate(clean, 0.5, torch.Generator().manual_seed(2))
    changed = (half != clean).flatten(1).any(1).float().mean()
    assert 0.4 < changed < 0.6
