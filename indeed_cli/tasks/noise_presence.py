"""Is there noise in this photograph?  A small learned detector that InDeedOAG and InDeedAG ask before
adapting (docs/model.md, Eq. (noise presence); docs/reports/2026-12-07-noise-presence.md).

Adapting to an image without noise removes detail: held-out photographs without noise lost 1.9 to
5.6 dB on average under OAG, through either objective, and no hand-made statistic (the noise level of
flat blocks, the colour or the spatial correlation of what the read-outs remove, the OOD score, the
first-change ratio) told them from photographs under light real camera noise, whose noise is
correlated, low-frequency and partly removed by JPEG in flat regions.  A convolutional network
trained on pairs of the same patches with and without noise does: synthetic camera noise
(:mod:`.camera_noise`, light to heavy, half of them JPEG-compressed together with their clean
reference, so that compression alone is no cue) and white noise, plus the real noisy / mean
pairs of PolyU100's scene-dev half.

The network reads two frequency bands of Y (Y − box₃(Y) and box₃(Y) − box₉(Y): noise, not content)
and gives a logit per 4 × 4 pixels; an image's score is the mean of that map (Eq. noise presence):
above 0 the detector finds noise, at or below 0 it does not.  0 is the logit's own boundary (the
training loss's), not a value fitted to a set.  Colour images only; gray images get no score.

A second bundled detector, trained with channel-correlated (Malvar-He-Cutler) camera noise and texture
photographs among its examples (``tools/train_noise_presence.py --mhc 0.5 --textures``), sees the light
channel-correlated noise the first misses.  The bundled score is max(s, s_tex − t_tex), t_tex = 3 from its
file's metadata: noise is found where either finds it, the second only with that margin, at which its
false alarms on development crops without noise were the first's (docs/reports/2026-12-08-noise-map-blend.md).
Its logit map also weighs InDeedOAG's recorrupted output against the plain one per pixel (Eq. noise-map
blend, :func:`noise_weight_map`).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ..inference.tiling import host_to_device
from ..model.registry import weights_dir

NOISE_PRESENCE_FILE = "noise/noise-presence.safetensors"  # under the bundled weights folder
NOISE_TEXTURE_FILE = "noise/noise-presence-texture.safetensors"  # the second detector (module doc)
# images up to this many pixels are scored whole; larger ones on a grid of tiles of NOISE_TILE pixels,
# at most NOISE_TILES of them, so that a 24-megapixel photograph does not hold 32 full-size feature maps
NOISE_WHOLE_PIXELS = 1024 * 1024
NOISE_TILE = 512
NOISE_TILES = 16
# pixels scored in one call on a GPU (images, or tiles, of one shape stacked): 16 of 512 × 512, about 1.6 GB
# of feature maps at their peak; on a CPU, where batching saves no time, one tile's worth (an image at least
# that large alone), as one at a time had held (16 tiles at once had raised the peak by 1.6 GB, one by 86 MB)
NOISE_BATCH_PIXELS = 4 * 1024 * 1024
NOISE_BATCH_PIXELS_CPU = NOISE_TILE * NOISE_TILE
NOISE_THRESHOLD = 0.0  # the logit's boundary: above it, noise was found


def _box(x: torch.Tensor, k: int) -> torch.Tensor:
    return F.avg_pool2d(F.pad(x, (k // 2,) * 4, mode="reflect"), k, 1)


class NoisePresenceNet(nn.Module):
    """Eq. (noise presence): a map of noise logits, one per 4 × 4 pixels, from two bands of a colour image."""

    def __init__(self, width: int = 32, context: int = 0, threshold: float = 0.0, temperature: float = 1.0):
        super().__init__()
        w = width
        self.width, self.context = w, context
        # from the file's metadata: the margin its score needs in the bundled pair (module doc), and the
        # temperature of its blend weights (Eq. noise-map blend)
        self.threshold, self.temperature = threshold, temperature
        # ``context`` dilated 3 x 3 layers at a quarter of the resolution (dilations 2, 4, ...): one of dilation
        # d reaches d map cells, 4 d pixels, farther to each side (context 2: 24); 0 is the bundled network
        wide = [
            m for k in range(context) for m in (nn.Conv2d(2 * w, 2 * w, 3, padding=2 << k, dilation=2 << k), nn.ReLU())
        ]
        self.body = nn.Sequential(
            nn.Conv2d(6, w, 3, padding=1), nn.ReLU(), nn.Conv2d(w, w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(w, 2 * w, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(2 * w, 2 * w, 3, padding=1), nn.ReLU(), *wide, nn.Conv2d(2 * w, 1, 1),
        )  # fmt: skip

    @staticmethod
    def bands(x: torch.Tensor) -> torch.Tensor:
        """(n, 3, h, w) in [0, 1] -> (n, 6, h, w): Y − box₃(Y) and box₃(Y) − box₉(Y), times 20."""
        b3 = _box(x, 3)
        return 20 * torch.cat([x - b3, b3 - _box(x, 9)], 1)

    def logit_map(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.bands(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """One logit per image of ``x`` (n, 3, h, w): the mean of its map."""
        return self.logit_map(x).mean((1, 2, 3))


_DETECTORS: dict[str, NoisePresenceNet | None] = {}


def noise_presence_path() -> Path:
    return weights_dir() / NOISE_PRESENCE_FILE


def noise_texture_path() -> Path:
    return weights_dir() / NOISE_TEXTURE_FILE


def load_noise_detector(device: torch.device | str = "cpu", path: Path | None = None) -> NoisePresenceNet | None:
    """The bundled detector on ``device`` (loaded once per device), or None where its file is missing
    (then no image is refused: adaptation runs as it did without it)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    path = Path(path) if path is not None else noise_presence_path()
    key = f"{path}|{device}"
    if key not in _DETECTORS:
        if not path.is_file():
            _DETECTORS[key] = None
        else:
            with safe_open(str(path), "pt") as f:
                meta = json.loads((f.metadata() or {}).get("config", "{}"))
            net = NoisePresenceNet(
                int(meta.get("width", 32)),
                int(meta.get("context", 0)),
                float(meta.get("threshold", NOISE_THRESHOLD)),
                float(meta.get("map_temperature", 1.0)),
            )
            net.load_state_dict(load_file(str(path)))
            _DETECTORS[key] = net.eval().requires_grad_(False).to(device)
    return _DETECTORS[key]


