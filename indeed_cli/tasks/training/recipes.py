"""Named training recipes: what `indeed train --task T` and ``indeed_cli.train(task=T)`` build
when the user says nothing else.  One place, so that the command and the Python call agree.

denoise: f_thetaS sees A B^T beside the residual (docs/model.md), AWGN up to sigma 75 (paper §4.1),
         no image pyramid, OOD statistics of the training images stored at the end;
detect:  the paper's f_thetaS input, mild sensor noise (sigma up to 5) that belongs to N, an image
         pyramid 1, 1/2, 1/4 (large defects need context beyond one tile), synthetic anomalies of
         the ``strong`` preset, a support posterior f_thetaM (width 32) that also reads the bundled
         frozen ImageNet features (docs/model.md; from scratch in 200-270 s on an H100 it scored
         pixel AUROC 0.80-0.81 against 0.69 for the |mu_S| map on magnetic tiles), and the threshold
         learned from held-out normal images.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ...model import ModelConfig
from .config import TrainConfig


@dataclass(frozen=True)
class Recipe:
    task: str
    sparse_input: str  # what f_thetaS sees (ModelConfig.sparse_input)
    sigma_max: float  # training noise, 8-bit units
    scales: tuple[float, ...]  # image pyramid (detect: also the read-out scales)
    sparse_width: int = 64
    anomalies: str = "strong"  # synthetic anomaly preset (detect)
    val_count: int = 8  # held out from the training images when no validation set is given
    ood_samples: int = 256  # denoise: noisy training crops for the OOD statistics
    support_width: int = 0  # detect: f_thetaM's width (0: none, the map is |mu_S|)
    support_features: str = ""  # detect: image features f_thetaM reads ("" none)

    def model_config(self, channels: int = 3, **overrides) -> ModelConfig:
        """The recipe's model; ``overrides`` replace any ModelConfig field.  Without f_thetaM
        (``support_width=0``) there are no features unless they are asked for."""
        features = "" if overrides.get("support_width") == 0 else self.support_features
        cfg = ModelConfig(
            channels=channels,
            task=self.task,
            sparse_input=self.sparse_input,
            sparse_width=self.sparse_width,
            support_width=self.support_width,
            support_features=features,
        )
        cfg = replace(cfg, **overrides)
        cfg.validate()
        return cfg

    def train_config(self, **overrides) -> TrainConfig:
        """The recipe's training settings; ``overrides`` replace any TrainConfig field."""
        tc = replace(TrainConfig(task=self.task, sigma_max=self.sigma_max), **overrides)
        tc.check()
        return tc


RECIPES = {
    "denoise": Recipe("denoise", sparse_input="residual+lowrank", sigma_max=75.0, scales=(1.0,)),
    "detect": Recipe(
        "detect",
        sparse_input="residual",
        sigma_max=5.0,
        scales=(1.0, 0.5, 0.25),
        support_width=32,
        support_features="efficientnet-lite0",
    ),
}


def recipe(task: str) -> Recipe:
    if task not in RECIPES:
        raise ValueError(f"--task must be one of {sorted(RECIPES)}, got {task!r}")
    return RECIPES[task]
