"""The modular network: shapes, sampling vs posterior means, module selection, input checks."""

import warnings

import pytest
import torch
from conftest import tiny_config, tiny_model

from indeed_cli.model import InDeed, network
from indeed_cli.model.posteriors import low_rank


@pytest.mark.parametrize("channels", [1, 3])
def test_output_shapes_follow_the_pgm(channels):
    m = tiny_model(channels)
    Y = torch.rand(2, channels, 24, 40)
    d = m(Y)
    r = m.cfg.rank
    assert d.mu_A.shape == d.sigma_A.shape == (2, channels, 24, r)
    assert d.mu_B.shape == d.sigma_B.shape == (2, channels, 40, r)
    assert d.mu_S.shape == d.sigma_S.shape == Y.shape
    assert (d.sigma_A > 0).all() and (d.sigma_B > 0).all() and (d.sigma_S > 0).all()
    assert torch.allclose(d.L_hat, low_rank(d.mu_A, d.mu_B))
    assert torch.linalg.matrix_rank(d.L_hat[0, 0]) <= r


def test_inference_uses_means_and_training_samples():
    m = tiny_model(1)
    Y = torch.rand(1, 1, 16, 16)
    a, b = m(Y), m(Y)
    assert torch.equal(a.S_hat, b.S_hat) and torch.equal(a.S_hat, a.mu_S)
    s = m(Y, sample=True)
    assert not torch.equal(s.A_hat, s.mu_A) and not torch.equal(s.S_hat, s.mu_S)


def test_sparse_module_sees_only_the_residual():
    """f_thetaS takes Y - A B^T: changing Y and L by the same amount leaves S unchanged."""
    m = tiny_model(1)
    Y = torch.rand(1, 1, 16, 16)
    d = m(Y)
    mu, _ = m.sparse(Y - d.L_hat)
    assert torch.allclose(mu, d.mu_S)


def test_sparse_module_can_also_see_the_low_rank_part(tmp_path):
    """sparse_input="residual+lowrank": the same residual with another L gives another S;
    the paper's "residual" module ignores L; the option survives a checkpoint round trip."""
    from indeed_cli.model import load_checkpoint, save_checkpoint

    m = tiny_model(3, sparse_input="residual+lowrank")
    R, L = torch.rand(1, 3, 16, 16), torch.rand(1, 3, 16, 16)
    assert not torch.allclose(m.sparse(R, L)[0], m.sparse(R, 2 * L)[0])
    with pytest.raises(ValueError, match="low-rank"):
        m.sparse(R)
    plain = tiny_model(3)
    assert torch.equal(plain.sparse(R, L)[0], plain.sparse(R, 2 * L)[0])
    Y = torch.rand(1, 3, 16, 16)
    d = m(Y)
    assert torch.allclose(m.sparse(Y - d.L_hat, d.L_hat)[0], d.mu_S)
    back = load_checkpoint(save_checkpoint(tmp_path / "m.safetensors", m, {}))
    assert back.config.sparse_input == "residual+lowrank"
    assert torch.allclose(back.model(Y).mu_S, d.mu_S, atol=1e-3)  # fp16 weights on disk
    with pytest.raises(ValueError, match="sparse_input"):
        InDeed(tiny_config(3, sparse_input="image"))


def test_modules_for_active_generalization():
    m = tiny_model(3)
    assert m.modules_for("S") == [m.sparse]
    assert m.modules_for("L") == [m.lowrank]
    assert m.modules_for("LS") == [m.lowrank, m.sparse]
    with pytest.raises(ValueError):
        m.modules_for("X")


def test_bad_inputs_are_refused():
    m = tiny_model(3)
    with pytest.raises(ValueError, match="multiples of 8"):
        m(torch.rand(1, 3, 20, 16))
    with pytest.raises(ValueError, match="channel"):
        m(torch.rand(1, 1, 16, 16))
    with pytest.raises(ValueError):
        InDeed(tiny_config(channels=2))


