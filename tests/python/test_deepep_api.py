"""Code written for deep_ep.HybridEPBuffer runs on railyard.megatron.HybridEPBuffer, with
DeepEP's documented behaviour (its Python API as Railyard's notes describe it):

* the attributes rank, group_size, local_rank, node_rank, num_of_nodes,
  num_of_hybrid_ep_ranks_per_nvlink_domain;
* non-permuted dispatch(hidden, scaling_factor, topk_idx, topk_weights, num_of_experts,
  probs, routing_map, ..., handle) -> (hidden, probs [N, E_local x ranks per domain],
  scaling_factor, handle) and combine(hidden, probs, handle) -> (combined, combined_probs);
* FP8 tokens as torch.uint8 as well as float8_e4m3fn; a scaling_factor with BF16
  tokens ignored; num_of_experts= and use_fp8= accepted without a warning;
* a batch larger than the buffer grows it (every rank in the same call), and handles
  of the smaller buffer stay usable.

Results are compared with the reference (reference.py), bit for bit.
"""

import warnings

import pytest
import torch

import reference as ref
from helpers import assert_bits, import_railyard, run_ranks

H = 128
EL = 2
K = 2


def inputs(world, counts, seed, fp8=False):
    E = world * EL
    g = torch.Generator().manual_seed(seed)
    xs, scales, idxs, weights = [], [], [], []
    for T in counts:
        x = torch.randint(-8, 9, (T, H), generator=g).to(torch.bfloat16)
        if fp8:
            codes, sc = ref.quantize_fp8_rows(x)
            xs.append(codes)
            scales.append(sc)
        else:
            xs.append(x)
        idxs.append(torch.rand(T, E, generator=g).topk(K, dim=1).indices)
        weights.append(torch.randint(1, 16, (T, K), generator=g).to(torch.float32) / 16)
    routings = [ref.normalize_routing(E, topk_idx=i, topk_weights=w) for i, w in zip(idxs, weights)]
    return xs, (scales if fp8 else None), idxs, weights, routings


def adapter(group, max_tokens, **kw):
    railyard = import_railyard()
    import railyard.megatron

    kw.setdefault("num_sms_dispatch_api", 2)  # small: the simulator runs every block
    kw.setdefault("num_sms_combine_api", 2)
    return railyard.megatron.HybridEPBuffer(group=group, hidden_dim=H, max_num_of_tokens_per_rank=max_tokens,
                                            num_local_experts=EL, **kw)


@pytest.fixture(autouse=True)
def no_install_floor():
    railyard = import_railyard()
    import railyard.megatron

    railyard.megatron.uninstall()  # no install() options: the adapter's own sizing
    yield


