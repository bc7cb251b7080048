"""Tiling: exact round-trip, tiled == untiled for local operators, seamless stitching."""

import numpy as np
import pytest
import torch
from conftest import tiny_model

from indeed_cli.inference import InferenceOptions, TileGrid, decompose, denoise, network_for, reflect_index, tiled_apply


@pytest.mark.parametrize(
    "h,w,tile,overlap",
    [(37, 31, 128, 32), (129, 257, 128, 32), (211, 213, 128, 17), (5, 300, 64, 16), (256, 256, 128, 0)],
)
def test_identity_round_trip_is_exact(h, w, tile, overlap):
    img = torch.rand(3, h, w)
    maps, _ = tiled_apply(lambda t: {"x": t}, img, tile, overlap, batch=3)
    assert maps["x"].shape == img.shape
    assert torch.allclose(maps["x"], img, atol=1e-6)


def test_local_operator_tiled_equals_untiled():
    torch.manual_seed(0)
    conv = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 5, padding=2, padding_mode="reflect"),
        torch.nn.ReLU(),
        torch.nn.Conv2d(4, 1, 5, padding=2, padding_mode="reflect"),
    ).eval()
    img = torch.rand(1, 129, 257)
    with torch.no_grad():
        full = conv(img[None])[0]
        maps, _ = tiled_apply(lambda t: {"y": conv(t)}, img, 64, 24, batch=4)
    # receptive field radius 4 <= overlap // 4 (the zero band): tiles agree to float precision.
    # At the image border, per-layer reflect padding differs from reflecting the input, so
    # compare away from it.
    assert torch.allclose(maps["y"][:, 8:-8, 8:-8], full[:, 8:-8, 8:-8], atol=1e-5)


def test_reflect_index_handles_pads_larger_than_the_image():
    idx = reflect_index(np.arange(-7, 10), 3)
    assert idx.min() >= 0 and idx.max() <= 2
    assert list(reflect_index(np.array([-1, 0, 1, 2, 3]), 3)) == [1, 0, 1, 2, 1]


def test_grid_refuses_bad_geometry():
    with pytest.raises(ValueError):
        TileGrid(10, 10, 64, 64)
    with pytest.raises(ValueError):
        TileGrid(10, 10, 0, 0)


def test_model_small_image_tiled_equals_single_pass():
    """An image within one tile is one padded forward pass: tiled output must match it."""
    from indeed_cli.model import Checkpoint

    m = tiny_model(3)
    ck = Checkpoint(m, m.cfg)
    img = np.random.default_rng(0).random((3, 37, 31)).astype(np.float32)
    opts = InferenceOptions(tile=64, overlap=16, whole_image=False)
    out = denoise(ck, img, opts, clip=False)  # the raw posterior mean, as the model gives it
    grid = TileGrid(37, 31, 64, 16)
    tile = grid.cut(torch.from_numpy(img), 0, 0)[None]
    with torch.no_grad():
        d = m(tile)
    ref = (d.L_hat + d.mu_S)[0, :, 8:45, 8:39]
    assert out.shape == img.shape
    assert np.allclose(out, ref.numpy(), atol=1e-5)


def test_decomposition_identity_and_no_seams():
    from indeed_cli.model import Checkpoint

    m = tiny_model(1)
    ck = Checkpoint(m, m.cfg)
    img = np.random.default_rng(1).random((1, 129, 257)).astype(np.float32)
    dec = decompose(ck, img, InferenceOptions(tile=64, overlap=16))
    arr = dec.in_scale(255.0)
    assert np.allclose(arr["L"] + arr["S"] + arr["N"], arr["Y"], atol=1e-3)
    assert arr["mu_gamma"].shape[:2] == dec.tiles["rank_index"].shape[:2]
    # blending is smooth: the output is a continuous function of tile outputs (finite everywhere)
    for k in ("L", "S", "sigma_L", "sigma_S", "mu_omega", "mu_lambda"):
        assert np.isfinite(arr[k]).all() and arr[k].shape == (1, 129, 257)


