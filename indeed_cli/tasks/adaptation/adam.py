"""Adam for the adapted weights, without ``torch.optim``.

The update is torch.optim.Adam's (Kingma & Ba 2015; no weight decay, no AMSGrad), to the bit: its
single-tensor form off a GPU, its fused kernel on one (tests/unit/test_adam.py).  Why not
torch.optim: building any of its optimizers imports ``torch._dynamo``, which took 0.9 s on a 2-core
CPU and 3.3-4.9 s on the GPU machines (docs/reports/2026-12-07-oag-cli-time.md), once per process
and on the path of the first adaptation; an adaptation of one image takes about 3 s on that CPU.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

BETAS = (0.9, 0.999)  # torch.optim.Adam's defaults, which the adaptation has always used
EPS = 1e-8


class Adam:
    """Adam over ``params`` (tensors with ``.grad``), one state per tensor.  ``fused`` (CUDA tensors
    only): one kernel launch for all of them instead of several per tensor."""

    def __init__(self, params: Sequence[torch.Tensor], lr: float, fused: bool = False):
        self.params = list(params)
        self.lr = lr
        self.fused = fused
        self.exp_avg = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p, memory_format=torch.preserve_format) for p in self.params]
        # as torch.optim keeps it: a float32 tensor, on the weights' device for the fused kernel
        self.steps = [torch.zeros((), dtype=torch.float32, device=p.device if fused else "cpu") for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """One update of every tensor that has a gradient (the others keep their values and state)."""
        have = [i for i, p in enumerate(self.params) if p.grad is not None]
        if not have:
            return
        b1, b2 = BETAS
        if self.fused:
            steps = [self.steps[i] for i in have]
            torch._foreach_add_(steps, 1)
            torch._fused_adam_(
                [self.params[i] for i in have],
                [self.params[i].grad for i in have],
                [self.exp_avg[i] for i in have],
                [self.exp_avg_sq[i] for i in have],
                [],
                steps,
                amsgrad=False,
                lr=self.lr,
                beta1=b1,
                beta2=b2,
                weight_decay=0.0,
                eps=EPS,
                maximize=False,
                grad_scale=None,
                found_inf=None,
            )
            return
        for i in have:  # torch.optim's single-tensor update, operation for operation
            p, g, m, v = self.params[i], self.params[i].grad, self.exp_avg[i], self.exp_avg_sq[i]
            self.steps[i] += 1
            step = self.steps[i].item()
            m.lerp_(g, 1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
            step_size = self.lr / (1 - b1**step)
            denom = (v.sqrt() / (1 - b2**step) ** 0.5).add_(EPS)
            p.addcdiv_(m, denom, value=-step_size)

    def select(self, params: Sequence[torch.Tensor], rows: torch.Tensor) -> Adam:
        """The optimizer of ``params``: tensors made of the rows ``rows`` (dim 0) of this one's, each
        keeping those rows of its state (the entries of a stacked adaptation that go on)."""
        out = Adam(params, self.lr, self.fused)
        out.exp_avg = [m.index_select(0, rows) for m in self.exp_avg]
        out.exp_avg_sq = [v.index_select(0, rows) for v in self.exp_avg_sq]
        out.steps = [s.clone() for s in self.steps]
        return out
