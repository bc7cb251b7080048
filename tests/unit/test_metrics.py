"""The evaluation conventions: seeded AWGN, PSNR on 8-bit quantised outputs, SSIM when installed."""

import numpy as np
import pytest

from indeed_cli.metrics import add_awgn, image_seed, psnr, quantise8, ssim


def test_psnr_is_computed_on_8_bit_quantised_images():
    ref = np.full((1, 8, 8), 0.5, np.float32)
    out = ref.copy()
    out[0, 0, 0] += 10 / 255  # one pixel 10 grey levels off
    mse = 100 / 64
    assert psnr(out, ref) == pytest.approx(10 * np.log10(255**2 / mse))
    assert psnr(ref + 0.1 / 255, ref) == psnr(ref, ref)  # below half a level: quantised away
    assert psnr(np.full_like(ref, 2.0), np.ones_like(ref)) == psnr(ref, ref)  # clipped to [0, 1] first
    assert quantise8(np.array([-1.0, 0.5, 3.0])).tolist() == [0.0, 128.0, 255.0]


def test_awgn_is_seeded_per_image_and_sigma_and_has_the_asked_level():
    clean = np.full((3, 128, 128), 0.5, np.float32)
    s1 = image_seed("a.png", 25)
    assert s1 == image_seed("a.png", 25) and len({s1, image_seed("b.png", 25), image_seed("a.png", 15)}) == 3
    y = add_awgn(clean, 25, s1)
    np.testing.assert_array_equal(y, add_awgn(clean, 25, s1))
    assert y.dtype == np.float32 and np.std(y - clean) * 255 == pytest.approx(25, rel=0.02)
    assert y.min() < 0.5 - 3 * 25 / 255  # float noise: not clipped
    q = add_awgn(clean, 25, s1, clipped8=True)
    np.testing.assert_array_equal(q, np.round(np.clip(y, 0, 1) * 255) / 255)


def test_ssim_matches_scikit_image_or_is_none_without_it():
    rng = np.random.default_rng(0)
    ref = rng.random((3, 32, 32)).astype(np.float32)
    noisy = np.clip(ref + rng.normal(0, 0.1, ref.shape), 0, 1).astype(np.float32)
    try:
        from skimage.metrics import structural_similarity
    except ImportError:
        assert ssim(noisy, ref) is None
        return
    a, b = quantise8(noisy).transpose(1, 2, 0), quantise8(ref).transpose(1, 2, 0)
    assert ssim(noisy, ref) == pytest.approx(structural_similarity(a, b, data_range=255, channel_axis=-1))
    assert ssim(ref, ref) == pytest.approx(1.0)
