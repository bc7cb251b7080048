"""Training: noise model, resumable state, and that the loss actually goes down."""

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_config, write_png

from indeed_cli.model import InDeed
from indeed_cli.model import posteriors as P
from indeed_cli.tasks.training import (
    LossWeights,
    PatchSampler,
    TrainConfig,
    add_noise,
    has_state,
    load_state,
    lr_at,
    noise_levels,
    save_state,
    training_loss,
)
from indeed_cli.tasks.training import (
    run_training as train,
)


def test_noise_levels_and_clipping():
    g = torch.Generator().manual_seed(0)
    clean = torch.full((400, 1, 16, 16), 0.5)
    noisy, sigma = add_noise(clean, 75.0, 0.0, g)
    assert (sigma > 0).all() and (sigma <= 75 / 255).all()
    est = (noisy - clean).flatten(1).std(1)
    assert torch.allclose(est, sigma, rtol=0.25)
    noisy, _ = add_noise(clean, 75.0, 1.0, g)
    assert noisy.min() >= 0 and noisy.max() <= 1
    assert torch.allclose(noisy * 255, torch.round(noisy * 255), atol=1e-4)


def test_noise_level_power_moves_patches_to_low_noise():
    # P(sigma <= s) = (s / max)^(1 / power): the empirical share at a third of the range, and the
    # uniform levels of power 1 drawn exactly as before the option existed
    for power, expected in [(1.0, 1 / 3), (2.0, (1 / 3) ** 0.5), (3.0, (1 / 3) ** (1 / 3))]:
        s = noise_levels(20000, 60.0, power, torch.Generator().manual_seed(0)) * 255
        assert (s > 0).all() and (s <= 60.0 + 1e-4).all()
        assert float((s <= 20.0).float().mean()) == pytest.approx(expected, abs=0.015)
    g = torch.Generator().manual_seed(3)
    uniform = (1.0 - torch.rand(64, generator=g)) * 60.0 / 255.0
    assert torch.equal(noise_levels(64, 60.0, 1.0, torch.Generator().manual_seed(3)), uniform)
    with pytest.raises(ValueError, match="sigma-power"):
        TrainConfig(sigma_power=0.0).check()


def test_patch_sampler_is_seeded_and_refuses_small_images():
    ims = [torch.randint(0, 256, (3, 40, 50), dtype=torch.uint8) for _ in range(3)]
    a = PatchSampler(ims, 32, torch.device("cpu"), torch.Generator().manual_seed(1)).sample(4)
    b = PatchSampler(ims, 32, torch.device("cpu"), torch.Generator().manual_seed(1)).sample(4)
    assert a.shape == (4, 3, 32, 32) and torch.equal(a, b)
    with pytest.raises(ValueError, match="smaller"):
        PatchSampler(ims, 64, torch.device("cpu"), torch.Generator())


def test_lr_schedule_warms_up_and_decays():
    tc = TrainConfig(steps=100, warmup=10, lr=1e-3, lr_min=0.0)
    assert lr_at(0, tc) < lr_at(9, tc) <= 1e-3
    assert lr_at(99, tc) < 1e-5
    tc = TrainConfig(steps=10**9, warmup=0, lr=1e-3, lr_min=0.0, time_budget=100)
    assert lr_at(5, tc, elapsed=100) == pytest.approx(0.0, abs=1e-9)


def test_loss_decreases_on_a_fixed_batch():
    torch.manual_seed(0)
    m = InDeed(tiny_config(1)).train()
    g = torch.Generator().manual_seed(0)
    clean = torch.rand(4, 1, 32, 32)
    noisy, _ = add_noise(clean, 30, 0.0, g)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3)
    w = LossWeights()
    losses = []
    for _ in range(60):
        total, parts = training_loss(m, noisy, {"clean": clean}, "denoise", w, m.cfg.priors)
        opt.zero_grad()
        total.backward()
        opt.step()
        losses.append(parts["sup"])
    assert set(parts) == {"sup", "orth", "fid", "rank", "sparse"}
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    _, parts = training_loss(m, noisy, {"clean": clean}, "denoise", LossWeights(bayesian=False), m.cfg.priors)
    assert set(parts) == {"sup", "orth"}


