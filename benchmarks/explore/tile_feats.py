"""Per-tile (l_rank, l_sparse) of PolyU100, CBSD68+AWGN 15 and 256 noisy training images, bf16 (input of ood_eval.py).

One-off exploration kept so that the numbers quoted in docs/ can be re-run; run from the
repository root with the data under $INDEED_DATA (default ../shared/data):

    python benchmarks/explore/tile_feats.py   (writes tile_feats.npz here)

It ran against commit a9b4567; later API changes may need small edits.
"""
import os
DATA = os.environ.get('INDEED_DATA', '../shared/data')
import sys, glob, numpy as np, torch
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[2]))
from indeed_cli import load_model, decompose, InferenceOptions
from indeed_cli.imageio import read_image
from indeed_cli.metrics import add_awgn, image_seed
from indeed_cli.training import list_images, load_images, add_noise
ck = load_model(None, 3, 'cpu')
o = InferenceOptions(precision='bf16')
def tf(y):
    d = decompose(ck, y, o)
    return np.stack([d.tiles['l_rank'].ravel(), d.tiles['l_sparse'].ravel()], 1), d.stats()
out = {}
real = sorted(glob.glob('' + DATA + '/denoise-real/PolyU100/*_real.JPG'))
out['real'] = [tf(read_image(p).data)[0] for p in real]
cb = sorted(glob.glob('' + DATA + '/denoise-test/CBSD68/*.png'))
out['syn'] = [tf(add_awgn(read_image(p).data, 15, image_seed(p.split('/')[-1], 15)))[0] for p in cb]
ims = load_images(list_images('' + DATA + '/denoise-train/BSDS500/CBSD432_list.txt'), 3)
gen = torch.Generator().manual_seed(0)
tr, sig = [], []
for i in range(256):
    im = ims[int(torch.randint(len(ims), (1,), generator=gen))]
    noisy, s = add_noise(im[None].float() / 255, 75.0, 0.5, gen)
    tr.append(tf(noisy[0].numpy())[0]); sig.append(float(s[0]) * 255)
out['train'] = tr
np.savez('tile_feats.npz', real=np.array(out['real'], dtype=object), syn=np.array(out['syn'], dtype=object), train=np.array(tr, dtype=object), sig=np.array(sig))
print('done')
