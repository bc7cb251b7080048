"""The detector's memory of normal features: Eq. (normal feature distance) against a direct
computation, Eq. (memory fusion), its statistics, and the checkpoint round trip."""

import json

import numpy as np
import pytest
import torch
from conftest import tiny_model

from indeed_cli.model import CheckpointError, load_checkpoint, read_metadata, save_checkpoint
from indeed_cli.model.checkpoint import dequantize_4bit, quantize_4bit, read_feature_trunk, stored_bank
from indeed_cli.model.memory import bank_density
from indeed_cli.model.registry import resolve_feature_weights
from indeed_cli.tasks.detection import (
    build_memory,
    calibrate,
    distance_map,
    fuse,
    fuse_scores,
    greedy_coreset,
    score_kind,
    stored_fusion,
    stored_pixel_threshold,
    stored_score_fusion,
)
from indeed_cli.tasks.detection.maps import detect, image_score, member_mean
from indeed_cli.tasks.detection.memory import FusionStats, ScoreStats, fusion_stats, memory_sample, score_stats


def bundled_trunk() -> dict[str, torch.Tensor]:
    """The bundled ImageNet trunk (a random one gives features too small to tell patches apart)."""
    return read_feature_trunk(resolve_feature_weights(None, "efficientnet-lite0"), "efficientnet-lite0")