def load_texture_detector(device: torch.device | str = "cpu") -> NoisePresenceNet | None:
    """The bundled second detector (module doc) on ``device``, or None where its file is missing (then the
    bundled score is the first detector's and OAG's output is not blended)."""
    return load_noise_detector(device, noise_texture_path())


def _tiles(image: torch.Tensor) -> list[torch.Tensor]:
    """The whole (3, h, w) image where it is small enough, else up to NOISE_TILES tiles of NOISE_TILE on an
    even grid over it."""
    _, h, w = image.shape
    if h * w <= NOISE_WHOLE_PIXELS or min(h, w) < NOISE_TILE:
        return [image]
    rows = np.linspace(0, h - NOISE_TILE, max(1, min(4, h // NOISE_TILE))).round().astype(int)
    cols = np.linspace(0, w - NOISE_TILE, max(1, min(4, w // NOISE_TILE))).round().astype(int)
    return [image[:, r : r + NOISE_TILE, c : c + NOISE_TILE] for r in rows for c in cols][:NOISE_TILES]


def noise_presence_score(
    image, detector: NoisePresenceNet | None = None, device: torch.device | str = "cpu"
) -> float | None:
    """Eq. (noise presence) of one image (C, h, w) in [0, 1] (array or tensor): the mean noise logit
    (above NOISE_THRESHOLD: noise found).  None for a gray image, an image smaller than 16 × 16, or
    without the detector's weights."""
    return noise_presence_scores([image], detector, device)[0]


def noise_presence_scores(
    images: list, detector: NoisePresenceNet | None = None, device: torch.device | str = "cpu"
) -> list[float | None]:
    """:func:`noise_presence_score` of each image: with ``detector``, its mean logit; without, the bundled
    score max(s, s_tex − t_tex) of the module doc (the first detector's alone where the second is missing).
    The tiles of one shape are scored together, at most NOISE_BATCH_PIXELS pixels per call
    (NOISE_BATCH_PIXELS_CPU on a CPU), and the scores brought to the host once: scored one by one, each score
    waited for the device before the next image was sent (an OAG group of 32 on a GPU)."""
    net = detector if detector is not None else load_noise_detector(device)
    if net is None:
        return [None] * len(images)
    texture = load_texture_detector(next(net.parameters()).device) if detector is None else None
    if texture is None:
        return _mean_logits(images, [net])[0]
    scores, second = _mean_logits(images, [net, texture])  # each batch sent to the device once for both
    return [None if a is None else max(a, b - texture.threshold) for a, b in zip(scores, second)]


def _mean_logits(images: list, nets: list[NoisePresenceNet]) -> list[list[float | None]]:
    """Per net of ``nets`` (on one device), each image's mean logit (None for a gray or too small image), as
    :func:`noise_presence_scores` batches them."""
    out: list[list[float | None]] = [[None] * len(images) for _ in nets]
    dev = next(nets[0].parameters()).device
    tiles: list[tuple[int, torch.Tensor]] = []  # (image, tile)
    for i, image in enumerate(images):
        x = torch.as_tensor(np.asarray(image, dtype=np.float32) if not torch.is_tensor(image) else image)
        if x.dim() == 3 and x.shape[0] == 3 and min(x.shape[1:]) >= 16:
            tiles += [(i, t) for t in _tiles(x)]
    if not tiles:
        return out
    by_shape: dict[tuple, list[int]] = {}
    for k, (_, t) in enumerate(tiles):
        by_shape.setdefault(tuple(t.shape), []).append(k)
    means: list = [None] * len(tiles)
    with torch.no_grad():
        for (_, h, w), members in by_shape.items():
            step = max(1, (NOISE_BATCH_PIXELS_CPU if dev.type == "cpu" else NOISE_BATCH_PIXELS) // (h * w))
            for c in range(0, len(members), step):
                run = members[c : c + step]
                batch = torch.stack([tiles[k][1].to(tiles[run[0]][1].device) for k in run]).float()
                batch = host_to_device(batch, dev) if batch.device.type == "cpu" else batch.to(dev)
                for k, m in zip(run, torch.stack([net.logit_map(batch).mean((1, 2, 3)) for net in nets], 1)):
                    means[k] = m  # (len(nets),)
        of_image: dict[int, list[int]] = {}  # each scored image's tiles
        for k, (i, _) in enumerate(tiles):
            of_image.setdefault(i, []).append(k)
        scored = sorted(of_image)
        per_image = torch.stack([torch.stack([means[k] for k in of_image[i]]).mean(0) for i in scored])
    for i, row in zip(scored, per_image.tolist()):
        for j, v in enumerate(row):
            out[j][i] = v
    return out


def noise_found(score: float | None) -> bool:
    """Whether an image with this score may be adapted: noise found, or no score to go by."""
    return score is None or score > NOISE_THRESHOLD


# Eq. (noise-map blend): images scored whole up to this many pixels; larger ones in tiles of NOISE_MAP_TILE
# pixels read with NOISE_MAP_MARGIN more on each side (the network's view is under 32 pixels), both multiples
# of 4 so that every tile's 4 x 4 cells are the whole image's
NOISE_MAP_TILE = 1024
NOISE_MAP_MARGIN = 32


def noise_weight_map(
    image, detector: NoisePresenceNet | None = None, device: torch.device | str = "cpu"
) -> np.ndarray | None:
    """Eq. (noise-map blend): the weights w = sigmoid(l / T) of a (3, h, w) image in [0, 1], (h, w) float32, l the
    logit map of ``detector`` (default: the bundled second detector on ``device``; T its file's ``map_temperature``)
    bilinearly upsampled from its 4 x 4 cells (edge rows and columns that do not fill a cell repeat the last).
    None for a gray image, an image under 16 pixels a side, or without the detector's weights."""
    net = detector if detector is not None else load_texture_detector(device)
    x = torch.as_tensor(np.asarray(image, dtype=np.float32) if not torch.is_tensor(image) else image).float()
    if net is None or x.dim() != 3 or x.shape[0] != 3 or min(x.shape[1:]) < 16:
        return None
    dev = next(net.parameters()).device
    _, h, w = x.shape
    T, m = NOISE_MAP_TILE, NOISE_MAP_MARGIN
    out = np.empty((h, w), np.float32)
    with torch.no_grad():
        for r in range(0, h, T):
            for c in range(0, w, T):
                r0, c0 = max(0, r - m), max(0, c - m)
                region = x[:, r0 : min(h, r + T + m), c0 : min(w, c + T + m)]
                logits = net.logit_map(region[None].to(dev)) / net.temperature
                up = F.interpolate(torch.sigmoid(logits), scale_factor=4, mode="bilinear", align_corners=False)
                up = F.pad(up, (0, region.shape[2] - up.shape[3], 0, region.shape[1] - up.shape[2]), mode="replicate")
                rh, cw = min(T, h - r), min(T, w - c)
                out[r : r + rh, c : c + cw] = up[0, 0, r - r0 : r - r0 + rh, c - c0 : c - c0 + cw].cpu().numpy()
    return out
