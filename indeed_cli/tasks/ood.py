"""Per-image out-of-distribution (OOD) score from the ELBO terms (paper §4.5, Fig. 7).

The paper shows that images unlike the training data (e.g. real camera noise for a model
trained on synthetic Gaussian noise) sit away from the training set in the plane of
(l_rank, l_sparse), the per-pixel KL terms of the low-rank and sparse posteriors.  We make
that a number:

1. features: (l_rank, l_sparse) per element of Y, for every inference tile of the image
   (`Decomposed.tiles`; the image-level values `indeed decompose` reports are their means);
2. at training time (or later, `indeed calibrate`), the same tile features of training images
   under the training noise (sigma ~ U(0, sigma_max], half clipped to 8 bits) are standardised
   (mean, std per feature) and stored in the checkpoint metadata (``extra["ood"]``) together
   with the standardised points themselves;
3. score = the median over the image's tiles of the distance, in standardised units, from the
   tile's features to the k-th nearest training tile.  The training features lie on a curve
   parameterised by the noise level, not in a Gaussian blob, which a nearest-neighbour distance
   follows; the median over tiles keeps a few unusual tiles (an edge, a flat sky) from deciding;
4. threshold = the 99th percentile of the same score of the training images, each scored
   against the tiles of the other training images: an image is flagged when its score exceeds it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch

from ..inference import denoise_with_stats
from ..inference.decomposition import WHOLE_IMAGE_PIXELS
from .training.noise import add_noise

FEATURES = ("l_rank", "l_sparse")
DEFAULT_K = 5
DEFAULT_QUANTILE = 0.99
MIN_SAMPLES = 16  # noisy training crops a time-bounded calibration measures at least


def ood_features(tiles) -> np.ndarray:
    """(n_tiles, 2) array of (l_rank, l_sparse) per tile: from a :class:`Decomposed` or from the
    per-tile statistics of :func:`indeed_cli.inference.denoise_with_stats`."""
    tiles = getattr(tiles, "tiles", tiles)
    return np.stack([np.asarray(tiles[k], dtype=np.float64).ravel() for k in FEATURES], 1)


def _knn_distance(z: np.ndarray, points: np.ndarray, k: int) -> np.ndarray:
    """Distance from each row of z to its k-th nearest row of points (a partial sort: on a GPU
    run, scoring an image against thousands of training tiles is CPU work that delays the next)."""
    d2 = np.zeros((len(z), len(points)))
    for j in range(z.shape[1]):  # per feature: no (n, m, features) temporary
        d2 += (z[:, j, None] - points[None, :, j]) ** 2
    kth = min(k, d2.shape[1]) - 1
    return np.sqrt(np.partition(d2, kth, axis=1)[:, kth])


def _image_score(z: np.ndarray, points: np.ndarray, k: int) -> float:
    return float(np.median(_knn_distance(z, points, k)))


def fit_ood(images: list[np.ndarray], k: int = DEFAULT_K, quantile: float = DEFAULT_QUANTILE) -> dict:
    """Training statistics for :func:`ood_score` from per-image (n_i, 2) tile features.

    Returns a JSON-able dict: mean, std, the standardised tile points, k and the threshold
    (the ``quantile`` of the training images' scores, each against the other images' tiles).
    """
    feats = [np.asarray(f, dtype=np.float64).reshape(-1, len(FEATURES)) for f in images]
    if len(feats) < 2 or any(len(f) == 0 for f in feats):
        raise ValueError(f"need tile features (n, {len(FEATURES)}) of at least 2 images")
    allf = np.concatenate(feats)
    mean, std = allf.mean(0), allf.std(0) + 1e-12
    zs = [(f - mean) / std for f in feats]
    owner = np.concatenate([np.full(len(z), i) for i, z in enumerate(zs)])
    points = np.concatenate(zs)
    own = [_image_score(z, points[owner != i], k) for i, z in enumerate(zs)]
    return {
        "features": list(FEATURES),
        "per": "tile",
        "aggregate": "median",
        "mean": mean.tolist(),
        "std": std.tolist(),
        "points": np.round(points, 4).tolist(),
        "k": int(k),
        "quantile": quantile,
        "threshold": float(np.quantile(own, quantile)),
        "n": len(feats),
        "n_points": int(len(points)),
    }


_POINTS: dict[int, tuple[list, np.ndarray]] = {}  # id of a stats' point list -> (the list, its array)


def _points(ood: dict) -> np.ndarray:
    """The training tiles of ``ood`` as an array, converted once per list (the statistics are
    JSON-able lists in the checkpoint; converting thousands of points took a millisecond an image)."""
    lst = ood["points"]
    hit = _POINTS.get(id(lst))
    if hit is None or hit[0] is not lst:
        if len(_POINTS) > 16:
            _POINTS.clear()
        hit = _POINTS[id(lst)] = (lst, np.asarray(lst, dtype=np.float64))
    return hit[1]


def ood_score(features: np.ndarray, ood: dict) -> float:
    """Median over tiles of the standardised k-NN distance to the training tiles."""
    z = (np.asarray(features, dtype=np.float64).reshape(-1, len(FEATURES)) - np.asarray(ood["mean"])) / np.asarray(
        ood["std"]
    )
    return _image_score(z, _points(ood), int(ood["k"]))


def image_ood_score(ckpt, image: np.ndarray, opts=None) -> float | None:
    """The OOD score of one (C, h, w) image under ``ckpt`` (None when the checkpoint has no
    statistics): one inference pass, as `indeed denoise --json` computes it."""
    ood = ckpt.extra.get("ood")
    if not ood:
        return None
    return ood_score(ood_features(denoise_with_stats(ckpt, image, opts)[1]), ood)


def ood_report(features: np.ndarray, ood: dict | None) -> dict:
    """The fields `decompose/denoise --json` print: score, threshold, flag (None without stats)."""
    if not ood:
        return {"ood_score": None, "ood_threshold": None, "ood": None}
    score = ood_score(features, ood)
    return {
        "ood_score": round(score, 4),
        "ood_threshold": round(float(ood["threshold"]), 4),
        "ood": bool(score > ood["threshold"]),
    }


def training_features(
    ckpt,
    images,
    n: int = 256,
    sigma_max: float = 75.0,
    clip_prob: float = 0.5,
    crop: int = 512,
    seed: int = 0,
    opts=None,
    max_seconds: float | None = None,
    progress: Callable[[int], object] | None = None,
) -> list[np.ndarray]:
    """Tile features of ``n`` noisy training images, for :func:`fit_ood`.

    ``images`` are uint8 (C, h, w) tensors as :func:`indeed_cli.tasks.training.load_images` gives;
    each sample is a random ``crop`` x ``crop`` crop (the whole image when smaller) with
    AWGN sigma ~ U(0, sigma_max], clipped to 8 bits with probability ``clip_prob``, exactly
    the noise of :func:`indeed_cli.tasks.training.add_noise`.  ``max_seconds`` ends the sampling
    early (after at least :data:`MIN_SAMPLES`): a CPU takes seconds per sample.
    """
    gen = torch.Generator().manual_seed(seed)
    out: list[np.ndarray] = []
    t0 = time.perf_counter()
    for _ in range(n):
        if max_seconds is not None and len(out) >= MIN_SAMPLES and time.perf_counter() - t0 > max_seconds:
            break
        im = images[int(torch.randint(len(images), (1,), generator=gen))]
        h, w = im.shape[1:]
        y0 = int(torch.randint(max(1, h - crop + 1), (1,), generator=gen))
        x0 = int(torch.randint(max(1, w - crop + 1), (1,), generator=gen))
        clean = im[None, :, y0 : y0 + crop, x0 : x0 + crop].float() / 255.0
        noisy, _ = add_noise(clean, sigma_max, clip_prob, gen)
        out.append(ood_features(denoise_with_stats(ckpt, noisy[0].numpy(), opts)[1]))
        if progress is not None:
            progress(1)
    return out


def calibrate_ood(ckpt, images, n: int = 256, seed: int = 0, max_seconds: float | None = None, progress=None) -> dict:
    """OOD statistics for ``ckpt["extra"]["ood"]`` from clean training images (uint8 tensors),
    under the noise the checkpoint was trained with (its metadata's sigma_max, clip_prob); at
    most ``n`` samples, fewer when ``max_seconds`` runs out (``n`` in the result says how many)."""
    t = ckpt.training
    feats = training_features(
        ckpt,
        images,
        n=n,
        sigma_max=float(t.get("sigma_max", 75.0)),
        clip_prob=float(t.get("clip_prob", 0.5)),
        seed=seed,
        max_seconds=max_seconds,
        progress=progress,
    )
    # which read-out made the features (docs/model.md): scores compare only under the same one
    readout = f"whole image up to {WHOLE_IMAGE_PIXELS:,} pixels (f_thetaS), mu_L by tiles"
    return {**fit_ood(feats), "seed": seed, "readout": readout}
