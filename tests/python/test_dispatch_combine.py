"""dispatch / combine and dispatch_with_permute / combine_with_unpermute on simulated
ranks, blocking mode, against tests/python/reference.py:

* dispatch and dispatch_with_permute: every output byte for byte (hidden, FP8 scales,
  probs, routing map, sources, tokens_per_expert) and the handle's fields;
* combine and combine_with_unpermute: bit for bit against the fixed-order fp32 sum
  rounded to BF16 (section 7 and 8 of docs/semantics.md); probs combine bitwise;
* a second combine on the same handle gives the same bits;
* groups of several NVLink domains (2 x 1, 2 x 2 ranks), both layouts;
* 1, 2, 4 and 8 ranks, unequal token counts with one rank at 0 and one at the maximum,
  BF16 and FP8, routing map and top-k forms, with and without probs, pad_multiple.
"""

import pytest
import torch

import reference as ref
from helpers import (
    assert_bits,
    check_permuted,
    check_received,
    expert_rows,
    make_buffer,
    make_case,
    random_fp32_rows,
    run_ranks,
    snap_combine,
    snap_dispatch,
)

# experts per rank for each world size (E = 4, 6, 8, 16)
LOCAL_EXPERTS = {1: 4, 2: 3, 4: 2, 8: 2}
WORLD_SIZES = [1, 2, 4, 8]
DTYPES = pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
FORMS = pytest.mark.parametrize("form", ["map", "topk"])


def case_for(world_size, fp8, form, seed, **kw):
    kw.setdefault("num_local_experts", LOCAL_EXPERTS[world_size])
    kw.setdefault("hidden_dim", 128 if fp8 else 64)
    return make_case(world_size, fp8=fp8, form=form, seed=seed, **kw)


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@DTYPES
@FORMS
def test_dispatch_and_combine_received_layout(railyard, world_size, fp8, form, seed):
    case = case_for(world_size, fp8, form, seed)
    N = [rc.num_rows for rc in case.received]
    ys = expert_rows(case, N, salt=2)
    qs = random_fp32_rows(case, [(n, case.num_local_experts) for n in N], salt=3)

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        r = buf.dispatch(case.hidden[d], **case.dispatch_kwargs(d))
        got = snap_dispatch(r)
        c1 = snap_combine(buf.combine(ys[d], probs=qs[d], handle=r.handle))
        c2 = snap_combine(buf.combine(ys[d], probs=qs[d], handle=r.handle))
        buf.destroy()
        return got, c1, c2

    results = run_ranks(world_size, fn)
    exp_h = ref.combine_ref(ys, case.received, case.tokens)
    exp_p = ref.combine_probs_ref(qs, case.received, case.tokens)
    for d, (got, c1, c2) in enumerate(results):
        check_received(case, d, got)
        assert_bits(c1["hidden"], exp_h[d], f"rank {d} combine hidden")
        assert_bits(c1["probs"], exp_p[d], f"rank {d} combine probs")
        assert_bits(c2["hidden"], c1["hidden"], f"rank {d} second combine on the same handle")


@pytest.mark.parametrize("world_size", [2, 4])
@FORMS
def test_dispatch_and_combine_without_probs(railyard, world_size, form):
    case = case_for(world_size, False, form, seed=5, with_probs=False)
    ys = expert_rows(case, [rc.num_rows for rc in case.received], salt=2)

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        r = buf.dispatch(case.hidden[d], **case.dispatch_kwargs(d))
        got = snap_dispatch(r)
        c = snap_combine(buf.combine(ys[d], handle=r.handle))
        buf.destroy()
        return got, c

    exp_h = ref.combine_ref(ys, case.received, case.tokens)
    for d, (got, c) in enumerate(run_ranks(world_size, fn)):
        check_received(case, d, got)
        assert_bits(c["hidden"], exp_h[d], f"rank {d} combine hidden")
        assert c["probs"] is None, f"rank {d}: combine without probs returns probs None"


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("world_size", WORLD_SIZES)
@DTYPES
@FORMS
def test_dispatch_with_permute_and_combine_with_unpermute(railyard, world_size, fp8, form, seed):
    pad = [1, 4, 8][(seed + world_size) % 3]
    case = case_for(world_size, fp8, form, seed, pad_multiple=pad)
    P = [pm.num_rows for pm in case.permuted]
    zs = expert_rows(case, P, salt=4)  # padding rows hold nonzero values: ignored
    qs = random_fp32_rows(case, [(p,) for p in P], salt=5)

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        r = buf.dispatch_with_permute(case.hidden[d], pad_multiple=pad, **case.dispatch_kwargs(d))
        got = snap_dispatch(r)
        c1 = snap_combine(buf.combine_with_unpermute(zs[d], probs=qs[d], handle=r.handle, pad_multiple=pad))
        c2 = snap_combine(buf.combine_with_unpermute(zs[d], probs=qs[d], handle=r.handle, pad_multiple=pad))
        buf.destroy()
        return got, c1, c2

    results = run_ranks(world_size, fn)
    exp_h = ref.combine_with_unpermute_ref(zs, case.permuted, case.tokens)
    exp_p = ref.combine_probs_permuted_ref(qs, case.permuted, case.tokens)
    for d, (got, c1, c2) in enumerate(results):
        check_permuted(case, d, got)
        assert_bits(c1["hidden"], exp_h[d], f"rank {d} combine_with_unpermute hidden")
        assert_bits(c1["probs"], exp_p[d], f"rank {d} combine_with_unpermute probs")
        assert_bits(c2["hidden"], c1["hidden"], f"rank {d} second combine on the same handle")