def test_noise_level_weights_scale_each_patch_supervision():
    """--sigma0-noise-ref: patch i's l_sup is multiplied by ref / max(sigma_i, ref / 5)."""
    from indeed_cli.tasks.training import noise_level_weights

    sigma = torch.tensor([1.0, 5.0, 15.0, 25.0, 75.0]) / 255.0
    np.testing.assert_allclose(noise_level_weights(sigma, 25.0).numpy(), [5, 5, 25 / 15, 1, 1 / 3], rtol=1e-5)
    torch.manual_seed(0)
    m = InDeed(tiny_config(1)).eval()
    clean = torch.rand(2, 1, 32, 32)
    g = torch.Generator().manual_seed(0)
    noisy, sig = add_noise(clean, 75, 0.0, g)
    targets = {"clean": clean, "sigma": sig}
    parts = {}
    for ref in (0.0, 25.0):
        torch.manual_seed(1)  # the same reparameterisation draws for both
        _, parts[ref] = training_loss(m, noisy, targets, "denoise", LossWeights(sigma0_noise_ref=ref), m.cfg.priors)
    torch.manual_seed(1)
    with torch.no_grad():
        d = m(noisy, sample=True).float()
    per_patch = P.denoise_supervision_loss(d.L_hat, d.S_hat, clean, LossWeights().sigma0) / clean[0].numel()
    assert parts[0.0]["sup"] == pytest.approx(float(per_patch.mean()), rel=1e-5)
    assert parts[25.0]["sup"] == pytest.approx(float((per_patch * noise_level_weights(sig, 25.0)).mean()), rel=1e-5)
    assert parts[25.0]["fid"] == pytest.approx(parts[0.0]["fid"], rel=1e-6)  # only l_sup changes


def test_patch_precision_gives_each_patch_the_gradient_of_its_log_error():
    """--patch-precision: uncapped, patch i's l_sup is scaled by mean(e) / e_i, so every weighted error
    equals the mean and the gradient is mean(e) * grad sum_i log e_i; the cap bounds each factor."""
    from indeed_cli.tasks.training import patch_precision_weights

    e = torch.tensor([0.5, 2.0, 50.0, 1e-3])
    w = patch_precision_weights(e, 1e9)
    np.testing.assert_allclose((w * e).numpy(), np.full(4, float(e.mean())), rtol=1e-5)
    assert float(patch_precision_weights(e, 20.0).max()) == pytest.approx(20.0)
    assert float(patch_precision_weights(e, 20.0)[2]) == pytest.approx(float(e.mean() / 50.0))

    theta = torch.tensor([0.3, -1.2, 2.0], requires_grad=True)
    x = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0], [1.0, 1.0, 4.0]])
    errors = (x @ theta - torch.tensor([1.0, 0.5, -2.0])).square() + 0.1
    (grad,) = torch.autograd.grad((errors * patch_precision_weights(errors, 1e9)).sum(), theta, retain_graph=True)
    (expected,) = torch.autograd.grad(float(errors.detach().mean()) * errors.log().sum(), theta)
    np.testing.assert_allclose(grad.numpy(), expected.numpy(), rtol=1e-5)


def _denoise_loss_parts(clean: torch.Tensor, sigma: float, variants: dict) -> tuple:
    """A tiny gray model's training-loss parts on ``clean`` + AWGN for each {key: LossWeights}, all on the same
    sampled A, B, S (seeded), and that sample's decomposition for checking them."""
    torch.manual_seed(0)
    m = InDeed(tiny_config(1)).eval()
    noisy, sig = add_noise(clean, sigma, 0.0, torch.Generator().manual_seed(0))
    parts = {}
    for key, weights in variants.items():
        torch.manual_seed(1)
        _, parts[key] = training_loss(m, noisy, {"clean": clean, "sigma": sig}, "denoise", weights, m.cfg.priors)
    torch.manual_seed(1)
    with torch.no_grad():
        d = m(noisy, sample=True).float()
    return m, parts, d


