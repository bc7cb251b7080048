"""Scaling of decomposition maps for viewing, and the side-by-side panel figure.

Scalings (docs/guide/decompose.md):
  Y, L, L + S      as images, clipped to [0, 1]
  S, N             signed: 0.5 + x / (2 * p99.5(|x|)), mid-gray = 0
  sigma_L, sigma_S x / p99.5(x), black = 0
  mu_omega, mu_lambda  log10, stretched between the 1st and 99th percentiles,
                   averaged over colour channels (bright = large precision:
                   for mu_omega, "S is zero here"; for mu_lambda, "little noise here")
The panel puts a scale bar under each map with the values its ends stand for, in the image's
units (0-255 for 8-bit images; precisions in 1/units²), and, given the per-tile mu_gamma, their
histogram (the paper's Fig. 6): log10 mu_gamma of every rank-one component of every tile and
channel, the bar between the components the rank index counts (small mu_gamma: in use) and
those it does not (large mu_gamma: switched off).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw


def _pct(x: np.ndarray, q: float) -> float:
    v = float(np.percentile(x, q))
    return v if v > 0 else 1e-12


@dataclass
class View:
    """A map ready to show: (C, h, w) in [0, 1], and what black and white stand for."""

    image: np.ndarray
    low: str
    high: str


def view_signed(x: np.ndarray, scale: float = 1.0) -> View:
    a = _pct(np.abs(x), 99.5)
    return View(np.clip(0.5 + x / (2 * a), 0, 1), f"-{a * scale:.3g}", f"+{a * scale:.3g}")


def view_positive(x: np.ndarray, scale: float = 1.0) -> View:
    a = _pct(x, 99.5)
    return View(np.clip(x / a, 0, 1), "0", f"{a * scale:.3g}")


def view_log(x: np.ndarray, scale: float = 1.0) -> View:
    lg = np.log10(np.maximum(x, 1e-30)).mean(0, keepdims=True)
    lo, hi = np.percentile(lg, 1), np.percentile(lg, 99)
    units = 2 * np.log10(scale)  # a precision in 1/units² is the [0, 1] one divided by scale²
    return View(np.clip((lg - lo) / max(hi - lo, 1e-9), 0, 1), f"1e{lo - units:.1f}", f"1e{hi - units:.1f}")


def view_image(x: np.ndarray, scale: float = 1.0) -> View:
    return View(np.clip(x, 0, 1), "0", f"{scale:g}")


GAMMA_KEPT, GAMMA_PRUNED = (30, 90, 200), (200, 120, 40)


def view_gamma_histogram(mu_gamma: np.ndarray, kept: np.ndarray, h: int, w: int) -> View:
    """Histogram of log10 mu_gamma (any shape; ``kept`` of the same shape marks the components the
    rank index counts) as an (3, h, w) picture: blue bars for counted components stacked under
    orange ones for the others; the ends stand for the smallest and largest value (in [0, 1]
    image scale: mu_gamma is a precision of the factors, whose scale is the image's)."""
    lg = np.log10(np.maximum(np.asarray(mu_gamma, np.float64).ravel(), 1e-30))
    keep = np.asarray(kept, bool).ravel()
    lo, hi = float(lg.min()), float(lg.max())
    hi = hi if hi > lo else lo + 1.0
    bins = max(8, min(64, w // 3))
    edges = np.linspace(lo, hi, bins + 1)
    n_kept, _ = np.histogram(lg[keep], edges)
    n_off, _ = np.histogram(lg[~keep], edges)
    top = max(1, int((n_kept + n_off).max()))
    img = np.ones((3, h, w), np.float32)
    for b in range(bins):
        x0, x1 = round(b * w / bins), max(round(b * w / bins) + 1, round((b + 1) * w / bins) - 1)
        y_kept = round(h * n_kept[b] / top)
        y_all = round(h * (n_kept[b] + n_off[b]) / top)
        img[:, h - y_kept : h, x0:x1] = np.array(GAMMA_KEPT, np.float32)[:, None, None] / 255
        img[:, h - y_all : h - y_kept, x0:x1] = np.array(GAMMA_PRUNED, np.float32)[:, None, None] / 255
    return View(img, f"1e{lo:.1f}", f"1e{hi:.1f}")


def views(maps: dict[str, np.ndarray], scale: float = 1.0) -> dict[str, View]:
    """Every map of a decomposition ready to show, keyed like the PNG suffixes; ``maps`` in [0, 1]
    scale with ``N`` included, ``scale`` the image's maximum code value (for the labels)."""
    return {
        "L": view_image(maps["L"], scale),
        "S": view_signed(maps["S"], scale),
        "N": view_signed(maps["N"], scale),
        "sigma_L": view_positive(maps["sigma_L"], scale),
        "sigma_S": view_positive(maps["sigma_S"], scale),
        "mu_omega": view_log(maps["mu_omega"], scale),
        "mu_lambda": view_log(maps["mu_lambda"], scale),
    }


def viewable(maps: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """(C, h, w) [0,1] arrays ready to save as 8-bit images, keyed like the PNG suffixes."""
    return {k: v.image for k, v in views(maps).items()}


PANEL_ORDER = (
    ("Y (input)", "Y"),
    ("L + S (denoised)", "X"),
    ("L = AB^T (low rank)", "L"),
    ("S (sparse)", "S"),
    ("N (noise)", "N"),
    ("sigma_L", "sigma_L"),
    ("sigma_S", "sigma_S"),
    ("mu_Omega (log10)", "mu_omega"),
    ("mu_Lambda (log10)", "mu_lambda"),
    ("mu_gamma: counted / off", "mu_gamma"),
)


def panel(
    Y: np.ndarray,
    X: np.ndarray,
    maps: dict[str, View],
    title: str = "",
    note: str = "",
    scale: float = 1.0,
    gamma: tuple[np.ndarray, np.ndarray] | None = None,
) -> Image.Image:
    """One figure: the input Y, the denoised X = L + S and every map of :func:`views` side by side
    (5 columns), each with a scale bar giving the values its black and white stand for; with
    ``gamma`` = (mu_gamma, counted), also their histogram (:func:`view_gamma_histogram`)."""
    h, w = Y.shape[1:]
    factor = min(1.0, 240 / max(h, w))
    th, tw = max(1, round(h * factor)), max(1, round(w * factor))
    shown = {"Y": view_image(Y, scale), "X": view_image(X, scale), **maps}
    order = [(name, key) for name, key in PANEL_ORDER if key in shown or (key == "mu_gamma" and gamma is not None)]
    if gamma is not None:
        shown["mu_gamma"] = view_gamma_histogram(*gamma, max(th, 40), max(tw, 40))
    pad, label, bar = 6, 14, 16
    cols = 5
    rows = (len(order) + (1 if note else 0) + cols - 1) // cols
    top = 20 if title else 0
    cell_h = label + th + bar + pad
    fig = Image.new("RGB", (cols * (tw + pad) + pad, top + rows * cell_h + pad), "white")
    draw = ImageDraw.Draw(fig)
    if title:
        draw.text((pad, 4), title, fill="black")
    ramp = np.repeat(np.linspace(0, 255, tw, dtype=np.float32)[None], 5, 0).astype(np.uint8)
    for i, (name, key) in enumerate(order):
        view = shown[key]
        a = np.round(np.clip(view.image, 0, 1) * 255).astype(np.uint8)
        a = np.repeat(a, 3, 0) if a.shape[0] == 1 else a
        resample = Image.NEAREST if key == "mu_gamma" else Image.BILINEAR
        tile = Image.fromarray(a.transpose(1, 2, 0), "RGB").resize((tw, th), resample)
        x = pad + (i % cols) * (tw + pad)
        y = top + pad + (i // cols) * cell_h
        draw.text((x, y), name, fill="black")
        fig.paste(tile, (x, y + label))
        fig.paste(Image.fromarray(ramp, "L").convert("RGB"), (x, y + label + th + 1))
        draw.text((x, y + label + th + 6), view.low, fill="black")
        right = draw.textlength(view.high) if hasattr(draw, "textlength") else 6 * len(view.high)
        draw.text((x + tw - right, y + label + th + 6), view.high, fill="black")
    if note:  # the cell after the last map
        i = len(order)
        x, y = pad + (i % cols) * (tw + pad), top + pad + (i // cols) * cell_h
        draw.multiline_text((x, y + label), note, fill="black", spacing=3)
    return fig


def elbo_plane(points: list[tuple[str, tuple[float, float], tuple[float, float] | None]], ood: dict | None,
               title: str = "", size: int = 640) -> Image.Image:  # fmt: skip
    """The paper's Fig. 7 for some images: each image's (l_rank, l_sparse) per pixel before adaptation
    (blue) and after (orange, joined by a line), over the training images' tiles stored with the
    checkpoint's OOD statistics (gray); a point far from the gray cloud is out of distribution.

    ``points``: (name, before, after or None); ``ood``: the checkpoint's ``extra["ood"]`` or None."""
    train = np.empty((0, 2))
    if ood and ood.get("points"):
        train = np.asarray(ood["points"], dtype=np.float64) * np.asarray(ood["std"]) + np.asarray(ood["mean"])
    xy = np.concatenate([train] + [np.asarray([b] + ([a] if a else [])) for _, b, a in points]) if points else train
    lo, hi = xy.min(0), xy.max(0)
    pad = 0.08 * np.maximum(hi - lo, 1e-6)
    lo, hi = lo - pad, hi + pad
    margin, top = 60, 30 if title else 10
    fig = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(fig)
    plot = size - margin - 10

    def at(p) -> tuple[float, float]:
        u = (np.asarray(p) - lo) / (hi - lo)
        return margin + u[0] * plot, top + (1 - u[1]) * (plot - top)

    draw.rectangle([margin, top, margin + plot, top + plot - top], outline="black")
    for t in range(5):  # ticks: four intervals on each axis
        vx, vy = lo[0] + (hi[0] - lo[0]) * t / 4, lo[1] + (hi[1] - lo[1]) * t / 4
        x, _ = at((vx, lo[1]))
        _, y = at((lo[0], vy))
        draw.text((x - 12, top + plot - top + 4), f"{vx:.3g}", fill="black")
        draw.text((4, y - 6), f"{vy:.3g}", fill="black")
    draw.text((margin + plot // 2 - 60, size - 18), "l_rank per pixel", fill="black")
    draw.text((2, top + (plot - top) // 2 - 20), "l_sparse\nper\npixel", fill="black")
    if title:
        draw.text((margin, 6), title, fill="black")
    for p in train:
        x, y = at(p)
        draw.point((x, y), fill=(170, 170, 170))
    for name, before, after in points:
        bx, by = at(before)
        if after is not None:
            ax, ay = at(after)
            draw.line([bx, by, ax, ay], fill=(120, 120, 120))
            draw.ellipse([ax - 3, ay - 3, ax + 3, ay + 3], fill=(230, 120, 20))
        draw.ellipse([bx - 3, by - 3, bx + 3, by + 3], fill=(30, 90, 200))
        if len(points) <= 20:  # names, while they stay readable
            draw.text((bx + 5, by - 5), name, fill=(30, 90, 200))
    legend = "gray: training tiles   blue: images before adaptation   orange: after"
    draw.text((margin + 4, top + 4), legend, fill="black")
    return fig