def test_variational_q_of_B_replaces_f_theta_B_and_balances_the_factors():
    from dataclasses import replace

    net = tiny_model(channels=3)
    var = InDeed(replace(net.cfg, lowrank_b="variational"))
    var.load_state_dict(net.state_dict())  # the same weights: f_thetaB is kept, unused
    Y = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        dn, dv = net(Y), var(Y)
    # q(A) is f_thetaA's, each column rescaled; q(B) is the update's, balanced against it
    cos = torch.nn.functional.cosine_similarity(dn.mu_A, dv.mu_A, dim=-2)
    assert torch.allclose(cos, torch.ones_like(cos), atol=1e-4)
    na, nb = dv.mu_A.square().sum(-2), dv.mu_B.square().sum(-2)
    assert torch.allclose(na, nb, rtol=1e-3, atol=1e-8)
    assert not torch.allclose(dn.mu_B, dv.mu_B)
    assert torch.allclose(dv.L_hat, low_rank(dv.mu_A, dv.mu_B), atol=1e-6)
    # L is the noisy input's projection onto q(A)'s kept columns: closer to Y than f_thetaB's
    assert (dv.L_hat - Y).square().mean() < (dn.L_hat - Y).square().mean()


def test_detached_copy_casts_once_and_owns_its_weights():
    """detached_copy(dtype) equals deepcopy(model).to(dtype), shares no storage with the model,
    and keeps which weights are trainable (a detector's frozen feature trunk stays frozen)."""
    import copy

    from indeed_cli.model import ModelConfig
    from indeed_cli.model.network import InDeed

    model = InDeed(ModelConfig(channels=1, task="detect", sparse_input="residual", sparse_width=8, lowrank_width=8,
                               support_width=8, support_features="efficientnet-lite0"))  # fmt: skip
    for dtype in (torch.bfloat16, torch.float32):
        fast, slow = model.detached_copy(dtype), copy.deepcopy(model).to(dtype)
        a, b = fast.state_dict(), slow.state_dict()
        assert a.keys() == b.keys()
        assert all(a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]) for k in a)
        own = {p.data_ptr() for p in (*model.parameters(), *model.buffers())}
        assert not own & {p.data_ptr() for p in (*fast.parameters(), *fast.buffers())}
        assert [p.requires_grad for p in fast.parameters()] == [p.requires_grad for p in model.parameters()]
    with torch.no_grad():
        next(fast.parameters()).add_(1.0)
    assert not torch.equal(next(fast.parameters()), next(model.parameters()))


def test_with_parameters_replaces_the_named_weights_and_shares_the_rest():
    """with_parameters(values) equals a deep copy with those weights copied in, keeps each weight's
    memory layout, owns the new weights, shares the untouched submodules, and leaves the model as it was."""
    import copy

    model = tiny_model(3).to(memory_format=torch.channels_last)
    names = [n for n, _ in model.sparse.named_parameters(prefix="sparse")]
    values = {n: torch.randn_like(model.get_parameter(n)).contiguous() for n in names}  # another layout
    before = {k: v.clone() for k, v in model.state_dict().items()}
    new = model.with_parameters(values)
    slow = copy.deepcopy(model)
    with torch.no_grad():
        for n, v in values.items():
            slow.get_parameter(n).copy_(v)
    a, b = new.state_dict(), slow.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for n in names:
        mine, old = new.get_parameter(n), model.get_parameter(n)
        assert mine.data_ptr() != old.data_ptr() and mine.data_ptr() != values[n].data_ptr()
        assert mine.stride() == old.stride() and isinstance(mine, torch.nn.Parameter)
    assert new.lowrank is model.lowrank and new.sparse is not model.sparse
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    y = torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(new(y).S_hat, slow(y).S_hat)
    with pytest.raises(KeyError, match="no such weights"):
        model.with_parameters({"sparse.nothing": torch.zeros(1)})


def _resblock_pair(seed: int = 0):
    from indeed_cli.model.network import ResBlock

    torch.manual_seed(seed)
    block = ResBlock(8).eval()
    return block, torch.randn(2, 8, 16, 16)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", [torch.contiguous_format, torch.channels_last])
