"""`indeed adapt` and adaptation through the CLI: outputs, unreadable inputs, --compile, mixed folders."""

import json
from pathlib import Path

import numpy as np
import torch
from conftest import tiny_model, write_png
from PIL import Image


def test_adapt_cli_writes_outputs(run_cli, tmp_path, rng, ckpt_paths):
    d = tmp_path / "ood"
    d.mkdir()
    for n in ("a", "b"):
        write_png(d / f"{n}.png", rng.integers(0, 256, (30, 26, 3), dtype=np.uint8))
    code, out, err = run_cli(
        "adapt",
        d,
        "--mode",
        "ag",
        "-o",
        tmp_path / "o",
        "-w",
        ckpt_paths[3],
        "--steps",
        "2",
        "--save-weights",
        tmp_path / "ad.safetensors",
        "--json",
    )
    assert code == 0, err
    for n in ("a", "b"):
        assert (tmp_path / "o" / f"{n}.png").exists() and (tmp_path / "o" / f"{n}.npz").exists()
    from indeed_cli.model import read_metadata

    adapted = read_metadata(tmp_path / "ad.safetensors")["training"]["adapted"]
    assert adapted["modules"] == "S" and adapted["lr"] == 1e-5  # the AG default; OAG's is 3e-5
    assert adapted["keep"] == "latest"  # AG keeps the latest weights no worse than the start
    assert adapted["recorrupted_tile"] == 0  # AG: the elbo's tiles on every device (OAG: 64 on a CPU)
    for line in out.splitlines():  # loss_kept: the objective of the weights kept, never above the start
        rec = json.loads(line)
        assert rec["loss_best"] <= rec["loss_kept"] <= rec["loss_start"]
        # change_rms: output against input in grey levels, as written (the PNG rounds to 8 bits)
        written = np.asarray(Image.open(rec["output"]), dtype=np.float64)
        source = np.asarray(Image.open(rec["image"]), dtype=np.float64)
        assert rec["channels"] == 3
        assert abs(rec["change_rms"] - np.sqrt(np.mean((written - source) ** 2))) < 0.5
    code, out, err = run_cli(
        "adapt",
        d,
        "--mode",
        "oag",
        "-o",
        tmp_path / "o2",
        "-w",
        ckpt_paths[3],
        "--steps",
        "1",
        "--group",
        "2",
        "--json",
        "-q",
    )
    assert code == 0, err

    lines = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert [r["adapted_together"] for r in lines] == [2, 2] and all(r["adapt_seconds"] > 0 for r in lines)
    assert (tmp_path / "o2" / "a.png").exists() and (tmp_path / "o2" / "b.png").exists()
    from indeed_cli.io import read_image
    from indeed_cli.tasks.adaptation.noise_level import block_noise_sigma

    for r in lines:  # the noise level that bounded each image's N, estimated from that image
        assert abs(r["noise_sigma"] - block_noise_sigma(read_image(r["image"]).data)) < 1e-6
        assert r["stop_share"] is None or 0.0 <= r["stop_share"] <= 1.0  # Eq. (stop at the bound)
    assert run_cli("adapt", d, "--mode", "xx", "-o", tmp_path / "o3")[0] == 2
    code, _, err = run_cli("adapt", d, "--mode", "oag", "-o", tmp_path / "o4", "--noise-bound", "-1")
    assert code == 2 and "noise-bound" in err and not (tmp_path / "o4").exists()
    code, _, err = run_cli("adapt", d, "--mode", "oag", "-o", tmp_path / "o5", "--recorrupted-tile", "-1")
    assert code == 2 and "recorrupted-tile" in err and not (tmp_path / "o5").exists()
    code, _, err = run_cli("adapt", d, "--mode", "oag", "-o", tmp_path / "o6", "--recorrupted-steps", "0")
    assert code == 2 and "recorrupted-steps" in err and not (tmp_path / "o6").exists()


def test_adapt_denoised_only_writes_just_the_image(run_cli, tmp_path, rng, ckpt_paths):
    """--denoised-only skips the decomposition files; the image equals the full run's <stem>.png."""
    d = tmp_path / "ood"
    d.mkdir()
    write_png(d / "a.png", rng.integers(0, 256, (30, 26, 3), dtype=np.uint8))
    args = ("adapt", d, "--mode", "oag", "-w", ckpt_paths[3], "--steps", "2", "-q")
    assert run_cli(*args, "-o", tmp_path / "full")[0] == 0
    code, out, err = run_cli(*args, "-o", tmp_path / "only", "--denoised-only", "--json")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "only").iterdir()) == ["a.png"]
    from PIL import Image

    full, only = (np.asarray(Image.open(tmp_path / k / "a.png")) for k in ("full", "only"))
    assert np.abs(full.astype(int) - only).max() <= 1  # same weights; decompose vs denoise rounding

    assert json.loads(out.splitlines()[0])["output"].endswith("a.png")


