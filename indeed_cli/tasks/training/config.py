"""Settings of one training run and its learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .objective import LossWeights


@dataclass
class TrainConfig:
    task: str = "denoise"
    steps: int = 20000  # planned total; the LR schedule is laid over it
    batch: int = 32
    patch: int = 128
    lr: float = 4e-4
    lr_min: float = 1e-6
    warmup: int = 300
    sigma_max: float = 75.0  # AWGN sigma ~ U(0, sigma_max] / 255 per patch (paper §4.1)
    # sigma = sigma_max * u^sigma_power, u ~ U(0, 1] (noise.noise_levels); 1 = the paper's uniform level
    sigma_power: float = 1.0
    clip_prob: float = 0.5  # share of patches clipped to [0,1] and quantised to 8 bits
    camera_share: float = 0.0  # denoise, colour: share of patches with camera noise instead of AWGN
    saturation_share: float = 0.0  # denoise, colour: share of clean patches with chroma scaled up (batches.saturate)
    seed: int = 0
    val_every: int = 1000
    save_every: int = 2000
    log_every: int = 100
    precision: str = "auto"  # bf16 autocast on GPU, fp32 on CPU
    time_limit: float = 0.0  # seconds for this call; 0 = no limit
    time_budget: float = 0.0  # total training seconds over all resumed calls; 0 = schedule by steps
    losses: LossWeights = field(default_factory=LossWeights)
    init: str = ""  # checkpoint whose weights start a new run (fine-tuning); ignored when resuming
    # detect: the ImageNet trunk's weights (tools/import_efficientnet_lite0.py) for a model whose
    # f_thetaM reads features and that does not have them yet (a fresh run, or --init without them)
    support_features_weights: str = ""
    deterministic: bool = False  # deterministic kernels, no cuDNN autotuning (docs/guide/train.md)
    state_shard_mb: float = 0.0  # the resumable state in files of at most this size; 0 = one file
    # train only the weights whose names start with one of these prefixes (e.g. "sparse.dec"), the
    # others frozen at their starting values (loop.freeze_except); empty: every weight
    train_only: tuple[str, ...] = ()

    def check(self) -> None:
        """Settings that cannot go together (raised before any data is loaded or trained on)."""
        if self.sigma_power <= 0:
            raise ValueError(f"--sigma-power must be above 0, got {self.sigma_power}")
        if not 0.0 <= self.camera_share <= 1.0:
            raise ValueError(f"--camera-noise must be a share between 0 and 1, got {self.camera_share}")
        if self.camera_share and self.task != "denoise":
            raise ValueError("--camera-noise is for denoisers (--task denoise)")
        if not 0.0 <= self.saturation_share <= 1.0:
            raise ValueError(f"--saturation must be a share between 0 and 1, got {self.saturation_share}")
        if self.saturation_share and self.task != "denoise":
            raise ValueError("--saturation is for denoisers (--task denoise)")
        if self.losses.rank_sup < 0:
            raise ValueError(f"--rank-supervision must be a weight of at least 0, got {self.losses.rank_sup}")
        if self.losses.rank_sup and self.task != "denoise":
            raise ValueError("--rank-supervision is for denoisers (--task denoise): it needs the clean images")
        if any(not p.strip() for p in self.train_only):
            raise ValueError("--train-only takes comma-separated weight-name prefixes, e.g. sparse.dec,sparse.head")
        if self.deterministic and self.time_budget:
            raise ValueError(
                "a deterministic run needs a step-based schedule: --time-budget makes the learning "
                "rate depend on wall-clock time (use --steps; --time-limit may still end a call)"
            )


def lr_at(step: int, tc: TrainConfig, elapsed: float = 0.0) -> float:
    """Linear warm-up, then cosine decay from lr to lr_min over the planned steps
    (or over the time budget, whichever is further along)."""
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    t = min(1.0, (step - tc.warmup) / max(1, tc.steps - tc.warmup))
    if tc.time_budget:
        t = max(t, min(1.0, elapsed / tc.time_budget))
    return tc.lr_min + 0.5 * (tc.lr - tc.lr_min) * (1 + math.cos(math.pi * t))
