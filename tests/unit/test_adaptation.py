"""Active generalization: only the chosen module changes, and the best weights are kept."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import tiny_model

from indeed_cli.model import Checkpoint
from indeed_cli.tasks.adaptation import AdaptConfig, adapt, adapt_each, adaptation_objective, lowrank_factors


def _ckpt(c=1):
    m = tiny_model(c)
    return Checkpoint(m, m.cfg, {}, {}, "tiny")


def _images(rng, c=1):
    return [rng.random((c, 40, 36)).astype(np.float32) for _ in range(2)]


def test_only_the_selected_module_changes(rng):
    ck = _ckpt()
    res = adapt(ck, _images(rng), AdaptConfig(modules="S", steps=4, lr=1e-2, eval_every=1, patience=10), tile=32)
    before, after = ck.model.state_dict(), res.checkpoint.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before if k.startswith("lowrank."))
    if res.best_step > 0:
        assert any(not torch.equal(before[k], after[k]) for k in before if k.startswith("sparse."))
    assert res.history[0]["step"] == 0 and res.history[0]["change"] == 0.0


def test_loss_never_ends_above_the_start(rng):
    """A destructive learning rate makes the loss rise: the starting weights come back."""
    ck = _ckpt()
    res = adapt(ck, _images(rng), AdaptConfig(modules="LS", steps=6, lr=10.0, eval_every=1, patience=1), tile=32)
    best = min(h["loss"] for h in res.history if np.isfinite(h["loss"]))
    assert best <= res.history[0]["loss"]
    if res.best_step == 0:
        for k, v in ck.model.state_dict().items():
            assert torch.equal(v, res.checkpoint.model.state_dict()[k])
    assert res.stop in ("no improvement", "non-finite loss", "collapse", "steps", "trust region")
    assert res.checkpoint.training["adapted"]["stop"] == res.stop


def test_collapse_guard_stops(rng):
    ck = _ckpt()
    res = adapt(
        ck,
        _images(rng),
        AdaptConfig(modules="S", steps=5, lr=1e-3, eval_every=1, patience=5, max_change=1e9, collapse_ratio=10.0),
        tile=32,
    )  # any step counts as collapse
    assert res.stop == "collapse" and res.best_step == 0


def test_trust_region_bounds_the_output_change(rng):
    """Weights whose output moved more than max_change are never returned."""
    ck = _ckpt()
    imgs = _images(rng)
    res = adapt(
        ck, imgs, AdaptConfig(modules="S", steps=6, lr=1e-2, eval_every=1, patience=10, max_change=1e-6), tile=32
    )
    assert res.stop == "trust region" and res.best_step == 0
    assert res.history[-1]["change"] > 1e-6
    for k, v in ck.model.state_dict().items():
        assert torch.equal(v, res.checkpoint.model.state_dict()[k])


def test_compiled_inference_leaves_adaptation_its_own_weights(rng, monkeypatch):
    """`--compile` wraps the network for inference without touching the checkpoint's model, so the
    copy that adaptation trains runs its own weights, not the compiled original."""
    from indeed_cli.inference import network_for

    ck = _ckpt()
    monkeypatch.setattr(torch, "compile", lambda net, **kw: lambda *a, **k: net(*a, **k))
    compiled = network_for(ck, "fp32", compile=True)
    assert compiled is not ck.model and "forward" not in ck.model.__dict__
    assert network_for(ck, "fp32", compile=True) is compiled  # wrapped once
    res = adapt(
        ck, _images(rng), AdaptConfig(modules="S", steps=2, lr=1e-2, eval_every=1, patience=10, max_change=1e9), tile=32
    )
    assert res.history[-1]["change"] > 0


def test_bf16_adaptation_runs_and_returns_float32_weights(rng):
    ck = _ckpt()
    res = adapt(ck, _images(rng), AdaptConfig(modules="S", steps=2, lr=1e-3, eval_every=1, precision="bf16"), tile=32)
    assert all(p.dtype == torch.float32 for p in res.checkpoint.model.parameters())
    assert all(np.isfinite(h["loss"]) for h in res.history)
    import pytest

    with pytest.raises(ValueError):
        adapt(ck, _images(rng), AdaptConfig(precision="fp16"), tile=32)


def test_grouped_adaptations_match_separate_ones(rng):
    """OAG runs several images as one vmapped network; each must get what it gets alone, also
    when some stop early and are dropped from the stack while the others go on."""
    ck = _ckpt(3)
    yy, xx = np.mgrid[0:40, 0:36] / 40.0
    imgs = [
        rng.random((3, 40, 36)),
        np.full((3, 40, 36), 0.5),
        np.stack([yy, xx, yy * xx]),
        0.1 * rng.random((3, 40, 36)),
        rng.random((3, 100, 70)),
    ]
    imgs = [x.astype(np.float32) for x in imgs]
    cfg = AdaptConfig(modules="S", steps=6, lr=1e-4, eval_every=1, patience=2, max_change=1.5, sample=False,
                      decide="always", noise_bound=0.0, keep="best")  # fmt: skip
    together = adapt_each(ck, [[x] for x in imgs], replace(cfg, group=4), tile=32)  # {0,1,2,3} and {4}
    alone = [adapt_each(ck, [[x]], replace(cfg, group=1), tile=32)[0] for x in imgs]
    assert all(a.best_step > 0 for a in alone)  # the weights really moved
    assert len({len(a.history) for a in together[:4]}) > 1  # entries of one group stopped at different steps
    for a, b in zip(together, alone):
        assert (a.best_step, a.stop) == (b.best_step, b.stop)
        np.testing.assert_allclose([h["loss"] for h in a.history], [h["loss"] for h in b.history], rtol=1e-5)
        sa, sb = a.checkpoint.model.state_dict(), b.checkpoint.model.state_dict()
        assert all(torch.allclose(sa[k], sb[k], atol=1e-5) for k in sb)
    first, second = (together[i].checkpoint.model.state_dict() for i in (0, 1))
    assert any(not torch.equal(first[k], second[k]) for k in first if k.startswith("sparse."))


def test_grouped_adaptations_stop_at_the_bound_as_separate_ones(rng):
    """Eq. (stop at the bound) in a group: each entry's kept weights are interpolated between its own
    evaluations (the stack position of an entry changes as others stop), as they are alone."""
    ck = _ckpt(3)
    yy, xx = np.mgrid[0:40, 0:36] / 40.0
    imgs = [rng.random((3, 40, 36)), np.stack([yy, xx, yy * xx]), 0.1 * rng.random((3, 40, 36))]
    imgs = [x.astype(np.float32) for x in [*imgs, rng.random((3, 40, 36))]]
    cfg = AdaptConfig(modules="S", steps=8, lr=1e-4, eval_every=1, patience=0, max_change=1.5, sample=False,
                      decide="always", noise_bound=0.0, keep="last", objective="elbo", stop_at_bound=True)  # fmt: skip
    together = adapt_each(ck, [[x] for x in imgs], replace(cfg, group=4), tile=32)
    alone = [adapt_each(ck, [[x]], replace(cfg, group=1), tile=32)[0] for x in imgs]
    shares = [a.checkpoint.training["adapted"]["stop_share"] for a in alone]
    assert sum(s is not None for s in shares) >= 2  # interpolated entries ...
    assert len({a.best_step for a, s in zip(alone, shares) if s is not None}) > 1  # ... stopped at different steps
    for a, b, share in zip(together, alone, shares):
        assert (a.best_step, a.stop) == (b.best_step, b.stop)
        assert a.checkpoint.training["adapted"]["stop_share"] == (share and pytest.approx(share, abs=1e-4))
        sa, sb = a.checkpoint.model.state_dict(), b.checkpoint.model.state_dict()
        assert all(torch.allclose(sa[k], sb[k], atol=1e-5) for k in sb)


def test_oag_results_share_only_the_frozen_weights(rng):
    """Each OAG result owns its adapted module's weights and shares the frozen module's with the
    other results of its call (no copy per image), which stay equal to the starting weights."""
    ck = _ckpt(3)
    imgs = [rng.random((3, 40, 36)).astype(np.float32) for _ in range(3)]
    cfg = AdaptConfig(modules="S", steps=4, lr=1e-4, eval_every=1, max_change=0.0, sample=False, decide="always",
                      noise_bound=0.0, keep="last", group=2)  # fmt: skip
    res = adapt_each(ck, [[x] for x in imgs], cfg, tile=32)
    models = [r.checkpoint.model for r in res]
    start = ck.model.state_dict()
    for name, p in models[0].named_parameters():
        ptrs = {dict(m.named_parameters())[name].data_ptr() for m in models}
        if name.startswith("lowrank."):
            assert len(ptrs) == 1 and torch.equal(p, start[name])
            assert p.data_ptr() != ck.model.get_parameter(name).data_ptr()  # not the caller's own tensor
        else:
            assert len(ptrs) == len(models)
    assert all(r.best_step > 0 for r in res)  # the adapted weights really moved
    assert any(not torch.equal(models[0].get_parameter(k), start[k]) for k in start if k.startswith("sparse."))


def test_oag_results_read_out_together_equal_each_read_out_alone(rng, monkeypatch):
    """denoise_each reads OAG's results out as one grouped network (on a GPU): every image's output is
    the one its own checkpoint gives alone; a result that kept the starting weights, and an image of
    another size, go with them.  Forced here on the CPU."""
    import indeed_cli.inference.decomposition as D
    from indeed_cli.inference import InferenceOptions, denoise, denoise_each

    ck = _ckpt(3)
    imgs = [rng.random((3, 40, 36)).astype(np.float32) for _ in range(3)] + [rng.random((3, 32, 48)).astype(np.float32)]
    cfg = AdaptConfig(modules="S", steps=3, lr=1e-3, eval_every=1, max_change=0.0, sample=False, decide="always",
                      noise_bound=0.0, keep="last", group=4)  # fmt: skip
    res = adapt_each(ck, [[x] for x in imgs], cfg, tile=32)
    ckpts = [r.checkpoint for r in res]
    start = {n: p for n, p in ck.model.named_parameters() if n.startswith("sparse.")}
    ckpts[1] = replace(ckpts[1], model=ckpts[0].model.with_parameters(start))  # kept the starting weights
    opts = InferenceOptions(tile=32, overlap=8)
    alone = [denoise(c, x, opts) for c, x in zip(ckpts, imgs)]
    calls = []
    grouped = D._denoise_grouped
    monkeypatch.setattr(D, "_groups_readout", lambda ck, d, o: True)
    monkeypatch.setattr(D, "_denoise_grouped", lambda cks, st, o: calls.append(len(cks)) or grouped(cks, st, o))
    together = denoise_each(ckpts, imgs, opts)
    assert sorted(calls) == [1, 3]  # the three images of one size in one call
    for a, b in zip(alone, together):
        np.testing.assert_allclose(b, a, atol=2e-5)
    assert np.abs(alone[0] - alone[2]).max() > 1e-4  # the copies differ: a shared f_thetaS would fail above
    with pytest.raises(ValueError, match="checkpoints for"):
        denoise_each(ckpts[:2], imgs, opts)


def test_oag_readout_is_fp32_on_a_gpu_only():
    from indeed_cli.inference import InferenceOptions
    from indeed_cli.tasks.adaptation import oag_readout

    opts = InferenceOptions(precision="bf16", tile=64)
    assert oag_readout(opts, torch.device("cuda")) == InferenceOptions(precision="fp32", tile=64)
    assert oag_readout(opts, torch.device("cpu")) is opts
    assert oag_readout(InferenceOptions(precision="auto"), torch.device("cuda")).precision == "fp32"


def test_cached_lowrank_factors_give_the_same_objective(rng):
    """Adapting f_thetaS reuses the frozen low-rank module's outputs, computed once per tile
    (in batches of another size); the objective and L + S must be those of a full pass, also
    with sampled A, B, S (the same draws whatever the factors' memory layout)."""
    model = tiny_model(3).float().eval()
    Y = torch.from_numpy(rng.random((5, 3, 32, 32)).astype(np.float32))
    cfg = AdaptConfig(modules="S")
    factors = lowrank_factors(model, Y, cfg, chunk=2)
    assert [tuple(f.shape) for f in factors] == [(5, 3, 32, 4)] * 4  # (tiles, C, side, r) for A and B
    for sample in (False, True):
        torch.manual_seed(3)
        direct = adaptation_objective(model, None, None, Y, cfg, sample)
        torch.manual_seed(3)
        cached = adaptation_objective(model, None, None, Y, cfg, sample, factors)
        for a, b in zip(cached, direct):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_grouped_bf16_adaptation(rng):
    """Autocast does not reach vmapped convolutions: a group adapting f_thetaS runs it in bf16 by
    hand (fp32 master weights, image and objective); a group adapting L runs in fp32."""
    ck = _ckpt(3)
    imgs = _images(rng, 3)
    cfg = AdaptConfig(steps=2, eval_every=1, group=2, sample=False, objective="elbo")
    runs = {
        (m, p): adapt_each(ck, [[x] for x in imgs], replace(cfg, modules=m, precision=p), tile=32)
        for m in ("S", "L")
        for p in ("fp32", "bf16")
    }
    for res in runs.values():
        assert all(np.isfinite(h["loss"]) for r in res for h in r.history)
        assert all(p.dtype == torch.float32 for r in res for p in r.checkpoint.model.parameters())

    def start(m, p):
        return [r.history[0]["loss"] for r in runs[m, p]]

    assert start("S", "bf16") != start("S", "fp32")  # bf16 really ran ...
    np.testing.assert_allclose(start("S", "bf16"), start("S", "fp32"), rtol=1e-2)  # ... on the fp32 image
    assert start("L", "bf16") == start("L", "fp32")


def test_training_tiles_at_a_stride_are_crops_of_the_image(rng):
    from indeed_cli.tasks.adaptation import tiles_of

    im = rng.random((1, 64, 64)).astype(np.float32)
    gen = torch.Generator().manual_seed(0)
    assert tiles_of([im], 32, 512, gen).shape == (4, 1, 32, 32)  # non-overlapping by default
    dense = tiles_of([im], 32, 512, gen, stride=16)
    assert len(dense) > 4
    inner = [
        t
        for t in dense
        if any(np.array_equal(t.numpy(), im[:, y : y + 32, x : x + 32]) for y in (8, 24) for x in (8, 24))
    ]
    assert len(inner) == 4  # the grid's interior tiles (it starts half an overlap outside) are plain crops
    few = tiles_of([im, im], 32, 5, torch.Generator().manual_seed(0), stride=16)
    assert few.shape == (5, 1, 32, 32)  # a random subset when there are more than max_tiles


def test_adaptation_with_overlapping_training_tiles_runs(rng):
    ck = _ckpt()
    res = adapt(
        ck,
        [rng.random((1, 64, 64)).astype(np.float32)],
        AdaptConfig(steps=2, eval_every=1, train_stride=16, max_change=1e9),
        tile=32,
    )
    assert len(res.history) == 3 and all(np.isfinite(h["loss"]) for h in res.history)


def test_default_learning_rate_depends_on_the_mode(rng):
    """InDeedAG (one adaptation on a folder) and InDeedOAG (one per image) have their own measured defaults."""
    from indeed_cli.tasks.adaptation import AG_LR, OAG_LR

    ck = _ckpt()
    cfg = AdaptConfig(steps=1, eval_every=1)
    assert adapt(ck, _images(rng), cfg, tile=32).checkpoint.training["adapted"]["lr"] == AG_LR
    assert adapt_each(ck, [[x] for x in _images(rng)], cfg, tile=32)[0].checkpoint.training["adapted"]["lr"] == OAG_LR
    assert adapt(ck, _images(rng), AdaptConfig(steps=1, lr=1e-3), tile=32).checkpoint.training["adapted"]["lr"] == 1e-3


def test_default_step_limit_depends_on_the_mode(rng):
    """OAG stops after OAG_STEPS at most, AG after AG_STEPS, unless steps is given."""
    from indeed_cli.tasks.adaptation import AG_STEPS, OAG_STEPS

    ck = _ckpt()
    cfg = AdaptConfig(eval_every=1, patience=100, max_change=1e9, train_stride=16, decide="always", noise_bound=0.0)
    ag = adapt(ck, _images(rng), cfg, tile=32)
    oag = adapt_each(ck, [[x] for x in _images(rng)[:1]], cfg, tile=32)[0]
    assert ag.checkpoint.training["adapted"]["steps"] == AG_STEPS and len(ag.history) == AG_STEPS + 1
    assert oag.checkpoint.training["adapted"]["steps"] == OAG_STEPS and len(oag.history) == OAG_STEPS + 1
    assert OAG_STEPS < AG_STEPS


def test_keep_latest_follows_an_objective_that_rises_before_it_falls():
    """InDeedAG's measured objective (PolyU odd half, fp32): below the start at step 2, above it
    for a while, below again from step 14 on. "best" keeps step 2 and stops; "latest" keeps step 20."""
    from indeed_cli.tasks.adaptation import AdaptConfig
    from indeed_cli.tasks.adaptation.stopping import EarlyStopping

    losses = [-17.440, -17.356, -17.317, -17.301, -17.310, -17.330, -17.351, -17.375, -17.401, -17.426]
    kept = {}
    for keep in ("best", "latest"):
        rule = EarlyStopping.start(AdaptConfig(keep=keep, patience=6), {"loss": -17.334, "abs_N": 0.01})
        for i, loss in enumerate(losses):
            rule.update({"step": 2 * (i + 1), "loss": loss, "abs_N": 0.01, "change": 1.0})
            if not rule.running:
                break
        kept[keep] = (rule.best_step, rule.stop)
    assert kept == {"best": (2, "no improvement"), "latest": (20, "steps")}
    # "latest" never keeps weights whose objective is above the start's
    rule = EarlyStopping.start(AdaptConfig(keep="latest", patience=2), {"loss": -1.0, "abs_N": 0.01})
    for step, loss in ((2, -0.9), (4, -0.8)):
        rule.update({"step": step, "loss": loss, "abs_N": 0.01, "change": 1.0})
    assert rule.best_step == 0 and rule.stop == "no improvement"
    with pytest.raises(ValueError, match="keep"):
        AdaptConfig(keep="first").check()


def test_ag_runs_all_its_steps_when_the_objective_stays_above_the_start_for_long():
    """With patience 6, an objective above the start from step 8 to 18 stopped AG at step 18 and
    kept step 6 (fp32, PolyU scene-dev); AG's default patience (0: never) reaches step 20."""
    from indeed_cli.tasks.adaptation import AdaptConfig
    from indeed_cli.tasks.adaptation.config import AG_PATIENCE
    from indeed_cli.tasks.adaptation.stopping import EarlyStopping

    losses = [-1.1, -1.05, -1.01, -0.9, -0.9, -0.9, -0.9, -0.9, -0.9, -1.2]  # steps 2..20, start -1.0
    kept = {}
    for patience in (6, AG_PATIENCE):
        rule = EarlyStopping.start(AdaptConfig(keep="latest", patience=patience), {"loss": -1.0, "abs_N": 0.01})
        for i, loss in enumerate(losses):
            rule.update({"step": 2 * (i + 1), "loss": loss, "abs_N": 0.01, "change": 1.0})
            if not rule.running:
                break
        kept[patience] = (rule.best_step, rule.stop)
    assert kept == {6: (6, "no improvement"), AG_PATIENCE: (20, "steps")}
    with pytest.raises(ValueError, match="patience"):
        AdaptConfig(patience=-1).check()


def _with_ood(ck, images, threshold_between):
    """``ck`` with OOD statistics fitted on random tile features and a threshold that lies
    between the scores of images[i] and images[j] (i scored in distribution, j flagged)."""
    from indeed_cli.tasks.ood import fit_ood, image_ood_score

    g = np.random.default_rng(1)
    ck = Checkpoint(ck.model, ck.config, {}, {"ood": fit_ood([g.normal(size=(6, 2)) for _ in range(4)])}, "tiny")
    scores = [image_ood_score(ck, im) for im in images]
    lo, hi = sorted(scores[k] for k in threshold_between)
    assert lo < hi
    ck.extra["ood"]["threshold"] = (lo + hi) / 2
    return ck, scores


def test_decide_ood_adapts_only_the_flagged_images(rng):
    """AG with decide="ood": the adaptation sees the flagged image alone, and says which one."""
    imgs = [rng.random((1, 40, 36)).astype(np.float32), 0.5 + 0.01 * rng.random((1, 40, 36)).astype(np.float32)]
    ck, scores = _with_ood(_ckpt(), imgs, (0, 1))
    flagged = [s > ck.extra["ood"]["threshold"] for s in scores]
    cfg = AdaptConfig(modules="S", steps=2, lr=1e-3, eval_every=1, max_change=1e9, seed=3, decide="ood")
    res = adapt(ck, imgs, cfg, tile=32)
    assert res.adapted_images == flagged and res.ood_scores == scores
    alone = adapt(ck, [im for im, f in zip(imgs, flagged) if f], replace(cfg, decide="always"), tile=32)
    assert res.history == alone.history
    for k, v in alone.checkpoint.model.state_dict().items():
        assert torch.equal(v, res.checkpoint.model.state_dict()[k])


def test_decide_ood_keeps_the_starting_weights_of_an_image_in_distribution(rng):
    """OAG: the image under the threshold is not adapted (its result is the starting checkpoint
    itself, nothing run); the one above is; decide="always" adapts both."""
    imgs = [rng.random((1, 40, 36)).astype(np.float32), 0.5 + 0.01 * rng.random((1, 40, 36)).astype(np.float32)]
    ck, scores = _with_ood(_ckpt(), imgs, (0, 1))
    cfg = AdaptConfig(modules="S", steps=2, lr=1e-3, eval_every=1, max_change=1e9, decide="ood")
    res = adapt_each(ck, [[im] for im in imgs], cfg, tile=32)
    for r, s in zip(res, scores):
        if s > ck.extra["ood"]["threshold"]:
            assert r.adapted_images == [True] and r.history and r.checkpoint is not ck
        else:
            assert r.adapted_images == [False] and r.stop == "in distribution"
            assert r.checkpoint is ck and r.history == [] and r.ood_scores == [s]
    both = adapt_each(ck, [[im] for im in imgs], replace(cfg, decide="always"), tile=32)
    assert all(r.history and r.adapted_images == [True] and r.ood_scores == [None] for r in both)
    with pytest.raises(ValueError, match="decide"):
        replace(cfg, decide="never").check()


def test_decide_change_keeps_the_start_when_the_first_steps_move_the_output_little():
    """decide="change": the first evaluation must move L + S by FIRST_CHANGE_RATIO x the RMS of the
    starting residual, or the starting weights are kept; later evaluations are judged as usual."""
    from indeed_cli.tasks.adaptation import OAG_DECIDE, EarlyStopping
    from indeed_cli.tasks.adaptation.config import FIRST_CHANGE_RATIO

    start = {"step": 0, "loss": -5.0, "abs_N": 1.0, "change": 0.0, "rms_N": 2.0}
    cfg = AdaptConfig(decide="change", max_change=100.0)
    small = EarlyStopping.start(cfg, start)
    assert not small.update({"step": 2, "loss": -6.0, "abs_N": 1.1, "change": 0.99 * FIRST_CHANGE_RATIO * 2.0})
    assert small.stop == "small first change" and small.best_step == 0
    large = EarlyStopping.start(cfg, start)
    assert large.update({"step": 2, "loss": -6.0, "abs_N": 1.5, "change": 1.01 * FIRST_CHANGE_RATIO * 2.0})
    assert large.running and large.best_step == 2
    assert large.update({"step": 4, "loss": -7.0, "abs_N": 1.6, "change": 0.1})  # only the first is judged so
    never = EarlyStopping.start(replace(cfg, decide="always"), start)
    assert never.update({"step": 2, "loss": -6.0, "abs_N": 1.1, "change": 0.01}) and never.running
    assert OAG_DECIDE == "change"
    # AdaptConfig.first_change_ratio (indeed adapt --first-change-ratio) replaces the default ratio
    moved = {"step": 2, "loss": -6.0, "abs_N": 1.5, "change": 1.5 * FIRST_CHANGE_RATIO * 2.0}
    assert EarlyStopping.start(cfg, start).update(dict(moved))
    strict = EarlyStopping.start(replace(cfg, first_change_ratio=2 * FIRST_CHANGE_RATIO), start)
    assert not strict.update(dict(moved)) and strict.stop == "small first change"
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="first_change_ratio"):
            replace(cfg, first_change_ratio=bad).check()


