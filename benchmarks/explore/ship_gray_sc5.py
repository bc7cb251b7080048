"""One-off (2026-11-26, sixth session): make the fine-tuned gray model of scales_ft_x1.sh (run g_sc5)
the bundled one: its training facts say what it was fine-tuned from, then OOD statistics from its
own training images, as for the first export (export_state.py), on this CPU.

    python benchmarks/explore/ship_gray_sc5.py /work/.device/4/g_sc5.safetensors weights/indeed-denoise-gray.safetensors
"""
import sys
from pathlib import Path

from indeed_cli.checkpoint import load_checkpoint, save_checkpoint
from indeed_cli.cli.calibrate import calibrate_checkpoint
from indeed_cli.training import list_images

src, out = Path(sys.argv[1]), Path(sys.argv[2])
data = [".carry/train400", ".carry/bsds/CBSD432_list.txt"]
paths = [p for d in data for p in list_images(d)][:-8]  # the 8 held-out validation images stay out
ck = load_checkpoint(src)
facts = dict(ck.training)
assert facts["init"].endswith("indeed-denoise-gray.safetensors") and facts["augment_scales"] == [1.0, 0.75, 0.5]
facts.update(
    init="indeed-denoise-gray of the previous release (38,079 steps, 1,500 s)", data=data,
    schedule="the previous release's 38,079 steps (470 s sharing one GPU, then 2 x ~510 s with DDP on 2 GPUs), "
             f"then a {facts['train_seconds']} s fine-tune of {facts['steps']} steps x 64 with --scales 1,0.75,0.5, "
             "peak lr 2e-4, on one H100 shared with two other runs",
    total_steps=38079 + facts["steps"], total_train_seconds=1500 + facts["train_seconds"])
save_checkpoint(out, ck.model, facts)
calibrate_checkpoint(out, out, paths, "cpu", 256, 0, {"data": data})
print(out, facts["total_steps"], facts["validation"])
