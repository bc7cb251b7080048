"""The command-line contract: outputs, exit codes, one-line errors, nothing overwritten or partial."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import write_png
from PIL import Image


@pytest.fixture
def imgs(tmp_path, rng):
    d = tmp_path / "in"
    d.mkdir()
    write_png(d / "a.png", rng.integers(0, 256, (40, 52, 3), dtype=np.uint8))
    write_png(d / "b.png", rng.integers(0, 256, (33, 20, 3), dtype=np.uint8))
    return d


def test_help_lists_the_commands(run_cli):
    code, out, _ = run_cli("--help")
    assert code == 0
    for c in ("decompose", "denoise", "detect", "adapt", "train", "evaluate", "calibrate", "models"):
        assert c in out


@pytest.mark.slow  # real processes joined by a pipe
def test_denoise_reads_stdin_and_writes_stdout_in_a_pipeline(run_cli, imgs, tmp_path, ckpt_paths):
    """`indeed denoise - -o -` in a real pipe: the same pixels as file to file; refusals write nothing."""
    import subprocess
    import sys

    w = str(ckpt_paths[3])
    code, _, err = run_cli("denoise", imgs / "a.png", "-o", tmp_path / "ref.png", "-w", w, "-q")
    assert code == 0, err

    def pipe(*args, data: bytes):
        r = subprocess.run(
            [sys.executable, "-m", "indeed_cli", "denoise", *map(str, args)],
            input=data,
            capture_output=True,
            timeout=300,
        )
        return r.returncode, r.stdout, r.stderr.decode()

    png = (imgs / "a.png").read_bytes()
    code, out, err = pipe("-", "-o", "-", "-w", w, "-q", data=png)
    assert code == 0, err
    import io

    assert np.array_equal(np.asarray(Image.open(io.BytesIO(out))), np.asarray(Image.open(tmp_path / "ref.png")))
    code, out, err = pipe("-", "-o", "-", "-w", w, data=b"not an image")
    assert code == 1 and out == b"" and "<stdin>" in err and len(err.strip().splitlines()) == 1
    code, out, err = pipe("-", "-o", "-", "-w", w, "--json", data=png)  # both would need stdout
    assert code == 2 and out == b""
    # standard input to a folder (and to detect's maps) is named "stdin"
    code, out, err = pipe("-", "-o", tmp_path / "outdir", "-w", w, "-q", data=png)
    assert code == 0 and (tmp_path / "outdir" / "stdin.png").exists(), err


def test_stdout_output_takes_one_input(run_cli, imgs, tmp_path, ckpt_paths):
    code, out, err = run_cli("denoise", imgs, "-o", "-", "-w", ckpt_paths[3])
    assert code == 2 and "one input" in err and out == ""


def test_denoise_file_and_folder(run_cli, imgs, tmp_path, ckpt_paths):
    code, out, err = run_cli("denoise", imgs / "a.png", "-o", tmp_path / "one.png", "-w", ckpt_paths[3])
    assert code == 0, err
    assert Image.open(tmp_path / "one.png").size == (52, 40)
    code, out, err = run_cli("denoise", imgs, "-o", tmp_path / "many", "-w", ckpt_paths[3], "--json")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "many").iterdir()) == ["a.png", "b.png"]
    lines = [json.loads(l) for l in out.splitlines()]
    assert [l["image"].endswith(n) for l, n in zip(lines, ("a.png", "b.png"))] == [True, True]
    assert all(l["height"] > 0 and l["seconds"] >= 0 for l in lines)


def test_glob_input(run_cli, imgs, tmp_path, ckpt_paths):
    code, _, err = run_cli("denoise", str(imgs / "*.png"), "-o", tmp_path / "g", "-w", ckpt_paths[3])
    assert code == 0, err
    assert len(list((tmp_path / "g").iterdir())) == 2


def test_refuses_existing_output_and_input_overwrite(run_cli, imgs, tmp_path, ckpt_paths):
    target = tmp_path / "x.png"
    target.write_bytes(b"keep me")
    code, _, err = run_cli("denoise", imgs / "a.png", "-o", target, "-w", ckpt_paths[3])
    assert code == 2 and "exists" in err and target.read_bytes() == b"keep me"
    code, _, err = run_cli("denoise", imgs / "a.png", "-o", target, "-w", ckpt_paths[3], "--force")
    assert code == 0 and Image.open(target).size == (52, 40)
    before = (imgs / "a.png").read_bytes()
    code, _, err = run_cli("denoise", imgs / "a.png", "-o", imgs / "a.png", "-w", ckpt_paths[3], "--force")
    assert code == 2 and "input" in err and (imgs / "a.png").read_bytes() == before
    afile = tmp_path / "results"  # a file where a folder of outputs should go: one line, before any work
    afile.write_bytes(b"keep me")
    code, _, err = run_cli("denoise", imgs, "-o", afile, "-w", ckpt_paths[3])
    assert code == 2 and "must be a folder" in err and len(err.strip().splitlines()) == 1
    assert afile.read_bytes() == b"keep me"
    for command, option in (("denoise", "-o"), ("decompose", "-o"), ("detect", "--maps")):  # a folder under a file
        code, _, err = run_cli(command, imgs, option, afile / "sub", "-w", ckpt_paths[3])
        assert code == 2 and "which is a file" in err and len(err.strip().splitlines()) == 1, (command, err)


def test_bad_images_fail_alone_with_one_line(run_cli, imgs, tmp_path, ckpt_paths):
    good = (imgs / "a.png").read_bytes()
    (imgs / "cut.png").write_bytes(good[:100])
    (imgs / "zero.png").write_bytes(b"")
    (imgs / "text.png").write_text("hello")
    code, out, err = run_cli("denoise", imgs, "-o", tmp_path / "o", "-w", ckpt_paths[3])
    assert code == 1
    errors = [l for l in err.splitlines() if "error" in l]
    assert len(errors) == 3 and all(l.startswith("indeed: error:") for l in errors)
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["a.png", "b.png"]  # no partial files


def test_unwritable_output(run_cli, imgs, tmp_path, ckpt_paths):
    if os.geteuid() == 0:
        blocker = tmp_path / "file"
        blocker.write_text("x")
        out = blocker / "sub" / "o.png"  # parent is a file: cannot be created even by root
    else:
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        out = ro / "o.png"
    code, _, err = run_cli("denoise", imgs / "a.png", "-o", out, "-w", ckpt_paths[3])
    assert code != 0 and "cannot write" in err and len(err.strip().splitlines()) == 1


def test_usage_errors(run_cli, imgs, tmp_path, ckpt_paths):
    assert run_cli("denoise", tmp_path / "nope.png", "-o", tmp_path / "o.png")[0] == 2
    assert run_cli("denoise", imgs, "-o", tmp_path / "o.png", "-w", ckpt_paths[3])[0] == 2  # 2 inputs, 1 file
    assert run_cli("denoise", imgs / "a.png", "-o", tmp_path / "o.png", "--tile", "100")[0] == 2
    code, _, err = run_cli("denoise", imgs / "a.png", "-o", tmp_path / "o.png", "-w", tmp_path / "missing.safetensors")
    assert code == 3 and "weights not found" in err
    (tmp_path / "bad.safetensors").write_text("junk")
    code, _, err = run_cli("denoise", imgs / "a.png", "-o", tmp_path / "o.png", "-w", tmp_path / "bad.safetensors")
    assert code == 3 and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o.png").exists()


def test_16bit_and_alpha_round_trip_through_denoise(run_cli, tmp_path, rng, ckpt_paths):
    g16 = write_png(tmp_path / "g16.png", rng.integers(0, 65536, (24, 24), dtype=np.uint16))
    rgba = write_png(tmp_path / "rgba.png", rng.integers(0, 256, (24, 24, 4), dtype=np.uint8), "RGBA")
    assert run_cli("denoise", g16, "-o", tmp_path / "o16.png", "-w", ckpt_paths[1])[0] == 0
    assert np.asarray(Image.open(tmp_path / "o16.png")).dtype == np.uint16
    assert run_cli("denoise", rgba, "-o", tmp_path / "oa.png", "-w", ckpt_paths[3])[0] == 0
    out = Image.open(tmp_path / "oa.png")
    assert out.mode == "RGBA"
    assert np.array_equal(np.asarray(out)[..., 3], np.asarray(Image.open(rgba))[..., 3])


def test_16bit_colour_with_alpha_through_denoise(run_cli, tmp_path, rng, ckpt_paths, monkeypatch):
    from indeed_cli.io import png16

    a = rng.integers(0, 65536, (24, 30, 4), dtype=np.uint16)
    (tmp_path / "c16.png").write_bytes(png16.encode(a))
    code, out, err = run_cli("denoise", tmp_path / "c16.png", "-o", tmp_path / "o.png", "-w", ckpt_paths[3], "--json")
    assert code == 0, err
    assert json.loads(out.splitlines()[0])["bit_depth"] == 16
    back = png16.decode((tmp_path / "o.png").read_bytes())
    assert back.shape == a.shape and np.array_equal(back[..., 3], a[..., 3])  # alpha untouched, 16 bits
    assert ((back[..., :3] >> 8) != (back[..., :3] & 255)).any()  # not an 8-bit result scaled by 257
    import indeed_cli.inference

    def no_compute(*_, **__):
        raise AssertionError("the image was denoised before its output format was refused")

    monkeypatch.setattr(indeed_cli.inference, "tiled_apply", no_compute)
    code, _, err = run_cli("denoise", tmp_path / "c16.png", "-o", tmp_path / "o.tif", "-w", ckpt_paths[3])
    assert code != 0 and "only be written as .png" in err and not (tmp_path / "o.tif").exists()


def test_gray_model_runs_on_colour_image(run_cli, imgs, tmp_path, ckpt_paths):
    code, _, err = run_cli("denoise", imgs / "a.png", "-o", tmp_path / "o.png", "-w", ckpt_paths[1])
    assert code == 0, err
    assert Image.open(tmp_path / "o.png").mode == "RGB"


def test_decompose_writes_everything_and_identity_holds(run_cli, imgs, tmp_path, ckpt_paths):
    code, out, err = run_cli(
        "decompose", imgs / "a.png", "-o", tmp_path / "dec", "-w", ckpt_paths[3], "--panel", "--json"
    )
    assert code == 0, err
    d = tmp_path / "dec"
    for suffix in ("L", "S", "N", "mu_omega", "mu_lambda", "sigma_L", "sigma_S", "panel"):
        assert (d / f"a_{suffix}.png").exists()
    z = np.load(d / "a.npz")
    assert {"Y", "L", "S", "N", "mu_omega", "mu_lambda", "sigma_L", "sigma_S", "mu_gamma"} <= set(z.files)
    assert np.abs(z["L"] + z["S"] + z["N"] - z["Y"]).max() <= 1e-4 * np.abs(z["Y"]).max()
    assert np.allclose(z["Y"], np.asarray(Image.open(imgs / "a.png")).transpose(2, 0, 1))  # input scale
    meta = json.loads((d / "a.json").read_text())
    assert {"rank_index", "l_rank", "l_sparse", "l_fid"} <= set(meta)
    line = json.loads(out.splitlines()[0])
    assert line["rank_index"] == meta["rank_index"]
    # decompose refuses to overwrite its own outputs without --force
    assert run_cli("decompose", imgs / "a.png", "-o", d, "-w", ckpt_paths[3])[0] == 2


def test_decompose_defaults_to_the_rank_model(run_cli, imgs, tmp_path, monkeypatch):
    """Colour images are decomposed with color-rank (its rank index follows the image) and denoised
    with color-fullchroma; named weights serve both."""
    from conftest import tiny_model

    from indeed_cli.model import registry as R
    from indeed_cli.model import save_checkpoint

    wdir = tmp_path / "w"
    for name in (R.BUNDLED_FULLCHROMA, R.BUNDLED_RANK):
        save_checkpoint(wdir / name, tiny_model(3))
    monkeypatch.setenv("INDEED_WEIGHTS_DIR", str(wdir))
    code, out, err = run_cli("decompose", imgs / "a.png", "-o", tmp_path / "dec", "--json")
    assert code == 0, err
    assert Path(json.loads(out.splitlines()[0])["weights"]).name == R.BUNDLED_RANK
    code, out, err = run_cli("decompose", imgs / "a.png", "-o", tmp_path / "dec2", "--json", "-w", "color-fullchroma")
    assert code == 0, err
    assert Path(json.loads(out.splitlines()[0])["weights"]).name == R.BUNDLED_FULLCHROMA
    code, out, err = run_cli("denoise", imgs / "a.png", "-o", tmp_path / "o.png", "--json")
    assert code == 0, err
    assert Path(json.loads(out.splitlines()[0])["weights"]).name == R.BUNDLED_FULLCHROMA


def test_models_lists_bundled(run_cli):
    code, out, _ = run_cli("models", "--json")
    rows = [json.loads(l) for l in out.splitlines()]
    assert code == 0 and {r["channels"] for r in rows if r["origin"] == "bundled"} == {1, 3}


def test_models_shows_deployment_thresholds(run_cli, tmp_path, monkeypatch):
    from conftest import tiny_model

    from indeed_cli.model import Checkpoint, save_checkpoint
    from indeed_cli.tasks.detection import with_members

    wdir = tmp_path / "w"
    # a fine-tuned model: the table shows all its steps (total_steps), not its last run's
    save_checkpoint(
        wdir / "den.safetensors",
        tiny_model(3),
        {"steps": 4321, "total_steps": 98765},
        {"ood": {"threshold": 0.25, "points": [[0, 0]]}},
    )
    save_checkpoint(wdir / "det.safetensors", tiny_model(1, task="detect"), {}, {"detect": {"threshold": 0.5}})
    save_checkpoint(wdir / "raw.safetensors", tiny_model(1), {}, int8_min_weights=1000, weight_bits=4)
    pair = Checkpoint(tiny_model(1, task="detect"), tiny_model(1, task="detect").cfg, {}, {}, "p")
    from indeed_cli.model.memory import FeatureMemory

    save_checkpoint(
        wdir / "pair.safetensors",
        pair.model,
        members=with_members(pair, [pair]).members,
        memory=FeatureMemory(3, bits=4),
    )
    monkeypatch.setenv("INDEED_WEIGHTS_DIR", str(wdir))
    monkeypatch.setenv("COLUMNS", "250")  # rich would otherwise shorten the cells
    code, out, _ = run_cli("models", "--json")
    rows = {r["name"]: r for r in map(json.loads, out.splitlines()) if r["origin"] == "bundled"}
    assert code == 0 and set(rows) == {"den", "det", "raw", "pair"}
    assert (rows["det"]["members"], rows["pair"]["members"]) == (1, 2)
    assert (rows["det"]["memory_entries"], rows["pair"]["memory_entries"]) == (None, 3)
    assert (rows["det"]["memory_bits"], rows["pair"]["memory_bits"]) == (None, 4)
    assert (rows["den"]["weight_bits"], rows["raw"]["weight_bits"]) == (None, 4)  # all float16; 4-bit convolutions
    assert (rows["den"]["ood_threshold"], rows["den"]["detect_threshold"]) == (0.25, None)
    assert (rows["det"]["ood_threshold"], rows["det"]["detect_threshold"]) == (None, 0.5)
    assert rows["raw"]["ood_threshold"] is None and "points" not in out
    code, out, _ = run_cli("models")
    assert code == 0 and "ood 0.25" in out and "anomaly 0.5" in out and "detect ×2 + memory" in out
    assert "98765" in out and "4321" not in out


@pytest.fixture
def detector(tmp_path, ckpt_paths):
    from conftest import tiny_model

    from indeed_cli.model import save_checkpoint

    return save_checkpoint(
        tmp_path / "det.safetensors", tiny_model(1, task="detect"), {}, {"detect": {"threshold": 0.01}}
    )


def test_detect_writes_maps_and_json(run_cli, tmp_path, rng, detector):
    a = write_png(tmp_path / "t1.png", rng.integers(0, 256, (37, 50), dtype=np.uint8))
    b = write_png(tmp_path / "t2.png", rng.integers(0, 256, (20, 20, 3), dtype=np.uint8))
    code, out, err = run_cli("detect", a, b, "--maps", tmp_path / "maps", "-w", detector, "--json")
    assert code == 0, err
    lines = [json.loads(l) for l in out.splitlines()]
    assert [l["threshold"] for l in lines] == [0.01, 0.01]
    for l, p, shape in zip(lines, (a, b), ((37, 50), (20, 20))):
        assert l["anomalous"] == (l["score"] > 0.01)
        z = np.load(tmp_path / "maps" / f"{p.stem}.npz")["anomaly_map"]
        assert z.shape == shape and z.dtype == np.float32 and (z >= 0).all()
        mask = np.asarray(Image.open(tmp_path / "maps" / f"{p.stem}_mask.png"))
        assert np.array_equal(mask > 0, z > 0.01)
        assert set(l["maps"]) == {"anomaly", "overlay", "mask", "npz"}
    assert "flagged" in err
    # --threshold overrides the stored one; a denoising checkpoint is refused for detection
    code, out, _ = run_cli("detect", a, "--maps", tmp_path / "m2", "-w", detector, "--json", "--threshold", "1e9")
    assert code == 0 and json.loads(out)["anomalous"] is False and json.loads(out)["threshold"] == 1e9
    code, _, err = run_cli("detect", a, "--maps", tmp_path / "m3", "-w", detector.parent / "tiny1.safetensors")
    assert code == 3
    # --scales overrides the read-out: the map is the mean over scales, so it differs from scale 1 alone
    code, out, err = run_cli("detect", a, "--maps", tmp_path / "m4", "-w", detector, "--json", "--scales", "1,0.5")
    assert code == 0, err
    z2 = np.load(tmp_path / "m4" / "t1.npz")["anomaly_map"]
    z1 = np.load(tmp_path / "maps" / "t1.npz")["anomaly_map"]
    assert z2.shape == z1.shape and not np.allclose(z1, z2)
    code, _, err = run_cli("detect", a, "--maps", tmp_path / "m5", "-w", detector, "--scales", "2")
    assert code == 2 and "--scales" in err and not (tmp_path / "m5").exists()


def test_evaluate_detect_against_masks(run_cli, tmp_path, rng, detector):
    d = tmp_path / "defects"
    d.mkdir()
    for i in range(3):
        Image.fromarray(rng.integers(0, 256, (24, 30), dtype=np.uint8)).save(d / f"x{i}.jpg")
        m = np.zeros((24, 30), np.uint8)
        if i:
            m[5:10, 5:12] = 255
        Image.fromarray(m).save(d / f"x{i}.png")
    code, out, err = run_cli("evaluate", "--task", "detect", d, "-w", detector, "--json")
    assert code == 0, err
    lines = [json.loads(l) for l in out.splitlines()]
    per_image = [l for l in lines if "score" in l]
    assert len(per_image) == 3  # the masks are not treated as images
    assert [l["anomalous_gt"] for l in per_image] == [False, True, True]
    summary = [l for l in lines if l.get("summary")]
    assert summary[0]["group"] == "all" and 0 <= summary[0]["pixel_auroc"] <= 1
    # the operating point of the stored threshold (0.01) agrees with the per-image decisions
    assert [l["anomalous"] for l in per_image] == [l["score"] > 0.01 for l in per_image]
    assert summary[0]["flagged_anomalous"] == [sum(l["anomalous"] for l in per_image[1:]), 2]
    assert summary[0]["flagged_normal"] == [int(per_image[0]["anomalous"]), 1]
    code, out, err = run_cli("evaluate", "--task", "detect", d, "-w", detector)
    assert code == 0 and "flagged" in out and " of 2" in out


def test_json_lines_are_strict_json(capsys):
    from indeed_cli.cli.runner import emit_json

    emit_json({"image_auroc": float("nan"), "x": [1.0, float("inf")], "nested": {"y": float("-inf")}})
    assert json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(f"non-JSON {c}")) == {
        "image_auroc": None,
        "x": [1.0, None],
        "nested": {"y": None},
    }


def test_skip_existing_resumes_a_folder_run(run_cli, tmp_path, rng, ckpt_paths):
    """--skip-existing leaves out inputs whose outputs all exist, redoes the others, refuses an
    input with only part of its outputs (never overwrites silently), and contradicts --force."""
    d = tmp_path / "in"
    d.mkdir()
    for n in ("a", "b", "c"):
        write_png(d / f"{n}.png", rng.integers(0, 256, (24, 20, 3), dtype=np.uint8))
    out = tmp_path / "out"
    assert run_cli("denoise", d, "-o", out, "-w", ckpt_paths[3], "-q")[0] == 0
    (out / "b.png").unlink()
    os.utime(out / "a.png", (1, 1))  # a recomputed a.png would get a new time
    code, stdout, err = run_cli("denoise", d, "-o", out, "-w", ckpt_paths[3], "-q", "--json", "--skip-existing")
    assert code == 0, err
    lines = [json.loads(x) for x in stdout.splitlines() if x.strip()]
    assert sorted(r["image"].rsplit("/", 1)[-1] for r in lines if r.get("skipped")) == ["a.png", "c.png"]
    assert [r["output"].rsplit("/", 1)[-1] for r in lines if "output" in r] == ["b.png"]
    assert (out / "b.png").exists() and (out / "a.png").stat().st_mtime == 1
    assert run_cli("denoise", d, "-o", out, "-w", ckpt_paths[3], "--skip-existing", "--force")[0] == 2

    dec = tmp_path / "dec"
    assert run_cli("decompose", d, "-o", dec, "-w", ckpt_paths[3], "-q")[0] == 0
    (dec / "c_S.png").unlink()  # c has part of its outputs only
    code, _, err = run_cli("decompose", d, "-o", dec, "-w", ckpt_paths[3], "-q", "--skip-existing")
    assert code == 2 and "c_L.png" in err


def test_denoise_tiled_option_selects_the_read_out(run_cli, tmp_path, rng, ckpt_paths):
    """By default f_thetaS sees the whole image; --tiled runs it tile by tile (as the ONNX tile
    network does). Each file is the Python API's result under the same options."""
    from indeed_cli import InferenceOptions, denoise, load_model

    src = write_png(tmp_path / "big.png", rng.integers(0, 256, (90, 150, 3), dtype=np.uint8))
    ck = load_model(str(ckpt_paths[3]), device="cpu")
    outs = {}
    for name, extra, whole in (("whole", [], None), ("tiled", ["--tiled"], False)):
        dst = tmp_path / f"{name}.png"
        code, _, err = run_cli("denoise", src, "-o", dst, "-w", ckpt_paths[3], "--tile", 32, "--overlap", 8, *extra)
        assert code == 0, err
        outs[name] = np.asarray(Image.open(dst), dtype=np.int16)
        want = denoise(ck, src, InferenceOptions(tile=32, overlap=8, whole_image=whole))
        assert np.abs(outs[name] - np.round(want.transpose(1, 2, 0) * 255)).max() <= 1
    assert np.abs(outs["whole"] - outs["tiled"]).max() > 1


