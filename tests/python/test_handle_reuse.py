"""dispatch(handle=...) / dispatch_with_permute(handle=...): the backward-style dispatch
of other data with the routing of a previous dispatch, no routing given. The rows must
be the reference dispatch of the new data with the old routing; on a bounded handle the
same rows are dropped.
"""

import pytest

import reference as ref
from helpers import assert_bits, make_buffer, make_case, random_bf16, run_ranks


def new_data(case, salt):
    g = case.generator(salt)
    return [random_bf16((T, case.hidden_dim), g, scale=3.0) for T in case.tokens]


@pytest.mark.parametrize("world_size", [2, 4, 8])
@pytest.mark.parametrize("layout", ["received", "permuted"])
@pytest.mark.parametrize("bounded", [False, True], ids=["blocking", "bounded"])
def test_dispatch_on_a_handle(railyard, world_size, layout, bounded):
    pad = 4 if layout == "permuted" else 1
    case = make_case(world_size, seed=40 + world_size, form="topk" if world_size == 4 else "map", pad_multiple=pad)
    xs2 = new_data(case, 7)
    full = case.received if layout == "received" else case.permuted
    counts = [x.num_rows for x in full]
    B = max(1, sorted(counts)[len(counts) // 2] - 1) if bounded else None

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        kw = case.dispatch_kwargs(d)
        if layout == "received":
            r = buf.dispatch(case.hidden[d], num_recv_tokens=B, **kw)
            r2 = buf.dispatch(xs2[d], handle=r.handle)
            r3 = buf.dispatch(case.hidden[d], handle=r.handle)
        else:
            nb = dict(num_permuted_tokens=B, non_blocking=True) if bounded else {}
            r = buf.dispatch_with_permute(case.hidden[d], pad_multiple=pad, **nb, **kw)
            r2 = buf.dispatch_with_permute(xs2[d], handle=r.handle, pad_multiple=pad)
            r3 = buf.dispatch_with_permute(case.hidden[d], handle=r.handle, pad_multiple=pad)
        out = (r.hidden.clone(), r2.hidden.clone(), r3.hidden.clone())
        buf.destroy()
        return out

    exp2 = ref.dispatch_ref(xs2, case.routings, case.num_experts)
    if layout == "permuted":
        exp2 = ref.permute_ref(exp2, pad)
    for d, (h1, h2, h3) in enumerate(run_ranks(world_size, fn)):
        kept = ref.kept_rows(counts[d], B)
        rows = counts[d] if B is None else B
        assert tuple(h2.shape) == (rows, case.hidden_dim), f"rank {d}: shape {tuple(h2.shape)} on the handle"
        assert_bits(h2[:kept], exp2[d].hidden[:kept], f"rank {d} dispatch of new data on the handle")
        assert_bits(h3[:kept], h1[:kept], f"rank {d} dispatch of the same data on the handle")
        assert_bits(h1[:kept], full[d].hidden[:kept], f"rank {d} first dispatch")
