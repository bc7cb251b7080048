"""Active generalization (paper §3.5): fine-tune one module on out-of-distribution images.

  InDeedAG  (mode "ag"):  one adaptation on all images of a folder, then inference on each;
  InDeedOAG (mode "oag"): a fresh copy of the weights adapted on each image alone.

Objective: :mod:`.objective`; stopping rule: :mod:`.stopping`; settings and defaults: :mod:`.config`.
Where the ELBO keeps an image's starting weights, ``AdaptConfig.objective`` "auto" (OAG's default)
tries the recorrupted-to-recorrupted objective for correlated noise (:mod:`.recorrupted`,
:func:`adapt_recorrupted`), grouped the same way.

Several independent adaptations (OAG on a folder) run at once: their weights are stacked
and the network runs under ``torch.vmap`` (``AdaptConfig.group`` at a time), each with its
own batches, Adam state (Adam is element-wise, so one optimizer over stacked weights is K
independent ones) and early stopping.  On a GPU this amortises the kernel launches that
dominate one small adaptation (docs/results.md); the result for an image does not
depend on which others share its group (tested).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, replace

import numpy as np
import torch
import torch.distributed as tdist
from torch.func import vmap

from ...inference import InferenceOptions, TileGrid, as_model_channels, pixel_shuffle_fits, shuffled_residuals
from ...inference.tiling import host_to_device
from ...model import Checkpoint, CheckpointError, load_checkpoint, resolve_weights
from ..noise_presence import load_noise_detector, noise_found, noise_presence_scores
from ..ood import image_ood_score
from .adam import Adam
from .config import (
    AG_DEFAULTS,
    AG_NOISE_CHECK,
    AG_RECORRUPTED_DEFAULTS,
    FLAT_BLOCK,
    FLAT_MAX_ACTIVITY,
    FLAT_MIN_RATIO,
    FLAT_NOISE_LIKE,
    FLAT_RECOLOUR,
    FLAT_SHARE,
    GRAY_LUMINANCE,
    GRAY_LUMINANCE_STRIDE,
    OAG_DEFAULTS,
    R2R_BATCH,
    R2R_EVAL_DRAWS,
    R2R_EVAL_EVERY,
    R2R_MIN_CORRELATION,
    R2R_MIN_FLAT_CORRELATION,
    R2R_SHUFFLE,
    AdaptConfig,
    AdaptResult,
    default_group,
    default_precision,
    recorrupted_steps_and_lr,
    recorrupted_tile_for,
    with_defaults,
)
from .noise_level import pooled_noise_sigma
from .objective import (
    adaptation_objective,
    grouped_objective_applies,
    grouped_recorrupted_objective,
    lowrank_factors,
    take,
)
from .recorrupted import (
    coloured,
    correlated_noise,
    flat_block_correlation,
    flat_block_recolour,
    gray_luminance_recolour,
    noise_gain,
    quiet_level_scale,
    recorrupted_pair,
    robust_level_scale,
    spectrum_roots,
)
from .stopping import EarlyStopping, first_change_ratio


def tiles_of(
    images: list[np.ndarray], tile: int, max_tiles: int, gen: torch.Generator, stride: int | None = None
) -> torch.Tensor:
    """Reflected tiles of all images at ``stride`` (default ``tile``: non-overlapping), a random
    subset of at most ``max_tiles`` when there are more (chosen before cutting)."""
    return tiles_and_owners(images, tile, max_tiles, gen, stride)[0]


def tiles_and_owners(
    images: list[np.ndarray], tile: int, max_tiles: int, gen: torch.Generator, stride: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`tiles_of`, and the index in ``images`` of the image each tile was cut from."""
    grids = [TileGrid(im.shape[1], im.shape[2], tile, tile - (stride or tile)) for im in images]
    spots = [(i, y, x) for i, g in enumerate(grids) for y, x in g.positions()]
    if len(spots) > max_tiles:
        spots = [spots[j] for j in torch.randperm(len(spots), generator=gen)[:max_tiles].tolist()]
    tensors: dict[int, torch.Tensor] = {}
    out = []
    for i, y, x in spots:
        if i not in tensors:  # a tensor stays where it is (tiles cut on its device)
            im = images[i]
            tensors[i] = im if torch.is_tensor(im) else torch.from_numpy(np.ascontiguousarray(im, dtype=np.float32))
        out.append(grids[i].cut(tensors[i], y, x))
    return torch.stack(out), torch.tensor([i for i, _, _ in spots])


def adapt(
    ckpt: Checkpoint, images: list[np.ndarray], cfg: AdaptConfig = AdaptConfig(), tile: int = 128, log=None
) -> AdaptResult:
    """InDeedAG: fine-tune one copy of ``ckpt`` on all ``images`` ((C, h, w) floats in [0, 1],
    the model's channels).  With ``objective="recorrupted"`` the learning rate defaults to the one
    that objective was chosen with (AG_RECORRUPTED_DEFAULTS), not AG_LR.  ``objective="auto"``: the
    ELBO's adaptation, with the recorrupted one on the same images as its ``fallback``, for the
    images whose ELBO output the per-image choice does not keep (choice.ag_image_result).

    ``cfg.noise_check`` (AG_NOISE_CHECK where None): the noise-presence detector scores every image first; a
    folder in which it finds no noise is not adapted ("no noise found"), else the adaptation runs on every
    image as without the check, and the result carries the scores, by which choice.ag_image_result keeps the
    plain output of each image without noise (Eq. AG noise check)."""
    if cfg.noise_check is None:
        cfg = replace(cfg, noise_check=AG_NOISE_CHECK)
    if cfg.noise_check and images:
        found = noise_presence([images], next(ckpt.model.parameters()).device)[0]
        unchecked = replace(cfg, noise_check=False)
        if found is not None and not any(noise_found(s) for s in found):  # nothing to remove in the folder
            ood_scores = decide(ckpt, images, unchecked, tile)[0]
            return AdaptResult(ckpt, [], 0, "no noise found", ood_scores, [False] * len(images), noise_scores=found)
        return replace(adapt(ckpt, images, unchecked, tile, log), noise_scores=found)
    if (cfg.objective or AG_DEFAULTS["objective"]) == "auto":
        first = adapt(ckpt, images, replace(cfg, objective="elbo"), tile, log)
        again = with_defaults(replace(cfg, objective="recorrupted"), AG_RECORRUPTED_DEFAULTS)
        fallback = adapt_each(ckpt, [images], again, tile, log)[0]
        return replace(first, fallback=fallback)
    defaults = AG_RECORRUPTED_DEFAULTS if cfg.objective == "recorrupted" else AG_DEFAULTS
    return adapt_each(ckpt, [images], with_defaults(cfg, defaults), tile, log)[0]


def adapt_each(
    ckpt: Checkpoint,
    image_sets: list[list[np.ndarray]],
    cfg: AdaptConfig = AdaptConfig(),
    tile: int = 128,
    log=None,
) -> list[AdaptResult]:
    """One independent adaptation of ``ckpt`` per entry of ``image_sets`` (InDeedOAG: one entry
    per image), ``cfg.group`` entries at a time as one batched network.

    The tiles of every entry and one adapted model per entry are held on the device until the
    call returns, so pass a bounded number of entries (the CLI passes one group at a time).
    """
    cfg.check()
    cfg = with_defaults(cfg, OAG_DEFAULTS)
    device = next(ckpt.model.parameters()).device
    if cfg.precision == "auto":
        cfg = replace(cfg, precision=default_precision(device))
    model = ckpt.model.detached_copy()
    model.requires_grad_(False)
    trainable = {id(p) for m in model.modules_for(cfg.modules) for p in m.parameters()}
    names = [n for n, p in model.named_parameters() if id(p) in trainable]
    frozen = {n: t for n, t in [*model.named_parameters(), *model.named_buffers()] if n not in names}
    torch.manual_seed(cfg.seed)
    decisions = [decide(ckpt, images, cfg, tile) for images in image_sets]
    results: list[AdaptResult | None] = [
        None if any(flags) else AdaptResult(ckpt, [], 0, "in distribution", scores, flags)
        for scores, flags in decisions
    ]
    noise = [None] * len(image_sets)
    if cfg.noise_check:
        noise = noise_presence(image_sets, device)
    for i, scores in enumerate(noise):  # Eq. (noise presence): an image without noise is not adapted on
        if scores is None:
            continue
        flags = [flag and noise_found(s) for flag, s in zip(decisions[i][1], scores)]
        decisions[i] = (decisions[i][0], flags)
        if results[i] is None and not any(flags):  # nothing to remove, nothing to adapt
            results[i] = AdaptResult(ckpt, [], 0, "no noise found", *decisions[i])
    todo = [i for i, r in enumerate(results) if r is None]
    if cfg.objective == "recorrupted":  # no ELBO adaptation: every entry goes to the recorrupted one
        for i in todo:
            results[i] = AdaptResult(ckpt, [], 0, "not run", *decisions[i])
        todo = []
    jobs = []
    for i in todo:
        images = [im for im, flag in zip(image_sets[i], decisions[i][1]) if flag]
        gen = torch.Generator().manual_seed(cfg.seed)
        pool = tiles_of(images, tile, cfg.max_tiles, gen).to(device)
        # at least one evaluation tile per image (up to 128): with many images (AG), 16 tiles
        # misjudged the objective and stopped adaptation early (docs/reports/2026-11-26-adaptation.md)
        eval_set = pool[: max(cfg.eval_tiles, min(len(images), 128))]
        if (
            cfg.train_stride and cfg.train_stride < tile
        ):  # overlapping training tiles (off: docs/reports/2026-11-26-adaptation.md)
            pool = tiles_of(images, tile, cfg.max_tiles, gen, cfg.train_stride).to(device)
        sigma = pooled_noise_sigma(images, device) if cfg.noise_bound else None  # the discrepancy bound's noise level
        jobs.append({"pool": pool, "eval": eval_set, "gen": gen, "batch": min(cfg.batch, len(pool)), "sigma": sigma})
    outcomes = _run_jobs(model, names, frozen, jobs, cfg, log)
    for i, job, (best, history, best_step, stop, share) in zip(todo, jobs, outcomes):
        info = {"best_step": best_step, "stop": stop, "stop_share": share, "noise_sigma": job["sigma"],
                "loss_curve": history}  # fmt: skip
        kept = best if best_step > 0 or share else None  # None: the starting weights
        results[i] = AdaptResult(
            _adapted_checkpoint(ckpt, model, kept, cfg, info), history, best_step, stop, *decisions[i],
            first_change_ratio=first_change_ratio(history),
        )  # fmt: skip
    if cfg.objective in ("auto", "recorrupted"):
        again = [
            i
            for i, res in enumerate(results)
            if res.best_step == 0 and res.stop not in ("in distribution", "no noise found")
        ]
        flags = [results[i].adapted_images or [True] * len(image_sets[i]) for i in again]
        outcomes = adapt_recorrupted(
            ckpt,
            model,
            names,
            frozen,
            [[im for im, f in zip(image_sets[i], fl) if f] for i, fl in zip(again, flags)],
            cfg,
            tile,
            [results[i].stop for i in again],
            log,
        )
        for i, fl, outcome in zip(again, flags, outcomes):
            res = results[i]
            if outcome.best_step > 0:
                # the images the weights are meant for: those decided on and admitted by the gate
                admitted = iter(outcome.adapted_images)
                used = [flag and next(admitted) for flag in fl]
                results[i] = replace(
                    outcome, ood_scores=res.ood_scores, adapted_images=used, first_change_ratio=res.first_change_ratio
                )
            else:  # the ELBO's result stays, with what the recorrupted objective found
                results[i] = replace(res, recorrupted=outcome.recorrupted)
    return [replace(res, noise_scores=scores) for res, scores in zip(results, noise)]


def noise_presence(image_sets: list[list[np.ndarray]], device: torch.device) -> list[list[float | None] | None]:
    """Per entry, the bundled noise-presence score of each of its images (tasks.noise_presence: both detectors;
    None for a gray image), or None for every entry where the detector's weights are missing."""
    if load_noise_detector(device) is None:
        return [None] * len(image_sets)
    # one batch per shape
    flat = noise_presence_scores([im for images in image_sets for im in images], device=device)
    found = iter(flat)
    return [[next(found) for _ in images] for images in image_sets]


def _run_jobs(model, names: list[str], frozen: dict, jobs: list[dict], cfg: AdaptConfig, log) -> list[tuple]:
    """:func:`_adapt_group` over ``jobs``, ``cfg.group`` at a time among those whose tensors have the
    same shapes; the outcomes in the order of ``jobs``."""
    group = cfg.group or default_group(next(model.parameters()).device)
    by_shape: dict[tuple, list[int]] = {}
    for i, j in enumerate(jobs):  # entries batch together when their tensors have the same shapes
        by_shape.setdefault((j["batch"], *j["eval"].shape), []).append(i)
    outcomes: list = [None] * len(jobs)
    for members in by_shape.values():
        for c in range(0, len(members), group):
            chunk = members[c : c + group]
            for i, outcome in zip(chunk, _adapt_group(model, names, frozen, [jobs[i] for i in chunk], cfg, log)):
                outcomes[i] = outcome
    return outcomes


def recorruption_gates(
    ckpt: Checkpoint, images: list[np.ndarray], keep_on_device: bool = True, level: str = "rms"
) -> list[tuple[bool, float, torch.Tensor | np.ndarray]]:
    """Per image: whether the recorrupted objective may run on it (Eq. recorruption gate), the
    lag-1 correlation it was decided by, and the noise estimate the objective would use: the
    residual R = Y - X_ps2 of the pixel-shuffled read-out (stride 2): with ``keep_on_device`` a tensor on
    the model's device (the level maps, noise filters and tiles made from it are computed there too),
    else an array (:func:`fits_on_device`).

    It runs where R is correlated between neighbouring pixels (lag-1 correlation at least
    R2R_MIN_CORRELATION), over the image and in its flattest blocks (R2R_MIN_FLAT_CORRELATION):
    demosaicked camera noise.  Where the noise is white the plain read-out
    removes it already, and R is mostly the white noise plus the detail the pixel-shuffled read-out
    loses, so the noise drawn from it would be too strong.  The read-outs of all the images are
    made together, and their guard, residual and correlation computed on the model's device
    (:func:`~indeed_cli.inference.shuffled_residuals`: five small read-outs per image cost OAG a third
    of its time on a GPU when made one by one), in fp32 whatever the adaptation's precision (in bf16
    they were no faster on an H200).  ``level`` "robust" or "quiet": each admitted image's residual,
    recoloured or not, scaled down to Eq. (robust noise level) or Eq. (quiet-block noise level)
    (AdaptConfig.recorruption_level).  An image too small for the pixel-shuffled read-out (under 2 × 2
    pixels per sub-image) is refused with no correlation measured: (False, None, None)."""
    fits = [pixel_shuffle_fits(im.shape[-2], im.shape[-1], R2R_SHUFFLE) for im in images]
    if not all(fits):
        inner = iter(recorruption_gates(ckpt, [im for im, f in zip(images, fits) if f], keep_on_device, level))
        return [next(inner) if f else (False, None, None) for f in fits]
    gated = []
    device = next(ckpt.model.parameters()).device
    for chunk in _pixel_chunks(images, GATE_PIXELS):  # a read-out and a residual per image held at once
        residuals = shuffled_residuals(ckpt, chunk, R2R_SHUFFLE, keep_on_device=keep_on_device)
        start, unchanged = len(gated), []
        for i, (im, (residual, c)) in enumerate(zip(chunk, residuals)):
            admitted, changed = c >= R2R_MIN_CORRELATION, False
            if admitted:  # Y and R on the device once, for both flat-block rules
                Y, R = torch.as_tensor(im).to(device), torch.as_tensor(residual).to(device)
                flat = flat_block_correlation(Y, R)  # Eq. (recorruption gate)'s second condition
                admitted = flat is None or flat >= R2R_MIN_FLAT_CORRELATION
            if admitted and FLAT_RECOLOUR:  # noise the residual missed (Eq. flat-block recolouring)
                R, changed = flat_block_recolour(Y, R, FLAT_BLOCK, FLAT_SHARE, FLAT_MAX_ACTIVITY, FLAT_MIN_RATIO,
                                                 FLAT_NOISE_LIKE)  # fmt: skip
                if changed:
                    residual = R if keep_on_device else R.cpu().numpy()
            if admitted and not changed and np.shape(im)[0] == 3:
                unchanged.append(i)
            gated.append((admitted, c, residual))
        if GRAY_LUMINANCE and unchanged:
            _gray_luminance(gated, start, [chunk[i] for i in unchanged], unchanged, device, keep_on_device)
        if level in ("robust", "quiet"):  # after both recolourings, so that z is drawn from the scaled residual
            scale = robust_level_scale if level == "robust" else quiet_level_scale
            for i, im in enumerate(chunk, start):
                admitted, c, residual = gated[i]
                if admitted:
                    gated[i] = (admitted, c, residual * scale(im, residual))
    return gated


def _gray_luminance(gated: list, start: int, images: list, where: list[int], device, keep_on_device: bool) -> None:
    """Eq. (gray-luminance recolouring) in place on ``gated[start + i]`` for ``i`` in ``where``: the
    bundled gray model's pixel-shuffled read-out of each image's luminance (the images of one size
    together), where it fits; nothing where the gray model is not available."""
    gray = _gray_model(device)
    if gray is None:
        return
    lums = [np.asarray(im, dtype=np.float32).mean(0, keepdims=True) for im in images]
    fits = [k for k, lum in enumerate(lums) if min(lum.shape[-2:]) >= 8 * GRAY_LUMINANCE_STRIDE]
    if not fits:
        return
    found = shuffled_residuals(gray, [lums[k] for k in fits], GRAY_LUMINANCE_STRIDE, keep_on_device=True)
    for k, (r, _) in zip(fits, found):
        admitted, c, residual = gated[start + where[k]]
        R, changed = gray_luminance_recolour(torch.as_tensor(residual).to(device), r)
        if changed:
            gated[start + where[k]] = (admitted, c, R if keep_on_device else R.cpu().numpy())


_GRAY_MODELS: dict[str, Checkpoint | None] = {}


def _gray_model(device: torch.device) -> Checkpoint | None:
    """The bundled gray denoiser on ``device``, loaded once per device (None if it cannot be read)."""
    key = str(device)
    if key not in _GRAY_MODELS:
        try:
            _GRAY_MODELS[key] = load_checkpoint(resolve_weights(None, 1), device)
        except (CheckpointError, OSError):
            _GRAY_MODELS[key] = None
    return _GRAY_MODELS[key]


GATE_PIXELS = 2**25  # pixels of the images whose gate read-outs are made together (32 of 1024x1024)


def fits_on_device(images: list[np.ndarray]) -> bool:
    """Whether the recorrupted adaptation keeps the gate's residuals, the level maps and the images they are
    cut with on the model's device: when all of ``images`` hold at most GATE_PIXELS pixels (OAG's groups;
    AG on a large folder keeps them on the host, as its residuals alone could exceed a GPU's memory)."""
    return sum(im.shape[-2] * im.shape[-1] for im in images) <= GATE_PIXELS


def _pixel_chunks(images: list[np.ndarray], pixels: int) -> list[list[np.ndarray]]:
    """``images`` in order, in runs of at most ``pixels`` pixels (an image larger than that alone)."""
    chunks, size = [[]], 0
    for im in images:
        n = im.shape[-2] * im.shape[-1]
        if chunks[-1] and size + n > pixels:
            chunks.append([])
            size = 0
        chunks[-1].append(im)
        size += n
    return [c for c in chunks if c]


def recorrupted_settings(cfg: AdaptConfig, device: torch.device | str = "cpu") -> AdaptConfig:
    """The settings the recorrupted adaptation runs with on ``device``: ``cfg.recorrupted_steps`` steps (where
    None, the device's default), the learning rate scaled to match (:func:`~.config.recorrupted_steps_and_lr`),
    evaluations at the start and after the last step (and every R2R_EVAL_EVERY steps where that is set), the
    posterior means, and the evaluated weights with the lowest recorrupted validation loss kept (the start's if
    none is lower); no trust region, noise bound, first-change rule or patience, which were chosen for the
    ELBO's trajectories.  Batch, precision and group are ``cfg``'s."""
    steps, lr = recorrupted_steps_and_lr(cfg, device)
    return replace(
        cfg, steps=steps, lr=lr, eval_every=R2R_EVAL_EVERY or steps, keep="best", patience=0, max_change=0.0,
        noise_bound=0.0, collapse_ratio=0.0, decide="always", sample=False,
    )  # fmt: skip


def recorruption_levels(
    images: list[np.ndarray], gated: list, device, keep_on_device: bool = True
) -> list[torch.Tensor | None]:
    """Per image, Eq. (signal-dependent noise)'s level map (:func:`recorrupted.noise_gain` of the
    gate's read-out X_ps2 = Y - R and residual R), a tensor computed on ``device`` and left there with
    ``keep_on_device`` (else on the CPU), None where the gate refused the image; the images of one size
    in one call, in runs of at most GATE_PIXELS pixels
    (:func:`_pixel_chunks`, as the gate's read-outs are made)."""
    levels: list[torch.Tensor | None] = [None] * len(images)
    shapes: dict[tuple, list[int]] = {}
    for i, (im, (ok, _, _)) in enumerate(zip(images, gated)):
        if ok:
            shapes.setdefault(im.shape, []).append(i)
    for same in shapes.values():
        order = iter(same)
        for chunk in _pixel_chunks([images[i] for i in same], GATE_PIXELS):  # the gate's bound on pixels held
            idx = [next(order) for _ in chunk]
            R = torch.stack([torch.as_tensor(gated[i][2]).to(device) for i in idx])
            Y = torch.from_numpy(np.stack([images[i] for i in idx])).to(device)
            gains = noise_gain(Y - R, R, device=device)
            for i, g in zip(idx, gains if keep_on_device else gains.cpu()):
                levels[i] = g
    return levels


def _recorrupted_job(
    ckpt: Checkpoint,
    images: list[np.ndarray],
    gated: list,
    cfg: AdaptConfig,
    tile: int,
    levels: list | None = None,
    roots: list[torch.Tensor] | None = None,
):
    """Given the gate's verdicts on ``images`` (:func:`recorruption_gates`), where it admits any,
    their adaptation job for :func:`_adapt_group`: the tiles of the admitted images, the owner of
    each tile, one noise filter per admitted image (Eq. noise spectrum), with
    ``cfg.recorruption_noise`` "signal" each tile's level map (``levels``, from
    :func:`recorruption_levels`, computed here when None), and the recorrupted evaluation tiles
    (R2R_EVAL_DRAWS fixed noise draws per tile).  ``roots``: the admitted images' noise filters where
    they were computed already (:func:`recorrupted.spectrum_roots`, a group's at once).  Returns (job or
    None, admitted flags, facts)."""
    device = next(ckpt.model.parameters()).device
    facts: dict = {"correlation": [None if c is None else round(c, 4) for _, c, _ in gated]}
    chosen = [(im, r) for im, (ok, _, r) in zip(images, gated) if ok]
    admitted = [ok for ok, _, _ in gated]
    if not chosen:
        return None, admitted, facts
    gen = torch.Generator().manual_seed(cfg.seed)
    roots = torch.stack(roots if roots is not None else spectrum_roots([r for _, r in chosen], tile, device))
    if cfg.recorruption_noise == "signal":  # each tile's level map cut with it (one cut of both)
        C = chosen[0][0].shape[0]
        if levels is None:
            levels = recorruption_levels(images, gated, device)
        stacked = [  # image and level map where the map is (recorruption_levels), cut there
            torch.cat([torch.from_numpy(np.ascontiguousarray(im, dtype=np.float32)).to(g.device), g])
            for im, (ok, _, _), g in zip(images, gated, levels)
            if ok
        ]
        both, owner = tiles_and_owners(stacked, tile, cfg.max_tiles, gen)
        pool, gains = both[:, :C].contiguous(), both[:, C:].contiguous().to(device)
    else:
        pool, owner = tiles_and_owners([im for im, _ in chosen], tile, cfg.max_tiles, gen)
        gains = None
    order = torch.randperm(len(pool), generator=gen)
    ev = order[: min(len(pool), max(cfg.eval_tiles, min(len(chosen), 128)))].repeat(R2R_EVAL_DRAWS)
    pool = pool.to(device)
    # the noise is drawn on the device (on the host it took longer than a GPU's adaptation steps)
    noise_gen = torch.Generator(device).manual_seed(cfg.seed + 1)
    ev_on_device = host_to_device(ev, device)
    Ez = correlated_noise(roots[host_to_device(owner[ev], device)], noise_gen)
    if gains is not None:
        Ez = Ez * gains[ev_on_device]
    noisier, target = recorrupted_pair(pool[ev_on_device], Ez)
    # the drawn noise's level (recorded; with the start's loss over its variance: 1 + 1 / alpha^2 = 5
    # plus the plain model's error, not used as a limit: docs/reports/2026-11-28-recorrupted-adaptation.md);
    # a tensor until the adaptation has run, so that preparing the jobs does not wait for the device
    facts["noise_sigma"] = Ez.square().mean().sqrt() * 255
    job = {"pool": pool, "eval": noisier, "target": target, "gen": gen, "batch": min(cfg.batch, len(pool)),
           "sigma": None, "roots": roots, "owner": owner, "noise_gen": noise_gen, "gains": gains}  # fmt: skip
    return job, admitted, facts


def adapt_recorrupted(
    ckpt: Checkpoint,
    model,
    names: list[str],
    frozen: dict,
    image_sets: list[list[np.ndarray]],
    cfg: AdaptConfig,
    tile: int,
    before: list[str],
    log=None,
) -> list[AdaptResult]:
    """The recorrupted-to-recorrupted adaptation (:mod:`.recorrupted`) of ``model``'s trainable
    weights ``names`` (``frozen``: the others), one per entry of ``image_sets``, grouped as the
    ELBO's adaptations are (:func:`_adapt_group`, settings :func:`recorrupted_settings`): each on
    the tiles of the entry's images the gate admits (Eq. recorruption gate), each tile's noise drawn
    from its own image's spectrum.  A result keeps the starting weights (best_step 0) when the gate
    refuses every image or when no evaluation improved on the start; its ``recorrupted`` dict says
    which, with the gate's correlation per image; ``adapted_images`` which images the gate admitted.
    ``before``: why the ELBO adaptation kept the start, per entry (recorded)."""
    device = next(ckpt.model.parameters()).device
    r2r = recorrupted_settings(cfg, device)
    tile = recorrupted_tile_for(cfg, device, tile)
    if R2R_BATCH:
        r2r = replace(r2r, batch=R2R_BATCH)
    flat = [im for images in image_sets for im in images]
    on_device = fits_on_device(flat)
    gated = recorruption_gates(ckpt, flat, on_device, r2r.recorruption_level)  # every image's read-outs together
    levels = iter(
        recorruption_levels(flat, gated, device, on_device)
        if r2r.recorruption_noise == "signal"
        else [None] * len(flat)
    )
    gates = iter(gated)
    entry_gates = [[next(gates) for _ in images] for images in image_sets]
    roots = iter(spectrum_roots([r for ok, _, r in gated if ok], tile, device))  # the group's filters at once
    prepared = [
        _recorrupted_job(
            ckpt, images, g, r2r, tile, [next(levels) for _ in images], [next(roots) for ok, _, _ in g if ok]
        )
        for images, g in zip(image_sets, entry_gates)
    ]
    jobs = [job for job, _, _ in prepared if job is not None]
    outcomes = iter(_run_jobs(model, names, frozen, jobs, r2r, log))
    results = []
    for (job, admitted, facts), elbo_stop in zip(prepared, before):
        if job is None:
            stop, history = "uncorrelated noise", []
        else:
            best, history, best_step, stop, _ = next(outcomes)
            sigma = float(facts["noise_sigma"])
            facts["noise_sigma"] = round(sigma, 4)
            facts["start_ratio"] = round(history[0]["loss"] / max(sigma**2, 1e-12), 4)
            if best_step == 0:
                stop = "no improvement" if stop == "steps" else stop
        if job is None or best_step == 0:
            results.append(AdaptResult(ckpt, list(history), 0, stop, None, admitted, objective="recorrupted",
                                       recorrupted={**facts, "stop": stop}))  # fmt: skip
            continue
        facts.update(stop=stop, best_step=best_step)
        info = {"objective": "recorrupted", "elbo_stop": elbo_stop, "recorrupted": facts, "best_step": best_step,
                "stop": stop, "loss_curve": history}  # fmt: skip
        ck = _adapted_checkpoint(ckpt, model, best, cfg, info)
        results.append(
            AdaptResult(ck, history, best_step, stop, None, admitted, objective="recorrupted", recorrupted=facts)
        )
    return results


def _adapted_checkpoint(ckpt: Checkpoint, model, best: dict | None, cfg: AdaptConfig, info: dict) -> Checkpoint:
    """``model`` with the adapted weights ``best`` (sharing its frozen modules), as a checkpoint whose
    training record says what it was adapted from and how: ``cfg`` and ``info`` under "adapted".
    ``best`` None: the starting weights, ``model`` itself, shared (adaptation trains copies of its
    weights and never changes it).  Where the ELBO keeps the start, the recorrupted objective usually
    runs next, and a copy had cost about 4 ms per image of a GPU group's time for nothing (one NVIDIA
    H100, docs/reports/2026-12-06-oag-readouts-on-the-device.md)."""
    training = {**ckpt.training, "adapted": {"parent": ckpt.source, **asdict(cfg), **info}}
    adapted = model if best is None else model.with_parameters(best).eval()
    return Checkpoint(adapted, ckpt.config, training, dict(ckpt.extra), ckpt.source + " (adapted)")


def decide(
    ckpt: Checkpoint, images: list[np.ndarray], cfg: AdaptConfig, tile: int = 128
) -> tuple[list[float | None], list[bool]]:
    """Per image: its OOD score and whether to adapt on it (``cfg.decide``; config.OAG_DECIDE).

    "ood" adapts on the images whose score is above the checkpoint's threshold, scored with the
    default inference options (those the checkpoint's statistics were computed with, whatever
    ``tile`` the adaptation uses).  "always" and "change" (which the stopping rule decides), or a
    checkpoint without OOD statistics, adapt on every image (scores None: not computed)."""
    ood = ckpt.extra.get("ood")
    if cfg.decide != "ood" or not ood:
        return [None] * len(images), [True] * len(images)
    scores = [image_ood_score(ckpt, im, InferenceOptions()) for im in images]
    return scores, [s > ood["threshold"] for s in scores]


def adapt_images(
    items: list[tuple[Checkpoint, np.ndarray]], cfg: AdaptConfig = AdaptConfig(), tile: int = 128
) -> tuple[list[AdaptResult], list[int]]:
    """InDeedOAG on (checkpoint, (C, h, w) image) pairs, those sharing a checkpoint in one
    :func:`adapt_each` call, each image shaped for its model (:func:`as_model_channels`).

    Returns the results in input order and, per image, how many were adapted together.
    """
    by_model: dict[int, list[int]] = {}
    for i, (ckpt, _) in enumerate(items):
        by_model.setdefault(id(ckpt), []).append(i)
    results: list = [None] * len(items)
    together = [1] * len(items)
    for members in by_model.values():
        ckpt = items[members[0]][0]
        sets = [as_model_channels(items[i][1], ckpt.config.channels) for i in members]
        for i, res in zip(members, adapt_each(ckpt, sets, cfg, tile)):
            results[i], together[i] = res, len(members)
    return results, together


def _optimizer(params: dict, lr: float, device: torch.device) -> Adam:
    """Adam over the adapted weights: fused kernels on a GPU (one launch for all weights instead of
    several per weight; OAG's time per image on an NVIDIA H100 fell by 2-7%,
    docs/reports/2026-12-06-oag-readouts-on-the-device.md), the single-tensor update elsewhere."""
    return Adam(list(params.values()), lr, fused=device.type == "cuda")


def _ranks() -> tuple[int, int] | None:
    """(rank, world size) of an active torch.distributed process group of several ranks, else None."""
    if tdist.is_available() and tdist.is_initialized() and tdist.get_world_size() > 1:
        return tdist.get_rank(), tdist.get_world_size()
    return None