def test_training_loss_applies_patch_precision_to_l_sup_only():
    clean = torch.rand(3, 1, 32, 32)
    variants = {cap: LossWeights(patch_precision=cap) for cap in (0.0, 20.0)}
    _, parts, d = _denoise_loss_parts(clean, 75, variants)
    from indeed_cli.tasks.training import patch_precision_weights

    per_patch = P.denoise_supervision_loss(d.L_hat, d.S_hat, clean, LossWeights().sigma0) / clean[0].numel()
    weighted = per_patch * patch_precision_weights(per_patch, 20.0)
    assert parts[20.0]["sup"] == pytest.approx(float(weighted.mean()), rel=1e-5)
    assert parts[20.0]["sup"] <= parts[0.0]["sup"] * (1 + 1e-6)  # each weighted error is at most the mean
    assert parts[20.0]["fid"] == pytest.approx(parts[0.0]["fid"], rel=1e-6)


def test_training_loss_adds_rank_supervision_only_when_asked():
    torch.manual_seed(0)
    clean = torch.rand(2, 1, 32, 1) * torch.rand(2, 1, 1, 32)  # rank 1: fewer than the untrained model's n
    m, parts, d = _denoise_loss_parts(clean, 25, {w: LossWeights(rank_sup=w) for w in (0.0, 3.0)})
    assert "rank_sup" not in parts[0.0]
    _, beta = P.gamma_posterior(d.mu_A, d.sigma_A, d.mu_B, d.sigma_B, m.cfg.priors)
    n_star = P.energy_rank(clean, cap=m.cfg.rank).clamp_min(1)
    expected = 3.0 * float(P.rank_supervision_loss(beta, n_star).mean())
    assert expected > 0 and parts[3.0]["rank_sup"] == pytest.approx(expected, rel=1e-5)
    assert parts[3.0]["sup"] == pytest.approx(parts[0.0]["sup"], rel=1e-6)


def test_ranked_batches_are_the_same_batches_with_their_own_clean_ranks():
    """RankedBatches draws one batch ahead: it returns make_batch's batches in their order, each with the SVD
    ranks of its own first RANK_PATCHES clean patches."""
    from indeed_cli.tasks.training import TrainConfig
    from indeed_cli.tasks.training.batches import RANK_PATCHES, RankedBatches, denoise_batch
    from indeed_cli.tasks.training.data import PatchSampler

    images = [torch.rand(3, 40, 48) for _ in range(2)]
    tc = TrainConfig(patch=32, losses=LossWeights(rank_sup=1.0))

    def batches(make, count):
        gen = torch.Generator().manual_seed(0)
        sampler = PatchSampler(images, 32, torch.device("cpu"), torch.Generator().manual_seed(1))
        return [make(sampler, RANK_PATCHES + 3, tc, gen) for _ in range(count)]

    plain, ranked = batches(denoise_batch, 3), batches(RankedBatches(denoise_batch), 3)
    for (y0, t0), (y1, t1) in zip(plain, ranked, strict=True):
        assert torch.equal(y0, y1) and torch.equal(t0["clean"], t1["clean"]) and "rank" not in t0
        assert torch.equal(t1["rank"].result(), P.energy_rank(t0["clean"][:RANK_PATCHES]))


def test_rank_supervision_needs_a_denoiser():
    from indeed_cli.tasks.training import TrainConfig

    with pytest.raises(ValueError, match="rank-supervision"):
        TrainConfig(task="detect", losses=LossWeights(rank_sup=1.0)).check()
    with pytest.raises(ValueError, match="rank-supervision"):
        TrainConfig(losses=LossWeights(rank_sup=-1.0)).check()


def test_state_round_trip(tmp_path):
    torch.manual_seed(0)
    m = InDeed(tiny_config(3))
    opt = torch.optim.Adam(m.parameters())
    m(torch.rand(1, 3, 16, 16)).L_hat.sum().backward()
    opt.step()
    g = torch.Generator().manual_seed(5)
    g.manual_seed(7)
    save_state(tmp_path, m, opt, 42, g, {"x": 1}, elapsed=12.5)
    assert has_state(tmp_path)
    m2 = InDeed(tiny_config(3))
    opt2 = torch.optim.Adam(m2.parameters())
    g2 = torch.Generator()
    step, elapsed = load_state(tmp_path, m2, opt2, g2)
    assert (step, elapsed) == (42, 12.5)
    with_state = 0
    for a, b in zip(m.parameters(), m2.parameters()):
        assert torch.equal(a, b)
        if a in opt.state:
            with_state += 1
            assert torch.allclose(opt.state[a]["exp_avg_sq"], opt2.state[b]["exp_avg_sq"], rtol=1e-2)
    assert with_state > 0
    assert torch.equal(torch.randint(1000, (5,), generator=g), torch.randint(1000, (5,), generator=g2))


