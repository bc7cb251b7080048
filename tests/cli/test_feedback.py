"""The command line tells the user what happened: progress and summaries, warnings where work was
done quietly, Ctrl-C, output formats, sub-folders, readable `models`, honest messages."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_TRAIN, default_sigint, tiny_model, write_png
from PIL import Image

from indeed_cli.model import load_checkpoint, save_checkpoint


@pytest.fixture
def folder(tmp_path, rng):
    d = tmp_path / "in"
    d.mkdir()
    for n in ("a", "b", "c"):
        write_png(d / f"{n}.png", rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
    return d


def flagging(ckpt_path, tmp_path, threshold: float):
    """A copy of a checkpoint with OOD statistics whose threshold flags every image (-1) or none."""
    ck = load_checkpoint(ckpt_path)
    ood = {"features": ["l_rank", "l_sparse"], "mean": [0, 0], "std": [1, 1], "points": [[0, 0]], "k": 1}
    return save_checkpoint(tmp_path / f"ood{threshold}.safetensors", ck.model, ck.training,
                           {"ood": {**ood, "threshold": threshold}})  # fmt: skip


def test_folder_run_ends_with_a_summary_and_one_file_names_its_output(run_cli, folder, tmp_path, ckpt_paths):
    code, _, err = run_cli("denoise", folder, "-o", tmp_path / "out", "-w", ckpt_paths[3])
    assert code == 0 and "3 of 3 images done in" in err
    code, _, err = run_cli("denoise", folder / "a.png", "-o", tmp_path / "one.png", "-w", ckpt_paths[3])
    assert code == 0 and f"wrote {tmp_path / 'one.png'} in" in err
    code, _, err = run_cli("decompose", folder, "-o", tmp_path / "dec", "-w", ckpt_paths[3])
    assert code == 0 and "3 of 3 images done" in err
    code, _, err = run_cli("denoise", folder, "-o", tmp_path / "q", "-w", ckpt_paths[3], "-q")
    assert code == 0 and err == ""  # -q: nothing


def test_adapt_says_what_it_is_doing(run_cli, folder, tmp_path, ckpt_paths):
    code, _, err = run_cli("adapt", folder, "-o", tmp_path / "ag", "-w", ckpt_paths[3], "--steps", "2",
                           "--denoised-only")  # fmt: skip
    assert code == 0, err
    assert "adapting module S on 3 images" in err and "adapted module S on 3 of 3 images" in err
    assert "3 of 3 images done" in err


def test_out_of_distribution_images_get_one_warning_line(run_cli, folder, tmp_path, ckpt_paths):
    w = flagging(ckpt_paths[3], tmp_path, -1.0)
    code, out, err = run_cli("denoise", folder, "-o", tmp_path / "o", "-w", w, "--json")
    assert code == 0
    warnings = [line for line in err.splitlines() if "unlike the training images" in line]
    assert len(warnings) == 1 and "3 of 3 images" in warnings[0] and "--auto-adapt" in warnings[0]
    assert "--weights color-camera" in warnings[0]  # colour photographs: the camera-noise model is named
    assert all(json.loads(line)["ood"] is True for line in out.splitlines())  # the JSON is as before
    code, _, err = run_cli("denoise", folder / "a.png", "-o", tmp_path / "a.png", "-w", w)
    assert "a.png looks unlike the training images" in err and "indeed adapt" in err
    code, _, err = run_cli("denoise", folder, "-o", tmp_path / "n", "-w", flagging(ckpt_paths[3], tmp_path, 1e9))
    assert code == 0 and "unlike the training images" not in err
    code, _, err = run_cli("denoise", folder, "-o", tmp_path / "aa", "-w", w, "--auto-adapt")
    assert code == 0 and "unlike the training images" not in err  # adapted: nothing left to say


def test_nearly_unchanged_images_get_one_line_naming_what_to_try():
    """Images not flagged whose output is within LITTLE_CHANGE grey levels of the input: one line."""
    from indeed_cli.cli.denoise import LITTLE_CHANGE, little_change_note
    from indeed_cli.pipelines import Outcome

    def rec(rms, ood=False, channels=3, weights="w/indeed-denoise-color-fullchroma.safetensors"):
        return {"change_rms": rms, "ood": ood, "adapted": None, "channels": channels, "weights": weights}

    quiet, loud = Outcome(Path("a.png"), rec(0.3)), Outcome(Path("b.png"), rec(4.0))
    flagged = Outcome(Path("c.png"), rec(0.2, ood=True))
    one = little_change_note([quiet, loud, flagged])
    assert one.startswith("a.png changed by only 0.3 grey levels") and "fine if it is clean" in one
    assert "indeed adapt a.png --mode oag" in one and "--weights color-camera" in one
    two = little_change_note([quiet, Outcome(Path("d.png"), rec(0.5, channels=1)), loud])
    assert two.startswith(f"2 of 3 images changed by less than {LITTLE_CHANGE:g} grey level") and "--mode ag" in two
    assert little_change_note([loud, flagged]) == ""  # flagged images get the OOD line instead
    gray_rec = rec(0.1, channels=1, weights="w/indeed-denoise-gray.safetensors")
    gray = little_change_note([Outcome(Path("g.png"), gray_rec)])
    assert gray and "color-camera" not in gray
    # an output identical to its input (0 grey levels) is the clearest case; no measure, no line
    assert little_change_note([Outcome(Path("z.png"), rec(0.0))]).startswith("z.png changed by only 0 grey")
    assert little_change_note([Outcome(Path("n.png"), rec(None))]) == ""


def test_flat_region_kept_is_the_share_of_flat_variance_the_output_kept(rng):
    """0 where the output removed all variation of the flattest regions, 1 where it kept it, the
    square of the amplitude kept in between; the RMS is the input's there, in grey levels."""
    from indeed_cli.pipelines.denoise import flat_region_kept

    noise = 0.04 * rng.standard_normal((3, 64, 64)).astype(np.float32)
    step = np.broadcast_to(np.where(np.arange(64) < 40, 0.3, 0.7).astype(np.float32), (3, 64, 64))  # inside a block
    Y = 0.5 + noise
    kept, rms = flat_region_kept(Y, np.full_like(Y, 0.5))
    assert kept == 0.0 and rms == pytest.approx(0.04 * 255, rel=0.05)
    assert flat_region_kept(Y, Y)[0] == pytest.approx(1.0, abs=1e-3)
    assert flat_region_kept(Y, 0.5 + 0.5 * noise)[0] == pytest.approx(0.25, abs=1e-3)
    # the blocks are chosen by how little the output varies: flat ones, not those across the step
    Z = step + noise
    assert flat_region_kept(Z, step)[0] == 0.0 and flat_region_kept(Z, Z)[0] == pytest.approx(1.0, abs=1e-3)
    assert flat_region_kept(Y[0], Y[0])[0] == pytest.approx(1.0, abs=1e-3)  # a gray (h, w) image
    assert flat_region_kept(Y, Y[:, :32]) is None and flat_region_kept(Y[:, :8, :8], Y[:, :8, :8]) is None
    still = np.full_like(Y, 0.5)
    assert flat_region_kept(still, Y) == (None, 0.0)  # no variation to keep a share of