def test_decide_defaults_depend_on_the_mode(rng):
    """OAG decides per image from its first change, AG (one adaptation per folder) always adapts."""
    from indeed_cli.tasks.adaptation.config import FIRST_CHANGE_RATIO

    ck = _ckpt()
    cfg = AdaptConfig(steps=2, lr=1e-3, eval_every=1, max_change=1e9, objective="elbo")
    assert adapt(ck, _images(rng), cfg, tile=32).checkpoint.training["adapted"]["decide"] == "always"
    oag = adapt_each(ck, [[x] for x in _images(rng)], cfg, tile=32)
    assert all(r.checkpoint is ck or r.checkpoint.training["adapted"]["decide"] == "change" for r in oag)
    for r in oag:  # an image whose first evaluation moved little kept the starting weights
        assert r.first_change_ratio == r.history[1]["change"] / r.history[0]["rms_N"]
        moved = r.first_change_ratio >= FIRST_CHANGE_RATIO
        assert r.stop != "small first change" if moved else (r.stop == "small first change" and r.best_step == 0)


def test_block_noise_sigma_reads_the_noise_of_the_flat_blocks():
    """A smooth image plus AWGN of sigma 10 (8-bit): the 25th percentile of 8 x 8 block variances
    is close to the noise variance (a little below it: chi-square quantile); structure adds to it;
    clipped blocks (saturation, zero variance) are left out instead of pulling it to 0."""
    from indeed_cli.tasks.adaptation.noise_level import block_noise_sigma, pooled_noise_sigma

    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:128, 0:128] / 128.0
    smooth = np.stack([0.3 + 0.3 * xx, 0.4 + 0.2 * yy, 0.5 - 0.2 * xx * yy])
    noisy = smooth + rng.normal(0, 10 / 255, smooth.shape)
    est = block_noise_sigma(noisy)
    assert 8.5 < est < 10.5
    assert block_noise_sigma(smooth) < 1.5  # the gradient inside a block
    stripes = smooth + 0.2 * (np.arange(128) % 4 < 2)[None, None, :]  # fine structure in every block
    assert block_noise_sigma(stripes + rng.normal(0, 10 / 255, smooth.shape)) > 2 * est
    half_white = noisy.copy()
    half_white[:, :, :64] = 1.0
    assert abs(block_noise_sigma(half_white) - est) < 1.5
    assert block_noise_sigma(np.zeros((1, 4, 4))) == 0.0
    pooled = pooled_noise_sigma([noisy, 0.5 * noisy])
    assert pooled == pytest.approx(np.sqrt((est**2 + block_noise_sigma(0.5 * noisy) ** 2) / 2))
    # Eq. (noise level) computed directly: per channel the 25th percentile of the blocks' unbiased
    # variances (numpy's linear percentile), their mean, its root, in 8-bit units; unclipped blocks only
    img = half_white[:, :61, 40:99].astype(np.float32)
    blocks = [img[:, y : y + 8, x : x + 8] for y in range(0, 56, 8) for x in range(0, 56, 8)]
    kept = [b for b in blocks if not ((b >= 254.5 / 255) | (b <= 0.5 / 255)).any()]
    var = np.array([[np.var(b[c].astype(np.float64), ddof=1) for c in range(3)] for b in kept])
    direct = 255 * np.sqrt(np.mean(np.percentile(var, 25, axis=0)))
    assert len(kept) >= 16 and block_noise_sigma(img) == pytest.approx(direct, rel=1e-9)
    assert block_noise_sigma(img[:, ::-1, ::-1]) == pytest.approx(block_noise_sigma(img[:, ::-1, ::-1].copy()))