def _random_colour_pngs(tmp_path: Path, rng, n: int) -> Path:
    """A folder tmp_path/data of ``n`` random 40 x 40 colour PNGs, training images for the tiny models."""
    data = tmp_path / "data"
    data.mkdir()
    for i in range(n):
        write_png(data / f"{i}.png", rng.integers(0, 256, (40, 40, 3), dtype=np.uint8))
    return data


def test_train_resumes_and_exports(tmp_path, rng):
    data = _random_colour_pngs(tmp_path, rng, 4)
    from indeed_cli.tasks.training import list_images, load_images

    ims = load_images(list_images(data), 3)
    tc = TrainConfig(steps=4, batch=2, patch=32, log_every=2, val_every=2, save_every=100)
    out = tmp_path / "run"
    train(tiny_config(3), tc, ims[:3], out, ims[3:], device="cpu", progress=False, log=lambda m: None)
    assert (out / "model.safetensors").exists() and has_state(out)
    tc = TrainConfig(steps=6, batch=2, patch=32, log_every=2, val_every=2, save_every=100)
    msgs = []
    rec = train(tiny_config(3), tc, ims[:3], out, ims[3:], device="cpu", progress=False, log=msgs.append)
    assert any("resumed" in m and "step 4" in m for m in msgs)
    assert rec["step"] == 6 and "psnr_s25" in rec
    logs = [json.loads(l) for l in (out / "log.jsonl").read_text().splitlines()]
    assert any("sparse" in l for l in logs)
    from indeed_cli.model import read_metadata

    assert read_metadata(out / "model.safetensors")["training"]["steps"] == 6


def _ddp_rank(rank: int, port: int, data: str, out: str, result, case: str) -> None:
    import os

    os.environ.update(
        WORLD_SIZE="2", RANK=str(rank), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )
    torch.set_num_threads(1)
    # as on a machine with GPUs: device="cpu" must still run on the CPU, with gloo (NCCL would
    # refuse CPU tensors; a CPU build of torch has no NCCL at all)
    torch.cuda.is_available = lambda: True
    import indeed_cli.tasks.training.loop as T
    from indeed_cli.tasks.training import list_images, load_images

    ims = load_images(list_images(data), 3)
    # "time": only rank 1 runs out of time; "nan": only rank 1 sees a non-finite loss (first batch).
    # Either way both ranks must take the same decision at the same step.
    tc = TrainConfig(
        steps=40 if case == "time" else 3,
        batch=2,
        patch=32,
        save_every=1000,
        time_limit=1e-9 if case == "time" and rank == 1 else 0,
    )
    if case == "nan" and rank == 1:
        original, calls = T.training_loss, []

        def first_loss_nan(*args, **kwargs):
            total, parts = original(*args, **kwargs)
            calls.append(1)
            return (total * float("nan") if len(calls) == 1 else total), parts

        T.training_loss = first_loss_nan
    rec = train(tiny_config(3), tc, ims, Path(out), device="cpu", progress=False, log=lambda m: None)
    result.put((rank, rec["step"]))