def test_distance_is_the_nearest_bank_entry_computed_directly(rng):
    mem = build_memory(bundled_trunk(), [rng.random((1, 40, 56), dtype=np.float32)], 1, share=0.5, seed=1)
    img = torch.from_numpy(rng.random((1, 1, 37, 50), dtype=np.float32))
    q = mem.patch_features(img)
    near, which = torch.cdist(q.double(), mem.bank.double()).min(1)
    # Eq. (normal feature distance): the nearest entry's distance over that entry's density radius
    want = (near / mem.density.double()[which]).view(5, 7)  # ceil(37/8), ceil(50/8)
    got = mem.distance(img)
    assert got.shape == (5, 7) and torch.allclose(got.double(), want, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(mem.density, torch.ones_like(mem.density))  # the radii are not all 1
    # an image whose every patch is in the memory lies at distance 0 from it (to the int8 rounding of
    # the bank), another image far from it
    same = rng.random((1, 32, 48), dtype=np.float32)
    full = build_memory(bundled_trunk(), [same], 1, share=1.0)
    near, far = (
        float(full.distance(torch.from_numpy(same)[None]).max()),
        float(mem.distance(torch.from_numpy(same)[None]).min()),
    )
    assert full.entries == 4 * 6 and near < 0.5 and far > 10 * near


def test_distance_searches_a_bank_of_several_chunks_as_one(rng):
    """Eq. (normal feature distance) over a bank of more than BANK_CHUNK entries, searched chunk by
    chunk: the nearest entry of all, and of equal entries the first (whose radius is read)."""
    from indeed_cli.model.memory import BANK_CHUNK, FeatureMemory

    mem = FeatureMemory(2 * BANK_CHUNK + 100)
    mem.trunk.load_state_dict({k: v.float() for k, v in bundled_trunk().items()})
    img = torch.from_numpy(rng.random((1, 1, 40, 48), dtype=np.float32))
    q = mem.patch_features(img)
    bank = torch.from_numpy(rng.normal(0, 1, (mem.entries, q.shape[1])).astype(np.float32)) * q.std() + q.mean()
    # each patch's own features somewhere in the bank, patch 0's in the last chunk and again in the first
    where = torch.from_numpy(rng.choice(np.arange(8, mem.entries), q.shape[0], replace=False))
    near_q = q + 0.05 * q.std() * torch.from_numpy(rng.normal(0, 1, q.shape).astype(np.float32))
    bank[where] = near_q
    bank[2 * BANK_CHUNK + 50], bank[7] = near_q[0], near_q[0]
    where[0] = 7
    mem.bank.copy_(bank)
    mem.density.copy_(torch.from_numpy(rng.uniform(0.5, 2.0, mem.entries).astype(np.float32)))
    near, which = torch.cdist(q.double(), bank.double()).min(1)
    want = (near / mem.density.double()[which]).view(5, 6)
    got = mem.distance(img)
    assert torch.allclose(got.double(), want, rtol=1e-3, atol=1e-4)
    assert torch.equal(which, where) and which.max() >= BANK_CHUNK  # found in every chunk, entry 7 first


def _random_bank_memory(rng, entries: int):
    """A memory of ``entries`` random entries about the features of a random image, each of whose
    patches has a near copy somewhere in the bank; the image's patch features."""
    from indeed_cli.model.memory import FeatureMemory

    mem = FeatureMemory(entries)
    mem.trunk.load_state_dict({k: v.float() for k, v in bundled_trunk().items()})
    img = torch.from_numpy(rng.random((1, 1, 48, 64), dtype=np.float32))
    q = mem.patch_features(img)
    bank = torch.from_numpy(rng.normal(0, 1, (entries, q.shape[1])).astype(np.float32)) * q.std() + q.mean()
    where = torch.from_numpy(rng.choice(entries, q.shape[0], replace=False))
    bank[where] = q + 0.2 * q.std() * torch.from_numpy(rng.normal(0, 1, q.shape).astype(np.float32))
    mem.bank.copy_(bank)
    mem.density.copy_(torch.from_numpy(rng.uniform(0.5, 2.0, entries).astype(np.float32)))
    return mem, q, img


def test_quantised_search_scores_are_eq_quantised_search_computed_directly(rng):
    """Eq. (quantised search): the int8 factors' product is round(w / alpha) . k_m - round(||m||^2 /
    (2 alpha)), the norms held exactly by the extra columns, in int64 against the formula."""
    from indeed_cli.model.memory import QUANTISED_SEARCH_MIN

    mem, q, _ = _random_bank_memory(rng, QUANTISED_SEARCH_MIN + 5)
    q_x, bank_x = mem.quantised_factors(q)
    assert q_x.dtype == bank_x.dtype == torch.int8 and q_x.shape[1] == bank_x.shape[1] and q_x.shape[1] % 8 == 0
    bank = mem.bank.double()
    lo, step = bank.amin(0), (bank.amax(0) - bank.amin(0)) / 255
    k = ((bank - lo) / step).round() - 128
    w = q.double() * step
    alpha = w.abs().max() / 127
    want = (w / alpha).round() @ k.T - (bank.square().sum(1) / (2 * alpha)).round()
    got = q_x.long() @ bank_x.long().T
    # float32 against float64 rounding may move a half-way value by one step: at most one unit per term
    assert (got - want.long()).abs().float().mean() < 0.5 and (got - want.long()).abs().max() <= q.shape[1] + 2
    # the score ranks the entries as the distance does: the highest score's entry is (nearly) the nearest
    near = torch.cdist(q.double(), bank).min(1).values
    at_best = torch.cdist(q.double(), bank).gather(1, got.argmax(1, keepdim=True))[:, 0]
    assert torch.all(at_best <= near * 1.02)


def test_quantised_search_finds_the_exact_nearest_entry(rng, monkeypatch):
    """Eq. (quantised search) against the exact float32 search and a direct float64 one: the same
    entries and distances for a bank of more than QUANTISED_SEARCH_MIN entries, an entry after the
    last whole block among them; QUANTISED_SEARCH = False gives the exact search."""
    from indeed_cli.model import memory as memory_module
    from indeed_cli.model.memory import QUANTISED_SEARCH_MIN, SEARCH_BLOCK

    monkeypatch.setattr(memory_module, "QUANTISED_SEARCH", True)  # whatever this CPU's default
    entries = QUANTISED_SEARCH_MIN + SEARCH_BLOCK // 2  # a partial last block
    mem, q, img = _random_bank_memory(rng, entries)
    bank = mem.bank.clone()
    bank[-1] = q[3]  # patch 3's own features in the partial block
    mem.bank.copy_(bank)
    near, which = torch.cdist(q.double(), bank.double()).min(1)
    d2, got = mem.nearest(q)
    assert int(got[3]) == entries - 1
    assert torch.equal(got, which)
    # (the product form's cancellation leaves about 0.02 where a patch equals its entry, as in the exact search)
    assert torch.allclose(d2.clamp_min(0).sqrt().double(), near, rtol=1e-3, atol=0.05)
    exact_d2, exact_which = mem.nearest_exact(q)
    assert torch.equal(exact_which, which) and torch.allclose(d2, exact_d2, rtol=1e-4, atol=1e-3)
    monkeypatch.setattr(memory_module, "QUANTISED_SEARCH", False)
    assert torch.equal(mem.distance(img), (exact_d2.clamp_min(0).sqrt() / mem.density[exact_which]).view(6, 8))
    monkeypatch.setattr(memory_module, "QUANTISED_SEARCH", True)
    # many patches are searched SEARCH_QUERIES at a time (each part with its own step alpha): the same entries
    # (20, 20 and 8 rows: the first two searched in integers, the last exactly)
    saved, memory_module.SEARCH_QUERIES = memory_module.SEARCH_QUERIES, 20
    try:
        assert torch.equal(mem.nearest(q)[1], which)
    finally:
        memory_module.SEARCH_QUERIES = saved
    # a bank changed in place is searched anew (its codes are remade)
    mem.bank[7] = q[0]
    assert int(mem.nearest(q)[1][0]) == 7


def test_quantised_searches_in_threads_agree_with_one_at_a_time(rng, monkeypatch):
    """Two threads searching one memory at once (torch releases the GIL) get what each search gets alone."""
    from concurrent.futures import ThreadPoolExecutor

    from indeed_cli.model import memory as memory_module
    from indeed_cli.model.memory import QUANTISED_SEARCH_MIN

    monkeypatch.setattr(memory_module, "QUANTISED_SEARCH", True)  # whatever this CPU's default

    mem, q, _ = _random_bank_memory(rng, QUANTISED_SEARCH_MIN)
    q = q.repeat(20, 1)  # searches long enough to overlap
    queries = [q, q.flip(0) * 1.5, q * 0.5, q.roll(7, 0)]  # different steps alpha, so different columns
    alone = [mem.nearest(x)[1] for x in queries]
    with ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda x: mem.nearest(x)[1], queries * 3))
    assert all(torch.equal(t, alone[i % len(queries)]) for i, t in enumerate(together))


