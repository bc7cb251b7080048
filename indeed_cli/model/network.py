"""The modular InDeed network f_theta (paper §3.4, Fig. "network structure").

  f_thetaL = (trunk, f_thetaA, f_thetaB):  Y            -> q(A), q(B)
  f_thetaS                               :  Y - A B^T    -> q(S)
  N = Y - A B^T - S; the leaf posteriors are computed in closed form
  (:mod:`indeed_cli.posteriors`), never learned.

Backbone choices (measured in docs/model.md): both modules work at half resolution
after a pixel-unshuffle, as FFDNet does, which is 4x cheaper than the paper's
full-resolution ResNet.  The low-rank trunk keeps the paper's GroupNorm (its
ablation #10 shows GroupNorm matters for A and B); the sparse module is a small
U-Net without normalisation, so that it is a local operator and tiles agree.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ModelConfig
from .features import FEATURE_CHANNELS, EfficientNetLite0Trunk
from .posteriors import low_rank, noise_precision_estimate, variational_B

SIGMA_FLOOR = 1e-4


def positive(x: Tensor) -> Tensor:
    """Standard deviations from raw outputs; the -4 offset starts them small (~0.02)."""
    return F.softplus(x - 4.0) + SIGMA_FLOOR


def standard_normal(like: Tensor) -> Tensor:
    """N(0, 1) draws of ``like``'s shape in logical order: unlike ``randn_like``, the draws do not
    depend on its memory layout (mu_A is a strided view when computed, contiguous when cached)."""
    return torch.randn(like.shape, dtype=like.dtype, device=like.device)


# Inference runs each ResBlock without normalisation with fused kernels: PyTorch otherwise adds a
# convolution's bias (on a GPU), the ReLU and the residual sum in elementwise passes of their own.
# On a CUDA GPU the first convolution, its bias and the ReLU are one cuDNN call
# (torch.cudnn_convolution_relu); those passes took 28% of the GPU time of a 4096x4096 read-out.
# On a CPU both convolutions are oneDNN calls with the ReLU, and the residual sum, as post-ops
# (the operators torch.compile's CPU backend emits).  docs/results.md, "Speed and memory".  Set to
# False to time or check the plain path; it turns itself off if the backend refuses a fused call.
FUSED_BLOCKS = True


def _onednn_convolution():
    """oneDNN's fused convolution operator, or None where this build of torch has none."""
    if not torch.backends.mkldnn.is_available():
        return None
    try:
        return torch.ops.mkldnn._convolution_pointwise
    except (AttributeError, RuntimeError):
        return None


_ONEDNN = _onednn_convolution()


def _onednn_bf16() -> bool:
    """Whether this CPU's oneDNN takes bf16 (oneDNN's own check: AVX-512 and newer); without it
    the fused operators refuse bf16 tensors (a 2-core AVX2 CPU), so bf16 blocks run plain there."""
    try:
        return _ONEDNN is not None and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


_ONEDNN_BF16 = _onednn_bf16()
# a tensor of a torch.func transform (vmap of grouped adaptation, grad): the fused operators have no
# batching rules, and vmap's fallback runs them image by image with a warning.  Where this torch
# cannot tell, every tensor counts as transformed (plain blocks).
_transformed = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", lambda t: True)


