"""How inference runs: device, tiling and precision options, and the network each option set uses."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

from ..model import Checkpoint, load_checkpoint, resolve_weights
from ..model.cpu import BF16_FLAGS, has_any

PRECISIONS = ("fp32", "bf16", "auto")


def native_bf16(device: torch.device, cpu_flags: str | None = None) -> bool:
    """Whether ``device`` computes bf16 natively: a CUDA GPU that supports it, or a CPU with AMX or
    AVX512-BF16 (``cpu_flags``: the flags line of /proc/cpuinfo, read when not given).  Elsewhere
    bf16 is emulated: OAG in bf16 ran several times slower than fp32 on a 2-core AVX2 CPU."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    return has_any(BF16_FLAGS, cpu_flags)


def resolve_precision(precision: str | None, device: torch.device) -> str:
    """``auto`` becomes bf16 where the device computes it natively, fp32 elsewhere; None (no precision
    asked for, and none a detector stores: :func:`~indeed_cli.tasks.detection.readout_precision`) fp32."""
    if precision is None:
        return "fp32"
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be fp32, bf16 or auto, got {precision!r}")
    if precision != "auto":
        return precision
    return "bf16" if native_bf16(device) else "fp32"


def resolve_device(device: str = "auto") -> torch.device:
    """``auto`` (a CUDA GPU when there is one: under torchrun, the one of the process's local rank),
    ``cpu``, ``cuda`` or ``cuda:N``; ValueError otherwise."""
    if device == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        local = int(os.environ.get("LOCAL_RANK", "0"))  # torchrun: one GPU per process
        return torch.device(f"cuda:{local % torch.cuda.device_count()}")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for but no CUDA GPU is available")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise ValueError(f"unknown device {device!r} (use auto, cpu, cuda or cuda:N)")
    return torch.device(device)


def load_model(
    weights: str | None = None, channels: int = 3, device: str = "auto", task: str = "denoise", job: str = "denoise"
) -> Checkpoint:
    """Resolve ``weights`` (path, bundled name, hf:// reference or default) and load it.  Without
    ``weights``, ``job="adapt"`` loads the default model to adapt from (``color`` for colour images),
    ``job="decompose"`` the default model of ``indeed decompose`` (``color-rank``, whose rank index follows
    the image), ``job="denoise"`` the default denoiser (``color-fullchroma``); docs/checkpoints.md."""
    return load_checkpoint(resolve_weights(weights, channels, task, job), resolve_device(device))


@dataclass
class InferenceOptions:
    """Tiling and speed settings of one inference run (they do not change what is computed,
    beyond bf16 rounding)."""

    tile: int = 128
    overlap: int = 32
    batch: int | None = None  # tiles per forward pass; default 8 on a CPU, 256 on a GPU (docs/results.md)
    # fp32, bf16 (a bf16 copy of the network: network_for), or auto (resolve_precision); None: the
    # checkpoint's own, which for a detector is the precision its threshold was learned at
    # (tasks.detection.readout_precision) and fp32 for every other network
    precision: str | None = "fp32"
    compile: bool = False  # torch.compile the network: tens of seconds once, faster on many images
    # detectors with f_thetaM: run f_thetaS and f_thetaM on the whole image (mu_L still by tiles);
    # None: when it holds at most WHOLE_IMAGE_PIXELS; False: by tiles, as the ONNX tile network does
    whole_image: bool | None = None

    def check(self, multiple: int = 8) -> None:
        """ValueError for settings that cannot run; ``multiple``: the model's size multiple."""
        if self.tile % multiple:
            raise ValueError(f"--tile must be a multiple of {multiple}, got {self.tile}")
        if not 0 <= self.overlap < self.tile:
            raise ValueError(f"--overlap ({self.overlap}) must be smaller than --tile ({self.tile})")
        if self.precision is not None and self.precision not in PRECISIONS:
            raise ValueError(f"--precision must be fp32, bf16 or auto, got {self.precision!r}")
        if self.batch is not None and self.batch < 1:
            raise ValueError(f"--batch must be at least 1, got {self.batch}")

    def batch_for(self, device: torch.device) -> int:
        return self.batch or (256 if device.type == "cuda" else 8)


def network_for(ckpt: Checkpoint, precision: str | None = "fp32", compile: bool = False) -> nn.Module:
    """The network that runs ``ckpt``'s inference at ``precision``, compiled or not.

    fp32: ``ckpt.model`` itself.  bf16: a bf16 copy of it, run without autocast.  Autocast would
    cast every weight on every call and run GroupNorm in fp32 with casts in and out; on an H100
    the copy made the gray model 11% faster at the same PSNR (docs/results.md).  The copy is made
    once and again when the model's weights change (an in-place update bumps a tensor's version
    counter).  ``compile`` wraps the chosen network in ``torch.compile`` (fixed tile shapes: one
    compilation per batch size), once per network.  Derived networks live in ``ckpt.runtime``.
    """
    net = ckpt.model
    precision = resolve_precision(precision, next(net.parameters()).device)
    params = list(net.parameters())
    if precision == "bf16" and params and params[0].dtype != torch.bfloat16:
        key = tuple((p.data_ptr(), p._version) for p in params)
        cached = ckpt.runtime.get("bf16")
        if cached is None or cached[0] != key:
            cached = ckpt.runtime["bf16"] = (key, net.detached_copy(torch.bfloat16))
        net = cached[1]
    if compile:
        compiled = ckpt.runtime.setdefault("compiled", {})
        if id(net) not in compiled or compiled[id(net)][0] is not net:
            compiled[id(net)] = (net, torch.compile(net, dynamic=False))
        net = compiled[id(net)][1]
    return net