def test_density_radius_is_the_mean_distance_to_the_nearest_other_entries(rng):
    """Eq. (memory density) against all pairwise distances computed directly; duplicates floored,
    a single entry (no other to measure) and equal entries give radius 1 (the plain distance)."""
    bank = torch.from_numpy(rng.normal(size=(700, 152)).astype(np.float32))  # more than one chunk
    pair = torch.cdist(bank.double(), bank.double()) + torch.diag(torch.full((700,), float("inf"), dtype=torch.float64))
    for k in (1, 3):
        want = pair.topk(k, dim=1, largest=False).values.mean(1)
        assert torch.allclose(bank_density(bank, k).double(), want, rtol=1e-4)
    two = torch.stack([bank[0], bank[0], bank[1]])  # entries 0 and 1 are the same patch
    rho = bank_density(two, 1)
    assert rho[0] == rho[1] and 0 < rho[0] < 1e-2 * rho[2]
    assert torch.equal(bank_density(bank[:1]), torch.ones(1))
    assert torch.equal(bank_density(bank[:1].repeat(5, 1)), torch.ones(5))
    # fewer others than neighbours asked for: the mean over all the others
    three = torch.cdist(bank[:3].double(), bank[:3].double())
    assert torch.allclose(bank_density(bank[:3], 9).double(), three.sum(1) / 2, rtol=1e-4)


def test_memory_is_thinned_to_its_entries_and_sampled_evenly():
    imgs = [np.full((1, 64, 64), v, np.float32) for v in (0.2, 0.5, 0.8)]
    mem = build_memory(bundled_trunk(), imgs, 1, entries=10, share=1.0)
    assert mem.entries == 10
    # the candidates' bound shared out among the images: 64 patches each, at most ceil(20 / 3) = 7 of
    # each image, so 21 candidates, all kept where the coreset may keep more
    assert build_memory(bundled_trunk(), imgs, 1, entries=100, share=1.0, candidates=20).entries == 21
    assert build_memory(bundled_trunk(), iter(imgs), 1, entries=100, share=0.5).entries == 3 * 32
    with pytest.raises(ValueError):
        build_memory(bundled_trunk(), imgs, 1, candidates=0)
    assert memory_sample(list(range(1000)), 400) == list(range(0, 800, 2))
    assert memory_sample([1, 2, 3], 400) == [1, 2, 3]
    with pytest.raises(ValueError):
        build_memory(bundled_trunk(), [], 1)
    with pytest.raises(ValueError):
        build_memory(bundled_trunk(), imgs, 1, share=0)


