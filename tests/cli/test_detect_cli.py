"""`indeed train --task detect` then `indeed detect`, end to end on tiny data."""

import json

import numpy as np
import pytest
import torch
from conftest import TINY_TRAIN, package_format_state, write_png


def test_train_detect_end_to_end(tmp_path, run_cli, rng):
    from indeed_cli.model import read_metadata

    d = tmp_path / "normal"
    d.mkdir()
    for i in range(5):  # includes an image narrower than the patch
        write_png(d / f"{i}.png", rng.integers(90, 160, (40 if i else 20, 44), dtype=np.uint8))
    code, _, err = run_cli(
        "train",
        "--task",
        "detect",
        "--data",
        d,
        "--val-count",
        "2",
        "--channels",
        "1",
        *TINY_TRAIN,
        "--support-width",
        "8",
        "--steps",
        "3",
        "--memory-entries",
        "2",
        "--out",
        tmp_path / "run",
        "-q",
    )
    assert code == 0, err
    meta = read_metadata(tmp_path / "run" / "model.safetensors")
    assert meta["memory"]["entries"] == 2  # of the 7 candidates of its 3 training images
    assert meta["config"]["task"] == "detect" and meta["config"]["support_width"] == 8
    assert meta["extra"]["detect"]["map"].startswith("q(z = 1)")  # the support posterior is the map
    assert meta["extra"]["detect"]["n_calibration"] == 2 and meta["extra"]["detect"]["threshold"] > 0
    assert meta["training"]["anomalies"]["preset"] == "strong"
    assert meta["training"]["scales"] == [1.0, 0.5, 0.25] == meta["extra"]["detect"]["scales"]  # the default pyramid
    code, _, err = run_cli(
        "train",
        "--task",
        "detect",
        "--data",
        d,
        "--val-count",
        "2",
        "--channels",
        "1",
        *TINY_TRAIN,
        "--steps",
        "2",
        "--anomalies",
        "surface",
        "--scales",
        "1,0.5",
        "--support-width",
        "0",
        "--out",
        tmp_path / "runs",
        "-q",
    )
    assert code == 0, err
    meta = read_metadata(tmp_path / "runs" / "model.safetensors")
    # with the memory a new detector fills, its image score is Eq. (score fusion)'s
    assert meta["config"]["support_width"] == 0 and meta["extra"]["detect"]["score_kind"] == "top5_joint"
    assert meta["training"]["scales"] == [1.0, 0.5] and meta["extra"]["detect"]["scales"] == [1.0, 0.5]
    assert meta["training"]["anomalies"]["preset"] == "surface"
    # a detector without f_thetaM gets a fresh one on top of its trained modules
    code, _, err = run_cli(
        "train",
        "--task",
        "detect",
        "--data",
        d,
        "--val-count",
        "2",
        "--channels",
        "1",
        "--init",
        tmp_path / "runs" / "model.safetensors",
        "--support-width",
        "8",
        "--patch",
        "32",
        "--batch",
        "2",
        "--steps",
        "1",
        "--out",
        tmp_path / "runi",
    )
    assert code == 0 and "f_thetaM (support posterior) starts fresh" in err, err
    from indeed_cli.model import load_checkpoint

    before, after = (
        load_checkpoint(tmp_path / "runs" / "model.safetensors"),
        load_checkpoint(tmp_path / "runi" / "model.safetensors"),
    )
    assert after.config.support_width == 8 and after.config.sparse_width == before.config.sparse_width
    for bad in ("1,0", "1,1", "a"):
        code, _, err = run_cli(
            "train",
            "--task",
            "detect",
            "--data",
            d,
            "--val-count",
            "2",
            "--channels",
            "1",
            "--scales",
            bad,
            "--steps",
            "1",
            "--out",
            tmp_path / "runb",
            "-q",
        )
        assert code == 2 and "--scales" in err and not (tmp_path / "runb").exists()
    code, _, err = run_cli(
        "train",
        "--task",
        "detect",
        "--data",
        d,
        "--val-count",
        "2",
        "--channels",
        "1",
        "--anomalies",
        "loud",
        "--steps",
        "1",
        "--out",
        tmp_path / "run1",
        "-q",
    )
    assert code == 2 and "--anomalies" in err
    # without held-out normal images there is no threshold to learn: refused before any training
    code, _, err = run_cli(
        "train",
        "--task",
        "detect",
        "--data",
        d,
        "--val-count",
        "0",
        "--channels",
        "1",
        "--steps",
        "3",
        "--out",
        tmp_path / "run0",
        "-q",
    )
    assert code == 2 and "held-out normal images" in err and not (tmp_path / "run0").exists()