@pytest.mark.parametrize("batch", [1, 5, 64])
def test_per_tile_outputs_keep_grid_order_for_any_batch(batch):
    """Strips may share a forward pass; per-tile vectors must still land on their tile."""
    img = torch.rand(2, 150, 230)
    maps, grids = tiled_apply(lambda t: {"x": t, "mean": t.mean((2, 3))}, img, 64, 16, batch=batch)
    g = TileGrid(150, 230, 64, 16)
    expect = torch.stack([g.cut(img, y, x).mean((1, 2)) for y, x in g.positions()]).reshape(*g.shape, 2)
    assert torch.allclose(grids["mean"], expect, atol=1e-6)
    assert torch.allclose(maps["x"], img, atol=1e-6)


def test_bf16_inference_runs_a_bf16_copy_close_to_fp32_and_follows_weight_changes():
    """--precision bf16 runs a bf16 copy of the network (inference.network_for): close to fp32 but not
    equal to it; the fp32 network is left as it was; a change of the weights reaches the copy."""
    from indeed_cli.model import Checkpoint

    m = tiny_model(1)
    ck = Checkpoint(m, m.cfg)
    img = np.random.default_rng(2).random((1, 70, 90)).astype(np.float32)
    fp32 = denoise(ck, img, InferenceOptions(tile=64, overlap=16))
    bf16 = denoise(ck, img, InferenceOptions(tile=64, overlap=16, precision="bf16"))
    assert bf16.dtype == np.float32 and bf16.shape == img.shape
    assert not np.array_equal(bf16, fp32)
    np.testing.assert_allclose(bf16, fp32, atol=0.05)
    assert all(p.dtype == torch.float32 for p in m.parameters())
    net = network_for(ck, "bf16")
    assert net is not m and network_for(ck, "bf16") is net  # made once
    assert all(p.dtype == torch.bfloat16 for p in net.parameters())
    with torch.no_grad():
        m.sparse.head.bias.add_(0.25)  # in place, as an optimiser or load_state_dict would
    assert network_for(ck, "bf16") is not net
    moved = denoise(ck, img, InferenceOptions(tile=64, overlap=16, precision="bf16"))
    assert np.abs(moved - bf16).mean() > 0.1
    with pytest.raises(ValueError):
        network_for(ck, "fp16")


@pytest.mark.parametrize("h,w,tile,overlap", [(129, 257, 64, 16), (37, 31, 64, 16), (100, 90, 32, 0), (5, 70, 16, 6)])
def test_tile_means_are_the_means_of_the_cut_tiles(h, w, tile, overlap):
    from indeed_cli.inference.tiling import tile_means

    plane = torch.rand(h, w)
    g = TileGrid(h, w, tile, overlap)
    expect = torch.stack([g.cut(plane[None], y, x).mean() for y, x in g.positions()]).reshape(g.shape)
    assert torch.allclose(tile_means(plane, g), expect, atol=1e-6)
    with pytest.raises(ValueError):
        tile_means(plane[1:], g)


