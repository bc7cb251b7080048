"""Model configuration and the paper's hyper-parameters.

The config travels inside every checkpoint (safetensors metadata, see
:mod:`indeed_cli.model.checkpoint`), so a checkpoint always rebuilds the exact network
it was trained with.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

FORMAT_VERSION = 1
TASKS = ("denoise", "detect")
SPARSE_INPUTS = ("residual", "residual+lowrank")
LOWRANK_B = ("network", "variational")
SUPPORT_FEATURES = ("", "efficientnet-lite0")
# what a fine-tune (`indeed train --init`) may change in its checkpoint's network: give a detector
# f_thetaM (support_width, support_levels) or give f_thetaM image features, whose weights start fresh,
# and take q(B) from f_thetaB or from the variational update (the same weights either way)
FINE_TUNE_FIELDS = ("support_width", "support_levels", "support_features", "lowrank_b")


@dataclass(frozen=True)
class Priors:
    """Gamma hyper-priors of the leaf variables (paper §4.1).

    alpha0 is shared by gamma, Omega and Lambda (alpha^0 = 2); the rates are
    beta^0_gamma = beta^0_omega = 1e-6 and beta^0_lambda = 1e-8.
    """

    alpha0: float = 2.0
    beta0_gamma: float = 1e-6
    beta0_omega: float = 1e-6
    beta0_lambda: float = 1e-8


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of the modular InDeed network (see docs/model.md)."""

    channels: int = 3  # 1 = gray, 3 = RGB; one factorisation per channel
    rank: int = 64  # r^0, the maximal rank of L = A B^T per channel
    task: str = "denoise"
    # f_thetaL: shared trunk for f_thetaA / f_thetaB (GroupNorm residual blocks)
    lowrank_width: int = 32
    lowrank_blocks: int = 2
    # f_thetaS: U-Net on (Y - A B^T); widths per scale, residual blocks per scale
    sparse_width: int = 48
    sparse_blocks: int = 2
    sparse_levels: int = 3
    # what f_thetaS sees: "residual" = Y - A B^T (the paper); "residual+lowrank" = also A B^T
    # as extra input channels (a deviation measured in docs/model.md)
    sparse_input: str = "residual"
    groups: int = 8
    # q(B): "network" = f_thetaB (the paper); "variational" = the closed-form update of q(B) given
    # q(A), the noise precision and gamma, iterated with the gamma update (docs/model.md, "The
    # variational update of q(B)"; f_thetaB's weights stay in the checkpoint, unused)
    lowrank_b: str = "network"
    # f_thetaM (detection): U-Net on (Y, mu_L, mu_S) -> q(support of S); 0 = no such module
    support_width: int = 0
    support_levels: int = 3
    # f_thetaM may also read frozen ImageNet features of Y, added at its coarsest scale
    # ("efficientnet-lite0"; docs/model.md, "ImageNet features in the support posterior"); "" = none
    support_features: str = ""
    priors: Priors = field(default_factory=Priors)

    @property
    def multiple(self) -> int:
        """Spatial sizes the network accepts must be multiples of this."""
        return 2 ** max(self.sparse_levels, self.support_levels if self.support_width else 0)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        d = dict(d)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown model config keys: {sorted(unknown)}")
        if "priors" in d and isinstance(d["priors"], dict):
            d["priors"] = Priors(**d["priors"])
        cfg = cls(**d)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.channels not in (1, 3):
            raise ValueError(f"channels must be 1 or 3, got {self.channels}")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if self.sparse_input not in SPARSE_INPUTS:
            raise ValueError(f"sparse_input must be one of {SPARSE_INPUTS}, got {self.sparse_input!r}")
        if self.lowrank_b not in LOWRANK_B:
            raise ValueError(f"lowrank_b must be one of {LOWRANK_B}, got {self.lowrank_b!r}")
        if self.rank < 1:
            raise ValueError("rank must be positive")
        if self.support_width and self.task != "detect":
            raise ValueError("a support module (support_width > 0) belongs to detection models")
        if self.support_features not in SUPPORT_FEATURES:
            raise ValueError(f"support_features must be one of {SUPPORT_FEATURES}, got {self.support_features!r}")
        if self.support_features and not self.support_width:
            raise ValueError("image features are read by f_thetaM: give the model one (--support-width N)")
        if self.support_width < 0 or self.support_levels < 1:
            raise ValueError("support_width must be >= 0 and support_levels >= 1")
        if self.lowrank_width % self.groups or self.sparse_width % self.groups:
            raise ValueError("widths must be multiples of groups")


def fine_tune_config(start: ModelConfig, requested: dict) -> ModelConfig:
    """The network of a run that starts from a checkpoint whose config is ``start``, given the model
    options the user asked for (``requested``, ModelConfig fields): ``start`` with the changes of
    :data:`FINE_TUNE_FIELDS` a fine-tune may make; any other field stays the checkpoint's.
    A detector that has f_thetaM keeps its width and scales. Raises ValueError for an invalid result."""
    changes = {k: requested[k] for k in FINE_TUNE_FIELDS if requested.get(k)}
    if start.support_width:
        changes.pop("support_width", None)
        changes.pop("support_levels", None)
    cfg = dataclasses.replace(start, **changes)
    cfg.validate()
    return cfg
