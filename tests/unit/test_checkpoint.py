"""Checkpoint round-trip, refusal of corrupt or mismatched files, --weights resolution."""

import json
from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from safetensors.torch import save_file

from indeed_cli.model import checkpoint as C
from indeed_cli.model import registry as R


def test_round_trip_preserves_config_and_outputs(tmp_path):
    m = tiny_model(3, seed=3)
    p = C.save_checkpoint(tmp_path / "m.safetensors", m, {"steps": 5}, {"ood": [1, 2]})
    meta = C.read_metadata(p)
    assert meta["config"]["rank"] == m.cfg.rank and meta["training"]["steps"] == 5 and meta["extra"]["ood"] == [1, 2]
    ck = C.load_checkpoint(p)
    assert ck.config == m.cfg
    Y = torch.rand(1, 3, 16, 16)
    with torch.no_grad():
        a, b = m(Y), ck.model(Y)
    assert torch.allclose(a.L_hat + a.mu_S, b.L_hat + b.mu_S, atol=2e-2)  # fp16 storage
    assert not list(tmp_path.glob(".*tmp*"))  # atomic write left no temp file


def test_checkpoints_get_the_permissions_of_other_outputs(tmp_path):
    """safetensors creates files 0600; a checkpoint (and a training run's state) is made 0666 less the
    umask, as images are, so that others of a group can read it on a shared machine."""
    import os
    import stat

    from indeed_cli.tasks.training.state import save_state

    old = os.umask(0o027)
    try:
        p = C.save_checkpoint(tmp_path / "m.safetensors", tiny_model(3), {}, {})
        m = tiny_model(3)
        opt = torch.optim.Adam(m.parameters())
        save_state(tmp_path / "run", m, opt, 1, torch.Generator(), {}, elapsed=0.0)
    finally:
        os.umask(old)
    expected = 0o666 & ~C.UMASK  # the umask the process had when it started
    assert stat.S_IMODE(p.stat().st_mode) == expected
    assert [stat.S_IMODE(f.stat().st_mode) for f in (tmp_path / "run").glob("state-*")] == [expected]


def test_int8_storage_round_trip_error_bound_and_size(tmp_path):
    m = tiny_model(3, seed=4)
    big = {k for k, v in m.state_dict().items() if v.dim() == 4 and v.numel() >= 1000}
    assert big  # the tiny model has convolutions this large
    fp16 = C.save_checkpoint(tmp_path / "a.safetensors", m, {"steps": 5}, {"ood": [1]})
    q = C.save_checkpoint(tmp_path / "b.safetensors", m, {"steps": 5}, {"ood": [1]}, int8_min_weights=1000)
    assert q.stat().st_size < fp16.stat().st_size
    assert C.read_metadata(fp16)["int8_min_weights"] is None
    ck = C.load_checkpoint(q)
    assert ck.int8_min_weights == 1000 and ck.extra == {"ood": [1]} and ck.training == {"steps": 5}
    src, got = m.state_dict(), ck.model.state_dict()
    for k in src:
        if k in big:  # half a quantisation step of the channel's own scale, at most
            step = src[k].flatten(1).abs().amax(1) / 127
            err = (got[k] - src[k]).flatten(1).abs().amax(1)
            assert (err <= 0.5 * step * 1.01 + 1e-7).all(), k
            assert (got[k] != src[k].half().float()).any()  # it really was stored in int8
        else:
            assert torch.equal(got[k], src[k].half().float()), k
    # rewriting it (what indeed calibrate does) keeps the int8 storage and the weights
    again = C.save_checkpoint(
        tmp_path / "c.safetensors", ck.model, ck.training, ck.extra, int8_min_weights=ck.int8_min_weights
    )
    assert again.stat().st_size == q.stat().st_size
    assert all(torch.equal(v, C.load_checkpoint(again).model.state_dict()[k]) for k, v in got.items())


