"""Hand-worked checks of tests/python/reference.py (no railyard needed).

The reference is what the railyard tests trust, so each of its rules (docs/semantics.md)
is pinned here with small cases worked out by hand.
"""

import pytest
import torch

import reference as ref
from helpers import bits


def bf(vals):
    return torch.tensor(vals, dtype=torch.float32).to(torch.bfloat16)


# ---------------------------------------------------------------- routing (section 3)


def test_topk_and_map_forms_normalise_to_the_same_choice():
    idx = torch.tensor([[2, -1, 0], [-1, -1, -1], [3, 1, -1]], dtype=torch.int64)
    w = torch.tensor([[0.5, 9.0, 0.25], [1.0, 2.0, 3.0], [0.0, -1.5, 7.0]])
    rt = ref.normalize_routing(4, topk_idx=idx, topk_weights=w)
    expect_map = torch.tensor([[1, 0, 1, 0], [0, 0, 0, 0], [0, 1, 0, 1]], dtype=torch.bool)
    expect_probs = torch.tensor([[0.25, 0, 0.5, 0], [0, 0, 0, 0], [0, -1.5, 0, 0.0]])
    assert torch.equal(rt.chosen, expect_map)
    assert torch.equal(bits(rt.probs), bits(expect_probs))  # the -1 slot's weight is ignored

    probs = torch.full((3, 4), 7.0)  # unchosen probs are ignored
    probs[0, 0], probs[0, 2], probs[2, 1], probs[2, 3] = 0.25, 0.5, -1.5, 0.0
    rt2 = ref.normalize_routing(4, routing_map=expect_map, probs=probs)
    assert torch.equal(rt2.chosen, expect_map)
    assert torch.equal(bits(rt2.probs), bits(expect_probs))


def test_routing_validation():
    with pytest.raises(ValueError, match="twice"):
        ref.normalize_routing(4, topk_idx=torch.tensor([[1, 1]]))
    with pytest.raises(ValueError, match="topk_idx"):
        ref.normalize_routing(4, topk_idx=torch.tensor([[4]]))
    with pytest.raises(ValueError, match="topk_idx"):
        ref.normalize_routing(4, topk_idx=torch.tensor([[-2]]))


# ---------------------------------------------------------------- dispatch (section 4)


def two_rank_example():
    """R=2, E=4 (E_local=2). Rank 0: 3 tokens, rank 1: 2 tokens.
    rank0 t0 -> {0, 3}   (rank 0 local 0, rank 1 local 1)
    rank0 t1 -> {}       (routed nowhere)
    rank0 t2 -> {0, 1}   (rank 0 locals 0 and 1)
    rank1 t0 -> {2}      (rank 1 local 0)
    rank1 t1 -> {1, 2, 3}"""
    maps = [
        torch.tensor([[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 0, 0]], dtype=torch.bool),
        torch.tensor([[0, 0, 1, 0], [0, 1, 1, 1]], dtype=torch.bool),
    ]
    probs = [torch.arange(12, dtype=torch.float32).reshape(3, 4) + 1, torch.arange(8, dtype=torch.float32).reshape(2, 4) + 101]
    hid = [bf([[1, 2], [3, 4], [5, 6]]), bf([[7, 8], [9, 10]])]
    routings = [ref.normalize_routing(4, routing_map=m, probs=p) for m, p in zip(maps, probs)]
    return hid, routings


def test_dispatch_received_layout_by_hand():
    hid, routings = two_rank_example()
    rc = ref.dispatch_ref(hid, routings, 4)
    # rank 0 holds: (0,t0) (0,t2) (1,t1)
    assert rc[0].src_rank.tolist() == [0, 0, 1] and rc[0].src_token.tolist() == [0, 2, 1]
    assert rc[0].src_rank.dtype == torch.int32 and rc[0].src_token.dtype == torch.int32
    assert rc[0].hidden.float().tolist() == [[1, 2], [5, 6], [9, 10]]
    assert rc[0].routing_map.tolist() == [[True, False], [True, True], [False, True]]
    assert rc[0].probs.tolist() == [[1, 0], [9, 10], [0, 106]]
    assert rc[0].tokens_per_expert.tolist() == [2, 2]
    # rank 1 holds: (0,t0) (1,t0) (1,t1)
    assert rc[1].src_rank.tolist() == [0, 1, 1] and rc[1].src_token.tolist() == [0, 0, 1]
    assert rc[1].hidden.float().tolist() == [[1, 2], [7, 8], [9, 10]]
    assert rc[1].routing_map.tolist() == [[False, True], [True, False], [True, True]]
    assert rc[1].probs.tolist() == [[0, 4], [103, 0], [107, 108]]
    assert rc[1].tokens_per_expert.tolist() == [2, 2]


