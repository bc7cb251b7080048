"""One-off (2026-11-26, seventh session): make the grown gray model of grow_ft_x1.sh (run g7b4: the
previous bundled gray model grown to 4 residual blocks per U-Net scale, then fine-tuned 540 s), and
then its further fine-tune of grow_ft2_x1.sh (run g7b4c), the bundled one: training facts that say where it came from, then OOD statistics from its own training
images (calibrate_checkpoint, as every bundled denoiser), on this CPU.

    python benchmarks/explore/ship_gray_b4.py /work/.device/1/g7b4.safetensors weights/indeed-denoise-gray.safetensors
    python benchmarks/explore/split_safetensors.py join /work/.device/3/g7b4c g7b4c.safetensors
    python benchmarks/explore/ship_gray_b4.py g7b4c.safetensors weights/indeed-denoise-gray.safetensors
"""
import sys
from pathlib import Path

from indeed_cli.checkpoint import load_checkpoint, save_checkpoint
from indeed_cli.cli.calibrate import calibrate_checkpoint
from indeed_cli.training import list_images

src, out = Path(sys.argv[1]), Path(sys.argv[2])
prev = load_checkpoint(out).training
ck = load_checkpoint(src)
facts = dict(ck.training)
assert ck.config.sparse_blocks == 4
if facts["init"] == "runs/grown4.safetensors":  # grow_ft_x1.sh's g7b4
    init = (f"indeed-denoise-gray of the previous release ({prev['total_steps']:,} steps), grown to 4 blocks per "
            "U-Net scale by benchmarks/explore/grow_blocks.py (new blocks start as identities)")
    what = "then grown, and a"
else:  # grow_ft2_x1.sh's g7b4c: the grown model fine-tuned once more
    assert facts["init"] == "weights/indeed-denoise-gray.safetensors" and prev["steps"] == 11798
    init = f"indeed-denoise-gray of the previous release (4 blocks, {prev['total_steps']:,} steps)"
    what = "then a further"
facts.update(
    init=init,
    schedule=prev["schedule"] + f"; {what} {facts['train_seconds']} s fine-tune of {facts['steps']} "
             "steps x 64 with --scales 1,0.75,0.5, peak lr 1e-4, on one H100 shared with one other run",
    total_steps=prev["total_steps"] + facts["steps"],
    total_train_seconds=prev["total_train_seconds"] + facts["train_seconds"])
paths = [p for d in facts["data"] for p in list_images(d)][:-8]  # the 8 held-out validation images stay out
save_checkpoint(out, ck.model, facts)
calibrate_checkpoint(out, out, paths, "cpu", 256, 0, {"data": facts["data"]})
print(out, facts["total_steps"], facts["validation"])
