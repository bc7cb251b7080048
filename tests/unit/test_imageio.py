"""Image I/O: depth, alpha, EXIF orientation preserved; bad files give one-line errors."""

import numpy as np
import pytest
from conftest import write_png
from PIL import Image

from indeed_cli.io import ImageError, read_image, write_image


def test_16bit_gray_round_trip_is_exact(tmp_path, rng):
    a = rng.integers(0, 65536, (21, 17), dtype=np.uint16)
    img = read_image(write_png(tmp_path / "g16.png", a))
    assert img.bit_depth == 16 and img.channels == 1 and img.scale == 65535
    out = write_image(tmp_path / "o.png", img.data, like=img)
    back = np.asarray(Image.open(out))
    assert back.dtype == np.uint16 and np.array_equal(back, a)


@pytest.mark.parametrize("mode,ch", [("RGBA", 4), ("LA", 2)])
def test_alpha_is_passed_through(tmp_path, rng, mode, ch):
    a = rng.integers(0, 256, (9, 11, ch), dtype=np.uint8)
    img = read_image(write_png(tmp_path / "a.png", a, mode))
    assert img.alpha is not None and img.channels == ch - 1
    back = np.asarray(Image.open(write_image(tmp_path / "o.png", img.data, like=img)))
    assert Image.open(tmp_path / "o.png").mode == mode
    assert np.array_equal(back, a)


def test_exif_orientation_is_applied(tmp_path):
    a = np.zeros((10, 20, 3), np.uint8)
    a[0, 0] = 255
    im = Image.fromarray(a)
    exif = im.getexif()
    exif[0x0112] = 6  # rotate 90 CW to display
    im.save(tmp_path / "r.jpg", exif=exif, quality=100)
    img = read_image(tmp_path / "r.jpg")
    assert img.size == (20, 10)


def test_palette_and_binary_images_are_read(tmp_path, rng):
    a = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
    Image.fromarray(a).convert("P").save(tmp_path / "p.png")
    Image.fromarray(a[..., 0] > 128).save(tmp_path / "b.png")
    assert read_image(tmp_path / "p.png").channels == 3
    assert read_image(tmp_path / "b.png").channels == 1


def test_bad_files_raise_one_line_errors(tmp_path, rng):
    good = write_png(tmp_path / "g.png", rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    (tmp_path / "cut.png").write_bytes(good.read_bytes()[:200])
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "text.png").write_text("this is not an image\n")
    for name, pat in [
        ("cut.png", "corrupt or truncated"),
        ("empty.png", "empty file"),
        ("text.png", "not an image"),
        ("missing.png", "no such file"),
    ]:
        with pytest.raises(ImageError, match=pat) as e:
            read_image(tmp_path / name)
        assert "\n" not in str(e.value)


def _png_chunk(kind: bytes, body: bytes) -> bytes:
    import struct
    import zlib

    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def _reference_png16(a: np.ndarray, row_filters: list[int], extra: bytes = b"", interlace: int = 0) -> bytes:
    """A 16-bit PNG made the slow way, byte by byte as the PNG specification defines the five
    row filters: an independent check of png16's vectorised decoder."""
    import struct
    import zlib

    h, w, n = a.shape
    bpp = 2 * n
    rows = [list(a[r].astype(">u2").tobytes()) for r in range(h)]
    out = bytearray()
    for r, t in enumerate(row_filters):
        out.append(t)
        for i, x in enumerate(rows[r]):
            left = rows[r][i - bpp] if i >= bpp else 0
            up = rows[r - 1][i] if r else 0
            ul = rows[r - 1][i - bpp] if r and i >= bpp else 0
            p = left + up - ul
            pa, pb, pc = abs(p - left), abs(p - up), abs(p - ul)
            paeth = left if pa <= pb and pa <= pc else up if pb <= pc else ul
            pred = [0, left, up, (left + up) // 2, paeth][t]
            out.append((x - pred) % 256)
    ctype = {2: 4, 3: 2, 4: 6}[n]
    raw = zlib.compress(bytes(out))
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, ctype, 0, 0, interlace))
        + extra
        + _png_chunk(b"IDAT", raw[:7])
        + _png_chunk(b"IDAT", raw[7:])
        + _png_chunk(b"IEND", b"")
    )


@pytest.mark.parametrize("n", [2, 3, 4])
def test_png16_decodes_every_row_filter_exactly(tmp_path, rng, n):
    from indeed_cli.io import png16

    a = rng.integers(0, 65536, (13, 7, n), dtype=np.uint16)
    a[:6] = np.cumsum(rng.integers(0, 300, (6, 7, n)), axis=1)  # smooth rows, where predictions matter
    filters = [int(t) for t in rng.integers(0, 5, 13)]
    data = _reference_png16(a, filters)
    assert np.array_equal(png16.decode(data), a)
    assert np.array_equal(png16.decode(_reference_png16(a, [0, 1, 2] * 4 + [1])), a)  # the row-by-row path
    # Pillow reads the same file as 8 bits: its values must be our high bytes
    (tmp_path / "x.png").write_bytes(data)
    low = np.asarray(Image.open(tmp_path / "x.png"))
    high = (a >> 8).astype(np.uint8)
    expect = np.concatenate([np.repeat(high[..., :1], 3, -1), high[..., 1:]], -1) if n == 2 else high
    assert np.array_equal(low, expect)