def test_adapt_skips_an_unreadable_image_and_keeps_the_others_names(run_cli, tmp_path, rng, ckpt_paths):
    """A corrupt file between good ones: reported, exit 1, and every good image's output under
    its own name (outputs were once assigned by position, so c's went to b.png)."""
    d = tmp_path / "ood"
    d.mkdir()
    write_png(d / "a.png", np.full((30, 26, 3), 20, np.uint8))
    (d / "b.png").write_bytes(b"not a png")
    write_png(d / "c.png", np.full((30, 26, 3), 230, np.uint8))
    code, out, err = run_cli(
        "adapt",
        d,
        "--mode",
        "oag",
        "-o",
        tmp_path / "o",
        "-w",
        ckpt_paths[3],
        "--steps",
        "1",
        "--denoised-only",
        "--json",
        "-q",
    )
    assert code == 1 and "b.png" in err
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == ["a.png", "c.png"]
    from PIL import Image

    assert (
        np.asarray(Image.open(tmp_path / "o" / "a.png")).mean()
        < np.asarray(Image.open(tmp_path / "o" / "c.png")).mean()
    )

    lines = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert [Path(r["output"]).name for r in lines if "output" in r] == ["a.png", "c.png"]


def test_compile_flag_compiles_the_network(run_cli, tmp_path, rng, ckpt_paths, monkeypatch):
    calls = []

    def fake_compile(fn, **kw):
        calls.append(kw)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    write_png(tmp_path / "a.png", rng.integers(0, 256, (30, 26, 3), dtype=np.uint8))
    code, _, err = run_cli(
        "denoise", tmp_path / "a.png", "-o", tmp_path / "b.png", "-w", ckpt_paths[3], "--compile", "-q"
    )
    assert code == 0, err
    assert calls == [{"dynamic": False}] and (tmp_path / "b.png").exists()


def test_oag_on_a_mixed_folder_uses_each_image_own_default_model(run_cli, tmp_path, rng, monkeypatch):
    """Default weights: colour images get the colour model, gray ones the gray model, in one OAG run."""

    from indeed_cli.model import save_checkpoint
    from indeed_cli.model.registry import BUNDLED

    wdir = tmp_path / "w"
    for c in (1, 3):
        save_checkpoint(wdir / BUNDLED[c], tiny_model(c), {})
    monkeypatch.setenv("INDEED_WEIGHTS_DIR", str(wdir))
    d = tmp_path / "mixed"
    d.mkdir()
    write_png(d / "a.png", rng.integers(0, 256, (30, 26, 3), dtype=np.uint8))
    write_png(d / "b.png", rng.integers(0, 256, (30, 26), dtype=np.uint8))
    code, _, err = run_cli("adapt", d, "--mode", "oag", "-o", tmp_path / "o", "--steps", "1", "-q")
    assert code == 0, err
    from PIL import Image

    assert Image.open(tmp_path / "o" / "a.png").mode == "RGB" and Image.open(tmp_path / "o" / "b.png").mode == "L"


