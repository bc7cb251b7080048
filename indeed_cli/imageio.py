"""Reading and writing images without losing what the user gave us.

- EXIF orientation is applied on read (photos come out upright).
- Gray stays gray, RGB stays RGB; an alpha channel is passed through untouched.
- 8-bit and 16-bit gray keep their depth; values are processed in [0, 1] floats.
- Corrupt, empty, truncated or non-image files raise :class:`ImageError` with a
  one-line message.  Writes go to a temporary file that is renamed into place, so
  an interrupted run never leaves a partial output.
"""
from __future__ import annotations

import io
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp", ".ppm", ".pgm", ".pnm"}
Image.MAX_IMAGE_PIXELS = 400_000_000  # 24 MP is normal here; beyond 400 MP ask the user to split


class ImageError(Exception):
    """An input image cannot be used, or an output cannot be written; one-line message."""


@dataclass
class LoadedImage:
    """Pixels as float32 (C, h, w) in [0, 1], plus what is needed to write back alike."""

    data: np.ndarray
    alpha: np.ndarray | None  # (h, w) in the file's own dtype, passed through
    bit_depth: int  # 8 or 16
    path: Path

    @property
    def channels(self) -> int:
        return self.data.shape[0]

    @property
    def scale(self) -> float:
        """Maximum code value of the file (255 or 65535): the 'input scale'."""
        return float(2 ** self.bit_depth - 1)

    @property
    def size(self) -> tuple[int, int]:
        return self.data.shape[1], self.data.shape[2]


STDIO = "-"  # an input or output path meaning standard input / output (shell pipelines)


def is_stdio(path: str | Path) -> bool:
    return str(path) == STDIO


def _png_colour_depth(head: bytes) -> tuple[int, int] | None:
    """(bit depth, colour type) from the first 26 bytes of a PNG, or None if not a PNG."""
    if len(head) < 26 or head[:8] != b"\x89PNG\r\n\x1a\n":
        return None
    return head[24], head[25]


def read_image(path: str | Path) -> LoadedImage:
    """An image file, or standard input for ``-`` (any format Pillow reads)."""
    path = Path(path)
    if is_stdio(path):
        name, data = "<stdin>", sys.stdin.buffer.read()
        if not data:
            raise ImageError(f"{name}: empty input (0 bytes)")
        head, source = data[:26], io.BytesIO(data)
    else:
        name = str(path)
        if not path.exists():
            raise ImageError(f"{path}: no such file")
        if path.is_dir():
            raise ImageError(f"{path}: is a folder, not an image")
        if path.stat().st_size == 0:
            raise ImageError(f"{path}: empty file (0 bytes)")
        with open(path, "rb") as f:
            head = f.read(26)
        source = path
    png = _png_colour_depth(head)
    if png and png[0] == 16 and png[1] in (2, 6):
        raise ImageError(f"{name}: 16-bit colour PNG is not supported yet (Pillow would drop it to 8 bits); "
                         "use 8-bit colour or 16-bit gray")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source) as im:
                im.load()
                im = ImageOps.exif_transpose(im)
    except UnidentifiedImageError:
        raise ImageError(f"{name}: not an image file (or an unsupported format)") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ImageError(f"{name}: corrupt or truncated image ({msg})") from None
    return _from_pil(im, path)


