"""Training of f_theta: data sampling, the task losses, a resumable loop.

The loop is built for short GPU sessions: ``time_limit`` stops it cleanly, and the
state (fp32 weights, Adam moments in bf16, step, RNG states) is written to a
state folder from which the next call continues.  The exported checkpoint is the
ordinary fp16 model file of :mod:`indeed_cli.checkpoint`.

Multi-GPU: run under ``torchrun --nproc_per_node=K``; each rank samples its own
patches (seeded by rank) and gradients are averaged by DistributedDataParallel.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from . import posteriors as P
from .checkpoint import save_checkpoint
from .config import LossWeights, ModelConfig
from .imageio import is_image_path, read_image
from .networks import InDeed



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
    clip_prob: float = 0.5  # share of patches clipped to [0,1] and quantised to 8 bits
    seed: int = 0
    val_every: int = 1000
    save_every: int = 2000
    log_every: int = 100
    precision: str = "auto"  # bf16 autocast on GPU, fp32 on CPU
    time_limit: float = 0.0  # seconds for this call; 0 = no limit
    time_budget: float = 0.0  # total training seconds over all resumed calls; 0 = schedule by steps
    losses: LossWeights = field(default_factory=LossWeights)
    init: str = ""  # checkpoint whose weights start a new run (fine-tuning); ignored when resuming
    deterministic: bool = False  # deterministic kernels, no cuDNN autotuning (docs/training.md)

    def check(self) -> None:
        """Settings that cannot go together (raised before any data is loaded or trained on)."""
        if self.deterministic and self.time_budget:
            raise ValueError("a deterministic run needs a step-based schedule: --time-budget makes the learning "
                             "rate depend on wall-clock time (use --steps; --time-limit may still end a call)")


# ------------------------------------------------------------------ data
def list_images(spec: str | Path) -> list[Path]:
    """A folder (searched recursively) or a .txt list of paths relative to the list's folder."""
    spec = Path(spec)
    if spec.is_file() and spec.suffix == ".txt":
        lines = [ln.strip() for ln in spec.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        return [spec.parent / ln for ln in lines]
    if spec.is_dir():
        return sorted(p for p in spec.rglob("*") if p.is_file() and is_image_path(p))
    raise FileNotFoundError(f"training data not found: {spec}")


def load_images(paths: list[Path], channels: int) -> list[torch.Tensor]:
    """uint8 (C, h, w) tensors; colour is averaged to gray (ITU-R 601 luma) for gray models."""
    out = []
    for p in paths:
        img = read_image(p).data
        if channels == 1 and img.shape[0] == 3:
            img = (0.299 * img[0] + 0.587 * img[1] + 0.114 * img[2])[None]
        elif channels == 3 and img.shape[0] == 1:
            img = np.repeat(img, 3, 0)
        out.append(torch.from_numpy(np.round(img * 255).astype(np.uint8)))
    return out


def image_pyramid(images: list[torch.Tensor], scales: tuple[float, ...]) -> list[torch.Tensor]:
    """Each uint8 image at each scale (antialiased bilinear), so that a 128 crop of a downscaled
    copy shows a whole defect with the normal surface around it (detect --scales)."""
    from .detection import resize, scaled_size  # the read-out's resampling, so both see the same sizes
    out = []
    for s in scales:
        for im in images:
            if s == 1:
                out.append(im)
                continue
            small = resize(im.numpy().astype(np.float32), scaled_size(*im.shape[1:], s))
            out.append(torch.from_numpy(np.round(small).clip(0, 255).astype(np.uint8)))
    return out


class PatchSampler:
    """Random crops with the 8 flips/rotations, drawn from images kept on the device."""

    def __init__(self, images: list[torch.Tensor], patch: int, device: torch.device, generator: torch.Generator,
                 pad_small: bool = False):
        small = [tuple(im.shape[1:]) for im in images if min(im.shape[1:]) < patch]
        if small and not pad_small:
            raise ValueError(f"{len(small)} training images are smaller than the patch size {patch}")
        if small:  # mirror-extend narrow images (anomaly data comes in all sizes)
            images = [_pad_to(im, patch) for im in images]
        self.images = [im.to(device) for im in images]
        self.patch, self.device, self.gen = patch, device, generator

    def sample(self, n: int) -> torch.Tensor:
        g, p = self.gen, self.patch
        idx = torch.randint(len(self.images), (n,), generator=g).tolist()
        ops = torch.randint(8, (n,), generator=g).tolist()
        crops = []
        for i, op in zip(idx, ops):
            im = self.images[i]
            y = int(torch.randint(im.shape[1] - p + 1, (1,), generator=g))
            x = int(torch.randint(im.shape[2] - p + 1, (1,), generator=g))
            c = im[:, y:y + p, x:x + p]
            if op & 4:
                c = c.transpose(1, 2)
            crops.append(torch.rot90(c, op & 3, (1, 2)))
        return torch.stack(crops).float() / 255.0


def _pad_to(im: torch.Tensor, size: int) -> torch.Tensor:
    """Mirror-extend a narrow image to ``size`` the way the tiler does at inference (repeated
    reflection, any shortfall), so that training and inference see the same borders."""
    from .tiling import reflect_index
    h, w = im.shape[1:]
    rows = torch.from_numpy(reflect_index(np.arange(max(h, size)), h))
    cols = torch.from_numpy(reflect_index(np.arange(max(w, size)), w))
    return im[:, rows][:, :, cols]


def add_noise(clean: torch.Tensor, sigma_max: float, clip_prob: float, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """AWGN with sigma ~ U(0, sigma_max]/255 per patch; some patches clipped+quantised like 8-bit files."""
    n = clean.shape[0]
    sigma = (1.0 - torch.rand(n, generator=generator)) * sigma_max / 255.0  # (0, max]
    clip = torch.rand(n, generator=generator) < clip_prob
    seed = int(torch.randint(2 ** 62, (1,), generator=generator))
    g = torch.Generator(device=clean.device).manual_seed(seed)
    noise = torch.randn(clean.shape, generator=g, device=clean.device)
    noisy = clean + noise * sigma.to(clean.device).view(-1, 1, 1, 1)
    c = clip.to(clean.device).view(-1, 1, 1, 1)
    noisy = torch.where(c, torch.round(noisy.clamp(0, 1) * 255) / 255, noisy)
    return noisy, sigma


# ------------------------------------------------------------------ objective
def noise_level_weights(sigma: torch.Tensor, ref: float) -> torch.Tensor:
    """Per-patch factors of sigma0 (``--sigma0-noise-ref``): ref / max(sigma, ref / 5), sigma and ref in
    8-bit units.  Under a constant sigma0 the squared error of a patch at sigma = 75 is about seven
    times that of one at sigma = 15, so low noise levels get little of the gradient; this gives
    them weight in proportion to 1/sigma, capped at 5 (docs/benchmarks.md measured it)."""
    s = sigma * 255.0
    return ref / torch.clamp(s, min=ref / 5.0)


def training_loss(model: torch.nn.Module, Y: torch.Tensor, targets: dict[str, torch.Tensor],
                  task: str, weights: LossWeights, priors) -> tuple[torch.Tensor, dict[str, float]]:
    """Eq. (network loss function): l_fid + l_sup + l_rank + l_sparse + tau * l_orth, per pixel.

    All terms are divided by the same element count C*h*w, which keeps their balance.
    """
    d = model(Y, sample=True).float()
    terms = P.elbo_terms(d, Y.float(), priors)
    if task == "denoise":
        sup = P.denoise_supervision_loss(d.L_hat, d.S_hat, targets["clean"], weights.sigma0)
        if weights.sigma0_noise_ref > 0:
            sup = sup * noise_level_weights(targets["sigma"].to(sup.device), weights.sigma0_noise_ref)
    else:
        sup = P.anomaly_supervision_loss(d.L_hat, d.S_hat, targets["normal"], targets["anomaly"], weights.sigma0)
    per_px = float(Y[0].numel())
    parts = {"sup": sup.mean() / per_px, "orth": weights.tau * terms["orth"].mean() / per_px}
    if weights.bayesian:
        parts.update(fid=terms["fid"].mean() / per_px, rank=terms["rank"].mean() / per_px,
                     sparse=terms["sparse"].mean() / per_px)
    total = sum(parts.values())
    return total, {k: float(v.detach()) for k, v in parts.items()}


# ------------------------------------------------------------------ state
SHARD_BYTES = 15_000_000  # GPU sessions bring back files of at most 16 MiB


def _shards(tensors: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    out, cur, size = [], {}, 0
    for k, v in tensors.items():
        n = v.numel() * v.element_size()
        if cur and size + n > SHARD_BYTES:
            out.append(cur)
            cur, size = {}, 0
        cur[k] = v
        size += n
    return out + [cur]


def save_state(folder: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, step: int,
               gen: torch.Generator, extra: dict, elapsed: float = 0.0) -> None:
    """Resumable state as safetensors shards of < 15 MB: fp32 weights, Adam's second
    moments in bf16, step, elapsed training time and RNG states.

    Adam's first moment is not kept: with beta1 = 0.9 it re-forms within ~10 steps,
    and leaving it out keeps the state small enough to travel to short GPU calls.
    """
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"model.{k}": v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
    for i, p in enumerate(model.parameters()):
        st = opt.state.get(p, {})
        if "exp_avg_sq" in st:
            tensors[f"optim.{i}.exp_avg_sq"] = st["exp_avg_sq"].detach().to("cpu", torch.bfloat16).contiguous()
    tensors["rng.sampler"] = gen.get_state().clone()
    tensors["rng.torch"] = torch.get_rng_state().clone()
    adam_step = max((float(s["step"]) for s in opt.state.values() if "step" in s), default=0.0)
    meta = {"step": str(step), "adam_step": str(adam_step), "elapsed": str(elapsed), "extra": json.dumps(extra)}
    shards = _shards(tensors)
    for old in folder.glob("state-*.safetensors"):
        old.unlink()
    for j, part in enumerate(shards):
        name = f"state-{j:02d}-of-{len(shards):02d}.safetensors"
        tmp = folder / f".{name}.tmp"
        save_file(part, str(tmp), metadata=meta)
        os.replace(tmp, folder / name)


def has_state(folder: Path) -> bool:
    return any(Path(folder).glob("state-*.safetensors"))


def load_state(folder: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, gen: torch.Generator) -> tuple[int, float]:
    """Restore what :func:`save_state` wrote; returns (step, training seconds so far)."""
    from safetensors import safe_open
    files = sorted(Path(folder).glob("state-*.safetensors"))
    n_expected = int(files[0].stem.split("-of-")[1])
    if len(files) != n_expected:
        raise ValueError(f"incomplete training state in {folder}: {len(files)} of {n_expected} shards")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    with safe_open(str(files[0]), "pt") as f:
        meta = f.metadata()
    model.load_state_dict({k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")})
    adam_step = float(meta["adam_step"])
    for i, p in enumerate(model.parameters()):
        key = f"optim.{i}.exp_avg_sq"
        if key in tensors:
            opt.state[p] = {"step": torch.tensor(adam_step), "exp_avg": torch.zeros_like(p),
                            "exp_avg_sq": tensors[key].to(p.device, torch.float32)}
    gen.set_state(tensors["rng.sampler"])
    torch.set_rng_state(tensors["rng.torch"])
    return int(meta["step"]), float(meta.get("elapsed", 0.0))


def lr_at(step: int, tc: TrainConfig, elapsed: float = 0.0) -> float:
    """Linear warm-up, then cosine decay from lr to lr_min over the planned steps
    (or over the time budget, whichever is further along)."""
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    t = min(1.0, (step - tc.warmup) / max(1, tc.steps - tc.warmup))
    if tc.time_budget:
        t = max(t, min(1.0, elapsed / tc.time_budget))
    return tc.lr_min + 0.5 * (tc.lr - tc.lr_min) * (1 + math.cos(math.pi * t))


# ------------------------------------------------------------------ validation
def psnr8(x: torch.Tensor, ref: torch.Tensor) -> float:
    """PSNR of the output clipped to [0,1] and quantised to 8 bits (data range 255)."""
    a = torch.round(x.clamp(0, 1) * 255)
    b = torch.round(ref.clamp(0, 1) * 255)
    mse = (a - b).square().mean().item()
    return 10 * math.log10(255 ** 2 / max(mse, 1e-10))


@torch.no_grad()
def validate(model: InDeed, images: list[torch.Tensor], device: torch.device, sigmas=(15, 25, 50),
             size: int = 256, seed: int = 1234) -> dict[str, float]:
    """Mean PSNR of L+S (and of L alone) on centre crops with fixed-seed AWGN (float, unclipped)."""
    model.eval()
    out = {}
    g = torch.Generator().manual_seed(seed)
    for s in sigmas:
        ps, pl = [], []
        for im in images:
            h, w = im.shape[1:]
            c = min(size, h - h % 8, w - w % 8)
            y0, x0 = (h - c) // 2, (w - c) // 2
            clean = im[:, y0:y0 + c, x0:x0 + c].float().div(255).unsqueeze(0)
            noisy = clean + torch.randn(clean.shape, generator=g) * s / 255
            d = model(noisy.to(device), sample=False)
            ps.append(psnr8((d.L_hat + d.mu_S).float().cpu(), clean))
            pl.append(psnr8(d.L_hat.float().cpu(), clean))
        out[f"psnr_s{s}"] = float(np.mean(ps))
        out[f"psnr_L_s{s}"] = float(np.mean(pl))
    model.train()
    return out


# ------------------------------------------------------------------ loop
def train(model_cfg: ModelConfig, tc: TrainConfig, train_images: list[torch.Tensor], out_dir: Path,
          val_images: list[torch.Tensor] | None = None, device: str = "auto", facts: dict | None = None,
          make_batch: Callable | None = None, progress: bool = True, log: Callable[[str], None] = print) -> dict:
    """Train (or resume) and export ``out_dir/model.safetensors``; returns the last log record.

    ``make_batch(sampler, n, tc, gen) -> (Y, targets)`` makes each batch; default: AWGN denoising.
    The backend settings (TF32, cuDNN autotuning, deterministic kernels) are restored afterwards.
    """
    tc.check()
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark,
             torch.backends.cudnn.deterministic, torch.are_deterministic_algorithms_enabled(),
             torch.is_deterministic_algorithms_warn_only_enabled())
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    # cuDNN autotuning picks the fastest kernels per shape, which may differ from run to run;
    # deterministic mode also asks PyTorch for deterministic kernels (a warning names any op
    # that has none) and cuBLAS for a fixed workspace
    torch.backends.cudnn.benchmark = not tc.deterministic
    torch.backends.cudnn.deterministic = tc.deterministic
    if tc.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        return _train(model_cfg, tc, train_images, out_dir, val_images, device, facts, make_batch, progress, log)
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark,
         torch.backends.cudnn.deterministic) = saved[:4]
        torch.use_deterministic_algorithms(saved[4], warn_only=saved[5])


def _train(model_cfg: ModelConfig, tc: TrainConfig, train_images: list[torch.Tensor], out_dir: Path,
           val_images: list[torch.Tensor] | None, device: str, facts: dict | None, make_batch: Callable | None,
           progress: bool, log: Callable[[str], None]) -> dict:
    """The training loop of :func:`train`, under its backend settings."""
    dist = int(os.environ.get("WORLD_SIZE", "1")) > 1
    rank = int(os.environ.get("RANK", "0"))
    if dist:
        import torch.distributed as tdist
        tdist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        local = int(os.environ.get("LOCAL_RANK", "0"))
        dev = torch.device(f"cuda:{local}" if torch.cuda.is_available() else "cpu")
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
    else:
        dev = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else
                           ("cpu" if device == "auto" else device))
    out_dir = Path(out_dir)
    torch.manual_seed(tc.seed + rank)
    model = InDeed(model_cfg).to(dev)
    if dev.type == "cuda":
        model = model.to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=tc.lr)
    gen = torch.Generator().manual_seed(tc.seed * 1000 + rank)
    step, elapsed0 = 0, 0.0
    if has_state(out_dir):
        step, elapsed0 = load_state(out_dir, model, opt, gen)
        if dist:  # every rank continues with its own stream
            gen.manual_seed(tc.seed * 1000 + rank + 7919 * step)
        log(f"resumed from {out_dir} at step {step}")
    elif tc.init:  # fine-tune: start from a checkpoint's weights with a fresh optimizer and schedule
        from .checkpoint import load_checkpoint
        start = load_checkpoint(tc.init, dev)
        if start.config != model_cfg:
            raise ValueError(f"--init checkpoint {tc.init} has another model config than this run")
        model.load_state_dict(start.model.state_dict())
        log(f"initialised from {tc.init} ({start.training.get('steps', '?')} steps)")
    net = model
    if dist:
        from torch.nn.parallel import DistributedDataParallel
        net = DistributedDataParallel(model, device_ids=[dev.index] if dev.type == "cuda" else None)
    sampler = PatchSampler(train_images, tc.patch, dev, gen, pad_small=tc.task == "detect")
    use_bf16 = tc.precision == "bf16" or (tc.precision == "auto" and dev.type == "cuda")
    make_batch = make_batch or _denoise_batch
    t0 = time.time()
    running: dict[str, float] = {}
    record: dict = {"step": step}
    bar = None
    if progress and rank == 0:
        from tqdm import tqdm
        bar = tqdm(total=tc.steps, initial=step, desc="train", unit="step", dynamic_ncols=True)
    model.train()
    stop_reason = "steps"
    while step < tc.steps:
        elapsed = elapsed0 + time.time() - t0
        reason = ("time limit" if tc.time_limit and time.time() - t0 > tc.time_limit else
                  "time budget" if tc.time_budget and elapsed > tc.time_budget else "")
        if dist:  # every rank must stop at the same step, or the others wait in DDP's all-reduce for ever
            reason = STOP_REASONS[_max_over_ranks(STOP_REASONS.index(reason), dev)]
        if reason:
            stop_reason = reason
            break
        for group in opt.param_groups:
            group["lr"] = lr_at(step, tc, elapsed)
        Y, targets = make_batch(sampler, tc.batch, tc, gen)
        if dev.type == "cuda":
            Y = Y.contiguous(memory_format=torch.channels_last)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_bf16):
            total, parts = training_loss(net, Y, targets, tc.task, tc.losses, model_cfg.priors)
        skip = not torch.isfinite(total)
        if dist:  # likewise for skipping a batch: a rank that skips its backward would stall the others
            skip = bool(_max_over_ranks(int(skip), dev))
        if skip:
            log(f"step {step}: non-finite loss, batch skipped")
            opt.zero_grad(set_to_none=True)
            step += 1
            continue
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1e4)
        opt.step()
        step += 1
        for k, v in parts.items():
            running[k] = running.get(k, 0.0) + v
        running["n"] = running.get("n", 0) + 1
        if bar is not None:
            bar.update(1)
        if rank == 0 and step % tc.log_every == 0:
            n = running.pop("n")
            record = {"step": step, "lr": lr_at(step, tc, elapsed), "time_s": round(elapsed0 + time.time() - t0, 1),
                      **{k: round(v / n, 5) for k, v in running.items()}}
            running = {}
            if val_images and step % tc.val_every == 0:
                record.update(validate(model, val_images, dev))
            _append_log(out_dir, record)
            if bar is not None:
                bar.set_postfix({k: record[k] for k in record if k in ("sup", "fid", "rank", "sparse", "psnr_s25")})
        if rank == 0 and step % tc.save_every == 0:
            save_state(out_dir, model, opt, step, gen, {"train": _jsonable(tc)}, elapsed0 + time.time() - t0)
    if bar is not None:
        bar.close()
    if rank == 0:
        save_state(out_dir, model, opt, step, gen, {"train": _jsonable(tc)}, elapsed0 + time.time() - t0)
        final = validate(model, val_images, dev) if val_images else {}
        record = {"step": step, "stop": stop_reason, "time_s": round(elapsed0 + time.time() - t0, 1), **final}
        _append_log(out_dir, record)
        training_facts = {**(facts or {}), "steps": step, "init": tc.init or None, "train_seconds": round(elapsed0 + time.time() - t0),
                          "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "batch": tc.batch, "patch": tc.patch,
                          "sigma_max": tc.sigma_max, "clip_prob": tc.clip_prob, "lr": tc.lr,
                          "losses": asdict(tc.losses), "deterministic": tc.deterministic, "validation": final}
        save_checkpoint(out_dir / "model.safetensors", model, training_facts)
    if dist:
        import torch.distributed as tdist
        tdist.destroy_process_group()
    return {**record, "step": step, "rank": rank}  # every rank reports the step it stopped at


