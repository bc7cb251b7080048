"""16-bit PNG with colour or alpha, read and written without losing depth.

Pillow reads a 16-bit RGB, RGBA or gray+alpha PNG as 8 bits per channel (and gray+alpha as
RGBA), so such files would silently lose their depth.  This module decodes and encodes those
PNGs itself with zlib and numpy.  16-bit gray without alpha still goes through Pillow, which
keeps it.

Decoding undoes the PNG row filters (Sub, Up, Average, Paeth).  Average and Paeth predict a
byte from its left, upper and upper-left neighbours, so a row cannot be undone in one vector
operation; the pixels are instead undone along anti-diagonals (every pixel of an anti-diagonal
depends only on the previous two), which takes h + w - 1 vector steps instead of h * w scalar
ones.  Encoding uses the Sub filter on every row (a vector operation, and a good filter for
photographs).
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
from PIL import Image

SIGNATURE = b"\x89PNG\r\n\x1a\n"
# colour type -> samples per pixel (only the 16-bit types this module handles)
SAMPLES = {2: 3, 4: 2, 6: 4}
# EXIF orientation -> numpy operations that make the image upright (as PIL.ImageOps.exif_transpose)
_ORIENT = {
    2: lambda a: a[:, ::-1],
    3: lambda a: a[::-1, ::-1],
    4: lambda a: a[::-1],
    5: lambda a: a.transpose(1, 0, 2),
    6: lambda a: a.transpose(1, 0, 2)[:, ::-1],
    7: lambda a: a.transpose(1, 0, 2)[::-1, ::-1],
    8: lambda a: a.transpose(1, 0, 2)[::-1],
}


class PNGError(ValueError):
    """A PNG this module cannot decode (message without the file name)."""


class PNGUnsupported(PNGError):
    """A valid PNG of a kind this module does not read (interlaced)."""


def handles(bit_depth: int, colour_type: int) -> bool:
    """True for the PNG kinds that Pillow would reduce to 8 bits and this module reads."""
    return bit_depth == 16 and colour_type in SAMPLES


def _chunks(data: bytes):
    pos = len(SIGNATURE)
    while pos + 8 <= len(data):
        n, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + n]
        if len(body) < n:
            raise PNGError("truncated chunk")
        yield kind, body
        pos += 12 + n
        if kind == b"IEND":
            return
    raise PNGError("no IEND chunk (truncated file)")


def _unfilter(filtered: np.ndarray, types: np.ndarray) -> np.ndarray:
    """Undo the row filters of (h, w, bpp) filtered bytes with per-row ``types``."""
    h, w, bpp = filtered.shape
    if types.max(initial=0) > 4:
        raise PNGError(f"unknown row filter {int(types.max())}")
    # a zero row above and a zero column left; bytes are widened to int16 a row or a diagonal at
    # a time, so that a 24-megapixel image needs one byte copy, not an int16 one
    raw = np.zeros((h + 1, w + 1, bpp), np.uint8)
    F = filtered
    if (types <= 2).all():  # None, Sub, Up only: row by row, each row one vector step
        for r in range(h):
            t = types[r]
            if t == 0:
                raw[r + 1, 1:] = F[r]
            elif t == 1:
                raw[r + 1, 1:] = np.cumsum(F[r], axis=0, dtype=np.int64) & 255
            else:
                raw[r + 1, 1:] = (F[r].astype(np.int16) + raw[r, 1:]) & 255
        return raw[1:, 1:]
    t_row = types.astype(np.int8)
    for k in range(h + w - 1):  # anti-diagonal r + x = k
        r = np.arange(max(0, k - w + 1), min(h - 1, k) + 1)
        x = k - r
        a = raw[r + 1, x].astype(np.int16)  # left
        b = raw[r, x + 1].astype(np.int16)  # up
        c = raw[r, x].astype(np.int16)  # up-left
        t = t_row[r][:, None]
        p = a + b - c
        pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
        paeth = np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c))
        pred = np.select([t == 0, t == 1, t == 2, t == 3], [0, a, b, (a + b) >> 1], paeth)
        raw[r + 1, x + 1] = (F[r, x].astype(np.int16) + pred) & 255
    return raw[1:, 1:]


def decode(data: bytes) -> np.ndarray:
    """A 16-bit RGB, RGBA or gray+alpha PNG -> (h, w, samples) uint16, EXIF orientation applied."""
    if data[:8] != SIGNATURE:
        raise PNGError("not a PNG file")
    header, idat, exif = None, [], None
    for kind, body in _chunks(data):
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body[:13])
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"eXIf":
            exif = body
    if header is None or not idat:
        raise PNGError("no image header or no image data")
    w, h, depth, ctype, _, _, interlace = header
    if not handles(depth, ctype):
        raise PNGError(f"bit depth {depth}, colour type {ctype} is not a 16-bit colour/alpha PNG")
    if interlace:
        raise PNGUnsupported("interlaced 16-bit colour PNG is not supported; save it without interlacing")
    bpp = 2 * SAMPLES[ctype]
    try:
        raw = zlib.decompress(b"".join(idat))
    except zlib.error as e:
        raise PNGError(f"corrupt image data ({e})") from None
    stride = 1 + w * bpp
    if len(raw) < h * stride:
        raise PNGError("truncated image data")
    rows = np.frombuffer(raw, np.uint8, h * stride).reshape(h, stride)
    pixels = _unfilter(rows[:, 1:].reshape(h, w, bpp), rows[:, 0])
    out = np.ascontiguousarray(pixels).view(">u2").reshape(h, w, SAMPLES[ctype]).astype(np.uint16)
    return _upright(out, exif)


def _upright(a: np.ndarray, exif: bytes | None) -> np.ndarray:
    if not exif:
        return a
    info = Image.Exif()
    try:
        info.load(exif)
    except Exception:  # unreadable EXIF: leave the image as stored, as Pillow does
        return a
    op = _ORIENT.get(info.get(0x0112, 1))
    return np.ascontiguousarray(op(a)) if op else a


def encode(pixels: np.ndarray, level: int = 6, rows_per_block: int = 256) -> bytes:
    """(h, w, 2 | 3 | 4) uint16 -> a 16-bit gray+alpha, RGB or RGBA PNG (Sub filter on every row).
    Rows are filtered and compressed in blocks, so the temporaries stay small."""
    h, w, n = pixels.shape
    ctype = {2: 4, 3: 2, 4: 6}[n]
    b = np.ascontiguousarray(pixels, dtype=">u2").view(np.uint8).reshape(h, w, 2 * n)
    z = zlib.compressobj(level)
    parts = []
    for r0 in range(0, h, rows_per_block):
        blk = b[r0 : r0 + rows_per_block]
        sub = blk.copy()
        sub[:, 1:] -= blk[:, :-1]  # uint8 arithmetic wraps mod 256, as the filter is defined
        rows = np.concatenate([np.ones((len(blk), 1), np.uint8), sub.reshape(len(blk), -1)], axis=1)
        parts.append(z.compress(rows.tobytes()))
    parts.append(z.flush())

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)

    return (
        SIGNATURE
        + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, ctype, 0, 0, 0))
        + chunk(b"IDAT", b"".join(parts))
        + chunk(b"IEND", b"")
    )
