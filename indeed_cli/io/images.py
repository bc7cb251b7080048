"""Reading and writing images without losing what the user gave us.

- EXIF orientation is applied on read (photos come out upright).
- Gray stays gray, RGB stays RGB; an alpha channel is passed through untouched.
- 8-bit and 16-bit images keep their depth; values are processed in [0, 1] floats.  16-bit
  colour and 16-bit alpha PNGs, which Pillow would reduce to 8 bits, are decoded and written
  by :mod:`indeed_cli.png16`.
- Corrupt, empty, truncated or non-image files raise :class:`ImageError` with a
  one-line message.  Writes go to a temporary file that is renamed into place, so
  an interrupted run never leaves a partial output.
"""

from __future__ import annotations

import io
import os
import re
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from . import png16

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".tif", ".tiff", ".bmp", ".webp", ".ppm", ".pgm", ".pnm"}
# formats an output file may be written in, named by its suffix; only PNG and TIFF hold 16 bits
OUTPUT_SUFFIXES = (".png", ".tif", ".tiff", ".jpg", ".jpeg", ".webp", ".bmp")
EIGHT_BIT_ONLY = {".jpg", ".jpeg", ".webp", ".bmp"}
NO_ALPHA = {".jpg", ".jpeg"}
JPEG_QUALITY = 95  # Pillow's default is 75, visibly blocky on a denoised photo
# zlib level of the PNGs written (Pillow's default is 6): level 1 encodes a denoised 512x512 colour
# image about 5 times faster for files about 5% larger; on two CPU cores the encoding shares them with
# the network (docs/guide/denoise.md, "Large images, speed and memory"). Same pixels at every level.
PNG_LEVEL = 1
Image.MAX_IMAGE_PIXELS = 400_000_000  # 24 MP is normal here; beyond 400 MP ask the user to split


class ImageError(Exception):
    """An input image cannot be used, or an output cannot be written; one-line message."""