def test_fusion_weighs_the_distance_as_one_more_member(rng):
    a = rng.random((20, 30)).astype(np.float32)
    d = rng.random((20, 30)).astype(np.float32) * 7 + 2
    stats = FusionStats(map_mean=0.2, map_std=0.05, distance_mean=4.0, distance_std=1.5, members=2)
    scaled = 0.2 + 0.05 * (d - 4.0) / 1.5
    assert np.allclose(fuse(a, d, stats), (2 * a + scaled) / 3, atol=1e-6)
    # a distance map that is the members' map on another scale gives the map back
    same = 4.0 + 1.5 * (a - 0.2) / 0.05
    assert np.allclose(fuse(a, same, stats), a, atol=1e-5)
    st = fusion_stats([a, a + 1], [d], 1)
    both = np.concatenate([a.ravel(), a.ravel() + 1])
    assert np.isclose(st.map_mean, both.mean()) and np.isclose(st.map_std, both.std())
    assert np.isclose(st.distance_std, d.std()) and FusionStats.from_dict(st.to_dict()) == st


def test_checkpoint_round_trip_with_a_memory(tmp_path, rng):
    model = tiny_model(1, task="detect", support_width=8)
    mem = build_memory(bundled_trunk(), [rng.random((1, 48, 48), dtype=np.float32)], 1, share=1.0)
    p = save_checkpoint(tmp_path / "m.safetensors", model, {}, {}, memory=mem)
    meta = read_metadata(p)
    assert meta["memory"] == {"features": "efficientnet-lite0", "entries": 36}
    ck = load_checkpoint(p)
    assert ck.memory.entries == 36
    # the bank is stored in int8 with a scale per feature channel, and built already so rounded: the
    # file gives back what was built, and the rounding is at most half a step of the unrounded bank
    assert torch.allclose(ck.memory.bank, mem.bank, atol=1e-6)
    raw = mem.bank.clone()
    assert torch.equal(stored_bank(raw), raw)
    noisy = raw + 0.01 * torch.randn(raw.shape)
    assert ((stored_bank(noisy) - noisy).abs() <= 0.5 * noisy.abs().amax(0) / 127 * 1.01 + 1e-6).all()
    img = torch.from_numpy(rng.random((1, 1, 40, 40), dtype=np.float32))
    assert torch.equal(ck.memory.density, mem.density)
    assert torch.allclose(ck.memory.distance(img), mem.distance(img), atol=1e-4)
    # a file made before the density radii holds none: radii 1, the plain nearest distance it was
    # calibrated with
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(p), "pt") as f:
        old_meta = f.metadata()
    old_state = {k: v for k, v in load_file(str(p)).items() if k != "memory.density"}
    save_file(old_state, str(tmp_path / "old.safetensors"), metadata=old_meta)
    old = load_checkpoint(tmp_path / "old.safetensors").memory
    q = old.patch_features(img)
    assert torch.equal(old.density, torch.ones(36))
    nearest = torch.cdist(q.double(), old.bank.double()).amin(1)
    assert torch.allclose(old.distance(img).flatten().double(), nearest, atol=1e-3)

    with safe_open(str(p), "pt") as f:
        assert f.metadata()["format_version"] == "4"
    plain = save_checkpoint(tmp_path / "p.safetensors", model, {}, {})
    assert load_checkpoint(plain).memory is None and read_metadata(plain)["memory"] is None
    with pytest.raises(ValueError):
        save_checkpoint(tmp_path / "d.safetensors", tiny_model(1), {}, {}, memory=mem)
    # metadata that promises a memory the tensors do not hold: one clear error
    with safe_open(str(plain), "pt") as f:
        bad_meta = {**f.metadata(), "memory": json.dumps({"features": "efficientnet-lite0", "entries": 4})}
    save_file(load_file(str(plain)), str(tmp_path / "bad.safetensors"), metadata=bad_meta)
    with pytest.raises(CheckpointError, match="feature memory"):
        load_checkpoint(tmp_path / "bad.safetensors")


