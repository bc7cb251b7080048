"""`indeed evaluate --task denoise`: synthetic AWGN per sigma, real noisy/clean pairs, summaries."""

import json

import numpy as np
import pytest
from conftest import write_png

from indeed_cli.inference import denoise, load_model
from indeed_cli.io import read_image
from indeed_cli.metrics import add_awgn, image_seed, psnr


@pytest.fixture
def clean(tmp_path, rng):
    d = tmp_path / "clean"
    d.mkdir()
    for n in ("a", "b"):
        write_png(d / f"{n}.png", rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
    return d


def test_evaluate_scores_each_image_with_its_seeded_noise(run_cli, clean, ckpt_paths):
    code, out, err = run_cli("evaluate", clean, "-s", "15", "-s", "50", "-w", ckpt_paths[3], "--json")
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    rows, summary = [r for r in lines if not r.get("summary")], [r for r in lines if r.get("summary")]
    assert len(rows) == 4 and [s["sigma"] for s in summary] == [15, 50] and all(s["n"] == 2 for s in summary)
    ck = load_model(str(ckpt_paths[3]), device="cpu")
    for r in rows:  # the row's numbers are those of the documented protocol, recomputed here
        ref = read_image(r["image"]).data
        y = add_awgn(ref, r["sigma"], image_seed(r["image"].rsplit("/", 1)[-1], r["sigma"]))
        assert r["psnr_in"] == pytest.approx(psnr(y, ref), abs=1e-3)
        assert r["psnr"] == pytest.approx(psnr(denoise(ck, y), ref), abs=1e-3)
    s15 = summary[0]
    assert s15["psnr"] == pytest.approx(np.mean([r["psnr"] for r in rows if r["sigma"] == 15]), abs=1e-3)
    assert summary[0]["psnr_in"] > summary[1]["psnr_in"]  # more noise, lower input PSNR


def test_evaluate_clipped_inputs_and_limit(run_cli, clean, ckpt_paths):
    code, out, _ = run_cli("evaluate", clean, "-s", "25", "--clipped8", "--limit", "1", "-w", ckpt_paths[3], "--json")
    rows = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(rows) == 2 and rows[0]["clipped8"] is True and rows[1]["n"] == 1


def test_evaluate_real_pairs_and_a_missing_reference(run_cli, tmp_path, rng, ckpt_paths):
    noisy, ref = tmp_path / "noisy", tmp_path / "ref"
    noisy.mkdir(), ref.mkdir()
    for n in ("x", "y"):
        c = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
        write_png(ref / f"{n}_mean.png", c)
        write_png(noisy / f"{n}_real.png", np.clip(c + rng.normal(0, 8, c.shape), 0, 255).astype(np.uint8))
    code, out, err = run_cli("evaluate", ref, "--noisy", noisy, "--pair", "_real:_mean", "-w", ckpt_paths[3], "--json")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["sigma"] for r in rows] == [None, None, None] and rows[-1]["n"] == 2
    assert rows[0]["psnr_in"] == pytest.approx(
        psnr(read_image(noisy / "x_real.png").data, read_image(ref / "x_mean.png").data), abs=1e-3
    )
    (ref / "y_mean.png").unlink()
    code, _, err = run_cli("evaluate", ref, "--noisy", noisy, "--pair", "_real:_mean", "-w", ckpt_paths[3])
    assert code == 2 and "no clean reference for y_real.png" in err
    code, out, err = run_cli("evaluate", ref, "-s", "25", "-w", ckpt_paths[3])  # the table
    assert code == 0 and "indeed evaluate" in out and "PSNR" in out


def test_evaluate_with_camera_noise(run_cli, clean, ckpt_paths):
    code, out, err = run_cli("evaluate", clean, "--noise", "camera:heavy", "-w", ckpt_paths[3], "--json")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["sigma"] for r in rows] == ["camera:heavy"] * 3 and rows[-1]["summary"] and rows[-1]["n"] == 2
    assert all(r["clipped8"] is None for r in rows[:2])
    again = [json.loads(line) for line in run_cli("evaluate", clean, "--noise", "camera:heavy", "-w", ckpt_paths[3],
                                                   "--json")[1].splitlines()]  # fmt: skip
    assert [r["psnr_in"] for r in again] == [r["psnr_in"] for r in rows]  # seeded per image
    code, out, err = run_cli("evaluate", clean, "--noise", "camera:heavy+mhc", "-w", ckpt_paths[3], "--json")
    assert code == 0, err
    mhc = [json.loads(line) for line in out.splitlines()]
    assert [r["sigma"] for r in mhc] == ["camera:heavy+mhc"] * 3
    assert [r["psnr_in"] for r in mhc[:2]] != [r["psnr_in"] for r in rows[:2]]  # another demosaic, other noise
    for bad in ("camera:huge", "camera:heavy+vng"):
        code, _, err = run_cli("evaluate", clean, "--noise", bad, "-w", ckpt_paths[3])
        assert code == 2 and "camera:LEVEL" in err and "awgn" in err
    code, out, err = run_cli("evaluate", clean, "--noise", "gauss:15", "-w", ckpt_paths[3])
    assert code == 2 and not out and "use --noise awgn --sigma 15" in err and len(err.strip().splitlines()) == 1


def test_evaluate_scores_the_pixel_shuffle_read_out(run_cli, clean, ckpt_paths):
    args = ("evaluate", clean, "--noise", "camera:heavy", "-w", ckpt_paths[3], "--json")
    plain = [json.loads(line) for line in run_cli(*args)[1].splitlines()]
    code, out, err = run_cli(*args, "--pixel-shuffle", "2")
    assert code == 0, err
    shuffled = [json.loads(line) for line in out.splitlines()]
    assert [r["psnr_in"] for r in shuffled] == [r["psnr_in"] for r in plain]  # the same noisy inputs
    assert [r["psnr"] for r in shuffled[:2]] != [r["psnr"] for r in plain[:2]]  # another read-out
    assert all(r["pixel_shuffle"] == 2 for r in shuffled[:2]) and "pixel_shuffle" not in plain[0]
    code, _, err = run_cli(*args, "--pixel-shuffle", "0")
    assert code == 2 and "--pixel-shuffle" in err
    assert run_cli(*args, "--pixel-shuffle", "auto")[0] == 0


def test_evaluate_scores_the_ensemble_read_out(run_cli, clean, ckpt_paths):
    args = ("evaluate", clean, "-s", "25", "-w", ckpt_paths[3], "--json")
    plain = [json.loads(line) for line in run_cli(*args)[1].splitlines()]
    code, out, err = run_cli(*args, "--ensemble", "8")
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["psnr_in"] for r in rows] == [r["psnr_in"] for r in plain]  # the same noisy inputs
    assert all(r["ensemble"] == 8 for r in rows[:2]) and "ensemble" not in plain[0]
    assert [r["psnr"] for r in rows[:2]] != [r["psnr"] for r in plain[:2]]
    code, _, err = run_cli(*args, "--ensemble", "5")
    assert code == 2 and "--ensemble" in err
