"""Store deployment statistics in a checkpoint's metadata.

denoise checkpoints: the OOD statistics of :mod:`indeed_cli.tasks.ood` from clean training
images under the checkpoint's training noise; detect checkpoints: the anomaly threshold from
held-out normal images.  :func:`indeed_cli.pipelines.train` calls it at the end of a run.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ..inference import InferenceOptions, resolve_device
from ..model import load_checkpoint, resolve_weights, save_checkpoint
from ..model.checkpoint import check_weight_bits, shared_trunk, stored_weights
from ..model.memory import check_bank_bits
from ..tasks.detection import (
    MEMORY_ENTRIES,
    QUANTILE,
    build_memory,
    calibrate,
    memory_trunk,
    rebanked,
    with_members,
)
from ..tasks.ood import DEFAULT_QUANTILE, calibrate_ood
from ..tasks.training import load_images
from .inputs import ensemble_setting


def calibrate_checkpoint(
    src: str | Path,
    output: str | Path,
    paths: list[Path],
    device: str = "auto",
    samples: int = 256,
    seed: int = 0,
    note: dict | None = None,
    max_seconds: float | None = None,
    progress=None,
    scales: tuple[float, ...] | None = None,
    quantile: float | None = None,
    ensemble: int | str | None = None,
    members: list[str | Path] | None = None,
    memory: list[Path] | str | None = None,
    memory_entries: int | None = None,
    memory_bits: int | None = None,
    weight_bits: int | None = None,
    precision: str | None = None,
) -> tuple[str, str, dict]:
    """Load ``src``, measure on ``paths``, write ``output`` with ``extra[key] = facts``.

    Returns (task, key, facts): key "detect" (threshold from normal images) or "ood"
    (statistics from ``samples`` noisy training images, fewer when ``max_seconds`` runs out;
    ``progress(n)`` hears of each).  ``note`` is merged into the facts.  ``scales`` (detect): the
    read-out scales to learn the threshold for, stored with it (default: the checkpoint's own);
    ``quantile`` (detect): the share of the normal images' scores at or below the threshold
    (default: tasks.detection.QUANTILE, 0.99); ``ensemble`` (detect): the flips and rotations of
    each image whose maps are averaged, stored with the threshold (default 1); ``members`` (detect):
    further detectors (names, paths or hf:// references) added to ``src``'s members, the map then
    being the mean of all members' maps, each at its own read-out scales (docs/guide/detect.md);
    ``memory`` (detect): normal images (the training images) to fill the detector's memory of normal
    features from, whose distance map is then fused with the members' (Eq. memory fusion), or "none"
    to drop the memory a detector has; None keeps what it has; ``memory_entries``: the most entries the
    coreset keeps (default: tasks.detection.MEMORY_ENTRIES); ``memory_bits``: the bits per value the
    file stores that memory's bank in, 8 (default) or 4 (twice the entries in the same bytes); without
    ``memory``, the memory the detector has is stored anew in them (:func:`rebanked`); ``weight_bits``:
    the bits per weight the file stores its largest convolutions in, 8 (int8) or 4 (Eq. (4-bit
    weights)), the networks rounded so before anything is measured on them (default: as ``src``);
    ``precision`` (detect): fp32, bf16 or auto, the read-out precision the threshold is learned at and
    stored with, at which ``indeed detect`` then reads out (default: the detector's own, fp32 for one
    never calibrated).
    """
    if precision is not None:
        InferenceOptions(precision=precision).check()  # before loading anything
    if weight_bits is not None:
        check_weight_bits(weight_bits, "--weight-bits")
    if memory_bits is not None:
        check_bank_bits(memory_bits, "--memory-bits")
    dev = resolve_device(device)
    ck = load_checkpoint(src, dev)
    if members:
        if ck.config.task != "detect":
            raise ValueError("--member is for detectors: a denoiser has no map to average")
        others = [load_checkpoint(resolve_weights(str(m), ck.config.channels, "detect"), dev) for m in members]
        ck = with_members(ck, others)
    nets = [ck.model, *(m.model for m in ck.members)]
    if weight_bits is not None and weight_bits != ck.weight_bits:
        if memory is None and ck.memory is not None and shared_trunk(ck.memory, nets) is not None:
            raise ValueError(
                f"--weight-bits {weight_bits} rounds the trunk this detector's memory reads its features with: "
                "fill the memory anew with --memory DIR|LIST (its training images), or drop it with --memory none"
            )
        ck = replace(ck, weight_bits=weight_bits)
    for net in nets:  # every network as the file will hold it (added members too), before measuring
        stored_weights(net, ck.int8_min_weights, ck.weight_bits)
    if memory_entries is not None and (memory is None or memory == "none"):
        raise ValueError("--memory-entries sizes a memory that --memory fills: give --memory DIR|LIST too")
    if memory_bits is not None and memory == "none":
        raise ValueError("--memory-bits stores a memory, and --memory none drops it: give one of them")
    if memory_bits is not None and memory is None:
        # the memory the detector has, stored anew (a 28,672-entry int8 memory halves without its images)
        if ck.config.task != "detect":
            raise ValueError("--memory-bits is for detectors: a denoiser has no memory")
        if ck.memory is None:
            raise ValueError("--memory-bits: this detector has no memory to store; fill one with --memory DIR|LIST")
        ck = replace(ck, memory=rebanked(ck.memory, memory_bits))
    if memory is not None:
        if ck.config.task != "detect":
            raise ValueError("--memory is for detectors: a denoiser has no map to fuse")
        if memory == "none":
            ck = replace(ck, memory=None)
        else:
            entries = MEMORY_ENTRIES if memory_entries is None else memory_entries
            bits = 8 if memory_bits is None else memory_bits
            filled = build_memory(memory_trunk(ck), memory, ck.config.channels, entries, device=dev, bits=bits)
            ck = replace(ck, memory=filled)
    if ck.config.task == "detect":
        quantile = QUANTILE if quantile is None else quantile
        ensemble = 1 if ensemble is None else ensemble_setting(ensemble)
        opts = InferenceOptions(precision=precision)
        key, facts = "detect", calibrate(ck, paths, opts, scales=scales, quantile=quantile, ensemble=ensemble)
    else:
        if precision is not None:
            raise ValueError("--precision is for detectors: a denoiser's OOD statistics are measured in fp32")
        if scales:
            raise ValueError("--scales is for detectors: a denoiser has no read-out scales")
        if ensemble is not None:
            raise ValueError("--ensemble is for detectors: a denoiser's OOD statistics have no maps to average")
        if quantile is not None:
            fixed = f"a denoiser's OOD threshold is fixed at {DEFAULT_QUANTILE:g}"
            raise ValueError(f"--quantile is for detectors: {fixed}")
        images = load_images(paths, ck.config.channels)
        key, facts = "ood", calibrate_ood(ck, images, samples, seed, max_seconds, progress)
    facts = {**facts, **(note or {})}
    extra = {**ck.extra, key: facts}
    save_checkpoint(
        output, ck.model, ck.training, extra, int8_min_weights=ck.int8_min_weights, members=ck.members,
        memory=ck.memory, weight_bits=ck.weight_bits,
    )  # fmt: skip
    return ck.config.task, key, facts