@pytest.mark.parametrize("n,channels,alpha", [(3, 3, False), (4, 3, True), (2, 1, True)])
def test_16bit_colour_and_alpha_keep_their_depth(tmp_path, rng, n, channels, alpha):
    a = rng.integers(0, 65536, (11, 9, n), dtype=np.uint16)
    (tmp_path / "c16.png").write_bytes(_reference_png16(a, [4] * 11))
    img = read_image(tmp_path / "c16.png")
    assert img.bit_depth == 16 and img.channels == channels and (img.alpha is not None) == alpha
    assert np.array_equal(np.round(img.data * 65535).astype(np.uint16), a[..., :channels].transpose(2, 0, 1))
    out = write_image(tmp_path / "o.png", img.data, like=img)
    from indeed_cli.io import png16

    assert np.array_equal(png16.decode(out.read_bytes()), a)  # exact round trip, alpha included
    assert np.array_equal(read_image(out).data, img.data)
    with pytest.raises(ImageError, match="only be written as .png"):
        write_image(tmp_path / "o.tif", img.data, like=img)
    assert not (tmp_path / "o.tif").exists()
    # an 8-bit output of a 16-bit alpha image gets the alpha at 8 bits
    if alpha:
        back = np.asarray(Image.open(write_image(tmp_path / "o8.png", img.data, like=img, bit_depth=8)))
        assert np.array_equal(back[..., -1], np.round(a[..., -1] / 257).astype(np.uint8))


def test_16bit_colour_exif_orientation_and_errors(tmp_path, rng):
    a = rng.integers(0, 65536, (4, 6, 3), dtype=np.uint16)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW to display
    (tmp_path / "r.png").write_bytes(_reference_png16(a, [1] * 4, _png_chunk(b"eXIf", exif.tobytes())))
    img = read_image(tmp_path / "r.png")
    assert img.size == (6, 4)  # as Pillow's exif_transpose turns an 8-bit image
    assert np.array_equal(np.round(img.data[:, 0, :] * 65535), a[::-1, 0].T)  # first row = first column, bottom up
    good = _reference_png16(a, [2] * 4)
    (tmp_path / "cut.png").write_bytes(good[:60])
    (tmp_path / "lace.png").write_bytes(_reference_png16(a, [0] * 4, interlace=1))
    for name, pat in [
        ("cut.png", "corrupt or truncated"),
        ("lace.png", "lace.png: interlaced 16-bit colour PNG is not"),
    ]:
        with pytest.raises(ImageError, match=pat) as e:
            read_image(tmp_path / name)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("depth, channels", [(8, 3), (16, 3), (16, 1)])
def test_png_level_changes_size_not_pixels(tmp_path, depth, channels):
    # a smooth image, which zlib's higher levels compress better
    y, x = np.mgrid[0:96, 0:128] / 128.0
    data = np.stack([np.sin(3 * x + k) * np.cos(2 * y) * 0.4 + 0.5 for k in range(channels)]).astype(np.float32)
    paths = {lv: write_image(tmp_path / f"l{lv}.png", data, bit_depth=depth, png_level=lv) for lv in (0, 1, 9)}
    pixels = {lv: read_image(p).data for lv, p in paths.items()}
    assert all(np.array_equal(pixels[0], pixels[lv]) for lv in (1, 9))
    sizes = {lv: p.stat().st_size for lv, p in paths.items()}
    assert sizes[0] > sizes[1] > sizes[9]
    default = write_image(tmp_path / "default.png", data, bit_depth=depth)
    assert default.read_bytes() == paths[1].read_bytes()  # PNG_LEVEL = 1
    with pytest.raises(ValueError, match="0-9"):
        write_image(tmp_path / "bad.png", data, bit_depth=depth, png_level=10)
    assert not (tmp_path / "bad.png").exists()


def test_an_output_folder_is_checked_before_any_work(tmp_path, monkeypatch):
    """require_folder: a file in the way or an ancestor this process cannot write into is refused up front,
    and nothing is made."""
    import os

    from indeed_cli.pipelines.inputs import UsageError, require_folder

    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(UsageError, match="which is a file"):
        require_folder(tmp_path / "f" / "a" / "b", "--output")
    require_folder(tmp_path / "new" / "deeper", "--output")  # makeable: fine, and not made yet
    assert not (tmp_path / "new").exists()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(tmp_path) else real(p, mode))
    with pytest.raises(UsageError, match="is not writable"):
        require_folder(tmp_path / "new" / "deeper", "--output")