@pytest.mark.parametrize("model_c,image_c", [(3, 3), (1, 3), (1, 1)])
def test_whole_image_read_out_is_the_tiled_one_when_one_tile_holds_the_image(model_c, image_c):
    """f_thetaS on the whole image and per tile are one computation when a single tile without
    overlap covers the image: maps, per-tile ELBO terms and rank statistics agree."""
    from indeed_cli.inference import denoise_with_stats
    from indeed_cli.model import Checkpoint

    m = tiny_model(model_c)
    ck = Checkpoint(m, m.cfg)
    img = np.random.default_rng(4).random((image_c, 64, 64)).astype(np.float32)
    whole, tiled = InferenceOptions(tile=64, overlap=0), InferenceOptions(tile=64, overlap=0, whole_image=False)
    dw, dt = decompose(ck, img, whole), decompose(ck, img, tiled)
    for k in dt.maps:
        np.testing.assert_allclose(dw.maps[k], dt.maps[k], rtol=1e-4, atol=1e-5, err_msg=k)
    for k in dt.tiles:
        assert dw.tiles[k].shape == dt.tiles[k].shape, k
        np.testing.assert_allclose(dw.tiles[k], dt.tiles[k], rtol=1e-4, atol=1e-5, err_msg=k)
    X, stats = denoise_with_stats(ck, img, whole)
    np.testing.assert_allclose(X, dw.maps["L"] + dw.maps["S"], atol=1e-6)
    for k in ("l_rank", "l_sparse"):
        np.testing.assert_allclose(stats[k], dt.tiles[k], rtol=1e-4, err_msg=k)


def test_whole_image_read_out_of_a_larger_image():
    """Several overlapping tiles: the whole read-out has no seams, so it differs from the tiled one
    (by little), keeps L + S + N = Y and gives one statistic per tile; it is the default below
    WHOLE_IMAGE_PIXELS, tiles above it, for |mu_S| maps alone, and with --compile."""
    import indeed_cli.inference.decomposition as D
    from indeed_cli.model import Checkpoint

    m = tiny_model(3)
    ck = Checkpoint(m, m.cfg)
    img = np.random.default_rng(5).random((3, 90, 150)).astype(np.float32)
    opts = InferenceOptions(tile=32, overlap=8)
    dw = decompose(ck, img, opts)
    dt = decompose(ck, img, InferenceOptions(tile=32, overlap=8, whole_image=False))
    arr = dw.in_scale(255.0)
    assert np.allclose(arr["L"] + arr["S"] + arr["N"], arr["Y"], atol=1e-3)
    np.testing.assert_array_equal(dw.maps["L"], dt.maps["L"])  # mu_L is by tiles either way
    assert not np.allclose(dw.maps["S"], dt.maps["S"], atol=1e-5)
    assert {k: v.shape for k, v in dw.tiles.items()} == {k: v.shape for k, v in dt.tiles.items()}
    assert D.reads_whole(ck, img, "denoise", opts)
    assert not D.reads_whole(ck, img, "sparse", opts)
    assert not D.reads_whole(ck, img, "denoise", InferenceOptions(compile=True))
    assert D.reads_whole(ck, img, "sparse", InferenceOptions(whole_image=True))
    old = D.WHOLE_IMAGE_PIXELS
    try:
        D.WHOLE_IMAGE_PIXELS = 90 * 150 - 1
        assert not D.reads_whole(ck, img, "denoise", opts)
        np.testing.assert_array_equal(decompose(ck, img, opts).maps["S"], dt.maps["S"])
    finally:
        D.WHOLE_IMAGE_PIXELS = old


