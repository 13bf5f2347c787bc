"""Self-Attention with Recurrence (RSA) and an RSA forecaster.

Reference: Huang, Yang, Xu, Zhu, Li, "Encoding Recurrence into Transformers", ICLR 2023
(../shared/papers/rsa-encoding-recurrence-into-transformers.txt).

- Recurrence encoding matrices (REMs, Sec. 2.2, Eq. 3; App. D.1): regular P^R(lambda),
  cyclical P^C1(gamma, theta) and P^C2(gamma, theta); masked (strictly lower triangular) or
  unmasked (P + P'); dilated (lags that are multiples of d, exponent lag / d); power cap K
  (entries with exponent > K masked, K = 200 in the paper); non-square for query and key spans
  that differ (App. D.2), via explicit query and key positions.
- RSA head (Eq. 4): {(1 - sigmoid(mu)) softmax(QK'/sqrt(d)) + sigmoid(mu) P} V, with
  lambda = tanh(eta), gamma = sigmoid(nu), one gate mu per layer, REM parameters per head.
- The six head types k1..k6 of Sec. 3: regular, cyclical C1, cyclical C2, and their dilated
  versions. Prop. 2's extra identity head (P = I) is kind IDENTITY, used by the math tests.
- ``RSAForecaster``: channel-independent patch encoder of RSA blocks with a linear head on
  top of a direct linear path (models/patch_forecaster.py); no positional encoding: the REMs
  carry relative position, as in the paper's RSA models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from models.patch_forecaster import PatchConfig, PatchForecaster, PreNormBlock

# REM kinds. The six configurable head types k1..k6 are (REGULAR, C1, C2) undilated then dilated.
IDENTITY, REGULAR, CYCLIC_COS, CYCLIC_SIN = 0, 1, 2, 3


@dataclass
class RSAConfig(PatchConfig):
    """The patch shell's configuration and the RSA heads'; ``n_heads`` must equal ``sum(head_types)``."""

    # (k1..k6): regular, cyclical C1, cyclical C2, dilated regular, dilated C1, dilated C2
    head_types: list[int] = field(default_factory=lambda: [1, 1, 1, 1, 0, 0])
    dilations: list[int] = field(default_factory=lambda: [3])  # dilating factors, cycled over dilated heads
    masked: bool = False  # masked (causal) REMs and attention; the look-back is all known, so unmasked
    power_cap: int = 200  # K: REM entries with exponent > K are masked (App. D.1)
    gate_init: float = 0.0  # mu at init (paper: within [-3, 3]); gate = sigmoid(mu)


def rem(
    kinds: torch.Tensor,
    lam: torch.Tensor,
    gamma: torch.Tensor,
    theta: torch.Tensor,
    dilations: torch.Tensor,
    query_pos: torch.Tensor,
    key_pos: torch.Tensor,
    masked: bool,
    power_cap: int,
) -> torch.Tensor:
    """REMs of all heads at once: (nh, Tq, Tk).

    kinds, dilations: (nh,) int64; lam, gamma, theta: (nh,) float; query_pos (Tq,), key_pos (Tk,).
    Entry (i, j) depends on the lag query_pos[i] - key_pos[j] (App. D.2 for Tq != Tk):
    f_n(lambda) = lambda^n (Eq. 3), f_n(gamma, theta) = gamma^n cos(n theta) or gamma^n sin(n theta),
    with n = |lag| / d for lags divisible by d (dilated REM, App. D.1) and zero elsewhere.
    """
    lag = query_pos[:, None] - key_pos[None, :]  # (Tq, Tk)
    dil = dilations[:, None, None]  # (nh, 1, 1)
    # masked REM (Eq. 3): strictly lower triangular; unmasked: P + P' (zero diagonal either way)
    valid = (lag > 0) if masked else (lag != 0)
    valid = valid[None] & (lag.abs()[None] % dil == 0)  # (nh, Tq, Tk)
    power = torch.div(lag.abs()[None], dil, rounding_mode="floor")  # (nh, Tq, Tk) exponent n
    valid = valid & (power <= power_cap)  # power cap K (App. D.1)
    n = power.to(lam.dtype)
    regular = lam[:, None, None] ** n  # D^R = lambda^L
    decay = gamma[:, None, None] ** n  # gamma^L
    angle = theta[:, None, None] * n  # theta (.) L
    kind = kinds[:, None, None]
    p = torch.where(
        kind == REGULAR, regular, torch.where(kind == CYCLIC_COS, decay * torch.cos(angle), decay * torch.sin(angle))
    )
    p = torch.where(valid, p, torch.zeros_like(p))
    identity = (lag == 0).to(lam.dtype)[None].expand_as(p)  # Prop. 2's h_{0,t} head
    return torch.where(kind == IDENTITY, identity, p)


def head_layout(head_types: list[int], dilations: list[int]) -> tuple[list[int], list[int]]:
    """(k1..k6) -> per-head REM kind and dilating factor (1 = undilated); dilations cycle in order."""
    kinds: list[int] = []
    factors: list[int] = []
    base = [REGULAR, CYCLIC_COS, CYCLIC_SIN]
    for index, count in enumerate(head_types):
        for _ in range(count):
            kinds.append(base[index % 3])
            if index < 3:
                factors.append(1)
            else:
                factors.append(int(dilations[(len(factors) - sum(head_types[:3])) % len(dilations)]))
    return kinds, factors


class RSAAttention(nn.Module):
    """Multi-head RSA (Eq. 4) with one REM per head and one gate per layer."""

    def __init__(
        self,
        d_model: int,
        kinds: list[int],
        dilations: list[int],
        masked: bool = False,
        power_cap: int = 200,
        gate_init: float = 0.0,
        dropout: float = 0.0,
    ):
        super().__init__()
        n_heads = len(kinds)
        if d_model % n_heads:
            raise ValueError(f"d_model {d_model} is not divisible by {n_heads} heads")
        self.n_heads, self.masked, self.power_cap = n_heads, masked, power_cap
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("kinds", torch.tensor(kinds, dtype=torch.int64), persistent=False)
        self.register_buffer("dilations", torch.tensor(dilations, dtype=torch.int64), persistent=False)
        # Sec. 3 initialisation: eta over [-2,-1] U [1,2] (alternating sign), nu over [1,2], theta = pi/4
        spread = torch.linspace(1.0, 2.0, n_heads) if n_heads > 1 else torch.tensor([1.5])
        sign = torch.tensor([1.0 if index % 2 == 0 else -1.0 for index in range(n_heads)])
        self.eta = nn.Parameter(sign * spread)  # lambda = tanh(eta)
        self.nu = nn.Parameter(spread.clone())  # gamma = sigmoid(nu)
        self.theta = nn.Parameter(torch.full((n_heads,), math.pi / 4))
        self.mu = nn.Parameter(torch.tensor(float(gate_init)))  # gate-control parameter, per layer

    def rems(self, query_pos: torch.Tensor, key_pos: torch.Tensor) -> torch.Tensor:  # (nh, Tq, Tk)
        return rem(
            self.kinds,
            torch.tanh(self.eta),
            torch.sigmoid(self.nu),
            self.theta,
            self.dilations,
            query_pos,
            key_pos,
            self.masked,
            self.power_cap,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape  # (B, T, d)
        q, k, v = self.qkv(x).split(width, dim=2)
        hs = width // self.n_heads
        q = q.view(batch, length, self.n_heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(batch, length, self.n_heads, hs).transpose(1, 2)
        v = v.view(batch, length, self.n_heads, hs).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(hs)  # (B, nh, T, T)
        if self.masked:
            causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
            scores = scores.masked_fill(~causal, float("-inf"))
        positions = torch.arange(length, device=x.device)
        gate = torch.sigmoid(self.mu)
        # Eq. (4): {(1 - sigma(mu)) softmax(QK'/sqrt(d)) + sigma(mu) P} V
        att = (1 - gate) * F.softmax(scores, dim=-1) + gate * self.rems(positions, positions)
        y = self.dropout(att) @ v  # (B, nh, T, hs)
        return self.proj(y.transpose(1, 2).reshape(batch, length, width))  # (B, T, d)


class RSAForecaster(PatchForecaster):
    """(B, L, C) standardized look-back -> (B, H, C) forecast, encoder of RSA blocks."""

    def __init__(self, config: RSAConfig):
        if sum(config.head_types) != config.n_heads:
            raise ValueError(f"head_types {config.head_types} do not add up to n_heads {config.n_heads}")
        super().__init__(config)
        kinds, factors = head_layout(config.head_types, config.dilations)
        self.blocks = nn.ModuleList(  # pre-norm blocks whose attention is multi-head RSA
            PreNormBlock(RSAAttention(config.d_model, kinds, factors, config.masked, config.power_cap,
                                      config.gate_init, config.dropout), config.d_model, config.d_ff, config.dropout)
            for _ in range(config.n_layers)
        )
