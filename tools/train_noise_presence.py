"""Train the noise-presence detector that OAG and AG ask before adapting (indeed_cli.tasks.noise_presence,
docs/model.md Eq. (noise presence)) and write it as safetensors with its config in the metadata.

Training data, all outside the held-out sets of docs/results.md:
  - --hq, --wall: the training splits of tools/build_training_set.py (Urban100/Set14 photographs,
    wallpaper crops), from their --skip-th file on (the first --skip are the development crops of issue 19);
  - --bsds: BSDS500's train/ and val/ JPEGs (none of them in CBSD68);
  - --polyu: PolyU100, the scene-dev half only (benchmarks/adapt.py's scene_half), its _real / _mean pairs.
Per clean image 12 random 64 x 64 patches, each as a pair: without noise (label 0) and with noise
(label 1): synthetic camera noise (70%: light, light, medium or heavy; half JPEG q90, the reference through
the same JPEG; a share --mhc of them, none by default, demosaicked across channels, Malvar-He-Cutler, whose
noise is correlated between channels as real sRGB noise is) or white noise of sigma U(2, 10)/255 (30%),
8-bit; PolyU's pairs as 64 x 64 tiles. Adam, batch 64, 2,500 steps (learning rate 2e-3, 5e-4 from step
1,800), flips and quarter turns; a tenth of the patches held back and scored at the end.
--patch P (patches and PolyU tiles of P x P), --halved (each --hq and --wall photograph also area-downscaled
by 2) and --context N (N dilated layers in the network) were tried together with --mhc 0.5 and rejected
(docs/reports/2026-12-08-wider-noise-detector.md); their defaults are the bundled recipe.
--textures DIR adds texture photographs (each area-downscaled by 2) as sources; the bundled second detector
(weights/noise/noise-presence-texture.safetensors, docs/reports/2026-12-08-noise-map-blend.md) is
`--mhc 0.5 --textures ../shared/data/anomaly/dtd-subset --threshold 3 --map-temperature 4` (the last two only
written into the metadata: the margin its score needs beside the first detector, and its blend's temperature).

    python tools/train_noise_presence.py --hq HQ/train --wall WALL/train --bsds ../shared/data/denoise-train/BSDS500 \\
        --polyu ../shared/data/denoise-real/PolyU100 -o weights/noise/noise-presence.safetensors

On the 2-core CPU of docs/reports/2026-12-07-noise-presence.md: about 4 minutes of patches, 12 of training.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from indeed_cli.io.images import read_image  # noqa: E402
from indeed_cli.tasks.camera_noise import camera_pair  # noqa: E402
from indeed_cli.tasks.noise_presence import NoisePresenceNet  # noqa: E402

PATCH, REGION, PER_IMAGE = 64, 128, 12


def q8(a: np.ndarray) -> np.ndarray:
    return np.round(np.clip(a, 0, 1) * 255) / 255


def jpeg90(a: np.ndarray) -> np.ndarray:
    buf = io.BytesIO()
    Image.fromarray((a.transpose(1, 2, 0) * 255).round().astype(np.uint8)).save(buf, format="JPEG", quality=90)
    return np.asarray(Image.open(buf)).transpose(2, 0, 1).astype(np.float32) / 255


def synthetic_pairs(
    sources: list[tuple[Path, bool]], rng: np.random.Generator, mhc: float = 0.0, patch: int = PATCH
) -> tuple[list, list, list]:
    """Pairs from each (path, halved) of ``sources``; a halved photograph is first area-downscaled by 2."""
    X, labels, kinds = [], [], []  # kinds: 0 clean, 1-3 camera light/medium/heavy, 4 white
    for n, (p, halved) in enumerate(sources):
        img = read_image(p).data
        if img.shape[0] != 3:
            continue
        if halved:  # finer texture, and what noise the photograph had averaged away
            _, H, W = img.shape
            img = img[:, : H // 2 * 2, : W // 2 * 2].reshape(3, H // 2, 2, W // 2, 2).mean((2, 4))
        _, H, W = img.shape
        for _ in range(PER_IMAGE):
            i, j = rng.integers(0, H - REGION + 1) // 2 * 2, rng.integers(0, W - REGION + 1) // 2 * 2
            c = img[:, i : i + REGION, j : j + REGION].astype(np.float32)
            if rng.random() < 0.7:
                level = ["light", "light", "medium", "heavy"][rng.integers(4)]
                jpeg = bool(rng.random() < 0.5)
                demosaic = "mhc" if mhc and rng.random() < mhc else "bilinear"
                y, r = camera_pair(c, level, int(rng.integers(1 << 30)), jpeg=jpeg, demosaic=demosaic)
                if jpeg:  # the reference through the same JPEG, so that compression alone is no cue
                    r = jpeg90(r)
                kind = 1 + ["light", "medium", "heavy"].index(level)
            else:
                s = rng.uniform(2, 10) / 255
                y, r, kind = c + rng.normal(0, s, c.shape).astype(np.float32), c, 4
            a, b = rng.integers(0, REGION - patch + 1, 2)
            X += [q8(r)[:, a : a + patch, b : b + patch], q8(y)[:, a : a + patch, b : b + patch]]
            labels += [0, 1]
            kinds += [0, kind]
        if n % 100 == 0:
            print(f"patches: {n} of {len(sources)} images", flush=True)
    return X, labels, kinds


def polyu_pairs(folder: Path, patch: int = PATCH) -> tuple[list, list, list]:
    from adapt import scene_half  # benchmarks/adapt.py: PolyU's scene split

    X, labels = [], []
    for p in sorted(folder.glob("*_real.JPG")):
        if scene_half(p.name) != "dev":
            continue
        noisy, mean = read_image(p).data, read_image(p.with_name(p.name.replace("_real", "_mean"))).data
        _, H, W = noisy.shape
        for i in range(0, H - patch + 1, patch):
            for j in range(0, W - patch + 1, patch):
                X += [mean[:, i : i + patch, j : j + patch], noisy[:, i : i + patch, j : j + patch]]
                labels += [0, 1]
    return X, labels, [0 if v == 0 else 5 for v in labels]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hq", type=Path, required=True)
    ap.add_argument("--wall", type=Path, required=True)
    ap.add_argument("--bsds", type=Path, required=True)
    ap.add_argument("--polyu", type=Path, required=True)
    ap.add_argument("--skip", type=int, default=32, help="leave out the first SKIP files of --hq and --wall")
    ap.add_argument("--steps", type=int, default=2500)
    ap.add_argument(
        "--mhc",
        type=float,
        default=0.0,
        help="share of the camera-noise patches demosaicked across channels (0, the bundled detector's recipe: "
        "bilinear only; 0.5 was tried, docs/reports/2026-12-07-noise-presence-mhc.md)",
    )
    ap.add_argument("--patch", type=int, default=PATCH, help=f"side of the training patches (at most {REGION})")
    ap.add_argument("--context", type=int, default=0, help="dilated layers that widen the view (NoisePresenceNet)")
    ap.add_argument(
        "--halved",
        action="store_true",
        help="also take each --hq and --wall photograph area-downscaled by 2: finer texture without noise",
    )
    ap.add_argument(
        "--textures",
        type=Path,
        help="a folder of texture photographs (searched recursively, .jpg/.png), each area-downscaled by 2 and "
        "taken like the photographs: repeating fine structure, with and without noise",
    )
    ap.add_argument("--threshold", type=float, default=0.0, help="the score's margin, written into the metadata")
    ap.add_argument(
        "--map-temperature", type=float, default=1.0, help="Eq. (noise-map blend)'s T, written into the metadata"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-o", "--out", type=Path, required=True)
    a = ap.parse_args()
    if not 0 < a.patch <= REGION:
        ap.error(f"--patch must be between 1 and {REGION}")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    photos = sorted(a.hq.glob("*.png"))[a.skip :] + sorted(a.wall.glob("*.png"))[a.skip :]
    bsds = sorted((a.bsds / "train").glob("*.jpg")) + sorted((a.bsds / "val").glob("*.jpg"))
    sources = [(p, False) for p in photos + bsds] + ([(p, True) for p in photos] if a.halved else [])
    if a.textures is not None:  # halved: these are web photographs, whose own noise the downscale averages away
        textures = sorted(p for p in a.textures.rglob("*") if p.suffix.lower() in (".jpg", ".jpeg", ".png"))
        if not textures:
            ap.error(f"--textures: no .jpg or .png under {a.textures}")
        sources += [(p, True) for p in textures]
    X1, y1, k1 = synthetic_pairs(sources, np.random.default_rng(0), a.mhc, a.patch)
    X2, y2, k2 = polyu_pairs(a.polyu, a.patch)
    # float16 storage of the patches, as the measured run had them
    X = torch.tensor(
        np.concatenate([np.stack(X1).astype(np.float16), np.stack(X2).astype(np.float16)]).astype(np.float32)
    )
    y = torch.tensor(np.array(y1 + y2)).float()
    kinds = torch.tensor(np.array(k1 + k2))
    n = len(X)
    perm = torch.randperm(n)
    held, train = perm[: n // 10], perm[n // 10 :]
    net = NoisePresenceNet(context=a.context)
    opt = torch.optim.Adam(net.parameters(), 2e-3)
    t0 = time.time()
    for step in range(1, a.steps + 1):
        idx = train[torch.randint(len(train), (64,))]
        xb = X[idx]
        if torch.rand(1) < 0.5:
            xb = xb.flip(-1)
        xb = torch.rot90(xb, int(torch.randint(4, (1,))), (-2, -1))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(net(xb), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 250 == 0:
            with torch.no_grad():
                acc = ((net(X[held]) > 0).float() == y[held]).float().mean()
            print(
                f"step {step}: loss {loss.item():.4f}, held-back accuracy {acc.item():.4f}, {time.time() - t0:.0f} s",
                flush=True,
            )
        if step == int(a.steps * 0.72):
            for g in opt.param_groups:
                g["lr"] = 5e-4
    held_acc = {}
    with torch.no_grad():
        lv = net(X[held])
        for k, name in enumerate(["clean", "camera light", "camera medium", "camera heavy", "white", "PolyU real"]):
            sel = kinds[held] == k
            if sel.any():
                held_acc[name] = round(float(((lv[sel] > 0).float() == y[held][sel]).float().mean()), 4)
    print("held-back accuracy by kind:", held_acc)
    from safetensors.torch import save_file

    a.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"task": "noise-presence", "width": net.width, "context": net.context, "patches": n,
            "threshold": a.threshold, "map_temperature": a.map_temperature,
            "steps": a.steps, "patch": a.patch, "halved": a.halved, "mhc_share": a.mhc,
            "textures": a.textures is not None,
            "held_back_accuracy": held_acc, "recipe": "tools/train_noise_presence.py"}  # fmt: skip
    save_file(
        {k: v.contiguous() for k, v in net.state_dict().items()}, str(a.out), metadata={"config": json.dumps(meta)}
    )
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
