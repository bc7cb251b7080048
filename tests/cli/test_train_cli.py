"""`indeed train`: fine-tuning from a checkpoint, the sparse module asked for, scale augmentation, option conflicts."""

import json

import numpy as np
import pytest
import torch
from conftest import TINY_TRAIN, tiny_config, write_png

from indeed_cli.tasks.training import (
    TrainConfig,
)
from indeed_cli.tasks.training import (
    run_training as train,
)


def test_init_starts_from_checkpoint_weights(tmp_path, rng, run_cli):
    from conftest import tiny_model

    from indeed_cli.model import load_checkpoint, read_metadata, save_checkpoint

    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        write_png(data / f"{i}.png", rng.integers(0, 256, (40, 40, 3), dtype=np.uint8))
    from indeed_cli.tasks.training import list_images, load_images

    ims = load_images(list_images(data), 3)
    start = save_checkpoint(tmp_path / "start.safetensors", tiny_model(3, seed=5), {"steps": 7})
    msgs = []
    tc = TrainConfig(steps=2, batch=2, patch=32, lr=0.0, lr_min=0.0, save_every=100, init=str(start))
    train(tiny_config(3), tc, ims, tmp_path / "run", device="cpu", progress=False, log=msgs.append)
    assert any("initialised from" in m for m in msgs)
    a, b = (
        load_checkpoint(start).model.state_dict(),
        load_checkpoint(tmp_path / "run" / "model.safetensors").model.state_dict(),
    )
    assert all(torch.equal(a[k], b[k]) for k in a)  # lr 0: the exported weights are the initial ones
    assert read_metadata(tmp_path / "run" / "model.safetensors")["training"]["init"] == str(start)
    # the variational q(B) starts from a checkpoint of f_thetaB's kind (the same weights)
    from dataclasses import replace

    train(replace(tiny_config(3), lowrank_b="variational"), tc, ims, tmp_path / "run_vb", device="cpu", progress=False)
    vb = load_checkpoint(tmp_path / "run_vb" / "model.safetensors")
    assert vb.config.lowrank_b == "variational"
    assert all(torch.equal(a[k], vb.model.state_dict()[k]) for k in a)
    # a mismatching config is refused before training
    code, _, err = run_cli(
        "train",
        "--data",
        data,
        "--out",
        tmp_path / "r2",
        "--init",
        start,
        "--channels",
        "1",
        "--val-count",
        "0",
        "--steps",
        "1",
        "-q",
    )
    assert code == 3 and "3-channel" in err
    code, _, err = run_cli(
        "train",
        "--data",
        data,
        "--out",
        tmp_path / "r3",
        "--sparse-input",
        "image",
        "--val-count",
        "0",
        "--steps",
        "1",
        "-q",
    )
    assert code == 2 and "sparse_input" in err
    code, _, err = run_cli(
        "train",
        "--data",
        data,
        "--out",
        tmp_path / "r4",
        "--init",
        start,
        "--lowrank-b",
        "svd",
        "--val-count",
        "0",
        "--steps",
        "1",
        "-q",
    )
    assert code == 2 and "lowrank_b" in err and not (tmp_path / "r4").exists()


def test_train_cli_builds_the_requested_sparse_module(tmp_path, rng, run_cli):
    from indeed_cli.model import read_metadata

    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        write_png(data / f"{i}.png", rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))
    code, _, err = run_cli(
        "train",
        "--data",
        data,
        "--out",
        tmp_path / "run",
        "--sparse-width",
        "8",
        "--sparse-blocks",
        "1",
        "--sparse-levels",
        "4",
        "--sparse-input",
        "residual+lowrank",
        "--lowrank-width",
        "8",
        "--rank",
        "4",
        "--patch",
        "32",
        "--batch",
        "2",
        "--steps",
        "2",
        "--val-count",
        "1",
        "--ood-samples",
        "0",
        "-q",
        "--device",
        "cpu",
    )
    assert code == 0, err
    cfg = read_metadata(tmp_path / "run" / "model.safetensors")["config"]
    assert (cfg["sparse_width"], cfg["sparse_blocks"], cfg["sparse_levels"], cfg["sparse_input"]) == (
        8,
        1,
        4,
        "residual+lowrank",
    )


