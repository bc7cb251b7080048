"""Image I/O: depth, alpha, EXIF orientation preserved; bad files give one-line errors."""
import numpy as np
import pytest
from PIL import Image

from conftest import write_png
from indeed_cli.imageio import ImageError, read_image, write_image


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
    for name, pat in [("cut.png", "corrupt or truncated"), ("empty.png", "empty file"),
                      ("text.png", "not an image"), ("missing.png", "no such file")]:
        with pytest.raises(ImageError, match=pat) as e:
            read_image(tmp_path / name)
        assert "\n" not in str(e.value)


def test_16bit_colour_is_refused_not_truncated(tmp_path):
    import struct, zlib
    h, w = 2, 2
    raw = b"".join(b"\x00" + b"\x12\x34" * 3 * w for _ in range(h))
    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    (tmp_path / "c16.png").write_bytes(png)
    with pytest.raises(ImageError, match="16-bit colour"):
        read_image(tmp_path / "c16.png")
