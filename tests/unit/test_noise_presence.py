"""The noise-presence detector (tasks.noise_presence, Eq. noise presence) and OAG's use of it."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_model, write_png
from safetensors.torch import save_file

from indeed_cli.inference import InferenceOptions, decompose, denoise_with_stats
from indeed_cli.model import Checkpoint
from indeed_cli.tasks import noise_presence as npres
from indeed_cli.tasks.adaptation import (
    AdaptConfig,
    AdaptResult,
    choice,
    noise_map_blend,
    oag_decomposition,
    oag_output,
)
from indeed_cli.tasks.adaptation.runner import adapt_each
from indeed_cli.tasks.camera_noise import camera_pair


def tiny_checkpoint(c: int = 3) -> Checkpoint:
    m = tiny_model(c)
    return Checkpoint(m, m.cfg, {}, {}, "tiny")


def scene(h: int = 192, w: int = 192, seed: int = 0) -> np.ndarray:
    """A clean colour picture: smooth shading and flat rectangles, through a lens's blur (3 x 3); 8-bit.
    (Low-pass random texture would not do: it is what correlated noise looks like.)"""
    g = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    img = np.stack([0.3 + 0.4 * xx, 0.2 + 0.5 * yy, 0.6 - 0.3 * xx * yy]).astype(np.float32)
    for _ in range(6):
        r, c = g.integers(0, h - 40), g.integers(0, w - 40)
        img[:, r : r + g.integers(10, 40), c : c + g.integers(10, 40)] = g.random(3)[:, None, None]
    img = npres._box(torch.tensor(img)[None], 3)[0].numpy()
    return np.round(np.clip(img, 0, 1) * 255).astype(np.float32) / 255


@pytest.fixture(autouse=True)
def noise_check_as_shipped(monkeypatch, no_noise_check):
    from indeed_cli.tasks.adaptation import config

    monkeypatch.setitem(config.OAG_DEFAULTS, "noise_check", config.OAG_NOISE_CHECK)


@pytest.fixture(scope="module")
def detector():
    net = npres.load_noise_detector("cpu")
    if net is None:
        pytest.skip("the bundled noise-presence weights are not in this checkout")
    return net


def test_bands_see_no_content_in_a_flat_image_and_the_map_is_a_quarter_size():
    net = npres.NoisePresenceNet(8)
    flat = torch.full((1, 3, 32, 40), 0.4)
    assert torch.allclose(net.bands(flat), torch.zeros(1, 6, 32, 40), atol=1e-4)
    assert net.logit_map(flat).shape == (1, 1, 8, 10)
    assert net(torch.rand(2, 3, 32, 32)).shape == (2,)


def test_context_layers_widen_the_view_keep_the_map_size_and_load_from_the_metadata(tmp_path):
    torch.manual_seed(0)
    net = npres.NoisePresenceNet(8, context=2).eval()
    x = torch.rand(1, 3, 96, 96)
    assert net.logit_map(x).shape == (1, 1, 24, 24)
    # a change about 24 px from a map cell's pixels reaches it only through the dilated layers
    y = x.clone()
    y[..., 66:70, 66:70] = 1 - y[..., 66:70, 66:70]
    near = lambda m: m.logit_map(x)[0, 0, 10, 10] - m.logit_map(y)[0, 0, 10, 10]  # noqa: E731
    with torch.no_grad():
        assert abs(float(near(net))) > 0 and float(near(npres.NoisePresenceNet(8).eval())) == 0
    path = tmp_path / "np.safetensors"
    save_file(net.state_dict(), str(path), metadata={"config": json.dumps({"width": 8, "context": 2})})
    loaded = npres.load_noise_detector("cpu", path)
    assert loaded.context == 2 and torch.equal(loaded.logit_map(x), net.logit_map(x))


def test_the_shipped_detector_finds_camera_noise_and_none_in_the_clean_picture(detector):
    clean = scene()
    s0 = npres.noise_presence_score(clean, detector)
    scores = [npres.noise_presence_score(camera_pair(clean, lvl, 3)[0], detector) for lvl in ("medium", "heavy")]
    white = np.round(np.clip(clean + np.random.default_rng(1).normal(0, 6 / 255, clean.shape), 0, 1) * 255) / 255
    scores.append(npres.noise_presence_score(white.astype(np.float32), detector))
    assert s0 <= npres.NOISE_THRESHOLD and not npres.noise_found(s0)
    assert all(s > npres.NOISE_THRESHOLD for s in scores), (s0, scores)


def test_the_score_is_the_mean_of_the_map_and_large_images_are_read_on_tiles(detector):
    img = scene(64, 80)
    with torch.no_grad():
        direct = float(detector.logit_map(torch.tensor(img)[None]).mean())
    assert npres.noise_presence_score(img, detector) == pytest.approx(direct, abs=1e-6)
    big = np.zeros((3, 1100, 2100), np.float32)
    big[:, 0, 0], big[:, -1, -1] = 1.0, 2.0
    tiles = npres._tiles(torch.tensor(big))
    assert 1 < len(tiles) <= npres.NOISE_TILES and all(t.shape[1:] == (npres.NOISE_TILE,) * 2 for t in tiles)
    assert float(tiles[0][0, 0, 0]) == 1.0 and float(tiles[-1][0, -1, -1]) == 2.0  # the grid runs corner to corner
    assert npres.noise_presence_score(np.zeros((3, 600, 600), np.float32), detector) is not None


def test_gray_tiny_and_missing_weights_give_no_score_and_do_not_refuse(tmp_path):
    net = npres.NoisePresenceNet(4)
    assert npres.noise_presence_score(np.zeros((1, 64, 64), np.float32), net) is None
    assert npres.noise_presence_score(np.zeros((3, 8, 64), np.float32), net) is None
    assert npres.load_noise_detector("cpu", tmp_path / "missing.safetensors") is None
    assert npres.noise_found(None)


def test_oag_keeps_the_start_where_no_noise_is_found_and_adapts_otherwise(detector):
    ckpt = tiny_checkpoint(3)
    clean = scene(64, 64)
    noisy = camera_pair(clean, "heavy", 5)[0]
    cfg = AdaptConfig(steps=2, eval_every=1, objective="elbo", decide="always")
    res_clean, res_noisy = adapt_each(ckpt, [[clean], [noisy]], cfg)
    assert res_clean.stop == "no noise found" and res_clean.best_step == 0 and res_clean.history == []
    assert res_clean.checkpoint is ckpt  # the plain result: the starting weights themselves
    assert res_clean.noise_scores[0] <= 0 < res_noisy.noise_scores[0]
    assert res_noisy.stop != "no noise found" and res_noisy.history  # it ran
    off = adapt_each(ckpt, [[clean]], AdaptConfig(steps=2, eval_every=1, objective="elbo", decide="always",
                                                  noise_check=False))[0]  # fmt: skip
    assert off.stop != "no noise found" and off.history and off.noise_scores is None
    # AG asks too by default: a folder without noise is not adapted; --no-noise-check adapts it
    from indeed_cli.tasks.adaptation import adapt

    assert adapt(ckpt, [clean], AdaptConfig(steps=1, eval_every=1, objective="elbo")).stop == "no noise found"
    unchecked = AdaptConfig(steps=1, eval_every=1, objective="elbo", noise_check=False)
    assert adapt(ckpt, [clean], unchecked).stop != "no noise found"


def test_the_adapt_cli_records_the_score_and_keeps_a_clean_picture_plain(run_cli, tmp_path, ckpt_paths, detector):
    d = tmp_path / "in"
    d.mkdir()
    write_png(d / "clean.png", (scene(64, 64).transpose(1, 2, 0) * 255).round().astype(np.uint8))
    noisy = camera_pair(scene(64, 64, seed=1), "heavy", 2)[0]
    write_png(d / "noisy.png", (noisy.transpose(1, 2, 0) * 255).round().astype(np.uint8))
    common = (
        "--mode",
        "oag",
        "-w",
        ckpt_paths[3],
        "--steps",
        "2",
        "--precision",
        "fp32",
        "--json",
        "-q",
        "--denoised-only",
    )
    code, out, err = run_cli("adapt", d, "-o", tmp_path / "on", *common)
    assert code == 0, err
    recs = {Path(r["image"]).name: r for r in map(json.loads, out.splitlines())}
    assert recs["clean.png"]["stop"] == "no noise found" and not recs["clean.png"]["adapted"]
    assert recs["clean.png"]["noise_score"] <= 0 < recs["noisy.png"]["noise_score"]
    assert recs["noisy.png"]["stop"] != "no noise found"
    code, _, err = run_cli("adapt", d, "-o", tmp_path / "said", *common[:-2])  # not quiet, no JSON
    assert code == 0 and "clean.png: no noise found, plain result kept (--no-noise-check adapts anyway)" in err
    code, out, err = run_cli("adapt", d, "-o", tmp_path / "off", "--no-noise-check", *common)
    assert code == 0, err
    assert all(json.loads(line)["noise_score"] is None for line in out.splitlines())
    assert all(json.loads(line)["stop"] != "no noise found" for line in out.splitlines())
    # ag asks by default, per image; --no-noise-check does not ask
    ag = ("--mode", "ag", *common[2:])
    code, out, err = run_cli("adapt", d, "-o", tmp_path / "ag", *ag)
    assert code == 0, err
    recs = {Path(r["image"]).name: r for r in map(json.loads, out.splitlines())}
    assert recs["clean.png"]["stop"] == "no noise found" and not recs["clean.png"]["adapted"]
    assert recs["clean.png"]["noise_score"] <= 0 < recs["noisy.png"]["noise_score"]
    code, out, err = run_cli("adapt", d, "-o", tmp_path / "ag-off", "--no-noise-check", *ag)
    assert code == 0, err
    assert all(json.loads(line)["noise_score"] is None for line in out.splitlines())


def test_ag_with_the_check_adapts_as_without_it_and_keeps_the_clean_one_plain(detector):
    """Eq. (AG noise check): the folder's adaptation is the one without the check (the same weights), the
    scores decide each image's output only, and a folder without noise is not adapted."""
    from indeed_cli.tasks.adaptation import adapt
    from indeed_cli.tasks.adaptation.choice import ag_image_result

    ckpt = tiny_checkpoint(3)
    clean, noisy = scene(64, 64), camera_pair(scene(64, 64, seed=1), "heavy", 5)[0]
    cfg = AdaptConfig(steps=2, eval_every=1, objective="elbo", noise_check=True, min_change_ratio=0.0)
    shared = adapt(ckpt, [clean, noisy], cfg)
    unchecked = adapt(ckpt, [clean, noisy], AdaptConfig(**{**cfg.__dict__, "noise_check": False}))
    assert shared.adapted_images == unchecked.adapted_images == [True, True]  # both images adapted on
    assert shared.best_step == unchecked.best_step > 0 and unchecked.noise_scores is None
    for k, v in unchecked.checkpoint.model.state_dict().items():
        assert torch.equal(shared.checkpoint.model.state_dict()[k], v), k
    assert shared.noise_scores[0] <= 0 < shared.noise_scores[1]
    res, _ = ag_image_result(ckpt, shared, clean, True, None, 0.0, 0.0, None, False, shared.noise_scores[0])
    assert res.stop == "no noise found" and res.checkpoint is ckpt and res.noise_scores == [shared.noise_scores[0]]
    res, _ = ag_image_result(ckpt, shared, noisy, True, None, 0.0, 0.0, None, False, shared.noise_scores[1])
    assert res.stop != "no noise found" and res.noise_scores == [shared.noise_scores[1]]
    # a folder without noise: nothing adapted
    none = adapt(ckpt, [clean], cfg)
    assert none.stop == "no noise found" and none.adapted_images == [False] and none.best_step == 0


