"""x8 geometric self-ensemble of the bundled gray denoiser (one-off check, docs/benchmarks.md):
python benchmarks/explore/self_ensemble.py SIGMA FOLDER N  ->  sigma, set, n, PSNR plain, PSNR x8."""
import sys, numpy as np
from pathlib import Path
from indeed_cli import InferenceOptions, denoise, load_model
from indeed_cli.imageio import read_image
from indeed_cli.metrics import add_awgn, image_seed, psnr
ck = load_model(None, 1, "cpu")
s = float(sys.argv[1]); d = Path(sys.argv[2]); lim = int(sys.argv[3])
p1, p8 = [], []
for f in sorted(d.iterdir())[:lim]:
    x = read_image(f).data
    x = x.mean(0, keepdims=True) if x.shape[0] == 3 else x
    y = add_awgn(x, s, image_seed(f.name, s))
    outs = []
    for k in range(4):
        for fl in (False, True):
            t = np.rot90(y, k, (1, 2)); t = t[:, :, ::-1] if fl else t
            o = denoise(ck, np.ascontiguousarray(t))
            o = o[:, :, ::-1] if fl else o
            outs.append(np.rot90(o, -k, (1, 2)))
    p1.append(psnr(outs[0], x)); p8.append(psnr(np.mean(outs, 0), x))
print(s, d.name, len(p1), round(np.mean(p1), 3), round(np.mean(p8), 3))