def tiny_detector_and_normals(tmp_path, rng):
    """A tiny untrained gray detector with f_thetaM (read out at scale 1) and a folder of 3 normal images."""
    from conftest import tiny_model

    from indeed_cli.model import save_checkpoint

    det = save_checkpoint(
        tmp_path / "det.safetensors", tiny_model(1, task="detect", support_width=8), {"scales": [1.0]}
    )
    normal = tmp_path / "normal"
    normal.mkdir()
    for i in range(3):
        write_png(normal / f"{i}.png", rng.integers(0, 256, (40, 48), dtype=np.uint8))
    return det, normal


def test_calibrate_learns_a_threshold_for_the_scales_asked(tmp_path, run_cli, rng):
    from indeed_cli.model import read_metadata

    det, normal = tiny_detector_and_normals(tmp_path, rng)
    out = tmp_path / "cal.safetensors"
    code, _, err = run_cli("calibrate", "-w", det, "--data", normal, "-o", out, "--scales", "1,0.5", "--device", "cpu")
    assert code == 0, err
    facts = read_metadata(out)["extra"]["detect"]
    assert facts["scales"] == [1.0, 0.5] and facts["readout"].startswith("whole image")
    bad = tmp_path / "b.safetensors"
    code, _, err = run_cli("calibrate", "-w", det, "--data", normal, "-o", bad, "--scales", "0,1")
    assert code == 2 and "--scales" in err and not bad.exists()


def test_calibrate_precision_is_stored_and_read_out_at(tmp_path, run_cli, rng, ckpt_paths):
    """`indeed calibrate --precision bf16`: the threshold is learned on bf16 maps and the precision
    stored with it; `indeed detect` then reads out in bf16 (its JSON says so, and its score is the
    bf16 read-out's, not the fp32 one's) unless given --precision; recalibrating without
    --precision keeps it; a bad value, or a denoiser, is refused in one line with nothing written."""
    from indeed_cli.inference import InferenceOptions
    from indeed_cli.model import load_checkpoint, read_metadata
    from indeed_cli.tasks.detection import detect, readout_precision

    det, normal = tiny_detector_and_normals(tmp_path, rng)
    runs = {}
    for p in ("bf16", "fp32"):
        runs[p] = tmp_path / f"cal_{p}.safetensors"
        code, _, err = run_cli("calibrate", "-w", det, "--data", normal, "-o", runs[p], "--precision", p)
        assert code == 0, err
        assert read_metadata(runs[p])["extra"]["detect"]["precision"] == p
    ck16, ck32 = (load_checkpoint(runs[p], "cpu") for p in ("bf16", "fp32"))
    assert readout_precision(ck16) == "bf16" and readout_precision(ck32) == "fp32"
    img = rng.random((1, 40, 48), dtype=np.float32)
    own = detect(ck16, img)  # the detector's own precision
    assert own.score == detect(ck16, img, InferenceOptions(precision="bf16")).score
    assert own.score != detect(ck16, img, InferenceOptions(precision="fp32")).score
    again = tmp_path / "again.safetensors"  # recalibrated without --precision: kept
    assert run_cli("calibrate", "-w", runs["bf16"], "--data", normal, "-o", again, "--device", "cpu")[0] == 0
    assert read_metadata(again)["extra"]["detect"]["precision"] == "bf16"
    maps = tmp_path / "maps"
    maps.mkdir()
    for extra, want in (((), "bf16"), (("--precision", "fp32", "--force"), "fp32")):
        code, out, err = run_cli("detect", normal / "0.png", "--maps", maps, "-w", runs["bf16"], "--json",
                                 "--device", "cpu", *extra)  # fmt: skip
        assert code == 0, err
        record = json.loads(out.strip().splitlines()[0])
        assert record["precision"] == want
    bad = tmp_path / "b.safetensors"
    code, _, err = run_cli("calibrate", "-w", det, "--data", normal, "-o", bad, "--precision", "fp16")
    assert code == 2 and "--precision" in err and len(err.strip().splitlines()) == 1 and not bad.exists()
    code, _, err = run_cli("calibrate", "-w", ckpt_paths[1], "--data", normal, "-o", bad, "--precision", "bf16")
    assert code == 2 and "--precision" in err and not bad.exists()


