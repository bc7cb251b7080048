"""Where checkpoints come from: the bundled weights, local paths and the Hugging Face Hub.

Resolution order of a ``--weights`` value (docs/checkpoints.md):
  1. empty / "default": the bundled checkpoint for the image's channel count and the job
     (``DEFAULTS``: colour images are denoised with "color-fullchroma", decomposed with
     "color-rank" and adapted from "color");
  2. a bundled name ("color", "gray", "color-fullchroma", "color-rank", "color-camera",
     "magnetic-tile", or a file stem in weights/);
  3. "hf://owner/repo/path/file.safetensors[@revision]": huggingface_hub download
     (uses the local cache; honours HF_HUB_OFFLINE);
  4. a local file path.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from .checkpoint import CheckpointError, read_metadata

BUNDLED = {1: "indeed-denoise-gray.safetensors", 3: "indeed-denoise-color.safetensors"}
BUNDLED_DETECT = "indeed-detect-magnetic-tile.safetensors"  # gray; runs per channel on colour images
# the colour model fine-tuned on full-chroma photographs: better on them, but InDeedAG in bf16 no
# longer gains on real camera noise with it, so it is not the default (weights/README.md)
BUNDLED_FULLCHROMA = "indeed-denoise-color-fullchroma.safetensors"
# color-fullchroma fine-tuned with half its patches under camera noise (indeed train --camera-noise):
# for photographs straight from a camera; a little below the others on Gaussian noise (weights/README.md)
BUNDLED_CAMERA = "indeed-denoise-color-camera.safetensors"
# color-fullchroma fine-tuned with rank supervision (indeed train --rank-supervision): its rank index n
# follows the image's SVD rank, for 0.01-0.05 dB of denoising (weights/README.md)
BUNDLED_RANK = "indeed-denoise-color-rank.safetensors"
# frozen ImageNet trunks that f_thetaM may read (model.features), by ModelConfig.support_features name
BUNDLED_FEATURES = {"efficientnet-lite0": "features/efficientnet-lite0.safetensors"}
# the default checkpoint per job and channel count.  Colour images are denoised with the full-chroma
# model (equal or better on AWGN almost everywhere, +0.8 dB on full-chroma photographs) but adapted
# from `color`: InDeedAG and InDeedOAG gain on real camera noise from it and not from the
# full-chroma fine-tunes (docs/reports/2026-11-27-flat-images.md; weights/README.md), and decomposed with
# the rank-supervised model, whose rank index n says something about the image (the reason to
# decompose) at a cost of 0.01-0.05 dB that denoising need not pay (docs/reports/2026-11-28-rank-full-data.md)
DEFAULTS = {
    "denoise": {1: BUNDLED[1], 3: BUNDLED_FULLCHROMA},
    "decompose": {1: BUNDLED[1], 3: BUNDLED_RANK},
    "adapt": {1: BUNDLED[1], 3: BUNDLED[3]},
}
# the name `indeed models` shows for each bundled file: the shortest one --weights takes
SHORT_NAMES = {
    BUNDLED[1]: "gray",
    BUNDLED[3]: "color",
    BUNDLED_FULLCHROMA: "color-fullchroma",
    BUNDLED_CAMERA: "color-camera",
    BUNDLED_RANK: "color-rank",
    BUNDLED_DETECT: "magnetic-tile",
}
BUNDLED_NAMES = {
    "gray": BUNDLED[1],
    "grey": BUNDLED[1],
    "color": BUNDLED[3],
    "colour": BUNDLED[3],
    "color-fullchroma": BUNDLED_FULLCHROMA,
    "colour-fullchroma": BUNDLED_FULLCHROMA,
    "color-camera": BUNDLED_CAMERA,
    "colour-camera": BUNDLED_CAMERA,
    "color-rank": BUNDLED_RANK,
    "colour-rank": BUNDLED_RANK,
    "magnetic-tile": BUNDLED_DETECT,
}


def weights_dir() -> Path:
    """The bundled weights folder: ``$INDEED_WEIGHTS_DIR``, the checkout's weights/, or the installed copy."""
    env = os.environ.get("INDEED_WEIGHTS_DIR")
    if env:
        return Path(env)
    package = Path(__file__).resolve().parents[1]
    for cand in (package.parent / "weights", package / "_weights"):
        if cand.is_dir():
            return cand
    return package.parent / "weights"


def parse_hub_ref(ref: str) -> tuple[str, str, str | None]:
    """'hf://owner/repo/dir/file.safetensors@rev' -> (repo_id, filename, revision)."""
    body = ref[len("hf://") :]
    revision = None
    if "@" in body:
        body, revision = body.rsplit("@", 1)
        revision = revision or None
    parts = body.split("/")
    if len(parts) < 3 or not all(parts):
        raise CheckpointError(f"Hub reference must look like hf://owner/repo/file.safetensors[@revision]: {ref}")
    return "/".join(parts[:2]), "/".join(parts[2:]), revision


