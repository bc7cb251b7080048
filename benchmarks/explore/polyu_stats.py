"""Image-level (l_rank, l_sparse, l_fid) of PolyU100 and CBSD68+AWGN 15; no-adaptation PSNR (docs/benchmarks.md: l_sparse alone AUROC 0.985).

One-off exploration kept so that the numbers quoted in docs/ can be re-run; run from the
repository root with the data under $INDEED_DATA (default ../shared/data):

    python benchmarks/explore/polyu_stats.py 100 > polyu_stats.jsonl

It ran against commit 26fb50c; later API changes may need small edits.
"""
import os
DATA = os.environ.get('INDEED_DATA', '../shared/data')
import sys, json, time, glob, numpy as np
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[2]))
from indeed_cli import load_model, decompose
from indeed_cli.imageio import read_image
from indeed_cli.metrics import psnr, add_awgn, image_seed
ck = load_model(None, 3, 'cpu')
rows = []
real = sorted(glob.glob('' + DATA + '/denoise-real/PolyU100/*_real.JPG'))
for p in real[: int(sys.argv[1])]:
    y = read_image(p).data; x = read_image(p.replace('_real', '_mean')).data
    d = decompose(ck, y)
    out = d.maps['L'] + d.maps['S']
    st = d.stats()
    rows.append({'set': 'polyu', 'name': p.split('/')[-1], 'psnr': psnr(out, x), 'psnr_in': psnr(y, x), 'l_rank': st['l_rank'], 'l_sparse': st['l_sparse'], 'l_fid': st['l_fid']})
    print(json.dumps(rows[-1]), flush=True)
for p in sorted(glob.glob('' + DATA + '/denoise-test/CBSD68/*.png'))[: int(sys.argv[1])]:
    x = read_image(p).data
    y = add_awgn(x, 15, image_seed(p.split('/')[-1], 15))
    d = decompose(ck, y); st = d.stats()
    rows.append({'set': 'cbsd15', 'name': p.split('/')[-1], 'psnr': psnr(d.maps['L'] + d.maps['S'], x), 'l_rank': st['l_rank'], 'l_sparse': st['l_sparse'], 'l_fid': st['l_fid']})
    print(json.dumps(rows[-1]), flush=True)
