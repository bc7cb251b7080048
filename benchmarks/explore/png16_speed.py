"""Speed of the 16-bit colour PNG codec (indeed_cli/png16.py) on a synthetic photograph-like image
whose rows are all Paeth-filtered (the slowest filter to undo; libpng's adaptive filtering picks
it often for photographs), and of its encoder.

    python benchmarks/explore/png16_speed.py --size 3000x2000
"""
from __future__ import annotations

import argparse
import struct
import sys
import time
import zlib
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from indeed_cli import png16  # noqa: E402


def paeth_png(a: np.ndarray) -> bytes:
    """A 16-bit RGB PNG of ``a`` with the Paeth filter on every row (vectorised: the filter, unlike
    its inverse, needs only the raw bytes)."""
    h, w, _ = a.shape
    b = a.astype(">u2").view(np.uint8).reshape(h, w, 6).astype(np.int16)
    left, up, ul = np.zeros_like(b), np.zeros_like(b), np.zeros_like(b)
    left[:, 1:], up[1:], ul[1:, 1:] = b[:, :-1], b[:-1], b[:-1, :-1]
    p = left + up - ul
    pa, pb, pc = np.abs(p - left), np.abs(p - up), np.abs(p - ul)
    pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, up, ul))
    rows = np.concatenate([np.full((h, 1), 4, np.uint8), ((b - pred) % 256).astype(np.uint8).reshape(h, -1)], 1)

    def chunk(k: bytes, d: bytes) -> bytes:
        return struct.pack(">I", len(d)) + k + d + struct.pack(">I", zlib.crc32(k + d) & 0xFFFFFFFF)
    return (png16.SIGNATURE + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows.tobytes(), 1)) + chunk(b"IEND", b""))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="3000x2000", help="WIDTHxHEIGHT")
    a_ = ap.parse_args()
    w, h = (int(v) for v in a_.size.split("x"))
    rng = np.random.default_rng(0)
    a = np.cumsum(rng.integers(0, 40, (h, w, 3)), axis=1).astype(np.uint16)  # smooth rows, like a photo
    data = paeth_png(a)
    t = time.perf_counter()
    ok = np.array_equal(png16.decode(data), a)
    t_dec = time.perf_counter() - t
    t = time.perf_counter()
    enc = png16.encode(a)
    t_enc = time.perf_counter() - t
    print(f"Command: `python {' '.join(sys.argv)}`\n")
    print(f"| {w}x{h} RGB, 16 bit | seconds |\n|---|---|\n| decode (Paeth rows), exact: {ok} | {t_dec:.2f} |\n"
          f"| encode (Sub rows, zlib level 6), {len(enc) / 1e6:.1f} MB | {t_enc:.2f} |")


if __name__ == "__main__":
    main()
