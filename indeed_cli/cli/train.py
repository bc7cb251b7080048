"""`indeed train`: train (or resume) a model; state and the exported checkpoint go to --out."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Annotated

import typer

from ..model import ModelConfig
from ..pipelines import parse_scales, train
from ..tasks.training import LossWeights, Recipe, TrainConfig
from .options import MemoryBits, MemoryEntries


def train_cmd(
    data: Annotated[
        list[str],
        typer.Option("--data", metavar="DIR|LIST", help="Training images: folder(s) or .txt list(s) of paths."),
    ],
    out: Annotated[
        Path, typer.Option("--out", metavar="DIR", help="Run folder: resumable state, log.jsonl, model.safetensors.")
    ],
    task: Annotated[
        str, typer.Option("--task", metavar="denoise|detect", help="denoise, or detect (train on normal images only).")
    ] = "denoise",
    textures: Annotated[
        str | None,
        typer.Option("--textures", metavar="DIR", help="detect: texture images for synthetic anomalies (e.g. DTD)."),
    ] = None,
    anomalies: Annotated[
        str,
        typer.Option(
            "--anomalies",
            metavar="strong|subtle|surface|cracks|defects",
            help="detect: synthetic anomaly preset: strong, subtle "
            "(also faint, soft-edged ones), surface (large texture regions), cracks (strong with "
            "thin dark cracks and chips) or defects (realistic kinds); "
            "docs/guide/detect.md.",
        ),
    ] = Recipe.anomalies,
    scales: Annotated[
        str | None,
        typer.Option(
            "--scales",
            metavar="LIST",
            help="Image pyramid to train on. detect: also the "
            "read-out scales (maps averaged; large defects need it), "
            "default 1,0.5,0.25. denoise: scale augmentation (copies "
            "smaller than --patch are left out), default 1.",
        ),
    ] = None,
    channels: Annotated[int, typer.Option("--channels", metavar="1|3", help="1 = gray model, 3 = colour model.")] = 3,
    val: Annotated[
        str | None, typer.Option("--val", metavar="DIR|LIST", help="Held-out images for validation PSNR.")
    ] = None,
    val_count: Annotated[
        int, typer.Option("--val-count", metavar="N", help="Without --val: hold out the last N training images.")
    ] = Recipe.val_count,
    steps: Annotated[
        int, typer.Option("--steps", metavar="N", help="Planned total steps (LR schedule).")
    ] = TrainConfig.steps,
    batch: Annotated[
        int, typer.Option("--batch", metavar="PATCHES", help="Patches per step (per GPU with torchrun).")
    ] = TrainConfig.batch,
    patch: Annotated[
        int, typer.Option("--patch", metavar="PIXELS", help="Side of the square training patches.")
    ] = TrainConfig.patch,
    lr: Annotated[
        float, typer.Option("--lr", metavar="LR", help="Peak Adam learning rate (after warm-up; cosine decay to 1e-6).")
    ] = TrainConfig.lr,
    sigma_max: Annotated[
        float | None,
        typer.Option(
            "--sigma-max",
            metavar="SIGMA",
            help="AWGN sigma ~ U(0, max] (8-bit units); default 75 for denoise, 5 for detect.",
        ),
    ] = None,
    sigma_power: Annotated[
        float,
        typer.Option(
            "--sigma-power",
            metavar="P",
            help="Noise levels sigma = max * u^P, u ~ U(0, 1]: 1 is uniform, above 1 puts more patches at low noise.",
        ),
    ] = TrainConfig.sigma_power,
    train_only: Annotated[
        str,
        typer.Option(
            "--train-only",
            metavar="PREFIXES",
            help="Fine-tune only the weights whose names start with one of these comma-separated prefixes "
            "(e.g. sparse.dec,sparse.head); the others keep their --init values.",
        ),
    ] = "",
    clip_prob: Annotated[
        float, typer.Option("--clip-prob", metavar="SHARE", help="Share of patches clipped+quantised to 8 bits.")
    ] = TrainConfig.clip_prob,
    camera_noise: Annotated[
        float,
        typer.Option(
            "--camera-noise",
            metavar="SHARE",
            help="Denoise, colour: share of patches with camera noise (raw shot and read noise, demosaic, "
            "colour pipeline; light to heavy) instead of AWGN.",
        ),
    ] = TrainConfig.camera_share,
    saturation: Annotated[
        float,
        typer.Option(
            "--saturation",
            metavar="SHARE",
            help="Denoise, colour: share of clean patches made more colourful (chroma scaled by up to 2.5, "
            "channels permuted), for photographs more saturated than the training data.",
        ),
    ] = TrainConfig.saturation_share,
    rank: Annotated[int, typer.Option("--rank", metavar="N", help="r0, the maximal rank.")] = ModelConfig.rank,
    sparse_width: Annotated[
        int, typer.Option("--sparse-width", metavar="N", help="f_thetaS U-Net width at its finest scale.")
    ] = Recipe.sparse_width,
    sparse_blocks: Annotated[
        int, typer.Option("--sparse-blocks", metavar="N", help="Residual blocks per U-Net scale.")
    ] = ModelConfig.sparse_blocks,
    sparse_levels: Annotated[
        int, typer.Option("--sparse-levels", metavar="N", help="U-Net scales (inputs padded to 2**levels).")
    ] = ModelConfig.sparse_levels,
    support_width: Annotated[
        int | None,
        typer.Option(
            "--support-width",
            metavar="N",
            help="detect: width of f_thetaM, the support posterior whose "
            "probability is the anomaly map (default 32 for a new detector; 0: none, the map is |mu_S|, "
            "the paper's). With --init, gives a trained detector without one a fresh f_thetaM "
            "(docs/guide/detect.md).",
        ),
    ] = None,
    support_levels: Annotated[
        int, typer.Option("--support-levels", metavar="N", help="detect: U-Net scales of f_thetaM.")
    ] = ModelConfig.support_levels,
    support_features: Annotated[
        str | None,
        typer.Option(
            "--support-features",
            metavar="efficientnet-lite0|FILE|none",
            help="detect: image features f_thetaM also reads: frozen EfficientNet-Lite0 ImageNet features, "
            "bundled (efficientnet-lite0, the default of a new detector with f_thetaM) or from FILE "
            "(tools/import_efficientnet_lite0.py); none: without. Stored in the checkpoint. With --init: "
            "gives the checkpoint's f_thetaM features. A deviation from the paper (docs/model.md).",
        ),
    ] = None,
    lowrank_b: Annotated[
        str | None,
        typer.Option(
            "--lowrank-b",
            metavar="network|variational",
            help="q(B) from f_thetaB (network, the paper) or by the closed-form variational update "
            "given q(A) with automatic relevance determination (variational; docs/model.md). "
            "Default: network, or the --init checkpoint's.",
        ),
    ] = None,
    sparse_input: Annotated[
        str | None,
        typer.Option(
            "--sparse-input",
            metavar="residual|residual+lowrank",
            help="What f_thetaS sees: residual "
            "(Y - AB^T, the paper) or residual+lowrank (also AB^T, "
            "docs/model.md); default residual+lowrank for denoise, "
            "residual for detect.",
        ),
    ] = None,
    lowrank_width: Annotated[
        int, typer.Option("--lowrank-width", metavar="N", help="Width of the low-rank trunk f_thetaL.")
    ] = ModelConfig.lowrank_width,
    sigma0: Annotated[
        float, typer.Option("--sigma0", metavar="PRECISION", help="Precision of the supervision likelihood.")
    ] = LossWeights.sigma0,
    no_bayes: Annotated[bool, typer.Option("--no-bayes", help="Drop l_fid, l_rank, l_sparse (ablation #9).")] = False,
    sigma0_noise_ref: Annotated[
        float,
        typer.Option(
            "--sigma0-noise-ref",
            metavar="SIGMA",
            help="denoise: scale each patch's sigma0 by "
            "REF/max(sigma, REF/5) (8-bit units), weighting low noise more; "
            "0 = constant sigma0 (the paper).",
        ),
    ] = LossWeights.sigma0_noise_ref,
    tau: Annotated[
        float, typer.Option("--tau", metavar="WEIGHT", help="Weight tau of the orthogonality term l_orth (paper: 1).")
    ] = LossWeights.tau,
    lowrank_sup: Annotated[
        float,
        typer.Option(
            "--lowrank-sup-weight",
            metavar="WEIGHT",
            help="denoise: weight w_L of ||L - U||^2 in l_sup (paper: 1); larger asks L to carry more of the image.",
        ),
    ] = LossWeights.lowrank_sup,
    patch_precision: Annotated[
        float,
        typer.Option(
            "--patch-precision",
            metavar="CAP",
            help="denoise: each patch's sigma0 = the batch's mean error over the patch's own, at most CAP, "
            "so that flat patches weigh like textured ones (docs/model.md); 0 = one sigma0 (the paper).",
        ),
    ] = LossWeights.patch_precision,
    rank_sup: Annotated[
        float,
        typer.Option(
            "--rank-supervision",
            metavar="WEIGHT",
            help="denoise: weight of l_n, which asks the rank index n to equal the clean patch's SVD rank "
            "(docs/model.md); 0 = off (the paper).",
        ),
    ] = LossWeights.rank_sup,
    time_limit: Annotated[
        float, typer.Option("--time-limit", metavar="SECONDS", help="Stop cleanly after this many seconds (0 = none).")
    ] = 0,
    time_budget: Annotated[
        float,
        typer.Option(
            "--time-budget",
            metavar="SECONDS",
            help="Total training seconds across resumes; the LR schedule follows it.",
        ),
    ] = 0,
    seed: Annotated[
        int, typer.Option("--seed", metavar="N", help="Seed of the sampling, the noise and the initialisation.")
    ] = TrainConfig.seed,
    deterministic: Annotated[
        bool,
        typer.Option(
            "--deterministic",
            help="Reproducible runs: deterministic kernels and "
            "no cuDNN autotuning (slower on a GPU); needs a step-based schedule "
            "(no --time-budget).",
        ),
    ] = False,
    device: Annotated[
        str, typer.Option("--device", metavar="DEVICE", help="auto, cpu, cuda or cuda:N (torchrun: each rank's GPU).")
    ] = "auto",
    init: Annotated[
        str | None,
        typer.Option(
            "--init",
            metavar="CHECKPOINT",
            help="Start from this checkpoint's weights (fine-tuning; "
            "its model config is used). A bundled name, path or hf:// reference.",
        ),
    ] = None,
    export: Annotated[
        Path | None, typer.Option("--export", metavar="PATH", help="Also copy the checkpoint here.")
    ] = None,
    log_every: Annotated[
        int, typer.Option("--log-every", metavar="STEPS", help="Steps between lines of log.jsonl.")
    ] = TrainConfig.log_every,
    val_every: Annotated[
        int, typer.Option("--val-every", metavar="STEPS", help="Steps between validations (a multiple of --log-every).")
    ] = TrainConfig.val_every,
    state_shard_mb: Annotated[
        float,
        typer.Option(
            "--state-shard-mb",
            metavar="MB",
            help="Write the resumable state in files of at most this many MB (0 = one file).",
        ),
    ] = TrainConfig.state_shard_mb,
    ood_samples: Annotated[
        int,
        typer.Option(
            "--ood-samples", metavar="N", help="denoise: noisy training crops for the OOD statistics (0 = skip)."
        ),
    ] = Recipe.ood_samples,
    memory_entries: MemoryEntries = None,
    memory_bits: MemoryBits = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar.")] = False,
) -> None:
    """Train InDeed on clean images with the paper's loss (resumes from --out if state exists)."""
    pyramid = parse_scales(scales) if scales else None
    model = {
        "rank": rank,
        "sparse_width": sparse_width,
        "sparse_blocks": sparse_blocks,
        "sparse_levels": sparse_levels,
        "lowrank_width": lowrank_width,
        **({"sparse_input": sparse_input} if sparse_input else {}),
        **({"lowrank_b": lowrank_b} if lowrank_b else {}),
        **({"support_width": support_width} if support_width is not None else {}),
        "support_levels": support_levels,
        # "none": without features; a name or a file: the one kind of features there is
        **(
            {"support_features": "" if support_features == "none" else "efficientnet-lite0"} if support_features else {}
        ),
    }
    settings = {
        "steps": steps,
        "batch": batch,
        "patch": patch,
        "lr": lr,
        "clip_prob": clip_prob,
        "sigma_power": sigma_power,
        "train_only": tuple(p.strip() for p in train_only.split(",")) if train_only else (),
        "camera_share": camera_noise,
        "saturation_share": saturation,
        "seed": seed,
        "time_limit": time_limit,
        "time_budget": time_budget,
        "log_every": log_every,
        "val_every": val_every,
        "deterministic": deterministic,
        "state_shard_mb": state_shard_mb,
        "losses": LossWeights(
            sigma0=sigma0,
            tau=tau,
            bayesian=not no_bayes,
            sigma0_noise_ref=sigma0_noise_ref,
            lowrank_sup=lowrank_sup,
            patch_precision=patch_precision,
            rank_sup=rank_sup,
        ),
        **({"sigma_max": sigma_max} if sigma_max is not None else {}),
        **(
            {"support_features_weights": support_features}
            if support_features not in (None, "none", "efficientnet-lite0")
            else {}
        ),
    }
    rec = train(
        data,
        out,
        task=task,
        channels=channels,
        val=val,
        val_count=val_count,
        scales=pyramid,
        textures=textures,
        anomalies=anomalies,
        init=init,
        model=model,
        ood_samples=ood_samples,
        memory_entries=memory_entries,
        memory_bits=memory_bits,
        device=device,
        progress=not quiet,
        log=lambda m: typer.echo(m, err=True),
        **settings,
    )
    if rec.get("rank", 0) != 0:  # other torchrun ranks: rank 0 reports and exports
        return
    typer.echo(
        f"step {rec.get('step')}: {out / 'model.safetensors'} "
        + " ".join(f"{k}={v:.2f}" for k, v in rec.items() if k.startswith("psnr")),
        err=True,
    )
    if export:
        shutil.copyfile(out / "model.safetensors", export)
