"""PSNR, objective and output change along an adaptation run (docs/adapt.md: +1.2 dB at change 1.4).

One-off exploration kept so that the numbers quoted in docs/ can be re-run; run from the
repository root with the data under $INDEED_DATA (default ../shared/data):

    python benchmarks/explore/ag_curve2.py image S 1e-4 16 4 2 1

It ran against commit 26fb50c; later API changes may need small edits.
"""
import os
DATA = os.environ.get('INDEED_DATA', '../shared/data')
import sys, json, time, glob, copy, numpy as np, torch
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[2]))
import indeed_cli.adaptation as AD
from indeed_cli import load_model, denoise
from indeed_cli import posteriors as P
from indeed_cli.imageio import read_image
from indeed_cli.metrics import psnr
torch.set_num_threads(2)
variant, modules, lr, steps, nimg = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
ck = load_model(None, 3, 'cpu')
off = int(sys.argv[7]) if len(sys.argv) > 7 else 0
real = sorted(glob.glob('' + DATA + '/denoise-real/PolyU100/*_real.JPG'))[off::100 // nimg][:nimg]
ys = [read_image(p).data for p in real]; xs = [read_image(p.replace('_real', '_mean')).data for p in real]
def loss(model, Y, sample=True):
    d = model(Y, sample=sample).float()
    pr = model.cfg.priors
    r = Y - d.L_hat - d.S_hat
    n = Y[0].numel()
    if variant == 'image':
        lam_terms = (pr.alpha0 + 0.5 * n) * torch.log(pr.beta0_lambda + 0.5 * r.square().flatten(1).sum(1)) / n
    else:
        lam_terms = ((pr.alpha0 + 0.5) * torch.log(pr.beta0_lambda + 0.5 * r.square())).flatten(1).sum(1) / n
    om = ((pr.alpha0 + 0.5) * torch.log(pr.beta0_omega + 0.5 * (d.mu_S.square() + d.sigma_S.square())) - 0.5 * torch.log(d.sigma_S.square() + 1e-12)).flatten(1).sum(1) / n
    tot = lam_terms.mean() + (om.mean() if 'S' in modules else 0)
    return tot, float(lam_terms.mean()), float(om.mean())
model = copy.deepcopy(ck.model).float(); model.requires_grad_(False)
tr = [p for m in model.modules_for(modules) for p in m.parameters()]
for p in tr: p.requires_grad_(True)
opt = torch.optim.Adam(tr, lr=lr)
g = torch.Generator().manual_seed(0); torch.manual_seed(0)
pool = AD.tiles_of(ys, 128, 512, g); ev = pool[:16]
from indeed_cli.checkpoint import Checkpoint
X0 = None
def report(step):
    global X0
    model.eval()
    with torch.no_grad():
        l, a, b = loss(model, ev, False); d = model(ev); X = d.L_hat + d.mu_S
    X0 = X if X0 is None else X0
    ch = float((X - X0).square().mean().sqrt() * 255); rn = float((ev - X).square().mean().sqrt() * 255)
    c = Checkpoint(model, ck.config)
    ps = np.mean([psnr(denoise(c, y), x) for y, x in zip(ys, xs)])
    print(json.dumps({'step': step, 'loss': float(l), 'fid': a, 'sp': b, 'psnr': ps, 'change': ch, 'rmsN': rn}), flush=True)
report(0)
for s in range(1, steps + 1):
    model.train()
    idx = torch.randint(len(pool), (8,), generator=g)
    l, _, _ = loss(model, pool[idx], True)
    opt.zero_grad(); l.backward(); opt.step()
    if s % int(sys.argv[6]) == 0: report(s)
