"""Gray and colour: how a model with one number of channels runs on an image with another.

One rule for inference, adaptation and training data, so that a model sees the same thing everywhere:
  - a colour model on a gray image: the gray plane is replicated to three channels, and the outputs
    are averaged back to one;
  - a gray model on a colour image: each colour channel is a separate gray image (the detector,
    trained on gray surfaces, reads out colour images this way);
  - training a gray model on colour files converts them to luma (ITU-R 601), because a gray model
    is meant for gray photographs, not for one channel of a colour one.
"""

from __future__ import annotations

import numpy as np
from torch import Tensor


class ChannelAdapter:
    """Moves (B, C, h, w) batches between an image's channels and a model's."""

    def __init__(self, model_channels: int, image_channels: int):
        if (model_channels, image_channels) not in ((1, 1), (3, 3), (3, 1), (1, 3)):
            raise ValueError(f"cannot run a {model_channels}-channel model on a {image_channels}-channel image")
        self.model_channels, self.image_channels = model_channels, image_channels

    def to_model(self, x: Tensor) -> Tensor:
        """(B, image C, h, w) -> the model's input: (B, 3, h, w) replicated, or (3B, 1, h, w) split."""
        if self.model_channels == self.image_channels:
            return x
        if self.model_channels == 3:
            return x.expand(-1, 3, -1, -1)
        return x.reshape(-1, 1, *x.shape[-2:])

    def from_model(self, y: Tensor) -> Tensor:
        """The model's output back per image: maps (…, C, h, w) to the image's channels; per-channel
        vectors such as mu_gamma (3B, r) of a gray model on colour become (B, 3r)."""
        if self.model_channels == self.image_channels:
            return y
        if self.model_channels == 3:
            return y.mean(1, keepdim=True) if y.dim() == 4 else y
        if y.dim() == 4:
            return y.reshape(-1, 3, *y.shape[-2:])
        return y.reshape(-1, 3, *y.shape[1:]).flatten(1, 2)

    def images(self, data: np.ndarray) -> list[np.ndarray]:
        """A (C, h, w) image as whole inputs of the model: itself, replicated to colour, or its
        channels as separate gray images (adaptation fits the model to each)."""
        if self.model_channels == self.image_channels:
            return [data]
        if self.model_channels == 3:
            return [np.repeat(data, 3, 0)]
        return [c[None] for c in data]


def as_model_channels(data: np.ndarray, channels: int) -> list[np.ndarray]:
    """A (C, h, w) image as inputs of a ``channels``-channel model (:meth:`ChannelAdapter.images`)."""
    return ChannelAdapter(channels, data.shape[0]).images(data)


def training_channels(img: np.ndarray, channels: int) -> np.ndarray:
    """A (C, h, w) training image with the model's channel count: colour to luma for a gray model,
    gray replicated for a colour one."""
    if channels == 1 and img.shape[0] == 3:
        return (0.299 * img[0] + 0.587 * img[1] + 0.114 * img[2])[None]
    if channels == 3 and img.shape[0] == 1:
        return np.repeat(img, 3, 0)
    return img


__all__ = ["ChannelAdapter", "as_model_channels", "training_channels"]
