"""`indeed calibrate` stores OOD statistics; `indeed denoise --json` reports them and --auto-adapt uses them."""

import json

import numpy as np
import pytest
from conftest import write_png

from indeed_cli.model import load_checkpoint, read_metadata, save_checkpoint


@pytest.fixture
def clean_dir(tmp_path, rng):
    d = tmp_path / "clean"
    d.mkdir()
    for i in range(3):
        write_png(d / f"{i}.png", rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
    return d


def test_calibrate_then_denoise_json_reports_ood(run_cli, tmp_path, clean_dir, ckpt_paths):
    cal = tmp_path / "cal.safetensors"
    code, out, err = run_cli(
        "calibrate", "--data", clean_dir, "-w", ckpt_paths[3], "-o", cal, "--samples", "10", "--json"
    )
    assert code == 0, err
    meta = read_metadata(cal)["extra"]["ood"]
    assert meta["n"] == 10 and meta["features"] == ["l_rank", "l_sparse"] and json.loads(out)["task"] == "denoise"
    assert meta["readout"].startswith("whole image")  # the read-out that made the features
    assert run_cli("calibrate", "--data", clean_dir, "-w", ckpt_paths[3], "-o", cal)[0] == 2  # no overwrite
    code, out, err = run_cli("denoise", clean_dir / "0.png", "-o", tmp_path / "d.png", "-w", cal, "--json", "-q")
    assert code == 0, err
    rec = json.loads(out)
    assert isinstance(rec["ood_score"], float) and rec["ood_threshold"] == pytest.approx(meta["threshold"], abs=1e-3)
    assert rec["ood"] == (rec["ood_score"] > rec["ood_threshold"]) and rec["adapted"] is None
    code, out, _ = run_cli(
        "denoise", clean_dir / "0.png", "-o", tmp_path / "f.png", "-w", cal, "--json", "-q", "--ood-threshold", "-1"
    )
    assert code == 0 and json.loads(out)["ood"] is True and json.loads(out)["ood_threshold"] == -1
    code, out, _ = run_cli(
        "denoise", clean_dir / "0.png", "-o", tmp_path / "e.png", "-w", ckpt_paths[3], "--json", "-q"
    )
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
        code, out, err = run_cli(
            "denoise", clean_dir, "-o", out_dir, "-w", tmp_path / name, "--auto-adapt", "--json", "-q"
        )
        assert code == 0, err
        recs = [json.loads(line) for line in out.splitlines()]
        assert len(recs) == 3 and len(list(out_dir.glob("*.png"))) == 3
        assert all(r["ood"] is flagged and (r["adapted"] is not None) is flagged for r in recs)


def test_auto_adapt_with_default_weights_adapts_from_the_adapt_default(
    run_cli, tmp_path, clean_dir, ckpt_paths, monkeypatch
):
    """Without -w, colour images are denoised with color-fullchroma and flagged ones adapted from color."""
    from indeed_cli.model.registry import BUNDLED, BUNDLED_FULLCHROMA

    ck = load_checkpoint(ckpt_paths[3])
    base = {"features": ["l_rank", "l_sparse"], "mean": [0, 0], "std": [1, 1], "points": [[0, 0]], "k": 1}
    wdir = tmp_path / "w"
    wdir.mkdir()
    save_checkpoint(wdir / BUNDLED_FULLCHROMA, ck.model, ck.training, {"ood": {**base, "threshold": -1.0}})
    save_checkpoint(wdir / BUNDLED[3], ck.model, ck.training, {"ood": {**base, "threshold": 1e9}})
    monkeypatch.setenv("INDEED_WEIGHTS_DIR", str(wdir))
    code, out, err = run_cli("denoise", clean_dir, "-o", tmp_path / "o", "--auto-adapt", "--json", "-q")
    assert code == 0, err
    recs = [json.loads(line) for line in out.splitlines()]
    # flagged by color-fullchroma's statistics, adapted from color
    assert len(recs) == 3 and all(r["ood"] and r["adapted"] is not None for r in recs)
    assert all(r["weights"].endswith(BUNDLED[3]) for r in recs)
    code, out, err = run_cli("denoise", clean_dir, "-o", tmp_path / "d", "-w", "default", "--auto-adapt", "--json")
    assert code == 0 and all(json.loads(line)["weights"].endswith(BUNDLED[3]) for line in out.splitlines())
    code, out, err = run_cli("denoise", clean_dir, "-o", tmp_path / "p", "--json", "-q")
    assert code == 0 and all(json.loads(line)["weights"].endswith(BUNDLED_FULLCHROMA) for line in out.splitlines())


def test_auto_adapt_adapts_flagged_images_in_groups(run_cli, tmp_path, clean_dir, ckpt_paths, monkeypatch):
    """On a GPU flagged images wait and are adapted together; every image is still written once."""
    import indeed_cli.pipelines.denoise as denoise_cli
    import indeed_cli.tasks.adaptation.runner as adaptation

    monkeypatch.setattr(denoise_cli, "default_group", lambda device: 2)  # what a GPU would do, with 2
    sizes, real_each = [], adaptation.adapt_each
    monkeypatch.setattr(
        adaptation, "adapt_each", lambda ck, sets, *a, **k: sizes.append(len(sets)) or real_each(ck, sets, *a, **k)
    )
    ck = load_checkpoint(ckpt_paths[3])
    base = {"features": ["l_rank", "l_sparse"], "mean": [0, 0], "std": [1, 1], "points": [[0, 0]], "k": 1}
    save_checkpoint(tmp_path / "all.safetensors", ck.model, ck.training, {"ood": {**base, "threshold": -1.0}})
    code, out, err = run_cli(
        "denoise", clean_dir, "-o", tmp_path / "o", "-w", tmp_path / "all.safetensors", "--auto-adapt", "--json", "-q"
    )
    assert code == 0, err
    recs = [json.loads(line) for line in out.splitlines()]
    assert sorted(r["image"] for r in recs) == sorted(str(p) for p in clean_dir.iterdir())
    assert all(r["adapted"] is not None for r in recs) and len(list((tmp_path / "o").glob("*.png"))) == 3
    assert sizes == [2, 1]  # two flagged images adapted together, then the last one