def test_detect_ensemble_is_calibrated_stored_and_read_out(run_cli, tmp_path, rng, detector):
    from indeed_cli.model import read_metadata

    a = write_png(tmp_path / "t1.png", rng.integers(0, 256, (37, 50), dtype=np.uint8))
    normal = tmp_path / "normal"
    normal.mkdir()
    for i in range(3):
        write_png(normal / f"n{i}.png", rng.integers(90, 160, (32, 40), dtype=np.uint8))
    code, out, err = run_cli("detect", a, "--maps", tmp_path / "m1", "-w", detector, "--json")
    assert code == 0 and json.loads(out)["ensemble"] == 1, err
    code, out, err = run_cli("detect", a, "--maps", tmp_path / "m2", "-w", detector, "--json", "--ensemble", "4")
    assert code == 0 and json.loads(out)["ensemble"] == 4, err
    z1, z4 = (np.load(tmp_path / m / "t1.npz")["anomaly_map"] for m in ("m1", "m2"))
    assert z4.shape == z1.shape and not np.allclose(z1, z4)
    code, _, err = run_cli("detect", a, "--maps", tmp_path / "m3", "-w", detector, "--ensemble", "3")
    assert code == 2 and "--ensemble" in err and not (tmp_path / "m3").exists()
    # calibrated with an ensemble: stored with the threshold, and `indeed detect` reads out with it
    out2 = tmp_path / "det2.safetensors"
    code, _, err = run_cli("calibrate", "-w", detector, "--data", normal, "-o", out2, "--ensemble", "4")
    assert code == 0, err
    assert read_metadata(out2)["extra"]["detect"]["ensemble"] == 4
    den = detector.parent / "tiny1.safetensors"  # a denoiser: nothing to average for its OOD statistics
    code, _, err = run_cli("calibrate", "-w", den, "--data", normal, "-o", tmp_path / "d.st", "--ensemble", "2")
    assert code != 0 and "--ensemble" in err and not (tmp_path / "d.st").exists()
    code, out, err = run_cli("detect", a, "--maps", tmp_path / "m4", "-w", out2, "--json")
    assert code == 0 and json.loads(out)["ensemble"] == 4, err
    assert np.allclose(np.load(tmp_path / "m4" / "t1.npz")["anomaly_map"], z4)
    code, out, err = run_cli("evaluate", "--task", "detect", a, normal, "-w", out2, "--json")
    assert code == 0, err
    code, _, err = run_cli("evaluate", "--task", "detect", a, normal, "-w", out2, "--ensemble", "5")
    assert code == 2 and "--ensemble" in err