def test_adapt_report_plots_the_elbo_plane(run_cli, tmp_path, rng):
    """--report: the paper's Fig. 7 as a PNG; every JSON line says where its image ended in that plane."""

    from conftest import tiny_model, write_png
    from PIL import Image

    from indeed_cli.model import save_checkpoint

    ood = {"features": ["l_rank", "l_sparse"], "mean": [1, 2], "std": [1, 1], "points": [[0, 0], [1, 1]], "k": 1,
           "threshold": 1.0}  # fmt: skip
    w = save_checkpoint(tmp_path / "m.safetensors", tiny_model(3), {}, {"ood": ood})
    d = tmp_path / "in"
    d.mkdir()
    for n in ("a", "b"):
        write_png(d / f"{n}.png", rng.integers(0, 256, (40, 48, 3), dtype=np.uint8))
    code, out, err = run_cli("adapt", d, "--mode", "oag", "-o", tmp_path / "o", "-w", w, "--steps", "2",
                             "--denoised-only", "--report", tmp_path / "fig7.png", "--json", "-q")  # fmt: skip
    assert code == 0, err
    assert Image.open(tmp_path / "fig7.png").size == (640, 640)
    assert all({"l_rank", "l_sparse"} <= set(json.loads(line)) for line in out.splitlines())
    code, _, err = run_cli(
        "adapt", d, "--mode", "oag", "-o", tmp_path / "o2", "-w", w, "--report", tmp_path / "fig7.png"
    )
    assert code == 2 and "exists" in err  # the report is an output like the others
    code, _, err = run_cli("adapt", d, "--mode", "oag", "-o", tmp_path / "o3", "-w", w, "--report", tmp_path / "r.txt")
    assert code == 2 and "name it .png" in err  # refused before adapting: nothing written
    assert not (tmp_path / "r.txt").exists() and not (tmp_path / "o3").exists()


def test_adapt_decides_per_image_from_the_ood_score(run_cli, tmp_path, rng):
    """--decide ood: an image the OOD score finds in distribution keeps the plain
    result (JSON adapted false, byte-identical to `indeed denoise`); --decide always adapts it."""
    from indeed_cli import load_checkpoint, save_checkpoint
    from indeed_cli.tasks.ood import fit_ood, image_ood_score

    d = tmp_path / "in"
    d.mkdir()
    write_png(d / "busy.png", rng.integers(0, 256, (40, 36), dtype=np.uint8))
    write_png(d / "flat.png", np.full((40, 36), 128, dtype=np.uint8))
    m = tiny_model(1)
    g = np.random.default_rng(1)
    stats = fit_ood([g.normal(size=(6, 2)) for _ in range(4)])
    path = tmp_path / "m.safetensors"
    save_checkpoint(path, m, {}, {"ood": stats})
    ck = load_checkpoint(path)
    from indeed_cli import read_image

    scores = {n: image_ood_score(ck, read_image(d / f"{n}.png").data) for n in ("busy", "flat")}
    stats["threshold"] = sum(scores.values()) / 2
    save_checkpoint(path, m, {}, {"ood": stats})
    flagged = {n: s > stats["threshold"] for n, s in scores.items()}
    assert sorted(flagged.values()) == [False, True]
    for mode in ("oag", "ag"):
        # --precision fp32: adapt's default (auto) is bf16 on CPUs with native bf16 (AMX), denoise's fp32
        code, out, err = run_cli("adapt", d, "--mode", mode, "-o", tmp_path / mode, "-w", path, "--steps", "2",
                                 "--lr", "1e-2", "--decide", "ood", "--denoised-only", "--json", "-q",
                                 "--precision", "fp32")  # fmt: skip
        assert code == 0, err
        recs = {Path(r["image"]).stem: r for r in map(json.loads, out.splitlines())}
        for n, r in recs.items():
            assert flagged[n] or r["adapted"] is False
            assert abs(r["ood_score"] - scores[n]) < 1e-3
            assert (r["stop"] == "in distribution") == (not flagged[n])
        calm = next(n for n in flagged if not flagged[n])
        code, _, err = run_cli("denoise", d / f"{calm}.png", "-o", tmp_path / f"plain_{mode}.png", "-w", path, "-q")
        assert code == 0, err
        assert (tmp_path / mode / f"{calm}.png").read_bytes() == (tmp_path / f"plain_{mode}.png").read_bytes()
    code, out, err = run_cli("adapt", d, "--mode", "oag", "-o", tmp_path / "all", "-w", path, "--steps", "2",
                             "--decide", "always", "--denoised-only", "--json", "-q")  # fmt: skip
    assert code == 0, err
    assert all(json.loads(x)["stop"] != "in distribution" for x in out.splitlines())
    assert run_cli("adapt", d, "-o", tmp_path / "x", "-w", path, "--decide", "never")[0] == 2