def test_attributes():
    """DeepEP derives local_rank = rank % R, node_rank = rank // R, num_of_nodes = size / R."""

    def fn(group):
        b = adapter(group, 16, nvlink_domain_size=2)
        return (b.rank, b.group_size, b.local_rank, b.node_rank, b.num_of_nodes,
                b.num_of_hybrid_ep_ranks_per_nvlink_domain)

    got = run_ranks(4, fn, ranks_per_domain=2)
    assert got == [(r, 4, r % 2, r // 2, 2, 2) for r in range(4)]


def test_attributes_follow_the_detected_domains():
    """Without nvlink_domain_size the domains are the buffer's, detected: two of two
    ranks here (num_of_nodes = 2, Megatron's count of domains)."""
    def fn(group):
        b = adapter(group, 16)
        before = b.num_of_nodes  # no buffer yet: the whole group
        x = torch.zeros(4, H, dtype=torch.bfloat16)
        idx = torch.tensor([[0, 5]] * 4, dtype=torch.int64)
        b.dispatch(x, topk_idx=idx, topk_weights=torch.full((4, K), 0.5), num_of_experts=4 * EL)
        return before, b.num_of_nodes, b.local_rank, b.node_rank

    got = run_ranks(4, fn, ranks_per_domain=2)
    assert got == [(1, 2, r % 2, r // 2) for r in range(4)]


@pytest.mark.parametrize("form", ["topk", "map"])
def test_non_permuted_dispatch_and_combine(form):
    world, counts = 2, [7, 5]
    xs, _, idxs, weights, routings = inputs(world, counts, seed=3)
    E = world * EL
    received = ref.dispatch_ref(xs, routings, E)
    ys = [rc.hidden for rc in received]

    def fn(group):
        d = group.rank()
        b = adapter(group, 16)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # num_of_experts is DeepEP's: no "has no effect" warning
            if form == "topk":
                out = b.dispatch(xs[d], topk_idx=idxs[d], topk_weights=weights[d], num_of_experts=E)
            else:
                out = b.dispatch(xs[d], routing_map=routings[d].chosen, probs=routings[d].probs, num_of_experts=E)
        hid, probs, sf, handle = out
        c_hidden, c_probs = b.combine(hid, probs=probs, handle=handle)
        return hid.clone(), probs.clone(), sf, c_hidden.clone(), c_probs.clone()

    exp_h = ref.combine_ref(ys, received, counts)
    exp_p = ref.combine_probs_ref([rc.probs for rc in received], received, counts)
    for d, (hid, probs, sf, c_hidden, c_probs) in enumerate(run_ranks(world, fn)):
        rc = received[d]
        assert_bits(hid, rc.hidden, f"rank {d} dispatched hidden")
        assert sf is None
        # DeepEP's probs: [N, E_local x ranks per domain], this rank's experts' columns set.
        want = torch.zeros(rc.hidden.shape[0], EL * world)
        want[:, d * EL:(d + 1) * EL] = rc.probs
        assert_bits(probs, want, f"rank {d} dispatched probs (domain columns)")
        assert_bits(c_hidden, exp_h[d], f"rank {d} combined hidden")
        assert_bits(c_probs, exp_p[d], f"rank {d} combined probs")


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float8_e4m3fn], ids=["uint8", "float8"])
@pytest.mark.parametrize("permuted", [False, True], ids=["dispatch", "dispatch_with_permute"])
def test_fp8_tokens_as_uint8_or_float8(dtype, permuted):
    world, counts = 2, [6, 4]
    xs, scales, idxs, weights, routings = inputs(world, counts, seed=5, fp8=True)
    E = world * EL
    received = ref.dispatch_ref(xs, routings, E, scales=scales)
    perm = ref.permute_ref(received)

    def fn(group):
        d = group.rank()
        b = adapter(group, 16, use_fp8=True)
        x = xs[d].view(dtype)
        if permuted:
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # use_fp8= and num_of_experts= are DeepEP's
                hid, _, sf, tpe, _ = b.dispatch_with_permute(hidden=x, scaling_factor=scales[d], topk_idx=idxs[d],
                                                             topk_weights=weights[d], num_of_experts=E, use_fp8=True)
        else:
            hid, _, sf, _ = b.dispatch(x, scaling_factor=scales[d], topk_idx=idxs[d], topk_weights=weights[d])
        return hid.clone(), sf.clone()

    for d, (hid, sf) in enumerate(run_ranks(world, fn)):
        want = perm[d] if permuted else received[d]
        assert hid.dtype == dtype, f"rank {d}: tokens come back as {hid.dtype}; expected {dtype} (as given)"
        assert_bits(hid.view(torch.float8_e4m3fn), want.hidden, f"rank {d} FP8 rows")
        assert_bits(sf, want.scales, f"rank {d} scaling factors")


def test_scaling_factor_ignored_with_bf16_tokens():
    world, counts = 2, [5, 6]
    xs, _, idxs, weights, routings = inputs(world, counts, seed=8)
    perm = ref.permute_ref(ref.dispatch_ref(xs, routings, world * EL))

    def fn(group):
        d = group.rank()
        b = adapter(group, 16)
        junk = torch.ones(counts[d], H // 128)
        hid, probs, sf, tpe, _ = b.dispatch_with_permute(hidden=xs[d], scaling_factor=junk, topk_idx=idxs[d],
                                                         topk_weights=weights[d])
        return hid.clone(), sf, tpe.clone()

    for d, (hid, sf, tpe) in enumerate(run_ranks(world, fn)):
        assert_bits(hid, perm[d].hidden, f"rank {d} rows")
        assert sf is None
        assert_bits(tpe, perm[d].tokens_per_expert, f"rank {d} tokens_per_expert")


def test_use_fp8_mismatch_names_the_argument():
    def fn(group):
        b = adapter(group, 16)
        with pytest.raises(ValueError, match="use_fp8 is True; expected False"):
            b.dispatch_with_permute(hidden=torch.zeros(2, H, dtype=torch.bfloat16), use_fp8=True,
                                    topk_idx=torch.zeros(2, 1, dtype=torch.int64))
        with pytest.raises(ValueError, match="num_of_experts is 5; expected 4"):
            b.dispatch(torch.zeros(2, H, dtype=torch.bfloat16), topk_idx=torch.zeros(2, 1, dtype=torch.int64),
                       num_of_experts=5)

    run_ranks(2, fn)


def test_capacity_is_deepeps_and_grows():
    """DeepEP sizes max-tokens to at least 512, a multiple of 64, and grows it (never
    shrinks) when a batch is larger. Every rank grows in the same call; a handle of the
    smaller buffer still combines afterwards."""
    world = 2
    small = inputs(world, [40, 30], seed=11)
    big = inputs(world, [700, 700], seed=12)  # past 512 on every rank (as with Megatron's padding)
    E = world * EL

    def fn(group):
        d = group.rank()
        b = adapter(group, 40)
        cap0 = b.max_num_of_tokens_per_rank
        first = b.dispatch_with_permute(hidden=small[0][d], topk_idx=small[2][d], topk_weights=small[3][d])
        second = b.dispatch_with_permute(hidden=big[0][d], topk_idx=big[2][d], topk_weights=big[3][d])
        cap1 = b.max_num_of_tokens_per_rank
        c_old = b.combine_with_unpermute(hidden=first[0], handle=first[4])[0]  # the smaller buffer's handle
        c_new = b.combine_with_unpermute(hidden=second[0], handle=second[4])[0]
        b.destroy()
        return cap0, cap1, second[0].clone(), c_old.clone(), c_new.clone()

    results = run_ranks(world, fn)
    recv_small = ref.dispatch_ref(small[0], small[4], E)
    recv_big = ref.dispatch_ref(big[0], big[4], E)
    perm_big = ref.permute_ref(recv_big)
    # combine_with_unpermute of the dispatched rows themselves: each token's rows summed
    z_small = ref.permute_ref(recv_small)
    exp_old = ref.combine_with_unpermute_ref([p.hidden for p in z_small], z_small, [40, 30])
    exp_new = ref.combine_with_unpermute_ref([p.hidden for p in perm_big], perm_big, [700, 700])
    for d, (cap0, cap1, hid, c_old, c_new) in enumerate(results):
        assert (cap0, cap1) == (512, 704), f"rank {d}: capacities {cap0}, {cap1}"
        assert_bits(hid, perm_big[d].hidden, f"rank {d} rows after growing")
        assert_bits(c_old, exp_old[d], f"rank {d} combine with the smaller buffer's handle")
        assert_bits(c_new, exp_new[d], f"rank {d} combine after growing")


def test_growth_on_some_ranks_only_fails_every_rank_at_once():
    """A batch past the capacity on rank 0 only: rank 0 would create a larger buffer
    (a collective) while rank 1 dispatches on the old one. Neither waits for a budget:
    rank 0's barrier and rank 1's dispatch differ, so both fail with the same report,
    rank 0's naming its batch and the capacity: railyard.AbortedError on both, no
    TimeoutError."""
    world = 2
    small = inputs(world, [40, 30], seed=13)
    skewed = inputs(world, [700, 30], seed=14)
    failures = [None] * world

    def fn(group):
        d = group.rank()
        b = adapter(group, 40)
        b.dispatch_with_permute(hidden=small[0][d], topk_idx=small[2][d], topk_weights=small[3][d])
        try:
            b.dispatch_with_permute(hidden=skewed[0][d], topk_idx=skewed[2][d], topk_weights=skewed[3][d])
        except Exception as e:
            failures[d] = (type(e).__name__, str(e))
            raise

    with pytest.raises(import_railyard().AbortedError):
        run_ranks(world, fn)
    for d, failure in enumerate(failures):
        assert failure is not None, f"rank {d}: the skewed dispatch succeeded"
        kind, message = failure
        assert kind == "AbortedError", f"rank {d}: {kind}: {message}"
        assert "the ranks run different operations: rank 1 runs kind 0, rank 0 kind 3" in message, \
            f"rank {d}: {message}"
    assert "batch of 700 tokens exceeds the buffer's capacity of 512" in failures[0][1], failures[0][1]
