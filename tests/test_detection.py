"""Synthetic anomalies, detection metrics against brute force, and detect training end to end."""
import numpy as np
import pytest
import torch

from indeed_cli.anomaly import AnomalyConfig, perlin, synthesize
from indeed_cli.detection import auroc, average_precision, gaussian_blur, image_score


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
    from indeed_cli.anomaly import PRESETS
    x = torch.rand(48, 1, 64, 64) * 0.5 + 0.25
    Y, UA, M = synthesize(x, torch.Generator().manual_seed(5), None, PRESETS["subtle"])
    Y2, _, _ = synthesize(x, torch.Generator().manual_seed(5), None, PRESETS["subtle"])
    assert torch.equal(Y, Y2) and torch.allclose(Y, x + UA)
    assert (UA * (M == 0)).abs().max() == 0  # nothing changes where the mask is zero
    soft = ((M > 0.05) & (M < 0.95)).flatten(1).float().mean(1)
    assert (soft > 0.02).sum() >= 5  # several anomalies with gradual edges
    _, _, M_strong = synthesize(x, torch.Generator().manual_seed(5), None, PRESETS["strong"])
    assert ((M_strong > 0) & (M_strong < 1)).sum() == 0  # the strong preset keeps hard masks


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


def test_blur_keeps_mass_and_score_finds_the_blob():
    m = np.zeros((40, 60), np.float32)
    m[10:14, 30:34] = 1
    b = gaussian_blur(m, 2)
    assert b.sum() == pytest.approx(m.sum(), rel=1e-4)
    assert image_score(m) > image_score(np.zeros_like(m))


def test_train_detect_end_to_end(tmp_path, run_cli, rng):
    from conftest import write_png
    from indeed_cli.checkpoint import read_metadata
    d = tmp_path / "normal"
    d.mkdir()
    for i in range(5):  # includes an image narrower than the patch
        write_png(d / f"{i}.png", rng.integers(90, 160, (40 if i else 20, 44), dtype=np.uint8))
    code, _, err = run_cli("train", "--task", "detect", "--data", d, "--val-count", "2", "--channels", "1",
                           "--rank", "4", "--sparse-width", "8", "--lowrank-width", "8", "--patch", "32",
                           "--batch", "2", "--steps", "3", "--out", tmp_path / "run", "-q")
    assert code == 0, err
    meta = read_metadata(tmp_path / "run" / "model.safetensors")
    assert meta["config"]["task"] == "detect"
    assert meta["extra"]["detect"]["n_calibration"] == 2 and meta["extra"]["detect"]["threshold"] > 0
    assert meta["training"]["anomalies"]["preset"] == "strong"
    code, _, err = run_cli("train", "--task", "detect", "--data", d, "--val-count", "2", "--channels", "1",
                           "--anomalies", "loud", "--steps", "1", "--out", tmp_path / "run1", "-q")
    assert code == 2 and "--anomalies" in err
    # without held-out normal images there is no threshold to learn: refused before any training
    code, _, err = run_cli("train", "--task", "detect", "--data", d, "--val-count", "0", "--channels", "1",
                           "--steps", "3", "--out", tmp_path / "run0", "-q")
    assert code == 2 and "held-out normal images" in err and not (tmp_path / "run0").exists()