def test_noise_bound_stops_when_N_passes_the_noise_level():
    """The discrepancy rule: evaluations whose RMS of N is above noise_bound x the estimated noise
    level end the adaptation, and the last evaluation inside the bounds is kept ("last")."""
    from indeed_cli.tasks.adaptation import EarlyStopping

    start = {"step": 0, "loss": -5.0, "abs_N": 1.0, "change": 0.0, "rms_N": 1.0}
    cfg = AdaptConfig(decide="always", max_change=0.0, noise_bound=1.25, keep="last")
    rule = EarlyStopping.start(cfg, start, noise_sigma=2.0)
    assert rule.max_rms_N == pytest.approx(2.5)
    assert rule.update({"step": 2, "loss": -4.0, "abs_N": 1.2, "change": 50.0, "rms_N": 2.4})  # loss above start
    assert rule.running and rule.best_step == 2  # kept: "last" does not ask the objective; no trust region
    assert not rule.update({"step": 4, "loss": -9.0, "abs_N": 1.3, "change": 60.0, "rms_N": 2.6})
    assert rule.stop == "noise level" and rule.best_step == 2
    unbounded = EarlyStopping.start(replace(cfg, noise_bound=0.0), start, noise_sigma=2.0)
    assert unbounded.max_rms_N is None
    assert unbounded.update({"step": 2, "loss": -4.0, "abs_N": 1.2, "change": 50.0, "rms_N": 99.0})
    latest = EarlyStopping.start(replace(cfg, keep="latest"), start, noise_sigma=2.0)
    assert not latest.update({"step": 2, "loss": -4.0, "abs_N": 1.2, "change": 0.5, "rms_N": 2.4})
    with pytest.raises(ValueError, match="noise_bound"):
        replace(cfg, noise_bound=-1.0).check()
    with pytest.raises(ValueError, match="max_change"):
        replace(cfg, max_change=-1.0).check()