def test_outputs_that_kept_their_flat_regions_variance_get_one_line():
    """Images neither flagged, adapted nor nearly unchanged whose output kept at least FLAT_KEPT_NOTE
    of their flattest regions' variance: one line, `indeed adapt` first for colour images."""
    from indeed_cli.cli.denoise import FLAT_KEPT_NOTE, flat_kept_note
    from indeed_cli.pipelines import Outcome

    def rec(kept, rms=4.0, channels=3, ood=False, adapted=None):
        return {"change_rms": rms, "flat_kept": kept, "flat_rms": 31.1, "ood": ood, "adapted": adapted,
                "channels": channels, "weights": "w/indeed-denoise-color-fullchroma.safetensors"}  # fmt: skip

    phone = Outcome(Path("p.png"), rec(0.88))
    gaussian = Outcome(Path("g.png"), rec(0.02))
    one = flat_kept_note([phone, gaussian])
    assert one.startswith("p.png kept 88% of the variance of its flattest regions (31 grey levels RMS there)")
    assert one.index("indeed adapt p.png --mode oag") < one.index("--pixel-shuffle 2") < one.index("color-camera")
    assert flat_kept_note([gaussian]) == "" and flat_kept_note([Outcome(Path("n.png"), rec(None))]) == ""
    # flagged, adapted and nearly unchanged images have their own lines
    assert flat_kept_note([Outcome(Path("f.png"), rec(0.9, ood=True))]) == ""
    assert flat_kept_note([Outcome(Path("a.png"), rec(0.9, adapted={"best_step": 3}))]) == ""
    assert flat_kept_note([Outcome(Path("q.png"), rec(0.99, rms=0.3))]) == ""
    gray = [Outcome(Path(f"{i}.png"), rec(FLAT_KEPT_NOTE, channels=1)) for i in range(2)]
    two = flat_kept_note([*gray, gaussian])
    assert two.startswith(f"2 of 3 images kept at least {FLAT_KEPT_NOTE:.0%}") and "--mode ag" in two
    assert two.index("--pixel-shuffle 3") < two.index("indeed adapt")  # gray: the read-out first


