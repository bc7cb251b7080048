#!/usr/bin/env python3
"""Fetch the 37 wallpaper photographs the full-chroma denoisers were trained on (weights/README.md,
"Licences of the training data") from Debian packages, and area-downscale them so that their
JPEG and chroma artefacts vanish: by 0.35 when the shorter side is at least 2000 px, else by 0.6.

python tools/fetch_wallpapers.py --out DIR [--debs DIR]

Without --debs it runs `apt-get download` for the four packages (about 170 MB) into a temporary
folder; with --debs it takes the .deb files from there. Then build the training set from DIR:

python tools/build_training_set.py DIR ... --out data/set --tests ../shared/data/denoise-test --holdout 0.2

Needs dpkg-deb (Debian, Ubuntu). Writes DIR/NAME.png for each photograph and DIR/SOURCES.txt
(package, file inside it, size before and after); DIR must not exist yet.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image

# package -> photographs: a file name stem under usr/share/backgrounds (lomiri, mate) or a folder
# under usr/share/wallpapers whose largest image is taken (plasma); the natural photographs only
WALLPAPERS = {
    "lomiri-wallpapers-16.04": [
        "Bridge_by_Sander_Klootwijk",
        "Dragonfly_by_Bolly",
        "Picture_0B_by_freespace",
        "Picture_1A_by_freespace",
        "Wine_by_Jakkub_Mede",
        "aitzgorri_by_Aitzol_Berasategi",
        "friends_by_Aitzol_Berasategi",
        "life_by_Aitzol_Berasategi",
        "picosdeeuropa_by_Aitzol_Berasategi",
        "sunset_by_Aitzol_Berasategi",
        "free_by_Peter_Nerlich",
        "greentock_by_Peter_Nerlich",
        "seeding_by_Clements_Engelhardt",
    ],
    "lomiri-wallpapers-20.04": ["Kleiber_by_Lukas_Baubkus"],
    "mate-backgrounds": [
        "Aqua",
        "Blinds",
        "Dune",
        "FreshFlower",
        "Garden",
        "GreenMeadow",
        "LadyBird",
        "RainDrops",
        "Storm",
        "TwoWings",
        "Wood",
        "YellowFlower",
    ],
    "plasma-workspace-wallpapers": [
        "BytheWater",
        "ColdRipple",
        "ColorfulCups",
        "DarkestHour",
        "EveningGlow",
        "FallenLeaf",
        "Kite",
        "OneStandsOut",
        "Path",
        "summer_1am",
        "Volna",
    ],
}
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png"}


def downscale_factor(width: int, height: int) -> float:
    """0.35 for photographs of at least 2000 px on the shorter side, else 0.6 (the model card's rule)."""
    return 0.35 if min(width, height) >= 2000 else 0.6


def find_photograph(root: Path, name: str) -> Path | None:
    """``name``'s file in an extracted package tree: usr/share/backgrounds/**/NAME.* or the image of most
    pixels in usr/share/wallpapers/NAME/contents/images/ (links followed: some sizes link to one file)."""
    images = root / "usr/share/wallpapers" / name / "contents/images"
    if images.is_dir():
        found = sorted({p.resolve() for p in images.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES})

        def pixels(p: Path) -> int:
            with Image.open(p) as im:
                return im.width * im.height

        return max(found, key=pixels) if found else None
    found = [p for p in (root / "usr/share/backgrounds").rglob(f"{name}.*") if p.suffix.lower() in IMAGE_SUFFIXES]
    return found[0] if found else None


def write_downscaled(src: Path, dst: Path) -> tuple[tuple[int, int], tuple[int, int]]:
    """Area-filter ``src`` by :func:`downscale_factor` into the PNG ``dst``; returns both sizes."""
    with Image.open(src) as im:
        im = im.convert("RGB")
        f = downscale_factor(*im.size)
        size = (max(1, round(im.width * f)), max(1, round(im.height * f)))
        im.resize(size, Image.Resampling.BOX).save(dst)
        return im.size, size


def _command_error(cmd: list[str], cwd: Path | None = None) -> str:
    """Run ``cmd``; "" when it succeeded, else one line saying what failed."""
    try:
        got = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    except OSError as e:
        return f"cannot run {cmd[0]} ({e.strerror}); it needs a Debian or Ubuntu system"
    last = (got.stderr.strip().splitlines() or [""])[-1]
    return f"{' '.join(cmd[:2])} failed: {last}" if got.returncode else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--out", required=True, type=Path, help="a new folder for the PNGs")
    ap.add_argument("--debs", type=Path, help="folder with the four .deb files (default: apt-get download them)")
    a = ap.parse_args()
    if a.out.exists():
        print(f"error: {a.out} exists; give a new folder", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        debs = a.debs or Path(tmp) / "debs"
        if a.debs is None:
            debs.mkdir()
            failed = _command_error(["apt-get", "download", *WALLPAPERS], cwd=debs)
            if failed:
                print(f"error: {failed}", file=sys.stderr)
                return 1
        rows, missing = [], []
        part = Path(tmp) / "part"
        part.mkdir()
        for package, names in WALLPAPERS.items():
            deb = sorted(debs.glob(f"{package}_*.deb"))
            if not deb:
                missing.append(f"{package} (no .deb in {debs})")
                continue
            root = Path(tmp) / package
            failed = _command_error(["dpkg-deb", "-x", str(deb[-1]), str(root)])
            if failed:
                print(f"error: {failed}", file=sys.stderr)
                return 1
            for name in names:
                src = find_photograph(root, name)
                if src is None:
                    missing.append(f"{package}: {name}")
                    continue
                before, after = write_downscaled(src, part / f"{name}.png")
                rows.append(f"{package}\t{src.relative_to(root)}\t{before[0]}x{before[1]}\t{after[0]}x{after[1]}")
        if missing:  # nothing is written unless every photograph was found
            print("error: not found: " + "; ".join(missing), file=sys.stderr)
            return 1
        (part / "SOURCES.txt").write_text("package\tfile\tsize\tdownscaled\n" + "\n".join(rows) + "\n")
        a.out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(part), str(a.out))
    print(f"{len(rows)} photographs in {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