@pytest.mark.slow  # two processes with torch.distributed
@pytest.mark.parametrize("case", ["time", "nan"])
def test_ddp_ranks_agree_on_stopping_and_skipping(tmp_path, rng, case):
    """A rank whose clock says stop, or whose batch is skipped, must not leave the others
    waiting in DDP's all-reduce."""
    import socket

    import torch.multiprocessing as mp

    data = _random_colour_pngs(tmp_path, rng, 2)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    result = ctx.Queue()
    procs = [
        ctx.Process(target=_ddp_rank, args=(r, port, str(data), str(tmp_path / "run"), result, case)) for r in (0, 1)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    alive = [p.is_alive() for p in procs]
    for p in procs:
        p.kill()
    assert not any(alive), "a rank hung"
    steps = dict(result.get(timeout=5) for _ in procs)
    assert steps[0] == steps[1]
    assert steps[0] < 40 if case == "time" else steps[0] == 3


def test_deterministic_mode_is_on_during_training_only_and_repeats_runs(tmp_path, rng):
    """--deterministic: PyTorch's deterministic kernels and no cuDNN autotuning while training,
    the caller's settings back afterwards, the same weights from the same command, recorded in
    the checkpoint; a time-based schedule is refused."""
    from safetensors.torch import load_file

    from indeed_cli.model import read_metadata
    from indeed_cli.tasks.training import denoise_batch as _denoise_batch

    ims = [torch.from_numpy(rng.integers(0, 256, (3, 40, 40), dtype=np.uint8)) for _ in range(3)]
    seen = []

    def batch(sampler, n, tc, gen):  # the default batches, noting the backend settings in force
        seen.append((torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark))
        return _denoise_batch(sampler, n, tc, gen)

    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark)
    weights = []
    for run in ("a", "b"):
        tc = TrainConfig(steps=3, batch=2, patch=32, log_every=100, save_every=100, deterministic=True)
        train(
            tiny_config(3),
            tc,
            ims,
            tmp_path / run,
            None,
            device="cpu",
            progress=False,
            log=lambda m: None,
            make_batch=batch,
        )
        weights.append(load_file(str(tmp_path / run / "model.safetensors")))
    assert seen == [(True, False)] * 6
    assert (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark) == before
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert read_metadata(tmp_path / "a" / "model.safetensors")["training"]["deterministic"] is True
    with pytest.raises(ValueError, match="step-based"):
        train(
            tiny_config(3),
            TrainConfig(steps=3, deterministic=True, time_budget=10),
            ims,
            tmp_path / "c",
            device="cpu",
            progress=False,
            log=lambda m: None,
        )


def test_fine_tune_config_changes_only_the_switchable_fields():
    from indeed_cli.model.config import fine_tune_config

    det = tiny_config(1, task="detect")
    asked = {"rank": 32, "sparse_width": 64, "support_width": 8, "support_levels": 3, "lowrank_b": "variational"}
    cfg = fine_tune_config(det, asked)
    assert (cfg.rank, cfg.sparse_width) == (det.rank, det.sparse_width)  # not switchable: the checkpoint's
    assert (cfg.support_width, cfg.lowrank_b) == (8, "variational")
    kept = fine_tune_config(cfg, {"support_width": 16, "support_levels": 2, "support_features": "efficientnet-lite0"})
    assert (kept.support_width, kept.support_levels, kept.support_features) == (8, 3, "efficientnet-lite0")
    with pytest.raises(ValueError, match="f_thetaM"):
        fine_tune_config(det, {"support_features": "efficientnet-lite0"})


def test_train_only_fine_tunes_the_named_weights_and_keeps_the_rest(tmp_path, rng):
    from indeed_cli.model import load_checkpoint, save_checkpoint
    from indeed_cli.tasks.training import list_images, load_images

    ims = load_images(list_images(_random_colour_pngs(tmp_path, rng, 3)), 3)
    torch.manual_seed(0)
    start = save_checkpoint(tmp_path / "start.safetensors", InDeed(tiny_config(3)).eval(), {})
    before = load_checkpoint(start, "cpu").model.state_dict()
    tc = TrainConfig(steps=3, batch=2, patch=32, lr=1e-2, warmup=1, save_every=100, init=str(start),
                     train_only=("sparse.head", "sparse.stem"))  # fmt: skip
    msgs = []
    train(tiny_config(3), tc, ims, tmp_path / "run", None, device="cpu", progress=False, log=msgs.append)
    after = load_checkpoint(tmp_path / "run" / "model.safetensors", "cpu").model.state_dict()
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all(k.startswith(("sparse.head", "sparse.stem")) for k in moved)
    assert any(k.startswith("sparse.head") for k in moved) and any(k.startswith("sparse.stem") for k in moved)
    assert any(m.startswith("training ") and "sparse.head" in m for m in msgs)
    with pytest.raises(ValueError, match="names no weight"):
        train(tiny_config(3), replace(tc, train_only=("sparse.nothing",)), ims, tmp_path / "run2", None,
              device="cpu", progress=False, log=lambda m: None)  # fmt: skip
