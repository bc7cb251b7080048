"""Checkpoint I/O (safetensors only, never pickle) and resolution of ``--weights``.

A model checkpoint is one ``.safetensors`` file whose metadata holds:
  format          "indeed"
  format_version  "1"
  config          JSON of :class:`indeed_cli.config.ModelConfig`
  training        JSON of training facts (task, data, steps, noise range, ...)
  extra           JSON of deployment facts (e.g. OOD statistics, thresholds)
Weights are stored in float16 to keep shipped files small and loaded as float32.

Resolution order of a ``--weights`` value (docs/checkpoints.md):
  1. empty / "default": the bundled checkpoint for the image's channel count;
  2. a bundled name ("color", "gray", or a file stem in weights/);
  3. "hf://owner/repo/path/file.safetensors[@revision]": huggingface_hub download
     (uses the local cache; honours HF_HUB_OFFLINE);
  4. a local file path.
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
from .networks import InDeed

BUNDLED = {1: "indeed-denoise-gray.safetensors", 3: "indeed-denoise-color.safetensors"}
BUNDLED_DETECT = "indeed-detect-magnetic-tile.safetensors"  # gray; runs per channel on colour images
BUNDLED_NAMES = {"gray": BUNDLED[1], "grey": BUNDLED[1], "color": BUNDLED[3], "colour": BUNDLED[3],
                 "magnetic-tile": BUNDLED_DETECT}


class CheckpointError(Exception):
    """A checkpoint could not be found, read or used; the message is one line."""


@dataclass
class Checkpoint:
    model: InDeed
    config: ModelConfig
    training: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)
    source: str = ""
    _bf16: tuple | None = field(default=None, repr=False, compare=False)  # (weights fingerprint, network)

    def network(self, precision: str = "fp32") -> InDeed:
        """The network that runs inference at ``precision``.

        fp32: ``model`` itself.  bf16: a bf16 copy of it, run without autocast.  Autocast would
        cast every weight on every call and run GroupNorm in fp32 with casts in and out; on an
        H100 the copy made the gray model 11% faster at the same PSNR (docs/benchmarks.md).  The
        copy is made once and made again when ``model``'s weights change (an in-place update
        bumps a tensor's version counter).  A compiled ``model.forward`` (``--compile``) gets a
        compiled copy: the copied attribute would run the fp32 original.
        """
        if precision == "fp32":
            return self.model
        if precision != "bf16":
            raise ValueError(f"precision must be fp32 or bf16, got {precision!r}")
        params = list(self.model.parameters())
        if params and params[0].dtype == torch.bfloat16:
            return self.model
        key = tuple((p.data_ptr(), p._version) for p in params)
        if self._bf16 is None or self._bf16[0] != key:
            net = self.model.detached_copy(torch.bfloat16)
            if "forward" in self.model.__dict__:  # compiled
                net.forward = torch.compile(net.forward, dynamic=False)
            self._bf16 = (key, net)
        return self._bf16[1]


def weights_dir() -> Path:
    """The bundled weights folder: ``$INDEED_WEIGHTS_DIR``, the checkout's weights/, or the installed copy."""
    env = os.environ.get("INDEED_WEIGHTS_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parent
    for cand in (here.parent / "weights", here / "_weights"):
        if cand.is_dir():
            return cand
    return here.parent / "weights"


def save_checkpoint(path: str | Path, model: InDeed, training: dict | None = None,
                    extra: dict | None = None, dtype: torch.dtype = torch.float16) -> Path:
    """Write model weights and metadata atomically (temp file + rename)."""
    path = Path(path)
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    meta = {"format": "indeed", "format_version": str(FORMAT_VERSION), "config": model.cfg.to_json(),
            "training": json.dumps(training or {}, sort_keys=True), "extra": json.dumps(extra or {}, sort_keys=True)}
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        save_file(tensors, str(tmp), metadata=meta)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_metadata(path: str | Path) -> dict:
    """Metadata of a checkpoint without loading its tensors; raises CheckpointError."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except (SafetensorsError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"not a readable safetensors checkpoint: {path} ({str(e).splitlines()[0][:120]})") from None
    if meta.get("format") != "indeed":
        raise CheckpointError(f"not an indeed checkpoint (no 'format: indeed' metadata): {path}")
    if meta.get("format_version") != str(FORMAT_VERSION):
        raise CheckpointError(f"checkpoint format version {meta.get('format_version')!r} is not supported "
                              f"(this indeed reads {FORMAT_VERSION}): {path}")
    try:
        return {"config": json.loads(meta["config"]), "training": json.loads(meta.get("training", "{}")),
                "extra": json.loads(meta.get("extra", "{}"))}
    except (KeyError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint metadata is damaged ({e}): {path}") from None


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> Checkpoint:
    """Rebuild the model from the metadata config and load its weights (float32, eval mode)."""
    meta = read_metadata(path)
    try:
        cfg = ModelConfig.from_dict(meta["config"])
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"checkpoint config is invalid ({e}): {path}") from None
    try:
        state = load_file(str(path))
    except (SafetensorsError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint tensors are unreadable: {path} ({str(e).splitlines()[0][:120]})") from None
    model = InDeed(cfg)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"checkpoint does not match its config: {len(missing)} missing, "
                              f"{len(unexpected)} unexpected tensors (e.g. {(missing + unexpected)[0]}): {path}")
    for k, v in state.items():
        if v.shape != expected[k].shape:
            raise CheckpointError(f"checkpoint tensor {k} has shape {tuple(v.shape)}, "
                                  f"config needs {tuple(expected[k].shape)}: {path}")
        if not torch.isfinite(v).all():
            raise CheckpointError(f"checkpoint tensor {k} holds NaN or Inf: {path}")
    model.load_state_dict({k: v.float() for k, v in state.items()})
    model.to(device).eval()
    if torch.device(device).type == "cuda":  # cuDNN's fast convolution layout
        model.to(memory_format=torch.channels_last)
    return Checkpoint(model, cfg, meta["training"], meta["extra"], str(path))


def parse_hub_ref(ref: str) -> tuple[str, str, str | None]:
    """'hf://owner/repo/dir/file.safetensors@rev' -> (repo_id, filename, revision)."""
    body = ref[len("hf://"):]
    revision = None
    if "@" in body:
        body, revision = body.rsplit("@", 1)
        revision = revision or None
    parts = body.split("/")
    if len(parts) < 3 or not all(parts):
        raise CheckpointError(f"Hub reference must look like hf://owner/repo/file.safetensors[@revision]: {ref}")
    return "/".join(parts[:2]), "/".join(parts[2:]), revision


def download_from_hub(ref: str) -> Path:
    """Fetch a Hub checkpoint through huggingface_hub's cache; one-line errors."""
    repo_id, filename, revision = parse_hub_ref(ref)
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - huggingface_hub is a dependency
        raise CheckpointError("huggingface_hub is not installed; cannot resolve " + ref) from None
    try:
        return Path(hf_hub_download(repo_id=repo_id, filename=filename, revision=revision))
    except LocalEntryNotFoundError:
        offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
        why = "HF_HUB_OFFLINE is set" if offline else "the Hub could not be reached"
        raise CheckpointError(f"{ref}: not in the local Hugging Face cache and {why}") from None
    except Exception as e:  # network, auth, missing repo/file: all become one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{ref}: download failed ({type(e).__name__}: {first[:160]})") from None


def resolve_weights(spec: str | None, channels: int | None = None, task: str = "denoise") -> Path:
    """Turn a ``--weights`` value into a local checkpoint path (see module docstring)."""
    wdir = weights_dir()
    if not spec or spec == "default":
        name = BUNDLED_DETECT if task == "detect" else BUNDLED.get(channels or 3)
        path = wdir / name
        if not path.is_file():
            raise CheckpointError(f"bundled default checkpoint missing: {path} (pass --weights PATH)")
        return path
    if spec.startswith("hf://"):
        return download_from_hub(spec)
    if spec in BUNDLED_NAMES:
        return wdir / BUNDLED_NAMES[spec]
    bundled = wdir / f"{spec}.safetensors"
    if "/" not in spec and bundled.is_file():
        return bundled
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    raise CheckpointError(f"weights not found: {spec!r} (tried: a file path, {bundled}, "
                          f"bundled names {sorted(set(BUNDLED_NAMES))}, hf://owner/repo/file)")


def list_checkpoints(include_cache: bool = True) -> list[dict]:
    """Bundled checkpoints and indeed checkpoints in the Hugging Face cache, with metadata."""
    rows = []
    for p in sorted(weights_dir().glob("*.safetensors")):
        rows.append(_describe(p, "bundled", p.stem))
    if include_cache:
        try:
            from huggingface_hub import scan_cache_dir
            info = scan_cache_dir()
            for repo in info.repos:
                for rev in repo.revisions:
                    for f in rev.files:
                        if f.file_name.endswith(".safetensors"):
                            ref = f"hf://{repo.repo_id}/{f.file_name}@{rev.commit_hash}"
                            rows.append(_describe(Path(f.file_path), "hub-cache", ref))
        except Exception:  # no cache yet, or unreadable: listing bundled ones is still useful
            pass
    return rows


def _describe(path: Path, origin: str, name: str) -> dict:
    row = {"name": name, "origin": origin, "path": str(path), "size_mb": round(path.stat().st_size / 1e6, 2)}
    try:
        meta = read_metadata(path)
        cfg = meta["config"]
        extra = meta["extra"]
        row.update(task=cfg.get("task"), channels=cfg.get("channels"), rank=cfg.get("rank"),
                   training=meta["training"],
                   # the deployment thresholds, not the OOD training points (tens of kB)
                   ood_threshold=(extra.get("ood") or {}).get("threshold"),
                   detect_threshold=(extra.get("detect") or {}).get("threshold"))
    except CheckpointError as e:
        row["error"] = str(e)
    return row
