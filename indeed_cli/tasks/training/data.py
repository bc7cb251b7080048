"""Training images: listing, loading, the scale pyramid and random patches."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ...inference import reflect_index, training_channels
from ...io import is_image_path, read_image
from ..detection.filters import resize, scaled_size


def list_images(spec: str | Path) -> list[Path]:
    """A folder (searched recursively) or a .txt list of paths relative to the list's folder."""
    spec = Path(spec)
    if spec.is_file() and spec.suffix == ".txt":
        lines = [ln.strip() for ln in spec.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        return [spec.parent / ln for ln in lines]
    if spec.is_dir():
        return sorted(p for p in spec.rglob("*") if p.is_file() and is_image_path(p))
    raise FileNotFoundError(f"training data not found: {spec}")


def load_images(paths: list[Path], channels: int) -> list[torch.Tensor]:
    """uint8 (C, h, w) tensors with the model's channels (:func:`indeed_cli.inference.training_channels`)."""
    out = []
    for p in paths:
        img = training_channels(read_image(p).data, channels)
        out.append(torch.from_numpy(np.round(img * 255).astype(np.uint8)))
    return out


def image_pyramid(images: list[torch.Tensor], scales: tuple[float, ...]) -> list[torch.Tensor]:
    """Each uint8 image at each scale (antialiased bilinear), so that a 128 crop of a downscaled
    copy shows a whole defect with the normal surface around it (detect --scales).  The resampling
    is the detector read-out's, so that training and read-out see the same sizes."""
    out = []
    for s in scales:
        for im in images:
            if s == 1:
                out.append(im)
                continue
            small = resize(im.numpy().astype(np.float32), scaled_size(*im.shape[1:], s))
            out.append(torch.from_numpy(np.round(small).clip(0, 255).astype(np.uint8)))
    return out


class PatchSampler:
    """Random crops with the 8 flips/rotations, drawn from images kept on the device."""

    def __init__(
        self,
        images: list[torch.Tensor],
        patch: int,
        device: torch.device,
        generator: torch.Generator,
        pad_small: bool = False,
    ):
        small = [tuple(im.shape[1:]) for im in images if min(im.shape[1:]) < patch]
        if small and not pad_small:
            raise ValueError(f"{len(small)} training images are smaller than the patch size {patch}")
        if small:  # mirror-extend narrow images (anomaly data comes in all sizes)
            images = [pad_to(im, patch) for im in images]
        self.images = [im.to(device) for im in images]
        self.patch, self.device, self.gen = patch, device, generator

    def sample(self, n: int) -> torch.Tensor:
        g, p = self.gen, self.patch
        idx = torch.randint(len(self.images), (n,), generator=g).tolist()
        ops = torch.randint(8, (n,), generator=g).tolist()
        crops = []
        for i, op in zip(idx, ops):
            im = self.images[i]
            y = int(torch.randint(im.shape[1] - p + 1, (1,), generator=g))
            x = int(torch.randint(im.shape[2] - p + 1, (1,), generator=g))
            c = im[:, y : y + p, x : x + p]
            if op & 4:
                c = c.transpose(1, 2)
            crops.append(torch.rot90(c, op & 3, (1, 2)))
        return torch.stack(crops).float() / 255.0


def pad_to(im: torch.Tensor, size: int) -> torch.Tensor:
    """Mirror-extend a narrow image to ``size`` the way the tiler does at inference (repeated
    reflection, any shortfall), so that training and inference see the same borders."""
    h, w = im.shape[1:]
    rows = torch.from_numpy(reflect_index(np.arange(max(h, size)), h))
    cols = torch.from_numpy(reflect_index(np.arange(max(w, size)), w))
    return im[:, rows][:, :, cols]