def test_pixel_shuffle_read_out_denoises_each_phase_and_puts_it_back(monkeypatch):
    from indeed_cli.inference import MAX_PIXEL_SHUFFLE, n_tiles, pixel_shuffle_denoise
    from indeed_cli.inference import decomposition as D
    from indeed_cli.model import Checkpoint

    m = tiny_model(3)
    ck = Checkpoint(m, m.cfg)
    x = np.random.default_rng(1).random((3, 37, 30)).astype(np.float32)  # odd height: phases of 19 and 18 rows
    plain = denoise(ck, x, clip=False)
    phases = np.empty_like(x)
    for i in range(2):
        for j in range(2):  # each phase: the plain read-out of that sub-image, in its own pixels
            phases[:, i::2, j::2] = denoise(ck, np.ascontiguousarray(x[:, i::2, j::2]), clip=False)
    got = pixel_shuffle_denoise(ck, x, 2)
    assert got.stride == 2 and got.noise_correlation is None
    np.testing.assert_allclose(got.image, D.pixel_shuffle_guard(plain, phases), atol=1e-6)
    np.testing.assert_array_equal(denoise(ck, x, pixel_shuffle=2, clip=False), got.image)
    np.testing.assert_array_equal(denoise(ck, x, pixel_shuffle=1), denoise(ck, x))
    # "auto" reads the correlation of the removed noise: above the threshold it shuffles, else plain
    monkeypatch.setattr(D, "AUTO_CORRELATION", 1.5)
    kept = pixel_shuffle_denoise(ck, x, "auto")
    assert kept.stride == 1 and kept.noise_correlation == D.removed_noise_correlation(x, plain)
    np.testing.assert_array_equal(kept.image, plain)
    ticks = []
    opts = InferenceOptions(tile=16, overlap=4)
    pixel_shuffle_denoise(ck, x, "auto", opts, progress=ticks.append)
    assert sum(ticks) == n_tiles(37, 30, opts, "auto")  # the bar completes when the sub-images are skipped
    monkeypatch.setattr(D, "AUTO_CORRELATION", -1.5)
    np.testing.assert_array_equal(pixel_shuffle_denoise(ck, x, "auto").image, got.image)
    ticks.clear()
    pixel_shuffle_denoise(ck, x, 3, opts, progress=ticks.append)
    assert sum(ticks) == n_tiles(37, 30, opts, 3)  # the progress bar's total
    with pytest.raises(ValueError, match="too small"):
        denoise(ck, x[:, :5, :5], pixel_shuffle=3)
    for bad in (MAX_PIXEL_SHUFFLE + 1, 0, "2.5", "two"):
        with pytest.raises(ValueError, match="1 to"):
            denoise(ck, x, pixel_shuffle=bad)


@pytest.mark.parametrize("model_c,image_c", [(3, 3), (1, 3)])
def test_denoise_batch_equals_one_read_out_per_image(model_c, image_c, monkeypatch):
    """denoise_batch gives each image what denoise gives it alone (plain, pixel shuffle 2, "auto"),
    with one network call per image size as long as WHOLE_IMAGE_PIXELS allows; an image above it is
    read out by tiles as alone."""
    from indeed_cli.inference import decomposition as D
    from indeed_cli.inference import denoise_batch, n_tiles
    from indeed_cli.model import Checkpoint

    m = tiny_model(model_c)
    ck = Checkpoint(m, m.cfg)
    rng = np.random.default_rng(7)
    sizes = [(48, 40), (30, 50), (48, 40), (48, 40)]
    images = [rng.random((image_c, h, w)).astype(np.float32) for h, w in sizes]
    opts = InferenceOptions(tile=16, overlap=4)
    calls = []
    whole_batch = D._denoise_whole_batch
    monkeypatch.setattr(
        D, "_denoise_whole_batch", lambda ck, stack, *a: calls.append(len(stack)) or whole_batch(ck, stack, *a)
    )
    for shuffle in (1, 2, "auto"):
        calls.clear()
        got = denoise_batch(ck, images, opts, clip=False, pixel_shuffle=shuffle)
        made = sorted(calls)
        for x, y in zip(images, got):
            np.testing.assert_allclose(y, denoise(ck, x, opts, clip=False, pixel_shuffle=shuffle), atol=1e-5)
        if shuffle == 2:  # plain: one call per size; sub-images: 24x20 (x12) and 15x25 (x4)
            assert made == [1, 3, 4, 12]
    plain = [denoise(ck, x, opts, clip=False) for x in images]
    corr = sorted(D.removed_noise_correlation(x, p) for x, p in zip(images, plain))
    monkeypatch.setattr(D, "AUTO_CORRELATION", (corr[1] + corr[2]) / 2)  # "auto": two images shuffled, two not
    ticks = []
    got = denoise_batch(ck, images, opts, pixel_shuffle="auto", progress=ticks.append)
    assert sum(ticks) == sum(n_tiles(*x.shape[1:], opts, "auto") for x in images)  # the bar completes
    shuffled = [not np.allclose(y, np.clip(p, 0, 1), atol=1e-6) for y, p in zip(got, plain)]
    assert sum(shuffled) == 2
    for x, y in zip(images, got):
        np.testing.assert_allclose(y, denoise(ck, x, opts, pixel_shuffle="auto"), atol=1e-5)
    planes = image_c if model_c == 1 else 1
    monkeypatch.setattr(D, "WHOLE_IMAGE_PIXELS", 2 * 48 * 40 * planes)  # two 48x40 images a call
    calls.clear()
    got = denoise_batch(ck, images, opts)
    assert sorted(calls) == [1, 1, 2]  # 48x40 in calls of 2 and 1, 30x50 alone
    monkeypatch.setattr(D, "WHOLE_IMAGE_PIXELS", 30 * 50 * planes)  # 48x40 above it: by tiles, as alone
    calls.clear()
    got = denoise_batch(ck, images, opts)
    assert calls == [1]
    for x, y in zip(images, got):
        np.testing.assert_allclose(y, denoise(ck, x, opts), atol=1e-5)