class ResBlock(nn.Module):
    """x + conv(act(norm(conv(x)))): the residual unit of both modules."""

    def __init__(self, ch: int, groups: int = 0, dims: int = 2):
        super().__init__()
        Conv = nn.Conv2d if dims == 2 else nn.Conv1d
        self.conv1 = Conv(ch, ch, 3, padding=1)
        self.conv2 = Conv(ch, ch, 3, padding=1)
        self.norm1 = nn.GroupNorm(groups, ch) if groups else nn.Identity()
        self.norm2 = nn.GroupNorm(groups, ch) if groups else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        out = self._fused(x) if self._fuses(x) else None
        if out is None:
            y = F.relu(self.norm1(self.conv1(x)))
            out = x + self.norm2(self.conv2(y))
        return out

    def _fuses(self, x: Tensor) -> bool:
        """Whether the block runs fused: inference (no autograd: the fused operators have no
        backward), no normalisation between convolution and ReLU, a CUDA tensor or a float32 /
        bfloat16 CPU tensor where oneDNN is built in, and not while torch.compile, TorchScript or
        the ONNX exporter traces the block, nor inside torch.func transforms such as the vmap of
        grouped adaptation (they need the plain operators), nor under autocast; bf16 on a CPU only
        where oneDNN computes it (:func:`_onednn_bf16`)."""
        if not (FUSED_BLOCKS and x.dim() == 4 and not torch.is_grad_enabled()):
            return False
        if not isinstance(self.norm1, nn.Identity):
            return False
        if torch.compiler.is_compiling() or torch.jit.is_tracing():  # the ONNX exporter traces
            return False
        if _transformed(x) or _transformed(self.conv1.weight) or _transformed(self.conv2.weight):
            return False
        # autocast casts the inputs of convolutions, not of the fused operators
        if torch.is_autocast_enabled(x.device.type) or x.dtype != self.conv1.weight.dtype:
            return False
        return x.is_cuda or (
            _ONEDNN is not None
            and x.device.type == "cpu"
            and (x.dtype == torch.float32 or (x.dtype == torch.bfloat16 and _ONEDNN_BF16))
        )

    def _fused(self, x: Tensor) -> Tensor | None:
        """The block's output from fused calls; None (and fusion off) if the backend refuses them."""
        global FUSED_BLOCKS
        c1, c2 = self.conv1, self.conv2
        try:
            if x.is_cuda:  # conv1 + bias + ReLU in one call; conv2's bias and the sum stay two passes
                y = torch.cudnn_convolution_relu(x, c1.weight, c1.bias, c1.stride, c1.padding, c1.dilation, c1.groups)
                return x + c2(y)
            y = _ONEDNN(x, c1.weight, c1.bias, c1.padding, c1.stride, c1.dilation, c1.groups, "relu", [], "")
            # conv2(y) + bias + x in one call: the residual sum as a binary post-op
            return _ONEDNN.binary(
                y, x, c2.weight, c2.bias, c2.padding, c2.stride, c2.dilation, c2.groups, "add", 1.0, None, [], None
            )
        except (RuntimeError, NotImplementedError, TypeError):
            FUSED_BLOCKS = False
            return None


class FactorHead(nn.Module):
    """f_thetaA (or f_thetaB): features -> mu, sigma of r factor vectors per channel.

    Pools the trunk features along the other image axis (mean and max), runs 1-D
    residual blocks along its own axis and upsamples x2 by a 1-D pixel shuffle, so
    a column factor a_i in R^h is produced from all columns of the image.
    """

    def __init__(self, width: int, channels: int, rank: int, groups: int):
        super().__init__()
        self.channels, self.rank = channels, rank
        self.inp = nn.Conv1d(2 * width, width, 1)
        self.blocks = nn.Sequential(ResBlock(width, groups, dims=1), ResBlock(width, groups, dims=1))
        self.out = nn.Conv1d(width, 2 * channels * rank * 2, 1)
        with torch.no_grad():  # start with |L| ~ 0.1 rather than ~6, so early steps are sane
            self.out.weight.mul_(0.15)

    def forward(self, feats: Tensor, axis: int) -> tuple[Tensor, Tensor]:
        # axis: spatial axis of the factor (2 = rows -> A, 3 = columns -> B)
        other = 3 if axis == 2 else 2
        pooled = torch.cat([feats.mean(other), feats.amax(other)], 1)  # (N, 2w, n/2)
        z = self.out(self.blocks(F.relu(self.inp(pooled))))  # (N, 2*C*r*2, n/2)
        n, _, half = z.shape
        z = (
            z.view(n, 2 * self.channels * self.rank, 2, half)
            .transpose(-1, -2)
            .reshape(n, 2, self.channels, self.rank, 2 * half)
        )
        z = z.transpose(-1, -2)  # (N, 2, C, n, r)
        return z[:, 0], positive(z[:, 1])


