"""Scaling of decomposition maps for viewing, and the side-by-side panel figure.

Scalings (docs/cli.md):
  Y, L             as images, clipped to [0, 1]
  S, N             signed: 0.5 + x / (2 * p99.5(|x|)), mid-gray = 0
  sigma_L, sigma_S x / p99.5(x), black = 0
  mu_omega, mu_lambda  log10, stretched between the 1st and 99th percentiles,
                   averaged over colour channels (bright = large precision:
                   for mu_omega, "S is zero here"; for mu_lambda, "little noise here")
"""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw


def _pct(x: np.ndarray, q: float) -> float:
    v = float(np.percentile(x, q))
    return v if v > 0 else 1e-12


def view_signed(x: np.ndarray) -> np.ndarray:
    return np.clip(0.5 + x / (2 * _pct(np.abs(x), 99.5)), 0, 1)


def view_positive(x: np.ndarray) -> np.ndarray:
    return np.clip(x / _pct(x, 99.5), 0, 1)


def view_log(x: np.ndarray) -> np.ndarray:
    lg = np.log10(np.maximum(x, 1e-30)).mean(0, keepdims=True)
    lo, hi = np.percentile(lg, 1), np.percentile(lg, 99)
    return np.clip((lg - lo) / max(hi - lo, 1e-9), 0, 1)


def viewable(maps: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """(C, h, w) [0,1] arrays ready to save as 8-bit images, keyed like the PNG suffixes."""
    return {
        "L": np.clip(maps["L"], 0, 1),
        "S": view_signed(maps["S"]),
        "N": view_signed(maps["N"]),
        "sigma_L": view_positive(maps["sigma_L"]),
        "sigma_S": view_positive(maps["sigma_S"]),
        "mu_omega": view_log(maps["mu_omega"]),
        "mu_lambda": view_log(maps["mu_lambda"]),
    }


def panel(Y: np.ndarray, views: dict[str, np.ndarray], title: str = "") -> Image.Image:
    """One figure: Y, L, S, N, sigma_L, sigma_S, mu_Omega, mu_Lambda side by side with labels."""
    order = [
        ("Y", np.clip(Y, 0, 1)),
        ("L = AB^T", views["L"]),
        ("S", views["S"]),
        ("N", views["N"]),
        ("sigma_L", views["sigma_L"]),
        ("sigma_S", views["sigma_S"]),
        ("mu_Omega (log)", views["mu_omega"]),
        ("mu_Lambda (log)", views["mu_lambda"]),
    ]
    h, w = Y.shape[1:]
    scale = min(1.0, 320 / max(h, w))
    th, tw = max(1, round(h * scale)), max(1, round(w * scale))
    pad, label = 6, 16
    cols = 4
    rows = (len(order) + cols - 1) // cols
    top = 20 if title else 0
    fig = Image.new("RGB", (cols * (tw + pad) + pad, top + rows * (th + label + pad) + pad), "white")
    draw = ImageDraw.Draw(fig)
    if title:
        draw.text((pad, 4), title, fill="black")
    for i, (name, arr) in enumerate(order):
        a = np.round(np.clip(arr, 0, 1) * 255).astype(np.uint8)
        a = np.repeat(a, 3, 0) if a.shape[0] == 1 else a
        tile = Image.fromarray(a.transpose(1, 2, 0), "RGB").resize((tw, th), Image.BILINEAR)
        x = pad + (i % cols) * (tw + pad)
        y = top + pad + (i // cols) * (th + label + pad)
        draw.text((x, y), name, fill="black")
        fig.paste(tile, (x, y + label))
    return fig