@pytest.mark.parametrize("model_c,image_c", [(3, 3), (1, 3)])
def test_shuffled_residuals_are_those_of_denoise_batch(model_c, image_c):
    """The gate's residuals, computed on the model's device for the images of one size at once, are
    Y minus what denoise_batch gives at stride 2 (clipped), with its correlation, for every image."""
    from indeed_cli.inference import decomposition as D
    from indeed_cli.inference import denoise_batch, shuffled_residuals
    from indeed_cli.model import Checkpoint

    m = tiny_model(model_c)
    ck = Checkpoint(m, m.cfg)
    rng = np.random.default_rng(3)
    images = [rng.random((image_c, h, w)).astype(np.float32) for h, w in [(48, 40), (30, 50), (48, 40)]]
    opts = InferenceOptions(tile=16, overlap=4)
    got = shuffled_residuals(ck, images, 2, opts)
    for x, y, (r, c) in zip(images, denoise_batch(ck, images, opts, pixel_shuffle=2), got):
        np.testing.assert_allclose(r, x - y, atol=1e-6)
        assert abs(c - D.removed_noise_correlation(x, y)) < 1e-9
    with pytest.raises(ValueError, match="too small"):
        shuffled_residuals(ck, [images[0][:, :1, :5]], 2, opts)


def test_guarded_readouts_group_by_size_in_runs_of_bounded_pixels(monkeypatch):
    """The guard made on the model's device for the images of one size at once, in runs of at most
    GUARD_PIXELS pixels, is each image's own guard, and each run names the images it holds."""
    from indeed_cli.inference import decomposition as D

    rng = np.random.default_rng(5)
    sizes = [(40, 30), (20, 24), (40, 30), (40, 30), (20, 24)]
    plain = [rng.random((3, h, w)).astype(np.float32) for h, w in sizes]
    shuffled = [p + 0.05 * rng.standard_normal(p.shape).astype(np.float32) for p in plain]
    noisy = [p + 0.1 for p in plain]
    monkeypatch.setattr(D, "GUARD_PIXELS", 2 * 40 * 30)  # two 40 x 30 images per run
    runs = list(D.guarded_readouts(torch.device("cpu"), plain, shuffled, noisy))
    assert [part for part, _, _ in runs] == [[0, 2], [3], [1, 4]]
    for part, X, Y in runs:
        for i, x, y in zip(part, X.numpy(), Y.numpy()):
            np.testing.assert_array_equal(x, D.pixel_shuffle_guard(plain[i], shuffled[i]))
            np.testing.assert_array_equal(y, noisy[i])
    assert [p for p, _ in D.guarded_readouts(torch.device("cpu"), plain[:2], shuffled[:2])] == [[0], [1]]