def download_from_hub(ref: str) -> Path:
    """Fetch a Hub checkpoint through huggingface_hub's cache; one-line errors.

    The cache is tried first, without the network.  When the file is not cached, the Hub's host is
    probed once (a few seconds at most) before downloading: without a network, huggingface_hub
    would retry five times with back-off, printing a warning each time, for about 25 s.
    """
    repo_id, filename, revision = parse_hub_ref(ref)
    # imported here, not at the top: it adds 0.2 s to every start of the command
    from huggingface_hub import constants, hf_hub_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(hf_hub_download(repo_id=repo_id, filename=filename, revision=revision, local_files_only=True))
    except Exception:  # not cached (or a revision that must be looked up): go to the Hub
        pass
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    if offline:
        raise CheckpointError(f"{ref}: not in the local Hugging Face cache and HF_HUB_OFFLINE is set")
    if not _reachable(constants.ENDPOINT):
        raise CheckpointError(f"{ref}: not in the local Hugging Face cache and {constants.ENDPOINT} cannot be reached")
    quiet = logging.getLogger("huggingface_hub")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # its retry warnings: the error below says what happened
    try:
        return Path(hf_hub_download(repo_id=repo_id, filename=filename, revision=revision))
    except LocalEntryNotFoundError:
        raise CheckpointError(f"{ref}: not in the local Hugging Face cache and the Hub could not be reached") from None
    except Exception as e:  # network, auth, missing repo/file: all become one line
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(f"{ref}: download failed ({type(e).__name__}: {first[:160]})") from None
    finally:
        quiet.setLevel(level)


def _reachable(endpoint: str, timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the endpoint's host opens within ``timeout`` seconds."""
    url = urlsplit(endpoint)
    try:
        with socket.create_connection((url.hostname, url.port or (443 if url.scheme == "https" else 80)), timeout):
            return True
    except OSError:
        return False


def resolve_weights(spec: str | None, channels: int | None = None, task: str = "denoise", job: str = "denoise") -> Path:
    """Turn a ``--weights`` value into a local checkpoint path (see module docstring).  ``task`` is the
    checkpoint's task (denoise, detect); ``job`` picks the default denoiser (denoise, decompose, adapt)."""
    wdir = weights_dir()
    if not spec or spec == "default":
        name = BUNDLED_DETECT if task == "detect" else DEFAULTS[job].get(channels or 3)
        path = wdir / name
        if not path.is_file():
            raise CheckpointError(f"bundled default checkpoint missing: {path} (pass --weights PATH)")
        return path
    if spec.startswith("hf://"):
        return download_from_hub(spec)
    if spec in BUNDLED_NAMES:
        return wdir / BUNDLED_NAMES[spec]
    bundled = wdir / f"{spec}.safetensors"
    if "/" not in spec and not spec.endswith(".safetensors") and bundled.is_file():
        return bundled
    path = Path(spec).expanduser()
    if path.is_file():
        return path
    names = ", ".join(sorted(set(SHORT_NAMES.values())))
    raise CheckpointError(
        f"weights not found: {spec!r} is neither a file nor a bundled name ({names}); "
        "a Hub checkpoint is hf://owner/repo/file.safetensors"
    )


def default_jobs(filename: str) -> list[str]:
    """The jobs (denoise, decompose, adapt, detect) a bundled file is the default checkpoint of."""
    jobs = [job for job, by_channels in DEFAULTS.items() if filename in by_channels.values()]
    return jobs + (["detect"] if filename == BUNDLED_DETECT else [])


def list_checkpoints(include_cache: bool = True) -> list[dict]:
    """Bundled checkpoints and indeed checkpoints in the Hugging Face cache, with metadata."""
    rows = []
    for p in sorted(weights_dir().glob("*.safetensors")):
        row = _describe(p, "bundled", SHORT_NAMES.get(p.name, p.stem))
        row["default_for"] = default_jobs(p.name)
        rows.append(row)
    if include_cache:
        try:
            from huggingface_hub import scan_cache_dir  # 0.2 s of imports, only for listing

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
        row.update(
            task=cfg.get("task"),
            channels=cfg.get("channels"),
            rank=cfg.get("rank"),
            training=meta["training"],
            # the deployment thresholds, not the OOD training points (tens of kB)
            ood_threshold=(extra.get("ood") or {}).get("threshold"),
            detect_threshold=(extra.get("detect") or {}).get("threshold"),
            members=1 + len(meta["members"]),
            memory_entries=(meta["memory"] or {}).get("entries"),  # a detector's memory of normal features
            memory_bits=meta["memory"].get("bits", 8) if meta["memory"] else None,  # its bank's storage
            # the largest convolutions' storage: 8 (int8), 4 (Eq. (4-bit weights)), None (all float16)
            weight_bits=meta["weight_bits"] if meta["int8_min_weights"] is not None else None,
        )
    except CheckpointError as e:
        row["error"] = str(e)
    return row


def resolve_feature_weights(spec: str | Path | None, name: str) -> Path:
    """The weights of the feature trunk ``name`` for ``indeed train --support-features``: ``spec`` a
    file, or empty / the trunk's name for the bundled copy (weights/features/)."""
    if not spec or str(spec) == name:
        path = weights_dir() / BUNDLED_FEATURES.get(name, f"features/{name}.safetensors")
        if not path.is_file():
            raise CheckpointError(
                f"the bundled {name} feature weights are not in {path.parent}: give --support-features FILE "
                "(tools/import_efficientnet_lite0.py writes it) or --support-features none"
            )
        return path
    return Path(spec)