class LowRankModule(nn.Module):
    """f_thetaL: image -> q(A) (h x r per channel) and q(B) (w x r per channel)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        w, C = cfg.lowrank_width, cfg.channels
        self.stem = nn.Conv2d(4 * C, w, 3, padding=1)
        self.trunk = nn.Sequential(*[ResBlock(w, cfg.groups) for _ in range(cfg.lowrank_blocks)])
        self.factor_A = FactorHead(w, C, cfg.rank, cfg.groups)
        self.factor_B = FactorHead(w, C, cfg.rank, cfg.groups)
        self.variational_b = cfg.lowrank_b == "variational"
        self.priors = cfg.priors  # the gamma prior of the variational q(B)

    def forward(self, Y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        # the input in the weights' precision (a no-op for fp32; bf16 inference, Checkpoint.network)
        feats = self.trunk(self.stem(F.pixel_unshuffle(Y, 2).to(self.stem.weight.dtype)))
        mu_A, sigma_A = self.factor_A(feats, axis=2)
        if self.variational_b:  # q(B) in closed form given q(A) (docs/model.md): f_thetaB is not used
            mu_B, sigma_B, _ = variational_B(Y, mu_A, sigma_A, noise_precision_estimate(Y), priors=self.priors)
            # balance each pair (a_i s_i, b_i / s_i, ||a_i s_i|| = ||b_i / s_i||): L is unchanged, and a
            # component the update switched off (b_i ~ 0) has a_i ~ 0 too, as under the shared gamma_i
            s = ((mu_B.square().sum(-2) + 1e-12) / (mu_A.float().square().sum(-2) + 1e-12)).pow(0.25)[..., None, :]
            mu_A, sigma_A = mu_A * s.to(mu_A.dtype), sigma_A * s.to(mu_A.dtype)
            return mu_A, sigma_A, (mu_B / s).to(mu_A.dtype), (sigma_B / s).to(mu_A.dtype)
        mu_B, sigma_B = self.factor_B(feats, axis=3)
        return mu_A, sigma_A, mu_B, sigma_B


class UNet(nn.Module):
    """The U-Net body shared by f_thetaS and f_thetaM: at 1/2 resolution after a pixel-unshuffle,
    then 1/4, 1/8, ...; residual blocks without normalisation, so that it is a local operator and
    tiles agree.  ``head`` gives ``out_ch`` channels at 1/2 resolution (pixel-shuffled by the caller)."""

    def __init__(self, in_ch: int, out_ch: int, width: int, blocks: int, levels: int):
        super().__init__()
        widths = [width * 2**i for i in range(levels)]
        self.stem = nn.Conv2d(in_ch, widths[0], 3, padding=1)
        self.enc = nn.ModuleList(nn.Sequential(*[ResBlock(c) for _ in range(blocks)]) for c in widths[:-1])
        self.down = nn.ModuleList(nn.Conv2d(widths[i], widths[i + 1], 2, stride=2) for i in range(levels - 1))
        self.mid = nn.Sequential(*[ResBlock(widths[-1]) for _ in range(blocks)])
        self.up = nn.ModuleList(nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2) for i in range(levels - 1))
        self.dec = nn.ModuleList(nn.Sequential(*[ResBlock(c) for _ in range(blocks)]) for c in widths[:-1])
        self.head = nn.Conv2d(widths[0], out_ch, 3, padding=1)

    def body(self, x: Tensor, at_coarsest: Tensor | None = None) -> Tensor:
        """Full-resolution input (N, in_ch/4, h, w) -> head output (N, out_ch/4, h, w).
        ``at_coarsest`` is added to the features at the coarsest scale, before its blocks."""
        # the input in the weights' precision: bf16 weights (grouped adaptation in bf16, bf16
        # inference) get a bf16 copy of the fp32 input, as autocast would give them; a no-op otherwise
        x = self.stem(F.pixel_unshuffle(x, 2).to(self.stem.weight.dtype))
        skips = []
        for enc, down in zip(self.enc, self.down):
            x = enc(x)
            skips.append(x)
            x = down(x)
        if at_coarsest is not None:
            x = x + at_coarsest.to(x.dtype)
        x = self.mid(x)
        for i in reversed(range(len(self.up))):
            x = self.dec[i](self.up[i](x) + skips[i])
        return F.pixel_shuffle(self.head(x), 2)

    def groupable(self) -> bool:
        """Whether :meth:`grouped_body` computes :meth:`body`: residual blocks without normalisation."""
        blocks = [b for b in self.modules() if isinstance(b, ResBlock)]
        return all(isinstance(b.norm1, nn.Identity) and isinstance(b.norm2, nn.Identity) for b in blocks)

    def grouped_body(self, x: Tensor, weights: dict[str, Tensor]) -> Tensor:
        """:meth:`body` (without ``at_coarsest``) for K sets of this module's weights at once: ``x`` (K, N,
        in_ch/4, h, w), ``weights`` every parameter by its name in this module with a leading K axis; out
        (K, N, out_ch/4, h, w).  Each convolution is one grouped call (groups = K) in channels-last layout.

        InDeedOAG adapts K images' copies of f_thetaS together.  Under torch.vmap their convolutions
        become grouped calls too, but in NCHW layout, whose weight gradients took 41% of the GPU time
        of the recorrupted adaptation (one NVIDIA H200, bf16); channels-last grouped calls of f_thetaS's
        shapes ran forward and backward 1.2-3.1 times faster (docs/reports/2026-12-03-recorrupted-time-and-int8.md)."""
        K = x.shape[0]
        x = F.pixel_unshuffle(x.flatten(0, 1), 2)
        x = _grouped(x.view(K, -1, *x.shape[1:]).to(weights["stem.weight"].dtype))

        def blocks(seq: nn.Sequential, prefix: str, x: Tensor) -> Tensor:
            for j, blk in enumerate(seq):
                y = F.relu(_grouped_conv(blk.conv1, weights, f"{prefix}.{j}.conv1", x, K))
                x = x + _grouped_conv(blk.conv2, weights, f"{prefix}.{j}.conv2", y, K)
            return x

        x = _grouped_conv(self.stem, weights, "stem", x, K)
        skips = []
        for i, down in enumerate(self.down):
            x = blocks(self.enc[i], f"enc.{i}", x)
            skips.append(x)
            x = _grouped_conv(down, weights, f"down.{i}", x, K)
        x = blocks(self.mid, "mid", x)
        for i in reversed(range(len(self.up))):
            x = blocks(self.dec[i], f"dec.{i}", _grouped_conv(self.up[i], weights, f"up.{i}", x, K) + skips[i])
        x = _ungrouped(_grouped_conv(self.head, weights, "head", x, K), K)
        out = F.pixel_shuffle(x.flatten(0, 1), 2)
        return out.view(K, -1, *out.shape[1:])


def _grouped(x: Tensor) -> Tensor:
    """(K, N, C, h, w) -> (N, K*C, h, w), channels-last: K images' features side by side as the channel
    groups of one grouped convolution."""
    K, N, C, h, w = x.shape
    return x.transpose(0, 1).reshape(N, K * C, h, w).contiguous(memory_format=torch.channels_last)


def _ungrouped(x: Tensor, K: int) -> Tensor:
    """(N, K*C, h, w) -> (K, N, C, h, w), the inverse of :func:`_grouped`."""
    N, KC, h, w = x.shape
    return x.reshape(N, K, KC // K, h, w).transpose(0, 1)


def _grouped_conv(m: nn.Module, weights: dict[str, Tensor], name: str, x: Tensor, K: int) -> Tensor:
    """``m`` (a Conv2d or ConvTranspose2d) with K stacked weight sets ``weights[name + ".weight"]`` (K, ...)
    and biases, on grouped features (:func:`_grouped`): one call with groups = K."""
    w = weights[f"{name}.weight"].flatten(0, 1).contiguous(memory_format=torch.channels_last)
    b = weights.get(f"{name}.bias")
    b = None if b is None else b.flatten()
    if isinstance(m, nn.ConvTranspose2d):  # weight (in, out, kh, kw): K stacked give (K*in, out, kh, kw)
        return F.conv_transpose2d(x, w, b, m.stride, m.padding, m.output_padding, K, m.dilation)
    return F.conv2d(x, w, b, m.stride, m.padding, m.dilation, K)


class SparseModule(UNet):
    """f_thetaS: (Y - A B^T) -> mu_S, sigma_S, a U-Net at 1/2, 1/4, 1/8 resolution.

    With ``sparse_input="residual+lowrank"`` it also sees A B^T (extra input channels).
    """

    def __init__(self, cfg: ModelConfig):
        C = cfg.channels
        self.sees_lowrank = cfg.sparse_input == "residual+lowrank"
        super().__init__(
            4 * C * (2 if self.sees_lowrank else 1), 2 * 4 * C, cfg.sparse_width, cfg.sparse_blocks, cfg.sparse_levels
        )
        with torch.no_grad():  # S starts near zero: the residual is mostly noise at first
            self.head.weight.mul_(0.1)

    def forward(self, R: Tensor, L: Tensor | None = None) -> tuple[Tensor, Tensor]:
        if self.sees_lowrank:
            if L is None:
                raise ValueError("this sparse module also needs the low-rank part A B^T")
            R = torch.cat([R, L], 1)
        out = self.body(R)  # (N, 2C, h, w)
        mu, raw = out.float().chunk(2, dim=1)  # sigma from fp32 whatever the network's precision
        return mu, positive(raw)

    def grouped(self, R: Tensor, L: Tensor | None, weights: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        """:meth:`forward` for K stacked weight sets (:meth:`UNet.grouped_body`): ``R``, ``L`` (K, N, C, h, w),
        ``weights`` this module's parameters by name, each (K, ...); mu_S, sigma_S (K, N, C, h, w)."""
        if self.sees_lowrank:
            if L is None:
                raise ValueError("this sparse module also needs the low-rank part A B^T")
            R = torch.cat([R, L], 2)
        mu, raw = self.grouped_body(R, weights).float().chunk(2, dim=2)
        return mu, positive(raw)