def test_batched_guards_and_correlations_are_each_images_own():
    from indeed_cli.inference import decomposition as D

    rng = np.random.default_rng(4)
    plain = rng.random((3, 3, 40, 30)).astype(np.float32)
    shuffled = plain + 0.02 * rng.standard_normal(plain.shape).astype(np.float32)
    shuffled[1, :, 5:15, 5:15] += 0.5
    both = D.pixel_shuffle_guards(torch.from_numpy(plain), torch.from_numpy(shuffled)).numpy()
    corr = D.removed_noise_correlations(torch.from_numpy(shuffled), torch.from_numpy(plain)).numpy()
    for k in range(3):
        np.testing.assert_allclose(both[k], D.pixel_shuffle_guard(plain[k], shuffled[k]), atol=1e-7)
        assert abs(corr[k] - D.removed_noise_correlation(shuffled[k], plain[k])) < 1e-12
    # numpy's median: the mean of the two middle values of an even count
    x = torch.tensor([[4.0, 1.0, 3.0, 2.0], [5.0, 1.0, 3.0, 7.0]])
    assert D._median(x).tolist() == [2.5, 4.0] and D._median(x[:, :3]).tolist() == [3.0, 3.0]


def test_pixel_shuffle_guard_keeps_the_plain_read_out_where_the_two_disagree():
    from indeed_cli.inference.decomposition import GUARD_WINDOW, pixel_shuffle_guard

    rng = np.random.default_rng(0)
    plain = rng.random((3, 60, 60)).astype(np.float32)
    shuffled = plain + 0.01 * rng.standard_normal(plain.shape).astype(np.float32)  # agrees everywhere
    np.testing.assert_allclose(pixel_shuffle_guard(plain, shuffled), shuffled, atol=1e-6)
    shuffled[:, 20:40, 20:40] += 0.5  # an aliased patch: far more than the median disagreement
    out = pixel_shuffle_guard(plain, shuffled)
    inner = slice(20 + GUARD_WINDOW, 40 - GUARD_WINDOW)
    np.testing.assert_allclose(out[:, inner, inner], plain[:, inner, inner], atol=1e-6)
    np.testing.assert_allclose(out[:, :5, :5], shuffled[:, :5, :5], atol=1e-6)


def test_removed_noise_correlation_tells_white_from_demosaiced_noise():
    from indeed_cli.inference.decomposition import removed_noise_correlation

    rng = np.random.default_rng(0)
    white = rng.standard_normal((3, 200, 200))
    assert abs(removed_noise_correlation(white, np.zeros_like(white))) < 0.02
    # a 2x2 box over white noise: neighbours share half their terms, lag-1 correlation 1/2 both ways
    boxed = (white[:, 1:, 1:] + white[:, :-1, 1:] + white[:, 1:, :-1] + white[:, :-1, :-1]) / 4
    assert abs(removed_noise_correlation(boxed, np.zeros_like(boxed)) - 0.5) < 0.03


@pytest.mark.parametrize("h,w,tile,overlap", [(37, 31, 16, 4), (64, 64, 32, 0), (90, 100, 32, 8)])
def test_cut_is_a_view_inside_the_image_and_reflects_outside(h, w, tile, overlap):
    """Every tile equals the reflected indexing of the image; those inside the image are views of it."""
    img = torch.rand(2, h, w)
    g = TileGrid(h, w, tile, overlap)
    views = 0
    for y, x in g.positions():
        cols = reflect_index(np.arange(x, x + tile) - g.margin, w)
        expect = img[:, torch.from_numpy(g.rows(y))][:, :, torch.from_numpy(cols)]
        got = g.cut(img, y, x)
        assert torch.equal(got, expect)
        views += got.untyped_storage().data_ptr() == img.untyped_storage().data_ptr()
    assert views > 0