def test_calibrate_quantile_sets_the_operating_point(tmp_path, run_cli, rng, ckpt_paths):
    """`--quantile Q`: the threshold is that quantile of the normal images' scores (0.5: their median,
    1: their maximum); outside (0, 1], or for a denoiser, one line, exit 2 and nothing written."""
    from indeed_cli.model import read_metadata

    det, normal = tiny_detector_and_normals(tmp_path, rng)
    facts = {}
    for q in ("0.5", "1"):
        out = tmp_path / f"cal{q}.safetensors"
        code, _, err = run_cli("calibrate", "-w", det, "--data", normal, "-o", out, "--quantile", q, "--device", "cpu")
        assert code == 0, err
        facts[q] = read_metadata(out)["extra"]["detect"]
        assert facts[q]["quantile"] == float(q)
    assert facts["0.5"]["threshold"] == facts["0.5"]["normal_scores"]["median"]
    assert facts["1"]["threshold"] == facts["1"]["normal_scores"]["max"] > facts["0.5"]["threshold"]
    bad = tmp_path / "b.safetensors"
    code, _, err = run_cli("calibrate", "-w", det, "--data", normal, "-o", bad, "--quantile", "0")
    assert code == 2 and "--quantile" in err and len(err.strip().splitlines()) == 1 and not bad.exists()
    code, _, err = run_cli("calibrate", "-w", ckpt_paths[1], "--data", normal, "-o", bad, "--quantile", "0.9")
    assert code == 2 and "--quantile" in err and not bad.exists()


def test_train_gives_a_detector_imagenet_features(tmp_path, run_cli, rng):
    """`--support-features FILE`: f_thetaM of a trained detector also reads the frozen trunk, which the
    new checkpoint carries, so `indeed detect` needs no feature file; a missing file is one line."""
    from indeed_cli.model import load_checkpoint
    from indeed_cli.model.checkpoint import save_feature_trunk
    from indeed_cli.model.features import trunk_state_from_efficientnet

    d = tmp_path / "normal"
    d.mkdir()
    for i in range(4):
        write_png(d / f"{i}.png", rng.integers(90, 160, (40, 44), dtype=np.uint8))
    trunk = save_feature_trunk(
        tmp_path / "t.safetensors", trunk_state_from_efficientnet(package_format_state()), "efficientnet-lite0", "test"
    )
    common = ["train", "--task", "detect", "--data", d, "--val-count", "2", "--channels", "1", *TINY_TRAIN, "-q"]
    code, _, err = run_cli(
        *common, "--support-width", "8", "--support-features", "none", "--steps", "1", "--out", tmp_path / "run"
    )
    assert code == 0, err
    start = tmp_path / "run" / "model.safetensors"
    assert load_checkpoint(start).config.support_features == ""
    code, _, err = run_cli(
        *common,
        "--init",
        start,
        "--support-features",
        tmp_path / "missing.safetensors",
        "--steps",
        "1",
        "--out",
        tmp_path / "bad",
    )
    assert code != 0 and "feature weights not found" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bad" / "model.safetensors").exists()
    code, _, err = run_cli(
        *common, "--init", start, "--support-features", trunk, "--steps", "1", "--out", tmp_path / "feat"
    )
    assert code == 0 and "now also reads ImageNet features" in err, err
    ck = load_checkpoint(tmp_path / "feat" / "model.safetensors")
    assert ck.config.support_features == "efficientnet-lite0"
    assert torch.equal(
        ck.model.support.features.stem.weight, load_checkpoint_trunk(trunk)["stem.weight"].half().float()
    )
    out = tmp_path / "maps"
    code, stdout, err = run_cli(
        "detect", d, "-w", tmp_path / "feat" / "model.safetensors", "--maps", out, "--json", "-q"
    )
    assert code in (0, 1) and len(stdout.strip().splitlines()) == 4, err  # 1: some image flagged
    assert len(list(out.glob("*_anomaly.png"))) == 4


def load_checkpoint_trunk(path):
    from indeed_cli.model.checkpoint import read_feature_trunk

    return read_feature_trunk(path, "efficientnet-lite0")


