"""The no-host-sync (bounded) mode, docs/semantics.md section 6:

* dispatch(num_recv_tokens=B) and dispatch_with_permute(non_blocking=True,
  num_permuted_tokens=B): outputs have exactly B rows; rows with index < B are the
  reference's first rows; the handle's counts are the true ones; the overflow flag is
  nonzero exactly when the true count exceeds B (checked on every rank, some ranks
  overflowing and some not in the same call);
* combine on a bounded handle: dropped rows contribute nothing, rows of the input past
  the true count (the unused tail of the bounded output) are ignored;
* the blocking mode's overflow flag is written (zero) - see test_dispatch_combine.py.
"""

import pytest

import reference as ref
from helpers import (
    check_permuted,
    check_received,
    assert_bits,
    expert_rows,
    make_buffer,
    make_case,
    random_fp32_rows,
    run_ranks,
    snap_combine,
    snap_dispatch,
)

BOUNDS = ["small", "large", "zero"]


def pick_bound(kind, counts):
    """One bound for every rank: 'small' makes the ranks with the most rows overflow
    while others do not, 'large' leaves a garbage tail on every rank."""
    if kind == "zero":
        return 0
    if kind == "large":
        return max(counts) + 5
    lo, hi = min(counts), max(counts)
    return (lo + hi) // 2 if hi - lo >= 2 else max(0, hi - 1)


@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize("bound_kind", BOUNDS)
@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
def test_bounded_dispatch_and_combine(railyard, world_size, bound_kind, fp8):
    case = make_case(world_size, fp8=fp8, hidden_dim=128 if fp8 else 64, form="map" if world_size != 4 else "topk",
                     seed=world_size + 10, max_tokens=24)
    counts = [rc.num_rows for rc in case.received]
    B = pick_bound(bound_kind, counts)
    if bound_kind == "small":
        assert any(n > B for n in counts)  # the case must overflow somewhere
    ys = expert_rows(case, [B] * world_size, salt=2)  # B rows; past the true count: garbage
    qs = random_fp32_rows(case, [(B, case.num_local_experts)] * world_size, salt=3)

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        r = buf.dispatch(case.hidden[d], num_recv_tokens=B, **case.dispatch_kwargs(d))
        got = snap_dispatch(r)
        c = snap_combine(buf.combine(ys[d], probs=qs[d], handle=r.handle))
        buf.destroy()
        return got, c

    exp_h = ref.combine_ref(ys, case.received, case.tokens, bound=B)
    exp_p = ref.combine_probs_ref(qs, case.received, case.tokens, bound=B)
    for d, (got, c) in enumerate(run_ranks(world_size, fn)):
        check_received(case, d, got, bound=B)
        assert_bits(c["hidden"], exp_h[d], f"rank {d} combine hidden (bound {B})")
        assert_bits(c["probs"], exp_p[d], f"rank {d} combine probs (bound {B})")


@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize("bound_kind", BOUNDS)
@pytest.mark.parametrize("pad", [1, 4])
def test_non_blocking_dispatch_with_permute(railyard, world_size, bound_kind, pad):
    fp8 = world_size == 4 and pad == 4
    case = make_case(world_size, fp8=fp8, hidden_dim=128 if fp8 else 64, form="topk" if pad == 1 else "map",
                     seed=world_size + 20 + pad, max_tokens=24, pad_multiple=pad)
    counts = [pm.num_rows for pm in case.permuted]
    B = pick_bound(bound_kind, counts)
    if bound_kind == "small":
        assert any(n > B for n in counts)
    zs = expert_rows(case, [B] * world_size, salt=4)
    qs = random_fp32_rows(case, [(B,)] * world_size, salt=5)

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        r = buf.dispatch_with_permute(case.hidden[d], pad_multiple=pad, num_permuted_tokens=B, non_blocking=True,
                                      **case.dispatch_kwargs(d))
        got = snap_dispatch(r)
        c = snap_combine(buf.combine_with_unpermute(zs[d], probs=qs[d], handle=r.handle, pad_multiple=pad))
        buf.destroy()
        return got, c

    exp_h = ref.combine_with_unpermute_ref(zs, case.permuted, case.tokens, bound=B)
    exp_p = ref.combine_probs_permuted_ref(qs, case.permuted, case.tokens, bound=B)
    for d, (got, c) in enumerate(run_ranks(world_size, fn)):
        check_permuted(case, d, got, bound=B)
        assert_bits(c["hidden"], exp_h[d], f"rank {d} combine_with_unpermute hidden (bound {B})")
        assert_bits(c["probs"], exp_p[d], f"rank {d} combine_with_unpermute probs (bound {B})")


def test_bound_per_rank_differs(railyard):
    """Each rank passes its own bound: rank 0 exactly its count, rank 1 one less."""
    case = make_case(2, seed=31, max_tokens=16, tokens=[16, 12])
    counts = [rc.num_rows for rc in case.received]
    assert min(counts) >= 1
    bounds = [counts[0], counts[1] - 1]

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        r = buf.dispatch(case.hidden[d], num_recv_tokens=bounds[d], **case.dispatch_kwargs(d))
        got = snap_dispatch(r)
        buf.destroy()
        return got

    for d, got in enumerate(run_ranks(2, fn)):
        check_received(case, d, got, bound=bounds[d])