def test_fraction_to_bound_is_where_the_bounded_quantity_meets_its_bound():
    """Eq. (stop at the bound): linear in between, the share of the way from the kept evaluation to the
    crossing one; the smaller share where both bounds are crossed; none for the start or keep "latest"."""
    from indeed_cli.tasks.adaptation import EarlyStopping

    start = {"step": 0, "loss": -5.0, "abs_N": 1.0, "change": 0.0, "rms_N": 1.0}
    cfg = AdaptConfig(decide="always", max_change=2.5, noise_bound=1.25, keep="last")
    kept = {"step": 2, "loss": -4.0, "abs_N": 1.0, "change": 2.0, "rms_N": 2.0}
    for crossed, share in [
        ({"change": 3.0, "rms_N": 2.2}, 0.5),  # trust region: (2.5 - 2) / (3 - 2)
        ({"change": 2.2, "rms_N": 3.0}, 0.5),  # noise bound 2.5: (2.5 - 2) / (3 - 2)
        ({"change": 4.5, "rms_N": 2.6}, 0.2),  # both: min(0.5 / 2.5, 0.5 / 0.6)
    ]:
        rule = EarlyStopping.start(cfg, start, noise_sigma=2.0)
        assert rule.update(kept)
        rec = {"step": 4, "loss": -4.5, "abs_N": 1.0, **crossed}
        assert not rule.update(rec) and rule.best_step == 2
        assert rule.fraction_to_bound(kept, rec) == pytest.approx(share)
    first = EarlyStopping.start(cfg, start, noise_sigma=2.0)
    assert not first.update({**kept, "change": 3.0})  # crossed at the first evaluation: the start stays
    assert first.fraction_to_bound(start, {**kept, "change": 3.0}) is None
    latest = EarlyStopping.start(replace(cfg, keep="latest"), start, noise_sigma=2.0)
    latest.update(kept)
    latest.update({**kept, "step": 4, "change": 3.0})
    assert latest.fraction_to_bound(kept, {**kept, "change": 3.0}) is None


