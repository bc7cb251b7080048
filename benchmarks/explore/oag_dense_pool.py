"""OAG with a denser pool of training tiles (stride 32 instead of non-overlapping 128), on the
even half of PolyU100 (the tuning half), against the default pool.  One-off exploration:

    python benchmarks/explore/oag_dense_pool.py ../shared/data/denoise-real/PolyU100 50

Evaluation tiles stay the 16 non-overlapping ones (they come first in the pool).  It ran on
this CPU against commit bdbcf63 (docs/adapt.md); `AdaptConfig.train_stride` is the product form.
"""
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import indeed_cli.adaptation as AD  # noqa: E402
from indeed_cli import denoise, load_model  # noqa: E402
from indeed_cli.imageio import read_image  # noqa: E402
from indeed_cli.metrics import psnr  # noqa: E402
from indeed_cli.tiling import TileGrid  # noqa: E402

folder, n = Path(sys.argv[1]), int(sys.argv[2])
pairs = [(p, p.with_name(p.name.replace("_real", "_mean"))) for p in sorted(folder.glob("*_real.*"))][0::2][:n]
ck = load_model(None, 3, "cpu")
default_tiles = AD.tiles_of


def dense_tiles(images, tile, max_tiles, gen, stride=32):
    base = default_tiles(images, tile, max_tiles, gen)
    extra = []
    for im in images:
        t = torch.from_numpy(np.ascontiguousarray(im, dtype=np.float32))
        g = TileGrid(t.shape[1], t.shape[2], tile, tile - stride)
        extra.extend(g.cut(t, y, x) for y, x in g.positions())
    return torch.cat([base, torch.stack(extra)])[:max_tiles]


for name, fn in (("default", default_tiles), ("dense", dense_tiles)):
    AD.tiles_of = fn
    vals, t0 = [], time.perf_counter()
    for noisy, clean in pairs:
        y, x = read_image(noisy).data, read_image(clean).data
        res = AD.adapt(ck, [y])
        vals.append((psnr(denoise(ck, y), x), psnr(denoise(res.checkpoint, y), x), res.best_step))
    v = np.array(vals)
    print(f"{name}: n {len(v)} none {v[:, 0].mean():.3f} oag {v[:, 1].mean():.3f} mean best step {v[:, 2].mean():.1f} "
          f"({time.perf_counter() - t0:.0f} s)", flush=True)