def test_four_bit_bank_is_its_channels_sixteen_levels_packed_two_a_byte(rng):
    """quantize_4bit against a direct computation: 16 levels from each row's minimum to its maximum,
    codes packed two a byte (an odd count padded), given back to half a step."""
    rows = torch.from_numpy(rng.normal(size=(5, 9)).astype(np.float32)) * torch.tensor([[1.0], [3], [0.1], [10], [1]])
    rows[4] = 0.25  # a constant channel: every value is its minimum
    codes, low, step = quantize_4bit(rows)
    assert codes.dtype == torch.uint8 and codes.shape == (5, 5) and low.dtype == step.dtype == torch.float16
    lo, hi = rows.amin(1), rows.amax(1)
    assert torch.allclose(low.float(), lo, rtol=1e-3) and torch.allclose(
        step[:4].float(), (hi - lo)[:4] / 15, rtol=1e-3
    )
    want = ((rows - low.float()[:, None]) / step.float()[:, None]).round().clamp(0, 15)
    assert torch.equal((codes[:, :4] & 15).float(), want[:, 0:8:2]) and torch.equal(
        (codes[:, :4] >> 4).float(), want[:, 1:8:2]
    )
    assert torch.equal((codes[:, 4] & 15).float(), want[:, 8]) and not (codes[:, 4] >> 4).any()  # the pad
    back = dequantize_4bit(codes, low, step, 9)
    assert back.shape == rows.shape and ((back - rows).abs() <= 0.5 * step.float()[:, None] * 1.01 + 1e-6).all()
    assert torch.equal(back[4], torch.full((9,), 0.25))
    # rounding what is already rounded changes nothing
    bank = torch.from_numpy(rng.normal(size=(33, 152)).astype(np.float32))
    once = stored_bank(bank, 4)
    assert torch.equal(stored_bank(once, 4), once) and not torch.equal(once, bank)
    assert len(torch.unique(once[:, 0])) <= 16
    with pytest.raises(ValueError):
        stored_bank(bank, 6)


def test_four_bit_memory_round_trip_holds_its_entries_in_half_the_bytes(tmp_path, rng):
    """A memory built in 4 bits: the file (format version 5, metadata bits 4) gives back the bank
    and the distances that were built, its bank taking half the bytes of the int8 one."""
    from safetensors import safe_open

    model = tiny_model(1, task="detect", support_width=8)
    imgs = [rng.random((1, 48, 56), dtype=np.float32)]  # 6 x 7 = 42 entries; odd counts are tested above
    sizes = {}
    for bits in (8, 4):
        mem = build_memory(bundled_trunk(), imgs, 1, share=1.0, bits=bits)
        assert mem.bits == bits and torch.equal(stored_bank(mem.bank, bits), mem.bank)
        p = save_checkpoint(tmp_path / f"m{bits}.safetensors", model, {}, {}, memory=mem)
        with safe_open(str(p), "pt") as f:
            version = f.metadata()["format_version"]
            sizes[bits] = sum(
                f.get_tensor(k).numel() * f.get_tensor(k).element_size() for k in f.keys() if "bank_t" in k
            )
        ck = load_checkpoint(p)
        assert version == {8: "4", 4: "5"}[bits] and ck.memory.bits == bits
        assert read_metadata(p)["memory"].get("bits", 8) == bits
        assert torch.equal(ck.memory.bank, mem.bank) and torch.equal(ck.memory.density, mem.density)
        img = torch.from_numpy(rng.random((1, 1, 40, 40), dtype=np.float32))
        assert torch.allclose(ck.memory.distance(img), mem.distance(img), atol=1e-4)
        again = save_checkpoint(tmp_path / f"again{bits}.safetensors", ck.model, {}, {}, memory=ck.memory)
        assert torch.equal(load_checkpoint(again).memory.bank, mem.bank)  # rewriting keeps the form
    # 42 x 152 codes: int8 one byte each plus a float16 scale per channel; 4 bits half a byte plus two
    assert sizes == {8: 42 * 152 + 2 * 152, 4: 21 * 152 + 4 * 152}
    # codes of the wrong size for the entries the metadata promises: one clear error
    from safetensors.torch import load_file, save_file

    with safe_open(str(tmp_path / "m4.safetensors"), "pt") as f:
        meta = f.metadata()
    state = load_file(str(tmp_path / "m4.safetensors"))
    state["memory.bank_t4"] = state["memory.bank_t4"][:, :-1].contiguous()
    save_file(state, str(tmp_path / "short.safetensors"), metadata=meta)
    with pytest.raises(CheckpointError, match="feature memory is damaged"):
        load_checkpoint(tmp_path / "short.safetensors")
    with pytest.raises(ValueError):
        build_memory(bundled_trunk(), imgs, 1, bits=2)


