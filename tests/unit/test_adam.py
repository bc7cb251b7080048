"""The adaptation's Adam against torch.optim.Adam, and its state when a stack of adaptations shrinks."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from indeed_cli.tasks.adaptation.adam import Adam


def _grads(shapes, steps, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=g) for s in shapes] for _ in range(steps)]


def _run(opt_params, opt, grads, skip=()):
    for k, gs in enumerate(grads):
        opt.zero_grad()
        for j, (p, g) in enumerate(zip(opt_params, gs)):
            if (k, j) not in skip:  # a tensor without a gradient this step keeps its value and state
                p.grad = g.clone()
        opt.step()


NO_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=NO_GPU)])
def test_adam_matches_torch_optim_to_the_bit(device):
    shapes = [(4, 3, 3, 3), (7,), (2, 5)]
    start = [torch.randn(s, generator=torch.Generator().manual_seed(i)) for i, s in enumerate(shapes)]
    grads = [[g.to(device) for g in gs] for gs in _grads(shapes, 6)]
    skip = {(2, 1), (3, 1), (4, 0)}
    ours = [p.clone().to(device).requires_grad_(True) for p in start]
    ref = [p.clone().to(device).requires_grad_(True) for p in start]
    fused = device == "cuda"
    _run(ours, Adam(ours, 3e-3, fused=fused), grads, skip)
    _run(ref, torch.optim.Adam(ref, lr=3e-3, fused=fused or None), grads, skip)
    for a, b in zip(ours, ref):
        assert torch.equal(a, b)
    assert not torch.equal(ours[0].cpu(), start[0])  # the weights moved


def test_selected_rows_go_on_as_if_adapted_alone():
    """Adam is element-wise: after ``select`` the kept rows continue exactly as an optimizer of those rows alone."""
    shapes = [(3, 6), (3, 2, 2)]
    grads = _grads(shapes, 8, seed=1)
    start = [torch.randn(s, generator=torch.Generator().manual_seed(5 + i)) for i, s in enumerate(shapes)]
    stacked = [p.clone().requires_grad_(True) for p in start]
    opt = Adam(stacked, 1e-2)
    _run(stacked, opt, grads[:4])
    rows = torch.tensor([0, 2])
    kept = [p.detach().index_select(0, rows).requires_grad_(True) for p in stacked]
    opt = opt.select(kept, rows)
    _run(kept, opt, [[g.index_select(0, rows) for g in gs] for gs in grads[4:]])

    alone = [p.clone().index_select(0, rows).requires_grad_(True) for p in start]
    ref = Adam(alone, 1e-2)
    _run(alone, ref, [[g.index_select(0, rows) for g in gs] for gs in grads])
    for a, b in zip(kept, alone):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_adapting_an_image_does_not_import_torch_dynamo():
    """The reason this Adam exists: torch.optim imports torch._dynamo (seconds, once per process)."""
    code = (
        "import sys, numpy as np\n"
        "sys.path.insert(0, 'tests')\n"
        "from conftest import tiny_model\n"
        "from indeed_cli.model import Checkpoint\n"
        "from indeed_cli.tasks.adaptation import AdaptConfig, adapt\n"
        "m = tiny_model(1)\n"
        "imgs = [np.random.default_rng(0).random((1, 40, 36)).astype(np.float32)]\n"
        "cfg = AdaptConfig(steps=2, lr=1e-2, eval_every=1)\n"
        "res = adapt(Checkpoint(m, m.cfg, {}, {}, 'tiny'), imgs, cfg, tile=32)\n"
        "assert len(res.history) > 1, res.history\n"
        "print('torch._dynamo' in sys.modules)\n"
    )
    root = Path(__file__).parents[2]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.strip() == "False", out.stderr
