"""Pure-torch reference of Railyard's dispatch / combine (docs/semantics.md).

Written from docs/semantics.md alone; it does not import railyard. The reference sees
every rank at once: inputs are lists indexed by rank.

Layouts (per destination rank d):

* received (section 4): one row per (source token, d) such that the token chose at
  least one expert on d; rows ordered by (source rank, source token).
* expert grouped (section 5): for local expert j ascending, the received rows routed to
  j in received order, then zero rows up to a multiple of ``pad_multiple``.

Combine (section 7) sums a token's rows in fp32 in rank order inside an NVLink domain,
rounds each domain's partial to bf16, sums the domains' partials in fp32 and rounds once
more to bf16 (with one domain: one rounding). Unpermute (section 8) first sums a
received row's expert-group rows in fp32 (local expert ascending) and rounds to bf16.

Bounds (section 6): with a bound ``B``, only rows with index ``< B`` exist; ``overflow``
is ``count > B``; counts stay the true ones.

All float arithmetic below is elementwise IEEE binary32 addition on CPU tensors
(``a + b`` on float32 tensors is a single correctly rounded addition; there is no
fused multiply-add in a plain add), which is exactly the "fp32 sum in order" of the doc.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence

import torch

__all__ = [
    "Routing",
    "Received",
    "Permuted",
    "normalize_routing",
    "dispatch_ref",
    "permute_ref",
    "combine_ref",
    "combine_probs_ref",
    "unpermute_ref",
    "combine_with_unpermute_ref",
    "combine_probs_permuted_ref",
    "quantize_fp8_rows",
    "dequantize_fp8_rows",
    "kept_rows",
]


# --------------------------------------------------------------------------- routing


@dataclass
class Routing:
    """One rank's routing normalised (section 3): ``chosen [T, E]`` bool and
    ``probs [T, E]`` fp32 (the prob bits where chosen, +0.0 elsewhere) or None."""

    chosen: torch.Tensor
    probs: Optional[torch.Tensor]

    @property
    def num_tokens(self) -> int:
        return self.chosen.shape[0]


def normalize_routing(
    num_experts: int,
    routing_map: Optional[torch.Tensor] = None,
    probs: Optional[torch.Tensor] = None,
    topk_idx: Optional[torch.Tensor] = None,
    topk_weights: Optional[torch.Tensor] = None,
) -> Routing:
    """Both routing forms -> the set of chosen experts with their probs (bit copies)."""
    if (routing_map is None) == (topk_idx is None):
        raise ValueError("give exactly one of routing_map / topk_idx")
    if routing_map is not None:
        if topk_weights is not None:
            raise ValueError("topk_weights goes with topk_idx")
        if routing_map.dtype != torch.bool or routing_map.dim() != 2 or routing_map.shape[1] != num_experts:
            raise ValueError(f"routing_map must be bool [T, {num_experts}]")
        chosen = routing_map.clone()
        dense = None
        if probs is not None:
            if probs.dtype != torch.float32 or tuple(probs.shape) != tuple(routing_map.shape):
                raise ValueError("probs must be fp32 [T, E]")
            dense = torch.where(chosen, probs, torch.zeros((), dtype=torch.float32))
        return Routing(chosen, dense)

    if probs is not None:
        raise ValueError("probs goes with routing_map")
    if topk_idx.dtype != torch.int64 or topk_idx.dim() != 2 or topk_idx.shape[1] < 1:
        raise ValueError("topk_idx must be int64 [T, K], K >= 1")
    T, K = topk_idx.shape
    if topk_idx.numel() and (int(topk_idx.min()) < -1 or int(topk_idx.max()) >= num_experts):
        raise ValueError(f"topk_idx: expert ids must be in [-1, {num_experts})")
    chosen = torch.zeros(T, num_experts, dtype=torch.bool)
    dense = None
    if topk_weights is not None:
        if topk_weights.dtype != torch.float32 or tuple(topk_weights.shape) != (T, K):
            raise ValueError("topk_weights must be fp32 [T, K]")
        dense = torch.zeros(T, num_experts, dtype=torch.float32)
    for t in range(T):
        for k in range(K):
            e = int(topk_idx[t, k])
            if e < 0:
                continue
            if chosen[t, e]:
                raise ValueError(f"topk_idx: expert {e} twice in token {t}")
            chosen[t, e] = True
            if dense is not None:
                dense[t, e] = topk_weights[t, k]
    return Routing(chosen, dense)


# --------------------------------------------------------------------------- layouts


@dataclass
class Received:
    """Received layout on one destination rank (full: no bound applied)."""

    hidden: torch.Tensor  # [N, H] bf16 or float8_e4m3fn
    scales: Optional[torch.Tensor]  # [N, H/128] fp32
    probs: Optional[torch.Tensor]  # [N, E_local] fp32
    routing_map: torch.Tensor  # [N, E_local] bool
    src_rank: torch.Tensor  # [N] int32
    src_token: torch.Tensor  # [N] int32
    tokens_per_expert: torch.Tensor  # [E_local] int64, rows routed to each local expert

    @property
    def num_rows(self) -> int:
        return self.hidden.shape[0]


@dataclass
class Permuted:
    """Expert-grouped layout on one destination rank (full: no bound applied)."""

    hidden: torch.Tensor  # [P, H]
    scales: Optional[torch.Tensor]  # [P, H/128]
    probs: Optional[torch.Tensor]  # [P] fp32
    recv_row: torch.Tensor  # [P] int64, -1 for padding
    local_expert: torch.Tensor  # [P] int64, the group of the row (padding too)
    tokens_per_expert: torch.Tensor  # [E_local] int64, padded
    unpadded_tokens_per_expert: torch.Tensor  # [E_local] int64
    received: Received = field(repr=False, default=None)

    @property
    def num_rows(self) -> int:
        return self.hidden.shape[0]


def kept_rows(count: int, bound: Optional[int]) -> int:
    """Rows that exist under a bound (section 6)."""
    return count if bound is None else min(count, bound)


def kept_tokens_per_expert(layout, bound: Optional[int]) -> torch.Tensor:
    """Rows per local expert among the rows a bound keeps (section 6): counted from the
    kept rows of the reference layout (a Received's routing map, a Permuted's groups)."""
    if isinstance(layout, Permuted):
        kept = kept_rows(layout.num_rows, bound)
        El = layout.tokens_per_expert.numel()
        return torch.bincount(layout.local_expert[:kept], minlength=El).to(torch.int64)
    kept = kept_rows(layout.routing_map.shape[0], bound)
    return layout.routing_map[:kept].sum(dim=0, dtype=torch.int64)


def dispatch_ref(
    hiddens: Sequence[torch.Tensor],
    routings: Sequence[Routing],
    num_experts: int,
    scales: Optional[Sequence[torch.Tensor]] = None,
) -> List[Received]:
    """Section 4: the received layout of every destination rank."""
    R = len(hiddens)
    assert len(routings) == R and num_experts % R == 0
    El = num_experts // R
    has_probs = routings[0].probs is not None if R else False
    out = []
    for d in range(R):
        rows_h, rows_s, rows_p, rows_m, rows_r, rows_t = [], [], [], [], [], []
        for r in range(R):
            rt = routings[r]
            local = rt.chosen[:, d * El:(d + 1) * El]
            toks = torch.nonzero(local.any(dim=1), as_tuple=False).flatten()  # ascending
            rows_h.append(hiddens[r][toks])
            if scales is not None:
                rows_s.append(scales[r][toks])
            if has_probs:
                rows_p.append(rt.probs[toks, d * El:(d + 1) * El])
            rows_m.append(local[toks])
            rows_r.append(torch.full((toks.numel(),), r, dtype=torch.int32))
            rows_t.append(toks.to(torch.int32))
        H = hiddens[0].shape[1]
        hid = torch.cat(rows_h) if rows_h else torch.empty(0, H, dtype=hiddens[0].dtype)
        rmap = torch.cat(rows_m)
        out.append(
            Received(
                hidden=hid,
                scales=torch.cat(rows_s) if scales is not None else None,
                probs=torch.cat(rows_p) if has_probs else None,
                routing_map=rmap,
                src_rank=torch.cat(rows_r),
                src_token=torch.cat(rows_t),
                tokens_per_expert=rmap.sum(dim=0, dtype=torch.int64),
            )
        )
    return out


def permute_ref(received: Sequence[Received], pad_multiple: int = 1) -> List[Permuted]:
    """Section 5: the expert-grouped layout from the (full) received layout."""
    assert pad_multiple >= 1
    out = []
    for rc in received:
        N, El = rc.routing_map.shape
        H = rc.hidden.shape[1]
        idx, experts, padded, unpadded = [], [], [], []
        for j in range(El):
            rows = torch.nonzero(rc.routing_map[:, j], as_tuple=False).flatten()
            n = rows.numel()
            p = -(-n // pad_multiple) * pad_multiple
            idx.append(rows)
            idx.append(torch.full((p - n,), -1, dtype=torch.int64))
            experts.append(torch.full((p,), j, dtype=torch.int64))
            padded.append(p)
            unpadded.append(n)
        recv_row = torch.cat(idx) if idx else torch.empty(0, dtype=torch.int64)
        local_expert = torch.cat(experts) if experts else torch.empty(0, dtype=torch.int64)
        P = recv_row.numel()
        real = recv_row >= 0
        src = recv_row.clamp(min=0)
        # hidden: the received row's bytes; padding rows all-zero bytes
        hid = torch.zeros(P, H, dtype=rc.hidden.dtype)
        if P:
            hb = hid.view(torch.uint8) if hid.dtype.itemsize == 1 else hid.view(torch.int16)
            sb = rc.hidden.view(torch.uint8) if hid.dtype.itemsize == 1 else rc.hidden.view(torch.int16)
            hb[real] = sb[src[real]]
        sc = None
        if rc.scales is not None:
            sc = torch.zeros(P, rc.scales.shape[1], dtype=torch.float32)
            sc[real] = rc.scales[src[real]]
        pr = None
        if rc.probs is not None:
            pr = torch.zeros(P, dtype=torch.float32)
            pr[real] = rc.probs[src[real], local_expert[real]]
        out.append(
            Permuted(
                hidden=hid,
                scales=sc,
                probs=pr,
                recv_row=recv_row,
                local_expert=local_expert,
                tokens_per_expert=torch.tensor(padded, dtype=torch.int64),
                unpadded_tokens_per_expert=torch.tensor(unpadded, dtype=torch.int64),
                received=rc,
            )
        )
    return out


# --------------------------------------------------------------------------- combine


def _rows_of_home(rc: Received, home: int, kept: int):
    """(row indices, token indices) of the rows of home rank ``home`` among the first
    ``kept`` received rows."""
    sel = torch.nonzero(rc.src_rank[:kept] == home, as_tuple=False).flatten()
    return sel, rc.src_token[sel].to(torch.int64)


def combine_ref(
    ys: Sequence[torch.Tensor],
    received: Sequence[Received],
    num_tokens: Sequence[int],
    ranks_per_domain: Optional[int] = None,
    bound: Optional[int] = None,
) -> List[torch.Tensor]:
    """Section 7. ``ys[d]``: bf16 [>= kept rows, H] in received order on expert rank d
    (rows past the bound, if any, are ignored). Returns bf16 [T_r, H] for each rank."""
    R = len(received)
    rpd = R if ranks_per_domain is None else ranks_per_domain
    assert R % rpd == 0
    H = ys[0].shape[1]
    outs = []
    for home in range(R):
        T = num_tokens[home]
        total = torch.zeros(T, H, dtype=torch.float32)
        for n in range(R // rpd):
            partial = torch.zeros(T, H, dtype=torch.float32)
            held = torch.zeros(T, dtype=torch.bool)
            for d in range(n * rpd, (n + 1) * rpd):
                kept = kept_rows(received[d].num_rows, bound)
                rows, toks = _rows_of_home(received[d], home, kept)
                if rows.numel() == 0:
                    continue
                # each token has at most one row on d: no duplicate indices
                partial[toks] = partial[toks] + ys[d][rows].to(torch.float32)
                held[toks] = True
            rounded = partial.to(torch.bfloat16).to(torch.float32)
            total = torch.where(held[:, None], total + rounded, total)
        outs.append(total.to(torch.bfloat16))
    return outs


def combine_probs_ref(
    qs: Sequence[torch.Tensor],
    received: Sequence[Received],
    num_tokens: Sequence[int],
    bound: Optional[int] = None,
) -> List[torch.Tensor]:
    """Section 7, probs: ``qs[d]`` fp32 [>= kept, E_local]; returns fp32 [T_r, E]:
    the chosen cells copied from the row, 0.0 elsewhere and for dropped rows."""
    R = len(received)
    El = received[0].routing_map.shape[1]
    outs = []
    for home in range(R):
        out = torch.zeros(num_tokens[home], R * El, dtype=torch.float32)
        for d in range(R):
            kept = kept_rows(received[d].num_rows, bound)
            rows, toks = _rows_of_home(received[d], home, kept)
            if rows.numel() == 0:
                continue
            vals = torch.where(received[d].routing_map[rows], qs[d][rows], torch.zeros((), dtype=torch.float32))
            out[toks, d * El:(d + 1) * El] = vals
        outs.append(out)
    return outs


def unpermute_ref(zs: Sequence[torch.Tensor], permuted: Sequence[Permuted], bound: Optional[int] = None) -> List[torch.Tensor]:
    """Section 8, unpermute: ``zs[d]`` bf16 [>= kept, H] in the permuted layout; returns
    ``y_d`` bf16 [N_d, H] in the received layout (N_d: all received rows)."""
    outs = []
    for d, pm in enumerate(permuted):
        N = pm.received.num_rows
        H = zs[d].shape[1]
        kept = kept_rows(pm.num_rows, bound)
        acc = torch.zeros(N, H, dtype=torch.float32)
        El = pm.tokens_per_expert.numel()
        for j in range(El):  # local expert ascending
            sel = torch.nonzero((pm.local_expert[:kept] == j) & (pm.recv_row[:kept] >= 0), as_tuple=False).flatten()
            if sel.numel() == 0:
                continue
            rows = pm.recv_row[sel]  # distinct within one expert group
            acc[rows] = acc[rows] + zs[d][sel].to(torch.float32)
        outs.append(acc.to(torch.bfloat16))
    return outs


def combine_with_unpermute_ref(
    zs: Sequence[torch.Tensor],
    permuted: Sequence[Permuted],
    num_tokens: Sequence[int],
    ranks_per_domain: Optional[int] = None,
    bound: Optional[int] = None,
) -> List[torch.Tensor]:
    """Section 8: unpermute on every rank, then combine of the full received layout."""
    ys = unpermute_ref(zs, permuted, bound)
    return combine_ref(ys, [p.received for p in permuted], num_tokens, ranks_per_domain)


def combine_probs_permuted_ref(
    qs: Sequence[torch.Tensor],
    permuted: Sequence[Permuted],
    num_tokens: Sequence[int],
    bound: Optional[int] = None,
) -> List[torch.Tensor]:
    """Section 8, probs: ``qs[d]`` fp32 [>= kept]; returns fp32 [T_r, E]."""
    R = len(permuted)
    El = permuted[0].tokens_per_expert.numel()
    outs = [torch.zeros(num_tokens[r], R * El, dtype=torch.float32) for r in range(R)]
    for d, pm in enumerate(permuted):
        kept = kept_rows(pm.num_rows, bound)
        rc = pm.received
        for p in range(kept):
            i = int(pm.recv_row[p])
            if i < 0:
                continue
            r = int(rc.src_rank[i])
            t = int(rc.src_token[i])
            e = d * El + int(pm.local_expert[p])
            outs[r][t, e] = qs[d][p]
    return outs


# --------------------------------------------------------------------------- FP8 data


def quantize_fp8_rows(x: torch.Tensor):
    """Section 10: x [T, H] (float or bf16, finite), H % 128 == 0 ->
    (codes float8_e4m3fn [T, H], scales fp32 [T, H/128])."""
    T, H = x.shape
    assert H % 128 == 0
    xf = x.to(torch.float32).reshape(T, H // 128, 128)
    amax = xf.abs().amax(dim=2)
    scale = torch.where(amax == 0, torch.ones((), dtype=torch.float32), amax / torch.tensor(448.0, dtype=torch.float32))
    q = (xf / scale[:, :, None]).clamp(-448.0, 448.0)
    codes = q.to(torch.float8_e4m3fn).reshape(T, H)
    return codes.contiguous(), scale.contiguous()


def dequantize_fp8_rows(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    T, H = codes.shape
    return (codes.to(torch.float32).reshape(T, H // 128, 128) * scales[:, :, None]).reshape(T, H)
