"""Checkpoints made from checkpoints (weight averaging, growing f_thetaS, exporting a run's state),
as library functions and through the scripts in tools/."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_config, tiny_model

from indeed_cli.model import Checkpoint, load_checkpoint, save_checkpoint
from indeed_cli.model.surgery import average_checkpoints, grow_sparse_blocks
from indeed_cli.tasks.training import TrainConfig, export_state, read_state_metadata, save_state

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def _ck(seed: int) -> Checkpoint:
    m = tiny_model(1, seed=seed)
    return Checkpoint(m, m.cfg, {"steps": 10 * seed}, {}, f"m{seed}")


def test_average_is_the_mean_of_the_weights_and_lists_its_runs():
    a, b = _ck(1), _ck(2)
    avg = average_checkpoints([a, b])
    for k, v in avg.model.state_dict().items():
        torch.testing.assert_close(v, (a.model.state_dict()[k] + b.model.state_dict()[k]) / 2)
    assert avg.training["soup_steps"] == [10, 20] and avg.training["soup_of"] == ["m1", "m2"]


def test_average_refuses_checkpoints_of_different_models():
    other = tiny_model(1, sparse_blocks=2)
    try:
        average_checkpoints([_ck(1), Checkpoint(other, other.cfg)])
    except ValueError as e:
        assert "config" in str(e)
    else:
        raise AssertionError("averaged two different models")


def test_grown_network_computes_the_same_function():
    src = _ck(3)
    grown = grow_sparse_blocks(src, 3)
    assert grown.config.sparse_blocks == 3 and sum(p.numel() for p in grown.model.parameters()) > sum(
        p.numel() for p in src.model.parameters()
    )
    x = torch.rand(2, 1, 32, 32)
    with torch.no_grad():
        d0, d1 = src.model(x), grown.model(x)
    torch.testing.assert_close(d1.mu_S, d0.mu_S)
    torch.testing.assert_close(d1.L_hat, d0.L_hat)


def test_export_state_writes_the_checkpoint_of_a_run(tmp_path):
    cfg = tiny_config(1)
    model = tiny_model(1, seed=4)
    opt = torch.optim.Adam(model.parameters())
    extra = {"train": {}, "model": json.loads(cfg.to_json()), "facts": {"task": "denoise"}}
    save_state(tmp_path / "run", model, opt, 7, torch.Generator(), extra, elapsed=12.0, shard_bytes=2000)
    assert len(list((tmp_path / "run").glob("state-*.safetensors"))) > 1  # a parameter, not a constant
    assert read_state_metadata(tmp_path / "run")["step"] == 7
    out = export_state(tmp_path / "run", tmp_path / "m.safetensors")
    ck = load_checkpoint(out)
    assert ck.config == cfg and ck.training["steps"] == 7 and ck.training["task"] == "denoise"
    for k, v in ck.model.state_dict().items():  # fp16 on disk
        torch.testing.assert_close(v, model.state_dict()[k].half().float())


@pytest.mark.slow  # three Python processes
def test_tool_scripts_run(tmp_path):
    a, b = (save_checkpoint(tmp_path / f"{s}.safetensors", _ck(s).model) for s in (1, 2))
    run = [sys.executable, str(TOOLS / "average_weights.py"), tmp_path / "avg.safetensors", a, b]
    assert subprocess.run(run, capture_output=True).returncode == 0
    run = [sys.executable, str(TOOLS / "grow_network.py"), "--weights", a, "--blocks", "2", "--out", tmp_path / "g.st"]
    r = subprocess.run(run, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert load_checkpoint(tmp_path / "g.st").config.sparse_blocks == 2
    model = tiny_model(1)
    extra = {"model": json.loads(model.cfg.to_json())}
    save_state(tmp_path / "run", model, torch.optim.Adam(model.parameters()), 3, torch.Generator(), extra)
    run = [sys.executable, str(TOOLS / "export_state.py"), tmp_path / "run", tmp_path / "e.safetensors"]
    r = subprocess.run(run, capture_output=True, text=True)
    assert r.returncode == 0 and "step 3" in r.stdout, r.stderr
    assert TrainConfig().state_shard_mb == 0  # one file unless asked


def _fetch_wallpapers():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fetch_wallpapers", TOOLS / "fetch_wallpapers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_fetch_wallpapers_picks_the_largest_image_and_downscales_by_area(tmp_path):
    import numpy as np
    from PIL import Image

    fw = _fetch_wallpapers()
    assert fw.downscale_factor(3000, 2000) == 0.35 and fw.downscale_factor(2560, 1600) == 0.6
    images = tmp_path / "usr/share/wallpapers/Kite/contents/images"
    images.mkdir(parents=True)
    Image.new("RGB", (40, 30)).save(images / "40x30.jpg")
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (50, 80, 3), dtype=np.uint8)).save(images / "80x50.png")
    (images / "1920x1080.png").symlink_to("80x50.png")  # a size name that links to another file
    src = fw.find_photograph(tmp_path, "Kite")
    assert src == (images / "80x50.png").resolve()
    before, after = fw.write_downscaled(src, tmp_path / "Kite.png")
    assert before == (80, 50) and after == (48, 30)  # 0.6: the shorter side is below 2000
    x = np.asarray(Image.open(src), dtype=np.float64)
    y = np.asarray(Image.open(tmp_path / "Kite.png"), dtype=np.float64)
    assert abs(x.mean() - y.mean()) < 1.0  # an area filter keeps the mean
    backgrounds = tmp_path / "usr/share/backgrounds/mate/nature"
    backgrounds.mkdir(parents=True)
    Image.new("RGB", (8, 8)).save(backgrounds / "Dune.jpg")
    assert fw.find_photograph(tmp_path, "Dune") == backgrounds / "Dune.jpg"
    assert fw.find_photograph(tmp_path, "Storm") is None


def test_fetch_wallpapers_writes_nothing_when_a_package_is_missing(tmp_path):
    (tmp_path / "debs").mkdir()
    tool = [sys.executable, str(TOOLS / "fetch_wallpapers.py"), "--out", tmp_path / "out", "--debs", tmp_path / "debs"]
    got = subprocess.run(tool, capture_output=True, text=True)
    assert got.returncode == 1 and "not found" in got.stderr and not (tmp_path / "out").exists()
    (tmp_path / "out").mkdir()
    got = subprocess.run(tool, capture_output=True, text=True)
    assert got.returncode == 2 and "exists" in got.stderr


def test_profile_oag_credits_each_idle_gap_to_the_launch_that_ended_it():
    """tools/profile_oag.py's analysis: device intervals merged, the gaps between them, each gap's length
    credited to the last host operation begun before it ended."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("profile_oag", TOOLS / "profile_oag.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    busy = tool.merged_intervals([(30, 40), (0, 10), (5, 20), (20, 22), (100, 110)])
    assert busy == [[0, 22], [30, 40], [100, 110]]
    gaps = tool.idle_gaps(busy, least=5)
    assert gaps == [(22, 30), (40, 100)]
    assert tool.idle_gaps(busy, least=10) == [(40, 100)]
    credit = tool.credited_gaps(gaps, [(2, "a"), (25, "b"), (90, "c"), (105, "d")])
    assert credit == {"b": 8, "c": 60}
    assert tool.credited_gaps([(0, 1)], [(5, "late")]) == {"(before the first host operation)": 1}


def test_corner_crops_cut_the_corners_named_and_sorted_and_refuse_an_existing_folder(tmp_path):
    from PIL import Image

    src = tmp_path / "holdout"
    src.mkdir()
    tall = np.zeros((40, 24, 3), np.uint8)
    tall[-1, -1] = 200  # the bottom-right pixel
    Image.fromarray(tall).save(src / "hq__Urban100__img_002.png")
    Image.fromarray(np.zeros((30, 30, 3), np.uint8)).save(src / "hq__Urban100__img_001.png")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(src / "hq__Urban100__img_003.png")  # smaller than a crop
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(src / "hq__Set14__face.png")  # not --match
    run = [sys.executable, str(TOOLS / "corner_crops.py"), src, tmp_path / "out", "--size", "16", "--count", "5"]
    r = subprocess.run(run, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    names = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert names == ["img_001_tl.png", "img_001_tr.png", "img_002_bl.png", "img_002_br.png", "img_002_tl.png"]
    br = np.asarray(Image.open(tmp_path / "out" / "img_002_br.png"))
    assert br.shape == (16, 16, 3) and br[-1, -1, 0] == 200 and br[:-1].max() == 0
    assert subprocess.run(run, capture_output=True).returncode != 0  # the folder exists now
