"""When an adaptation stops, and which of its weights it keeps (docs/guide/adapt.md).

Every ``eval_every`` steps the objective and the output L + S are evaluated with the posterior
means on a fixed set of tiles.  An adaptation stops
  - when the output has moved more than ``max_change`` (RMS, 8-bit units; 0: never) from the
    output of the starting weights: the trust region that bounds how far the network's function (its
    Lipschitz behaviour, in the paper's words) may drift; the objective keeps falling beyond
    it while the image is being smoothed away;
  - after ``patience`` evaluations without improvement of the objective (0: never; AG's default);
  - when the RMS of N = Y - L - S exceeds ``noise_bound`` times the noise level estimated from
    the images themselves (:mod:`.noise_level`; 0: never): the discrepancy principle, Eq.
    (discrepancy bound) in docs/model.md.  Removing more than the noise removes image: on real
    camera noise OAG's PSNR peaked when N reached about the noise the plain model had left in,
    and fell after while the objective still improved (docs/reports/2026-11-28-adaptation-noise-level.md);
  - on a non-finite loss, or on collapse (mean |N| below ``collapse_ratio`` of its start; 0: never);
  - with ``decide="change"``, at the first evaluation when the output has moved by less than
    ``first_change_ratio`` (config.FIRST_CHANGE_RATIO) times the RMS of the starting residual N: the
    starting weights are kept.
    Where the plain model already removes most of the noise, the first steps move the output by
    a fraction of its residual and go on to smooth the image; where it misreads the noise as
    signal (real camera noise), they move it by several times its residual
    (docs/reports/2026-11-27-adaptation-decision.md).
The weights kept (``keep``) are the best evaluated ones inside the bounds ("best"), the
latest evaluated ones whose objective is no worse than the starting weights' ("latest"; patience
then counts evaluations above the start), or the last evaluated ones inside the bounds ("last",
OAG's default: there the noise bound, not the objective, guards the image); with "best" and
"latest" the starting weights if none qualifies, so that adaptation never makes the objective
worse than where it started.  "latest" exists because InDeedAG's objective rises for its first
steps and only then falls below the start, while the image keeps improving
(docs/reports/2026-11-27-adaptation-heavy-noise.md).  With "last" and ``stop_at_bound`` (OAG's
default), where the trust region or the noise bound is crossed between two evaluations after the
start, the weights kept lie between them, where the bounded quantity meets its bound
(:meth:`EarlyStopping.fraction_to_bound`, Eq. (stop at the bound) in docs/model.md; the runner moves them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .config import AdaptConfig


@dataclass
class EarlyStopping:
    """The stopping rule for one adaptation, fed one evaluation record at a time."""

    max_change: float
    patience: int  # 0: never stop for lack of improvement
    collapse_ratio: float
    start_abs_N: float  # mean |N| with the starting weights
    best: float  # the best objective so far (at the start: the starting weights')
    best_step: int = 0
    bad: int = 0  # evaluations since the last improvement
    stop: str = "steps"  # why it stopped; "steps" while it runs (and when it ran all its steps)
    keep: str = "best"  # "best" or "latest" (module doc)
    # decide="change": the first evaluation must move the output by at least this share of the
    # starting residual's RMS, or the starting weights are kept (AdaptConfig.first_change_ratio)
    first_change: float | None = None
    start_rms_N: float = 0.0
    evaluations: int = 0
    max_rms_N: float | None = None  # noise_bound x the estimated noise level (8-bit RMS); None: no bound
    # with keep "last" and stop_at_bound: the share of the way from the kept evaluation to the one that
    # crossed a bound at which the kept weights were placed (fraction_to_bound); None: not interpolated
    fraction: float | None = None

    @classmethod
    def start(cls, cfg: AdaptConfig, first: dict, noise_sigma: float | None = None) -> EarlyStopping:
        """The rule for an adaptation whose evaluation at step 0 gave ``first`` (loss, abs_N, rms_N),
        on images whose estimated noise level is ``noise_sigma`` (8-bit units; None: not bounded)."""
        keep = cfg.keep or "best"
        ratio = cfg.first_change_ratio if cfg.decide == "change" else None
        bound = cfg.noise_bound * noise_sigma if cfg.noise_bound and noise_sigma is not None else None
        abs_N = first.get("abs_N", 0.0)  # the recorrupted objective's records have none (collapse_ratio 0)
        return cls(cfg.max_change, cfg.patience or 0, cfg.collapse_ratio, abs_N, first["loss"], keep=keep,
                   first_change=ratio, start_rms_N=first.get("rms_N", 0.0), max_rms_N=bound)  # fmt: skip

    @property
    def running(self) -> bool:
        return self.stop == "steps"

    def update(self, rec: dict) -> bool:
        """Judge one evaluation (step, loss, abs_N, change); True when its weights are the new best."""
        self.evaluations += 1
        if not math.isfinite(rec["loss"]):
            self.stop = "non-finite loss"
        elif (
            self.first_change is not None
            and self.evaluations == 1
            and (rec["change"] < self.first_change * self.start_rms_N)
        ):
            self.stop = "small first change"
        elif self.max_change and rec["change"] > self.max_change:
            self.stop = "trust region"
        elif self.max_rms_N is not None and rec["rms_N"] > self.max_rms_N:
            self.stop = "noise level"
        elif self.collapse_ratio and rec["abs_N"] < self.collapse_ratio * self.start_abs_N:
            self.stop = "collapse"
        elif self.keep == "last":  # every evaluation inside the bounds
            self.best_step, self.bad = rec["step"], 0
            return True
        elif self.keep == "latest" and rec["loss"] <= self.best:  # best stays the start's objective
            self.best_step, self.bad = rec["step"], 0
            return True
        elif self.keep == "best" and rec["loss"] < self.best - 1e-6 * abs(self.best):
            self.best, self.best_step, self.bad = rec["loss"], rec["step"], 0
            return True
        else:
            self.bad += 1
            if self.patience and self.bad >= self.patience:
                self.stop = "no improvement"
        return False

    def fraction_to_bound(self, kept: dict, crossed: dict) -> float | None:
        """Eq. (stop at the bound), docs/model.md: where the trust region or the noise bound stopped an
        adaptation (keep "last") between the kept evaluation ``kept`` (after the start) and the evaluation
        ``crossed`` beyond it, the share t of the way from one to the other at which the bounded quantity,
        linear in between, meets its bound; the smallest t over the bounds crossed, in [0, 1].  None where
        the stop was not a bound's or the kept weights are the start's (whose fallback is the recorrupted
        objective's, whatever the share)."""
        if self.keep != "last" or self.best_step == 0 or self.stop not in ("trust region", "noise level"):
            return None
        limits = [("change", self.max_change or None), ("rms_N", self.max_rms_N)]
        shares = [
            (bound - kept[key]) / (crossed[key] - kept[key])
            for key, bound in limits
            if bound is not None and crossed[key] > bound and crossed[key] > kept[key]
        ]
        return min(1.0, max(0.0, min(shares))) if shares else None


def first_change_ratio(history: list[dict]) -> float | None:
    """What ``decide="change"`` reads off an ELBO adaptation's ``history``: the output's change at the first
    evaluation after the start over the RMS of the starting residual N (docs/model.md, "Which images adapt").
    None where there is no such evaluation, or the records are not the ELBO's (they carry no change)."""
    if len(history) < 2 or "change" not in history[1] or "rms_N" not in history[0]:
        return None
    return history[1]["change"] / max(history[0]["rms_N"], 1e-12)
