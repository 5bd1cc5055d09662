"""Autograd (docs/python-api.md "Autograd", docs/semantics.md section 9).

* dispatch's backward is combine on the same handle: the hidden gradient must be the
  reference combine of the received-row (or permuted-row) gradients, bit for bit (the
  summation order is fixed), and the probs / topk_weights gradient the reference probs
  combine (exact copies).
* combine's backward is dispatch on the same handle: the gradient of the expert rows
  is the reference dispatch of the output gradient (exact copies; padding rows 0).
  (combine's probs input has no gradient: the router's gradient flows through dispatch.)
* end to end, router logits -> softmax -> (map or top-k) -> dispatch -> expert scaling
  by the probs -> combine -> loss: the gradients of the hidden input and of the router
  logits against a float64 reference from the same bf16 / fp32 inputs.

Tolerances against float64 (the bitwise checks above are the strict ones):
  - a combine result is bf16(fp32 sum of n <= R rows): one rounding to BF16 (unit
    roundoff u = 2^-8, so error <= 2^-8 |s|) plus fp32 addition errors
    (<= (n-1) 2^-24 sum|x|); combine_with_unpermute rounds twice (per rank, then in
    combine): error <= 2 * 2^-8 sum|x| (1 + 2^-8) + fp32 terms. We allow 2^-6 sum|x|.
  - end to end, the expert-row gradient bf16(W * p) adds one more 2^-8 relative
    rounding per term (3 roundings in all): still within 2^-6 sum|W p|.
  - the logits gradient has no BF16 rounding: its only departures are fp32 (the H-term
    dot product W.x, the softmax in fp32): we allow 2^-14 times the magnitude of the
    row's terms, far above fp32 error (H * 2^-24 = 2^-18 for H = 64) and far below any
    real mistake (a wrong or missing expert changes it by O(1) relative).
"""

import pytest
import torch

import reference as ref
from helpers import (
    assert_bits,
    assert_within_exact,
    dispatch_grad_ref,
    exact_row_sums,
    expert_rows,
    make_buffer,
    make_case,
    random_fp32_rows,
    run_ranks,
    topk_grad_from_dense,
)

LAYOUTS = ["received", "permuted", "permuted_bounded"]


def leaf_kwargs(case, d):
    """The rank's dispatch kwargs with the probs (or topk_weights) a fresh leaf that
    requires grad; returns (kwargs, the leaf)."""
    kw = case.dispatch_kwargs(d)
    key = "probs" if case.form == "map" else "topk_weights"
    w = kw[key].clone().requires_grad_(True)
    kw[key] = w
    return kw, w


def run_dispatch(buf, case, d, layout, x, kw, bound):
    if layout == "received":
        return buf.dispatch(x, **kw)
    if layout == "permuted":
        return buf.dispatch_with_permute(x, pad_multiple=case.pad_multiple, **kw)
    return buf.dispatch_with_permute(x, pad_multiple=case.pad_multiple, num_permuted_tokens=bound, non_blocking=True, **kw)


def run_combine(buf, case, layout, y, q, handle):
    if layout == "received":
        return buf.combine(y, probs=q, handle=handle)
    return buf.combine_with_unpermute(y, probs=q, handle=handle, pad_multiple=case.pad_multiple)