def test_denoise_json_reports_how_much_the_image_changed(run_cli, folder, tmp_path, ckpt_paths):
    from PIL import Image

    code, out, err = run_cli("denoise", folder / "a.png", "-o", tmp_path / "a.png", "-w", ckpt_paths[3], "--json")
    assert code == 0, err
    x = np.asarray(Image.open(folder / "a.png"), dtype=np.float64)
    y = np.asarray(Image.open(tmp_path / "a.png"), dtype=np.float64)
    rms = float(np.sqrt(np.mean((x - y) ** 2)))
    record = json.loads(out)
    assert record["change_rms"] == pytest.approx(rms, abs=0.5)  # the file is the output rounded to 8 bits
    assert 0.0 <= record["flat_kept"] and record["flat_rms"] >= 0.0


def test_detect_says_when_it_flags_nothing(run_cli, tmp_path, rng):
    det = save_checkpoint(
        tmp_path / "det.safetensors", tiny_model(1, task="detect"), {}, {"detect": {"threshold": 1e9}}
    )
    a = write_png(tmp_path / "t.png", rng.integers(0, 256, (37, 50), dtype=np.uint8))
    code, out, err = run_cli("detect", a, "--maps", tmp_path / "maps", "-w", det, "--json")
    assert code == 0 and "0 of 1 images flagged" in err and "highest score" in err and "--threshold" in err
    record = json.loads(out)
    assert record["weights"] == str(det) and record["seconds"] >= 0  # JSON says which model and how long


def test_training_warns_about_a_barely_trained_model_and_reruns_do_nothing(run_cli, folder, tmp_path):
    args = ["train", "--data", folder, "--out", tmp_path / "run", *TINY_TRAIN, "--steps", "3", "--val-count", "1",
            "--ood-samples", "16", "-q"]  # fmt: skip
    code, _, err = run_cli(*args)
    assert code == 0 and "barely trained" in err and "saved" in err
    model = tmp_path / "run" / "model.safetensors"
    before = model.stat().st_mtime_ns
    code, _, err = run_cli(*args)
    assert code == 0 and "nothing to do" in err and model.stat().st_mtime_ns == before


def test_training_bar_follows_the_time_budget():
    from indeed_cli.tasks.training import TrainConfig
    from indeed_cli.tasks.training.loop import _progress_bar

    bar = _progress_bar(TrainConfig(steps=20000, time_budget=60), step=0, elapsed0=0.0)
    assert bar.unit == "s" and bar.total == 60
    bar = _progress_bar(TrainConfig(steps=20000, time_budget=600, time_limit=50), step=10, elapsed0=100.0)
    assert bar.total == 150 and bar.n == 100
    assert _progress_bar(TrainConfig(steps=20), step=3, elapsed0=0.0).unit == "step"


def test_time_bounded_calibration_stops_early():
    import torch

    from indeed_cli.model import Checkpoint
    from indeed_cli.tasks.ood import MIN_SAMPLES, calibrate_ood

    m = tiny_model(3)
    images = [torch.randint(0, 256, (3, 40, 40), dtype=torch.uint8) for _ in range(3)]
    stats = calibrate_ood(Checkpoint(m, m.cfg), images, n=200, max_seconds=0.0)
    assert stats["n"] == MIN_SAMPLES