def test_permute_by_hand_with_padding():
    hid, routings = two_rank_example()
    rc = ref.dispatch_ref(hid, routings, 4)
    pm = ref.permute_ref(rc, pad_multiple=4)
    # rank 0: expert 0 <- recv rows 0, 1 ; expert 1 <- recv rows 1, 2 ; each padded to 4
    assert pm[0].recv_row.tolist() == [0, 1, -1, -1, 1, 2, -1, -1]
    assert pm[0].tokens_per_expert.tolist() == [4, 4]
    assert pm[0].unpadded_tokens_per_expert.tolist() == [2, 2]
    assert pm[0].probs.tolist() == [1, 9, 0, 0, 10, 106, 0, 0]
    assert pm[0].hidden.float().tolist() == [[1, 2], [5, 6], [0, 0], [0, 0], [5, 6], [9, 10], [0, 0], [0, 0]]
    pm1 = ref.permute_ref(rc, pad_multiple=1)
    assert pm1[1].recv_row.tolist() == [1, 2, 0, 2]
    assert pm1[1].probs.tolist() == [103, 107, 4, 108]
    assert pm1[1].tokens_per_expert.tolist() == [2, 2]


def test_padding_rows_are_zero_bytes_and_fp8_scales_follow():
    hid, routings = two_rank_example()
    x = torch.randn(3, 128) * 3
    codes, scales = ref.quantize_fp8_rows(x)
    codes1, scales1 = ref.quantize_fp8_rows(torch.randn(2, 128))
    rc = ref.dispatch_ref([codes, codes1], routings, 4, scales=[scales, scales1])
    assert torch.equal(rc[0].hidden.view(torch.uint8), torch.stack([codes[0], codes[2], codes1[1]]).view(torch.uint8))
    assert torch.equal(bits(rc[0].scales), bits(torch.stack([scales[0], scales[2], scales1[1]])))
    pm = ref.permute_ref(rc, pad_multiple=3)
    assert pm[0].recv_row.tolist() == [0, 1, -1, 1, 2, -1]
    assert (pm[0].hidden[2].view(torch.uint8) == 0).all() and float(pm[0].scales[2, 0]) == 0.0


# ---------------------------------------------------------------- combine (section 7)


def four_rank_one_token(values):
    """Rank 0 has one token routed to every rank (E = R = len(values)); rank d's row
    of it has the value values[d] in all elements."""
    R = len(values)
    routings = [ref.normalize_routing(R, routing_map=torch.ones(1, R, dtype=torch.bool))] + [
        ref.normalize_routing(R, routing_map=torch.zeros(0, R, dtype=torch.bool)) for _ in range(R - 1)
    ]
    hid = [bf([[0.0, 0.0]])] + [torch.zeros(0, 2, dtype=torch.bfloat16) for _ in range(R - 1)]
    rc = ref.dispatch_ref(hid, routings, R)
    ys = [bf([[v, v]]) for v in values]
    return ys, rc, [1] + [0] * (R - 1)


def test_combine_sums_in_rank_order():
    # (2^25 + -2^25) + 1 = 1, whereas 1 + -2^25 rounds to -2^25 (tie to even) and the
    # sum would be 0; (2^25 + 1) + -2^25 is 0 as well. Only rank order gives 1.
    B = 2.0 ** 25
    ys, rc, T = four_rank_one_token([B, -B, 1.0])
    out = ref.combine_ref(ys, rc, T)
    assert out[0].float().tolist() == [[1.0, 1.0]]
    ys, rc, T = four_rank_one_token([1.0, -B, B])
    assert ref.combine_ref(ys, rc, T)[0].float().tolist() == [[0.0, 0.0]]