def layout_rows(case, layout):
    """(full row counts, bound) of a layout for this case."""
    full = [rc.num_rows for rc in case.received] if layout == "received" else [pm.num_rows for pm in case.permuted]
    bound = max(1, sorted(full)[len(full) // 2] - 1) if layout == "permuted_bounded" else None
    return full, bound


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("form", ["map", "topk"])
def test_dispatch_backward_is_combine(railyard, world_size, layout, form):
    case = make_case(world_size, form=form, seed=50 + world_size, pad_multiple=1 if layout == "received" else 4,
                     num_local_experts=2 if world_size == 4 else 3)
    full, bound = layout_rows(case, layout)
    rows = full if bound is None else [bound] * world_size
    gh = expert_rows(case, rows, salt=8)
    gp = random_fp32_rows(case, [(n, case.num_local_experts) if layout == "received" else (n,) for n in rows], salt=9)

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        x = case.hidden[d].clone().requires_grad_(True)
        kw, w = leaf_kwargs(case, d)
        r = run_dispatch(buf, case, d, layout, x, kw, bound)
        assert tuple(r.hidden.shape) == (rows[d], case.hidden_dim)
        torch.autograd.backward([r.hidden, r.probs], [gh[d], gp[d]])
        out = (x.grad.clone(), w.grad.clone())
        buf.destroy()
        return out

    results = run_ranks(world_size, fn)
    if layout == "received":
        exp_x = ref.combine_ref(gh, case.received, case.tokens)
        exp_p = ref.combine_probs_ref(gp, case.received, case.tokens)
    else:
        exp_x = ref.combine_with_unpermute_ref(gh, case.permuted, case.tokens, bound=bound)
        exp_p = ref.combine_probs_permuted_ref(gp, case.permuted, case.tokens, bound=bound)
    exact, mag = exact_row_sums(case, gh, "received" if layout == "received" else "permuted", bound)
    for d, (gx, gw) in enumerate(results):
        assert_bits(gx, exp_x[d], f"rank {d} hidden.grad")
        assert_within_exact(gx, exact[d], mag[d], f"rank {d} hidden.grad vs float64", rel=2.0 ** -6)
        if form == "map":
            assert_bits(gw, exp_p[d], f"rank {d} probs.grad")
        else:
            idx = case.routing_kwargs[d]["topk_idx"]
            assert_bits(gw, topk_grad_from_dense(idx, exp_p[d]), f"rank {d} topk_weights.grad")


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("form", ["map", "topk"])
def test_combine_backward_is_dispatch(railyard, world_size, layout, form):
    """The expert rows' gradient. Combine's probs input carries no gradient (the
    router's gradient flows through dispatch; railyard raises when it requires grad,
    see test_combine_probs_input_requiring_grad_is_refused): probs are passed detached,
    and their presence must not change the hidden gradient."""
    case = make_case(world_size, form=form, seed=60 + world_size, pad_multiple=1 if layout == "received" else 2)
    full, bound = layout_rows(case, layout)
    rows = full if bound is None else [bound] * world_size
    ys = expert_rows(case, rows, salt=10)
    qs = random_fp32_rows(case, [(n, case.num_local_experts) if layout == "received" else (n,) for n in rows], salt=11)
    G = expert_rows(case, case.tokens, salt=12)

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        r = run_dispatch(buf, case, d, layout, case.hidden[d], case.dispatch_kwargs(d), bound)
        y = ys[d].clone().requires_grad_(True)
        c = run_combine(buf, case, layout, y, qs[d], r.handle)
        c.hidden.backward(G[d])
        out = y.grad.clone()
        buf.destroy()
        return out

    zeros = [torch.zeros(T, case.num_experts) for T in case.tokens]
    expected = dispatch_grad_ref(case, G, zeros, "received" if layout == "received" else "permuted")
    for d, gy in enumerate(run_ranks(world_size, fn)):
        kept = ref.kept_rows(full[d], bound)
        assert tuple(gy.shape) == (rows[d], case.hidden_dim), f"rank {d}: grad shape {tuple(gy.shape)}"
        assert_bits(gy[:kept], expected[d][0][:kept], f"rank {d} grad of the expert rows")


def test_combine_probs_input_requiring_grad_is_refused(railyard):
    """Not in docs/python-api.md: railyard refuses a combine probs input that requires
    grad (it has no gradient). Pinned here so a change is noticed; the error must say
    what to do."""
    case = make_case(2, seed=65)
    ys = expert_rows(case, [rc.num_rows for rc in case.received], salt=10)

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        kw, w = leaf_kwargs(case, d)
        r = buf.dispatch(case.hidden[d], **kw)
        try:
            c = buf.combine(ys[d].clone().requires_grad_(True), probs=r.probs, handle=r.handle)
            c.hidden.float().sum().backward()
            err = None
        except Exception as exc:  # noqa: BLE001
            err = exc
        buf.destroy()
        return err

    for d, err in enumerate(run_ranks(2, fn)):
        assert err is not None and "probs" in str(err), f"rank {d}: {err!r}"


def router_forward(buf, case, layout, x, logits, d):
    """Router -> dispatch -> expert (rows scaled by their probs) -> combine."""
    probs = torch.softmax(logits, dim=-1)
    kw = case.routing_kwargs[d]
    if case.form == "map":
        route = dict(routing_map=kw["routing_map"], probs=probs)
    else:
        idx = kw["topk_idx"]
        route = dict(topk_idx=idx, topk_weights=probs.gather(1, idx.clamp(min=0)))
    if layout == "received":
        r = buf.dispatch(x, **route)
        z = (r.hidden.float() * r.probs.sum(dim=1, keepdim=True)).to(torch.bfloat16)
        return buf.combine(z, handle=r.handle).hidden
    r = buf.dispatch_with_permute(x, pad_multiple=case.pad_multiple, **route)
    z = (r.hidden.float() * r.probs[:, None]).to(torch.bfloat16)
    return buf.combine_with_unpermute(z, handle=r.handle, pad_multiple=case.pad_multiple).hidden


@pytest.mark.parametrize("world_size", [2, 4])
@pytest.mark.parametrize("layout", ["received", "permuted"])
@pytest.mark.parametrize("form", ["map", "topk"])
def test_router_gradient_end_to_end(railyard, world_size, layout, form):
    case = make_case(world_size, form=form, seed=70 + world_size, pad_multiple=4)
    g = case.generator(14)
    logits = [torch.randn(T, case.num_experts, generator=g) for T in case.tokens]
    # loss weights representable in BF16, so the gradient reaching combine's output
    # (a BF16 tensor) is W exactly
    W = [torch.randn(T, case.hidden_dim, generator=g).to(torch.bfloat16).float() for T in case.tokens]

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        x = case.hidden[d].clone().requires_grad_(True)
        lg = logits[d].clone().requires_grad_(True)
        out = router_forward(buf, case, layout, x, lg, d)
        (out.float() * W[d]).sum().backward()
        res = (out.detach().clone(), x.grad.clone(), lg.grad.clone())
        buf.destroy()
        return res

    results = run_ranks(world_size, fn)
    for d, (out, gx, glg) in enumerate(results):
        # float64 reference from the same inputs
        x64 = case.hidden[d].double().requires_grad_(True)
        l64 = logits[d].double().requires_grad_(True)
        chosen = case.routings[d].chosen
        p64 = torch.softmax(l64, dim=-1) * chosen
        o64 = x64 * p64.sum(dim=1, keepdim=True)
        (o64 * W[d].double()).sum().backward()
        scale = p64.detach().sum(dim=1, keepdim=True)  # sum of the terms' factors (p >= 0)
        assert_within_exact(out, o64.detach(), x64.detach().abs() * scale, f"rank {d} forward", rel=2.0 ** -6)
        assert_within_exact(gx, x64.grad, W[d].double().abs() * scale, f"rank {d} hidden.grad", rel=2.0 ** -6)
        # logits grad: magnitude of its terms, per row: sum_h |W x| (softmax factors <= 1)
        mag = (W[d].double() * case.hidden[d].double()).abs().sum(dim=1, keepdim=True).expand_as(l64)
        assert_within_exact(glg, l64.grad, mag, f"rank {d} logits.grad", rel=2.0 ** -14)
        # the router does get a gradient (rows with a chosen expert)
        has = chosen.any(dim=1)
        if has.any():
            assert glg[has].abs().sum() > 0


def test_fp8_combine_backward_raises(railyard):
    case = make_case(2, fp8=True, hidden_dim=128, seed=80)
    ys = expert_rows(case, [rc.num_rows for rc in case.received], salt=2)

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        r = buf.dispatch(case.hidden[d], **case.dispatch_kwargs(d))
        y = ys[d].clone().requires_grad_(True)
        c = buf.combine(y, handle=r.handle)
        try:
            c.hidden.float().sum().backward()
            err = None
        except Exception as exc:  # noqa: BLE001 - the doc names no type
            err = exc
        buf.destroy()
        return err

    for d, err in enumerate(run_ranks(2, fn)):
        assert err is not None, f"rank {d}: combine backward on an FP8 buffer did not raise"
        assert "fp8" in str(err).lower(), f"rank {d}: message does not say why: {err}"
