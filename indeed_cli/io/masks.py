"""Ground-truth defect masks stored beside their images (``X.png`` next to ``X.jpg``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def load_mask(image_path: str | Path, shape: tuple[int, int], suffix: str = ".png") -> np.ndarray:
    """Ground-truth mask of an image: ``X<suffix>`` beside ``X.jpg``, binarised at 128;
    all-normal when there is none.  Raises ValueError when its size differs from ``shape``."""
    mpath = Path(image_path).with_suffix(suffix)
    if not mpath.exists() or mpath == Path(image_path):
        return np.zeros(shape, bool)
    mask = np.asarray(Image.open(mpath).convert("L")) >= 128
    if mask.shape != tuple(shape):
        raise ValueError(f"{mpath}: mask size {mask.shape} differs from the image {tuple(shape)}")
    return mask