def test_ag_keeps_the_plain_output_below_the_change_ratio(run_cli, tmp_path, rng, ckpt_paths):
    """--min-change-ratio: above every image's ratio each keeps the plain model's output (the same
    file `indeed denoise` writes) and says so; 0 takes the adapted output without computing a ratio."""
    d = tmp_path / "in"
    d.mkdir()
    for n in ("a", "b"):
        write_png(d / f"{n}.png", rng.integers(0, 256, (30, 26, 3), dtype=np.uint8))
    common = (
        "-w",
        ckpt_paths[3],
        "--steps",
        "4",
        "--lr",
        "1e-3",
        "--max-change",
        "0",
        "--precision",
        "fp32",
        "--denoised-only",
        "--json",
        "-q",
    )
    code, out, err = run_cli("adapt", d, "--mode", "ag", "-o", tmp_path / "plain", "--min-change-ratio", "1e9", *common)
    assert code == 0, err
    recs = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert recs and all(r["adapted"] is False for r in recs)
    assert all(r["change_ratio"] is not None and r["change_ratio"] < 1e9 for r in recs)
    assert run_cli("denoise", d, "-o", tmp_path / "den", "-w", ckpt_paths[3], "-q")[0] == 0
    for n in ("a", "b"):
        got, want = (np.asarray(Image.open(tmp_path / f / f"{n}.png")) for f in ("plain", "den"))
        np.testing.assert_array_equal(got, want)
    code, out, err = run_cli(
        "adapt", d, "--mode", "ag", "-o", tmp_path / "all", "--min-change-ratio", "0", "--image-noise-bound", "0",
        *common,
    )  # fmt: skip
    assert code == 0, err
    assert all(json.loads(x)["change_ratio"] is None for x in out.splitlines() if x.strip())
    code, _, err = run_cli("adapt", d, "--mode", "ag", "-o", tmp_path / "bad", "--min-change-ratio", "-1")
    assert code == 2 and "min-change-ratio" in err and not (tmp_path / "bad").exists()
    code, out, err = run_cli(  # the noise bound alone, at almost nothing: every image keeps the plain output
        "adapt", d, "--mode", "ag", "-o", tmp_path / "nb", "--min-change-ratio", "0", "--image-noise-bound", "1e-9",
        *common,
    )  # fmt: skip
    assert code == 0, err
    recs = [json.loads(x) for x in out.splitlines() if x.strip()]
    assert all(r["adapted"] is False and r["removed_over_noise"] > 1e-9 for r in recs)
    code, _, err = run_cli("adapt", d, "--mode", "ag", "-o", tmp_path / "bad2", "--image-noise-bound", "-1")
    assert code == 2 and "image-noise-bound" in err and not (tmp_path / "bad2").exists()


def test_objective_option(run_cli, tmp_path, rng, ckpt_paths):
    """--objective: auto reports which objective's weights each image kept; ag takes recorrupted
    (without the ELBO's per-image choice) and auto; a bad value exits 2 and writes nothing."""
    d = tmp_path / "in"
    d.mkdir()
    write_png(d / "a.png", rng.integers(0, 256, (40, 36, 3), dtype=np.uint8))
    common = ("-w", ckpt_paths[3], "--steps", "2", "--precision", "fp32", "--denoised-only", "--json", "-q")
    code, out, err = run_cli("adapt", d, "--mode", "oag", "-o", tmp_path / "auto", "--objective", "auto", *common)
    assert code == 0, err
    rec = json.loads(out.splitlines()[0])
    assert rec["objective"] in (None, "elbo", "recorrupted") and (rec["objective"] is None) == (not rec["adapted"])
    assert (tmp_path / "auto" / "a.png").exists()
    # the ELBO ran first (decide change): its first change over the residual is recorded, and where its
    # weights were kept it passed --first-change-ratio
    from indeed_cli.tasks.adaptation.config import FIRST_CHANGE_RATIO

    assert isinstance(rec["first_change_ratio"], float) and rec["first_change_ratio"] >= 0
    assert rec["objective"] != "elbo" or rec["first_change_ratio"] >= FIRST_CHANGE_RATIO
    code, out, _ = run_cli("adapt", d, "--mode", "oag", "-o", tmp_path / "elbo", *common)
    assert code == 0 and json.loads(out.splitlines()[0])["objective"] in (None, "elbo")
    code, out, err = run_cli("adapt", d, "--mode", "ag", "-o", tmp_path / "ag", "--objective", "recorrupted", *common)
    assert code == 0, err
    rec = json.loads(out.splitlines()[0])
    assert rec["objective"] in (None, "recorrupted") and rec["change_ratio"] is None  # no ELBO choice
    code, out, err = run_cli("adapt", d, "--mode", "ag", "-o", tmp_path / "ag-auto", "--objective", "auto", *common)
    assert code == 0, err
    rec = json.loads(out.splitlines()[0])
    assert rec["objective"] in (None, "elbo", "recorrupted") and (rec["objective"] is None) == (not rec["adapted"])
    assert rec["first_change_ratio"] is None  # ag decides for the folder (always), not per image
    for bad, mode in (("r2r", "oag"), ("r2r", "ag")):
        code, _, err = run_cli("adapt", d, "--mode", mode, "-o", tmp_path / f"bad-{mode}", "--objective", bad, *common)
        assert code == 2 and "objective" in err and not (tmp_path / f"bad-{mode}").exists()