def test_dihedral_transforms_are_the_eight_symmetries_and_their_prefixes_groups():
    from indeed_cli.inference.decomposition import DIHEDRAL, dihedral

    x = np.random.default_rng(0).random((2, 5, 7)).astype(np.float32)
    seen = set()
    for k in range(len(DIHEDRAL)):
        y = dihedral(x, k)
        np.testing.assert_array_equal(dihedral(y, k, inverse=True), x)
        seen.add((y.shape, y.tobytes()))
    assert len(seen) == 8  # all distinct: the group of the square, no transform twice
    np.testing.assert_array_equal(dihedral(x, 1), x.transpose(0, 2, 1))
    np.testing.assert_array_equal(dihedral(x, 2), x[:, ::-1, ::-1])
    for n in (2, 4):  # the first n are closed under composition: an ensemble of n is a subgroup
        firsts = {(dihedral(x, k).shape, dihedral(x, k).tobytes()) for k in range(n)}
        for a in range(n):
            for b in range(n):
                z = dihedral(dihedral(x, a), b)
                assert (z.shape, z.tobytes()) in firsts


def test_ensemble_is_the_mean_of_the_turned_back_read_outs(monkeypatch):
    """denoise(ensemble=n) = mean over the first n transforms of read-outs turned back, for one image
    (also with a pixel shuffle) and, through denoise_batch, for several; the bar completes."""
    from indeed_cli.inference import check_ensemble, denoise_batch, n_tiles
    from indeed_cli.inference.decomposition import dihedral
    from indeed_cli.model import Checkpoint

    m = tiny_model(3)
    ck = Checkpoint(m, m.cfg)
    rng = np.random.default_rng(3)
    x = rng.random((3, 40, 56)).astype(np.float32)
    opts = InferenceOptions(tile=16, overlap=4)
    for n in (2, 4, 8):
        for shuffle in (1, 2):
            want = np.mean(
                [
                    dihedral(denoise(ck, dihedral(x, k), opts, clip=False, pixel_shuffle=shuffle), k, inverse=True)
                    for k in range(n)
                ],
                axis=0,
            )
            got = denoise(ck, x, opts, clip=False, pixel_shuffle=shuffle, ensemble=n)
            np.testing.assert_allclose(got, want, atol=1e-6)
    plain = denoise(ck, x, opts, clip=False)
    assert np.abs(denoise(ck, x, opts, clip=False, ensemble=8) - plain).max() > 1e-4  # it does average something
    images = [x, rng.random((3, 24, 32)).astype(np.float32)]
    ticks = []
    got = denoise_batch(ck, images, opts, clip=False, ensemble=4, progress=ticks.append)
    for a, b in zip(images, got):
        np.testing.assert_allclose(b, denoise(ck, a, opts, clip=False, ensemble=4), atol=1e-5)
    assert sum(ticks) == sum(n_tiles(*a.shape[1:], opts, 1, 4) for a in images)
    assert n_tiles(40, 56, opts, 1, 2) == n_tiles(40, 56, opts) + n_tiles(56, 40, opts)
    from indeed_cli.inference import decomposition as D

    for level in (2.0, -2.0):  # "auto" keeps the plain read-out of every transform, or shuffles every one
        monkeypatch.setattr(D, "AUTO_CORRELATION", level)
        ticks = []
        denoise(ck, x, opts, progress=ticks.append, pixel_shuffle="auto", ensemble=4)
        assert sum(ticks) == n_tiles(40, 56, opts, "auto", 4)  # the bar completes either way
        ticks = []
        denoise_batch(ck, images, opts, progress=ticks.append, pixel_shuffle="auto", ensemble=4)
        assert sum(ticks) == sum(n_tiles(*a.shape[1:], opts, "auto", 4) for a in images)
    for bad in (0, 3, 16, "2.5", "two"):
        with pytest.raises(ValueError, match="ensemble must be 1, 2, 4 or 8"):
            check_ensemble(bad)