def test_score_fusion_weighs_the_distance_score_as_a_second_vote(rng):
    """Eq. (score fusion): t(d) brought to the fused scores' normal scale, averaged with t(a_M)."""
    stats = ScoreStats(score_mean=0.3, score_std=0.02, distance_score_mean=1.1, distance_score_std=0.1)
    assert np.isclose(fuse_scores(0.36, 1.4, stats), (0.36 + 0.3 + 0.02 * (1.4 - 1.1) / 0.1) / 2)
    # a distance score that says what the map's says, on its own scale, gives the map's score back
    assert np.isclose(fuse_scores(0.34, 1.1 + 0.1 * (0.34 - 0.3) / 0.02, stats), 0.34)
    a, d = rng.random(9), rng.random(9) * 5
    st = score_stats(a, d)
    assert np.allclose([st.score_mean, st.score_std, st.distance_score_mean, st.distance_score_std],
                       [a.mean(), a.std(), d.mean(), d.std()])  # fmt: skip
    assert ScoreStats.from_dict(st.to_dict()) == st
    # on the normal images the statistics come from, the joint scores keep the map scores' mean
    assert np.isclose(np.mean([fuse_scores(x, y, st) for x, y in zip(a, d)]), a.mean())


def test_calibrated_detector_maps_the_fusion_computed_directly(tmp_path, rng):
    """calibrate() learns Eq. (memory fusion)'s statistics from the normal images' pixels, Eq. (score
    fusion)'s from their scores, the threshold on the joint scores and the pixel threshold on the
    fused maps' own; detect() maps and scores so."""
    model = tiny_model(1, task="detect", support_width=8)
    normal = [rng.integers(90, 160, (1, 40, 48)).astype(np.float32) / 255 for _ in range(3)]
    mem = build_memory(bundled_trunk(), normal, 1, share=1.0)
    ck = load_checkpoint(save_checkpoint(tmp_path / "m.safetensors", model, {"scales": [1.0]}, {}, memory=mem))
    facts = calibrate(ck, normal, quantile=1.0)
    a = [member_mean(ck, im) for im in normal]
    d = [distance_map(ck.memory, im, 1) for im in normal]
    want = fusion_stats(a, d, 1)
    got = FusionStats.from_dict(facts["memory"])
    assert np.allclose(list(got.to_dict().values()), list(want.to_dict().values()), rtol=1e-5)
    fused_scores = [image_score(fuse(x, y, want)) for x, y in zip(a, d)]
    votes = score_stats(fused_scores, [image_score(y) for y in d])
    assert np.allclose(list(facts["memory"]["scores"].values()), list(votes.to_dict().values()), rtol=1e-5)
    joint = [fuse_scores(f, image_score(y), votes) for f, y in zip(fused_scores, d)]
    assert np.isclose(facts["threshold"], max(joint), rtol=1e-5)
    assert np.isclose(facts["pixel_threshold"], max(fused_scores), rtol=1e-5)
    assert facts["score_kind"] == "top5_joint" and "score fusion" in facts["score"]
    assert facts["memory"]["entries"] == mem.entries and "normal patch features" in facts["map"]
    ck.extra["detect"] = facts
    test = rng.integers(0, 256, (1, 37, 50)).astype(np.float32) / 255
    dmap = distance_map(ck.memory, test, 1)
    fused = fuse(member_mean(ck, test), dmap, stored_fusion(ck))
    det = detect(ck, test)
    assert np.allclose(det.anomaly_map, fused, atol=1e-6)
    assert np.isclose(det.score, fuse_scores(image_score(fused), image_score(dmap), stored_score_fusion(ck)))
    assert np.isclose(detect(ck, test, score="top5").score, image_score(fused))
    assert stored_pixel_threshold(ck) == facts["pixel_threshold"] != facts["threshold"]
    # a detector calibrated before Eq. (score fusion) keeps the fused map's own score and one threshold
    ck.extra["detect"] = {k: v for k, v in facts.items() if k not in ("pixel_threshold", "score_kind")}
    del ck.extra["detect"]["memory"]["scores"]
    ck.extra["detect"]["score_kind"] = "top5"
    assert stored_score_fusion(ck) is None and score_kind(ck) == "top5"
    assert stored_pixel_threshold(ck) == facts["threshold"]
    assert np.isclose(detect(ck, test).score, image_score(fused))
    with pytest.raises(ValueError, match="top5_joint"):
        detect(ck, test, score="top5_joint")
    # a defect-like patch that no normal patch resembles lies further from the memory
    spot = normal[0].copy()
    spot[:, 16:32, 16:32] = 1.0
    assert distance_map(ck.memory, spot, 1)[24, 24] > distance_map(ck.memory, normal[0], 1)[24, 24] + 1.0


