"""Training sets built from folders of photographs: test-set leak checks, downscaling, crops, a
held-out split and a manifest (tools/build_training_set.py is its command line).

A training image must not be a test image in disguise: re-encoded, resized, cropped, flipped or
turned gray.  :class:`LeakIndex` finds those by normalised cross-correlation of small gray
thumbnails: each test image, shrunk so that its shorter side is ``TEMPLATE`` pixels, is slid over
the candidate shrunk by the same factor times each relative scale in ``LEAK_SCALES`` (a test
image is often a crop of its source downscaled by 2, as Set12's peppers is of Set14's pepper).
A window that correlates at ``LEAK_COARSE`` or more is looked at again around the same place at 4×
the resolution (``LEAK_STEP``) and then with the test image's shorter side ``VERIFY_SIDE``; a match
there at ``LEAK_VERIFY`` or more is a leak.  Pictures of regular structures (façades, grids) reach
0.89 at the middle level against unrelated test images; the last level tells them apart.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, JpegImagePlugin

from .data import list_images

TEMPLATE = 16  # shorter side of a test image's coarse thumbnail
LEAK_SCALES = (1.0, 0.75, 0.5, 0.25)  # test-image pixels per candidate pixel
LEAK_COARSE = 0.70  # low: a crop's offset falls between coarse pixels, which costs correlation
LEAK_STEP = 0.80  # the middle level, 4x the coarse resolution
VERIFY_SIDE = 256  # the test image's shorter side at the last level (or its own size)
LEAK_VERIFY = 0.95
WEBP_LOSSLESS = {"lossless": True, "quality": 100, "method": 6}


def gray_of(im: Image.Image) -> np.ndarray:
    """float32 (h, w) luma in [0, 1] (ITU-R 601, PIL's "L")."""
    return np.asarray(im.convert("L"), dtype=np.float32) / 255.0


def shrink(gray: np.ndarray, factor: float) -> np.ndarray:
    """``gray`` resized by ``factor`` with an area (box) filter; at least 1 pixel a side."""
    h, w = gray.shape
    size = (max(1, round(w * factor)), max(1, round(h * factor)))
    return np.asarray(Image.fromarray(gray, mode="F").resize(size, Image.Resampling.BOX), dtype=np.float32)


def soften(gray: torch.Tensor) -> torch.Tensor:
    """A 3x3 binomial blur: a shift by a fraction of a pixel then costs little correlation."""
    k = torch.tensor([1.0, 2.0, 1.0]) / 4
    x = F.pad(gray[None, None], (1, 1, 1, 1), mode="replicate")
    return F.conv2d(x, (k[:, None] * k[None, :])[None, None])[0, 0]


def is_refined(f: float, side: int) -> bool:
    """Whether factor ``f`` of a test image with shorter side ``side`` is above the coarse level:
    there both thumbnails are softened, since a peak located on the coarse grid is off by a
    fraction of a pixel."""
    return f > TEMPLATE / side


def pixel_digest(im: Image.Image) -> str:
    """sha256 of the decoded RGB pixels and size: the same picture re-encoded digests the same."""
    rgb = im.convert("RGB")
    return hashlib.sha256(np.asarray(rgb).tobytes() + repr(rgb.size).encode()).hexdigest()


def box_sums(x: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """Sum of every h x w window of ``x`` (H, W): (H-h+1, W-w+1), from an integral image."""
    ii = F.pad(x.cumsum(0).cumsum(1), (1, 0, 1, 0))
    return ii[h:, w:] - ii[:-h, w:] - ii[h:, :-w] + ii[:-h, :-w]


def ncc_map(image: torch.Tensor, templates: torch.Tensor) -> torch.Tensor:
    """Normalised cross-correlation of each template (N, h, w) at each valid place of ``image``
    (H, W): (N, H-h+1, W-w+1), in [-1, 1]; flat windows or templates correlate 0.

    The correlation is taken through FFTs and the window sums from integral images, in float64:
    a direct convolution with a large single-channel kernel is hundreds of times slower on a CPU."""
    n, h, w = templates.shape
    H, W = image.shape
    x = image.double()
    t = templates.double()
    t = t - t.mean((1, 2), keepdim=True)
    t_norm = t.flatten(1).norm(dim=1).clamp_min(1e-6)
    # the template's mean is 0, so the window's mean drops out of the numerator; correlating over
    # an (H, W) period never wraps at the valid places
    spec = torch.fft.rfft2(x, s=(H, W)) * torch.fft.rfft2(t, s=(H, W)).conj()
    num = torch.fft.irfft2(spec, s=(H, W))[:, : H - h + 1, : W - w + 1]
    s1 = box_sums(x, h, w)
    s2 = box_sums(x * x, h, w)
    win_norm = (s2 - s1 * s1 / (h * w)).clamp_min(0).sqrt()
    # a window flatter than a quarter of an 8-bit level correlates 0: its normalisation would
    # divide rounding errors by almost nothing
    flat = win_norm < 1e-3 * (h * w) ** 0.5
    ncc = num / (t_norm[:, None, None] * win_norm.clamp_min(1e-12))
    return ncc.masked_fill(flat, 0.0).clamp(-1.0, 1.0).float()


@dataclass
class Leak:
    test: str  # the test image's name
    score: float  # its verified correlation
    scale: float  # test-image pixels per candidate pixel (2: the candidate is a half-size copy)


@dataclass
class LeakIndex:
    """Every test image, as gray thumbnails, to check candidates against (see the module)."""

    names: list[str] = field(default_factory=list)
    grays: list[np.ndarray] = field(default_factory=list)
    sizes: list[float] = field(default_factory=list)  # each entry's size relative to the test image
    digests: dict[str, str] = field(default_factory=dict)
    # (test index, flipped, factor) -> its thumbnail, softened above the coarse level: the same
    # few thumbnails of a test image serve every candidate
    thumbs: dict[tuple[int, bool, float], torch.Tensor] = field(default_factory=dict)

    def add(self, name: str, im: Image.Image) -> None:
        """Index ``im``, and ``im`` at half size: candidates 0.5-4x the test image's size are then
        found at the scales in ``LEAK_SCALES`` (a half- or two-thirds-size copy included)."""
        gray = gray_of(im)
        self.names.append(name)
        self.grays.append(gray)
        self.sizes.append(1.0)
        self.digests[pixel_digest(im)] = name
        if min(gray.shape) >= 2 * TEMPLATE * 4:
            self.names.append(name)
            self.grays.append(shrink(gray, 0.5))
            self.sizes.append(0.5)

    def check(self, im: Image.Image) -> Leak | None:
        """The test image that ``im`` contains or equals (flipped or not), or None."""
        exact = self.digests.get(pixel_digest(im))
        if exact:
            return Leak(exact, 1.0, 1.0)
        cand = gray_of(im)
        shrunk: dict[tuple[float, bool], torch.Tensor] = {}  # the candidate at each factor, shared by the tests

        def cand_at(factor: float, soft: bool) -> torch.Tensor:
            key = (round(factor, 6), soft)
            if key not in shrunk:
                c = torch.from_numpy(shrink(cand, factor).copy())
                shrunk[key] = soften(c) if soft else c
            return shrunk[key]

        # the coarse level of every test image of one size (both flips) in one correlation
        groups: dict[tuple[int, ...], list[tuple[int, bool]]] = {}
        for i, gray in enumerate(self.grays):
            groups.setdefault(gray.shape, []).extend([(i, False), (i, True)])
        best: Leak | None = None
        for shape, members in groups.items():
            side = min(shape)
            levels = [TEMPLATE / side, min(1.0, 4 * TEMPLATE / side), min(1.0, VERIFY_SIDE / side)]
            thumbs = torch.stack([self._test_at(i, flipped, levels[0]) for i, flipped in members])
            for scale in LEAK_SCALES:
                c = cand_at(levels[0] * scale, False)
                if c.shape[0] < thumbs.shape[1] or c.shape[1] < thumbs.shape[2]:
                    continue
                m = ncc_map(c, thumbs)
                scores, where = m.flatten(1).max(1)
                for n in (scores >= LEAK_COARSE).nonzero().flatten().tolist():
                    i, flipped = members[n]
                    score, at = float(scores[n]), divmod(int(where[n]), m.shape[2])
                    test_at = lambda f, i=i, flipped=flipped: self._test_at(i, flipped, f)  # noqa: E731
                    for prev, f in zip(levels, levels[1:]):
                        if score is None or f == prev:
                            continue
                        score, at = self._search(cand_at, test_at, side, scale, f, (at, f / prev), LEAK_STEP)
                    if score is not None and score >= LEAK_VERIFY and (best is None or score > best.score):
                        best = Leak(self.names[i], score, scale / self.sizes[i])
        return best

    def _test_at(self, i: int, flipped: bool, f: float) -> torch.Tensor:
        key = (i, flipped, round(f, 6))
        if key not in self.thumbs:
            test = self.grays[i][:, ::-1] if flipped else self.grays[i]
            t = torch.from_numpy(shrink(np.ascontiguousarray(test), f).copy())
            self.thumbs[key] = soften(t) if is_refined(f, min(test.shape)) else t
        return self.thumbs[key]

    @staticmethod
    def _search(cand_at, test_at, side, scale, f, near, floor):
        """Best correlation of the test image shrunk by ``f`` (``test_at(f)``; its shorter side is
        ``side``) in the candidate shrunk by ``f * scale``, within a few pixels of the peak found at
        the coarser level (``near`` = ((y, x), ratio of the factors)).  (score, (y, x)), or
        (None, None) below ``floor``.  The coarse level itself is searched in :meth:`check`."""
        t = test_at(f)
        c = cand_at(f * scale, is_refined(f, side))
        th, tw = t.shape
        (y, x), ratio = near
        r = int(np.ceil(ratio)) + 2
        y0, x0 = max(0, round(y * ratio) - r), max(0, round(x * ratio) - r)
        c = c[y0 : y0 + th + 2 * r, x0 : x0 + tw + 2 * r]
        if c.shape[0] < th or c.shape[1] < tw:
            return None, None
        m = ncc_map(c, t[None])[0]
        score = float(m.max())
        if score < floor:
            return None, None
        y, x = divmod(int(m.argmax()), m.shape[1])
        return score, (y0 + y, x0 + x)


def leak_index(folders: list[Path]) -> LeakIndex:
    """A :class:`LeakIndex` of every image under ``folders`` (searched recursively)."""
    idx = LeakIndex()
    for folder in folders:
        for p in list_images(folder):
            with Image.open(p) as im:
                idx.add(f"{folder.name}/{p.relative_to(folder)}", im)
    return idx


def crop_boxes(width: int, height: int, crop: int) -> list[tuple[int, int, int, int]]:
    """Non-overlapping ``crop``² boxes (left, top, right, bottom) that tile the image, spread
    evenly so that the margins left over are shared; the whole image for ``crop`` 0."""
    if crop <= 0:
        return [(0, 0, width, height)]
    if width < crop or height < crop:
        return []

    def starts(n: int) -> list[int]:
        k = n // crop
        gap = (n - k * crop) / (k + 1)
        return [round(gap * (i + 1) + crop * i) for i in range(k)]

    return [(x, y, x + crop, y + crop) for y in starts(height) for x in starts(width)]


def is_held_out(key: str, share: float) -> bool:
    """Deterministic split by source image: the same image always lands on the same side."""
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF < share


def encode(im: Image.Image, fmt: str) -> bytes:
    """``png``, ``webp`` (lossless) or ``jpg`` (quality 97, 4:4:4 chroma, so that the crops keep
    full-resolution colour)."""
    buf = io.BytesIO()
    if fmt == "png":
        im.save(buf, "PNG", optimize=True)
    elif fmt == "webp":
        im.save(buf, "WEBP", **WEBP_LOSSLESS)
    elif fmt == "jpg":
        im.save(buf, "JPEG", quality=97, subsampling=0)
    else:
        raise ValueError(f"format must be png, webp or jpg, got {fmt!r}")
    return buf.getvalue()


def chroma_sampling(im: Image.Image) -> str:
    """ "4:2:0", "4:2:2", "4:4:4" for JPEGs, "full" for other formats."""
    if im.format != "JPEG":
        return "full"
    return {0: "4:4:4", 1: "4:2:2", 2: "4:2:0"}.get(JpegImagePlugin.get_sampling(im), "unknown")


def build_training_set(
    sources: list[Path],
    out: Path,
    tests: LeakIndex,
    *,
    downscale: float = 1.0,
    crop: int = 0,
    max_crops: int = 0,
    holdout: float = 0.0,
    fmt: str = "png",
    min_side: int = 0,
) -> dict:
    """Write the crops of every image under ``sources`` into ``out/train`` and ``out/holdout``
    (``holdout``: the share of source images held out), and ``out/manifest.json``.

    Each image is checked against the images already taken (exact pixel duplicates), downscaled
    by ``downscale`` (area filter: 0.5 turns 4:2:0 JPEG chroma into full-resolution chroma and
    averages compression artefacts away), checked against ``tests``, then cut into ``crop``² tiles
    (0: whole), at most ``max_crops`` a source (0: all).  Returns the manifest.
    """
    if not 0 < downscale <= 1:
        raise ValueError(f"downscale must be in (0, 1], got {downscale}")
    if (out / "manifest.json").exists():
        raise FileExistsError(f"{out} already holds a training set (manifest.json); pick a new folder")
    taken: dict[str, str] = {}
    manifest: dict = {
        "sources": [str(s) for s in sources],
        "downscale": downscale,
        "crop": crop,
        "max_crops": max_crops,
        "holdout": holdout,
        "format": fmt,
        "leak_check": {"tests": len(tests.names), "scales": list(LEAK_SCALES), "verify": LEAK_VERIFY},
        "images": [],
        "excluded": [],
    }
    for src in sources:
        for p in list_images(src):
            key = f"{src.name}/{p.relative_to(src).as_posix()}"
            with Image.open(p) as raw:
                raw.load()
                sampling = chroma_sampling(raw)
                im = raw.convert("RGB") if raw.mode not in ("L", "RGB") else raw.copy()
            digest = pixel_digest(im)
            if digest in taken:
                manifest["excluded"].append({"source": key, "reason": "duplicate", "of": taken[digest]})
                continue
            taken[digest] = key
            if downscale < 1:
                size = (max(1, round(im.width * downscale)), max(1, round(im.height * downscale)))
                im = im.resize(size, Image.Resampling.BOX)
            # what is checked is what would be written: a test image inside it at 0.25-2x its size
            leak = tests.check(im)
            if leak:
                manifest["excluded"].append(
                    {"source": key, "reason": "test image", "of": leak.test, "score": round(leak.score, 4)}
                )
                continue
            if min(im.size) < max(min_side, crop):
                manifest["excluded"].append({"source": key, "reason": f"smaller than {max(min_side, crop)} px"})
                continue
            split = "holdout" if is_held_out(key, holdout) else "train"
            boxes = crop_boxes(im.width, im.height, crop)
            if max_crops:
                boxes = [
                    boxes[i] for i in np.linspace(0, len(boxes) - 1, min(max_crops, len(boxes))).round().astype(int)
                ]
            stem = key.replace("/", "__").rsplit(".", 1)[0]
            for j, box in enumerate(boxes):
                name = f"{split}/{stem}" + (f"_{j:02d}" if crop else "") + f".{fmt}"
                data = encode(im.crop(box), fmt)
                (out / name).parent.mkdir(parents=True, exist_ok=True)
                (out / name).write_bytes(data)
                manifest["images"].append(
                    {"file": name, "source": key, "chroma": sampling, "box": list(box), "bytes": len(data)}
                )
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest
