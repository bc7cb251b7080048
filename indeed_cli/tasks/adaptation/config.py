"""Settings and results of active generalization (paper §3.5), and the measured defaults."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ...inference import InferenceOptions, native_bf16
from ...model import Checkpoint

# Learning rates measured for the shipped colour model (docs/reports/2026-11-26-adaptation.md): one
# adaptation on a whole folder (AG) needs smaller steps than one per image (OAG) to stay inside the
# trust region.
AG_LR = 1e-5
OAG_LR = 3e-5
# Most steps: per image (OAG), 12 scored at least as well as 20 on both halves of PolyU100 and
# ran about 25% faster (docs/reports/2026-11-26-adaptation.md); AG keeps the 20 it was measured with.
AG_STEPS = 20
OAG_STEPS = 12
# Which evaluated weights an adaptation keeps (stopping.EarlyStopping): "best" objective, the
# "latest" whose objective is no worse than the starting weights', or the "last" inside the bounds.
# AG's objective rises for its first steps and then falls below the start: "best" kept step 2 in
# fp32 (PolyU even half, H100: 36.37 dB) where "latest" kept step 20 (38.00 dB; bf16 38.02),
# docs/reports/2026-11-27-adaptation-heavy-noise.md.
AG_KEEP = "latest"
# OAG keeps the last evaluation inside its bounds (the noise bound below and the trust region): its
# objective rises for the first steps on most PolyU images while PSNR already rises (scene-dev
# trajectories, 49 images, no trust region: +1.55 dB over plain with "last", +1.34 with "best" or
# "latest"; docs/reports/2026-11-28-adaptation-noise-level.md).
OAG_KEEP = "last"
# Which images an adaptation may change (AdaptConfig.decide; measured in
# docs/reports/2026-11-27-adaptation-decision.md, 4 x H200, fp32):
#   "change": keep the starting weights when the first evaluation moved the output by less than
#     FIRST_CHANGE_RATIO x the RMS of the starting residual N (stopping.EarlyStopping).  OAG's
#     default: on synthetic camera noise (light to heavy), where adapting cost up to 1.9 dB on
#     single images, it kept the plain result of every image but a few light-noise ones; on
#     PolyU it kept OAG's gains (scene halves 37.08 / 37.34 dB against 37.10 / 37.34 always).
#   "ood": adapt only the images the checkpoint's OOD score flags (tasks.ood).  It kept half of
#     PolyU100's images from adapting and lost 0.6 (OAG) to 1.3 dB (AG) of the gain there.
#   "always": AG's default: one adaptation for a folder has no per-image first step to read, and
#     "change" stopped it on every set (its smaller learning rate moves the output less).
# Evaluations without improvement before an adaptation stops.  AG runs all its steps: with keep
# "latest", a patience of 6 stopped fp32 AG on PolyU's scene-dev half at step 18 while its
# objective was still above the start's, keeping step 6 (36.45 dB); run to step 20 it kept step
# 20 (37.65 dB on the 2-core CPU; bf16 on an H200: 37.67), docs/reports/2026-11-27-adaptation-decision.md.
AG_PATIENCE = 0  # 0: never stop for lack of improvement
OAG_PATIENCE = 6
AG_DECIDE = "always"
OAG_DECIDE = "change"
# decide="change": stopping.EarlyStopping.  1.3 since 2026-12-07 (1.0 until then): the ELBO's first moves
# between 1.0 and 1.3 times the residual were, on development crops, synthetic light camera noise it smoothed
# (1.04-1.21: -0.6 to -1.6 dB, the recorrupted objective +1.8 to +3.7 instead) and photographs without noise,
# against one PolyU100 scene-dev image (1.07; the next at 1.42); held out, every image it moved to the
# recorrupted objective gained (docs/reports/2026-12-07-first-change-ratio.md).
FIRST_CHANGE_RATIO = 1.3
# OAG's discrepancy bound (stopping.EarlyStopping): N may grow to OAG_NOISE_BOUND x the noise level
# estimated from the image (noise_level.block_noise_sigma).  Chosen on development data
# (docs/reports/2026-11-28-adaptation-noise-level.md): on 49 OAG trajectories of PolyU100's scene-dev
# half 1.0 / 1.25 / 1.5 all kept every image within 0.01 dB of plain, 1.25 gained most; with the
# trust region kept as well (2.5), because without it OAG lost up to 5.7 dB on single training
# crops under light synthetic camera noise (4 x H200, 305 crops per level).  AG: no bound (not
# measured with it).
OAG_NOISE_BOUND = 1.25
AG_NOISE_BOUND = 0.0  # 0: no noise bound
# After AG, per image (choice.choose_output): the adapted output is kept only where it moved the image
# at least this many times as far as the plain model's removal did (Eq. AG image choice,
# docs/model.md).  Chosen on development data (docs/reports/2026-11-28-ag-image-choice.md): on PolyU100's
# scene-dev half the ratio was 2.32-9.78 (AG +1.72 dB), on training crops under synthetic camera
# noise 0.07-2.12 (AG from -1.74 dB on light noise to +2.92 on medium noise on wallpaper); 2.5 kept
# +1.66 dB on PolyU and every camera-noise crop plain.  OAG decides per image in its steps instead.
AG_MIN_CHANGE_RATIO = 2.5
# ... and only where it removed at most this many times the image's noise level (RMS(Y - X) against
# noise_level.block_noise_sigma; OAG's discrepancy bound, the same 1.25).  On development data AG
# on all of PolyU100 at once (bf16, 2-core CPU) lost 1.28 / 0.45 / 0.28 dB on three scene-dev crops
# whose adapted output had removed 2.9 / 9.4 / 1.4 times the noise level; 1.25 kept every
# scene-dev crop at or above plain there and in fp32 (docs/reports/2026-11-28-ag-image-choice.md).
AG_IMAGE_NOISE_BOUND = OAG_NOISE_BOUND
# The recorrupted-to-recorrupted adaptation (recorrupted.py; AdaptConfig.objective), for correlated
# noise the ELBO adaptation leaves in place: steps, evaluations, and the fixed noise draws per
# evaluation tile of its validation loss (docs/reports/2026-11-28-recorrupted-adaptation.md).
R2R_LR = OAG_LR  # the learning rate it was chosen with, per image; AG with it uses the same
# ... at this many steps; N steps run at R2R_LR x R2R_REFERENCE_STEPS / N (Eq. recorrupted steps)
R2R_REFERENCE_STEPS = 20
# The steps OAG runs on a GPU where AdaptConfig.recorrupted_steps is None (recorrupted_steps_and_lr): 18 since
# 2026-12-06: on one H100 (bf16, groups of 32) 13% less time per 512 x 512 image under heavy camera noise than
# 20 (0.075-0.077 against 0.087-0.088 s), on 32 development crops within 0.04 dB of 20's mean gain under
# heavy, medium and light camera noise and without noise, by the rule fixed before the run; 16 lost 0.053 dB
# under light noise.  On a CPU (its tiles of 64) 18 steps took no less time on 4 development crops and lost
# 0.09 dB under light noise, so a CPU runs 20 (docs/reports/2026-12-06-recorrupted-evaluations.md).
GPU_OAG_RECORRUPTED_STEPS = 18
AG_RECORRUPTED_STEPS = R2R_REFERENCE_STEPS  # AG: not measured with fewer
# Evaluations of the recorrupted validation loss between the start and the last step (0: none, only
# those two).  With one every 5 steps the last was the lowest on each of the 107 development inputs OAG
# adapted with this objective (32 crops under heavy, medium and light camera noise and without noise; one
# H100, bf16): without them every crop's PSNR was the same (to 0.001 dB) and OAG took a tenth less time
# (docs/reports/2026-12-06-recorrupted-evaluations.md).
R2R_EVAL_EVERY = 0
R2R_EVAL_DRAWS = 2
# Fewer still are an option (AdaptConfig.recorrupted_steps): on one NVIDIA H100 (bf16, groups of 32) 10 steps
# took OAG from 0.089-0.100 to 0.069-0.071 s per 512 x 512 image under heavy camera noise for 0.07 dB less
# gain on held-out photographs, but 0.09-0.21 dB less on the development crops under camera noise
# (docs/reports/2026-12-06-oag-time-on-h100.md).
# The recorrupted adaptation's tiles per step, for every mode and device where set; None: AdaptConfig.batch.
# benchmarks/adapt.py sets runner's copy (runner.R2R_BATCH) per method (%TILExBATCH; the tile side is
# AdaptConfig.recorrupted_tile).
R2R_BATCH: int | None = None
# InDeedOAG's recorrupted adaptation on a CPU runs on tiles of this side (AdaptConfig.recorrupted_tile
# None), elsewhere on the ELBO's (128).  On an H200 tiles of 64 took the same time as 128 (its steps are
# bound by launches, not convolutions) and cost up to 0.1 dB on development crops; held out (fp32)
# -0.09 / -0.02 dB on Urban100/Set14 light / heavy noise, +0.01 / +0.26 on wallpaper; on a CPU the
# convolutions are the work: 22.5 instead of 57.7 s per 384 x 384 crop on a 2-core AVX2 EPYC
# (docs/reports/2026-12-02-recorrupted-tiles.md), 10.7 instead of 26.3-28.6 s on a 2-core AVX-512 EPYC in
# fp32 (3 development crops: heavy -0.01, light -0.08 dB; 3 wallpaper ones in bf16 -0.17 / -0.18;
# docs/reports/2026-12-03-cpu-recorrupted-tiles.md).
# AG keeps the ELBO's tile (0): one adaptation for all its images, 1.5x faster with 64 on the CPU but
# -0.13 dB under light noise on 6 development crops.
CPU_OAG_RECORRUPTED_TILE = 64
# The recorrupted objective runs only where the residual of the pixel-shuffled read-out is correlated
# between neighbouring pixels at least this much (runner.recorruption_gate).  Development crops
# (256 x 256 training crops, `color`): synthetic camera noise 0.33-0.60 (light to heavy), white
# Gaussian noise of sigma 15 0.00-0.12 and of sigma 5 0.02-0.32, where the objective lost up to
# 6.4 dB; clean photographs 0.26-0.64 (not separated: docs/reports/2026-11-28-recorrupted-adaptation.md).
R2R_MIN_CORRELATION = 0.3
# ... and where that correlation, read in the FLAT_SHARE of FLAT_BLOCK x FLAT_BLOCK blocks where the read-out
# varies least among those with under a tenth of their values clipped (recorrupted.flat_block_correlation:
# R there is noise, not detail the read-out lost), is at least this much.  Development crops (the top-left
# 384 x 384 of the first 32 training-split photographs, `color`): synthetic camera noise 0.20-0.64 (on the
# crops the first condition admitted: light 0.38, medium 0.32, heavy 0.45 and above), white Gaussian noise
# of sigma 5 -0.02-0.40 (median 0.06) and of sigma 10 -0.02-0.20: of the four white-noise crops the first
# condition admitted, the three that had lost (up to 1.35 dB) read 0.18-0.25, the fourth 0.40; PolyU100
# scene-dev 0.55 and above
# (docs/reports/2026-12-06-oag-readouts-on-the-device.md, section 5).
R2R_MIN_FLAT_CORRELATION = 0.3
# The stride of the pixel-shuffled read-out whose residual R = Y - X_ps is the recorrupted objective's
# noise estimate and its gate (Eq. recorruption gate): 2 (the sub-images of a demosaicked colour image
# see its noise at lag 2, nearly white).
R2R_SHUFFLE = 2
# The noise's channel covariance from the image's flattest blocks (recorrupted.flat_block_recolour, Eq.
# flat-block recolouring): the gate's residual misses the noise that real camera pipelines make
# correlated between channels (luminance-like noise the model reads as texture; on a SIDD validation
# block R was 0.65 times the true noise with the wrong sign of correlation, on camera noise demosaiced
# with Malvar-He-Cutler filters 0.77 times).  The residual is recoloured to the covariance of Y in the
# FLAT_SHARE of FLAT_BLOCK x FLAT_BLOCK blocks where the read-out X_ps varies least, where (a) the
# read-out's variance there is at most FLAT_MAX_ACTIVITY times that covariance's trace (the blocks are
# flat: what varies in Y there is noise) and (b) that trace is at least FLAT_MIN_RATIO times the
# residual's in the same blocks (the residual missed much of it).  Chosen on development crops
# (docs/reports/2026-12-04-noise-channel-covariance.md): 0.2 / 1.6 recoloured 30 of the 652 development
# inputs, none of which lost; looser limits lost up to 4.5 dB on single textured crops, whose flattest
# blocks hold detail.  Held out (OAG, one H200, fp32): +0.35 to +1.53 dB on Malvar-He-Cutler camera
# noise, no image below OAG without it but one light-noise wallpaper crop (-2.29, still +0.48 over
# plain), nothing else changed.  FLAT_RECOLOUR False: the residual as before.
FLAT_RECOLOUR = True
FLAT_BLOCK = 16
FLAT_SHARE = 0.1
FLAT_MAX_ACTIVITY = 0.2
FLAT_MIN_RATIO = 1.6
# ... or where the read-out's variation in those blocks is at most FLAT_NOISE_LIKE[0] times the trace and
# noise-like, its lag-2 correlation at most FLAT_NOISE_LIKE[1] (noise the read-out kept is white from lag
# 2 on, smooth detail is not): it reached the SIDD validation block of the report (activity 0.25, lag 2
# -0.01; OAG 19.09 -> 26.12 dB there on a CPU) and 2 more development crops, all of which gained; held
# out (CPU, fp32) it recoloured 3 more of 456 inputs (+1.27 to +1.58 dB) and nothing else.  None: the
# first rule alone.
FLAT_NOISE_LIKE: tuple[float, float] | None = (0.3, 0.2)
# The noise's luminance from the bundled gray model (recorrupted.gray_luminance_recolour, Eq.
# gray-luminance recolouring), for admitted colour images the flat-block recolouring left alone: the
# gray model, trained on white noise, removes the luminance noise of the luminance image's stride-3
# sub-images that the colour model reads as grey texture.  On development crops under heavy
# Malvar-He-Cutler camera noise OAG gained +2.35 / +6.57 dB over plain with it against +1.04 / +2.76
# (one H200, fp32); GRAY_LUMINANCE_MIN_LAG3 keeps it off textured crops whose stride-3 read-out loses
# detail.  Held out (OAG, CPU, fp32) it added +1.14 / +2.79 dB under heavy MHC noise but cost single crops
# under light noise or none up to 6.29 dB, so it is off (docs/reports/2026-12-04-noise-left-in-flat-regions.md).
GRAY_LUMINANCE = False
GRAY_LUMINANCE_STRIDE = 3
GRAY_LUMINANCE_MIN_LAG3 = -0.1
# InDeedOAG runs the recorrupted objective where the ELBO kept an image's starting weights ("auto"):
# held out (384 x 384 crops, synthetic camera noise, one NVIDIA H200, fp32) it gained +0.7 to +4.1 dB
# over plain where the ELBO alone gained nothing, left PolyU100 as it was (37.36 dB on the scene-test
# half) and white Gaussian noise untouched.  It costs time where it runs (an H200, bf16, batched over
# OAG's groups: 0.09 s per 512 x 512 image against 0.03-0.05 for the ELBO alone) and, on photographs
# without noise, detail (the ELBO's losses there are larger).  AG with objective "recorrupted" adapts
# on the images its gate admits and skips the ELBO's per-image choice (+2.4 / +4.0 dB on held-out heavy
# camera noise); on PolyU100 it changed nothing, where the ELBO gains 1.3 dB.  So AG's default, "auto",
# runs both and gives an image the recorrupted output only where the per-image choice did not keep the
# ELBO's (choice.ag_image_result): on development data (the first 10 training crops of each set, 2-core
# CPU, bf16) the ELBO kept no camera-noise crop and "auto" gained +0.66 / +1.51 dB (light) and +2.36 /
# +6.38 (heavy) over it, the same +1.45 on PolyU100's scene-dev half, and lost 1.36 / 1.01 dB on crops
# without noise, where the ELBO's choice keeps the plain output
# (docs/reports/2026-11-28-recorrupted-adaptation.md, section 11).
AG_OBJECTIVE = "auto"
OAG_OBJECTIVE = "auto"
# The recorrupted objective's noise z (AdaptConfig.recorruption_noise): its level at each pixel
# follows the image's intensity in InDeedOAG ("signal", Eq. signal-dependent noise), one level per
# image in InDeedAG ("stationary").  Chosen for OAG on development crops (training crops under
# synthetic camera noise, means of 6 crops: -0.01 to +0.53 dB over "stationary" on heavy, medium and
# light noise, -0.04 / -0.20 on crops without noise); held out, OAG gained up to +0.19 dB with it and
# lost at most 0.04, while AG lost up to 0.20 dB, so AG keeps the one level
# (docs/reports/2026-11-29-signal-dependent-recorruption.md).
OAG_RECORRUPTION_NOISE = "signal"
AG_RECORRUPTION_NOISE = "stationary"
# The recorrupted objective's noise level (AdaptConfig.recorruption_level): "rms", R's own RMS, or "robust",
# R scaled down to Eq. (robust noise level) (recorrupted.robust_level_scale), which reads the level off the
# medians of |R| and so counts less of the detail R holds on textured images.  On development crops (one
# NVIDIA H200, fp32, 8 noise conditions and PolyU's scene-dev half, 641 inputs) "robust" cut the OAG and AG
# outputs more than 0.1 dB below plain from 166 to 134 and the worst under light noise from -2.33 to
# -1.67 dB, and cost up to 0.34 dB of OAG's mean on smooth wallpaper crops; held out 203 -> 173 such
# outputs, but AG's mean under heavy camera noise on the wallpaper crops fell from +4.61 to +3.99 dB,
# beyond the 0.35 dB set beforehand, so "rms" stays the default
# (docs/reports/2026-12-04-recorruption-noise-level.md).
RECORRUPTION_LEVEL = "rms"
# "quiet": R scaled down to the level of its quieter blocks (Eq. quiet-block noise level,
# recorrupted.quiet_level_scale): the QUIET_QUANTILE-quantile over the QUIET_BLOCK x QUIET_BLOCK blocks
# with at most QUIET_MAX_CLIPPED of the image's values at 0 or 1 of R's variance over the level map's mean
# square there, divided by the same quantile of one draw of noise of R's own covariance and level map (the
# spread of pure noise's block variances).  Lost detail sits in some blocks, the noise in all of them, so
# the quieter blocks read the noise.  Chosen on two development sets (the first 32 training-split
# Urban100/Set14 photographs and the first 32 training-split wallpaper crops, 384x384, 2-core CPU, bf16;
# quantile 0.25 against 0.1 by a rule fixed before the runs): OAG's mean gain over plain under light camera
# noise +0.76 -> +0.92 dB (Urban100/Set14; crops below -0.1 dB 6 -> 4) and +1.83 -> +1.83 (wallpaper),
# medium +1.88 -> +1.93 and +4.30 -> +4.29, heavy +3.23 -> +3.25 and +6.50 -> +6.50, without noise (16
# crops each) -1.54 -> -0.95 and -3.39 -> -2.96 (docs/reports/2026-12-07-spread-corrected-quiet-level.md).
# Without the spread correction the wallpaper crops lost 0.07-0.18 dB; without QUIET_MIN_USABLE two held-out
# mostly clipped crops lost up to 6.3 dB (docs/reports/2026-12-07-quiet-block-noise-level.md).  Not the
# default: held out (2-core CPU, bf16) it lifted OAG under light camera noise on Urban100 crops from +0.65 to
# +0.84 dB over plain, but lowered it on 12 real smartphone images (SIDD) from +5.53 to +5.46, past the 0.05
# dB set beforehand (three images read a scale of 0.98 and lost 0.16-0.37 dB).
QUIET_QUANTILE = 0.25
QUIET_BLOCK = 16
QUIET_MAX_CLIPPED = 0.1
QUIET_MIN_BLOCKS = 8  # fewer usable blocks: R's own level
QUIET_MIN_USABLE = 0.5  # ... or fewer than this share of the blocks
QUIET_DRAW_TILE = 64  # the tiles of the pure-noise draw
# images of more blocks than this (1024 x 1024 with blocks of 16) draw the noise for this many of their usable
# blocks, chosen at random, instead of on their whole shape (a 24-megapixel image's draw took gigabytes)
QUIET_DRAW_BLOCKS = 4096
# Where OAG's trust region or noise bound stops it between two evaluations, keep the weights interpolated
# to the bound (AdaptConfig.stop_at_bound, Eq. stop at the bound) rather than the evaluation before it:
# which evaluation came last inside a bound depended on the evaluation grid, and one evaluation more or
# less moved single images by up to 3 dB.  On PolyU100 (one NVIDIA H100, seeds 0 and 1) the mean gain
# over plain rose by 0.14-0.22 dB on both scene halves in fp32 and bf16, images whose fp32 and bf16
# results differ by more than 0.1 dB fell from 51 / 41 to 27 / 19 of 100 (largest 2.5 / 3.1 -> 0.7 / 0.6
# dB); on held-out crops without noise, where OAG already loses 2-6 dB, it lost 0.07-0.33 dB more, under
# light camera noise on wallpaper 0.14-0.17 more, elsewhere the same (docs/reports/2026-12-06-oag-stop-at-the-bound.md).
# AG keeps "latest", not "last": not interpolated.
OAG_STOP_AT_BOUND = True
AG_STOP_AT_BOUND = False
# OAG asks the noise-presence detector (tasks.noise_presence) before adapting an image and keeps the plain
# result where it finds no noise.  Held out (2-core CPU, bf16): photographs without noise went from -1.88 /
# -3.62 / -5.59 dB under OAG (Urban100 / Kodak24 / wallpaper crops) to -0.03 / 0.00 / 0.00; of 315 noisy
# crops and images (camera noise light to heavy, PolyU100 scene-test, SIDD) it kept two unadapted, which
# had gained +0.81 and -0.00 dB (docs/reports/2026-12-07-noise-presence.md).  AG asks it too (since late
# on 2026-12-07), but only for the output: the folder is adapted on every image as without
# the check (leaving the images without noise out of the adaptation had cost PolyU100's scene-test half
# 0.13 dB by changing the adaptation), an image without noise keeps the plain output, and a folder without
# noise is not adapted (Eq. AG noise check).  Held out (2-core CPU, bf16), AG's gain over plain without
# noise -1.48 / -1.45 / -5.12 dB (Urban100 / Kodak24 / wallpaper crops) -> -0.01 / 0.00 / 0.00, under light
# camera noise and on PolyU100 scene-test within 0.002 dB (docs/reports/2026-12-07-ag-noise-check.md).
OAG_NOISE_CHECK = True
AG_NOISE_CHECK = True
# The settings left None in AdaptConfig, per mode: adapt() (InDeedAG) and adapt_each() (InDeedOAG)
AG_DEFAULTS = {
    "lr": AG_LR,
    "steps": AG_STEPS,
    "keep": AG_KEEP,
    "decide": AG_DECIDE,
    "patience": AG_PATIENCE,
    "noise_bound": AG_NOISE_BOUND,
    "min_change_ratio": AG_MIN_CHANGE_RATIO,
    "image_noise_bound": AG_IMAGE_NOISE_BOUND,
    "objective": AG_OBJECTIVE,
    "recorruption_noise": AG_RECORRUPTION_NOISE,
    "recorrupted_tile": 0,
    "recorrupted_steps": AG_RECORRUPTED_STEPS,
    "stop_at_bound": AG_STOP_AT_BOUND,
    "noise_check": AG_NOISE_CHECK,
}
# InDeedAG with objective "recorrupted": AG's settings, with the learning rate that objective was chosen
# with (R2R_LR; AG_LR's smaller steps were measured for the ELBO)
AG_RECORRUPTED_DEFAULTS = {**AG_DEFAULTS, "lr": R2R_LR}
OAG_DEFAULTS = {
    "lr": OAG_LR,
    "steps": OAG_STEPS,
    "keep": OAG_KEEP,
    "decide": OAG_DECIDE,
    "patience": OAG_PATIENCE,
    "noise_bound": OAG_NOISE_BOUND,
    "min_change_ratio": 0.0,
    "image_noise_bound": 0.0,
    "objective": OAG_OBJECTIVE,
    "recorruption_noise": OAG_RECORRUPTION_NOISE,
    "stop_at_bound": OAG_STOP_AT_BOUND,
    "noise_check": OAG_NOISE_CHECK,
}


@dataclass
class AdaptConfig:
    modules: str = "S"
    steps: int | None = None  # None: AG_STEPS in adapt() (InDeedAG), OAG_STEPS in adapt_each() (InDeedOAG)
    lr: float | None = None  # None: AG_LR in adapt() (InDeedAG), OAG_LR in adapt_each()/adapt_images() (InDeedOAG)
    batch: int = 8
    eval_every: int = 2
    patience: int | None = None  # None: AG_PATIENCE in adapt(), OAG_PATIENCE otherwise; 0: never
    eval_tiles: int = 16
    max_tiles: int = 512
    train_stride: int | None = None  # step between training tiles; None: the tile size (no overlap)
    max_change: float = 2.5  # trust region: RMS change of L + S on the evaluation tiles, 8-bit units; 0: none
    # decide="change": the first evaluation must move L + S by this times the starting residual's RMS
    first_change_ratio: float = FIRST_CHANGE_RATIO
    # stop when the RMS of N exceeds this many times the images' estimated noise level
    # (noise_level.block_noise_sigma; the discrepancy principle, stopping.EarlyStopping); 0: no bound;
    # None: AG_NOISE_BOUND in adapt(), OAG_NOISE_BOUND otherwise
    noise_bound: float | None = None
    keep: str | None = None  # "best", "latest" or "last" (EarlyStopping); None: AG_KEEP in adapt(), OAG_KEEP otherwise
    # AG, per image: keep the adapted output only where its change ratio (choice.change_ratio) is at
    # least this; 0: every image takes the adapted output; None: AG_MIN_CHANGE_RATIO (OAG: 0, unused)
    min_change_ratio: float | None = None
    # AG, per image: ... and only where it removed at most this many times the image's estimated noise
    # level (choice.removed_over_noise); 0: no such condition; None: AG_IMAGE_NOISE_BOUND (OAG: 0, unused)
    image_noise_bound: float | None = None
    collapse_ratio: float = 0.2
    # "elbo": the paper's objective; "recorrupted": recorrupted-to-recorrupted (recorrupted.py) only;
    # "auto": the ELBO, then the recorrupted objective where the ELBO kept the starting weights (OAG)
    # or where the per-image choice did not keep the ELBO's output (AG: AdaptResult.fallback);
    # None: AG_OBJECTIVE in adapt(), OAG_OBJECTIVE otherwise
    objective: str | None = None
    decide: str | None = None  # "change", "ood" or "always"; None: AG_DECIDE in adapt(), OAG_DECIDE otherwise
    noise_precision: str = "image"  # "image" (one Lambda per image) or "pixel" (the paper's)
    # the recorrupted objective's noise z: "signal" (its level at each pixel follows the image's
    # intensity, Eq. signal-dependent noise) or "stationary" (one level per image); None:
    # AG_RECORRUPTION_NOISE in adapt(), OAG_RECORRUPTION_NOISE otherwise
    recorruption_noise: str | None = None
    # the recorrupted objective's noise level: "rms" (R's RMS), "robust" (Eq. robust noise level) or
    # "quiet" (Eq. quiet-block noise level); RECORRUPTION_LEVEL's and QUIET_QUANTILE's measurements
    recorruption_level: str = RECORRUPTION_LEVEL
    # "bf16": the network runs in bf16, the objective in fp32; "auto" (default_precision, what
    # `indeed adapt` uses): bf16 where the hardware computes it natively (a CPU with AMX: OAG 2.4x
    # faster; H100 groups: 0.065 s against 0.083 s per image, +0.1 dB), fp32 elsewhere (a 2-core AVX2
    # CPU ran bf16 several times slower)
    precision: str = "fp32"
    sample: bool = True  # reparameterised A, B, S in the steps (the paper's Monte-Carlo ELBO)
    group: int | None = None  # adaptations run at once (adapt_each); None: 32 on a GPU, 1 on a CPU
    # the recorrupted adaptation's tile side (recorrupted_tile_for); 0: the ELBO's tile (AG's default);
    # None: CPU_OAG_RECORRUPTED_TILE on a CPU (at most the ELBO's tile), the ELBO's tile elsewhere
    recorrupted_tile: int | None = None
    # the recorrupted adaptation's steps (recorrupted_steps_and_lr); None: AG_RECORRUPTED_STEPS in adapt(),
    # in adapt_each() GPU_OAG_RECORRUPTED_STEPS on a GPU and R2R_REFERENCE_STEPS on a CPU
    recorrupted_steps: int | None = None
    # keep "last": where the trust region or the noise bound stops an adaptation between two evaluations
    # after the start, keep the weights interpolated to where the bounded quantity meets its bound
    # (Eq. stop at the bound, stopping.EarlyStopping.fraction_to_bound) instead of the last evaluation
    # inside it; None: AG_STOP_AT_BOUND in adapt(), OAG_STOP_AT_BOUND otherwise
    stop_at_bound: bool | None = None
    # ask the noise-presence detector first (tasks.noise_presence, Eq. noise presence): an image in which it
    # finds no noise keeps the plain result, unadapted; None: OAG_NOISE_CHECK in adapt_each(), AG_NOISE_CHECK
    # in adapt()
    noise_check: bool | None = None
    seed: int = 0

    def check(self) -> None:
        if self.noise_precision not in ("image", "pixel"):
            raise ValueError(f"noise_precision must be image or pixel, got {self.noise_precision!r}")
        if self.recorruption_noise not in (None, "signal", "stationary"):
            raise ValueError(f"recorruption_noise must be signal or stationary, got {self.recorruption_noise!r}")
        if self.recorruption_level not in ("rms", "robust", "quiet"):
            raise ValueError(f"recorruption_level must be rms, robust or quiet, got {self.recorruption_level!r}")
        if self.precision not in ("fp32", "bf16", "auto"):
            raise ValueError(f"precision must be fp32, bf16 or auto, got {self.precision!r}")
        if self.keep not in (None, "best", "latest", "last"):
            raise ValueError(f"keep must be best, latest or last, got {self.keep!r}")
        if self.objective not in (None, "elbo", "recorrupted", "auto"):
            raise ValueError(f"objective must be elbo, recorrupted or auto, got {self.objective!r}")
        if self.decide not in (None, "ood", "change", "always"):
            raise ValueError(f"decide must be ood, change or always, got {self.decide!r}")
        if self.patience is not None and self.patience < 0:
            raise ValueError(f"patience must be 0 (never) or more, got {self.patience}")
        if self.noise_bound is not None and self.noise_bound < 0:
            raise ValueError(f"noise_bound must be 0 (no bound) or more, got {self.noise_bound}")
        if self.image_noise_bound is not None and self.image_noise_bound < 0:
            raise ValueError(f"image_noise_bound must be 0 (no bound) or more, got {self.image_noise_bound}")
        if self.min_change_ratio is not None and self.min_change_ratio < 0:
            raise ValueError(f"min_change_ratio must be 0 (always adapted) or more, got {self.min_change_ratio}")
        if self.max_change < 0:
            raise ValueError(f"max_change must be 0 (no trust region) or more, got {self.max_change}")
        if not self.first_change_ratio > 0:
            raise ValueError(f"first_change_ratio must be above 0, got {self.first_change_ratio}")
        if self.group is not None and self.group < 1:
            raise ValueError(f"group must be at least 1, got {self.group}")
        if self.recorrupted_steps is not None and self.recorrupted_steps < 1:
            raise ValueError(f"recorrupted_steps must be at least 1, got {self.recorrupted_steps}")
        if self.recorrupted_tile is not None and self.recorrupted_tile < 0:
            raise ValueError(f"recorrupted_tile must be 0 (the ELBO's tile) or more, got {self.recorrupted_tile}")


@dataclass
class AdaptResult:
    checkpoint: Checkpoint
    history: list[dict] = field(default_factory=list)
    best_step: int = 0
    stop: str = "steps"  # why it stopped; "in distribution": nothing adapted (decide="ood")
    # per image given (decide="ood"): its OOD score, and whether the adaptation used it; the weights
    # are meant for the images it used, the others keep the starting weights
    ood_scores: list[float | None] | None = None
    adapted_images: list[bool] | None = None
    objective: str = "elbo"  # the objective whose weights these are ("elbo" or "recorrupted")
    # where the recorrupted objective was tried: its gate's correlation(s), noise level, start ratio,
    # why it stopped (runner.adapt_recorrupted); None where it was not tried
    recorrupted: dict | None = None
    # InDeedAG with objective "auto": the recorrupted adaptation on the same images, whose output an
    # image takes where the ELBO's does not stay (choice.ag_image_result); None otherwise
    fallback: AdaptResult | None = None
    # InDeedOAG: the ELBO's first change over its starting residual (stopping.first_change_ratio), which
    # decide="change" compares with AdaptConfig.first_change_ratio; kept where the recorrupted objective's
    # weights replaced the ELBO's.  None where the ELBO made no evaluation after the start
    first_change_ratio: float | None = None
    # per image given: the noise-presence score (tasks.noise_presence; None: not asked, or a gray image)
    noise_scores: list[float | None] | None = None
    # InDeedOAG's results share the modules they did not adapt (InDeed.with_parameters; read-only:
    # changing one in place changes them all); each holds its adapted module's weights of its own.


def with_defaults(cfg: AdaptConfig, defaults: dict) -> AdaptConfig:
    """``cfg`` with each setting it leaves None taken from ``defaults`` (AG_DEFAULTS, OAG_DEFAULTS)."""
    return replace(cfg, **{k: v for k, v in defaults.items() if getattr(cfg, k) is None})


def default_precision(device: torch.device, cpu_flags: str | None = None) -> str:
    """What ``precision="auto"`` adapts in on ``device``: bf16 where it is native, fp32 elsewhere."""
    return "bf16" if native_bf16(device, cpu_flags) else "fp32"


def recorrupted_tile_for(cfg: AdaptConfig, device: torch.device, tile: int) -> int:
    """The recorrupted adaptation's tile side: ``cfg.recorrupted_tile`` where set (0: ``tile``, the
    ELBO's); unset, CPU_OAG_RECORRUPTED_TILE (at most ``tile``) on a CPU, ``tile`` elsewhere."""
    if cfg.recorrupted_tile:
        return cfg.recorrupted_tile
    if cfg.recorrupted_tile is None and torch.device(device).type == "cpu":
        return min(tile, CPU_OAG_RECORRUPTED_TILE)
    return tile


def recorrupted_steps_and_lr(cfg: AdaptConfig, device: torch.device | str = "cpu") -> tuple[int, float]:
    """Eq. (recorrupted steps): the recorrupted adaptation's steps, ``cfg.recorrupted_steps`` where set, else
    GPU_OAG_RECORRUPTED_STEPS off a CPU and R2R_REFERENCE_STEPS on one (``device``, the adaptation's), and its
    learning rate, ``cfg.lr`` times R2R_REFERENCE_STEPS / steps: Adam moves each weight by about the learning
    rate per step, so fewer steps of a proportionally larger rate travel about as far as the rate's reference
    steps (measured at 10 steps: docs/reports/2026-12-06-oag-time-on-h100.md)."""
    on_cpu = torch.device(device).type == "cpu"
    steps = cfg.recorrupted_steps or (R2R_REFERENCE_STEPS if on_cpu else GPU_OAG_RECORRUPTED_STEPS)
    ref = R2R_REFERENCE_STEPS  # at its reference steps, the rate to the bit
    return steps, cfg.lr if steps == ref else cfg.lr * ref / steps


def default_group(device: torch.device) -> int:
    """Adaptations run at once when AdaptConfig.group is unset: batching pays on a GPU (32 was
    the fastest of 1-64 per image on an H100, docs/results.md) and costs ~10% on a CPU."""
    return 32 if device.type == "cuda" else 1


def oag_readout(opts: InferenceOptions, device: torch.device) -> InferenceOptions:
    """The inference options an InDeedOAG result is read out with: fp32 on a GPU, ``opts`` elsewhere.

    An OAG result's weights serve one image, so a bf16 read-out needs a bf16 copy of the network
    per image (``network_for``), and on a GPU that copy costs more than bf16 saves: on an NVIDIA
    H200, a 512x512 colour image took 11.1 ms to read out in fp32 and in bf16 alike, and the copy
    13-14 ms (docs/reports/2026-11-28-oag-readout.md).  On a CPU with AMX bf16 halves the read-out
    (0.34 s against 0.86 s, docs/results.md) for a 6 ms copy, so the requested precision stays.
    The adaptation itself still runs in ``AdaptConfig.precision``."""
    if device.type == "cuda" and opts.precision != "fp32":
        return replace(opts, precision="fp32")
    return opts
