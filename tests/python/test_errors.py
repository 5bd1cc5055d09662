"""Bad input (docs/python-api.md "Errors"): ValueError or TypeError whose message names
the argument. Every rank makes the same bad call (methods are collectives); after all
of them the buffers still dispatch and combine correctly.

The calls run once on two simulated ranks (module fixture); each case is a test of its
own that looks up what its call raised.
"""

import pytest
import torch

import reference as ref
from helpers import assert_bits, make_buffer, make_case, run_ranks

H = 128
MAXT = 8
EL = 2
WORLD = 2
E = WORLD * EL
T = 4
MAX_TOP_K = 3


def bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


def good_map(t=T, e=E):
    m = torch.zeros(t, e, dtype=torch.bool)
    m[:, 0] = True
    m[:, e - 1] = True
    return m


def good_topk(t=T, k=2):
    idx = torch.tensor([[0, E - 1]] * t, dtype=torch.int64)[:, :k]
    return idx, torch.rand(t, k)


def noncontig(t, h):
    return bf16(h, t).t()  # [t, h] with strides (1, t)


# name -> (call(buf, fp8buf, state) performing the bad call, argument names the message
# may use; the first is the argument the call gets wrong)
CASES = {
    "hidden_dtype_fp32": (lambda b, f, s: b.dispatch(torch.randn(T, H), routing_map=good_map()), ["hidden"]),
    "hidden_dtype_fp16": (lambda b, f, s: b.dispatch(torch.randn(T, H).half(), routing_map=good_map()), ["hidden"]),
    "hidden_wrong_width": (lambda b, f, s: b.dispatch(bf16(T, H + 128), routing_map=good_map()), ["hidden"]),
    "hidden_1d": (lambda b, f, s: b.dispatch(bf16(H), routing_map=good_map()), ["hidden"]),
    "hidden_noncontiguous": (lambda b, f, s: b.dispatch(noncontig(T, H), routing_map=good_map()), ["hidden"]),
    "hidden_meta_device": (lambda b, f, s: b.dispatch(bf16(T, H).to("meta"), routing_map=good_map()), ["hidden"]),
    "too_many_tokens": (lambda b, f, s: b.dispatch(bf16(MAXT + 1, H), routing_map=good_map(MAXT + 1)),
                        ["hidden", "max_num_of_tokens_per_rank"]),
    "routing_map_dtype": (lambda b, f, s: b.dispatch(bf16(T, H), routing_map=good_map().to(torch.uint8)), ["routing_map"]),
    "routing_map_width": (lambda b, f, s: b.dispatch(bf16(T, H), routing_map=good_map(T, E + 1)), ["routing_map"]),
    "routing_map_rows": (lambda b, f, s: b.dispatch(bf16(T, H), routing_map=good_map(T + 1)), ["routing_map"]),
    "routing_map_noncontiguous": (lambda b, f, s: b.dispatch(bf16(T, H), routing_map=good_map(T, 2 * E)[:, ::2]), ["routing_map"]),
    "probs_dtype": (lambda b, f, s: b.dispatch(bf16(T, H), routing_map=good_map(), probs=torch.rand(T, E).to(torch.bfloat16)), ["probs"]),
    "probs_shape": (lambda b, f, s: b.dispatch(bf16(T, H), routing_map=good_map(), probs=torch.rand(T, E - 1)), ["probs"]),
    "probs_meta_device": (lambda b, f, s: b.dispatch(bf16(T, H), routing_map=good_map(), probs=torch.rand(T, E, device="meta")), ["probs"]),
    "topk_idx_dtype": (lambda b, f, s: b.dispatch(bf16(T, H), topk_idx=good_topk()[0].int()), ["topk_idx"]),
    "topk_idx_too_large": (lambda b, f, s: b.dispatch(bf16(T, H), topk_idx=torch.full((T, 1), E, dtype=torch.int64)), ["topk_idx"]),
    "topk_idx_below_minus_one": (lambda b, f, s: b.dispatch(bf16(T, H), topk_idx=torch.full((T, 1), -2, dtype=torch.int64)), ["topk_idx"]),
    "topk_idx_duplicate": (lambda b, f, s: b.dispatch(bf16(T, H), topk_idx=torch.tensor([[1, 1]] * T)), ["topk_idx"]),
    "topk_idx_over_max_top_k": (lambda b, f, s: b.dispatch(bf16(T, H), topk_idx=torch.tensor([[0, 1, 2, 3]] * T)), ["topk_idx", "max_top_k"]),
    "topk_weights_shape": (lambda b, f, s: b.dispatch(bf16(T, H), topk_idx=good_topk()[0], topk_weights=torch.rand(T, 3)), ["topk_weights"]),
    "topk_weights_dtype": (lambda b, f, s: b.dispatch(bf16(T, H), topk_idx=good_topk()[0], topk_weights=torch.rand(T, 2).double()), ["topk_weights"]),
    "no_routing": (lambda b, f, s: b.dispatch(bf16(T, H)), ["routing_map", "topk_idx"]),
    "both_routing_forms": (lambda b, f, s: b.dispatch(bf16(T, H), routing_map=good_map(), topk_idx=good_topk()[0]), ["routing_map", "topk_idx"]),
    "num_recv_tokens_negative": (lambda b, f, s: b.dispatch(bf16(T, H), routing_map=good_map(), num_recv_tokens=-1), ["num_recv_tokens"]),
    "fp8_without_scales": (lambda b, f, s: f.dispatch(torch.zeros(T, H, dtype=torch.float8_e4m3fn), routing_map=good_map()), ["scaling_factor"]),
    "fp8_scales_shape": (lambda b, f, s: f.dispatch(torch.zeros(T, H, dtype=torch.float8_e4m3fn), routing_map=good_map(),
                                                    scaling_factor=torch.ones(T, H // 128 + 1)), ["scaling_factor"]),
    "fp8_scales_dtype": (lambda b, f, s: f.dispatch(torch.zeros(T, H, dtype=torch.float8_e4m3fn), routing_map=good_map(),
                                                    scaling_factor=torch.ones(T, H // 128, dtype=torch.float64)), ["scaling_factor"]),
    "bf16_into_fp8_buffer": (lambda b, f, s: f.dispatch(bf16(T, H), routing_map=good_map(), scaling_factor=torch.ones(T, 1)), ["hidden"]),
    "permute_non_blocking_without_bound": (lambda b, f, s: b.dispatch_with_permute(bf16(T, H), routing_map=good_map(), non_blocking=True),
                                           ["num_permuted_tokens"]),
    "permute_experts_per_rank_mismatch": (lambda b, f, s: b.dispatch_with_permute(bf16(T, H), routing_map=good_map(), num_of_experts_per_rank=EL + 1),
                                          ["num_of_experts_per_rank"]),
    "permute_pad_multiple_zero": (lambda b, f, s: b.dispatch_with_permute(bf16(T, H), routing_map=good_map(), pad_multiple=0), ["pad_multiple"]),
    "permute_bound_negative": (lambda b, f, s: b.dispatch_with_permute(bf16(T, H), routing_map=good_map(), num_permuted_tokens=-1, non_blocking=True),
                               ["num_permuted_tokens"]),
    "combine_hidden_dtype": (lambda b, f, s: b.combine(torch.zeros(s["rows"], H), handle=s["handle"]), ["hidden"]),
    "combine_hidden_rows": (lambda b, f, s: b.combine(bf16(s["rows"] + 1, H), handle=s["handle"]), ["hidden"]),
    "combine_hidden_width": (lambda b, f, s: b.combine(bf16(s["rows"], H // 2), handle=s["handle"]), ["hidden"]),
    "combine_hidden_noncontiguous": (lambda b, f, s: b.combine(noncontig(s["rows"], H), handle=s["handle"]), ["hidden"]),
    "combine_probs_shape": (lambda b, f, s: b.combine(bf16(s["rows"], H), probs=torch.rand(s["rows"], EL + 1), handle=s["handle"]), ["probs"]),
    "combine_without_handle": (lambda b, f, s: b.combine(bf16(s["rows"], H)), ["handle"]),
    "unpermute_probs_shape": (lambda b, f, s: b.combine_with_unpermute(bf16(s["prows"], H), probs=torch.rand(s["prows"], 2),
                                                                       handle=s["phandle"]), ["probs"]),
    "hidden_list": (lambda b, f, s: b.dispatch(bf16(T, H).tolist(), routing_map=good_map()), ["hidden"]),
    "routing_map_list": (lambda b, f, s: b.dispatch(bf16(T, H), routing_map=good_map().tolist()), ["routing_map"]),
    "permute_hidden_list": (lambda b, f, s: b.dispatch_with_permute(bf16(T, H).tolist(), routing_map=good_map()), ["hidden"]),
    "combine_hidden_list": (lambda b, f, s: b.combine(bf16(s["rows"], H).tolist(), handle=s["handle"]), ["hidden"]),
    "unpermute_hidden_dtype": (lambda b, f, s: b.combine_with_unpermute(torch.zeros(s["prows"], H), handle=s["phandle"]), ["hidden"]),
}


@pytest.fixture(scope="module")
def outcomes():
    from helpers import import_railyard

    railyard = import_railyard()
    case = make_case(WORLD, hidden_dim=H, max_tokens=MAXT, num_local_experts=EL, tokens=[5, 3], seed=90, top_k=MAX_TOP_K)

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case, max_top_k=MAX_TOP_K)
        fbuf = railyard.Buffer(group, hidden_dim=H, max_num_of_tokens_per_rank=MAXT, num_local_experts=EL, use_fp8=True)
        torch.manual_seed(1)  # the same bad input on every rank
        r0 = buf.dispatch(case.hidden[d], **case.dispatch_kwargs(d))
        p0 = buf.dispatch_with_permute(case.hidden[d], **case.dispatch_kwargs(d))
        state = {"handle": r0.handle, "rows": r0.hidden.shape[0], "phandle": p0.handle, "prows": p0.hidden.shape[0]}
        got = {}
        for name, (call, _) in CASES.items():
            try:
                call(buf, fbuf, state)
                got[name] = None
            except Exception as exc:  # noqa: BLE001 - the type is checked by the test
                got[name] = (type(exc), str(exc))
        # still usable
        r = buf.dispatch(case.hidden[d], **case.dispatch_kwargs(d))
        after = (r.hidden.clone(), buf.combine(r.hidden, handle=r.handle).hidden.clone())
        fbuf.destroy()
        buf.destroy()
        return got, after

    return case, run_ranks(WORLD, fn)


@pytest.mark.parametrize("name", list(CASES))
def test_bad_argument_is_named(outcomes, name):
    _, results = outcomes
    names = CASES[name][1]
    for d, (got, _) in enumerate(results):
        res = got[name]
        assert res is not None, f"rank {d}: {name} did not raise"
        typ, msg = res
        assert issubclass(typ, (ValueError, TypeError)), f"rank {d}: {name} raised {typ.__name__}: {msg}"
        assert any(n in msg for n in names), f"rank {d}: {name}: message does not name {names[0]!r}: {msg}"


@pytest.mark.parametrize("name", [n for n in CASES if n.endswith("_list")])
def test_non_tensor_is_a_type_error(outcomes, name):
    """A list where a tensor belongs: TypeError naming the argument and torch.Tensor."""
    for d, (got, _) in enumerate(outcomes[1]):
        typ, msg = got[name]
        assert typ is TypeError and "torch.Tensor" in msg and "list" in msg, f"rank {d}: {name}: {typ.__name__}: {msg}"


@pytest.mark.parametrize("group", [object(), None, 4])
def test_buffer_group_of_wrong_type(railyard, group):
    with pytest.raises(TypeError, match=r"group is a .*; expected a torch\.distributed\.ProcessGroup"):
        railyard.Buffer(group, hidden_dim=H, max_num_of_tokens_per_rank=MAXT, num_local_experts=EL)


def test_buffer_still_works_after_errors(outcomes):
    case, results = outcomes
    sums = ref.combine_ref([rc.hidden for rc in case.received], case.received, case.tokens)
    for d, (_, (hidden, combined)) in enumerate(results):
        assert_bits(hidden, case.received[d].hidden, f"rank {d} dispatch after the errors")
        assert_bits(combined, sums[d], f"rank {d} combine after the errors")