def test_new_detector_reads_the_bundled_imagenet_features_by_default(tmp_path, run_cli, rng):
    from indeed_cli.model import load_checkpoint, weights_dir
    from indeed_cli.model.checkpoint import read_feature_trunk

    d = tmp_path / "normal"
    d.mkdir()
    for i in range(3):
        write_png(d / f"{i}.png", rng.integers(90, 160, (40, 44), dtype=np.uint8))
    common = ["train", "--task", "detect", "--data", d, "--val-count", "1", "--channels", "1", *TINY_TRAIN, "-q"]
    code, _, err = run_cli(*common, "--steps", "1", "--out", tmp_path / "default")
    assert code == 0, err
    ck = load_checkpoint(tmp_path / "default" / "model.safetensors")
    assert (ck.config.support_width, ck.config.support_features) == (32, "efficientnet-lite0")
    bundled = read_feature_trunk(weights_dir() / "features" / "efficientnet-lite0.safetensors", "efficientnet-lite0")
    assert all(torch.equal(v, bundled[k].float()) for k, v in ck.model.support.features.state_dict().items())
    code, _, err = run_cli(*common, "--steps", "1", "--support-width", "0", "--out", tmp_path / "paper")
    assert code == 0, err
    cfg = load_checkpoint(tmp_path / "paper" / "model.safetensors").config
    assert (cfg.support_width, cfg.support_features) == (0, "")  # the paper's |mu_S| map
    code, _, err = run_cli(
        *common,
        "--steps",
        "1",
        "--support-width",
        "0",
        "--support-features",
        "efficientnet-lite0",
        "--out",
        tmp_path / "x",
    )
    assert code == 2 and "f_thetaM" in err and not (tmp_path / "x").exists()


def test_calibrate_member_makes_a_detector_of_two_members(tmp_path, run_cli, rng, ckpt_paths):
    """`indeed calibrate --member D2`: the file holds both networks, its threshold is learned on the
    mean of their maps, `indeed detect` maps that mean; a member that is not a detector of the same
    channels is one line, exit 3, nothing written."""
    from conftest import tiny_model

    from indeed_cli.inference import InferenceOptions
    from indeed_cli.io import read_image
    from indeed_cli.model import load_checkpoint, read_metadata, save_checkpoint
    from indeed_cli.tasks.detection import scale_maps

    nets = {s: tiny_model(1, seed=s, task="detect", support_width=8) for s in (1, 2)}
    scales = {1: [1.0, 0.5], 2: [0.5]}
    dets = [save_checkpoint(tmp_path / f"d{s}.safetensors", nets[s], {"scales": scales[s]}) for s in (1, 2)]
    normal = tmp_path / "normal"
    normal.mkdir()
    for i in range(3):
        write_png(normal / f"{i}.png", rng.integers(90, 160, (40, 48), dtype=np.uint8))
    pair = tmp_path / "pair.safetensors"
    code, out, err = run_cli("calibrate", "-w", dets[0], "--member", dets[1], "--data", normal, "-o", pair, "--json")
    assert code == 0, err
    meta = read_metadata(pair)
    assert len(meta["members"]) == 1 and meta["extra"]["detect"]["map"].endswith("2 members")
    assert meta["members"][0]["extra"] == {"detect": {"scales": [0.5]}}
    img = write_png(tmp_path / "t.png", rng.integers(0, 256, (37, 50), dtype=np.uint8))
    code, out, err = run_cli("detect", img, "--maps", tmp_path / "maps", "-w", pair, "--json")
    assert code == 0, err
    got = np.load(tmp_path / "maps" / "t.npz")["anomaly_map"]
    want = np.mean([scale_maps(load_checkpoint(d), read_image(img), InferenceOptions()).mean(0) for d in dets], 0)
    assert np.allclose(got, want, atol=1e-5)
    # calibrating the pair again keeps its members
    again = tmp_path / "again.safetensors"
    code, _, err = run_cli("calibrate", "-w", pair, "--data", normal, "-o", again, "--quantile", "0.5")
    assert code == 0 and len(read_metadata(again)["members"]) == 1, err
    for bad_member in (ckpt_paths[1], ckpt_paths[3]):  # a gray and a colour denoiser
        bad = tmp_path / "bad.safetensors"
        code, _, err = run_cli("calibrate", "-w", dets[0], "--member", bad_member, "--data", normal, "-o", bad)
        assert code == 3 and len(err.strip().splitlines()) == 1 and not bad.exists(), err