def test_train_denoise_scale_augmentation_leaves_out_copies_smaller_than_the_patch(tmp_path, rng, run_cli):
    from indeed_cli.model import read_metadata

    data = tmp_path / "data"
    data.mkdir()
    for i in range(3):
        write_png(data / f"{i}.png", rng.integers(0, 256, (48, 48), dtype=np.uint8))
    # 0.75 makes 36 px copies (kept), 0.5 makes 24 px ones: cropping 32 px patches from them would fail
    code, _, err = run_cli(
        "train",
        "--data",
        data,
        "--out",
        tmp_path / "run",
        "--channels",
        "1",
        "--scales",
        "1,0.75,0.5",
        *TINY_TRAIN,
        "--steps",
        "2",
        "--val-count",
        "1",
        "--ood-samples",
        "0",
        "-q",
        "--device",
        "cpu",
    )
    assert code == 0, err
    meta = read_metadata(tmp_path / "run" / "model.safetensors")
    assert meta["training"]["augment_scales"] == [1.0, 0.75, 0.5] and "scales" not in meta["training"]
    assert "detect" not in meta["extra"]  # a denoiser has no read-out scales


def test_train_cli_refuses_deterministic_with_a_time_budget(tmp_path, rng, run_cli):
    d = tmp_path / "data"
    d.mkdir()
    write_png(d / "a.png", rng.integers(0, 256, (40, 40, 3), dtype=np.uint8))
    code, _, err = run_cli("train", "--data", d, "--out", tmp_path / "run", "--deterministic", "--time-budget", "10")
    assert code == 2 and "step-based" in err and not (tmp_path / "run").exists()


def _colour_pngs(folder, rng, count: int = 3):
    folder.mkdir()
    for i in range(count):
        write_png(folder / f"{i}.png", rng.integers(0, 256, (40, 40, 3), dtype=np.uint8))
    return folder


@pytest.mark.parametrize("option,key", [("--camera-noise", "camera_share"), ("--saturation", "saturation_share")])
def test_colour_training_options_are_recorded_and_refuse_gray_and_bad_shares(tmp_path, rng, run_cli, option, key):
    from indeed_cli.model import read_metadata

    data = _colour_pngs(tmp_path / "data", rng)
    common = [*TINY_TRAIN, "--steps", "2", "--val-count", "1", "--ood-samples", "0", "-q", "--device", "cpu"]
    code, _, err = run_cli("train", "--data", data, "--out", tmp_path / "run", option, "0.5", *common)
    assert code == 0, err
    assert read_metadata(tmp_path / "run" / "model.safetensors")["training"][key] == 0.5
    code, _, err = run_cli(
        "train", "--data", data, "--out", tmp_path / "gray", "--channels", "1", option, "0.5", *common
    )
    assert code == 2 and "colour model" in err and not (tmp_path / "gray").exists()
    code, _, err = run_cli("train", "--data", data, "--out", tmp_path / "bad", option, "2", *common)
    assert code == 2 and option in err and not (tmp_path / "bad").exists()


def test_train_with_rank_supervision_logs_l_n_and_refuses_detection(tmp_path, rng, run_cli):
    data = _colour_pngs(tmp_path / "data", rng)
    common = [*TINY_TRAIN, "--steps", "2", "--log-every", "1", "--val-count", "1", "--ood-samples", "0", "-q"]
    code, _, err = run_cli(
        "train", "--data", data, "--out", tmp_path / "run", "--rank-supervision", "100", "--device", "cpu", *common
    )
    assert code == 0, err
    logged = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert any("rank_sup" in r for r in logged)
    code, _, err = run_cli(
        "train", "--task", "detect", "--data", data, "--out", tmp_path / "det", "--rank-supervision", "1", *common
    )
    assert code == 2 and "--rank-supervision" in err and not (tmp_path / "det").exists()


def test_no_training_images_says_why(tmp_path, rng, run_cli):
    """A folder whose images all went to validation: the line says so, instead of only 'no training images'."""
    data = tmp_path / "data"
    data.mkdir()
    write_png(data / "only.png", rng.integers(0, 256, (40, 40, 3), dtype=np.uint8))
    code, _, err = run_cli("train", "--data", data, "--out", tmp_path / "run", "--val-count", "8", "-q")
    assert code == 2 and "the 1 image(s) found went to validation (--val-count 8)" in err
    assert not (tmp_path / "run").exists()