def test_the_denoise_note_says_what_the_detector_found_in_nearly_unchanged_images(tmp_path, detector):
    """`indeed denoise` names what to run only where the detector finds noise the model left in place."""
    from conftest import write_png

    from indeed_cli.cli.denoise import little_change_note
    from indeed_cli.pipelines import Outcome

    clean = write_png(tmp_path / "clean.png", (scene().transpose(1, 2, 0) * 255).round().astype(np.uint8))
    noisy_img = camera_pair(scene(seed=1), "heavy", 2)[0]
    noisy = write_png(tmp_path / "noisy.png", (noisy_img.transpose(1, 2, 0) * 255).round().astype(np.uint8))
    rec = {"change_rms": 0.4, "ood": False, "adapted": None, "channels": 3, "weights": "w/x.safetensors"}
    note = little_change_note([Outcome(clean, rec)])
    expected = "clean.png changed by only 0.4 grey levels (RMS), and the noise-presence detector finds no noise in it"
    assert note == expected + ": nothing to remove"
    note = little_change_note([Outcome(noisy, rec)])
    assert "but the noise-presence detector finds noise in it, which the model reads as signal: try" in note
    assert "indeed adapt" in note
    both = little_change_note([Outcome(clean, rec), Outcome(noisy, rec)])
    assert both.startswith("2 of 2 images changed by less than") and "finds noise in 1 of 2 it checked" in both
    # a file that cannot be read again (or stdin) is not checked: the note is the one without the detector
    assert "fine if it is clean" in little_change_note([Outcome(tmp_path / "gone.png", rec)])