class SupportModule(UNet):
    """f_thetaM: (Y, mu_L, mu_S) -> logit of q(z = 1), z = 1{S != 0}: the posterior probability that
    a pixel is in the support of S (docs/model.md, "The support posterior").  Trained with the
    focal loss on the masks of synthetic anomalies (:func:`~indeed_cli.model.posteriors.support_focal_loss`);
    its inputs are detached, so it never changes L, S or N.

    With ``support_features`` it also reads frozen ImageNet features of Y (:mod:`.features`), projected
    by a 1x1 convolution and added at its coarsest scale; the projection starts at zero, so a detector
    given features starts as the one it was."""

    def __init__(self, cfg: ModelConfig):
        C = cfg.channels
        super().__init__(4 * 3 * C, 4, cfg.support_width, cfg.sparse_blocks, cfg.support_levels)
        with torch.no_grad():  # start at q(z = 1) ~ 0.05: most pixels are normal
            self.head.weight.mul_(0.1)
            self.head.bias.fill_(-3.0)
        self.features = self.feature_proj = None
        if cfg.support_features:
            self.features = EfficientNetLite0Trunk().requires_grad_(False)
            self.feature_proj = nn.Conv2d(FEATURE_CHANNELS, cfg.support_width * 2 ** (cfg.support_levels - 1), 1)
            nn.init.zeros_(self.feature_proj.weight)
            nn.init.zeros_(self.feature_proj.bias)

    def image_features(self, Y: Tensor, size: tuple[int, int]) -> Tensor:
        """The frozen features of Y (edge-padded to multiples of 16), projected, at ``size``."""
        h, w = Y.shape[-2:]
        pad = (0, (-w) % 16, 0, (-h) % 16)
        with torch.no_grad():
            f = self.features(F.pad(Y, pad, mode="replicate") if any(pad) else Y)
            f = f[..., : -(-h // 8), : -(-w // 8)]
        f = self.feature_proj(f.to(self.feature_proj.weight.dtype))
        return (
            f
            if tuple(f.shape[-2:]) == tuple(size)
            else F.interpolate(f, size=size, mode="bilinear", align_corners=False)
        )

    def forward(self, Y: Tensor, L: Tensor, S: Tensor) -> Tensor:
        extra = None
        if self.features is not None:
            scale = 2 ** len(self.down) * 2  # the coarsest scale: pixel-unshuffle, then each down
            extra = self.image_features(Y, (Y.shape[-2] // scale, Y.shape[-1] // scale))
        return self.body(torch.cat([Y, L, S], 1), extra).float()  # (N, 1, h, w) logits, fp32


@dataclass
class Decomposition:
    """Outputs of one forward pass: variational parameters and (sampled) components."""

    mu_A: Tensor
    sigma_A: Tensor
    mu_B: Tensor
    sigma_B: Tensor
    mu_S: Tensor
    sigma_S: Tensor
    A_hat: Tensor
    B_hat: Tensor
    L_hat: Tensor  # A_hat B_hat^T
    S_hat: Tensor
    support_logit: Tensor | None = None  # f_thetaM's logit of q(z = 1), if the model has it

    def float(self) -> Decomposition:
        return Decomposition(**{k: None if v is None else v.float() for k, v in self.__dict__.items()})


class InDeed(nn.Module):
    """f_theta: Y -> phi_{Z_m} = (q(A), q(B), q(S)).

    ``sample=True`` draws A_hat, B_hat, S_hat by reparameterisation (training,
    Eq. l_fid); ``sample=False`` uses the posterior means (inference).
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.lowrank = LowRankModule(cfg)
        self.sparse = SparseModule(cfg)
        self.support = SupportModule(cfg) if cfg.support_width else None

    def detached_copy(self, dtype: torch.dtype = torch.float32) -> InDeed:
        """A deep copy in ``dtype`` with weights of its own (adaptation, bf16 inference).

        Each floating-point weight is cast once into the copy (``deepcopy(self).to(dtype)`` copied
        it and then cast it again): OAG makes one such copy per adapted image for bf16 inference."""
        memo: dict[int, object] = {}
        for t in (*self.parameters(), *self.buffers()):
            if id(t) in memo:
                continue
            new = t.detach().to(dtype) if t.is_floating_point() else t.detach()
            if new.data_ptr() == t.data_ptr():  # same dtype: .to() returned the tensor itself
                new = new.clone()
            memo[id(t)] = nn.Parameter(new, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else new
        return copy.deepcopy(self, memo)

    def with_parameters(self, values: dict[str, Tensor]) -> InDeed:
        """This network with the named weights replaced by copies of ``values`` (in each weight's
        dtype and memory layout), sharing every submodule that holds none of them.

        InDeedOAG returns one network per image that differ only in the adapted module: a deep copy
        per image cost more host time than the adaptation's GPU work (Python's deepcopy walked all
        108 modules), and memory for 32 copies of the frozen weights.  The shared parts remain this
        network's: treat the result as read-only."""
        unknown = set(values) - {n for n, _ in self.named_parameters()}
        if unknown:
            raise KeyError(f"no such weights: {sorted(unknown)}")
        return _with_parameters(self, values, "")

    def modules_for(self, which: str) -> list[nn.Module]:
        """The modules InDeedAG may fine-tune: 'S', 'L' or 'LS' (paper §3.5)."""
        table = {"S": [self.sparse], "L": [self.lowrank], "LS": [self.lowrank, self.sparse]}
        if which not in table:
            raise ValueError(f"modules must be one of {sorted(table)}, got {which!r}")
        return table[which]

    def forward(
        self,
        Y: Tensor,
        sample: bool = False,
        factors: tuple[Tensor, Tensor, Tensor, Tensor] | None = None,
        with_support: bool = True,
    ) -> Decomposition:
        """``factors``: (mu_A, sigma_A, mu_B, sigma_B) of ``Y`` computed before by ``self.lowrank``;
        adapting f_thetaS alone reuses them, since the frozen low-rank module gives the same ones.
        ``with_support=False`` skips f_thetaM (``support_logit`` None) where its output is not used."""
        m = self.cfg.multiple
        if Y.shape[-1] % m or Y.shape[-2] % m:
            raise ValueError(f"input height and width must be multiples of {m}, got {tuple(Y.shape[-2:])}")
        if Y.shape[1] != self.cfg.channels:
            raise ValueError(f"model expects {self.cfg.channels} channel(s), got {Y.shape[1]}")
        mu_A, sigma_A, mu_B, sigma_B = self.lowrank(Y) if factors is None else factors
        if sample:
            A_hat = mu_A + sigma_A * standard_normal(mu_A)
            B_hat = mu_B + sigma_B * standard_normal(mu_B)
        else:
            A_hat, B_hat = mu_A, mu_B
        L_hat = low_rank(A_hat, B_hat)
        mu_S, sigma_S = self.sparse(Y - L_hat, L_hat)
        S_hat = mu_S + sigma_S * standard_normal(mu_S) if sample else mu_S
        logit = None
        if self.support is not None and with_support:  # from the posterior means, detached: f_thetaM reads L and S only
            mu_L = low_rank(mu_A, mu_B) if sample else L_hat
            logit = self.support(Y, mu_L.detach(), mu_S.detach())
        return Decomposition(mu_A, sigma_A, mu_B, sigma_B, mu_S, sigma_S, A_hat, B_hat, L_hat, S_hat, logit)


def _with_parameters(module: nn.Module, values: dict[str, Tensor], prefix: str) -> nn.Module:
    """:meth:`InDeed.with_parameters` for ``module`` at ``prefix``: ``module`` itself when it holds
    none of ``values``, else a shallow copy with its own parameter, buffer and child tables."""
    if not any(k.startswith(prefix) for k in values):
        return module
    new = copy.copy(module)  # shares the attribute values, so the three tables are replaced below
    params = {}
    for k, p in module._parameters.items():
        if p is not None and prefix + k in values:
            with torch.no_grad():
                p = nn.Parameter(torch.empty_like(p).copy_(values[prefix + k]), requires_grad=p.requires_grad)
        params[k] = p
    new._parameters = params
    new._buffers = dict(module._buffers)
    new._modules = {
        k: None if c is None else _with_parameters(c, values, f"{prefix}{k}.") for k, c in module._modules.items()
    }
    return new
