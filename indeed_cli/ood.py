"""Per-image out-of-distribution (OOD) score from the ELBO terms (paper §4.5, Fig. 7).

The paper shows that images unlike the training data (e.g. real camera noise for a model
trained on synthetic Gaussian noise) sit away from the training set in the plane of
(l_rank, l_sparse), the per-pixel KL terms of the low-rank and sparse posteriors.  We make
that a number:

1. features: (l_rank, l_sparse) of the image, per element of Y, as `indeed decompose`
   reports them (means over tiles);
2. at training time (or later, `indeed calibrate-ood`), the same features of training
   images with the training noise (sigma ~ U(0, sigma_max], half clipped to 8 bits) are
   standardised (mean, std per feature) and stored in the checkpoint metadata
   (``extra["ood"]``) together with the standardised points themselves;
3. score = distance, in standardised units, from the image's features to the k-th nearest
   training point.  The training features lie on a curve parameterised by the noise level,
   not in a Gaussian blob, so a nearest-neighbour distance follows that curve where a
   Mahalanobis distance to the mean would not;
4. threshold = the 99th percentile of the same (leave-one-out) score of the training points:
   an image is flagged OOD when its score exceeds it.
"""
from __future__ import annotations

import numpy as np

FEATURES = ("l_rank", "l_sparse")
DEFAULT_K = 5
DEFAULT_QUANTILE = 0.99


def ood_features(stats: dict) -> np.ndarray:
    """(l_rank, l_sparse) of one image from :meth:`Decomposed.stats`."""
    return np.array([float(stats[k]) for k in FEATURES], dtype=np.float64)


def _knn_distance(z: np.ndarray, points: np.ndarray, k: int, exclude_self: bool = False) -> np.ndarray:
    """Distance from each row of z to its k-th nearest row of points."""
    d = np.sqrt(((z[:, None, :] - points[None, :, :]) ** 2).sum(-1))
    if exclude_self:
        np.fill_diagonal(d, np.inf)
    k = min(k, d.shape[1] - (1 if exclude_self else 0))
    return np.sort(d, axis=1)[:, k - 1]


def fit_ood(features: np.ndarray, k: int = DEFAULT_K, quantile: float = DEFAULT_QUANTILE) -> dict:
    """Training statistics for :func:`ood_score` from an (n, 2) array of training features.

    Returns a JSON-able dict: mean, std, the standardised points, k and the threshold
    (the ``quantile`` of the training points' own leave-one-out scores).
    """
    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2 or f.shape[1] != len(FEATURES) or len(f) < 2:
        raise ValueError(f"need an (n >= 2, {len(FEATURES)}) array of training features")
    mean, std = f.mean(0), f.std(0) + 1e-12
    z = (f - mean) / std
    own = _knn_distance(z, z, k, exclude_self=True)
    return {"features": list(FEATURES), "mean": mean.tolist(), "std": std.tolist(),
            "points": np.round(z, 4).tolist(), "k": int(k), "quantile": quantile,
            "threshold": float(np.quantile(own, quantile)), "n": int(len(f))}


def ood_score(stats: dict, ood: dict) -> float:
    """Standardised k-NN distance of one image's (l_rank, l_sparse) to the training points."""
    z = (ood_features(stats) - np.asarray(ood["mean"])) / np.asarray(ood["std"])
    return float(_knn_distance(z[None], np.asarray(ood["points"]), int(ood["k"]))[0])


def ood_report(stats: dict, ood: dict | None) -> dict:
    """The fields `decompose/denoise --json` print: score, threshold, flag (None without stats)."""
    if not ood:
        return {"ood_score": None, "ood_threshold": None, "ood": None}
    score = ood_score(stats, ood)
    return {"ood_score": round(score, 4), "ood_threshold": round(float(ood["threshold"]), 4),
            "ood": bool(score > ood["threshold"])}


def training_features(ckpt, images, n: int = 256, sigma_max: float = 75.0, clip_prob: float = 0.5,
                      crop: int = 256, seed: int = 0, opts=None) -> np.ndarray:
    """(n, 2) features of training images under the training noise, for :func:`fit_ood`.

    ``images`` are uint8 (C, h, w) tensors as :func:`indeed_cli.training.load_images` gives;
    each sample is a random ``crop`` x ``crop`` crop (the whole image when smaller) with
    AWGN sigma ~ U(0, sigma_max], clipped to 8 bits with probability ``clip_prob``, exactly
    the noise of :func:`indeed_cli.training.add_noise`.
    """
    import torch

    from .inference import decompose
    from .training import add_noise
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        im = images[int(torch.randint(len(images), (1,), generator=gen))]
        h, w = im.shape[1:]
        y0 = int(torch.randint(max(1, h - crop + 1), (1,), generator=gen))
        x0 = int(torch.randint(max(1, w - crop + 1), (1,), generator=gen))
        clean = im[None, :, y0:y0 + crop, x0:x0 + crop].float() / 255.0
        noisy, _ = add_noise(clean, sigma_max, clip_prob, gen)
        out.append(ood_features(decompose(ckpt, noisy[0].numpy(), opts).stats()))
    return np.stack(out)


def calibrate_ood(ckpt, images, n: int = 256, seed: int = 0) -> dict:
    """OOD statistics for ``ckpt["extra"]["ood"]`` from clean training images (uint8 tensors),
    under the noise the checkpoint was trained with (its metadata's sigma_max, clip_prob)."""
    t = ckpt.training
    feats = training_features(ckpt, images, n=n, sigma_max=float(t.get("sigma_max", 75.0)),
                              clip_prob=float(t.get("clip_prob", 0.5)), seed=seed)
    return {**fit_ood(feats), "seed": seed}