@pytest.mark.parametrize("world_size,ranks_per_domain,transport", [(2, 1, "auto"), (4, 2, "auto"), (4, 2, "gin")])
@DTYPES
def test_across_nvlink_domains(railyard, world_size, ranks_per_domain, transport, fp8):
    """Several NVLink domains (the hierarchical path through the simulated NICs, the
    queue pairs driven directly or through the GIN lane): both layouts, bit for bit;
    combine rounds each domain's partial to BF16 (semantics.md 7)."""
    case = case_for(world_size, fp8, "topk" if fp8 else "map", seed=7, pad_multiple=4,
                    ranks_per_domain=ranks_per_domain)
    N = [rc.num_rows for rc in case.received]
    P = [pm.num_rows for pm in case.permuted]
    ys, zs = expert_rows(case, N, salt=2), expert_rows(case, P, salt=4)
    qs = random_fp32_rows(case, [(n, case.num_local_experts) for n in N], salt=3)

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case, ranks_per_domain=ranks_per_domain, transport=transport)
        assert buf.transport == ("mlx5" if transport == "auto" else transport)  # the simulated NICs are mlx5
        r = buf.dispatch(case.hidden[d], **case.dispatch_kwargs(d))
        got = snap_dispatch(r)
        c = snap_combine(buf.combine(ys[d], probs=qs[d], handle=r.handle))
        rp = buf.dispatch_with_permute(case.hidden[d], pad_multiple=4, **case.dispatch_kwargs(d))
        got_p = snap_dispatch(rp)
        cp = snap_combine(buf.combine_with_unpermute(zs[d], handle=rp.handle, pad_multiple=4))
        buf.destroy()
        return got, c, got_p, cp

    results = run_ranks(world_size, fn, ranks_per_domain=ranks_per_domain)
    exp_h = ref.combine_ref(ys, case.received, case.tokens, ranks_per_domain)
    exp_p = ref.combine_probs_ref(qs, case.received, case.tokens)
    exp_z = ref.combine_with_unpermute_ref(zs, case.permuted, case.tokens, ranks_per_domain)
    for d, (got, c, got_p, cp) in enumerate(results):
        check_received(case, d, got)
        assert_bits(c["hidden"], exp_h[d], f"rank {d} combine hidden")
        assert_bits(c["probs"], exp_p[d], f"rank {d} combine probs")
        check_permuted(case, d, got_p)
        assert_bits(cp["hidden"], exp_z[d], f"rank {d} combine_with_unpermute hidden")


def test_megatron_style_keyword_call(railyard):
    """The keyword call of Megatron Core's fused_a2a (num_of_experts_per_rank,
    fuse_permute_dispatch, non_blocking=False) and the 5-tuple unpacking."""
    case = case_for(2, False, "map", seed=3, pad_multiple=2)
    P = [pm.num_rows for pm in case.permuted]
    zs = expert_rows(case, P, salt=4)

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        kw = case.dispatch_kwargs(d)
        hidden, probs, scales, tpe, handle = buf.dispatch_with_permute(
            hidden=case.hidden[d], routing_map=kw["routing_map"], probs=kw["probs"], scaling_factor=None,
            num_of_experts_per_rank=case.num_local_experts, pad_multiple=2, num_permuted_tokens=None,
            non_blocking=False, fuse_permute_dispatch=True, handle=None)
        out = (hidden.clone(), probs.clone(), scales, tpe.clone())
        combined, combined_probs = buf.combine_with_unpermute(
            hidden=zs[d], probs=probs, handle=handle, pad_multiple=2, fuse_unpermute_combine=True)
        res = out + (combined.clone(), combined_probs.clone())
        buf.destroy()
        return res

    exp_h = ref.combine_with_unpermute_ref(zs, case.permuted, case.tokens)
    exp_p = ref.combine_probs_permuted_ref([pm.probs for pm in case.permuted], case.permuted, case.tokens)
    for d, (hidden, probs, scales, tpe, combined, cprobs) in enumerate(run_ranks(2, fn)):
        pm = case.permuted[d]
        assert_bits(hidden, pm.hidden, f"rank {d} hidden")
        assert_bits(probs, pm.probs, f"rank {d} probs")
        assert scales is None
        assert_bits(tpe, pm.tokens_per_expert, f"rank {d} tokens_per_expert")
        assert_bits(combined, exp_h[d], f"rank {d} combined")
        # the permuted probs sent back land on the chosen cells: the dispatched probs
        assert_bits(cprobs, exp_p[d], f"rank {d} combined probs")
        assert_bits(cprobs, case.routings[d].probs, f"rank {d} combined probs == router probs")