def test_four_bit_weights_are_fifteen_symmetric_levels_packed_two_a_byte():
    """Eq. (4-bit weights) against a direct computation: codes q + 8 with q = round(w / s) in -7..7,
    s = max|w| / 7 per output channel (float16), the even weight in the low half of its byte."""
    torch.manual_seed(0)
    w = torch.randn(6, 3, 3, 3)  # 27 weights a channel: the last byte is padded
    codes, scale = C.quantize_4bit_weights(w)
    assert codes.dtype == torch.uint8 and codes.shape == (6, 14) and scale.dtype == torch.float16
    s = (w.flatten(1).abs().amax(1) / 7).half().float()
    q = torch.round(w.flatten(1) / s[:, None]).clamp(-7, 7)
    assert torch.equal((codes[:, :13] & 15).float() - 8, q[:, 0:26:2])
    assert torch.equal((codes >> 4)[:, :13].float() - 8, q[:, 1::2])
    assert torch.equal(codes[:, 13] & 15, (q[:, 26] + 8).to(torch.uint8)) and (codes[:, 13] >> 4 == 8).all()
    back = C.dequantize_4bit_weights(codes, scale, tuple(w.shape))
    assert torch.equal(back, (q * s[:, None]).view_as(w))
    assert ((back - w).flatten(1).abs().amax(1) <= 0.5 * s * 1.01 + 1e-7).all()  # half a step at most
    assert torch.equal(C.dequantize_4bit_weights(*C.quantize_4bit_weights(back), tuple(w.shape)), back)  # idempotent
    with pytest.raises(ValueError, match="4-bit codes"):
        C.dequantize_4bit_weights(codes, scale, (6, 3, 3, 4))


def test_four_bit_weight_storage_round_trip_is_what_stored_weights_rounds_to(tmp_path):
    m = tiny_model(3, seed=4)
    big = {k for k, v in m.state_dict().items() if v.dim() == 4 and v.numel() >= 1000}
    q8 = C.save_checkpoint(tmp_path / "a.safetensors", m, {"steps": 5}, {"ood": [1]}, int8_min_weights=1000)
    q4 = C.save_checkpoint(
        tmp_path / "b.safetensors", m, {"steps": 5}, {"ood": [1]}, int8_min_weights=1000, weight_bits=4
    )
    big_bytes = sum(m.state_dict()[k].numel() for k in big)
    assert q8.stat().st_size - q4.stat().st_size >= 0.49 * big_bytes  # half the bytes of the int8 convolutions
    meta = C.read_metadata(q4)
    assert (meta["weight_bits"], meta["int8_min_weights"], C.read_metadata(q8)["weight_bits"]) == (4, 1000, 8)
    from safetensors import safe_open

    with safe_open(str(q4), "pt") as f:
        assert f.metadata()["format_version"] == str(C.WEIGHTS4_FORMAT_VERSION)
        assert {k[: -len(C.Q4_SCALE_SUFFIX)] for k in f.keys() if k.endswith(C.Q4_SCALE_SUFFIX)} == big
    ck = C.load_checkpoint(q4)
    assert ck.weight_bits == 4 and ck.extra == {"ood": [1]}
    rounded = C.stored_weights(tiny_model(3, seed=4), 1000, 4).state_dict()
    src, got = m.state_dict(), ck.model.state_dict()
    for k in src:
        if k in big:
            assert torch.equal(got[k], rounded[k]), k
            assert not torch.equal(got[k], C.load_checkpoint(q8).model.state_dict()[k])  # coarser than int8
        else:
            assert torch.equal(got[k], src[k].half().float()), k
    # rewriting it (what indeed calibrate does) keeps the 4-bit storage and the weights exactly
    again = C.save_checkpoint(tmp_path / "c.safetensors", ck.model, int8_min_weights=1000, weight_bits=ck.weight_bits)
    assert again.stat().st_size < q4.stat().st_size + 100
    assert all(torch.equal(v, C.load_checkpoint(again).model.state_dict()[k]) for k, v in got.items())
    with pytest.raises(ValueError, match="8 or 4"):
        C.save_checkpoint(tmp_path / "d.safetensors", m, weight_bits=2)
    # a file whose 4-bit codes do not fit the config is refused in one line
    from safetensors.torch import load_file

    with safe_open(str(q4), "pt") as f:
        meta = f.metadata()
    state = load_file(str(q4))
    name = sorted(big)[0]
    state[name] = state[name][:, :-1].contiguous()
    save_file(state, str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(C.CheckpointError, match="4-bit tensor"):
        C.load_checkpoint(tmp_path / "bad.safetensors")


def test_int8_tensor_without_its_scale_is_refused(tmp_path):
    m = tiny_model(1)
    p = C.save_checkpoint(tmp_path / "q.safetensors", m, int8_min_weights=1000)
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(p), "pt") as f:
        meta = f.metadata()
    state = {k: v for k, v in load_file(str(p)).items() if not k.endswith(C.INT8_SCALE_SUFFIX)}
    save_file(state, str(tmp_path / "noscale.safetensors"), metadata=meta)
    with pytest.raises(C.CheckpointError, match="int8"):
        C.load_checkpoint(tmp_path / "noscale.safetensors")