def test_stop_at_bound_keeps_the_weights_between_the_evaluations(rng):
    """With stop_at_bound the kept weights are w2 + t (w3 - w2), t the share at which the output change,
    linear in between, meets the trust region: the same steps run again stop there."""
    ck = _ckpt()
    img = _images(rng)[:1]
    base = AdaptConfig(steps=3, lr=1e-4, eval_every=1, decide="always", objective="elbo", max_change=0.0,
                       noise_bound=0.0, keep="last", patience=0, sample=False)  # fmt: skip

    def run(**kw):
        return adapt_each(ck, [img], replace(base, **kw), tile=32)[0]

    free = run()
    c2, c3 = free.history[2]["change"], free.history[3]["change"]
    assert 0 < c2 < c3
    w2 = run(steps=2).checkpoint.model.state_dict()
    w3 = free.checkpoint.model.state_dict()
    bound = c2 + 0.3 * (c3 - c2)
    res = run(max_change=bound, stop_at_bound=True)
    assert res.stop == "trust region" and res.best_step == 2
    share = res.checkpoint.training["adapted"]["stop_share"]
    assert share == pytest.approx(0.3, rel=1e-4)
    got = res.checkpoint.model.state_dict()
    for k in got:
        assert torch.allclose(got[k], w2[k] + share * (w3[k] - w2[k]), atol=1e-7), k
    plain = run(max_change=bound, stop_at_bound=False)  # without: the last evaluation inside the bound
    assert plain.checkpoint.training["adapted"]["stop_share"] is None
    assert all(torch.equal(plain.checkpoint.model.state_dict()[k], w2[k]) for k in w2)