def test_the_ood_line_says_when_the_detector_finds_no_noise_in_flagged_images(tmp_path, detector):
    from conftest import write_png

    from indeed_cli.cli.denoise import ood_warning
    from indeed_cli.pipelines import Outcome

    clean = write_png(tmp_path / "clean.png", (scene().transpose(1, 2, 0) * 255).round().astype(np.uint8))
    noisy_img = camera_pair(scene(seed=1), "heavy", 2)[0]
    noisy = write_png(tmp_path / "noisy.png", (noisy_img.transpose(1, 2, 0) * 255).round().astype(np.uint8))
    rec = {"ood": True, "ood_score": 0.6, "ood_threshold": 0.4, "adapted": None, "channels": 3, "weights": "w/x"}
    assert ood_warning([Outcome(clean, rec)]).endswith(
        "but the noise-presence detector finds no noise in it: nothing to remove"
    )
    both = ood_warning([Outcome(clean, rec), Outcome(noisy, rec)])
    assert "finds noise in 1 of 2 it checked: it may be left in place; rerun with --auto-adapt" in both
    assert "may be left in place; rerun with --auto-adapt" in ood_warning([Outcome(tmp_path / "gone.png", rec)])


def test_models_names_the_bundled_detector(run_cli, detector):
    code, _, err = run_cli("models")
    assert code == 0 and "Also bundled:" in err and "noise-presence.safetensors" in err
    assert "noise-presence-texture.safetensors" in err