def test_bundled_weights_are_under_16_megabytes():
    files = sorted((Path(__file__).resolve().parents[2] / "weights").glob("*.safetensors"))
    assert files
    for f in files:
        assert f.stat().st_size < 16_000_000, f"{f.name}: {f.stat().st_size / 1e6:.2f} MB"


def test_truncated_file_is_refused(tmp_path):
    p = C.save_checkpoint(tmp_path / "m.safetensors", tiny_model(1))
    data = p.read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(C.CheckpointError, match="unreadable|not a readable"):
        C.load_checkpoint(tmp_path / "cut.safetensors")


def test_text_and_foreign_files_are_refused(tmp_path):
    (tmp_path / "t.safetensors").write_text("hello")
    with pytest.raises(C.CheckpointError, match="not a readable safetensors"):
        C.load_checkpoint(tmp_path / "t.safetensors")
    save_file({"w": torch.zeros(2)}, str(tmp_path / "f.safetensors"))
    with pytest.raises(C.CheckpointError, match="not an indeed checkpoint"):
        C.load_checkpoint(tmp_path / "f.safetensors")
    with pytest.raises(C.CheckpointError, match="not found"):
        C.load_checkpoint(tmp_path / "missing.safetensors")


def test_config_and_tensor_mismatch_is_refused(tmp_path):
    m = tiny_model(1)
    state = {k: v.half() for k, v in m.state_dict().items()}
    meta = {"format": "indeed", "format_version": "1", "config": json.dumps({**json.loads(m.cfg.to_json()), "rank": 5})}
    save_file(state, str(tmp_path / "bad.safetensors"), metadata=meta)
    with pytest.raises(C.CheckpointError, match="shape"):
        C.load_checkpoint(tmp_path / "bad.safetensors")
    meta["format_version"] = "99"
    save_file(state, str(tmp_path / "v.safetensors"), metadata=meta)
    with pytest.raises(C.CheckpointError, match="version"):
        C.load_checkpoint(tmp_path / "v.safetensors")
    state.pop(next(iter(state)))
    meta["format_version"] = "1"
    meta["config"] = m.cfg.to_json()
    save_file(state, str(tmp_path / "miss.safetensors"), metadata=meta)
    with pytest.raises(C.CheckpointError, match="missing"):
        C.load_checkpoint(tmp_path / "miss.safetensors")


def test_hub_reference_parsing_and_offline_error(tmp_path, monkeypatch):
    assert R.parse_hub_ref("hf://me/repo/dir/m.safetensors@abc123") == ("me/repo", "dir/m.safetensors", "abc123")
    assert R.parse_hub_ref("hf://me/repo/m.safetensors") == ("me/repo", "m.safetensors", None)
    with pytest.raises(C.CheckpointError):
        R.parse_hub_ref("hf://me/m.safetensors")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", True, raising=False)
    with pytest.raises(C.CheckpointError, match="not in the local Hugging Face cache"):
        R.resolve_weights("hf://someone/somerepo/m.safetensors@0123456789abcdef0123456789abcdef01234567")


