"""Checkpoint I/O: safetensors only, never pickle.

A model checkpoint is one ``.safetensors`` file whose metadata holds:
  format          "indeed"
  format_version  "1"
  config          JSON of :class:`indeed_cli.config.ModelConfig`
  training        JSON of training facts (task, data, steps, noise range, ...)
  extra           JSON of deployment facts (e.g. OOD statistics, thresholds)
Weights are stored in float16 to keep shipped files small and loaded as float32. A file may hold
its largest convolutions in int8 with one float16 scale per output channel (``int8_min_weights``;
format_version "2", docs/checkpoints.md): the gray denoiser's U-Net bottleneck is stored so. A
detector may hold further members, whole networks of their own whose support maps are averaged
with the first's (format_version "3"; metadata ``members``, tensors ``member<k>.<name>``), and a
memory of normal image features (:mod:`.memory`; format_version "4"; metadata ``memory``, tensors
``memory.bank_t`` (int8, by feature channel, with its scales), ``memory.density`` and ``memory.trunk.<name>`` unless a
network of the file holds the same trunk as f_thetaM's features). A memory whose bank is stored in
4 bits (metadata ``memory.bits`` 4) holds ``memory.bank_t4`` instead, two values a byte with each
feature channel's minimum and step (format_version "5"). A file whose int8-sized convolutions are
stored in 4 bits instead (metadata ``weight_bits`` 4; Eq. (4-bit weights)) holds them as packed
uint8 codes with one float16 scale per output channel (``NAME.q4_scale``; format_version "6").

Where a ``--weights`` value points (bundled names, paths, the Hub): :mod:`.registry`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError as SafetensorsError
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from .config import FORMAT_VERSION, ModelConfig
from .memory import FeatureMemory, check_bank_bits
from .network import InDeed

# the version of files that hold int8 tensors; readers of FORMAT_VERSION alone refuse them clearly
INT8_FORMAT_VERSION = 2
# the version of files that hold several member networks (a detector's members, below): readers of
# versions 1 and 2 would load the first network alone and refuse the unknown tensors unclearly
MEMBERS_FORMAT_VERSION = 3
# the version of files that hold a detector's memory of normal features (below): readers of versions
# 1 to 3 would refuse its tensors as not matching the config, without saying why
MEMORY_FORMAT_VERSION = 4
# the version of files whose memory bank is stored in 4 bits: readers of version 4 would call the
# memory damaged (no int8 bank) instead of saying that the file is newer than they are
BANK4_FORMAT_VERSION = 5
# the version of files whose largest convolutions are stored in 4 bits: readers of version 5 would
# refuse their uint8 codes as not matching the config, without saying why
WEIGHTS4_FORMAT_VERSION = 6
READABLE_VERSIONS = tuple(
    str(v)
    for v in (
        FORMAT_VERSION, INT8_FORMAT_VERSION, MEMBERS_FORMAT_VERSION, MEMORY_FORMAT_VERSION, BANK4_FORMAT_VERSION,
        WEIGHTS4_FORMAT_VERSION,
    )
)  # fmt: skip
MEMBER_PREFIX = "member"
MEMORY_PREFIX = "memory."
INT8_SCALE_SUFFIX = ".int8_scale"
# a 4-bit convolution's per-output-channel scales (its codes are the tensor of its own name, uint8)
Q4_SCALE_SUFFIX = ".q4_scale"
# bits per weight the convolutions of at least int8_min_weights weights may be stored in
WEIGHT_BITS = (8, 4)
# a 4-bit bank's tensors: the packed codes, and each feature channel's minimum and step
BANK4, BANK4_MIN_SUFFIX, BANK4_STEP_SUFFIX = "bank_t4", ".q4_min", ".q4_step"
# convolutions of at least this many weights may be stored in int8: in the gray denoiser these are
# the 8 bottleneck convolutions (256 x 256 x 3 x 3), 9.4 of its 16.2 MB in float16; int8 there moved
# mean PSNR on Set12 and BSD68 by at most 0.001 dB at sigma 15/25/50, int8 in every convolution of
# at least 4,096 weights by up to 0.007 (docs/reports/2026-11-28-features-and-int8.md)
INT8_MIN_WEIGHTS = 2**19


class CheckpointError(Exception):
    """A checkpoint could not be found, read or used; the message is one line."""


@dataclass
class Checkpoint:
    model: InDeed
    config: ModelConfig
    training: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    source: str = ""
    # the int8 storage rule of the file it came from (save_checkpoint's int8_min_weights), so that
    # rewriting it (indeed calibrate) keeps the file's size
    int8_min_weights: int | None = None
    # the bits per weight those convolutions are stored in (8: int8, 4: Eq. (4-bit weights))
    weight_bits: int = 8
    # networks derived for inference (a bf16 copy, compiled wrappers), keyed and filled by
    # indeed_cli.inference.runtime; never saved
    runtime: dict = field(default_factory=dict, repr=False, compare=False)
    # a detector's further members: whole detectors of their own (their training facts, and their
    # read-out scales in extra["detect"]["scales"]), whose maps indeed_cli.tasks.detection averages
    # with this one's; the threshold in this checkpoint's extra belongs to that mean
    members: list[Checkpoint] = field(default_factory=list)
    # a detector's memory of normal image features (Eq. normal feature distance), whose distance map
    # indeed_cli.tasks.detection fuses with the members' mean map; None: no memory
    memory: FeatureMemory | None = None


def save_checkpoint(
    path: str | Path,
    model: InDeed,
    training: dict | None = None,
    extra: dict | None = None,
    dtype: torch.dtype = torch.float16,
    int8_min_weights: int | None = None,
    members: list[Checkpoint] | tuple[Checkpoint, ...] = (),
    memory: FeatureMemory | None = None,
    weight_bits: int = 8,
) -> Path:
    """Write model weights and metadata atomically (temp file + rename).

    ``int8_min_weights``: convolution kernels with at least this many weights are stored as int8
    (:func:`quantize_int8`), or in 4 bits where ``weight_bits`` is 4 (:func:`quantize_4bit_weights`;
    every convolution of at least :data:`INT8_MIN_WEIGHTS` where ``int8_min_weights`` is None); None
    stores every tensor in ``dtype``.  ``members``: a detector's further
    members (:attr:`Checkpoint.members`), stored with their config, training facts and extra; their
    own members are not kept (``tasks.detection.with_members`` flattens them).  ``memory``: a
    detector's memory of normal features (:attr:`Checkpoint.memory`): its bank in int8 by feature
    channel, its trunk in ``dtype`` unless a network of the file holds the same (:func:`_memory_tensors`)."""
    path = Path(path)
    if members and model.cfg.task != "detect":
        raise ValueError(f"only detectors have members; this is a {model.cfg.task} model")
    if memory is not None and model.cfg.task != "detect":
        raise ValueError(f"only detectors have a feature memory; this is a {model.cfg.task} model")
    int8_min_weights = _storage_rule(int8_min_weights, weight_bits)
    tensors = _tensors(model, dtype, int8_min_weights, weight_bits)
    for k, member in enumerate(members, 1):
        own = _tensors(member.model, dtype, int8_min_weights, weight_bits)
        tensors.update({f"{MEMBER_PREFIX}{k}.{n}": v for n, v in own.items()})
    int8 = any(v.dtype == torch.int8 for v in tensors.values())
    four = any(n.endswith(Q4_SCALE_SUFFIX) for n in tensors)
    if memory is not None:
        shared = shared_trunk(memory, [model, *(m.model for m in members)])
        tensors.update(_memory_tensors(memory, dtype, with_trunk=shared is None))
    version = (
        WEIGHTS4_FORMAT_VERSION if four
        else BANK4_FORMAT_VERSION if memory is not None and memory.bits == 4
        else MEMORY_FORMAT_VERSION if memory is not None
        else MEMBERS_FORMAT_VERSION if members else INT8_FORMAT_VERSION if int8 else FORMAT_VERSION
    )  # fmt: skip
    meta = {
        "format": "indeed",
        "format_version": str(version),
        "config": model.cfg.to_json(),
        "training": json.dumps(training or {}, sort_keys=True),
        "extra": json.dumps(extra or {}, sort_keys=True),
    }
    if int8 or four:
        meta["int8_min_weights"] = str(int8_min_weights)
    if four:
        meta["weight_bits"] = "4"
    if members:
        described = [
            {"config": json.loads(m.config.to_json()), "training": m.training, "extra": m.extra} for m in members
        ]
        meta["members"] = json.dumps(described, sort_keys=True)
    if memory is not None:
        described = {"features": memory.name, "entries": memory.entries}
        if memory.bits != 8:  # 8-bit files say nothing, as they did before there was a choice
            described["bits"] = memory.bits
        if shared is not None:
            described["trunk"] = shared
        meta["memory"] = json.dumps(described, sort_keys=True)
    return write_safetensors_atomically(path, tensors, meta)


def shared_trunk(memory: FeatureMemory, networks: list[InDeed]) -> str | None:
    """Where a network of the file (0: the detector, k: member k) already holds the memory's trunk
    as f_thetaM's features, with the same weights as stored (float16): that one, which the memory
    then reads its trunk from instead of a copy of its own; None otherwise."""
    mine = {k: v.to(torch.float16) for k, v in memory.trunk.state_dict().items()}
    for k, net in enumerate(networks):
        feats = getattr(getattr(net, "support", None), "features", None)
        if feats is None or net.cfg.support_features != memory.name:
            continue
        theirs = feats.state_dict()
        if theirs.keys() == mine.keys() and all(torch.equal(theirs[n].to(torch.float16), v) for n, v in mine.items()):
            return str(k)
    return None


def stored_bank(bank: torch.Tensor, bits: int = 8) -> torch.Tensor:
    """A memory bank (entries, 152) as a file stores and gives it back in ``bits`` per value (int8
    by feature channel, :func:`quantize_int8`, or 4 bits, :func:`quantize_4bit`), dequantised, so
    that statistics learned on it hold for the saved file."""
    t = bank.detach().to("cpu").T
    if check_bank_bits(bits) == 4:
        back = dequantize_4bit(*quantize_4bit(t), count=t.shape[1])
    else:
        back = dequantize_int8(*quantize_int8(t))
    return back.T.contiguous().to(bank.device)


def _memory_tensors(memory: FeatureMemory, dtype: torch.dtype, with_trunk: bool) -> dict[str, torch.Tensor]:
    """The memory as stored: its bank by feature channel (the bank is most of the memory's size) in
    int8 with one float16 scale per channel (:func:`quantize_int8` on its transpose) or in 4 bits
    (:func:`quantize_4bit`) as ``memory.bits`` says, its trunk in ``dtype`` unless another network
    of the file holds the same trunk, its density radii in float32."""
    t = memory.bank.detach().to("cpu").T
    if memory.bits == 4:
        codes, low, step = quantize_4bit(t)
        out = {MEMORY_PREFIX + BANK4: codes, MEMORY_PREFIX + BANK4 + BANK4_MIN_SUFFIX: low,
               MEMORY_PREFIX + BANK4 + BANK4_STEP_SUFFIX: step}  # fmt: skip
    else:
        q, scale = quantize_int8(t)
        out = {MEMORY_PREFIX + "bank_t": q, MEMORY_PREFIX + "bank_t" + INT8_SCALE_SUFFIX: scale}
    out[MEMORY_PREFIX + "density"] = memory.density.detach().to("cpu", torch.float32).contiguous()
    if with_trunk:
        out.update({f"{MEMORY_PREFIX}trunk.{n}": v.detach().to("cpu", dtype).contiguous()
                    for n, v in memory.trunk.state_dict().items()})  # fmt: skip
    return out


def check_weight_bits(bits: int, option: str = "weight_bits") -> int:
    """``bits`` where a file can store its largest convolutions in that many bits; ValueError otherwise."""
    if bits not in WEIGHT_BITS:
        raise ValueError(f"{option} must be 8 or 4, not {bits}")
    return bits


def _storage_rule(int8_min_weights: int | None, weight_bits: int) -> int | None:
    """The ``int8_min_weights`` a file is stored by: its own, or :data:`INT8_MIN_WEIGHTS` where
    4-bit storage is asked of a file that stored every tensor in float16."""
    check_weight_bits(weight_bits)
    return INT8_MIN_WEIGHTS if weight_bits == 4 and int8_min_weights is None else int8_min_weights


def _stored_large(v: torch.Tensor, int8_min_weights: int | None) -> bool:
    """Whether a tensor is one of the convolutions a file stores in int8 or 4 bits."""
    return int8_min_weights is not None and v.dim() == 4 and v.numel() >= int8_min_weights


def _tensors(
    model: InDeed, dtype: torch.dtype, int8_min_weights: int | None, weight_bits: int = 8
) -> dict[str, torch.Tensor]:
    """A network's state as stored: ``dtype``, or int8 (4 bits) with scales for the largest convolutions."""
    tensors = {}
    for k, v in model.state_dict().items():
        v = v.detach().to("cpu")
        if _stored_large(v, int8_min_weights) and weight_bits == 4:
            tensors[k], tensors[k + Q4_SCALE_SUFFIX] = quantize_4bit_weights(v)
        elif _stored_large(v, int8_min_weights):
            tensors[k], tensors[k + INT8_SCALE_SUFFIX] = quantize_int8(v)
        else:
            tensors[k] = v.to(dtype).contiguous()
    return tensors


def _process_umask() -> int:
    """The process's umask, read once at import (os.umask can only be read by setting it, which is not
    safe while writer threads create files)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


UMASK = _process_umask()


def write_safetensors_atomically(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> Path:
    """safetensors to a temporary file beside ``path``, then renamed: never a half-written file.  The file
    gets the permissions any other output gets (0666 less the umask): safetensors creates its files 0600,
    which left checkpoints unreadable to the rest of a group on a shared machine."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        save_file(tensors, str(tmp), metadata=meta)
        os.chmod(tmp, 0o666 & ~UMASK)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _safetensors_metadata(path: Path, what: str) -> dict[str, str]:
    """The metadata of a safetensors file that exists; CheckpointError naming ``what`` otherwise."""
    try:
        with safe_open(str(path), framework="pt") as f:
            return f.metadata() or {}
    except (SafetensorsError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"not a readable safetensors {what}: {path} ({str(e).splitlines()[0][:120]})") from None


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per output channel: q = round(w / s) with s = max|w| / 127 over the channel's
    weights, s kept in float16 (the dequantised weight is q * s, :func:`dequantize_int8`)."""
    w = weight.float()
    scale = (w.flatten(1).abs().amax(1) / 127.0).clamp_min(1e-12).half()
    s = scale.float().view(-1, *([1] * (w.dim() - 1)))
    return torch.round(w / s).clamp(-127, 127).to(torch.int8).contiguous(), scale.contiguous()


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 weights from :func:`quantize_int8`'s int8 values and per-output-channel scales."""
    return q.float() * scale.float().view(-1, *([1] * (q.dim() - 1)))


def quantize_4bit_weights(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. (4-bit weights) of docs/model.md, symmetric 4 bits per output channel of a convolution:
    q = round(w / s) in -7..7 with s = max|w| / 7 over the channel's weights, kept in float16; the
    codes q + 8 two a byte along the channel's flattened weights (the even one in the low half, a
    last odd one padded). Returns (codes (out, ceil(n/2)) uint8, s (out,) float16)."""
    w = weight.float().flatten(1)
    scale = (w.abs().amax(1) / 7.0).clamp_min(1e-12).half()
    q = (torch.round(w / scale.float()[:, None]).clamp(-7, 7) + 8).to(torch.uint8)
    if q.shape[1] % 2:
        q = torch.cat([q, torch.full_like(q[:, :1], 8)], 1)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous(), scale.contiguous()


def dequantize_4bit_weights(codes: torch.Tensor, scale: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    """The float32 convolution of ``shape`` from :func:`quantize_4bit_weights`: w = (code - 8) s."""
    count = 1
    for d in shape[1:]:
        count *= d
    if codes.dtype != torch.uint8 or tuple(codes.shape) != (shape[0], -(-count // 2)) or scale.numel() != shape[0]:
        raise ValueError(f"4-bit codes of shape {tuple(codes.shape)} do not hold a weight of shape {tuple(shape)}")
    q = torch.stack([codes & 15, codes >> 4], -1).flatten(1)[:, :count].float() - 8
    return (q * scale.float()[:, None]).view(shape)


def stored_weights(model: InDeed, int8_min_weights: int | None, weight_bits: int) -> InDeed:
    """``model`` with its convolutions of at least ``int8_min_weights`` weights rounded in place to
    what a file stores of them in ``weight_bits`` (int8 or Eq. (4-bit weights)), so that statistics
    learned on it (a threshold, a memory read through its trunk) hold for the saved file."""
    int8_min_weights = _storage_rule(int8_min_weights, weight_bits)
    with torch.no_grad():
        for p in model.parameters():
            if not _stored_large(p, int8_min_weights):
                continue
            if weight_bits == 4:
                back = dequantize_4bit_weights(*quantize_4bit_weights(p.detach().cpu()), tuple(p.shape))
            else:
                back = dequantize_int8(*quantize_int8(p.detach().cpu()))
            p.copy_(back.to(p.device, p.dtype))
    return model


def quantize_4bit(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eq. (4-bit bank) of docs/model.md, asymmetric 4 bits per row of a (rows, n) tensor (a memory
    bank by feature channel): q = round((x - lo) / s) in 0..15, with lo the row's minimum and
    s = (max - lo) / 15, both kept in float16; two codes a byte (the even column
    in the low half), a last odd column padded. Returns (codes (rows, ceil(n/2)) uint8, lo, s)."""
    x = rows.float()
    low = x.amin(1).half()
    step = ((x.amax(1) - low.float()) / 15).clamp_min(1e-7).half()
    q = ((x - low.float()[:, None]) / step.float()[:, None]).round().clamp(0, 15).to(torch.uint8)
    if q.shape[1] % 2:
        q = torch.cat([q, torch.zeros_like(q[:, :1])], 1)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous(), low.contiguous(), step.contiguous()


def dequantize_4bit(codes: torch.Tensor, low: torch.Tensor, step: torch.Tensor, count: int) -> torch.Tensor:
    """The float32 (rows, count) tensor of :func:`quantize_4bit`'s codes, Eq. (4-bit bank): lo + q s."""
    q = torch.stack([codes & 15, codes >> 4], -1).flatten(1)[:, :count]
    return q.float() * step.float()[:, None] + low.float()[:, None]


def _dequantized(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state with every int8 tensor replaced by its float32 weights and the scales removed."""
    out = {}
    for k, v in state.items():
        if k.endswith(INT8_SCALE_SUFFIX):
            continue
        if v.dtype == torch.int8:
            scale = state.get(k + INT8_SCALE_SUFFIX)
            if scale is None or scale.numel() != v.shape[0]:
                raise ValueError(f"int8 tensor {k} has no matching {INT8_SCALE_SUFFIX}")
            v = dequantize_int8(v, scale)
        out[k] = v
    return out


def read_metadata(path: str | Path) -> dict:
    """Metadata of a checkpoint without loading its tensors; raises CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    meta = _safetensors_metadata(path, "checkpoint")
    if meta.get("format") != "indeed":
        raise CheckpointError(f"not an indeed checkpoint (no 'format: indeed' metadata): {path}")
    if meta.get("format_version") not in READABLE_VERSIONS:
        raise CheckpointError(
            f"checkpoint format version {meta.get('format_version')!r} is not supported "
            f"(this indeed reads {' and '.join(READABLE_VERSIONS)}): {path}"
        )
    try:
        return {
            "config": json.loads(meta["config"]),
            "training": json.loads(meta.get("training", "{}")),
            "extra": json.loads(meta.get("extra", "{}")),
            "int8_min_weights": int(meta["int8_min_weights"]) if "int8_min_weights" in meta else None,
            "weight_bits": int(meta.get("weight_bits", 8)),
            "members": json.loads(meta.get("members", "[]")),
            "memory": json.loads(meta["memory"]) if "memory" in meta else None,
        }
    except (KeyError, ValueError) as e:  # json.JSONDecodeError is a ValueError
        raise CheckpointError(f"checkpoint metadata is damaged ({e}): {path}") from None


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> Checkpoint:
    """Rebuild the model from the metadata config and load its weights (float32, eval mode; int8
    tensors are dequantised), and so each member of a detector that has them."""
    meta = read_metadata(path)
    try:
        state = _dequantized(load_file(str(path)))
    except (SafetensorsError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint tensors are unreadable: {path} ({str(e).splitlines()[0][:120]})") from None
    memory_state = {n[len(MEMORY_PREFIX) :]: state.pop(n) for n in list(state) if n.startswith(MEMORY_PREFIX)}
    members = []
    for k, described in enumerate(meta["members"], 1):
        prefix = f"{MEMBER_PREFIX}{k}."
        own = {n[len(prefix) :]: state.pop(n) for n in [n for n in state if n.startswith(prefix)]}
        if not isinstance(described, dict) or "config" not in described:
            raise CheckpointError(f"checkpoint metadata is damaged (member {k} has no config): {path}")
        model = _network(described["config"], own, path, f"member {k} ")
        facts, extra = described.get("training", {}), described.get("extra", {})
        members.append(Checkpoint(model, model.cfg, facts, extra, f"{path}#member{k}"))
    model = _network(meta["config"], state, path)
    memory = _memory(meta["memory"], memory_state, [model, *(m.model for m in members)], path)
    if memory is not None:
        memory.to(device).eval()
    for m in (model, *(m.model for m in members)):
        m.to(device).eval()
        # channels-last weights: cuDNN's fast layout, and oneDNN's on a CPU (a 512x512 colour image took
        # 2.32 s in NCHW, 1.80-1.85 s so on a 2-core AVX2 CPU; outputs differ by < 1e-6; docs/results.md)
        m.to(memory_format=torch.channels_last)
    return Checkpoint(
        model, model.cfg, meta["training"], meta["extra"], str(path), int8_min_weights=meta["int8_min_weights"],
        weight_bits=meta["weight_bits"], members=members, memory=memory,
    )  # fmt: skip


def _memory(
    described: dict | None, state: dict[str, torch.Tensor], networks: list[InDeed], path
) -> FeatureMemory | None:
    """The feature memory that ``described`` (the metadata) and ``state`` (its tensors, the bank
    stored by channel) give, its trunk from ``networks[described["trunk"]]``'s f_thetaM where the
    file shares it; None when the file has none; CheckpointError when they do not agree."""
    if described is None and not state:
        return None
    try:
        entries, bits = int(described["entries"]), int(described.get("bits", 8))
        memory = FeatureMemory(entries, described["features"], bits)
        if bits == 4:
            codes = state.pop(BANK4)
            low, step = state.pop(BANK4 + BANK4_MIN_SUFFIX), state.pop(BANK4 + BANK4_STEP_SUFFIX)
            if codes.dtype != torch.uint8 or codes.shape[1] != -(-entries // 2):
                raise ValueError(f"a 4-bit bank of {entries} entries has codes of shape {tuple(codes.shape)}")
            state["bank_t"] = dequantize_4bit(codes, low, step, entries)
        state = {("bank" if k == "bank_t" else k): (v.T if k == "bank_t" else v) for k, v in state.items()}
        if "trunk" in described:
            trunk = networks[int(described["trunk"])].support.features.state_dict()
            state.update({f"trunk.{k}": v for k, v in trunk.items()})
        # files made before the density radii (Eq. memory density) hold none: radii 1, the plain
        # distance they were calibrated with
        state.setdefault("density", torch.ones(int(described["entries"])))
        memory.load_state_dict({k: v.float().contiguous() for k, v in state.items()})
    except (TypeError, KeyError, ValueError, RuntimeError, IndexError, AttributeError) as e:
        raise CheckpointError(
            f"checkpoint feature memory is damaged ({str(e).splitlines()[0][:120]}): {path}"
        ) from None
    if not (torch.isfinite(memory.bank).all() and torch.isfinite(memory.density).all() and (memory.density > 0).all()):
        raise CheckpointError(f"checkpoint feature memory holds NaN, Inf or a radius not above 0: {path}")
    return memory


def _network(config: dict, state: dict[str, torch.Tensor], path, what: str = "") -> InDeed:
    """The network of ``config`` with the float32 weights of ``state``; CheckpointError naming
    ``what`` (a member) and ``path`` if the config is invalid or the tensors do not fit it."""
    try:
        cfg = ModelConfig.from_dict(config)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint {what}config is invalid ({e}): {path}") from None
    model = InDeed(cfg)
    expected = model.state_dict()
    for k in [k for k in state if k.endswith(Q4_SCALE_SUFFIX)]:  # Eq. (4-bit weights), by the config's shapes
        name, scale = k[: -len(Q4_SCALE_SUFFIX)], state.pop(k)
        try:
            state[name] = dequantize_4bit_weights(state[name], scale, tuple(expected[name].shape))
        except (KeyError, ValueError) as e:
            raise CheckpointError(f"checkpoint {what}4-bit tensor {name} is damaged ({e}): {path}") from None
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(
            f"checkpoint {what}does not match its config: {len(missing)} missing, "
            f"{len(unexpected)} unexpected tensors (e.g. {(missing + unexpected)[0]}): {path}"
        )
    for k, v in state.items():
        if v.shape != expected[k].shape:
            raise CheckpointError(
                f"checkpoint {what}tensor {k} has shape {tuple(v.shape)}, "
                f"config needs {tuple(expected[k].shape)}: {path}"
            )
        if not torch.isfinite(v).all():
            raise CheckpointError(f"checkpoint {what}tensor {k} holds NaN or Inf: {path}")
    model.load_state_dict({k: v.float() for k, v in state.items()})
    return model


FEATURES_FORMAT = "indeed-features"


def save_feature_trunk(path: str | Path, state: dict[str, torch.Tensor], name: str, source: str) -> Path:
    """Write the weights of a frozen feature trunk (:mod:`.features`) for ``indeed train --support-features``:
    float16 safetensors (as a checkpoint stores them) with metadata format "indeed-features", the
    trunk's name and its source."""
    path = Path(path)
    tensors = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in state.items()}
    return write_safetensors_atomically(path, tensors, {"format": FEATURES_FORMAT, "name": name, "source": source})


def read_feature_trunk(path: str | Path, name: str) -> dict[str, torch.Tensor]:
    """The weights of a file of :func:`save_feature_trunk` holding the trunk ``name``; raises CheckpointError."""
    if not path:
        raise CheckpointError(
            f"f_thetaM reads {name} features: give their weights (--support-features FILE; "
            "tools/import_efficientnet_lite0.py writes them)"
        )
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"feature weights not found: {path}")
    meta = _safetensors_metadata(path, "file")
    if meta.get("format") != FEATURES_FORMAT or meta.get("name") != name:  # before reading any tensor
        raise CheckpointError(f"{path} holds no {name} feature weights (its name: {meta.get('name')!r})")
    try:
        return load_file(str(path))
    except (SafetensorsError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"feature weights are unreadable: {path} ({str(e).splitlines()[0][:120]})") from None


def load_support_features(model: InDeed, path: str | Path) -> None:
    """Load the frozen ImageNet trunk of f_thetaM from a file of :func:`save_feature_trunk`; raises
    CheckpointError if the model reads no features, or the file is missing or holds another trunk."""
    support = getattr(model, "support", None)
    if support is None or support.features is None:
        raise CheckpointError("this model's f_thetaM reads no image features")
    state = read_feature_trunk(path, model.cfg.support_features)
    try:
        support.features.load_state_dict({k: v.float() for k, v in state.items()})
    except RuntimeError as e:
        raise CheckpointError(
            f"{path} does not fit the {model.cfg.support_features} trunk ({str(e).splitlines()[0][:120]})"
        ) from None