def test_memory_reads_its_trunk_from_a_member_that_holds_the_same(tmp_path, rng):
    """A detector whose f_thetaM (or a member's) reads the same trunk stores it once: the memory then
    loads it from that network."""
    from indeed_cli.model.checkpoint import load_support_features

    feat = tiny_model(1, task="detect", support_width=8, support_features="efficientnet-lite0", seed=3)
    load_support_features(feat, resolve_feature_weights(None, "efficientnet-lite0"))
    plain = tiny_model(1, task="detect", support_width=8)
    mem = build_memory(bundled_trunk(), [rng.random((1, 48, 48), dtype=np.float32)], 1, share=1.0)
    from indeed_cli.model import Checkpoint

    member = Checkpoint(feat, feat.cfg, {}, {"detect": {"scales": [1.0]}})
    shared = save_checkpoint(tmp_path / "s.safetensors", plain, {}, {}, members=[member], memory=mem)
    alone = save_checkpoint(tmp_path / "a.safetensors", plain, {}, {}, memory=mem)
    assert read_metadata(shared)["memory"]["trunk"] == "1" and "trunk" not in read_metadata(alone)["memory"]
    from safetensors import safe_open

    with safe_open(str(shared), "pt") as f, safe_open(str(alone), "pt") as g:  # the trunk stored once
        assert not any(k.startswith("memory.trunk.") for k in f.keys())
        assert any(k.startswith("memory.trunk.") for k in g.keys())
    a, b = load_checkpoint(shared).memory, load_checkpoint(alone).memory
    img = torch.from_numpy(rng.random((1, 1, 40, 40), dtype=np.float32))
    assert torch.equal(a.distance(img), b.distance(img))


def test_greedy_coreset_keeps_the_rare_points_a_random_draw_misses():
    """Many copies of one point and a few far ones: the coreset of a few rows holds every far one;
    each next row is the farthest from those chosen."""
    gen = torch.Generator().manual_seed(0)
    common = torch.zeros(500, 8) + 0.01 * torch.randn(500, 8, generator=gen)
    rare = torch.eye(8)[:3] * 10
    feats = torch.cat([common, rare])
    core = greedy_coreset(feats, 4, torch.Generator().manual_seed(1), dims=8)
    assert len(core) == 4
    for r in rare:
        assert (core - r).norm(dim=1).min() < 1e-6
    assert torch.equal(greedy_coreset(feats[:3], 4, gen), feats[:3])


