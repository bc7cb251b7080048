"""The frozen ImageNet trunk that f_thetaM may read (support_features): folding, padding, shapes,
that a detector given features starts as the one it was, and that only the projection trains."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from conftest import package_format_state, tiny_model

from indeed_cli.model import checkpoint as C
from indeed_cli.model.features import (
    FEATURE_CHANNELS,
    EfficientNetLite0Trunk,
    fold_batchnorm,
    same_padding,
    trunk_state_from_efficientnet,
)

TOOLS = Path(__file__).resolve().parents[2] / "tools"


def test_folded_batchnorm_equals_convolution_then_batchnorm():
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(6, 4, 3, 3, generator=g), torch.randn(2, 4, 9, 9, generator=g)
    bn = {
        "weight": torch.rand(6) + 0.5,
        "bias": torch.randn(6),
        "running_mean": torch.randn(6),
        "running_var": torch.rand(6) + 0.1,
    }
    want = F.batch_norm(F.conv2d(x, w), bn["running_mean"], bn["running_var"], bn["weight"], bn["bias"], eps=1e-3)
    wf, bf = fold_batchnorm(w, bn)
    torch.testing.assert_close(F.conv2d(x, wf, bf), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n", [15, 16, 17, 40])
@pytest.mark.parametrize("k,s", [(3, 1), (5, 1), (3, 2), (5, 2)])
def test_same_padding_gives_tensorflows_output_size(n, k, s):
    x = torch.zeros(1, 1, n, n + 1)
    y = F.conv2d(same_padding(x, k, s), torch.zeros(1, 1, k, k), stride=s)
    assert tuple(y.shape[-2:]) == (math.ceil(n / s), math.ceil((n + 1) / s))


def test_trunk_shapes_gray_input_and_conversion():
    t = EfficientNetLite0Trunk().eval()
    t.load_state_dict(trunk_state_from_efficientnet(package_format_state()))
    x = torch.rand(2, 1, 48, 64)
    with torch.no_grad():
        f, f3 = t(x), t(x.expand(-1, 3, -1, -1))
    assert f.shape == (2, FEATURE_CHANNELS, 6, 8) and torch.isfinite(f).all() and f.abs().amax() > 0
    torch.testing.assert_close(f, f3)  # gray is read as the same image in R, G and B


def test_trunk_equals_the_package_it_is_converted_from():
    pkg = pytest.importorskip("efficientnet_lite_pytorch")  # the `features` / `bench` extras
    net = pkg.EfficientNet.from_name("efficientnet-lite0").eval()
    net.load_state_dict({**net.state_dict(), **package_format_state(2)}, strict=True)
    t = EfficientNetLite0Trunk().eval()
    t.load_state_dict(trunk_state_from_efficientnet(net.state_dict()))
    x = torch.rand(1, 3, 64, 96)
    mean, std = (
        torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1),
        torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1),
    )
    with torch.no_grad():
        f, outs = net._swish(net._bn0(net._conv_stem((x - mean) / std))), []
        for i, block in enumerate(net._blocks[:11]):
            f = block(f)
            outs += [f] if i in (4, 10) else []
        want = torch.cat([outs[0], F.interpolate(outs[1], size=outs[0].shape[-2:], mode="bilinear")], 1)
        torch.testing.assert_close(t(x), want, atol=1e-4, rtol=1e-4)


def test_detector_given_features_starts_as_it_was_and_trains_only_the_projection():
    plain = tiny_model(1, task="detect", support_width=8, seed=5)
    feat = tiny_model(1, task="detect", support_width=8, support_features="efficientnet-lite0", seed=6)
    missing, unexpected = feat.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all(k.startswith("support.feature") for k in missing)
    Y = torch.rand(2, 1, 40, 56)  # not a multiple of 16: the trunk pads
    with torch.no_grad():
        torch.testing.assert_close(feat(Y).support_logit, plain(Y).support_logit)
    trunk = {k: v.clone() for k, v in feat.support.features.state_dict().items()}
    opt = torch.optim.Adam(feat.parameters(), lr=1e-2)
    feat.train()
    feat(Y).support_logit.mean().backward()
    assert feat.support.feature_proj.weight.grad.abs().sum() > 0
    assert all(p.grad is None for p in feat.support.features.parameters())
    opt.step()
    assert all(torch.equal(v, feat.support.features.state_dict()[k]) for k, v in trunk.items())
    with torch.no_grad():
        assert not torch.allclose(feat(Y).support_logit, plain(Y).support_logit)


def test_feature_weights_file_round_trip_and_refusals(tmp_path):
    trunk = trunk_state_from_efficientnet(package_format_state(3))
    p = C.save_feature_trunk(tmp_path / "t.safetensors", trunk, "efficientnet-lite0", "test")
    m = tiny_model(1, task="detect", support_width=8, support_features="efficientnet-lite0")
    C.load_support_features(m, p)
    assert torch.equal(m.support.features.stem.weight, trunk["stem.weight"].half().float())  # stored in fp16
    other = C.save_feature_trunk(tmp_path / "o.safetensors", trunk, "resnet18", "test")
    for bad, match in (
        (other, "no efficientnet-lite0"),
        (tmp_path / "none.safetensors", "not found"),
        ("", "give their weights"),
    ):
        with pytest.raises(C.CheckpointError, match=match):
            C.load_support_features(m, bad)
    with pytest.raises(C.CheckpointError, match="reads no image features"):
        C.load_support_features(tiny_model(1, task="detect", support_width=8), p)
    with pytest.raises(ValueError, match="f_thetaM"):
        tiny_model(1, task="detect", support_features="efficientnet-lite0")


def test_import_tool_converts_a_state_dict(tmp_path):
    torch.save(package_format_state(4), tmp_path / "lite0.pth")
    out = tmp_path / "trunk.safetensors"
    r = subprocess.run(
        [sys.executable, str(TOOLS / "import_efficientnet_lite0.py"), out, "--source", tmp_path / "lite0.pth"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    got = C.read_feature_trunk(out, "efficientnet-lite0")
    want = trunk_state_from_efficientnet(package_format_state(4))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k].half()) for k in want)


def test_missing_bundled_features_name_the_way_out(tmp_path, monkeypatch):
    from indeed_cli.model.registry import resolve_feature_weights

    assert resolve_feature_weights("", "efficientnet-lite0").is_file()  # bundled
    assert resolve_feature_weights(tmp_path / "f.safetensors", "efficientnet-lite0") == tmp_path / "f.safetensors"
    monkeypatch.setenv("INDEED_WEIGHTS_DIR", str(tmp_path))
    with pytest.raises(C.CheckpointError, match="--support-features none"):
        resolve_feature_weights("efficientnet-lite0", "efficientnet-lite0")
