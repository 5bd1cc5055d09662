"""Shared helpers of the Python API tests: input generation, the reference of a case,
running a function on simulated ranks, bitwise comparison.

Only ``run_ranks`` and ``import_railyard`` touch railyard; the rest is plain torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

import pytest
import torch

import reference as ref

# --------------------------------------------------------------------------- bits


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as integers of the same width (for bitwise comparison;
    distinguishes +0 from -0 and compares NaN payloads)."""
    t = t.detach().contiguous()
    if t.dtype == torch.bool:
        return t.to(torch.uint8)
    if not (t.dtype.is_floating_point or t.dtype.is_complex):
        return t
    return t.view(_INT_OF_SIZE[t.dtype.itemsize])


def assert_bits(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Same dtype, shape and bytes; on a mismatch name the first differing element."""
    assert actual is not None, f"{what}: got None"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, expected {expected.dtype}"
    assert tuple(actual.shape) == tuple(expected.shape), f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    a, e = bits(actual), bits(expected)
    if not torch.equal(a, e):
        diff = torch.nonzero(a != e, as_tuple=False)
        first = tuple(diff[0].tolist())
        av = actual.detach()[first].float().item() if actual.dtype != torch.bool else bool(actual[first])
        ev = expected[first].float().item() if expected.dtype != torch.bool else bool(expected[first])
        raise AssertionError(
            f"{what}: {diff.shape[0]} of {a.numel()} elements differ; first at {first}: "
            f"got {av!r} (bits {int(a[first])}), expected {ev!r} (bits {int(e[first])})"
        )


def assert_within_exact(actual: torch.Tensor, exact: torch.Tensor, abs_sum: torch.Tensor, what: str, rel: float) -> None:
    """``|actual - exact| <= rel * abs_sum`` elementwise (float64), where ``exact`` is
    the float64 value of the same sum and ``abs_sum`` the sum of the terms' magnitudes."""
    a = actual.detach().to(torch.float64)
    err = (a - exact).abs()
    tol = rel * abs_sum + 1e-300
    bad = err > tol
    if bad.any():
        i = tuple(torch.nonzero(bad, as_tuple=False)[0].tolist())
        raise AssertionError(f"{what}: |{a[i].item()} - {exact[i].item()}| > {tol[i].item()} at {i}")


# --------------------------------------------------------------------------- cases


@dataclass
class Case:
    """Inputs of every rank plus their reference."""

    world_size: int
    hidden_dim: int
    num_local_experts: int
    tokens: List[int]
    max_tokens: int
    fp8: bool
    form: str  # "map" or "topk"
    with_probs: bool
    top_k: int
    seed: int
    pad_multiple: int = 1
    ranks_per_domain: Optional[int] = None
    # generated
    hidden: List[torch.Tensor] = field(default_factory=list)  # what dispatch gets (bf16 or fp8)
    scales: Optional[List[torch.Tensor]] = None
    routing_kwargs: List[Dict[str, torch.Tensor]] = field(default_factory=list)
    routings: List[ref.Routing] = field(default_factory=list)
    received: List[ref.Received] = field(default_factory=list)
    permuted: List[ref.Permuted] = field(default_factory=list)

    @property
    def num_experts(self) -> int:
        return self.world_size * self.num_local_experts

    def dispatch_kwargs(self, rank: int) -> Dict[str, Any]:
        kw = dict(self.routing_kwargs[rank])
        if self.fp8:
            kw["scaling_factor"] = self.scales[rank]
        return kw

    def generator(self, salt: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed * 1000003 + salt)


def token_counts(world_size: int, max_tokens: int, seed: int, zero_rank: bool = True) -> List[int]:
    """Unequal counts in [0, max_tokens]: one rank at the maximum and (with two ranks or
    more) one rank with no tokens."""
    g = torch.Generator().manual_seed(seed + 17)
    counts = torch.randint(1, max_tokens + 1, (world_size,), generator=g).tolist()
    perm = torch.randperm(world_size, generator=g).tolist()
    counts[perm[0]] = max_tokens
    if zero_rank and world_size >= 2:
        counts[perm[1]] = 0
    return counts


def random_choices(T: int, E: int, K: int, g: torch.Generator) -> List[List[int]]:
    """Per token, a list of distinct experts: usually K of them, sometimes fewer, and
    about one token in eight is routed nowhere."""
    out = []
    for _ in range(T):
        u = float(torch.rand((), generator=g))
        n = 0 if u < 0.125 else (K if u > 0.4 else int(torch.randint(1, K + 1, (), generator=g)))
        out.append(torch.randperm(E, generator=g)[:n].tolist())
    return out


# BF16 values whose fp32 sums depend on the order of the additions and on where the
# roundings happen: (2^25 + -2^25) + 1 = 1 but (2^25 + 1) + -2^25 = 0; 1 + 2^-8 + 2^-8
# is 1 + 2^-7 with one rounding and 1 with a rounding after each addition; -0 + -0 must
# come out +0 (the sum starts from +0).
SPECIAL_VALUES = torch.tensor([2.0 ** 25, -(2.0 ** 25), 2.0 ** 24, -(2.0 ** 24), 1.0, -1.0, 3.0, -0.5,
                               2.0 ** -8, -(2.0 ** -8), 0.0, -0.0])


def random_bf16(shape, g: torch.Generator, scale: float = 1.0, adversarial: bool = False) -> torch.Tensor:
    """Normal values; with ``adversarial`` about half the elements are drawn from
    SPECIAL_VALUES instead, so a wrong summation order or rounding shows in BF16."""
    x = torch.randn(*shape, generator=g) * scale
    if adversarial:
        pick = torch.randint(0, SPECIAL_VALUES.numel(), tuple(shape), generator=g)
        mask = torch.rand(*shape, generator=g) < 0.5
        x = torch.where(mask, SPECIAL_VALUES[pick], x)
    return x.to(torch.bfloat16)


def random_probs(shape, g: torch.Generator) -> torch.Tensor:
    # values in (0, 1) with full fp32 mantissas; a few exact zeros (a chosen expert with
    # prob 0 is still chosen)
    p = torch.rand(*shape, generator=g)
    p[torch.rand(*shape, generator=g) < 0.05] = 0.0
    return p


def make_case(
    world_size: int,
    *,
    hidden_dim: int = 64,
    num_local_experts: int = 2,
    tokens: Optional[Sequence[int]] = None,
    max_tokens: int = 32,
    fp8: bool = False,
    form: str = "map",
    with_probs: bool = True,
    top_k: int = 4,
    seed: int = 0,
    pad_multiple: int = 1,
    ranks_per_domain: Optional[int] = None,
) -> Case:
    if fp8 and hidden_dim % 128:
        hidden_dim = 128
    E = world_size * num_local_experts
    K = min(top_k, E)
    counts = list(tokens) if tokens is not None else token_counts(world_size, max_tokens, seed)
    c = Case(world_size, hidden_dim, num_local_experts, counts, max_tokens, fp8, form, with_probs, K, seed,
             pad_multiple, ranks_per_domain)
    g = c.generator(1)
    if fp8:
        c.scales = []
    for r, T in enumerate(counts):
        x = random_bf16((T, hidden_dim), g)
        if fp8:
            codes, sc = ref.quantize_fp8_rows(x.float() * 4)
            c.hidden.append(codes)
            c.scales.append(sc)
        else:
            c.hidden.append(x)
        choices = random_choices(T, E, K, g)
        if form == "map":
            rmap = torch.zeros(T, E, dtype=torch.bool)
            for t, ch in enumerate(choices):
                rmap[t, ch] = True
            kw = {"routing_map": rmap}
            if with_probs:
                kw["probs"] = random_probs((T, E), g)  # unchosen cells nonzero too: ignored
        else:
            idx = torch.full((T, K), -1, dtype=torch.int64)
            for t, ch in enumerate(choices):
                slots = torch.randperm(K, generator=g)[: len(ch)]
                idx[t, slots] = torch.tensor(ch, dtype=torch.int64)
            kw = {"topk_idx": idx}
            if with_probs:
                kw["topk_weights"] = random_probs((T, K), g)  # weights of -1 slots: ignored
        c.routing_kwargs.append(kw)
        c.routings.append(ref.normalize_routing(E, **kw))
    c.received = ref.dispatch_ref(c.hidden, c.routings, E, scales=c.scales)
    c.permuted = ref.permute_ref(c.received, pad_multiple)
    return c


def expert_rows(case: Case, rows: Sequence[int], salt: int, extra_rows: int = 0) -> List[torch.Tensor]:
    """Per rank, bf16 rows playing the expert outputs (or gradients): ``rows[d] +
    extra_rows`` rows (the extra ones stand for the unused tail of a bounded output).
    Adversarial values (see SPECIAL_VALUES): the order of combine's sums matters."""
    g = case.generator(salt)
    return [random_bf16((n + extra_rows, case.hidden_dim), g, adversarial=True) for n in rows]


def random_fp32_rows(case: Case, shapes: Sequence[tuple], salt: int) -> List[torch.Tensor]:
    g = case.generator(salt)
    return [torch.randn(*s, generator=g) for s in shapes]


# --------------------------------------------------------------------------- railyard


def import_railyard():
    """railyard and railyard.sim, or skip the test when the package is not built."""
    try:
        import railyard  # noqa: F401
        import railyard.sim  # noqa: F401
    except Exception as exc:  # ImportError, or a missing compiled module
        pytest.skip(f"railyard not importable: {exc!r}")
    return railyard


def run_ranks(world_size: int, fn: Callable, ranks_per_domain: Optional[int] = None, seed: int = 1) -> List[Any]:
    """``fn(group)`` on ``world_size`` simulated ranks; the ranks' return values."""
    railyard = import_railyard()
    return railyard.sim.run(
        world_size=world_size, fn=fn, ranks_per_domain=ranks_per_domain or world_size, seed=seed
    )


def make_buffer(group, case: Case, **kw):
    import railyard

    return railyard.Buffer(
        group,
        hidden_dim=case.hidden_dim,
        max_num_of_tokens_per_rank=case.max_tokens,
        num_local_experts=case.num_local_experts,
        use_fp8=case.fp8,
        **kw,
    )


def scalar(t) -> int:
    """A device scalar (tensor) or int read on the host."""
    if isinstance(t, torch.Tensor):
        return int(t.item())
    return int(t)


def clone(t):
    return None if t is None else t.detach().clone()


def snap_handle(h) -> Dict[str, Any]:
    """The handle's fields, read back (the ops' outputs are gone after the run)."""
    out = {
        "layout": h.layout,
        "num_tokens": scalar(h.num_tokens),
        "pad_multiple": scalar(h.pad_multiple),
        "num_rows": scalar(h.num_rows),
        "bounded": bool(h.bounded),
        "overflow": scalar(h.overflow),
        "last": scalar(h[-1]),
        "required_rows": scalar(h.required_rows),
        "tokens_per_expert": clone(h.tokens_per_expert),
    }
    if h.layout == "received":
        out["count"] = scalar(h.num_recv_tokens)
    else:
        out["count"] = scalar(h.num_permuted_tokens)
    return out


def snap_dispatch(r) -> Dict[str, Any]:
    d = {k: clone(getattr(r, k)) for k in r._fields if k != "handle"}
    d["handle"] = snap_handle(r.handle)
    return d


def snap_combine(c) -> Dict[str, Any]:
    return {"hidden": clone(c.hidden), "probs": clone(c.probs)}


# --------------------------------------------------------------------------- checks


def check_received(case: Case, d: int, got: Dict[str, Any], bound: Optional[int] = None) -> None:
    """Compare one rank's DispatchResult snapshot with the reference."""
    rc = case.received[d]
    N = rc.num_rows
    kept = ref.kept_rows(N, bound)
    rows = N if bound is None else bound
    w = f"rank {d}"
    assert tuple(got["hidden"].shape) == (rows, case.hidden_dim), f"{w}: hidden shape {tuple(got['hidden'].shape)}"
    assert_bits(got["hidden"][:kept], rc.hidden[:kept], f"{w} hidden")
    if case.fp8:
        assert got["scaling_factor"] is not None and tuple(got["scaling_factor"].shape) == (rows, case.hidden_dim // 128)
        assert_bits(got["scaling_factor"][:kept], rc.scales[:kept], f"{w} scaling_factor")
    else:
        assert got["scaling_factor"] is None, f"{w}: scaling_factor should be None for BF16"
    if case.with_probs:
        assert tuple(got["probs"].shape) == (rows, case.num_local_experts)
        assert_bits(got["probs"][:kept], rc.probs[:kept], f"{w} probs")
    else:
        assert got["probs"] is None, f"{w}: probs should be None when none were given"
    assert tuple(got["routing_map"].shape) == (rows, case.num_local_experts)
    assert_bits(got["routing_map"][:kept], rc.routing_map[:kept], f"{w} routing_map")
    assert_bits(got["src_rank"][:kept], rc.src_rank[:kept], f"{w} src_rank")
    assert_bits(got["src_token"][:kept], rc.src_token[:kept], f"{w} src_token")
    # The result counts the rows written; the handle keeps the true counts.
    assert_bits(got["tokens_per_expert"], ref.kept_tokens_per_expert(rc, bound), f"{w} tokens_per_expert (kept)")
    h = got["handle"]
    assert_bits(h["tokens_per_expert"], rc.tokens_per_expert, f"{w} handle.tokens_per_expert")
    assert h["layout"] == "received"
    assert h["num_tokens"] == case.tokens[d]
    assert h["num_rows"] == rows
    assert h["bounded"] == (bound is not None)
    assert h["count"] == N, f"{w}: num_recv_tokens {h['count']}, expected the true count {N}"
    assert (h["overflow"] != 0) == (bound is not None and N > bound), f"{w}: overflow {h['overflow']} with {N} rows, bound {bound}"
    assert h["last"] == h["overflow"], f"{w}: handle[-1] is {h['last']}, expected the overflow flag"
    assert h["required_rows"] == N


def check_permuted(case: Case, d: int, got: Dict[str, Any], bound: Optional[int] = None) -> None:
    """Compare one rank's PermutedDispatchResult snapshot with the reference."""
    pm = case.permuted[d]
    P = pm.num_rows
    kept = ref.kept_rows(P, bound)
    rows = P if bound is None else bound
    w = f"rank {d}"
    assert tuple(got["hidden"].shape) == (rows, case.hidden_dim), f"{w}: hidden shape {tuple(got['hidden'].shape)}"
    assert_bits(got["hidden"][:kept], pm.hidden[:kept], f"{w} hidden")
    if case.fp8:
        assert tuple(got["scaling_factor"].shape) == (rows, case.hidden_dim // 128)
        assert_bits(got["scaling_factor"][:kept], pm.scales[:kept], f"{w} scaling_factor")
    else:
        assert got["scaling_factor"] is None
    if case.with_probs:
        assert tuple(got["probs"].shape) == (rows,)
        assert_bits(got["probs"][:kept], pm.probs[:kept], f"{w} probs")
    else:
        assert got["probs"] is None
    kept_per_expert = ref.kept_tokens_per_expert(pm, bound)
    assert_bits(got["tokens_per_expert"], kept_per_expert, f"{w} tokens_per_expert (padded, kept)")
    assert int(kept_per_expert.sum()) == kept, f"{w}: kept tokens_per_expert do not sum to the rows written"
    h = got["handle"]
    assert_bits(h["tokens_per_expert"], pm.tokens_per_expert, f"{w} handle.tokens_per_expert")
    assert h["layout"] == "expert_grouped"
    assert h["num_tokens"] == case.tokens[d]
    assert h["pad_multiple"] == case.pad_multiple
    assert h["num_rows"] == rows
    assert h["bounded"] == (bound is not None)
    assert h["count"] == P, f"{w}: num_permuted_tokens {h['count']}, expected the true count {P}"
    assert (h["overflow"] != 0) == (bound is not None and P > bound), f"{w}: overflow {h['overflow']} with {P} rows, bound {bound}"
    assert h["last"] == h["overflow"], f"{w}: handle[-1] is {h['last']}, expected the overflow flag"
    assert h["required_rows"] == P


def exact_row_sums(case: Case, zs: Sequence[torch.Tensor], layout: str, bound: Optional[int] = None):
    """float64 sums of each token's rows (any order; exact up to float64) and the sums of
    the rows' magnitudes: the ideal value of combine (layout "received") or
    combine_with_unpermute (layout "permuted") that the roundings depart from."""
    R, H = case.world_size, case.hidden_dim
    exact = [torch.zeros(T, H, dtype=torch.float64) for T in case.tokens]
    mag = [torch.zeros(T, H, dtype=torch.float64) for T in case.tokens]
    for d in range(R):
        rc = case.received[d]
        if layout == "received":
            kept = ref.kept_rows(rc.num_rows, bound)
            recv = torch.arange(kept)
            src = torch.arange(kept)
        else:
            pm = case.permuted[d]
            kept = ref.kept_rows(pm.num_rows, bound)
            real = torch.nonzero(pm.recv_row[:kept] >= 0, as_tuple=False).flatten()
            recv = pm.recv_row[real]
            src = real
        for home in range(R):
            sel = rc.src_rank[recv] == home
            toks = rc.src_token[recv][sel].to(torch.int64)
            vals = zs[d][src[sel]].to(torch.float64)
            exact[home].index_add_(0, toks, vals)
            mag[home].index_add_(0, toks, vals.abs())
    return exact, mag


def dispatch_grad_ref(case: Case, grads: Sequence[torch.Tensor], grad_probs: Sequence[torch.Tensor], layout: str):
    """What the backward of combine must give: the dispatch of the output gradients
    with the case's routing (hidden rows; probs rows: the chosen cells of the [T, E]
    gradient). Returns (hidden, probs) per rank, full (no bound)."""
    routings = [ref.Routing(rt.chosen, torch.where(rt.chosen, gp, torch.zeros(())))
                for rt, gp in zip(case.routings, grad_probs)]
    rcs = ref.dispatch_ref(grads, routings, case.num_experts)
    if layout == "received":
        return [(r.hidden, r.probs) for r in rcs]
    pms = ref.permute_ref(rcs, case.pad_multiple)
    return [(p.hidden, p.probs) for p in pms]


def topk_grad_from_dense(topk_idx: torch.Tensor, dense: torch.Tensor) -> torch.Tensor:
    """Gradient of topk_weights from the gradient of the dense [T, E] probs: slot k gets
    the cell of its expert, an unused (-1) slot 0."""
    g = dense.gather(1, topk_idx.clamp(min=0))
    return torch.where(topk_idx >= 0, g, torch.zeros(()))
