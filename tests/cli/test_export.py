"""`indeed export --onnx`: the exported tile network equals the PyTorch one, carries what a runtime
needs, and examples/onnx_detect.py reads a detector out exactly as `indeed detect` does."""

import importlib.util
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import torch
from conftest import tiny_model

from indeed_cli.inference import InferenceOptions
from indeed_cli.model import load_checkpoint, save_checkpoint
from indeed_cli.tasks.detection import detect

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "onnx_detect.py"


def session(path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("channels", [1, 3])
def test_exported_denoiser_equals_pytorch_on_tiles(run_cli, tmp_path, channels):
    w = save_checkpoint(tmp_path / "d.safetensors", tiny_model(channels))
    code, out, err = run_cli("export", "-w", w, "--onnx", tmp_path / "d.onnx", "--tile", "64", "--json")
    assert code == 0, err
    assert json.loads(out)["max_difference"] <= 1e-4
    s = session(tmp_path / "d.onnx")
    model = load_checkpoint(w).model
    for batch in (1, 5):  # the batch size is dynamic
        tiles = torch.rand(batch, channels, 64, 64)
        with torch.no_grad():
            d = model(tiles)
        np.testing.assert_allclose(s.run(None, {"Y": tiles.numpy()})[0], (d.L_hat + d.mu_S).numpy(), atol=1e-4)
    meta = s.get_modelmeta().custom_metadata_map
    assert meta["indeed.task"] == "denoise" and meta["indeed.tile"] == "64"
    assert json.loads(meta["indeed.config"])["channels"] == channels


def test_export_refuses_clearly(run_cli, tmp_path):
    w = save_checkpoint(tmp_path / "d.safetensors", tiny_model(3))
    (tmp_path / "x.onnx").write_bytes(b"old")
    code, _, err = run_cli("export", "-w", w, "--onnx", tmp_path / "x.onnx")
    assert code == 2 and "exists" in err and (tmp_path / "x.onnx").read_bytes() == b"old"
    code, _, err = run_cli("export", "-w", w, "--onnx", tmp_path / "y.onnx", "--tile", "60")
    assert code == 2 and "multiple of 8" in err and not (tmp_path / "y.onnx").exists()
    code, _, err = run_cli("export", "-w", w, "--onnx", tmp_path / "y.txt")
    assert code == 2 and ".onnx" in err
    (tmp_path / "afile").write_bytes(b"")  # a folder that cannot be made: one line, not a FileNotFoundError
    code, _, err = run_cli("export", "-w", w, "--onnx", tmp_path / "afile" / "z.onnx")
    assert code == 2 and "cannot write there" in err and "Error:" not in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("export", "-w", w, "--onnx", tmp_path / "new" / "z.onnx", "--tile", "64")
    assert code == 0 and (tmp_path / "new" / "z.onnx").exists()  # a new folder is made, as for other outputs
    v = save_checkpoint(tmp_path / "v.safetensors", tiny_model(3, lowrank_b="variational"))
    code, _, err = run_cli("export", "-w", v, "--onnx", tmp_path / "v.onnx")
    assert code == 2 and "lowrank_b" in err and not (tmp_path / "v.onnx").exists()


@pytest.mark.parametrize("support,features", [(0, ""), (8, ""), (8, "efficientnet-lite0")])
def test_numpy_readout_of_an_exported_detector_equals_indeed_detect(run_cli, tmp_path, rng, support, features):
    det = tiny_model(1, task="detect", support_width=support, support_features=features)
    if features:  # the projection starts at zero: make the features count
        torch.nn.init.normal_(det.support.feature_proj.weight, std=0.1)
    facts = {"threshold": 0.02, "scales": [1.0, 0.5], "score_kind": "top5"}
    w = save_checkpoint(tmp_path / "det.safetensors", det, {}, {"detect": facts})
    code, _, err = run_cli("export", "-w", w, "--onnx", tmp_path / "det.onnx", "--json")
    assert code == 0, err
    spec = importlib.util.spec_from_file_location("onnx_detect", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    image = rng.random((3, 150, 170)).astype(np.float32)  # colour, read by the gray detector per channel
    amap, score, anomalous = example.detect(session(tmp_path / "det.onnx"), image)
    want = detect(load_checkpoint(w), image, InferenceOptions(whole_image=False))  # `indeed detect --tiled`
    meta = session(tmp_path / "det.onnx").get_modelmeta().custom_metadata_map
    assert meta["indeed.threshold_readout"] == "tiles"  # no `readout` fact: calibrated before whole-image read-outs
    assert meta["indeed.ensemble"] == "1"  # one read-out per image, as the example does
    np.testing.assert_allclose(amap, want.anomaly_map, atol=1e-5)
    assert score == pytest.approx(want.score, rel=1e-4) and anomalous == (want.score > 0.02)


def test_numpy_readout_of_an_exported_pair_equals_indeed_detect(run_cli, tmp_path, rng):
    """A detector of two members exports one graph with one q(z = 1) channel per member; the example
    reads each member at its own scales and averages, as `indeed detect --tiled` does."""
    from indeed_cli.model import Checkpoint
    from indeed_cli.tasks.detection import with_members

    nets = [tiny_model(1, seed=s, task="detect", support_width=8) for s in (1, 2)]
    a = Checkpoint(nets[0], nets[0].cfg, {}, {"detect": {"scales": [1.0, 0.5]}}, "a")
    b = Checkpoint(nets[1], nets[1].cfg, {}, {"detect": {"scales": [0.5, 0.25]}}, "b")
    pair = with_members(a, [b])
    facts = {**pair.extra["detect"], "threshold": 0.3, "score_kind": "top5"}
    w = save_checkpoint(tmp_path / "pair.safetensors", pair.model, {}, {"detect": facts}, members=pair.members)
    code, _, err = run_cli("export", "-w", w, "--onnx", tmp_path / "pair.onnx")
    assert code == 0, err
    s = session(tmp_path / "pair.onnx")
    assert s.run(None, {"Y": rng.random((2, 1, 128, 128)).astype(np.float32)})[0].shape == (2, 2, 128, 128)
    meta = s.get_modelmeta().custom_metadata_map
    assert json.loads(meta["indeed.member_scales"]) == [[1.0, 0.5], [0.5, 0.25]]
    spec = importlib.util.spec_from_file_location("onnx_detect", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    image = rng.random((1, 150, 170)).astype(np.float32)
    amap, score, anomalous = example.detect(s, image)
    want = detect(load_checkpoint(w), image, InferenceOptions(whole_image=False))
    np.testing.assert_allclose(amap, want.anomaly_map, atol=1e-5)
    assert score == pytest.approx(want.score, rel=1e-4) and anomalous == (want.score > 0.3)