STOP_REASONS = ("", "time limit", "time budget")


def _max_over_ranks(code: int, dev: torch.device) -> int:
    """The largest ``code`` over all DDP ranks: per-rank decisions (stop, skip a batch) agreed."""
    import torch.distributed as tdist
    t = torch.tensor([code], device=dev)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return int(t.item())


def _denoise_batch(sampler: PatchSampler, n: int, tc: TrainConfig, gen: torch.Generator):
    clean = sampler.sample(n)
    noisy, sigma = add_noise(clean, tc.sigma_max, tc.clip_prob, gen)
    return noisy, {"clean": clean, "sigma": sigma}


def detect_batch_fn(textures: list[torch.Tensor] | None = None, anomaly_cfg=None) -> Callable:
    """Batches for UAD (paper §3.6): normal patches U_N, synthetic anomalies U_A = Y - U_N,
    and mild sensor noise that belongs to N."""
    from .anomaly import AnomalyConfig, synthesize
    cache: dict = {}

    def make(sampler: PatchSampler, n: int, tc: TrainConfig, gen: torch.Generator):
        normal = sampler.sample(n)
        if "tex" not in cache:
            cache["tex"] = [t.to(normal.device) for t in (textures or [])]
        Y, U_A, _ = synthesize(normal, gen, cache["tex"], anomaly_cfg or AnomalyConfig())
        noisy, _ = add_noise(Y, tc.sigma_max, tc.clip_prob, gen)
        return noisy, {"normal": normal, "anomaly": U_A}
    return make


def _jsonable(tc: TrainConfig) -> dict:
    return json.loads(json.dumps(asdict(tc)))


def _append_log(out_dir: Path, record: dict) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "log.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")