def test_oag_and_ag_bounds_by_default(rng):
    """OAG: noise bound and trust region, keep "last"; AG: trust region, no noise bound.  The noise
    level an adaptation was bounded by is recorded with it."""
    from indeed_cli.tasks.adaptation.config import AG_DEFAULTS, OAG_DEFAULTS, with_defaults
    from indeed_cli.tasks.adaptation.noise_level import block_noise_sigma

    oag, ag = with_defaults(AdaptConfig(), OAG_DEFAULTS), with_defaults(AdaptConfig(), AG_DEFAULTS)
    assert (oag.max_change, oag.noise_bound, oag.keep, oag.stop_at_bound) == (2.5, 1.25, "last", True)
    assert (ag.max_change, ag.noise_bound, ag.keep, ag.stop_at_bound) == (2.5, 0.0, "latest", False)
    ck = _ckpt()
    imgs = _images(rng)
    cfg = AdaptConfig(steps=2, lr=1e-3, eval_every=1, decide="always", objective="elbo")
    for im, r in zip(imgs, adapt_each(ck, [[x] for x in imgs], cfg, tile=32)):
        assert r.checkpoint.training["adapted"]["noise_sigma"] == pytest.approx(block_noise_sigma(im))
        assert r.checkpoint.training["adapted"]["noise_bound"] == 1.25
    assert adapt(ck, imgs, cfg, tile=32).checkpoint.training["adapted"]["noise_sigma"] is None