def test_onnx_metadata_gives_the_threshold_learned_without_the_memory(tmp_path, rng):
    """The exported graph has no memory: its metadata names the members' own threshold, not the fused one."""
    from indeed_cli.pipelines.export import metadata

    model = tiny_model(1, task="detect", support_width=8)
    normal = [rng.integers(90, 160, (1, 40, 48)).astype(np.float32) / 255 for _ in range(3)]
    mem = build_memory(bundled_trunk(), normal, 1, share=1.0)
    ck = load_checkpoint(save_checkpoint(tmp_path / "m.safetensors", model, {"scales": [1.0]}, {}, memory=mem))
    ck.extra["detect"] = calibrate(ck, normal, quantile=1.0)
    meta = metadata(ck, 128, "P")
    without = ck.extra["detect"]["memory"]["threshold_without"]
    assert json.loads(meta["indeed.threshold"]) == without != ck.extra["detect"]["threshold"]
    assert "indeed.memory" in meta
    # the graph's map is scored by its own top5, the score threshold_without was learned on
    assert ck.extra["detect"]["score_kind"] == "top5_joint" and meta["indeed.score"] == "top5"


def test_calibrating_to_four_bit_weights_rebuilds_the_memory_through_the_rounded_trunk(tmp_path, rng):
    """`indeed calibrate --weight-bits 4`: the networks are rounded to Eq. (4-bit weights) before
    anything is measured, so the memory filled through the rounded trunk still shares it and the
    stored threshold is the saved file's own; without --memory the stale memory is refused."""
    from indeed_cli.io import write_image
    from indeed_cli.model import Checkpoint
    from indeed_cli.model.checkpoint import load_support_features
    from indeed_cli.pipelines import calibrate_checkpoint

    feat = tiny_model(1, task="detect", support_width=8, support_features="efficientnet-lite0", seed=3)
    load_support_features(feat, resolve_feature_weights(None, "efficientnet-lite0"))
    plain = tiny_model(1, task="detect", support_width=8)
    paths = []
    for i in range(3):
        paths.append(write_image(tmp_path / f"n{i}.png", rng.integers(90, 160, (1, 40, 48)).astype(np.float32) / 255))
    mem = build_memory(bundled_trunk(), [str(p) for p in paths], 1, share=1.0)
    member = Checkpoint(feat, feat.cfg, {}, {"detect": {"scales": [1.0]}})
    src = save_checkpoint(
        tmp_path / "s.safetensors", plain, {"scales": [1.0]}, {}, int8_min_weights=1000, members=[member], memory=mem
    )
    assert read_metadata(src)["memory"]["trunk"] == "1"
    with pytest.raises(ValueError, match="--memory"):
        calibrate_checkpoint(src, tmp_path / "x.safetensors", paths, "cpu", weight_bits=4)
    assert not (tmp_path / "x.safetensors").exists()
    out = tmp_path / "q4.safetensors"
    _, _, facts = calibrate_checkpoint(src, out, paths, "cpu", memory=paths, memory_entries=64, weight_bits=4)
    meta = read_metadata(out)
    assert meta["weight_bits"] == 4 and meta["memory"]["trunk"] == "1"  # the rounded trunk, still stored once
    assert out.stat().st_size < src.stat().st_size
    ck = load_checkpoint(out)
    before = load_checkpoint(src).members[0].model.support.features.state_dict()
    after = ck.members[0].model.support.features.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the trunk was rounded
    again = calibrate(ck, [str(p) for p in paths])  # the threshold is the saved file's own
    assert np.isclose(again["threshold"], facts["threshold"], rtol=1e-5)
    assert np.isclose(again["pixel_threshold"], facts["pixel_threshold"], rtol=1e-5)


def test_integer_search_is_the_default_only_where_the_cpu_has_int8_dot_products():
    """Without VNNI or AMX (AVX2 alone) torch's int8 product is slower than the float32 search."""
    from indeed_cli.model import cpu, memory

    avx2 = "flags\t\t: fpu sse sse2 avx fma f16c avx2"
    assert not cpu.has_any(cpu.INT8_DOT_FLAGS, avx2)
    assert cpu.has_any(cpu.INT8_DOT_FLAGS, avx2 + " avx512f avx512_vnni")
    assert cpu.has_any(cpu.INT8_DOT_FLAGS, avx2 + " avx_vnni")
    assert not cpu.has_any(cpu.INT8_DOT_FLAGS, "")  # not Linux: nothing assumed
    assert memory.QUANTISED_SEARCH == cpu.has_any(cpu.INT8_DOT_FLAGS)
