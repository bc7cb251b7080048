"""OOD score: k-NN distance in standardised (l_rank, l_sparse), stored by `indeed calibrate`."""

import json

import numpy as np
import pytest

from indeed_cli.tasks.ood import fit_ood, ood_report, ood_score


def _curve_images(n=60, tiles=6, seed=0):
    """Training tile features on a curve (as they lie along the noise level): one noise level
    per image, its tiles jittered around that point."""
    rng = np.random.default_rng(seed)
    out = []
    for t in rng.uniform(0, 1, n):
        out.append(np.stack([5 + 2 * t, 9 - 3 * t**2], 0)[None] + rng.normal(0, 0.01, (tiles, 2)))
    return out


def test_threshold_is_the_quantile_of_leave_one_image_out_scores():
    imgs = _curve_images(20, 3)
    ood = fit_ood(imgs, k=3, quantile=0.9)
    allf = np.concatenate(imgs)
    z = [(f - allf.mean(0)) / allf.std(0) for f in imgs]
    own = []
    for i, zi in enumerate(z):
        others = np.concatenate([zj for j, zj in enumerate(z) if j != i])
        d = np.sqrt(((zi[:, None] - others[None]) ** 2).sum(-1))
        own.append(np.median(np.sort(d, 1)[:, 2]))
    assert ood["threshold"] == pytest.approx(np.quantile(own, 0.9), rel=1e-6)
    assert ood["n"] == 20 and ood["n_points"] == 60 and len(ood["points"]) == 60


def test_points_off_the_training_curve_score_above_threshold():
    ood = fit_ood(_curve_images())
    rng = np.random.default_rng(1)
    on = np.array([[6.0, 9 - 3 * 0.25]]) + rng.normal(0, 0.01, (6, 2))  # t = 0.5, on the curve
    off = np.array([[6.0, 9.0]]) + rng.normal(0, 0.01, (6, 2))  # inside the curve's bounding box, off it
    assert ood_score(on, ood) < ood["threshold"] < ood_score(off, ood)
    assert ood_report(off, ood)["ood"] is True and ood_report(on, ood)["ood"] is False
    assert ood_report(on, None) == {"ood_score": None, "ood_threshold": None, "ood": None}
    # the median over tiles: one odd tile does not flag an image
    mixed = np.concatenate([on, off[:1]])
    assert ood_report(mixed, ood)["ood"] is False
    json.dumps(ood)  # stored as checkpoint metadata


def test_fit_ood_rejects_bad_input():
    with pytest.raises(ValueError):
        fit_ood([np.zeros((3, 2))])
    with pytest.raises(ValueError):
        fit_ood([np.zeros((3, 2)), np.zeros((0, 2))])


def test_knn_distance_is_the_kth_smallest_and_points_are_converted_once():
    from indeed_cli.tasks.ood import _knn_distance, _points, ood_score

    rng = np.random.default_rng(0)
    z, pts = rng.normal(size=(9, 2)), rng.normal(size=(50, 2))
    brute = np.sort(np.sqrt(((z[:, None] - pts[None]) ** 2).sum(-1)), 1)
    for k in (1, 5, 50, 80):  # k beyond the points: the farthest one
        np.testing.assert_array_equal(_knn_distance(z, pts, k), brute[:, min(k, 50) - 1])
    stats = {"mean": [0.0, 0.0], "std": [1.0, 1.0], "points": pts.tolist(), "k": 5}
    assert _points(stats) is _points(stats)  # one conversion per point list
    assert ood_score(z, stats) == float(np.median(brute[:, 4]))
    other = {**stats, "points": (pts + 1).tolist()}
    np.testing.assert_array_equal(_points(other), pts + 1)  # a new list is converted anew