@dataclass
class LoadedImage:
    """Pixels as float32 (C, h, w) in [0, 1], plus what is needed to write back alike."""

    data: np.ndarray
    alpha: np.ndarray | None  # (h, w) in the file's own dtype (uint8 or uint16), passed through
    bit_depth: int  # 8 or 16
    path: Path

    @property
    def channels(self) -> int:
        return self.data.shape[0]

    @property
    def scale(self) -> float:
        """Maximum code value of the file (255 or 65535): the 'input scale'."""
        return float(2**self.bit_depth - 1)

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
        source, data = path, None
    png = _png_colour_depth(head)
    if png and png16.handles(*png):
        return _read_png16(data if data is not None else path.read_bytes(), name, path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(source) as im:
                im.load()
                im = ImageOps.exif_transpose(im)
    except UnidentifiedImageError:
        raise ImageError(f"{name}: not an image file (or an unsupported format)") from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
        found = re.search(r"\((\d+) pixels\)", str(e))
        raise ImageError(_too_large(name, int(found.group(1)) if found else None)) from None
    except (OSError, SyntaxError, ValueError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ImageError(f"{name}: corrupt or truncated image ({msg})") from None
    return _from_pil(im, path)


def _too_large(name: str, pixels: int | None, size: str = "") -> str:
    """The message for an image whose header claims more pixels than are read at once."""
    what = f"{size} = {pixels / 1e6:,.0f} megapixels" if size else f"{pixels / 1e6:,.0f} megapixels" if pixels else "it"
    return (
        f"{name}: too large to read: {what}, more than the {Image.MAX_IMAGE_PIXELS / 1e6:,.0f} megapixels "
        "read at once; split it into parts (if the file is really this large)"
    )


def _read_png16(data: bytes, name: str, path: Path) -> LoadedImage:
    """A 16-bit RGB, RGBA or gray+alpha PNG at full depth (Pillow would read it as 8 bits)."""
    w, h = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if w * h > Image.MAX_IMAGE_PIXELS:
        raise ImageError(_too_large(name, w * h, f"{w}x{h}"))
    try:
        pixels = png16.decode(data)
    except png16.PNGUnsupported as e:
        raise ImageError(f"{name}: {e}") from None
    except png16.PNGError as e:
        raise ImageError(f"{name}: corrupt or truncated image ({e})") from None
    has_alpha = pixels.shape[2] in (2, 4)
    alpha = pixels[..., -1].copy() if has_alpha else None
    colour = pixels[..., :-1] if has_alpha else pixels
    data_f = colour.transpose(2, 0, 1).astype(np.float32)
    data_f /= 65535.0
    return LoadedImage(data_f, alpha, 16, path)


def _alpha_at(alpha: np.ndarray, bit_depth: int) -> np.ndarray:
    """An alpha plane at the output depth (a 16-bit alpha written into an 8-bit file, or back)."""
    if bit_depth == 16:
        return alpha.astype(np.uint16) * 257 if alpha.dtype == np.uint8 else alpha.astype(np.uint16)
    return alpha if alpha.dtype == np.uint8 else np.round(alpha / 257.0).astype(np.uint8)


def image_from_pil(im: Image.Image, path: Path | str = "<PIL image>") -> LoadedImage:
    """A PIL image as a :class:`LoadedImage` (the same conversions as reading a file)."""
    return _from_pil(im, Path(path))


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


def _quantise(data: np.ndarray, bit_depth: int) -> np.ndarray:
    """(C, h, w) float in [0, 1] -> (h, w, C) unsigned integers of the given depth."""
    x = np.clip(data, 0.0, 1.0)  # the only float temporary; scaled and rounded in place
    x *= 65535 if bit_depth == 16 else 255
    return np.round(x, out=x).astype(np.uint16 if bit_depth == 16 else np.uint8).transpose(1, 2, 0)


def needs_png16(channels: int, bit_depth: int, alpha: np.ndarray | None) -> bool:
    """16-bit output that Pillow cannot write (colour, or with alpha): PNG through png16 only."""
    return bit_depth == 16 and (channels != 1 or alpha is not None)


def encode_png16(data: np.ndarray, alpha: np.ndarray | None = None, level: int | None = None) -> bytes:
    """(C, h, w) float in [0, 1] (+ alpha) -> bytes of a 16-bit PNG (zlib ``level``, default PNG_LEVEL)."""
    q = _quantise(data, 16)
    if alpha is not None:
        q = np.concatenate([q, _alpha_at(alpha, 16)[..., None]], axis=-1)
    return png16.encode(q, PNG_LEVEL if level is None else level)


def to_pil(data: np.ndarray, bit_depth: int = 8, alpha: np.ndarray | None = None) -> Image.Image:
    """(C, h, w) float in [0, 1] -> PIL image of the given depth, with alpha re-attached
    (16-bit colour or alpha cannot be a PIL image: :func:`encode_png16`)."""
    C = data.shape[0]
    if needs_png16(C, bit_depth, alpha):
        raise ImageError("16-bit colour or alpha output can only be written as PNG")
    q = _quantise(data, bit_depth)
    if bit_depth == 16:
        return Image.fromarray(q[..., 0])
    if alpha is not None:
        q = np.concatenate([q, _alpha_at(alpha, 8)[..., None]], axis=-1)
        return Image.fromarray(q, "LA" if C == 1 else "RGBA")
    return Image.fromarray(q[..., 0] if C == 1 else q, "L" if C == 1 else "RGB")


def atomic_save(image: Image.Image | bytes, path: str | Path, png_level: int | None = None, **save_kwargs) -> Path:
    """Save an image (or bytes) to ``path`` atomically, via :func:`atomic_write_via`; a PNG at zlib
    level ``png_level`` (default PNG_LEVEL)."""
    path = Path(path)

    def writer(tmp: Path) -> None:
        if isinstance(image, bytes):
            tmp.write_bytes(image)
        else:
            fmt = {".jpg": "JPEG", ".jpeg": "JPEG"}.get(path.suffix.lower(), None)
            fmt = fmt or Image.registered_extensions().get(path.suffix.lower(), "PNG")
            if fmt == "PNG":
                save_kwargs["compress_level"] = PNG_LEVEL if png_level is None else png_level
            image.save(tmp, format=fmt, **save_kwargs)

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


def _require_png(path: str | Path) -> None:
    if not is_stdio(path) and Path(path).suffix.lower() != ".png":
        raise ImageError(
            f"{path}: a 16-bit colour or alpha image can only be written as .png (other formats would lose its depth)"
        )


def check_output_format(path: str | Path, like: LoadedImage) -> None:
    """Refuse, before any work, an output file whose format cannot hold ``like`` as it is: its depth
    (16-bit images: .png, or .tif for gray without alpha) or its alpha channel (JPEG has none).
    write_image would refuse such a file only after the image was computed."""
    suffix = "" if is_stdio(path) else Path(path).suffix.lower()
    if needs_png16(like.channels, like.bit_depth, like.alpha):
        _require_png(path)
    if like.bit_depth == 16 and suffix in EIGHT_BIT_ONLY:
        raise ImageError(f"{path}: {suffix} files are 8-bit and this image is 16-bit; write .png or .tif")
    if like.alpha is not None and suffix in NO_ALPHA:
        raise ImageError(f"{path}: {suffix} files have no alpha channel and this image has one; write .png or .webp")


def write_image(
    path: str | Path,
    data: np.ndarray,
    like: LoadedImage | None = None,
    bit_depth: int | None = None,
    quality: int = JPEG_QUALITY,
    png_level: int | None = None,
) -> Path:
    """Write (C, h, w) [0, 1] data with the depth and alpha of ``like``, in the format the suffix names
    (``quality`` for JPEG and WebP, ``png_level`` the zlib level 0-9 of a PNG, default PNG_LEVEL);
    ``-`` writes a PNG to standard output."""
    level = PNG_LEVEL if png_level is None else png_level
    if not 0 <= level <= 9:
        raise ValueError(f"png_level must be a zlib level 0-9, got {level}")
    depth = bit_depth or (like.bit_depth if like else 8)
    alpha = like.alpha if like is not None else None
    if alpha is not None and alpha.shape != data.shape[1:]:
        alpha = None
    if needs_png16(data.shape[0], depth, alpha):
        _require_png(path)
        image = encode_png16(data, alpha, level)
    else:
        image = to_pil(data, depth, alpha)
    if is_stdio(path):
        if isinstance(image, bytes):
            payload = image
        else:
            buf = io.BytesIO()
            image.save(buf, format="PNG", compress_level=level)
            payload = buf.getvalue()
        try:
            sys.stdout.buffer.write(payload)
            sys.stdout.buffer.flush()
        except OSError as e:  # e.g. the reading end of the pipe went away
            raise ImageError(f"<stdout>: cannot write ({e.strerror or e})") from None
        return Path(path)
    lossy = Path(path).suffix.lower() in (".jpg", ".jpeg", ".webp")
    return atomic_save(image, path, level, **({"quality": quality} if lossy else {}))


def is_image_path(p: Path) -> bool:
    return p.suffix.lower() in IMAGE_SUFFIXES