def test_calibrate_memory_fills_keeps_and_drops_the_feature_memory(tmp_path, run_cli, rng, ckpt_paths):
    """`indeed calibrate --memory NORMAL`: the file holds the memory and the fusion statistics, and
    `indeed detect` maps the fusion; recalibrating keeps the memory, `--memory none` drops it; a
    missing folder, an empty list or a denoiser is one line, exit 2, nothing written."""
    from conftest import tiny_model

    from indeed_cli.io import read_image
    from indeed_cli.model import load_checkpoint, read_metadata, save_checkpoint
    from indeed_cli.tasks.detection import detect

    det = save_checkpoint(tmp_path / "d.safetensors", tiny_model(1, task="detect", support_width=8), {"scales": [1.0]})
    normal = tmp_path / "normal"
    normal.mkdir()
    for i in range(3):
        write_png(normal / f"{i}.png", rng.integers(90, 160, (40, 48), dtype=np.uint8))
    out = tmp_path / "mem.safetensors"
    code, _, err = run_cli("calibrate", "-w", det, "--data", normal, "--memory", normal, "-o", out, "--device", "cpu")
    assert code == 0, err
    meta = read_metadata(out)
    assert meta["memory"]["entries"] > 0 and meta["extra"]["detect"]["memory"]["members"] == 1
    img = write_png(tmp_path / "t.png", rng.integers(0, 256, (37, 50), dtype=np.uint8))
    code, stdout, err = run_cli("detect", img, "--maps", tmp_path / "maps", "-w", out, "--json")
    assert code == 0, err
    got = np.load(tmp_path / "maps" / "t.npz")["anomaly_map"]
    want = detect(load_checkpoint(out), read_image(img))
    assert np.allclose(got, want.anomaly_map, atol=1e-6)
    # the image is scored by Eq. (score fusion) at the threshold, its pixels marked at the pixel threshold
    facts, record = meta["extra"]["detect"], json.loads(stdout.strip().splitlines()[-1])
    assert facts["score_kind"] == "top5_joint" and facts["pixel_threshold"] != facts["threshold"]
    assert record["threshold"] == facts["threshold"] and record["pixel_threshold"] == facts["pixel_threshold"]
    assert np.isclose(record["score"], want.score, atol=1e-6)
    assert record["anomalous"] == (want.score > facts["threshold"])
    from PIL import Image

    mask = np.asarray(Image.open(tmp_path / "maps" / "t_mask.png")) > 0
    assert np.array_equal(mask, got > facts["pixel_threshold"])
    again, dropped = tmp_path / "again.safetensors", tmp_path / "dropped.safetensors"
    assert run_cli("calibrate", "-w", out, "--data", normal, "-o", again)[0] == 0
    assert read_metadata(again)["memory"] == meta["memory"] and "memory" in read_metadata(again)["extra"]["detect"]
    assert run_cli("calibrate", "-w", out, "--data", normal, "--memory", "none", "-o", dropped)[0] == 0
    assert read_metadata(dropped)["memory"] is None and "memory" not in read_metadata(dropped)["extra"]["detect"]
    assert "pixel_threshold" not in read_metadata(dropped)["extra"]["detect"]
    assert read_metadata(dropped)["extra"]["detect"]["score_kind"] == "top5"
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    for bad_memory, weights in ((tmp_path / "nowhere", det), (empty, det), (normal, ckpt_paths[1])):
        bad = tmp_path / "bad.safetensors"
        code, _, err = run_cli("calibrate", "-w", weights, "--data", normal, "--memory", bad_memory, "-o", bad)
        assert code == 2 and len(err.strip().splitlines()) == 1 and not bad.exists(), err