def test_change_ratio_is_the_adapted_change_over_the_plain_removal():
    from indeed_cli.tasks.adaptation import change_ratio

    plain = np.full((3, 8, 8), 0.5)
    noisy, adapted = plain + 0.02, plain - 0.06  # RMS 0.02 removed by the plain model, 0.06 moved by AG
    assert change_ratio(noisy, plain, adapted) == pytest.approx(3.0)
    assert change_ratio(plain, plain, adapted) == float("inf")


def test_choose_output_takes_the_adapted_output_at_or_above_the_ratio(rng):
    from indeed_cli.inference import denoise_with_stats
    from indeed_cli.tasks.adaptation import change_ratio, choose_output

    ck = _ckpt(3)
    res = adapt(ck, _images(rng, 3), AdaptConfig(modules="S", steps=4, lr=1e-2, eval_every=1, sample=False,
                                                 max_change=0.0), tile=32)  # fmt: skip
    y = _images(rng, 3)[0]
    plain, adapted = denoise_with_stats(ck, y)[0], denoise_with_stats(res.checkpoint, y)[0]
    r = change_ratio(y, plain, adapted)
    assert 0 < r < float("inf")
    above, below, off = (choose_output(ck, res.checkpoint, y, k) for k in (r * 0.999, r * 1.001, 0.0))
    assert above.adapted and np.array_equal(above.output, adapted) and above.ratio == pytest.approx(r)
    assert not below.adapted and np.array_equal(below.output, plain) and below.ratio == pytest.approx(r)
    assert off.adapted and np.isnan(off.ratio) and np.array_equal(off.output, adapted)
    q = choose_output(ck, res.checkpoint, y, 0.0, 1e-9)  # the noise bound alone: nothing may be removed
    assert not q.adapted and np.array_equal(q.output, plain) and q.removed > 1e-9
    assert choose_output(ck, res.checkpoint, y, 0.0, 1e9).adapted