def test_fused_block_matches_the_plain_block(monkeypatch, device, dtype, layout):
    """cuDNN's conv + bias + ReLU on a GPU, oneDNN's convolutions with ReLU and sum post-ops on a CPU."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if device == "cpu" and network._ONEDNN is None:
        pytest.skip("this torch has no oneDNN")
    if device == "cpu" and dtype == torch.bfloat16 and not network._ONEDNN_BF16:
        pytest.skip("oneDNN computes no bf16 on this CPU (the next test covers it)")
    block, x = _resblock_pair()
    block = block.to(device=device, dtype=dtype, memory_format=layout)
    x = x.to(device=device, dtype=dtype, memory_format=layout)
    with torch.no_grad():
        assert block._fuses(x)
        fused = block(x)
        assert network.FUSED_BLOCKS, "the backend refused the fused call"
        monkeypatch.setattr(network, "FUSED_BLOCKS", False)
        plain = block(x)
    # bf16 rounding in either path; on a GPU both convolutions may use TF32 in fp32
    tol = 3e-2 if dtype == torch.bfloat16 else (1e-3 if device == "cuda" else 1e-5)
    assert fused.dtype == plain.dtype and torch.allclose(fused.float(), plain.float(), atol=tol, rtol=tol)


def test_bf16_blocks_run_plain_on_a_cpu_without_onednn_bf16(monkeypatch):
    """On a CPU whose oneDNN has no bf16 (AVX2 only) the fused operators refuse bf16 tensors, and a
    refusal turns fusion off for the process, fp32 included: bf16 blocks must not try."""
    if network._ONEDNN is None:
        pytest.skip("this torch has no oneDNN")
    monkeypatch.setattr(network, "_ONEDNN_BF16", False)
    block, x = _resblock_pair()
    with torch.no_grad():
        assert block._fuses(x)  # fp32 stays fused
        b16, x16 = block.to(torch.bfloat16), x.to(torch.bfloat16)
        assert not b16._fuses(x16)
        monkeypatch.setattr(network, "FUSED_BLOCKS", False)
        plain = b16(x16)
        monkeypatch.setattr(network, "FUSED_BLOCKS", True)
        assert torch.equal(b16(x16), plain) and network.FUSED_BLOCKS is True


def test_fused_block_falls_back_to_the_plain_block_where_the_backend_refuses(monkeypatch):
    """A backend that refuses the fused call (an old cuDNN, a torch without the operator) costs
    nothing but the fusion: the block computes the plain result and fusion is off from then on."""

    def refuse(*args, **kwargs):
        raise RuntimeError("no fused convolution here")

    block, x = _resblock_pair()
    with torch.no_grad():
        monkeypatch.setattr(network, "FUSED_BLOCKS", False)
        plain = block(x)
        monkeypatch.setattr(network, "FUSED_BLOCKS", True)
        monkeypatch.setattr(network, "_ONEDNN", refuse)
        monkeypatch.setattr(torch, "cudnn_convolution_relu", refuse)
        monkeypatch.setattr(network.ResBlock, "_fuses", lambda self, x: network.FUSED_BLOCKS)
        assert torch.equal(block(x), plain) and network.FUSED_BLOCKS is False
        assert torch.equal(block(x), plain)


def test_the_plain_block_is_kept_for_training_normalised_blocks_and_tracing():
    block, x = _resblock_pair()
    assert not block._fuses(x)  # autograd is on: the fused operators have no backward
    x.requires_grad_(True)
    block(x).sum().backward()
    assert x.grad is not None and block.conv1.weight.grad is not None
    with torch.no_grad():
        assert not network.ResBlock(8, groups=2)._fuses(x.detach())  # GroupNorm between conv and ReLU
        assert not block._fuses(x.detach().double())  # oneDNN's fused call: float32 and bfloat16
        with torch.autocast("cpu", dtype=torch.bfloat16):  # autocast would not cast the fused call's inputs
            assert not block._fuses(x.detach())
            assert block(x.detach().bfloat16()).dtype == torch.bfloat16
        assert not block._fuses(x.detach().bfloat16())  # the weights are float32
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            graph = str(torch.jit.trace(block, x.detach()).graph)  # ONNX export traces the same way
        assert "aten::relu" in graph and "mkldnn" not in graph and "cudnn" not in graph


def test_blocks_under_vmap_stay_plain():
    """Grouped adaptation vmaps the network over stacked weights: the fused operators have no batching
    rule there (vmap would loop over the group with a warning), so the plain block runs."""
    from torch.func import functional_call, vmap

    block, x = _resblock_pair()
    params = {k: torch.stack([v, v + 0.01]) for k, v in block.named_parameters()}
    seen = []

    def run(p, y):
        seen.append(block._fuses(y))
        return functional_call(block, p, (y,))

    with torch.no_grad():
        out = vmap(run)(params, torch.stack([x, x + 1]))
        each = [functional_call(block, {k: v[i] for k, v in params.items()}, (x + i,)) for i in range(2)]
    assert seen == [False] and torch.allclose(out, torch.stack(each), atol=1e-5)
