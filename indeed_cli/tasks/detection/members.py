"""Detectors of several members: whole detectors trained apart whose maps :func:`.maps.detect`
averages (docs/model.md, Eq. (member mean)); the file format is :mod:`indeed_cli.model.checkpoint`'s."""

from __future__ import annotations

from dataclasses import replace

from ...model import Checkpoint, CheckpointError
from .maps import has_support, readout_scales


def with_members(ckpt: Checkpoint, others: list[Checkpoint] | tuple[Checkpoint, ...]) -> Checkpoint:
    """``ckpt`` with ``others`` (and their own members) appended to its members: a detector whose map
    is the mean of all their maps (docs/model.md, Eq. (member mean)).  Every member must be a
    detector of the same channels whose map is of the same kind (all q(z = 1), or all |mu_S|), so
    that the mean is of one quantity.  The result has no threshold: its read-out is new, so of
    ``extra["detect"]`` only the read-out scales stay (indeed calibrate learns the threshold)."""
    flat = [m for o in others for m in (o, *o.members)]
    for m in flat:
        if m.config.task != "detect" or ckpt.config.task != "detect":
            raise CheckpointError(f"only detectors have members; {m.source or 'a member'} is a {m.config.task} model")
        if m.config.channels != ckpt.config.channels:
            raise CheckpointError(
                f"member {m.source or ''} reads {m.config.channels} channel(s), the detector {ckpt.config.channels}"
            )
        if has_support(m) != has_support(ckpt):
            kind = lambda c: "q(z = 1)" if has_support(c) else "|mu_S|"  # noqa: E731
            raise CheckpointError(
                f"member {m.source or ''} maps {kind(m)}, the detector {kind(ckpt)}: "
                "their mean would mix two quantities"
            )
    members = [*ckpt.members, *(_as_member(m) for m in flat)]
    extra = {**{k: v for k, v in ckpt.extra.items() if k != "detect"}, **_as_member(ckpt).extra}
    return replace(ckpt, extra=extra, members=members, runtime={})


def _as_member(m: Checkpoint) -> Checkpoint:
    """A member keeps its network, training facts and read-out scales (what it maps with), not the
    threshold learned for it alone, nor members of its own (those are flattened by with_members), nor
    a feature memory (the detector's own, if any, is fused with the mean of all members)."""
    extra = {"detect": {"scales": list(readout_scales(m))}}
    return replace(m, extra=extra, members=[], memory=None, runtime={})