def _from_pil(im: Image.Image, path: Path) -> LoadedImage:
    mode = im.mode
    alpha = None
    if mode in ("I;16", "I;16B", "I;16L", "I;16N"):
        arr = np.asarray(im).astype(np.float32)[None] / 65535.0
        return LoadedImage(arr, None, 16, path)
    if mode == "I":  # 32-bit int, e.g. 16-bit PNG read by some Pillow versions
        a = np.asarray(im)
        if a.min() < 0 or a.max() > 65535:
            raise ImageError(f"{path}: 32-bit integer images are not supported")
        return LoadedImage(a.astype(np.float32)[None] / 65535.0, None, 16, path)
    if mode == "F":
        raise ImageError(f"{path}: floating-point images are not supported yet; save as 8- or 16-bit")
    if mode == "P":
        im = im.convert("RGBA" if "transparency" in im.info else "RGB")
    elif mode == "1":
        im = im.convert("L")
    elif mode == "PA":
        im = im.convert("RGBA")
    elif mode not in ("L", "LA", "RGB", "RGBA"):
        im = im.convert("RGB")  # CMYK, YCbCr, LAB, HSV ...
    arr = np.asarray(im)
    if im.mode in ("LA", "RGBA"):
        alpha = arr[..., -1].copy()
        arr = arr[..., :-1]
    if arr.ndim == 2:
        arr = arr[..., None]
    data = arr.transpose(2, 0, 1).astype(np.float32)  # one float copy, scaled in place
    data /= 255.0
    return LoadedImage(data, alpha, 8, path)


def to_pil(data: np.ndarray, bit_depth: int = 8, alpha: np.ndarray | None = None) -> Image.Image:
    """(C, h, w) float in [0, 1] -> PIL image of the given depth, with alpha re-attached."""
    C = data.shape[0]
    x = np.clip(data, 0.0, 1.0)  # the only float temporary; scaled and rounded in place
    if bit_depth == 16:
        if C != 1 or alpha is not None:
            raise ImageError("16-bit output is supported for gray images without alpha only")
        x *= 65535
        return Image.fromarray(np.round(x[0], out=x[0]).astype(np.uint16))
    x *= 255
    q = np.round(x, out=x).astype(np.uint8).transpose(1, 2, 0)
    if alpha is not None:
        q = np.concatenate([q, alpha[..., None].astype(np.uint8)], axis=-1)
        return Image.fromarray(q, "LA" if C == 1 else "RGBA")
    return Image.fromarray(q[..., 0] if C == 1 else q, "L" if C == 1 else "RGB")


def atomic_save(image: Image.Image | bytes, path: str | Path, **save_kwargs) -> Path:
    """Save an image (or bytes) to ``path`` atomically, via :func:`atomic_write_via`."""
    path = Path(path)

    def writer(tmp: Path) -> None:
        if isinstance(image, bytes):
            tmp.write_bytes(image)
        else:
            fmt = {".jpg": "JPEG", ".jpeg": "JPEG"}.get(path.suffix.lower(), None)
            image.save(tmp, format=fmt or Image.registered_extensions().get(path.suffix.lower(), "PNG"), **save_kwargs)
    return atomic_write_via(path, writer)


def atomic_write_via(path: str | Path, writer) -> Path:
    """Run ``writer(tmp_path)`` on a temp file in the same folder (same suffix), then rename it
    into place: an interrupted run never leaves a partial output."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}{path.suffix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        writer(tmp)
        os.replace(tmp, path)
    except OSError as e:
        raise ImageError(f"{path}: cannot write ({e.strerror or e})") from None
    finally:
        try:
            tmp.unlink()
        except OSError:
            pass
    return path


def write_image(path: str | Path, data: np.ndarray, like: LoadedImage | None = None, bit_depth: int | None = None) -> Path:
    """Write (C, h, w) [0, 1] data with the depth and alpha of ``like``; ``-`` writes a PNG to
    standard output."""
    depth = bit_depth or (like.bit_depth if like else 8)
    alpha = like.alpha if like is not None else None
    if alpha is not None and alpha.shape != data.shape[1:]:
        alpha = None
    image = to_pil(data, depth, alpha)
    if is_stdio(path):
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        try:
            sys.stdout.buffer.write(buf.getvalue())
            sys.stdout.buffer.flush()
        except OSError as e:  # e.g. the reading end of the pipe went away
            raise ImageError(f"<stdout>: cannot write ({e.strerror or e})") from None
        return Path(path)
    return atomic_save(image, path)


def is_image_path(p: Path) -> bool:
    return p.suffix.lower() in IMAGE_SUFFIXES