@pytest.mark.slow  # a real process and a real SIGINT
def test_ctrl_c_reports_what_was_written(tmp_path, rng):
    """SIGINT in the middle of a folder run: exit 130, one line on stderr, and every file that was
    written has its JSON line (the bundled colour model makes each image take a while: 512x512, so
    that the run is still under way when the signal comes; a JSON line follows its image by one or
    two images, and 256x256 runs finished first now and then)."""
    d = tmp_path / "in"
    d.mkdir()
    for i in range(8):
        write_png(d / f"{i}.png", rng.integers(0, 256, (512, 512, 3), dtype=np.uint8))
    proc = subprocess.Popen([sys.executable, "-m", "indeed_cli", "denoise", d, "-o", tmp_path / "out", "--json",
                             "--device", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)  # fmt: skip
    first = proc.stdout.readline()  # the first image is written
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=120)
    lines = [json.loads(x) for x in (first + rest).splitlines()]
    written = sorted(p.name for p in (tmp_path / "out").glob("*.png"))
    assert proc.returncode == 130 and "interrupted" in err and "Traceback" not in err
    assert 1 <= len(written) < 8 and sorted(os.path.basename(x["output"]) for x in lines) == written
    assert not list((tmp_path / "out").glob(".*tmp*"))  # no partial files


def test_output_file_format_follows_its_suffix(run_cli, folder, tmp_path, ckpt_paths, rng):
    w = ckpt_paths[3]
    code, _, err = run_cli("denoise", folder / "a.png", "-o", tmp_path / "out.jpg", "-w", w, "-q")
    assert code == 0 and (tmp_path / "out.jpg").is_file() and Image.open(tmp_path / "out.jpg").format == "JPEG"
    code, _, _ = run_cli("denoise", folder / "a.png", "-o", tmp_path / "low.jpg", "-w", w, "-q", "--quality", "20")
    assert (tmp_path / "low.jpg").stat().st_size < (tmp_path / "out.jpg").stat().st_size
    code, _, _ = run_cli("denoise", folder / "a.png", "-o", tmp_path / "fast.png", "-w", w, "-q")
    code9, _, _ = run_cli("denoise", folder / "a.png", "-o", tmp_path / "small.png", "-w", w, "-q", "--png-level", "9")
    assert code == code9 == 0 and (tmp_path / "small.png").stat().st_size < (tmp_path / "fast.png").stat().st_size
    assert np.array_equal(np.asarray(Image.open(tmp_path / "small.png")), np.asarray(Image.open(tmp_path / "fast.png")))
    code, _, err = run_cli("denoise", folder / "a.png", "-o", tmp_path / "bad.png", "-w", w, "--png-level", "10")
    assert code == 2 and "--png-level" in err and not (tmp_path / "bad.png").exists()
    code, _, _ = run_cli("denoise", folder / "a.png", "-o", tmp_path / "out.webp", "-w", w, "-q")
    assert code == 0 and Image.open(tmp_path / "out.webp").format == "WEBP"
    code, _, err = run_cli("denoise", folder, "-o", tmp_path / "many.jpg", "-w", w)
    assert code == 2 and "need an output folder" in err and not (tmp_path / "many.jpg").exists()
    rgba = write_png(tmp_path / "rgba.png", rng.integers(0, 256, (20, 24, 4), dtype=np.uint8), "RGBA")
    code, _, err = run_cli("denoise", rgba, "-o", tmp_path / "rgba.jpg", "-w", w)
    assert code == 1 and "no alpha channel" in err and not (tmp_path / "rgba.jpg").exists()
    g16 = tmp_path / "g16.png"
    Image.fromarray(rng.integers(0, 65536, (20, 24), dtype=np.uint16)).save(g16)
    code, _, err = run_cli("denoise", g16, "-o", tmp_path / "g16.jpg", "-w", ckpt_paths[1])
    assert code == 1 and "8-bit" in err and len(err.strip().splitlines()) == 1


def test_recursive_runs_mirror_the_input_tree(run_cli, tmp_path, rng, ckpt_paths):
    for sub in ("a", "b/c"):
        (tmp_path / "in" / sub).mkdir(parents=True)
        write_png(tmp_path / "in" / sub / "x.png", rng.integers(0, 256, (30, 32, 3), dtype=np.uint8))
    code, _, err = run_cli("denoise", tmp_path / "in", "-r", "-o", tmp_path / "out", "-w", ckpt_paths[3], "-q")
    assert code == 0, err
    assert sorted(p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*.png")) == [
        "a/x.png", "b/c/x.png"]  # fmt: skip
    code, _, err = run_cli("decompose", tmp_path / "in", "-r", "-o", tmp_path / "dec", "-w", ckpt_paths[3], "-q")
    assert code == 0 and (tmp_path / "dec" / "b" / "c" / "x.npz").exists()
    code, _, err = run_cli("denoise", tmp_path / "in" / "a" / "x.png", tmp_path / "in" / "b" / "c" / "x.png",
                           "-o", tmp_path / "flat", "-w", ckpt_paths[3])  # fmt: skip
    assert code == 2 and "same output" in err  # files named one by one still collide


