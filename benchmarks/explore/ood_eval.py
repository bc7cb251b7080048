"""OOD score variants compared offline on tile_feats.npz (docs/adapt.md: 0.894 / 0.882 / 0.894; 0.894 / 0.929 / 0.854).

One-off exploration kept so that the numbers quoted in docs/ can be re-run; run from the
repository root with the data under $INDEED_DATA (default ../shared/data):

    python benchmarks/explore/ood_eval.py

It ran against commit a9b4567; later API changes may need small edits.
"""
import os
import numpy as np, sys
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[2]))
from indeed_cli.detection import auroc
d = np.load('tile_feats.npz', allow_pickle=True)
f = lambda a: [np.asarray(x, dtype=np.float64) for x in a]
real, syn, train, sig = f(d['real']), f(d['syn']), f(d['train']), d['sig'].astype(float)
lab = lambda a, b: np.r_[np.ones(len(a)), np.zeros(len(b))]
def img_mean(L): return np.array([x.mean(0) for x in L])
def knn(z, P, k, self_=False):
    D = np.sqrt(((z[:, None] - P[None]) ** 2).sum(-1))
    if self_: np.fill_diagonal(D, np.inf)
    return np.sort(D, 1)[:, k - 1]
T = img_mean(train); mu, sd = T.mean(0), T.std(0)
for k in (3, 5, 10):
    sr = knn((img_mean(real) - mu) / sd, (T - mu) / sd, k); ss = knn((img_mean(syn) - mu) / sd, (T - mu) / sd, k)
    thr = np.quantile(knn((T - mu) / sd, (T - mu) / sd, k, True), 0.99)
    print('image-mean knn', k, round(auroc(np.r_[sr, ss], lab(sr, ss)), 3), 'flag real/syn', (sr > thr).mean(), (ss > thr).mean())
Tt = np.concatenate(train); mu_t, sd_t = Tt.mean(0), Tt.std(0)
rng = np.random.default_rng(0); sub = Tt[rng.choice(len(Tt), 4000, replace=False)]
Z = (sub - mu_t) / sd_t
def img_scores(L, k, agg):
    return np.array([agg(knn((x - mu_t) / sd_t, Z, k)) for x in L])
for k in (5, 20):
    for name, agg in (('mean', np.mean), ('median', np.median), ('q90', lambda v: np.quantile(v, 0.9))):
        sr, ss = img_scores(real, k, agg), img_scores(syn, k, agg)
        print('tile knn', k, name, round(auroc(np.r_[sr, ss], lab(sr, ss)), 3))
Dr = np.sqrt((((img_mean(real)[:, None] - T[None]) / sd) ** 2).sum(-1)); Ds = np.sqrt((((img_mean(syn)[:, None] - T[None]) / sd) ** 2).sum(-1))
print('train sigma near PolyU', np.median(sig[np.argsort(Dr, 1)[:, :5]]), 'near CBSD15', np.median(sig[np.argsort(Ds, 1)[:, :5]]))