def test_resolution_order(tmp_path, monkeypatch):
    monkeypatch.setenv("INDEED_WEIGHTS_DIR", str(tmp_path))
    gray = C.save_checkpoint(tmp_path / R.BUNDLED[1], tiny_model(1))
    color = C.save_checkpoint(tmp_path / R.BUNDLED[3], tiny_model(3))
    assert R.resolve_weights(None, 1) == gray
    assert R.resolve_weights("gray") == gray and R.resolve_weights("indeed-denoise-color") == color
    assert R.resolve_weights(str(color)) == color
    full = C.save_checkpoint(tmp_path / R.BUNDLED_FULLCHROMA, tiny_model(3))
    # colour images are denoised with the full-chroma model and adapted from `color`; gray has one model
    assert R.resolve_weights("color-fullchroma") == full and R.resolve_weights(None, 3) == full
    assert R.resolve_weights(None, 3, job="adapt") == color and R.resolve_weights("default", 3, job="adapt") == color
    assert R.resolve_weights(None, 1, job="adapt") == gray == R.resolve_weights(None, 1)
    assert R.resolve_weights("color-fullchroma", 3, job="adapt") == full  # a named model wins
    cam = C.save_checkpoint(tmp_path / R.BUNDLED_CAMERA, tiny_model(3))
    assert R.resolve_weights("colour-camera") == cam and R.resolve_weights(None, 3) == full
    # colour images are decomposed with the rank-supervised model; gray ones with the gray model
    rank = C.save_checkpoint(tmp_path / R.BUNDLED_RANK, tiny_model(3))
    assert R.resolve_weights(None, 3, job="decompose") == rank == R.resolve_weights("color-rank")
    assert R.resolve_weights(None, 1, job="decompose") == gray and R.resolve_weights(None, 3) == full
    with pytest.raises(C.CheckpointError, match="neither a file nor a bundled name"):
        R.resolve_weights("nope")
    rows = R.list_checkpoints(include_cache=False)
    assert {r["name"] for r in rows} == {"gray", "color", "color-fullchroma", "color-camera", "color-rank"}
    assert all(R.resolve_weights(r["name"]) == Path(r["path"]) for r in rows)
    defaults = {r["name"]: r["default_for"] for r in rows}
    assert defaults == {
        "gray": ["denoise", "decompose", "adapt"],
        "color": ["adapt"],
        "color-fullchroma": ["denoise"],
        "color-rank": ["decompose"],
        "color-camera": [],
    }


def test_bundled_weights_load():
    """The shipped defaults exist, load, and say what they are."""
    for c in (1, 3):
        for job in ("denoise", "decompose", "adapt"):
            ck = C.load_checkpoint(R.resolve_weights(None, c, job=job))
            assert ck.config.channels == c and ck.config.task == "denoise"
            assert ck.training.get("steps", 0) > 0 and "ood" in ck.extra


def test_missing_weights_message_names_what_was_given(tmp_path):
    with pytest.raises(C.CheckpointError) as e:
        R.resolve_weights(str(tmp_path / "nothere.safetensors"))
    assert "nothere.safetensors'" in str(e.value) and ".safetensors.safetensors" not in str(e.value)
    assert "color" in str(e.value) and "hf://" in str(e.value)


def test_unreachable_hub_fails_fast_in_one_line(tmp_path, monkeypatch, capfd):
    """Without a network, huggingface_hub would retry five times over ~25 s, a warning each time."""
    import time

    import huggingface_hub.constants as hc

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False, raising=False)
    monkeypatch.setattr(hc, "ENDPOINT", "http://127.0.0.1:9")  # the discard port: connection refused
    t0 = time.perf_counter()
    with pytest.raises(C.CheckpointError, match="cannot be reached"):
        R.resolve_weights("hf://someone/somerepo/m.safetensors")
    assert time.perf_counter() - t0 < 5
    out, err = capfd.readouterr()
    assert "Retrying" not in out + err