def test_models_fits_80_columns_and_lists_names_weights_takes():
    r = subprocess.run([sys.executable, "-m", "indeed_cli", "models"], capture_output=True, text=True,
                       env={**os.environ, "COLUMNS": "80"})  # fmt: skip
    assert r.returncode == 0 and max(len(line) for line in r.stdout.splitlines()) <= 80
    for name in ("color", "gray", "magnetic-tile"):
        assert f" {name} " in r.stdout
    r = subprocess.run([sys.executable, "-m", "indeed_cli", "models", "-h"], capture_output=True, text=True)
    assert "per checkpoint" in r.stdout and "per image" not in r.stdout


def test_every_option_of_every_command_explains_itself():
    import typer.main

    from indeed_cli.cli.app import app

    group = typer.main.get_command(app)
    for name, cmd in group.commands.items():
        for p in cmd.params:
            if p.opts[0].startswith("-"):
                assert p.help, f"indeed {name} {p.opts[0]} has no help text"


def test_python_denoise_clips_and_takes_arrays_and_pil_images(ckpt_paths, rng):
    from indeed_cli import denoise

    ck = load_checkpoint(ckpt_paths[3])
    hwc = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
    out = denoise(ck, hwc)
    assert out.shape == (3, 40, 48) and out.min() >= 0 and out.max() <= 1
    chw = hwc.transpose(2, 0, 1).astype(np.float32) / 255
    np.testing.assert_array_equal(denoise(ck, Image.fromarray(hwc)), out)
    np.testing.assert_array_equal(denoise(ck, chw), out)
    raw = denoise(ck, chw, clip=False)
    np.testing.assert_array_equal(np.clip(raw, 0, 1), out)
    with pytest.raises(ValueError):
        denoise(ck, np.zeros((5, 40, 48), np.float32))


def test_very_large_images_are_announced_and_absurd_headers_named():
    from indeed_cli.pipelines.runner import Progress, note_large_image

    class Notes(Progress):
        said: list = []

        def note(self, message):
            self.said.append(message)

    notes = Notes()
    note_large_image(notes, "small.png", 4000, 6000, 3, 2000)
    note_large_image(notes, "big.png", 20000, 20000, 3, 43000)
    assert len(notes.said) == 1 and "400 megapixels" in notes.said[0] and "GB of memory" in notes.said[0]


def test_a_header_claiming_ten_gigapixels_is_not_called_corrupt(tmp_path):
    import struct
    import zlib

    from indeed_cli.io import ImageError, read_image

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    for depth in (8, 16):
        path = tmp_path / f"huge{depth}.png"
        header = struct.pack(">IIBBBBB", 100000, 100000, depth, 2, 0, 0, 0)
        path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IEND", b""))
        with pytest.raises(ImageError, match="too large to read: .*10,000 megapixels"):
            read_image(path)