def test_stop_at_bound_flags_reach_the_adaptation(run_cli, tmp_path, rng, ckpt_paths, monkeypatch):
    """--stop-at-evaluation / --stop-at-bound set AdaptConfig.stop_at_bound; unset, OAG's default (on) applies."""
    import indeed_cli.pipelines.adapt as pipeline
    from indeed_cli.tasks.adaptation.config import OAG_DEFAULTS, with_defaults

    seen = []
    real = pipeline.adapt_images

    def spy(items, cfg, *args, **kwargs):
        seen.append(with_defaults(cfg, OAG_DEFAULTS).stop_at_bound)
        return real(items, cfg, *args, **kwargs)

    monkeypatch.setattr(pipeline, "adapt_images", spy)
    d = tmp_path / "ood"
    d.mkdir()
    write_png(d / "a.png", rng.integers(0, 256, (30, 26, 3), dtype=np.uint8))
    for i, flag in enumerate(([], ["--stop-at-evaluation"], ["--stop-at-bound"])):
        args = ("adapt", d, "--mode", "oag", "-w", ckpt_paths[3], "--steps", "1", "-q", "--denoised-only")
        assert run_cli(*args, *flag, "-o", tmp_path / f"o{i}")[0] == 0
    assert seen == [True, False, True]


def test_first_change_ratio_reaches_the_adaptation(run_cli, tmp_path, rng, ckpt_paths, monkeypatch):
    """--first-change-ratio sets AdaptConfig.first_change_ratio (unset: config.FIRST_CHANGE_RATIO); 0 exits 2
    with one line and writes nothing."""
    import indeed_cli.pipelines.adapt as pipeline
    from indeed_cli.tasks.adaptation.config import FIRST_CHANGE_RATIO

    seen = []
    real = pipeline.adapt_images

    def spy(items, cfg, *args, **kwargs):
        seen.append(cfg.first_change_ratio)
        return real(items, cfg, *args, **kwargs)

    monkeypatch.setattr(pipeline, "adapt_images", spy)
    d = tmp_path / "in"
    d.mkdir()
    write_png(d / "a.png", rng.integers(0, 256, (30, 26, 3), dtype=np.uint8))
    args = ("adapt", d, "--mode", "oag", "-w", ckpt_paths[3], "--steps", "1", "-q", "--denoised-only")
    assert run_cli(*args, "-o", tmp_path / "o0")[0] == 0
    assert run_cli(*args, "--first-change-ratio", "2.5", "-o", tmp_path / "o1")[0] == 0
    assert seen == [FIRST_CHANGE_RATIO, 2.5]
    code, _, err = run_cli(*args, "--first-change-ratio", "0", "-o", tmp_path / "bad")
    assert code == 2 and "first_change_ratio" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()


def test_ag_records_leave_the_first_change_ratio_null(run_cli, tmp_path, rng, ckpt_paths, monkeypatch):
    """AG adapts a folder (decide always): even where its result carries the ELBO's first change over the
    residual, the record's first_change_ratio stays null (it is OAG's per-image decision)."""
    from dataclasses import replace as dc_replace

    import indeed_cli.pipelines.adapt as pipeline

    real = pipeline.ag_image_result

    def with_ratio(*args, **kwargs):
        res, choice = real(*args, **kwargs)
        return dc_replace(res, first_change_ratio=1.5), choice

    monkeypatch.setattr(pipeline, "ag_image_result", with_ratio)
    d = tmp_path / "in"
    d.mkdir()
    write_png(d / "a.png", rng.integers(0, 256, (30, 26, 3), dtype=np.uint8))
    code, out, err = run_cli(
        "adapt", d, "--mode", "ag", "-w", ckpt_paths[3], "--steps", "1", "-q", "--denoised-only", "--json",
        "-o", tmp_path / "o",
    )  # fmt: skip
    assert code == 0, err
    assert json.loads(out.splitlines()[0])["first_change_ratio"] is None
