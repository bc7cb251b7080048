"""Export a checkpoint's tile network to ONNX, for runtimes outside Python (optional extra `onnx`).

The exported graph is what runs on each tile: (B, C, tile, tile) float32 in [0, 1] in, the
posterior mean of L + S (a denoiser), of S (a detector), or q(z = 1) (a detector with a support
posterior, f_thetaM) out, with a dynamic batch size.  Tiling,
blending and the detector's read-out stay outside it; examples/onnx_detect.py does them with numpy
the way `indeed detect` does, and the metadata carries what they need (tile, overlap, threshold,
read-out scales, score; for a detector of several members, each member's scales).
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..inference import InferenceOptions
from ..model import Checkpoint, load_checkpoint, resolve_weights
from ..tasks.detection import has_support, readout_ensemble, readout_scales, score_kind, stored_fusion, stored_threshold
from ..tasks.detection.maps import DEFAULT_SCORE, MAP_BLUR, SCORE_DEFINITIONS
from .inputs import UsageError

INPUT = "Y"
OUTPUTS = {"denoise": "X", "detect": "S", "support": "P"}
PARITY_TOLERANCE = 1e-4  # float32: the exported graph must give the network's numbers


class TileNetwork(nn.Module):
    """The part of inference that runs on a tile: posterior means, no sampling.  A detector of
    several members (support posteriors) outputs one q(z = 1) channel per member, in order."""

    def __init__(self, ckpt: Checkpoint):
        super().__init__()
        self.model, self.output = ckpt.model, output_kind(ckpt)
        self.members = nn.ModuleList(m.model for m in ckpt.members)

    def forward(self, Y: torch.Tensor) -> torch.Tensor:
        d = self.model(Y, sample=False)
        if self.output == "support":
            logits = [d.support_logit, *(m(Y, sample=False).support_logit for m in self.members)]
            return torch.sigmoid(torch.cat(logits, 1))
        return d.mu_S if self.output == "detect" else d.L_hat + d.mu_S


def output_kind(ck: Checkpoint) -> str:
    """What the exported graph outputs: "denoise" (L + S), "detect" (S) or "support" (q(z = 1))."""
    return "support" if has_support(ck) else ck.config.task


def export_onnx(
    weights: str | Path | Checkpoint | None,
    out: str | Path,
    *,
    task: str = "denoise",
    channels: int = 3,
    tile: int = 128,
    opset: int = 17,
    force: bool = False,
) -> dict:
    """Write the tile network of ``weights`` (default: the bundled model of ``task`` and ``channels``)
    to ``out`` and check it against PyTorch on random tiles with onnxruntime.  Returns the metadata
    written into the ONNX file and ``max_difference``, the largest deviation found."""
    try:
        import onnx
        import onnxruntime
    except ImportError:
        raise UsageError("ONNX export needs the onnx extra: pip install 'indeed[onnx]'") from None
    out = Path(out)
    if out.exists() and not force:
        raise UsageError(f"output exists: {out} (use --force to overwrite)")
    if out.suffix.lower() != ".onnx":
        raise UsageError(f"{out}: an ONNX model file should end in .onnx")
    ck = weights if isinstance(weights, Checkpoint) else load_checkpoint(resolve_weights(
        None if weights is None else str(weights), channels, task), "cpu")  # fmt: skip
    if ck.config.task not in OUTPUTS:
        raise UsageError(f"cannot export a {ck.config.task!r} checkpoint")
    if ck.members and not has_support(ck):  # members of support posteriors share one output, one channel each
        raise UsageError(
            f"cannot export a detector of {1 + len(ck.members)} members that map |mu_S|; export each member's own file"
        )
    if ck.config.lowrank_b != "network":  # its iterated Cholesky solves have no ONNX counterpart
        raise UsageError(f"cannot export a checkpoint with lowrank_b={ck.config.lowrank_b!r}; only f_thetaB's q(B)")
    try:
        InferenceOptions(tile=tile, overlap=0).check(ck.config.multiple)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if any(p.dtype != torch.float32 for p in ck.model.parameters()):
        raise UsageError("only float32 networks are exported (bf16 is a runtime choice, not a file format)")
    net = TileNetwork(ck).eval().cpu()
    example = torch.rand(2, ck.config.channels, tile, tile)
    name = OUTPUTS[output_kind(ck)]
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:  # the folder is made as for any other output; where it cannot be, one line, not a traceback's
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"{out}: cannot write there ({e.strerror or e})") from None
    try:
        with torch.no_grad(), warnings.catch_warnings():
            # the tracer notes that the shape checks of InDeed.forward become constants: they hold for
            # every tile of this size, which is all the graph takes
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.simplefilter("ignore", DeprecationWarning)  # torch's TorchScript-based exporter, still the
            # one that needs no onnxscript and keeps the batch dimension dynamic in one call
            torch.onnx.export(net, (example,), str(tmp), input_names=[INPUT], output_names=[name], opset_version=opset,
                              dynamic_axes={INPUT: {0: "batch"}, name: {0: "batch"}}, dynamo=False)  # fmt: skip
        meta = metadata(ck, tile, name)
        model = onnx.load(str(tmp))
        for key, value in meta.items():
            model.metadata_props.add(key=key, value=value)
        onnx.save(model, str(tmp))
        check = torch.rand(3, ck.config.channels, tile, tile)  # another batch size than the example's
        session = onnxruntime.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
        got = session.run(None, {INPUT: check.numpy()})[0]
        with torch.no_grad():
            want = net(check).numpy()
        diff = float(np.abs(got - want).max())
        if not diff <= PARITY_TOLERANCE:
            raise UsageError(
                f"the exported network differs from PyTorch by {diff:.2g} (> {PARITY_TOLERANCE}); not written"
            )
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return {**meta, "max_difference": diff, "bytes": out.stat().st_size}


OUTPUT_MEANINGS = {
    "denoise": "posterior mean of L + S per tile (the denoised tile)",
    "detect": "posterior mean of S per tile",
    "support": "q(z = 1) per tile, the probability that a pixel is in the support of S",
}


def metadata(ck: Checkpoint, tile: int, output: str) -> dict[str, str]:
    """What a runtime needs besides the graph, as the ONNX file's string metadata."""
    meta = {
        "indeed.task": ck.config.task,
        "indeed.config": ck.config.to_json(),
        "indeed.source": ck.source,
        "indeed.tile": str(tile),
        "indeed.overlap": "32",
        "indeed.input": f"{INPUT}: (batch, {ck.config.channels}, {tile}, {tile}) float32 in [0, 1], one tile each",
        "indeed.output": f"{output}: " + OUTPUT_MEANINGS[output_kind(ck)],
    }
    if ck.config.task == "detect":
        # a memory's graph-less distance: the graph's map is scored by its own top5 (threshold_without)
        kind = DEFAULT_SCORE if stored_fusion(ck) is not None else score_kind(ck)
        support = output_kind(ck) == "support"
        meta.update({
            "indeed.threshold": json.dumps(stored_threshold(ck)),
            # the read-out the threshold was learned with: this graph's tiles reproduce "tiles" only
            "indeed.threshold_readout": (ck.extra.get("detect") or {}).get("readout", "tiles"),
            "indeed.scales": json.dumps(list(readout_scales(ck))),
            # n > 1: the threshold belongs to the mean of the maps of the first n transforms of
            # indeed_cli.inference.DIHEDRAL of the image, each turned back (`indeed detect --ensemble`)
            "indeed.ensemble": json.dumps(readout_ensemble(ck)),
            "indeed.map": "mean_c P (the channels of a colour image read as gray images), mean over the read-out "
            "scales" if support else f"gaussian_blur(mean_c |S|, {MAP_BLUR}), mean over the read-out scales",
            "indeed.score": kind,
            "indeed.score_definition": SCORE_DEFINITIONS[kind],
        })  # fmt: skip
        if stored_fusion(ck) is not None:  # the graph has no feature memory: the members' map and its threshold
            meta["indeed.threshold"] = json.dumps(ck.extra["detect"]["memory"].get("threshold_without"))
            meta["indeed.memory"] = (
                "not in this graph: `indeed detect` fuses a distance to normal ImageNet features with this map "
                "(docs/model.md, Eq. (memory fusion)); indeed.threshold is the one learned without it"
            )
        if ck.members:  # the map: the mean over members of each member's mean over its own scales
            meta["indeed.member_scales"] = json.dumps([list(readout_scales(m)) for m in (ck, *ck.members)])
            meta["indeed.output"] += f"; one channel per member ({1 + len(ck.members)}), in indeed.member_scales' order"
            meta["indeed.map"] += " of each member, mean over the members"
    return meta
