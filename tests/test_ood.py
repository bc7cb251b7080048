"""OOD score: k-NN distance in standardised (l_rank, l_sparse), stored by `indeed calibrate`."""
import json

import numpy as np
import pytest

from conftest import write_png
from indeed_cli.checkpoint import load_checkpoint, read_metadata, save_checkpoint
from indeed_cli.ood import fit_ood, ood_report, ood_score


def _curve_images(n=60, tiles=6, seed=0):
    """Training tile features on a curve (as they lie along the noise level): one noise level
    per image, its tiles jittered around that point."""
    rng = np.random.default_rng(seed)
    out = []
    for t in rng.uniform(0, 1, n):
        out.append(np.stack([5 + 2 * t, 9 - 3 * t ** 2], 0)[None] + rng.normal(0, 0.01, (tiles, 2)))
    return out


def test_threshold_is_the_quantile_of_leave_one_image_out_scores():
    imgs = _curve_images(20, 3)
    ood = fit_ood(imgs, k=3, quantile=0.9)
    allf = np.concatenate(imgs)
    z = [(f - allf.mean(0)) / allf.std(0) for f in imgs]
    own = []
    for i, zi in enumerate(z):
        others = np.concatenate([zj for j, zj in enumerate(z) if j != i])
        d = np.sqrt(((zi[:, None] - others[None]) ** 2).sum(-1))
        own.append(np.median(np.sort(d, 1)[:, 2]))
    assert ood["threshold"] == pytest.approx(np.quantile(own, 0.9), rel=1e-6)
    assert ood["n"] == 20 and ood["n_points"] == 60 and len(ood["points"]) == 60


def test_points_off_the_training_curve_score_above_threshold():
    ood = fit_ood(_curve_images())
    rng = np.random.default_rng(1)
    on = np.array([[6.0, 9 - 3 * 0.25]]) + rng.normal(0, 0.01, (6, 2))  # t = 0.5, on the curve
    off = np.array([[6.0, 9.0]]) + rng.normal(0, 0.01, (6, 2))  # inside the curve's bounding box, off it
    assert ood_score(on, ood) < ood["threshold"] < ood_score(off, ood)
    assert ood_report(off, ood)["ood"] is True and ood_report(on, ood)["ood"] is False
    assert ood_report(on, None) == {"ood_score": None, "ood_threshold": None, "ood": None}
    # the median over tiles: one odd tile does not flag an image
    mixed = np.concatenate([on, off[:1]])
    assert ood_report(mixed, ood)["ood"] is False
    json.dumps(ood)  # stored as checkpoint metadata


def test_fit_ood_rejects_bad_input():
    with pytest.raises(ValueError):
        fit_ood([np.zeros((3, 2))])
    with pytest.raises(ValueError):
        fit_ood([np.zeros((3, 2)), np.zeros((0, 2))])


@pytest.fixture
def clean_dir(tmp_path, rng):
    d = tmp_path / "clean"
    d.mkdir()
    for i in range(3):
        write_png(d / f"{i}.png", rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
    return d


def test_calibrate_then_denoise_json_reports_ood(run_cli, tmp_path, clean_dir, ckpt_paths):
    cal = tmp_path / "cal.safetensors"
    code, out, err = run_cli("calibrate", "--data", clean_dir, "-w", ckpt_paths[3], "-o", cal, "--samples", "10", "--json")
    assert code == 0, err
    meta = read_metadata(cal)["extra"]["ood"]
    assert meta["n"] == 10 and meta["features"] == ["l_rank", "l_sparse"] and json.loads(out)["task"] == "denoise"
    assert run_cli("calibrate", "--data", clean_dir, "-w", ckpt_paths[3], "-o", cal)[0] == 2  # no overwrite
    code, out, err = run_cli("denoise", clean_dir / "0.png", "-o", tmp_path / "d.png", "-w", cal, "--json", "-q")
    assert code == 0, err
    rec = json.loads(out)
    assert isinstance(rec["ood_score"], float) and rec["ood_threshold"] == pytest.approx(meta["threshold"], abs=1e-3)
    assert rec["ood"] == (rec["ood_score"] > rec["ood_threshold"]) and rec["adapted"] is None
    code, out, _ = run_cli("denoise", clean_dir / "0.png", "-o", tmp_path / "f.png", "-w", cal, "--json", "-q",
                           "--ood-threshold", "-1")
    assert code == 0 and json.loads(out)["ood"] is True and json.loads(out)["ood_threshold"] == -1
    code, out, _ = run_cli("denoise", clean_dir / "0.png", "-o", tmp_path / "e.png", "-w", ckpt_paths[3], "--json", "-q")
    assert code == 0 and json.loads(out)["ood_score"] is None


def test_auto_adapt_runs_oag_only_on_flagged_images(run_cli, tmp_path, clean_dir, ckpt_paths):
    code, _, err = run_cli("denoise", clean_dir, "-o", tmp_path / "x", "-w", ckpt_paths[3], "--auto-adapt", "-q")
    assert code == 3 and "OOD statistics" in err and not (tmp_path / "x").exists()
    ck = load_checkpoint(ckpt_paths[3])
    base = {"features": ["l_rank", "l_sparse"], "mean": [0, 0], "std": [1, 1], "points": [[0, 0]], "k": 1}
    for name, thr in (("all.safetensors", -1.0), ("none.safetensors", 1e9)):
        save_checkpoint(tmp_path / name, ck.model, ck.training, {"ood": {**base, "threshold": thr}})
    for name, flagged in (("all.safetensors", True), ("none.safetensors", False)):
        out_dir = tmp_path / name.split(".")[0]
        code, out, err = run_cli("denoise", clean_dir, "-o", out_dir, "-w", tmp_path / name, "--auto-adapt",
                                 "--json", "-q")
        assert code == 0, err
        recs = [json.loads(line) for line in out.splitlines()]
        assert len(recs) == 3 and len(list(out_dir.glob("*.png"))) == 3
        assert all(r["ood"] is flagged and (r["adapted"] is not None) is flagged for r in recs)


def test_auto_adapt_adapts_flagged_images_in_groups(run_cli, tmp_path, clean_dir, ckpt_paths, monkeypatch):
    """On a GPU flagged images wait and are adapted together; every image is still written once."""
    import indeed_cli.cli.denoise as denoise_cli
    import indeed_cli.adaptation as adaptation
    monkeypatch.setattr(denoise_cli, "default_group", lambda device: 2)  # what a GPU would do, with 2
    sizes, real_each = [], adaptation.adapt_each
    monkeypatch.setattr(adaptation, "adapt_each",
                        lambda ck, sets, *a, **k: sizes.append(len(sets)) or real_each(ck, sets, *a, **k))
    ck = load_checkpoint(ckpt_paths[3])
    base = {"features": ["l_rank", "l_sparse"], "mean": [0, 0], "std": [1, 1], "points": [[0, 0]], "k": 1}
    save_checkpoint(tmp_path / "all.safetensors", ck.model, ck.training, {"ood": {**base, "threshold": -1.0}})
    code, out, err = run_cli("denoise", clean_dir, "-o", tmp_path / "o", "-w", tmp_path / "all.safetensors",
                             "--auto-adapt", "--json", "-q")
    assert code == 0, err
    recs = [json.loads(line) for line in out.splitlines()]
    assert sorted(r["image"] for r in recs) == sorted(str(p) for p in clean_dir.iterdir())
    assert all(r["adapted"] is not None for r in recs) and len(list((tmp_path / "o").glob("*.png"))) == 3
    assert sizes == [2, 1]  # two flagged images adapted together, then the last one
