"""One-off (2026-11-26, eighth session): make the bundled gray model from the last weight average of
the eighth session's fine-tuning rounds (soup_ft_x1.sh, soup_ft2_x1.sh, sigma_weight_x1.sh,
sigma_weight2_x1.sh): training facts that say where it came from, validation PSNR of the averaged
weights on the run's 8 held-out images (computed here, as training computes it), then OOD
statistics from its own training images (calibrate_checkpoint, as every bundled denoiser), on this CPU.

    python benchmarks/explore/average_weights.py g8wsoup.safetensors g8w8.safetensors g8w9.safetensors
    python benchmarks/explore/ship_gray_soup.py g8wsoup.safetensors weights/indeed-denoise-gray.safetensors
"""
import sys
from pathlib import Path

import torch

from indeed_cli.checkpoint import load_checkpoint, save_checkpoint
from indeed_cli.cli.calibrate import calibrate_checkpoint
from indeed_cli.training import list_images, load_images, validate

src, out = Path(sys.argv[1]), Path(sys.argv[2])
prev = load_checkpoint(out).training
ck = load_checkpoint(src)
facts = dict(ck.training)
assert ck.config.sparse_blocks == 4 and prev["total_steps"] == 70014 and facts["soup_steps"] == [7936, 7903]
# one path through the rounds (each round: two runs of 420 s from the same start, sharing one H100)
path_steps = [8370, 7898, 7986, 8216, 7936]
facts.pop("soup_of")
facts.update(
    init=f"indeed-denoise-gray of the previous release (4 blocks, {prev['total_steps']:,} steps)",
    schedule=prev["schedule"] + "; then five rounds of 420 s fine-tuning (peak lr 1e-4, --scales 1,0.75,0.5), "
             "each round two runs with different seeds from the same start on one H100, rounds 1-3 and 5 "
             "continuing from the average of the previous round's two runs, round 4 from one run; rounds 4 and 5 "
             "with --sigma0-noise-ref 25; the model is the average of round 5's two runs",
    total_steps=prev["total_steps"] + sum(path_steps),
    total_train_seconds=prev["total_train_seconds"] + 5 * 420)
paths = [p for d in facts["data"] for p in list_images(d)]
facts["validation"] = validate(ck.model, load_images(paths[-8:], 1), torch.device("cpu"))
save_checkpoint(out, ck.model, facts)
calibrate_checkpoint(out, out, paths[:-8], "cpu", 256, 0, {"data": facts["data"]})  # held-out images stay out
print(out, facts["total_steps"], facts["validation"])
