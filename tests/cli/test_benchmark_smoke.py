"""Every benchmark script runs end to end on one or two tiny images with tiny models (CI keeps them
working; the numbers they print here mean nothing)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_model, write_png

from indeed_cli.model import save_checkpoint

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
pytestmark = pytest.mark.slow  # one Python process per script


def run(script: str, *args) -> str:
    r = subprocess.run(
        [sys.executable, str(BENCH / script), *map(str, args)], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert "Command" in r.stdout  # every benchmark prints the command that made its table
    return r.stdout


def test_denoise_benchmark(tmp_path, rng, ckpt_paths):
    for name, shape in (("CBSD68", (40, 48, 3)), ("Set12", (40, 48))):
        (tmp_path / name).mkdir()
        write_png(tmp_path / name / "a.png", rng.integers(0, 256, shape, dtype=np.uint8))
    out = run(
        "denoise.py",
        "--data",
        tmp_path,
        "--sets",
        "CBSD68,Set12",
        "--sigmas",
        "25",
        "--methods",
        "indeed,indeed:ps2",
        "--forms",
        "float",
        "--weights-color",
        ckpt_paths[3],
        "--weights-gray",
        ckpt_paths[1],
        "--no-timing",
    )
    assert "| CBSD68 | indeed:ps2 | 1 |" in out and "| Set12 | indeed | 1 |" in out


def test_denoise_benchmark_saturates_colour_sets_only(tmp_path, rng, ckpt_paths):
    for name, shape in (("CBSD68", (40, 48, 3)), ("Set12", (40, 48))):
        (tmp_path / name).mkdir()
        write_png(tmp_path / name / "a.png", rng.integers(0, 256, shape, dtype=np.uint8))
    args = ["--data", tmp_path, "--sets", "CBSD68,Set12", "--sigmas", "25", "--methods", "indeed"]
    args += ["--forms", "float", "--weights-color", ckpt_paths[3], "--weights-gray", ckpt_paths[1], "--no-timing"]
    out = run("denoise.py", *args, "--saturate", "1,2.2")
    assert "| CBSD68 | indeed | 1 |" in out and "| CBSD68 x2.2 | indeed | 1 |" in out
    assert "| Set12 | indeed | 1 |" in out and "Set12 x2.2" not in out


def test_saturate_scales_chroma_about_the_luma(rng):
    sys.path.insert(0, str(BENCH))
    from denoise import saturate

    x = (0.3 + 0.4 * rng.random((3, 8, 8))).astype(np.float32)  # mid values: nothing is clipped at 1.5
    luma = (x * np.array([0.299, 0.587, 0.114], np.float32)[:, None, None]).sum(0)
    y = saturate(x, 1.5)
    y_luma = (y * np.array([0.299, 0.587, 0.114], np.float32)[:, None, None]).sum(0)
    np.testing.assert_allclose(y_luma, luma, atol=1e-6)
    np.testing.assert_allclose(y - luma, 1.5 * (x - luma), atol=1e-6)
    np.testing.assert_allclose(saturate(x, 1.0), x, atol=1e-6)
    assert saturate(np.stack([np.ones((4, 4)), np.zeros((4, 4)), np.zeros((4, 4))]).astype(np.float32), 3).max() <= 1


def test_denoise_benchmark_splits_flat_images_and_keeps_each_image(tmp_path, rng, ckpt_paths):
    import json

    (tmp_path / "CBSD68").mkdir()
    write_png(tmp_path / "CBSD68" / "busy.png", rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
    write_png(tmp_path / "CBSD68" / "sky.png", np.full((40, 48, 3), 120, dtype=np.uint8))
    rows_file = tmp_path / "rows.json"
    args = ["--data", tmp_path, "--sets", "CBSD68", "--sigmas", "25", "--methods", "indeed", "--forms", "float"]
    args += ["--weights-color", ckpt_paths[3], "--no-timing", "--flat-below", "1.5", "--json", rows_file]
    out = run("denoise.py", *args)
    assert "| CBSD68 (flat) | indeed | 1 |" in out and "| CBSD68 (other) | indeed | 1 |" in out
    rows = {r["set"]: r for r in json.loads(rows_file.read_text())["rows"]}
    images = {i["image"]: i for i in rows["CBSD68"]["images"]}
    assert images["sky.png"]["flatness"] == 0.0 and images["busy.png"]["flatness"] > 20
    flat, other = rows["CBSD68 (flat)"]["psnr"], rows["CBSD68 (other)"]["psnr"]
    assert rows["CBSD68"]["psnr"] == pytest.approx((flat + other) / 2)
    assert flat == pytest.approx(images["sky.png"]["psnr"])


def test_rank_agreement_helpers():
    sys.path.insert(0, str(BENCH))
    from lowrank import decompose_tile_ranks, energy_count, spearman, svd_rank

    from indeed_cli import InferenceOptions
    from indeed_cli.inference.tiling import TileGrid

    assert energy_count([5.0, 0.0, 3.0, 2.0], 0.8) == 2 and energy_count([1.0, 1.0, 1.0, 1.0], 0.999) == 4

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 2, 3], [5, 6, 7, 8]) == pytest.approx(np.corrcoef([1.5, 1.5, 3, 4], [1, 2, 3, 4])[0, 1])
    r = np.random.default_rng(0)
    low = r.standard_normal((256, 3)) @ r.standard_normal((3, 256))  # rank 3 in every 128 x 128 tile
    assert svd_rank(low[None]) == 3.0
    assert svd_rank(r.standard_normal((1, 128, 128))) > 100  # noise needs almost every component

    # the tiles n is read on: overlapping, over the whole image, reflected at its borders (rank kept)
    opts = InferenceOptions()
    img = np.stack([r.standard_normal((200, 2)) @ r.standard_normal((2, 300)), r.standard_normal((200, 300))])
    ranks = decompose_tile_ranks(img, opts)
    assert ranks.shape == (*TileGrid(200, 300, opts.tile, opts.overlap).shape, 2) == (3, 4, 2)
    assert (ranks[..., 0] == 2).all() and (ranks[..., 1] > 80).all()  # reflected borders repeat rows
    half = img[:1].copy()
    half[:, :, 150:] = r.standard_normal((1, 200, 150))  # right half noise: the right tiles' rank rises
    ranks = decompose_tile_ranks(half, opts)[..., 0]
    assert ranks[:, 0].max() == 2 and ranks[:, -1].min() > 80


def test_lowrank_and_speed_benchmarks(tmp_path, rng, ckpt_paths):
    (tmp_path / "clean").mkdir()
    write_png(tmp_path / "clean" / "a.png", rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
    assert "| " in run("lowrank.py", "--data", tmp_path / "clean", "--weights", ckpt_paths[3])
    write_png(tmp_path / "clean" / "a.png", rng.integers(0, 256, (136, 150, 3), dtype=np.uint8))  # one whole tile
    out = run("lowrank.py", "--data", tmp_path / "clean", "--weights", ckpt_paths[3], "--readouts")
    assert "energy rank of components" in out and "SVD rank of mu_L" in out
    out = run("speed.py", "--weights", ckpt_paths[3], "--size", "64", "--reps", "1", "--device", "cpu")
    assert "64x64" in out


def test_adapt_benchmark(tmp_path, rng, ckpt_paths):
    for i in range(2):
        clean = rng.integers(20, 230, (40, 48, 3), dtype=np.uint8)
        noisy = np.clip(clean + rng.normal(0, 10, clean.shape), 0, 255).astype(np.uint8)
        write_png(tmp_path / f"{i}_real.png", noisy)
        write_png(tmp_path / f"{i}_mean.png", clean)
    out = run(
        "adapt.py",
        "--data",
        tmp_path,
        "--methods",
        "none,oag,none+ps2,none+psauto",
        "--weights",
        ckpt_paths[3],
        "--device",
        "cpu",
        "--steps",
        "2",
    )
    assert "| oag |" in out and "| none+ps2 |" in out and "| none+psauto |" in out


def test_detect_benchmark(tmp_path, rng):
    det = save_checkpoint(tmp_path / "det.safetensors", tiny_model(1, task="detect"))
    for cls in ("MT_Blowhole", "MT_Break", "MT_Crack", "MT_Fray", "MT_Uneven", "MT_Free"):
        (tmp_path / cls).mkdir()
        for i in range(2 if cls != "MT_Free" else 6):
            img = rng.integers(60, 200, (40, 48), dtype=np.uint8)
            write_png((tmp_path / cls / f"{i}.jpg").with_suffix(".png"), img)  # masks are PNGs
            (tmp_path / cls / f"{i}.png").rename(tmp_path / cls / f"{i}.jpg")
            if cls != "MT_Free":
                mask = np.zeros((40, 48), np.uint8)
                mask[10:20, 10:20] = 255
                write_png(tmp_path / cls / f"{i}.png", mask)
    out = run("detect.py", "--data", tmp_path, "--weights", det, "--methods", "indeed,rpca", "--device", "cpu")
    assert "rpca" in out
    two = run("detect.py", "--data", tmp_path, "--weights", det, "--methods", "indeed", "--ensemble", "2", "--json",
              tmp_path / "two.json")  # fmt: skip
    one = json.loads((tmp_path / "two.json").read_text())["indeed"]["all"]
    assert "indeed" in two and 0 <= one["pixel_auroc"] <= 1


def test_onnx_speed_benchmark(tmp_path, ckpt_paths, rng):
    facts = {"threshold": 0.1, "score_kind": "top5", "scales": [1.0]}
    det = save_checkpoint(tmp_path / "det.safetensors", tiny_model(1, task="detect"), {}, {"detect": facts})
    img = write_png(tmp_path / "t.png", rng.integers(0, 256, (40, 48), dtype=np.uint8))
    out = run("onnx_speed.py", "--weights", f"{ckpt_paths[3]},{det}", "--image", img, "--reps", "1")
    assert "onnxruntime" in out and "detect" in out