def test_decompose_npz_can_be_smaller_and_panel_shows_the_denoised_image(run_cli, folder, tmp_path, ckpt_paths):
    code, _, _ = run_cli("decompose", folder / "a.png", "-o", tmp_path / "f32", "-w", ckpt_paths[3], "-q", "--panel")
    code16, _, _ = run_cli("decompose", folder / "a.png", "-o", tmp_path / "f16", "-w", ckpt_paths[3], "-q",
                           "--npz-precision", "float16", "--npz-compress")  # fmt: skip
    assert code == code16 == 0
    z = np.load(tmp_path / "f16" / "a.npz")
    assert z["L"].dtype == np.float16
    np.testing.assert_allclose(z["L"].astype(np.float32) + z["S"] + z["N"], z["Y"], atol=0.5)  # float16 rounding
    assert (tmp_path / "f16" / "a.npz").stat().st_size < (tmp_path / "f32" / "a.npz").stat().st_size / 2
    width = Image.open(tmp_path / "f32" / "a_panel.png").size[0]
    assert width > 5 * 48  # five maps a row: Y, L + S, L, S, N
    from indeed_cli.pipelines.visualize import GAMMA_KEPT, GAMMA_PRUNED, view_gamma_histogram, view_signed

    # the mu_gamma histogram: every component in one bar, counted ones (blue) under the others (orange)
    mu_gamma = np.array([1e-2, 1e-2, 1e-2, 1e3, 1e3, 1e-2])
    hist = view_gamma_histogram(mu_gamma, mu_gamma < 1, 40, 64)
    assert hist.low == "1e-2.0" and hist.high == "1e3.0"
    colour = lambda c: np.all(np.abs(hist.image - np.array(c)[:, None, None] / 255) < 1e-6, axis=0)
    blue, orange = colour(GAMMA_KEPT), colour(GAMMA_PRUNED)
    assert blue[:, :8].any() and not blue[:, -8:].any() and orange[:, -8:].any() and not orange[:, :8].any()
    assert blue[:, :8].sum(0).max() == 40 and orange[:, -8:].sum(0).max() == round(40 * 2 / 4)  # 4 vs 2 components
    with Image.open(tmp_path / "f32" / "a_panel.png") as im:
        shown = np.asarray(im.convert("RGB"))
    assert (np.abs(shown.astype(int) - GAMMA_KEPT).sum(-1) < 10).sum() > 20  # the panel shows it

    v = view_signed(np.array([[[-0.1, 0.0, 0.2]]], np.float32), scale=255.0)
    assert v.low.startswith("-") and v.high.startswith("+") and float(v.high) > 40  # in 8-bit units


def test_adaptation_precision_default_follows_the_hardware():
    import torch

    from indeed_cli.tasks.adaptation import default_precision

    assert default_precision(torch.device("cpu")) in ("fp32", "bf16")
    assert default_precision(torch.device("cpu"), cpu_flags="flags : avx2 fma") == "fp32"
    assert default_precision(torch.device("cpu"), cpu_flags="flags : avx512f avx512_bf16 amx_bf16") == "bf16"


def test_time_is_reported_in_seconds_not_hidden(run_cli, folder, tmp_path, ckpt_paths):
    t0 = time.perf_counter()
    code, out, _ = run_cli("denoise", folder, "-o", tmp_path / "o", "-w", ckpt_paths[3], "--json", "-q")
    total = sum(json.loads(line)["seconds"] for line in out.splitlines())
    assert code == 0 and 0 < total <= time.perf_counter() - t0


def test_pixel_shuffle_read_out_from_the_command_line(run_cli, folder, tmp_path, ckpt_paths):
    code, out, err = run_cli("denoise", folder, "-o", tmp_path / "ps", "-w", ckpt_paths[3], "--pixel-shuffle", "2",
                             "--json")  # fmt: skip
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) == 3 and all(r["pixel_shuffle"] == 2 for r in records)
    from indeed_cli.inference import denoise

    got = np.asarray(Image.open(tmp_path / "ps" / "a.png"), dtype=np.float32) / 255
    want = denoise(load_checkpoint(ckpt_paths[3]), folder / "a.png", pixel_shuffle=2).transpose(1, 2, 0)
    assert np.abs(got - want).max() <= 0.5 / 255 + 1e-6  # the shuffled read-out, rounded to 8 bits
    code, _, err = run_cli("denoise", folder, "-o", tmp_path / "bad", "-w", ckpt_paths[3], "--pixel-shuffle", "5")
    assert code == 2 and "--pixel-shuffle" in err and not (tmp_path / "bad").exists()
    code, out, err = run_cli("denoise", folder, "-o", tmp_path / "auto", "-w", ckpt_paths[3], "--pixel-shuffle",
                             "auto", "--json")  # fmt: skip
    assert code == 0, err
    for r in map(json.loads, out.splitlines()):  # which read-out each image got, and what decided it
        assert r["pixel_shuffle"] == (2 if r["noise_correlation"] > 0.15 else 1)
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    write_png(tiny / "t.png", np.zeros((3, 40, 3), dtype=np.uint8))
    write_png(tiny / "u.png", np.zeros((40, 40, 3), dtype=np.uint8))
    code, _, err = run_cli("denoise", tiny, "-o", tmp_path / "to", "-w", ckpt_paths[3], "--pixel-shuffle", "2")
    assert code != 0 and "too small for --pixel-shuffle 2" in err
    assert (tmp_path / "to" / "u.png").exists() and not (tmp_path / "to" / "t.png").exists()


