"""Pixel-wise vs pooled noise precision in adaptation (docs/adapt.md: 37.70 -> 37.68 / 38.30 dB).

One-off exploration kept so that the numbers quoted in docs/ can be re-run; run from the
repository root with the data under $INDEED_DATA (default ../shared/data):

    python benchmarks/explore/ag_exp.py pixel S 1e-5 10 4   and   ... image S 1e-4 20 4 5

It ran against commit 26fb50c; later API changes may need small edits.
"""
import os
DATA = os.environ.get('INDEED_DATA', '../shared/data')
import sys, json, time, glob, numpy as np, torch
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[2]))
import indeed_cli.adaptation as AD
from indeed_cli import load_model, denoise
from indeed_cli import posteriors as P
from indeed_cli.imageio import read_image
from indeed_cli.metrics import psnr
torch.set_num_threads(2)
variant, modules, lr, steps, nimg = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ck = load_model(None, 3, 'cpu')
real = sorted(glob.glob('' + DATA + '/denoise-real/PolyU100/*_real.JPG'))[::100 // nimg][:nimg]
ys = [read_image(p).data for p in real]; xs = [read_image(p.replace('_real', '_mean')).data for p in real]
if variant == 'image':
    def loss(model, Y, modules, sample=True):
        d = model(Y, sample=sample).float()
        pr = model.cfg.priors
        r = Y - d.L_hat - d.S_hat
        n = Y[0].numel()
        with torch.no_grad():
            lam = (pr.alpha0 + 0.5 * n) / (pr.beta0_lambda + 0.5 * r.square().flatten(1).sum(1))
            mo = P.gamma_mean(*P.omega_posterior(d.mu_S, d.sigma_S, pr))
            a_g, b_g = P.gamma_posterior(d.mu_A, d.sigma_A, d.mu_B, d.sigma_B, pr); mg = a_g / b_g
        parts = {'fid': (0.5 * lam * r.square().flatten(1).sum(1)).mean() / n}
        if 'S' in modules: parts['sparse'] = P.sparse_loss(d.mu_S, d.sigma_S, mo).mean() / n
        if 'L' in modules: parts['rank'] = P.rank_loss(d.mu_A, d.sigma_A, d.mu_B, d.sigma_B, mg).mean() / n
        tot = sum(parts.values())
        return tot, {**{k: float(v.detach()) for k, v in parts.items()}, 'abs_N': float((Y - d.L_hat - d.mu_S).abs().mean())}
    AD.adaptation_loss = loss
before = [psnr(denoise(ck, y), x) for y, x in zip(ys, xs)]
t = time.time()
res = AD.adapt(ck, ys, AD.AdaptConfig(modules=modules, lr=lr, steps=steps, patience=int(sys.argv[6]) if len(sys.argv) > 6 else 2), log=lambda r: print(r, flush=True))
t = time.time() - t
after = [psnr(denoise(res.checkpoint, y), x) for y, x in zip(ys, xs)]
print(json.dumps({'variant': variant, 'modules': modules, 'lr': lr, 'steps': steps, 'before': np.mean(before), 'after': np.mean(after), 'best': res.best_step, 'stop': res.stop, 'sec': t}))
