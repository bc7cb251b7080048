"""Average the weights of checkpoints fine-tuned from one start ("model soup", Wortsman et al., ICML 2022):
fine-tunes that start from the same model stay in one basin, so their mean is often better than each.

    python benchmarks/explore/average_weights.py OUT.safetensors A.safetensors B.safetensors [...]

The mean is taken in float32 over the models' tensors (all must share one config); the first
checkpoint's training facts are kept, with the averaged runs' sources and steps listed (``soup_of``, ``soup_steps``).
"""
import sys

import torch

from indeed_cli.checkpoint import load_checkpoint, save_checkpoint

out, srcs = sys.argv[1], sys.argv[2:]
cks = [load_checkpoint(s) for s in srcs]
if any(c.config != cks[0].config for c in cks):
    raise SystemExit("checkpoints differ in config; only fine-tunes of one model can be averaged")
states = [c.model.state_dict() for c in cks]
with torch.no_grad():
    mean = {k: torch.stack([s[k].float() for s in states]).mean(0) for k in states[0]}
model = cks[0].model
model.load_state_dict(mean)
facts = dict(cks[0].training, soup_of=[c.source for c in cks], soup_steps=[c.training.get("steps") for c in cks])
save_checkpoint(out, model, facts, cks[0].extra)
print(out, "mean of", len(cks), "checkpoints")