def test_calibrate_memory_entries_bounds_the_coreset(tmp_path, run_cli, rng):
    """`--memory-entries N` keeps at most N entries (all candidates where there are fewer), and
    `--memory-bits 4` stores them in 4 bits, or without --memory the memory the detector has;
    `--memory-entries` without --memory, `--memory-bits` without a memory to store, and values out
    of range are refused with exit 2 and nothing written."""
    from conftest import tiny_model

    from indeed_cli.model import load_checkpoint, read_metadata, save_checkpoint
    from indeed_cli.model.checkpoint import stored_bank
    from indeed_cli.model.memory import bank_density

    det = save_checkpoint(tmp_path / "d.safetensors", tiny_model(1, task="detect", support_width=8), {"scales": [1.0]})
    normal = tmp_path / "normal"
    normal.mkdir()
    for i in range(3):  # 40 x 48: 5 x 6 stride-8 patches each, a tenth of them (3) candidates: 9
        write_png(normal / f"{i}.png", rng.integers(90, 160, (40, 48), dtype=np.uint8))
    for entries, want in ((["--memory-entries", "5"], 5), ([], 9), (["--memory-bits", "4"], 9)):
        out = tmp_path / f"mem{want}{len(entries)}.safetensors"
        code, _, err = run_cli("calibrate", "-w", det, "--data", normal, "--memory", normal, *entries, "-o", out)
        assert code == 0, err
        assert read_metadata(out)["memory"]["entries"] == want
        assert load_checkpoint(out).memory.bits == (4 if "--memory-bits" in entries else 8)
    # --weight-bits 4 stores the int8-sized convolutions in 4 bits: half their bytes
    q8 = save_checkpoint(tmp_path / "q8.safetensors", tiny_model(1, task="detect", support_width=8), {"scales": [1.0]},
                         int8_min_weights=1000)  # fmt: skip
    q4 = tmp_path / "q4.safetensors"
    code, _, err = run_cli("calibrate", "-w", q8, "--data", normal, "--weight-bits", "4", "-o", q4)
    assert code == 0 and read_metadata(q4)["weight_bits"] == 4 and q4.stat().st_size < q8.stat().st_size, err
    # without --memory, --memory-bits stores the memory the detector has anew: rounded, radii again
    small = tmp_path / "small.safetensors"
    code, _, err = run_cli("calibrate", "-w", tmp_path / "mem90.safetensors", "--data", normal, "--memory-bits", "4",
                           "-o", small)  # fmt: skip
    assert code == 0, err
    before, after = load_checkpoint(tmp_path / "mem90.safetensors").memory, load_checkpoint(small).memory
    assert (after.bits, after.entries) == (4, 9) and torch.equal(after.bank, stored_bank(before.bank, 4))
    assert torch.allclose(after.density, bank_density(after.bank)) and not torch.equal(after.bank, before.bank)
    refused = {  # the arguments, and whether the refusal is our one line (typer words its own range check)
        ("--memory-entries", "5"): True,
        ("--memory", "none", "--memory-entries", "5"): True,
        ("--memory", str(normal), "--memory-entries", "0"): False,
        ("--memory-bits", "4"): True,  # this detector has no memory to store anew
        ("--memory", "none", "--memory-bits", "4"): True,
        ("--memory", str(normal), "--memory-bits", "5"): True,
        ("--weight-bits", "3"): True,
    }
    for args, one_line in refused.items():
        bad = tmp_path / "bad.safetensors"
        code, _, err = run_cli("calibrate", "-w", det, "--data", normal, *args, "-o", bad)
        assert code == 2 and not bad.exists(), err
        assert not one_line or len(err.strip().splitlines()) == 1, err


def test_train_memory_entries_is_for_detectors(tmp_path, run_cli, rng):
    """`indeed train --task denoise --memory-entries N`: one line, exit 2, no run folder."""
    d = tmp_path / "clean"
    d.mkdir()
    for i in range(3):
        write_png(d / f"{i}.png", rng.integers(0, 256, (40, 44), dtype=np.uint8))
    out = tmp_path / "run"
    code, _, err = run_cli(
        "train",
        "--data",
        d,
        "--channels",
        "1",
        *TINY_TRAIN,
        "--steps",
        "2",
        "--memory-entries",
        "5",
        "--out",
        out,
        "-q",
    )
    assert code == 2 and len(err.strip().splitlines()) == 1 and "detectors" in err and not out.exists(), err
    code, _, err = run_cli("train", "--data", d, "--channels", "1", *TINY_TRAIN, "--steps", "2", "--memory-bits", "4",
                           "--out", out, "-q")  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1 and "detectors" in err and not out.exists(), err
    from indeed_cli.pipelines import train
    from indeed_cli.pipelines.inputs import UsageError

    with pytest.raises(UsageError, match="at least 1"):  # the Python API refuses it before training
        tiny = {"model": {"rank": 4, "sparse_width": 8, "lowrank_width": 8, "support_width": 8}, "patch": 32}
        train(
            [d], out, task="detect", channels=1, val_count=1, memory_entries=0, progress=False, steps=1, batch=2, **tiny
        )
    with pytest.raises(UsageError, match="8 or 4"):
        train([d], out, task="detect", channels=1, val_count=1, memory_bits=5, progress=False, steps=1, batch=2, **tiny)
    assert not out.exists()