def test_ag_auto_scores_each_image_once(detector, monkeypatch):
    """AG with objective auto adapts twice (the ELBO, then the recorrupted fallback): each image is scored
    once, before both, and neither pass leaves an image out for its score."""
    from indeed_cli.tasks.adaptation import adapt, runner

    calls = []
    real = runner.noise_presence_scores
    monkeypatch.setattr(runner, "noise_presence_scores", lambda ims, **kw: calls.extend(ims) or real(ims, **kw))
    clean, noisy = scene(64, 64), camera_pair(scene(64, 64, seed=2), "heavy", 4)[0]
    res = adapt(tiny_checkpoint(3), [clean, noisy], AdaptConfig(steps=1, eval_every=1, noise_check=True))
    assert len(calls) == 2  # two images, scored once
    assert res.fallback is not None and res.noise_scores[0] <= 0 < res.noise_scores[1]
    assert res.adapted_images[0] is True  # the folder's adaptation is the one without the check


def test_scores_of_many_images_at_once_are_each_image_scored_alone(detector, monkeypatch):
    """Images of several sizes, a gray one and one read on tiles, scored together in batches of a few pixels
    (the batch bound forces several calls per shape): the same scores as each image's own map, in order."""
    monkeypatch.setattr(npres, "NOISE_BATCH_PIXELS_CPU", 2 * 64 * 64)
    monkeypatch.setattr(npres, "NOISE_WHOLE_PIXELS", 96 * 96)
    monkeypatch.setattr(npres, "NOISE_TILE", 64)
    images = [scene(64, 64, seed=s) for s in range(3)] + [np.zeros((1, 64, 64), np.float32), scene(48, 80, seed=5)]
    images.append(camera_pair(scene(128, 192, seed=6), "medium", 1)[0])  # over NOISE_WHOLE_PIXELS: 6 tiles
    together = npres.noise_presence_scores(images, detector)
    assert together[3] is None and all(v is not None for i, v in enumerate(together) if i != 3)
    with torch.no_grad():
        for i in (0, 1, 2, 4):
            alone = float(detector.logit_map(torch.tensor(images[i])[None]).mean())
            assert together[i] == pytest.approx(alone, abs=1e-5)
        tiles = npres._tiles(torch.tensor(images[5]))
        assert len(tiles) == 6
        alone = float(torch.stack([detector.logit_map(t[None]).mean() for t in tiles]).mean())
    assert together[5] == pytest.approx(alone, abs=1e-5)
    assert npres.noise_presence_scores(images[3:4], detector) == [None]


def _save_detector(path: Path, net: "npres.NoisePresenceNet", **meta) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(net.state_dict(), str(path), metadata={"config": json.dumps({"width": net.width, **meta})})
    return path


