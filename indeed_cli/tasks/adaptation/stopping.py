"""When an adaptation stops, and which of its weights it keeps (docs/guide/adapt.md).

Every ``eval_every`` steps the objective and the output L + S are evaluated with the posterior
means on a fixed set of tiles.  An adaptation stops
  - when the output has moved more than ``max_change`` (RMS, 8-bit units) from the output of
    the starting weights: the trust region that bounds how far the network's function (its
    Lipschitz behaviour, in the paper's words) may drift; the objective keeps falling beyond
    it while the image is being smoothed away;
  - after ``patience`` evaluations without improvement of the objective;
  - on a non-finite loss, or on collapse (mean |N| below ``collapse_ratio`` of its start).
The weights kept (``keep``) are the best evaluated ones inside the trust region ("best"), or the
latest evaluated ones whose objective is no worse than the starting weights' ("latest"; patience
then counts evaluations above the start); the starting weights if none qualifies: adaptation
never makes the objective worse than where it started.  "latest" exists because InDeedAG's
objective rises for its first steps and only then falls below the start, while the image keeps
improving (docs/reports/2026-11-27-adaptation-heavy-noise.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import AdaptConfig


@dataclass
class EarlyStopping:
    """The stopping rule for one adaptation, fed one evaluation record at a time."""

    max_change: float
    patience: int
    collapse_ratio: float
    start_abs_N: float  # mean |N| with the starting weights
    best: float  # the best objective so far (at the start: the starting weights')
    best_step: int = 0
    bad: int = 0  # evaluations since the last improvement
    stop: str = "steps"  # why it stopped; "steps" while it runs (and when it ran all its steps)
    keep: str = "best"  # "best" or "latest" (module doc)

    @classmethod
    def start(cls, cfg: AdaptConfig, first: dict) -> EarlyStopping:
        """The rule for an adaptation whose evaluation at step 0 gave ``first`` (loss, abs_N)."""
        keep = cfg.keep or "best"
        return cls(cfg.max_change, cfg.patience, cfg.collapse_ratio, first["abs_N"], first["loss"], keep=keep)

    @property
    def running(self) -> bool:
        return self.stop == "steps"

    def update(self, rec: dict) -> bool:
        """Judge one evaluation (step, loss, abs_N, change); True when its weights are the new best."""
        if not math.isfinite(rec["loss"]):
            self.stop = "non-finite loss"
        elif rec["change"] > self.max_change:
            self.stop = "trust region"
        elif rec["abs_N"] < self.collapse_ratio * self.start_abs_N:
            self.stop = "collapse"
        elif self.keep == "latest" and rec["loss"] <= self.best:  # best stays the start's objective
            self.best_step, self.bad = rec["step"], 0
            return True
        elif self.keep == "best" and rec["loss"] < self.best - 1e-6 * abs(self.best):
            self.best, self.best_step, self.bad = rec["loss"], rec["step"], 0
            return True
        else:
            self.bad += 1
            if self.bad >= self.patience:
                self.stop = "no improvement"
        return False