def test_combine_rounds_once_to_bf16_within_a_domain():
    # 1 + 2^-8 + 2^-8 = 1 + 2^-7 exactly in fp32, a BF16 value. Rounding after each
    # addition would give 1 (1 + 2^-8 is a tie, to even).
    e = 2.0 ** -8
    ys, rc, T = four_rank_one_token([1.0, e, e, 0.0])
    assert ref.combine_ref(ys, rc, T)[0].float().tolist() == [[1 + 2 * e] * 2]
    # Two domains of 2 ranks: domain 0's partial 1 + 2^-8 rounds to 1, then 1 + 2^-8
    # rounds to 1 again.
    assert ref.combine_ref(ys, rc, T, ranks_per_domain=2)[0].float().tolist() == [[1.0, 1.0]]
    # One rank per domain: each partial is one BF16 value, no difference from one domain.
    assert ref.combine_ref(ys, rc, T, ranks_per_domain=1)[0].float().tolist() == [[1 + 2 * e] * 2]


def test_combine_zero_sum_is_positive_zero_and_nowhere_token_is_zero():
    ys, rc, T = four_rank_one_token([-0.0, -0.0])
    out = ref.combine_ref(ys, rc, T)[0]
    assert bits(out).tolist() == [[0, 0]]  # +0, not -0
    ys, rc, T = four_rank_one_token([2.5, -2.5])
    assert bits(ref.combine_ref(ys, rc, T)[0]).tolist() == [[0, 0]]
    hid, routings = two_rank_example()
    rcs = ref.dispatch_ref(hid, routings, 4)
    ys = [torch.ones(r.num_rows, 2, dtype=torch.bfloat16) for r in rcs]
    out = ref.combine_ref(ys, rcs, [3, 2])
    assert out[0].float().tolist() == [[2, 2], [0, 0], [1, 1]]  # t1 routed nowhere
    assert out[1].float().tolist() == [[1, 1], [2, 2]]


def test_combine_with_bound_drops_rows():
    hid, routings = two_rank_example()
    rcs = ref.dispatch_ref(hid, routings, 4)
    ys = [bf([[1, 1], [2, 2], [4, 4]]), bf([[8, 8], [16, 16], [32, 32]])]
    full = ref.combine_ref(ys, rcs, [3, 2])
    assert [r[0] for r in full[0].float().tolist()] == [9, 0, 2]
    assert [r[0] for r in full[1].float().tolist()] == [16, 36]
    b2 = ref.combine_ref(ys, rcs, [3, 2], bound=2)  # drops row 2 on each rank
    assert [r[0] for r in b2[0].float().tolist()] == [9, 0, 2]
    assert [r[0] for r in b2[1].float().tolist()] == [16, 0]


