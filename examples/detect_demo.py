#!/usr/bin/env python3
"""A self-contained anomaly-detection demo on procedural textures (no dataset needed).

    python examples/detect_demo.py make demo/                  # demo/normal/*.png, demo/test/*.png (+ masks)
    indeed train --task detect --data demo/normal --val-count 16 --channels 1 --out runs/demo
    indeed detect demo/test --maps demo/maps --weights runs/demo/model.safetensors
    python examples/detect_demo.py figure demo/ docs/images/detect-demo.png

Normal images: a brushed-metal-like surface (oriented smoothed noise, faint machining
stripes, slow shading), different at every seed. Test images: the same kind of surface with
one defect each: a dark pit, a bright scratch, a stain, and one defect-free image. The defects
are drawn here, not by the training's synthetic-anomaly generator. Their masks go to
demo/truth/ (not beside the images, so that `indeed detect demo/test` sees only images).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from PIL import Image

SIZE = 256


def _smooth(x: np.ndarray, sy: float, sx: float) -> np.ndarray:
    """Anisotropic Gaussian blur by FFT (periodic edges are fine for a texture)."""
    fy = np.fft.fftfreq(x.shape[0])[:, None]
    fx = np.fft.fftfreq(x.shape[1])[None, :]
    k = np.exp(-2 * np.pi**2 * ((fy * sy) ** 2 + (fx * sx) ** 2))
    return np.real(np.fft.ifft2(np.fft.fft2(x) * k))


def surface(seed: int, size: int = SIZE) -> np.ndarray:
    """One normal image in [0, 1]: oriented grain + stripes + shading."""
    rng = np.random.default_rng(seed)
    grain = _smooth(rng.normal(size=(size, size)), 0.6, 6.0)
    grain /= grain.std() + 1e-8
    yy, xx = np.mgrid[0:size, 0:size] / size
    stripes = np.sin(2 * np.pi * (yy * rng.uniform(18, 24) + rng.uniform(0, 1)))
    shade = 0.08 * np.sin(2 * np.pi * (xx * rng.uniform(0.3, 0.8) + yy * rng.uniform(0.2, 0.6)) + rng.uniform(0, 6))
    img = 0.5 + rng.uniform(-0.05, 0.05) + 0.045 * grain + 0.02 * stripes + shade
    return np.clip(img, 0, 1)


def add_defect(img: np.ndarray, kind: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    h, w = img.shape
    yy, xx = np.mgrid[0:h, 0:w].astype(float)
    cy, cx = rng.uniform(0.3, 0.7) * h, rng.uniform(0.3, 0.7) * w
    if kind == "pit":
        r = rng.uniform(6, 10)
        d = np.hypot(yy - cy, (xx - cx) * 0.8) / r
        mask = d < 1
        out = img - 0.25 * np.clip(1 - d**2, 0, 1)
    elif kind == "scratch":
        ang = rng.uniform(0, np.pi)
        dist = np.abs((yy - cy) * np.cos(ang) - (xx - cx) * np.sin(ang))
        along = np.abs((yy - cy) * np.sin(ang) + (xx - cx) * np.cos(ang))
        mask = (dist < 1.5) & (along < 45)
        out = img + 0.2 * mask * np.exp(-(dist**2) / 2)
    else:  # stain: a soft darker blob with an irregular edge
        noise = _smooth(rng.normal(size=(h, w)), 4, 4)
        d = np.hypot(yy - cy, xx - cx) / rng.uniform(14, 20) + 0.8 * noise / (noise.std() + 1e-8) * 0.15
        mask = d < 1
        out = img - 0.12 * np.clip(1.2 - d, 0, 1)
    return np.clip(out, 0, 1), mask


def save(arr: np.ndarray, path: Path) -> None:
    Image.fromarray(np.round(np.clip(arr, 0, 1) * 255).astype(np.uint8)).save(path)


def make(root: Path, n_normal: int = 96) -> None:
    (root / "normal").mkdir(parents=True, exist_ok=True)
    (root / "test").mkdir(parents=True, exist_ok=True)
    (root / "truth").mkdir(parents=True, exist_ok=True)
    for i in range(n_normal):
        save(surface(i), root / "normal" / f"normal_{i:03d}.png")
    for j, kind in enumerate(["pit", "scratch", "stain"]):
        img, mask = add_defect(surface(10_000 + j), kind, j)
        save(img, root / "test" / f"{kind}.png")
        save(mask.astype(float), root / "truth" / f"{kind}.png")
    save(surface(20_000), root / "test" / "good.png")
    print(f"wrote {n_normal} normal images to {root / 'normal'} and 4 test images to {root / 'test'}")


def figure(root: Path, out: Path) -> None:
    """Rows: test image | overlay written by `indeed detect` | binary mask | ground truth."""
    rows = []
    for stem in ["pit", "scratch", "stain", "good"]:
        tiles = [
            Image.open(root / "test" / f"{stem}.png").convert("RGB"),
            Image.open(root / "maps" / f"{stem}_overlay.png").convert("RGB"),
            Image.open(root / "maps" / f"{stem}_mask.png").convert("RGB"),
        ]
        gt = root / "truth" / f"{stem}.png"
        tiles.append(Image.open(gt).convert("RGB") if gt.exists() else Image.new("RGB", tiles[0].size))
        rows.append(np.concatenate([np.asarray(t.resize((SIZE, SIZE))) for t in tiles], 1))
    gap = np.full((4, rows[0].shape[1], 3), 255, np.uint8)
    grid = np.concatenate([x for r in rows for x in (r, gap)][:-1], 0)
    out.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(grid).resize((grid.shape[1] // 2, grid.shape[0] // 2), Image.LANCZOS).save(out, optimize=True)
    print(f"wrote {out}")


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("make", "figure"):
        sys.exit(__doc__)
    if sys.argv[1] == "make":
        make(Path(sys.argv[2]))
    else:
        figure(Path(sys.argv[2]), Path(sys.argv[3]))