def test_the_bundled_score_is_the_first_detectors_or_the_seconds_beyond_its_margin(tmp_path, monkeypatch):
    first, second = npres.NoisePresenceNet(8).eval(), npres.NoisePresenceNet(8).eval()
    torch.manual_seed(1)
    for p in second.parameters():  # a different detector: different scores
        p.data.normal_(0, 0.3)
    _save_detector(tmp_path / npres.NOISE_PRESENCE_FILE, first)
    monkeypatch.setenv("INDEED_WEIGHTS_DIR", str(tmp_path))
    images = [scene(64, 80, s) for s in range(4)] + [np.zeros((1, 32, 32), np.float32)]
    alone = npres.noise_presence_scores(images)  # without the second file: the first detector's mean logit
    with torch.no_grad():
        assert alone[:4] == pytest.approx([float(first(torch.tensor(im)[None])) for im in images[:4]], abs=1e-5)
    assert alone[4] is None and npres.noise_weight_map(images[0]) is None
    _save_detector(tmp_path / npres.NOISE_TEXTURE_FILE, second, threshold=3.0, map_temperature=4.0)
    both = npres.noise_presence_scores(images)
    with torch.no_grad():
        s2 = [float(second(torch.tensor(im)[None])) for im in images[:4]]
    assert both[:4] == pytest.approx([max(a, b - 3.0) for a, b in zip(alone[:4], s2)], abs=1e-5)
    assert both[4] is None
    # a detector given explicitly is scored alone
    assert npres.noise_presence_scores(images[:4], first) == pytest.approx(alone[:4], abs=1e-6)


def test_the_blend_weights_are_the_second_detectors_map_at_its_temperature_tiled_or_whole(monkeypatch):
    net = npres.NoisePresenceNet(8).eval()
    torch.manual_seed(2)
    for p in net.parameters():
        p.data.normal_(0, 0.3)
    net.temperature = 4.0
    image = scene(150, 170, 3)
    whole = npres.noise_weight_map(image, net)
    with torch.no_grad():  # 150 x 170: 37 x 42 cells, upsampled by 4 and the last rows and columns repeated
        logits = net.logit_map(torch.tensor(image)[None]) / 4
        up = torch.nn.functional.interpolate(torch.sigmoid(logits), scale_factor=4, mode="bilinear")[0, 0].numpy()
    assert whole.shape == (150, 170) and whole.dtype == np.float32
    np.testing.assert_allclose(whole[:148, :168], up, atol=1e-6)
    np.testing.assert_array_equal(whole[148:, :168], np.repeat(up[-1:], 2, 0))
    assert 0 <= whole.min() and whole.max() <= 1
    monkeypatch.setattr(npres, "NOISE_MAP_TILE", 64)  # tiles with margins give the whole image's map
    np.testing.assert_allclose(npres.noise_weight_map(image, net), whole, atol=1e-5)
    assert npres.noise_weight_map(image[:1], net) is None


def test_oag_blends_only_the_recorrupted_objectives_output_and_keeps_the_decomposition_whole(monkeypatch):
    base = tiny_checkpoint()
    moved = tiny_model(3, seed=5)  # stands in for adapted weights
    adapted = Checkpoint(moved, moved.cfg, {}, {}, "tiny")
    y = camera_pair(scene(64, 64, 4), "heavy", 0)[0]
    w = np.linspace(0, 1, 64 * 64, dtype=np.float32).reshape(64, 64)
    monkeypatch.setattr(choice, "noise_weight_map", lambda image, device: w)
    opts = InferenceOptions(precision="fp32")
    plain, ours = denoise_with_stats(base, y, opts)[0], denoise_with_stats(adapted, y, opts)[0]
    r2r = AdaptResult(adapted, best_step=3, objective="recorrupted")
    out, _, weights = oag_output(base, r2r, y, opts)
    assert weights is w
    np.testing.assert_allclose(out, noise_map_blend(plain, ours, w), atol=1e-6)
    np.testing.assert_allclose(out[..., 0, 0], plain[..., 0, 0], atol=1e-6)  # weight 0: the plain output
    np.testing.assert_allclose(out[..., -1, -1], ours[..., -1, -1], atol=1e-6)  # weight 1: the adapted one
    dec, _ = oag_decomposition(base, r2r, y, opts)
    np.testing.assert_allclose(dec.maps["L"] + dec.maps["S"], out, atol=1e-5)
    N = dec.in_scale(1.0)["N"]
    np.testing.assert_allclose(dec.maps["L"] + dec.maps["S"] + N, y, atol=1e-5)
    for elbo in (AdaptResult(adapted, best_step=3, objective="elbo"), AdaptResult(adapted, best_step=0)):
        out, _, weights = oag_output(base, elbo, y, opts)
        assert weights is None
        np.testing.assert_allclose(out, ours, atol=1e-6)
        np.testing.assert_allclose(
            oag_decomposition(base, elbo, y, opts)[0].maps["S"], decompose(adapted, y, opts).maps["S"]
        )