def test_ensemble_read_out_from_the_command_line(run_cli, folder, tmp_path, ckpt_paths):
    code, out, err = run_cli("denoise", folder, "-o", tmp_path / "e", "-w", ckpt_paths[3], "--ensemble", "4", "--json")
    assert code == 0, err
    records = [json.loads(line) for line in out.splitlines()]
    assert len(records) == 3 and all(r["ensemble"] == 4 for r in records)
    from indeed_cli.inference import denoise

    got = np.asarray(Image.open(tmp_path / "e" / "a.png"), dtype=np.float32) / 255
    want = denoise(load_checkpoint(ckpt_paths[3]), folder / "a.png", ensemble=4).transpose(1, 2, 0)
    plain = denoise(load_checkpoint(ckpt_paths[3]), folder / "a.png").transpose(1, 2, 0)
    assert np.abs(got - want).max() <= 0.5 / 255 + 1e-6  # the ensemble's mean, rounded to 8 bits
    assert np.abs(got - plain).max() > 1.5 / 255  # not the plain read-out
    for bad in ("3", "0", "x"):
        code, _, err = run_cli("denoise", folder, "-o", tmp_path / "bad", "-w", ckpt_paths[3], "--ensemble", bad)
        assert code == 2 and "--ensemble" in err and not (tmp_path / "bad").exists()


def test_advice_names_the_pixel_shuffle_read_out_unless_it_was_used():
    from indeed_cli.cli.denoise import little_change_note, ood_warning
    from indeed_cli.pipelines import Outcome

    rec = {"change_rms": 0.2, "ood": False, "adapted": None, "channels": 1, "weights": "gray.safetensors"}
    assert little_change_note([Outcome(Path("a.png"), rec)]).endswith(  # gray: stride 3
        "try --pixel-shuffle 3 or `indeed adapt a.png --mode oag -o DIR`"
    )
    used = little_change_note([Outcome(Path("a.png"), {**rec, "pixel_shuffle": 2})])
    assert used.endswith("try `indeed adapt a.png --mode oag -o DIR`")
    flagged = {**rec, "ood": True, "ood_score": 3.0, "ood_threshold": 1.0}
    assert ood_warning([Outcome(Path("a.png"), flagged)]).endswith(
        "rerun with --auto-adapt, --pixel-shuffle 3 or `indeed adapt a.png --mode oag -o DIR`"
    )
    colour = {**rec, "channels": 3}
    # colour: adaptation first (real phone noise: docs/results.md), then the read-out
    assert "try `indeed adapt a.png --mode oag -o DIR`, --pixel-shuffle 2 or" in little_change_note(
        [Outcome(Path("a.png"), colour)]
    )
    mixed = little_change_note([Outcome(Path("a.png"), rec), Outcome(Path("b.png"), colour)])
    assert "try `indeed adapt FOLDER --mode ag -o DIR` (one camera), --pixel-shuffle 2 (3 for the gray ones)" in mixed


def test_adapt_names_the_pixel_shuffle_for_images_it_left_nearly_unchanged():
    from indeed_cli.cli.adapt import unadapted_note
    from indeed_cli.pipelines import Outcome

    gray = {"adapted": False, "change_rms": 0.4, "channels": 1}
    assert unadapted_note([Outcome(Path("v.png"), gray)]) == (
        "v.png was not adapted and changed by only 0.4 grey levels (RMS): fine if it is clean; "
        "if it looks noisy, try `indeed denoise v.png -o DIR --pixel-shuffle 3`"
    )
    colour = {**gray, "channels": 3}
    two = unadapted_note([Outcome(Path("a.png"), colour), Outcome(Path("b.png"), colour)])
    assert two.startswith("2 of 2 images were not adapted")
    assert two.endswith(
        "FOLDER -o DIR --pixel-shuffle 2` or --weights color-camera (trained on camera noise) "
        "instead of the pixel shuffle"
    )
    # adapted images, images that changed, and records without a change (other shapes) get no line
    assert unadapted_note([Outcome(Path("a.png"), {**gray, "adapted": True})]) == ""
    assert unadapted_note([Outcome(Path("a.png"), {**gray, "change_rms": 3.0})]) == ""
    assert unadapted_note([Outcome(Path("a.png"), {**gray, "change_rms": None})]) == ""