def _average_gradients(params, scale: float) -> None:
    """Sum each gradient over the ranks (scaled): every rank then takes the same Adam step."""
    for p in params:
        if p.grad is not None:
            tdist.all_reduce(p.grad)
            if scale != 1.0:
                p.grad.mul_(scale)


# Whether grouped recorrupted adaptations run f_thetaS's copies as channels-last grouped convolutions
# (grouped_recorrupted_objective) instead of under torch.vmap.  The same objective, outputs and gradients
# (tests/unit/test_recorrupted.py); end to end on one NVIDIA H200 in bf16 OAG took 0.100-0.104 s instead of
# 0.110-0.118 s per 512 x 512 image where every image takes the recorrupted objective, the same PSNR to
# 0.01 dB (docs/reports/2026-12-03-recorrupted-time-and-int8.md, section 5).  False: vmap, as until then.
GROUPED_RECORRUPTED = True


def _adapt_group(model, names: list[str], frozen: dict, jobs: list[dict], cfg: AdaptConfig, log):
    """The adaptation loop for K entries whose batches have the same shapes (see module doc).

    One entry runs the network directly on a working copy; several run under ``torch.vmap``
    with stacked weights, and entries that stop are dropped from the stack (with their Adam
    state) so that the others run alone.  Jobs with noise filters ("roots", from
    :func:`_recorrupted_job`) minimise the recorrupted objective instead of the ELBO: each batch is
    recorrupted with noise drawn from its images' filters, and evaluation scores the output of the
    job's recorrupted evaluation tiles against their "target" copies.  Returns per entry: its best
    trainable weights, history, best step, stop reason and, where the kept weights were moved towards
    the evaluation that crossed a bound (``cfg.stop_at_bound``, Eq. stop at the bound), the share of
    the way (else None).
    """
    K = len(jobs)
    device = jobs[0]["pool"].device
    cached = cfg.modules == "S"  # the frozen low-rank module's outputs are computed once
    r2r = "roots" in jobs[0]
    if K == 1:  # the plain network: no functional_call or vmap overhead for a single adaptation
        work = copy.deepcopy(model)
        params = {n: work.get_parameter(n).requires_grad_(True) for n in names}

        def run(p, Y, sample, F, T=None):
            T1 = None if T is None else T[0]
            obj, X = adaptation_objective(work, None, None, Y[0], cfg, sample, take(F, lambda f: f[0]), T1)
            return obj[None], X[None]

        view = {n: v.unsqueeze(0) for n, v in params.items()}  # (1, ...) views of the live weights
    else:
        # Autocast does not reach convolutions with vmapped weights.  bf16 is therefore done by
        # hand where it is safe: f_thetaS alone, fp32 master weights cast to bf16 in each pass
        # (their gradients flow back to fp32 Adam), the image and the objective kept in fp32
        # (f_thetaS casts its input); the cached low-rank factors come from autocast, as in a
        # single adaptation.  Rounding the image itself to bf16 had cost 0.6 dB on PolyU100
        # (docs/reports/2026-11-26-adaptation.md).  Otherwise fp32.
        half = cfg.precision == "bf16" and cached
        if not half:
            cfg = replace(cfg, precision="fp32")
        base = dict(model.named_parameters())
        params = {n: base[n].detach().unsqueeze(0).repeat(K, *[1] * base[n].dim()).requires_grad_(True) for n in names}

        def cast(p):  # the weights of one pass: bf16 copies of the fp32 masters where half
            return {n: v.to(torch.bfloat16) for n, v in p.items()} if half else p

        def objective(p, Y, F, T, s):
            return adaptation_objective(model, cast(p), frozen, Y, cfg, s, F, T)

        vmapped = {
            s: vmap(
                lambda p, Y, F, T, s=s: objective(p, Y, F, T, s),
                in_dims=(0, 0, 0 if cached else None, 0 if r2r else None),
                randomness="different",
            )
            for s in (True, False)
        }
        # the recorrupted objective runs f_thetaS's K copies as channels-last grouped convolutions
        # instead: vmap's NCHW grouped weight gradients were 41% of its GPU time (Eq. recorrupted objective
        # either way; docs/reports/2026-12-03-recorrupted-time-and-int8.md)
        grouped = GROUPED_RECORRUPTED and grouped_objective_applies(model, names, cached, r2r)

        def run(p, Y, sample, F, T=None):
            if grouped:
                return grouped_recorrupted_objective(model, cast(p), Y, F, T)
            return vmapped[sample](p, Y, F, T)

        view = params
    best_params = {n: v.detach().clone() for n, v in view.items()}
    opt = _optimizer(params, cfg.lr, device)
    E = torch.stack([j["eval"] for j in jobs])  # (K, n_eval, C, t, t)
    targets = torch.stack([j["target"] for j in jobs]) if r2r else None
    size = max(len(j["pool"]) for j in jobs)
    pools = torch.zeros((K * size, *jobs[0]["pool"].shape[1:]), device=device)
    for k, j in enumerate(jobs):
        pools[k * size : k * size + len(j["pool"])] = j["pool"]
    gain_pools = None
    if r2r and jobs[0].get("gains") is not None:
        gain_pools = torch.ones_like(pools)
        for k, j in enumerate(jobs):
            gain_pools[k * size : k * size + len(j["pool"])] = j["gains"]
    b = jobs[0]["batch"]
    # recorrupted batches change every step, so their low-rank factors are computed per step
    pool_factors = lowrank_factors(model, pools, cfg) if cached and not r2r else None
    eval_factors = lowrank_factors(model, E, cfg) if cached else None
    alive = list(range(K))  # entries still adapting, in stack order

    def evaluate(X0=None):
        with torch.no_grad():
            obj, X = run(params, E, False, eval_factors, targets)
            if r2r:  # the recorrupted validation loss, in squared 8-bit units
                return [{"loss": v * 255**2, "objective": "recorrupted"} for v in obj.mean(1).tolist()], X
            loss, abs_N = obj.mean(1), (E - X).abs().flatten(1).mean(1)
            rms_N = 255 * (E - X).square().flatten(1).mean(1).sqrt()
            change = 255 * (X - X0).square().flatten(1).mean(1).sqrt() if X0 is not None else torch.zeros_like(loss)
            rows = torch.stack([loss, abs_N, change, rms_N], 1).tolist()  # one host sync per evaluation
        return [dict(zip(("loss", "abs_N", "change", "rms_N"), r)) for r in rows], X

    start, X0 = evaluate()
    history = [[{"step": 0, **s}] for s in start]
    rules = [EarlyStopping.start(cfg, s, j["sigma"]) for s, j in zip(start, jobs)]
    ranks = _ranks() if K == 1 else None  # one adaptation shared by the ranks of a process group
    if r2r:  # every entry's noise filters in one tensor, and the filter of each row of ``pools`` in it
        filters = torch.cat([j["roots"] for j in jobs])
        filter_of = torch.zeros(K * size, dtype=torch.long)
        first = 0
        for k, j in enumerate(jobs):
            filter_of[k * size : k * size + len(j["pool"])] = j["owner"] + first
            first += len(j["roots"])
        filter_of = filter_of.to(device)
    for step in range(1, cfg.steps + 1):
        idx = torch.stack([torch.randint(len(jobs[k]["pool"]), (b,), generator=jobs[k]["gen"]) for k in alive])
        # (entries, b) rows of ``pools``, copied without waiting for the previous step's backward pass and update
        rows = host_to_device(idx + torch.tensor(alive)[:, None] * size, device)
        if r2r:  # each entry's noise from its own generator, each tile's from its image's filter
            white = torch.stack(
                [torch.randn(b, *pools.shape[1:], generator=jobs[k]["noise_gen"], device=device) for k in alive]
            )
            z = coloured(filters[filter_of[rows]].flatten(0, 1), white.flatten(0, 1))
            z = z.view(len(alive), b, *pools.shape[1:])
        split = ranks is not None and b >= ranks[1]
        if split:  # every rank draws the same batch and computes its part of it
            rows = rows[:, ranks[0] :: ranks[1]]
            if r2r:
                z = z[:, ranks[0] :: ranks[1]]
        nb = rows.shape[1]
        rows = rows.flatten()
        Y = pools[rows].view(len(alive), nb, *pools.shape[1:])
        if r2r:
            if gain_pools is not None:
                z = z * gain_pools[rows].view(len(alive), nb, *pools.shape[1:])
            Y, T = recorrupted_pair(Y, z)
            F = lowrank_factors(model, Y, cfg) if cached else None
        else:
            T = None
            F = take(pool_factors, lambda f, rows=rows, n=len(alive), nb=nb: f[rows].view(n, nb, *f.shape[1:]))
        obj, _ = run(params, Y, cfg.sample, F, T)
        opt.zero_grad()
        # entries are independent: the sum gives each its own gradient; split over ranks, each rank's
        # part is a share of the whole batch's mean, and the ranks' gradients are summed (DDP's mean)
        (obj.sum(1).sum() / b if split else obj.mean(1).sum()).backward()
        if ranks is not None:
            _average_gradients(params.values(), 1.0 if split else 1.0 / ranks[1])
        opt.step()
        if step % cfg.eval_every and step != cfg.steps:
            continue
        recs, _ = evaluate(X0)
        improved, keep = [], []
        for pos, (k, rec) in enumerate(zip(alive, recs)):
            rec = {"step": step, **rec}
            history[k].append(rec)
            if log:
                log(rec if K == 1 else {"entry": k, **rec})
            if rules[k].update(rec):
                improved.append((pos, k))
            if rules[k].running:
                keep.append(pos)
            elif cfg.stop_at_bound:
                kept = next(h for h in history[k] if h["step"] == rules[k].best_step)
                t = rules[k].fraction_to_bound(kept, rec)
                if t:  # Eq. (stop at the bound): the kept weights moved t of the way to the crossing ones
                    rules[k].fraction = t
                    with torch.no_grad():
                        for n, v in view.items():
                            best_params[n][k].lerp_(v[pos].detach().to(best_params[n].dtype), t)
        if improved:
            src = torch.tensor([p for p, _ in improved], device=device)
            dst = torch.tensor([k for _, k in improved], device=device)
            with torch.no_grad():
                for n, v in view.items():
                    best_params[n].index_copy_(0, dst, v.detach().index_select(0, src))
        if not keep:
            break
        if len(keep) < len(alive):  # drop the stopped entries from the stack (never when K == 1)
            sel = torch.tensor(keep, device=device)
            params = {n: v.detach().index_select(0, sel).requires_grad_(True) for n, v in params.items()}
            opt = opt.select(list(params.values()), sel)
            view, E, X0 = params, E[sel], X0[sel]
            targets = targets[sel] if r2r else None
            eval_factors = take(eval_factors, lambda f, sel=sel: f[sel])
            alive = [alive[p] for p in keep]
    return [
        ({n: v[k] for n, v in best_params.items()}, history[k], rules[k].best_step, rules[k].stop, rules[k].fraction)
        for k in range(K)
    ]