@pytest.mark.parametrize("world_size", [1, 4])
def test_every_rank_without_tokens(railyard, world_size):
    case = case_for(world_size, False, "topk", seed=2, tokens=[0] * world_size)
    for rc in case.received:
        assert rc.num_rows == 0

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        r = buf.dispatch(case.hidden[d], **case.dispatch_kwargs(d))
        got = snap_dispatch(r)
        c = snap_combine(buf.combine(r.hidden, probs=r.probs, handle=r.handle))
        rp = buf.dispatch_with_permute(case.hidden[d], **case.dispatch_kwargs(d))
        gotp = snap_dispatch(rp)
        cp = snap_combine(buf.combine_with_unpermute(rp.hidden, probs=rp.probs, handle=rp.handle))
        buf.destroy()
        return got, c, gotp, cp

    for d, (got, c, gotp, cp) in enumerate(run_ranks(world_size, fn)):
        check_received(case, d, got)
        check_permuted(case, d, gotp)
        assert tuple(c["hidden"].shape) == (0, case.hidden_dim)
        assert tuple(cp["hidden"].shape) == (0, case.hidden_dim)
        assert tuple(c["probs"].shape) == (0, case.num_experts)


@pytest.mark.parametrize("chunk_rows", [1, 3])
def test_chunk_rows_do_not_change_results(railyard, chunk_rows):
    case = case_for(4, False, "topk", seed=5, pad_multiple=4)
    P = [pm.num_rows for pm in case.permuted]
    zs = expert_rows(case, P, salt=4)

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case, dispatch_chunk_rows=chunk_rows, combine_chunk_rows=chunk_rows)
        r = buf.dispatch_with_permute(case.hidden[d], pad_multiple=4, **case.dispatch_kwargs(d))
        got = snap_dispatch(r)
        c = snap_combine(buf.combine_with_unpermute(zs[d], handle=r.handle, pad_multiple=4))
        return got, c

    results = run_ranks(4, fn)
    exp_h = ref.combine_with_unpermute_ref(zs, case.permuted, case.tokens)
    for d, (got, c) in enumerate(results):
        check_permuted(case, d, got)
        assert_bits(c["hidden"], exp_h[d], f"rank {d} combine_with_unpermute hidden, chunks of {chunk_rows}")


def test_negative_chunk_rows_are_refused(railyard):
    with pytest.raises(ValueError, match="dispatch_chunk_rows is -2"):
        run_ranks(1, lambda group: make_buffer(group, case_for(1, False, "map", 0), dispatch_chunk_rows=-2))


def test_nccl_comm_is_found_where_torch_exposes_it(railyard):
    """transport="gin" on GPUs takes the process group's NCCL communicator
    (ProcessGroupNCCL._comm_ptr); any group that has none gives None, never an error."""
    from railyard._torch_group import nccl_comm_of

    class Backend:
        def __init__(self, ptr):
            self.ptr = ptr

        def _comm_ptr(self):
            if isinstance(self.ptr, Exception):
                raise self.ptr
            return self.ptr

    class Group:
        def __init__(self, backend):
            self.backend = backend

        def _get_backend(self, device):
            if self.backend is None:
                raise RuntimeError("no backend for this device")
            return self.backend

    device = torch.device("cuda", 0)
    assert nccl_comm_of(Group(Backend(0x7F00_1234_5000)), device) == 0x7F00_1234_5000
    assert nccl_comm_of(Group(Backend(0)), device) is None  # not made yet
    assert nccl_comm_of(Group(Backend(RuntimeError("communicator not initialized"))), device) is None
    assert nccl_comm_of(Group(object()), device) is None  # gloo: no _comm_ptr
    assert nccl_comm_of(Group(None), device) is None
    assert nccl_comm_of(object(), device) is None  # not a ProcessGroup


def test_nccl_comm_is_checked(railyard):
    def fn(group):
        with pytest.raises(ValueError, match="nccl_comm is -5; expected an ncclComm_t as a positive int"):
            railyard.Buffer(group, 64, 8, 1, nccl_comm=-5)
        return True

    assert all(run_ranks(1, fn))


def test_transport_is_checked(railyard):
    """transport names one of the transports (docs/python-api.md), on every rank."""

    def fn(group):
        with pytest.raises(ValueError, match="transport is 'efa'; expected 'auto', 'mlx5' or 'gin'"):
            railyard.Buffer(group, 64, 8, 1, transport="efa")
        return True

    assert all(run_ranks(2, fn))