def test_detector_members_round_trip_with_their_own_scales(tmp_path):
    """A detector's members keep their networks, training facts and read-out scales through a file
    (format 3, tensors member<k>.*), also in int8; a member's threshold is dropped, the first's scales
    stay; what has no map to average, or maps another quantity, is refused."""
    from indeed_cli.tasks.detection import readout_scales, with_members

    first = tiny_model(1, seed=1, task="detect", support_width=8)
    second = tiny_model(1, seed=2, task="detect", support_width=8)
    a = C.Checkpoint(first, first.cfg, {"steps": 3}, {"detect": {"threshold": 0.4, "scales": [1.0, 0.5]}}, "a")
    b = C.Checkpoint(second, second.cfg, {"steps": 7}, {"detect": {"threshold": 0.3, "scales": [0.5, 0.25]}}, "b")
    pair = with_members(a, [b])
    assert pair.extra == {"detect": {"scales": [1.0, 0.5]}} and a.members == []  # no threshold, a unchanged
    assert [m.extra for m in pair.members] == [{"detect": {"scales": [0.5, 0.25]}}]
    for int8 in (None, 1000):
        p = C.save_checkpoint(
            tmp_path / f"p{int8}.safetensors", pair.model, pair.training, pair.extra, members=pair.members,
            int8_min_weights=int8,
        )  # fmt: skip
        meta = C.read_metadata(p)
        assert len(meta["members"]) == 1 and meta["members"][0]["training"] == {"steps": 7}
        back = C.load_checkpoint(p)
        assert [readout_scales(m) for m in (back, *back.members)] == [(1.0, 0.5), (0.5, 0.25)]
        assert back.members[0].config == second.cfg and back.members[0].source.endswith("#member1")
        got, want = back.members[0].model.state_dict(), second.state_dict()
        tol = 2e-2 if int8 else 1e-3
        assert all(torch.allclose(got[k], want[k].float(), atol=tol) for k in want)
        assert not all(torch.allclose(got[k], first.state_dict()[k], atol=tol) for k in want)
    assert file_metadata(p)["format_version"] == "3"
    # a member's own members are flattened into the detector's
    trio = with_members(a, [pair])
    assert len(trio.members) == 2
    with pytest.raises(C.CheckpointError, match="maps"):
        plain = tiny_model(1, task="detect")  # |mu_S| map beside q(z = 1) maps
        with_members(a, [C.Checkpoint(plain, plain.cfg, {}, {}, "plain")])
    with pytest.raises(C.CheckpointError, match="channel"):
        colour = tiny_model(3, task="detect", support_width=8)
        with_members(a, [C.Checkpoint(colour, colour.cfg, {}, {}, "colour")])
    den = tiny_model(1)
    with pytest.raises(C.CheckpointError, match="detectors"):
        with_members(a, [C.Checkpoint(den, den.cfg, {}, {}, "den")])
    with pytest.raises(ValueError, match="detectors"):
        C.save_checkpoint(tmp_path / "x.safetensors", den, members=pair.members)


def file_metadata(path) -> dict:
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.metadata()


def test_member_tensors_missing_are_refused(tmp_path):
    from safetensors.torch import load_file

    from indeed_cli.tasks.detection import with_members

    first = tiny_model(1, seed=1, task="detect", support_width=8)
    a = C.Checkpoint(first, first.cfg, {}, {}, "a")
    p = C.save_checkpoint(tmp_path / "p.safetensors", first, members=with_members(a, [a]).members)
    meta = file_metadata(p)
    state = {k: v for k, v in load_file(str(p)).items() if not k.startswith("member1.support.")}
    save_file(state, str(tmp_path / "cut.safetensors"), metadata=meta)
    with pytest.raises(C.CheckpointError, match="member 1 does not match"):
        C.load_checkpoint(tmp_path / "cut.safetensors")