def test_combine_probs_by_hand():
    hid, routings = two_rank_example()
    rcs = ref.dispatch_ref(hid, routings, 4)
    qs = [torch.tensor([[1.0, 2], [3, 4], [5, 6]]), torch.tensor([[7.0, 8], [9, 10], [11, 12]])]
    out = ref.combine_probs_ref(qs, rcs, [3, 2])
    # unchosen cells are 0 even where q is not
    assert out[0].tolist() == [[1, 0, 0, 8], [0, 0, 0, 0], [3, 4, 0, 0]]
    assert out[1].tolist() == [[0, 0, 9, 0], [0, 6, 11, 12]]
    out = ref.combine_probs_ref(qs, rcs, [3, 2], bound=1)
    assert out[0].tolist() == [[1, 0, 0, 8], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert out[1].tolist() == [[0, 0, 0, 0], [0, 0, 0, 0]]


# ---------------------------------------------------------------- unpermute (section 8)


def test_unpermute_rounds_per_rank_then_combine_rounds_again():
    # One token on both local experts of rank 0 and local expert 0 of rank 1.
    maps = [torch.tensor([[1, 1, 1, 0]], dtype=torch.bool), torch.zeros(0, 4, dtype=torch.bool)]
    routings = [ref.normalize_routing(4, routing_map=m) for m in maps]
    hid = [bf([[0.0, 0.0]]), torch.zeros(0, 2, dtype=torch.bfloat16)]
    rcs = ref.dispatch_ref(hid, routings, 4)
    pms = ref.permute_ref(rcs, pad_multiple=2)
    assert pms[0].recv_row.tolist() == [0, -1, 0, -1]
    assert pms[1].recv_row.tolist() == [0, -1]  # local 1 empty: no rows, no padding
    assert pms[1].tokens_per_expert.tolist() == [2, 0]
    e = 2.0 ** -8
    zs = [bf([[1, 1], [99, 99], [e, e], [99, 99]]), bf([[e, e], [99, 99]])]
    ys = ref.unpermute_ref(zs, pms)
    assert ys[0].float().tolist() == [[1, 1]]  # bf16(1 + 2^-8) = 1 (tie to even); padding ignored
    out = ref.combine_with_unpermute_ref(zs, pms, [1, 0])
    assert out[0].float().tolist() == [[1, 1]]  # 1 + 2^-8 again ties to 1
    # bound 2 on rank 0 keeps only permuted rows 0, 1: the 2^-8 row of expert 1 is dropped
    assert ref.unpermute_ref(zs, pms, bound=2)[0].float().tolist() == [[1, 1]]
    # bound 0: rank 0's received row has no surviving permuted row -> 0
    assert ref.unpermute_ref(zs, pms, bound=0)[0].float().tolist() == [[0, 0]]
    probs = ref.combine_probs_permuted_ref([torch.tensor([0.5, 9, 0.25, 9]), torch.tensor([2.0, 9])], pms, [1, 0])
    assert probs[0].tolist() == [[0.5, 0.25, 2.0, 0]]


# ---------------------------------------------------------------- adjoint (section 9)


def test_reference_dispatch_and_combine_are_adjoint_on_integers():
    g = torch.Generator().manual_seed(5)
    R, El, H = 3, 2, 4
    E = R * El
    Ts = [5, 0, 3]
    maps = [torch.rand(T, E, generator=g) < 0.4 for T in Ts]
    routings = [ref.normalize_routing(E, routing_map=m) for m in maps]
    xs = [torch.randint(-8, 8, (T, H), generator=g).to(torch.bfloat16) for T in Ts]
    rcs = ref.dispatch_ref(xs, routings, E)
    gs = [torch.randint(-8, 8, (r.num_rows, H), generator=g).to(torch.bfloat16) for r in rcs]
    lhs = sum((r.hidden.double() * gg.double()).sum() for r, gg in zip(rcs, gs))
    cg = ref.combine_ref(gs, rcs, Ts)
    rhs = sum((x.double() * c.double()).sum() for x, c in zip(xs, cg))
    assert float(lhs) == float(rhs)
    pms = ref.permute_ref(rcs, pad_multiple=3)
    zs = [torch.randint(-8, 8, (p.num_rows, H), generator=g).to(torch.bfloat16) for p in pms]
    lhs = sum((p.hidden.double() * z.double()).sum() for p, z in zip(pms, zs))
    cz = ref.combine_with_unpermute_ref(zs, pms, Ts)
    rhs = sum((x.double() * c.double()).sum() for x, c in zip(xs, cz))
    assert float(lhs) == float(rhs)


# ---------------------------------------------------------------- FP8 (section 10)


def test_quantize_fp8_rows():
    x = torch.zeros(2, 256)
    x[0, 0], x[0, 1], x[0, 2] = 896.0, -448.0, 1.0  # amax 896 -> scale 2
    codes, scales = ref.quantize_fp8_rows(x)
    assert scales.tolist() == [[2.0, 1.0], [1.0, 1.0]]  # all-zero blocks get scale 1
    assert codes[0, :3].float().tolist() == [448.0, -224.0, 0.5]
    assert torch.equal(ref.dequantize_fp8_rows(codes, scales)[0, :3], torch.tensor([896.0, -448.0, 1.0]))
