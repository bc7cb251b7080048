"""Training-set curation: the leak check against test sets, crops, split and manifest, and the
tools/build_training_set.py command line."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from indeed_cli.tasks.training.curation import (
    LeakIndex,
    build_training_set,
    crop_boxes,
    is_held_out,
    ncc_map,
)

TOOL = Path(__file__).resolve().parents[2] / "tools" / "build_training_set.py"


def scene(seed: int, h: int = 192, w: int = 256) -> Image.Image:
    """A colour picture with structure at every scale (summed smoothed noise), not white noise."""
    rng = np.random.default_rng(seed)
    out = np.zeros((h, w, 3))
    for cell in (4, 16, 48):
        small = rng.random((h // cell + 2, w // cell + 2, 3))
        big = np.asarray(
            Image.fromarray((small * 255).astype(np.uint8)).resize((w + 2 * cell, h + 2 * cell), Image.BICUBIC)
        )
        out += big[cell : cell + h, cell : cell + w] / 3
    return Image.fromarray(out.clip(0, 255).astype(np.uint8))


def test_ncc_map_is_the_correlation_coefficient_of_each_window():
    rng = np.random.default_rng(0)
    img, tpl = rng.random((20, 24), dtype=np.float32), rng.random((5, 7), dtype=np.float32)
    m = ncc_map(torch.from_numpy(img), torch.from_numpy(tpl)[None])[0]
    assert m.shape == (16, 18)
    for y, x in [(0, 0), (7, 11), (15, 17)]:
        direct = np.corrcoef(img[y : y + 5, x : x + 7].ravel(), tpl.ravel())[0, 1]
        assert abs(float(m[y, x]) - direct) < 1e-4
    planted = img.copy()
    planted[3:8, 9:16] = 2 * tpl + 1  # an affine copy correlates 1
    m = ncc_map(torch.from_numpy(planted), torch.from_numpy(tpl)[None])[0]
    assert divmod(int(m.argmax()), m.shape[1]) == (3, 9) and float(m.max()) > 0.9999


def test_ncc_map_stays_in_range_on_flat_and_nearly_flat_windows():
    # the float32 direct form once gave correlations of 34 and 2460 on a sky: smooth gradients
    # with 8-bit steps, large windows
    yy, xx = np.mgrid[0:300, 0:400]
    sky = (np.round((0.6 + 0.0004 * yy + 0.0001 * xx) * 255) / 255).astype(np.float32)
    sky[:, 200:] = 0.5  # and a flat half
    tpl = np.random.default_rng(1).random((100, 150), dtype=np.float32)
    m = ncc_map(torch.from_numpy(sky), torch.from_numpy(tpl)[None])[0]
    assert float(m.abs().max()) <= 1.0 and float(m[:, 220:].abs().max()) == 0.0


@pytest.fixture(scope="module")
def tests_index():
    idx = LeakIndex()
    idx.add("set/a.png", scene(1))
    idx.add("set/b.png", scene(2).resize((128, 96), Image.BOX).convert("L"))  # a small gray test image
    return idx


def jpeg(im: Image.Image, q: int = 90) -> Image.Image:
    import io

    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=q)
    return Image.open(io.BytesIO(buf.getvalue()))


def test_leak_check_finds_test_images_in_disguise(tests_index):
    a, b_source = scene(1), scene(2)
    assert tests_index.check(a).score == 1.0  # the same pixels
    assert tests_index.check(jpeg(a)).test == "set/a.png"  # re-encoded
    assert tests_index.check(a.transpose(Image.FLIP_LEFT_RIGHT)).test == "set/a.png"
    assert tests_index.check(a.convert("L")).test == "set/a.png"  # gray
    # the gray test image b is b_source at half size: its full-size colour source leaks
    leak = tests_index.check(b_source)
    assert leak.test == "set/b.png" and leak.scale == 0.5
    # a test image cropped out of a larger picture: the picture leaks
    canvas = scene(3, 300, 400)
    canvas.paste(a, (57, 83))
    assert tests_index.check(canvas).test == "set/a.png"
    # smaller copies of a test image (a half-size and a flipped two-thirds-size one) leak too
    w, h = a.size
    leak = tests_index.check(a.resize((w // 2, h // 2), Image.BICUBIC))
    assert leak.test == "set/a.png" and leak.scale == 2.0
    assert tests_index.check(a.resize((w * 2 // 3, h * 2 // 3), Image.LANCZOS).transpose(Image.FLIP_LEFT_RIGHT))


def test_leak_check_passes_other_pictures(tests_index):
    for seed in (4, 5, 6):
        assert tests_index.check(scene(seed)) is None
    assert tests_index.check(Image.new("RGB", (200, 150), (90, 120, 30))) is None  # flat


def test_crop_boxes_tile_the_image_without_overlap():
    boxes = crop_boxes(1000, 700, 256)
    assert len(boxes) == 3 * 2
    mask = np.zeros((700, 1000), int)
    for x0, y0, x1, y1 in boxes:
        assert x1 - x0 == 256 == y1 - y0 and x0 >= 0 and y0 >= 0 and x1 <= 1000 and y1 <= 700
        mask[y0:y1, x0:x1] += 1
    assert mask.max() == 1
    assert crop_boxes(200, 700, 256) == [] and crop_boxes(30, 20, 0) == [(0, 0, 30, 20)]


def test_held_out_split_is_by_source_and_stable():
    keys = [f"src/{i}.jpg" for i in range(2000)]
    share = np.mean([is_held_out(k, 0.2) for k in keys])
    assert 0.17 < share < 0.23
    assert [is_held_out(k, 0.2) for k in keys] == [is_held_out(k, 0.2) for k in keys]
    assert not any(is_held_out(k, 0.0) for k in keys)


def make_sources(root: Path) -> Path:
    src = root / "photos"
    (src / "sub").mkdir(parents=True)
    scene(1).save(src / "leak.png")  # a test image
    scene(7, 300, 420).save(src / "big.jpg", quality=95, subsampling=2)  # 4:2:0 chroma
    scene(8).save(src / "sub" / "other.png")
    scene(8).save(src / "sub" / "copy.png")  # the same pixels again
    return src


def test_build_writes_crops_split_and_manifest(tmp_path, tests_index):
    src = make_sources(tmp_path)
    out = tmp_path / "set"
    m = build_training_set([src], out, tests_index, downscale=0.5, crop=64, holdout=0.5, fmt="webp")
    reasons = {r["source"]: r["reason"] for r in m["excluded"]}
    assert reasons == {"photos/leak.png": "test image", "photos/sub/other.png": "duplicate"} or reasons == {
        "photos/leak.png": "test image",
        "photos/sub/copy.png": "duplicate",
    }
    rows = m["images"]
    assert {r["source"] for r in rows} == {
        "photos/big.jpg",
        next(iter({"photos/sub/copy.png", "photos/sub/other.png"} - set(reasons))),
    }
    big = [r for r in rows if r["source"] == "photos/big.jpg"]
    assert len(big) == len(crop_boxes(210, 150, 64)) and {r["chroma"] for r in big} == {"4:2:0"}
    for r in rows:  # every crop on disk, lossless, in the split of its source
        im = Image.open(out / r["file"])
        assert im.size == (64, 64) and r["file"].split("/")[0] in ("train", "holdout")
        assert r["file"].split("/")[0] == ("holdout" if is_held_out(r["source"], 0.5) else "train")
    first = big[0]
    expect = Image.open(src / "big.jpg").convert("RGB").resize((210, 150), Image.BOX).crop(tuple(first["box"]))
    assert np.array_equal(np.asarray(Image.open(out / first["file"]).convert("RGB")), np.asarray(expect))
    assert json.loads((out / "manifest.json").read_text()) == m
    with pytest.raises(FileExistsError):
        build_training_set([src], out, tests_index)


def test_tool_builds_and_reports(tmp_path):
    src = make_sources(tmp_path)
    tests = tmp_path / "tests"
    tests.mkdir()
    scene(1).save(tests / "a.png")
    run = [sys.executable, str(TOOL), str(src), "--tests", str(tests), "--crop", "96"]
    r = subprocess.run([*run, "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "left out photos/leak.png: test image tests/a.png" in r.stdout
    assert len(list((tmp_path / "o" / "train").glob("*.png"))) == len(crop_boxes(420, 300, 96)) + len(
        crop_boxes(256, 192, 96)
    )
    r = subprocess.run([*run, "--out", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 2 and "already holds a training set" in r.stderr
    r = subprocess.run(
        [*run[:-4], "--tests", str(tmp_path / "nope"), "--out", str(tmp_path / "p")], capture_output=True, text=True
    )
    assert r.returncode == 2 and "not a folder" in r.stderr and not (tmp_path / "p").exists()