def test_removed_over_noise_is_one_where_exactly_the_noise_was_removed(rng):
    from indeed_cli.tasks.adaptation import removed_over_noise

    yy, xx = np.mgrid[0:128, 0:128] / 128.0
    clean = np.stack([0.3 + 0.2 * yy, 0.5 + 0.1 * xx, 0.4 + 0.1 * yy * xx]).astype(np.float32)
    noisy = clean + rng.normal(0, 10 / 255, clean.shape).astype(np.float32)
    assert 0.85 < removed_over_noise(noisy, clean) < 1.15  # RMS 10 removed, noise level about 10
    assert removed_over_noise(noisy, clean + (noisy - clean) * 0.5) < 0.6
    assert removed_over_noise(noisy, noisy) == 0.0  # nothing removed


def test_first_change_ratio_reads_the_elbo_history_only():
    """stopping.first_change_ratio: the first evaluation's change over the start's RMS of N; None without an
    evaluation after the start, or for records without a change (the recorrupted objective's)."""
    from indeed_cli.tasks.adaptation.stopping import first_change_ratio

    start = {"step": 0, "loss": -5.0, "abs_N": 1.0, "change": 0.0, "rms_N": 2.0}
    first = {"step": 2, "loss": -6.0, "abs_N": 1.2, "change": 3.0, "rms_N": 2.5}
    assert first_change_ratio([start, first, {**first, "step": 4, "change": 9.0}]) == 1.5
    assert first_change_ratio([start]) is None and first_change_ratio([]) is None
    assert first_change_ratio([{"step": 0, "loss": 1.0}, {"step": 20, "loss": 0.5}]) is None
