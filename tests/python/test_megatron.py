"""Megatron Core's own "hybridep" code running on Railyard (railyard.megatron), in the
CPU simulator, checked against the pure-torch reference (reference.py).

What runs is Megatron's, unmodified: ``fused_a2a.HybridEPDispatch`` /
``HybridEPCombine`` (forward, and backward through torch.autograd), the module-global
buffer they create, ``token_dispatcher._HybridEPManager`` (setup_metadata / dispatch /
combine) driven through the ``hybrid_ep_dispatch`` / ``hybrid_ep_combine`` that
``railyard.megatron.install()`` defines, and ``MoEFlexTokenDispatcher`` built from a
real TransformerConfig with the hybridep backend. Values are small integers (hidden) and
multiples of 1/16 (probs), so every sum is exact and results are compared bitwise.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import types
import warnings

import pytest
import torch

pytest.importorskip(
    "megatron.core",
    reason="megatron-core is not installed (pip install megatron-core); the Megatron drop-in cannot be tested",
)

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # Megatron warns about missing Transformer Engine / Apex
    from megatron.core.transformer.moe import fused_a2a, token_dispatcher

try:
    import railyard
    import railyard.megatron
    import railyard.sim
except Exception as exc:  # ImportError, or a missing compiled module (as helpers.import_railyard)
    pytest.skip(f"railyard not importable: {exc!r}", allow_module_level=True)

from reference import (
    combine_probs_permuted_ref,
    combine_with_unpermute_ref,
    dispatch_ref,
    kept_tokens_per_expert,
    normalize_routing,
    permute_ref,
)

H = 64  # hidden
EL = 2  # local experts per rank
K = 2  # top-k
SMS = 2  # blocks per dispatch / combine: small, the simulator runs every block
MAX_TOKENS = 32
COUNTS = {2: [12, 16], 4: [12, 16, 0, 9]}  # unequal token counts, one rank with none


@pytest.fixture(autouse=True)
def megatron_on_railyard():
    # Megatron sizes its buffer from the first batch of whichever rank creates it; the
    # token counts differ between ranks here, so give the capacity explicitly.
    railyard.megatron.install(max_num_of_tokens_per_rank=MAX_TOKENS)
    fused_a2a.reset_hybrid_ep_buffer()
    yield
    fused_a2a.reset_hybrid_ep_buffer()


# --------------------------------------------------------------------------- data


def make_rank_inputs(world, counts, seed):
    """Per rank: hidden bf16 [T, H] (small ints), routing_map bool [T, E] (top-K of random
    scores), probs fp32 [T, E] (multiples of 1/16; junk where not routed)."""
    E = world * EL
    g = torch.Generator().manual_seed(seed)
    xs, maps, probs = [], [], []
    for r in range(world):
        T = counts[r]
        xs.append(torch.randint(-4, 5, (T, H), generator=g).to(torch.bfloat16))
        idx = torch.rand(T, E, generator=g).topk(K, dim=1).indices
        m = torch.zeros(T, E, dtype=torch.bool)
        m.scatter_(1, idx, True)
        maps.append(m)
        probs.append(torch.randint(1, 16, (T, E), generator=g).to(torch.float32) / 16)
    return xs, maps, probs


def grad_out(rank, T):
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randint(-3, 4, (T, H), generator=g).to(torch.bfloat16)


def expert_factor(rank, local_expert):
    """The "expert" multiplies its rows by a per-(rank, expert) integer."""
    return (local_expert + 1 + 2 * rank).to(torch.bfloat16)


def prob_weight(rank, local_expert):
    """Loss weight of a dispatched prob: a per-(rank, expert) multiple of 1/4."""
    return (local_expert.to(torch.float32) + 1) * 0.25 + rank


def local_expert_of_rows(tokens_per_expert, rows):
    """Local expert of each of the first sum(tokens_per_expert) rows, then -1 (rows past
    the true count in bounded mode)."""
    le = torch.repeat_interleave(torch.arange(EL), tokens_per_expert.to(torch.int64).cpu())
    out = torch.full((rows,), -1, dtype=torch.int64)
    n = min(rows, le.numel())
    out[:n] = le[:n]
    return out


def expected(world, counts, xs, maps, probs, pad_multiple=None, bound=None, ranks_per_domain=None):
    """Reference of one forward + backward of the test's tiny MoE layer (combine rounds
    each NVLink domain's partial to BF16 when the group spans several)."""
    E = world * EL
    routings = [normalize_routing(E, routing_map=maps[r], probs=probs[r]) for r in range(world)]
    perm = permute_ref(dispatch_ref(xs, routings, E), pad_multiple or 1)
    zs = [perm[d].hidden * expert_factor(d, perm[d].local_expert)[:, None] for d in range(world)]
    combined = combine_with_unpermute_ref(zs, perm, counts, ranks_per_domain, bound=bound)
    # d loss / d x: combine's backward is a dispatch of grad_out on the same routing,
    # times the expert factor, then dispatch's backward (combine with unpermute).
    gouts = [grad_out(r, counts[r]) for r in range(world)]
    gperm = permute_ref(dispatch_ref(gouts, routings, E), pad_multiple or 1)
    gz = [gperm[d].hidden * expert_factor(d, gperm[d].local_expert)[:, None] for d in range(world)]
    xgrad = combine_with_unpermute_ref(gz, perm, counts, ranks_per_domain, bound=bound)
    # d loss / d probs: the probs combine of the loss weights of the dispatched probs.
    qs = [prob_weight(d, perm[d].local_expert) for d in range(world)]
    pgrad = combine_probs_permuted_ref(qs, perm, counts, bound=bound)
    return perm, combined, xgrad, pgrad


def check_rank(d, got, perm, combined, xgrad, pgrad, bound=None):
    pm = perm[d]
    P = pm.num_rows
    kept = P if bound is None else min(P, bound)
    assert got["rows"] == (P if bound is None else bound), f"rank {d}: rows"
    # the rows kept per expert (with a bound that dropped rows, fewer than the true counts)
    assert torch.equal(got["tokens_per_expert"], kept_tokens_per_expert(pm, bound)), f"rank {d}: tokens_per_expert"
    assert got["tokens_per_expert"].dtype == torch.int64
    assert torch.equal(got["hidden"][:kept], pm.hidden[:kept]), f"rank {d}: dispatched hidden"
    assert got["probs"].dtype == torch.float32
    assert torch.equal(got["probs"][:kept], pm.probs[:kept]), f"rank {d}: dispatched probs"
    assert torch.equal(got["combined"], combined[d]), f"rank {d}: combined"
    assert torch.equal(got["xgrad"], xgrad[d]), f"rank {d}: grad of x"
    assert torch.equal(got["pgrad"], pgrad[d]), f"rank {d}: grad of probs"
    assert got["overflow"] == int(bound is not None and P > bound), f"rank {d}: overflow flag"


def moe_layer(rank, x, dispatched, dispatched_probs, tokens_per_expert, combine):
    """The test's expert computation and loss, identical on every rank."""
    rows = dispatched.shape[0]
    le = local_expert_of_rows(tokens_per_expert, rows)
    valid = le >= 0
    factor = torch.zeros(rows, dtype=torch.bfloat16)
    factor[valid] = expert_factor(rank, le[valid])
    y = dispatched * factor[:, None]
    combined = combine(y)
    weight = torch.zeros(rows, dtype=torch.float32)
    weight[valid] = prob_weight(rank, le[valid])
    n = int(valid.sum())  # rows past the true count (bounded mode) are unwritten: leave them out
    loss = (combined.float() * grad_out(rank, x.shape[0]).float()).sum() + (dispatched_probs[:n] * weight[:n]).sum()
    loss.backward()
    return combined, n


# --------------------------------------------------------------------------- Megatron's autograd functions


def dispatch_apply(*args, **kwargs):
    """HybridEPDispatch.apply with keyword arguments: its positional order changed
    (0.19 inserts num_blocks_permute, num_blocks_unpermute and fused before
    num_permuted_tokens), so bind them to the installed version's forward()."""
    import inspect

    params = list(inspect.signature(fused_a2a.HybridEPDispatch.forward).parameters.values())[1:]  # drop ctx
    bound = inspect.Signature(params).bind(*args, **kwargs)
    bound.apply_defaults()
    return fused_a2a.HybridEPDispatch.apply(*bound.args)


def run_autograd_functions(world, counts, seed, pad_multiple=None, bound=None, ranks_per_domain=None):
    xs, maps, probs = make_rank_inputs(world, counts, seed)

    def fn(group):
        r = group.rank()
        assert group.size() == world
        x = xs[r].clone().requires_grad_()
        p = probs[r].clone().requires_grad_()
        hid, dprobs, scales, tpe, handle = dispatch_apply(
            x, maps[r], p, group, EL, num_sms_dispatch_api=SMS, num_sms_combine_api=SMS,
            num_permuted_tokens=bound, pad_multiple=pad_multiple)
        assert scales is None
        combined, n = moe_layer(
            r, x, hid, dprobs, tpe,
            lambda y: fused_a2a.HybridEPCombine.apply(y, handle, bound, pad_multiple))
        assert x.grad is not None and p.grad is not None
        return dict(rows=hid.shape[0], hidden=hid.detach().clone(), probs=dprobs.detach().clone(),
                    tokens_per_expert=tpe.clone(), combined=combined.detach().clone(),
                    xgrad=x.grad.clone(), pgrad=p.grad.clone(), overflow=int(handle.overflow))

    got = railyard.sim.run(world_size=world, fn=fn, ranks_per_domain=ranks_per_domain or world, seed=seed)
    perm, combined, xgrad, pgrad = expected(world, counts, xs, maps, probs, pad_multiple, bound, ranks_per_domain)
    for d in range(world):
        check_rank(d, got[d], perm, combined, xgrad, pgrad, bound)
    return perm


@pytest.mark.parametrize("pad_multiple,transport", [(None, None), (16, None), (None, "gin")])
def test_autograd_functions_across_nvlink_domains(pad_multiple, transport):
    """Two NVLink domains of two ranks (detected, no option): Megatron's functions run
    the hierarchical path, forward and backward, bit for bit; install(transport=...)
    reaches the buffers (the GIN lane)."""
    railyard.megatron.install(max_num_of_tokens_per_rank=MAX_TOKENS, transport=transport)
    run_autograd_functions(4, COUNTS[4], seed=9, pad_multiple=pad_multiple, ranks_per_domain=2)


def test_install_passes_the_transport_to_the_buffers():
    """An unknown transport from install() is refused by the buffer Megatron's first
    dispatch creates, naming it: the option reaches railyard.Buffer."""
    railyard.megatron.install(max_num_of_tokens_per_rank=MAX_TOKENS, transport="efa")
    with pytest.raises(ValueError, match="transport is 'efa'; expected 'auto', 'mlx5' or 'gin'"):
        run_autograd_functions(2, COUNTS[2], seed=3, ranks_per_domain=1)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("pad_multiple", [None, 16])
def test_autograd_functions_blocking(world, pad_multiple):
    """num_permuted_tokens=None: the sizes are read back; outputs sized exactly."""
    run_autograd_functions(world, COUNTS[world], seed=world, pad_multiple=pad_multiple)


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("pad_multiple", [None, 8])
def test_autograd_functions_non_blocking(world, pad_multiple):
    """num_permuted_tokens given: no host read, outputs have exactly that many rows."""
    counts = COUNTS[world]
    bound = sum(counts) * K + EL * 8  # at least every rank's P, padding included
    run_autograd_functions(world, counts, seed=10 + world, pad_multiple=pad_multiple, bound=bound)


def test_autograd_functions_overflow():
    """A bound between the two ranks' row counts: rows past it are dropped on the rank
    over it, only that rank's overflow flag is set, and forward and backward agree with
    the reference under the same bound."""
    world, counts, seed = 2, [12, 16], 21
    xs, maps, probs = make_rank_inputs(world, counts, seed)
    E = world * EL
    routings = [normalize_routing(E, routing_map=maps[r], probs=probs[r]) for r in range(world)]
    sizes = [pm.num_rows for pm in permute_ref(dispatch_ref(xs, routings, E), 1)]
    bound = (min(sizes) + max(sizes)) // 2
    assert min(sizes) < bound < max(sizes), sizes  # one rank under the bound, one over
    run_autograd_functions(world, counts, seed=seed, bound=bound)


def test_buffer_is_one_per_rank_and_reused():
    """Megatron's one module-global buffer is one Railyard adapter; every rank thread has
    its own railyard.Buffer in it, created with its own group, reused by later calls."""
    world = 4
    xs, maps, probs = make_rank_inputs(world, COUNTS[world], 5)

    def fn(group):
        r = group.rank()
        seen = []
        for _ in range(2):
            hid, _, _, tpe, handle = dispatch_apply(
                xs[r], maps[r], probs[r], group, EL, num_sms_dispatch_api=SMS, num_sms_combine_api=SMS)
            fused_a2a.HybridEPCombine.apply(hid, handle, None, None)
            adapter = fused_a2a._hybrid_ep_buffer
            seen.append((adapter, adapter.buffer))
        assert seen[0][0] is seen[1][0] and seen[0][1] is seen[1][1]
        buf = seen[0][1]
        assert isinstance(seen[0][0], railyard.megatron.HybridEPBuffer)
        assert isinstance(buf, railyard.Buffer)
        assert (buf.rank, buf.world_size, buf.num_local_experts, buf.hidden_dim) == (r, world, EL, H)
        return id(seen[0][0]), id(buf)

    got = railyard.sim.run(world_size=world, fn=fn, ranks_per_domain=world, seed=5)
    assert len({a for a, _ in got}) == 1, "one adapter shared by all rank threads"
    assert len({b for _, b in got}) == world, "one railyard.Buffer per rank"


def test_adapters_with_the_same_settings_are_one_under_the_simulator():
    """Megatron's "create the global buffer if it is None" may run on several rank
    threads at once; each must get the same adapter, or a rank could make two buffers.
    Token counts below install()'s capacity floor give the same settings."""

    def fn(group):
        a = railyard.megatron.HybridEPBuffer(group, H, 12 + group.rank(), EL, num_sms_dispatch_api=SMS)
        b = railyard.megatron.HybridEPBuffer(group, H, 16, EL, num_sms_dispatch_api=SMS)
        c = railyard.megatron.HybridEPBuffer(group, H, 16, EL, num_sms_dispatch_api=SMS + 1)
        assert a is b and a is not c
        assert a.max_num_of_tokens_per_rank == 512  # DeepEP's sizing: >= 512, a multiple of 64
        return a  # kept alive by the results list, as Megatron's global keeps it

    adapters = railyard.sim.run(world_size=2, fn=fn, ranks_per_domain=2, seed=3)
    assert adapters[0] is adapters[1]


# --------------------------------------------------------------------------- the dispatcher's manager


def manager_config(**overrides):
    """The TransformerConfig fields _HybridEPManager reads (0.16.1 and 0.19.2: the
    later names too; each version reads its own)."""
    cfg = dict(moe_permute_fusion=False, moe_expert_capacity_factor=None, moe_pad_expert_input_to_capacity=False,
               moe_router_topk=K, fp8=None, fp4=None, moe_hybridep_num_sms=SMS, moe_flex_dispatcher_num_sms=SMS,
               moe_expert_rank_capacity_factor=None, moe_hybridep_pad_uneven_dispatch_inputs=False,
               moe_hybridep_num_blocks_permute=None, moe_hybridep_num_blocks_unpermute=None,
               moe_permute_fusion_into_hybridep=False, moe_hybridep_num_sms_preprocessing=None,
               use_transformer_engine_op_fuser=False)
    cfg.update(overrides)
    return types.SimpleNamespace(**cfg)


def run_manager_step(mgr, r, world, x, routing_map, probs):
    """One forward + backward through _HybridEPManager, as MoEFlexTokenDispatcher drives
    it (routing map and probs reshaped to [T, world, E_local] first)."""
    T = x.shape[0]
    x = x.clone().requires_grad_()
    p = probs.clone().requires_grad_()
    mgr.setup_metadata(routing_map.reshape(T, world, EL), p.reshape(T, world, EL))
    hid = mgr.dispatch(x)
    hid, dprobs = mgr.get_permuted_hidden_states_by_experts(hid)
    tpe = mgr.get_number_of_tokens_per_expert()
    combined, _ = moe_layer(
        r, x, hid, dprobs, tpe,
        lambda y: mgr.combine(mgr.get_restored_hidden_states_by_experts(y)))
    return dict(rows=hid.shape[0], hidden=hid.detach().clone(), probs=dprobs.detach().clone(),
                tokens_per_expert=tpe.clone(), combined=combined.detach().clone(),
                xgrad=x.grad.clone(), pgrad=p.grad.clone(), overflow=mgr.test_overflow)


class RecordingManager(token_dispatcher._HybridEPManager):
    """_HybridEPManager unchanged, but remembers the handle's overflow flag after dispatch
    (Megatron drops the handle in combine)."""

    def dispatch(self, hidden_states, async_finish=True, allocate_on_comm_stream=True):
        out = super().dispatch(hidden_states, async_finish, allocate_on_comm_stream)
        self.test_overflow = int(self.handle.overflow)
        return out


class _CudaTensorsOnCpu(torch.overrides.TorchFunctionMode):
    """Megatron >= 0.18's _HybridEPManager makes its over_budget flag with
    device='cuda'; on this CPU-only machine make it a CPU tensor."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if str(kwargs.get("device", "")).startswith("cuda"):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def make_manager(group, world, cfg, cls=None):
    with _CudaTensorsOnCpu():
        return (cls or RecordingManager)(group, num_local_experts=EL, num_experts=world * EL, config=cfg)


def _reads_handle_overflow():
    import inspect

    return "handle[-1]" in inspect.getsource(token_dispatcher._HybridEPManager.dispatch)


def skewed_routing(T, E):
    """Every token to experts 0 and 1 (both on rank 0): rank 0 receives 2 rows per token
    of every rank, rank 1 none."""
    m = torch.zeros(T, E, dtype=torch.bool)
    m[:, :2] = True
    return m


@pytest.mark.skipif(not _reads_handle_overflow(), reason="this megatron-core predates moe_expert_rank_capacity_factor")
@pytest.mark.parametrize("factor", [1.0, 2.5], ids=["overflow_on_rank0", "within_budget"])
def test_hybridep_manager_rank_capacity_factor(factor):
    """moe_expert_rank_capacity_factor (Megatron >= 0.18): a static budget, bounded
    dispatch; Megatron ORs handle[-1] into over_budget. It must be set exactly on the rank
    that dropped rows, and the tokens_per_expert handed to the grouped GEMM must count
    the rows kept (their sum is the rows written)."""
    world, T = 2, 100
    counts = [T] * world
    xs, _, probs = make_rank_inputs(world, counts, 70)
    maps = [skewed_routing(T, world * EL) for _ in range(world)]
    # the budget rounds up to the alignment: 256 with the TE op fuser
    cfg = manager_config(moe_expert_rank_capacity_factor=factor, use_transformer_engine_op_fuser=True)
    budget = -(-int(T * K * factor) // 256) * 256

    def fn(group):
        r = group.rank()
        mgr = make_manager(group, world, cfg)
        res = run_manager_step(mgr, r, world, xs[r], maps[r], probs[r])
        assert mgr.num_permuted_tokens is None  # released by combine (not drop-and-pad)
        res["over_budget"] = bool(mgr.over_budget.any())
        return res

    got = railyard.sim.run(world_size=world, fn=fn, ranks_per_domain=world, seed=7)
    perm, combined, xgrad, pgrad = expected(world, counts, xs, maps, probs, bound=budget)
    for d in range(world):
        P = perm[d].num_rows
        g = got[d]
        assert g["over_budget"] == (P > budget), f"rank {d}: over_budget {g['over_budget']} with {P} rows, budget {budget}"
        assert g["overflow"] == int(P > budget)
        kept = kept_tokens_per_expert(perm[d], budget)
        assert torch.equal(g["tokens_per_expert"], kept), f"rank {d}: tokens_per_expert {g['tokens_per_expert']}, kept {kept}"
        assert int(g["tokens_per_expert"].sum()) == min(P, budget)
        n = min(P, budget)
        assert g["rows"] == budget
        assert torch.equal(g["hidden"][:n], perm[d].hidden[:n]), f"rank {d}: dispatched rows"
        assert torch.equal(g["combined"], combined[d]), f"rank {d}: combined"
        assert torch.equal(g["xgrad"], xgrad[d]), f"rank {d}: grad of x"
        assert torch.equal(g["pgrad"], pgrad[d]), f"rank {d}: grad of probs"
    assert perm[0].num_rows > budget if factor == 1.0 else perm[0].num_rows <= budget  # the case is what it says


def _sim_all_reduce(tensor, op=None, group=None, async_op=False):
    """torch.distributed.all_reduce(MAX) over a railyard.sim group, for Megatron's
    padding of uneven inputs (the simulator's group is not a torch.distributed one)."""
    assert op == torch.distributed.ReduceOp.MAX and isinstance(group, railyard.sim.SimGroup)
    tensor.copy_(torch.stack(group.all_gather(tensor)).amax(dim=0))


@pytest.mark.skipif(not _reads_handle_overflow(), reason="this megatron-core has no moe_hybridep_pad_uneven_dispatch_inputs")
@pytest.mark.parametrize("counts", [[12, 16], [530, 300]], ids=["fits", "grows_past_512"])
def test_hybridep_manager_pad_uneven_inputs(counts, monkeypatch):
    """moe_hybridep_pad_uneven_dispatch_inputs: Megatron pads every rank's tokens to the
    group's largest count rounded up to 64 (576 for 530: past the buffer's 512, so the
    buffer grows on every rank in the same call); results match the unpadded reference."""
    import torch.distributed as dist

    monkeypatch.setattr(dist, "all_reduce", _sim_all_reduce)
    world = 2
    xs, maps, probs = make_rank_inputs(world, counts, 80)
    cfg = manager_config(moe_hybridep_pad_uneven_dispatch_inputs=True)

    def fn(group):
        r = group.rank()
        mgr = make_manager(group, world, cfg)
        res = run_manager_step(mgr, r, world, xs[r], maps[r], probs[r])
        res["capacity"] = fused_a2a._hybrid_ep_buffer.max_num_of_tokens_per_rank
        return res

    got = railyard.sim.run(world_size=world, fn=fn, ranks_per_domain=world, seed=8)
    perm, combined, xgrad, pgrad = expected(world, counts, xs, maps, probs)
    padded = -(-max(counts) // 64) * 64
    for d in range(world):
        check_rank(d, got[d], perm, combined, xgrad, pgrad)
        assert got[d]["capacity"] == max(512, padded)


@pytest.mark.parametrize("world", [2, 4])
def test_hybridep_manager(world):
    """_HybridEPManager without capacity: blocking dispatch, two steps in a row."""
    counts = COUNTS[world]
    steps = [make_rank_inputs(world, counts, 30 + world), make_rank_inputs(world, counts, 40 + world)]

    def fn(group):
        r = group.rank()
        mgr = make_manager(group, world, manager_config())
        out = []
        for xs, maps, probs in steps:
            out.append(run_manager_step(mgr, r, world, xs[r], maps[r], probs[r]))
            assert mgr.handle is None and mgr.num_permuted_tokens is None  # combine released them
        return out

    got = railyard.sim.run(world_size=world, fn=fn, ranks_per_domain=world, seed=world)
    for step, (xs, maps, probs) in enumerate(steps):
        perm, combined, xgrad, pgrad = expected(world, counts, xs, maps, probs)
        for d in range(world):
            check_rank(d, got[d][step], perm, combined, xgrad, pgrad)


def capacity_routing(world, T):
    """Every expert gets exactly T * K / E tokens from every rank (what the router's
    pad-to-capacity produces), so Megatron's capacity bound is the exact row count."""
    E = world * EL
    t = torch.arange(T)
    m = torch.zeros(T, E, dtype=torch.bool)
    m[t, t % E] = True
    m[t, (t + 1) % E] = True
    return m


@pytest.mark.parametrize("world", [2, 4])
def test_hybridep_manager_drop_and_pad(world):
    """_HybridEPManager with moe_pad_expert_input_to_capacity: Megatron passes the capacity
    bound (non-blocking dispatch) and its own tokens_per_expert."""
    T = 16
    counts = [T] * world
    xs, _, probs = make_rank_inputs(world, counts, 50 + world)
    maps = [capacity_routing(world, T) for _ in range(world)]
    cfg = manager_config(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True)
    capacity = T * K // (world * EL)

    def fn(group):
        r = group.rank()
        mgr = make_manager(group, world, cfg)
        res = run_manager_step(mgr, r, world, xs[r], maps[r], probs[r])
        assert mgr.num_permuted_tokens == capacity * world * EL
        return res

    got = railyard.sim.run(world_size=world, fn=fn, ranks_per_domain=world, seed=world)
    perm, combined, xgrad, pgrad = expected(world, counts, xs, maps, probs, bound=capacity * world * EL)
    for d in range(world):
        assert torch.equal(perm[d].tokens_per_expert, torch.full((EL,), capacity * world))
        check_rank(d, got[d], perm, combined, xgrad, pgrad, bound=capacity * world * EL)


# --------------------------------------------------------------------------- the flex token dispatcher


class _SubGroup:
    """A stand-in for the expert tensor-parallel group: rank() and size() only (the flex
    dispatcher communicates on tp_ep, the simulator's group; it only sizes with this one)."""

    def __init__(self, rank, size):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


@pytest.fixture
def torch_distributed_initialised():
    """Megatron's get_pg_size() answers 1 unless torch.distributed is initialised; a
    one-process gloo group makes it ask the groups themselves (the simulator's)."""
    import torch.distributed as dist

    mine = not dist.is_initialized()
    if mine:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    if mine:
        dist.destroy_process_group()


def flex_config(world, tp):
    from megatron.core.transformer.transformer_config import TransformerConfig

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return TransformerConfig(
            num_layers=1, hidden_size=H, num_attention_heads=4, add_bias_linear=False,
            num_moe_experts=world // tp * EL, moe_router_topk=K, moe_router_dtype="fp32",
            moe_token_dispatcher_type="flex", moe_flex_dispatcher_backend="hybridep", moe_hybridep_num_sms=SMS,
            expert_model_parallel_size=world // tp, expert_tensor_parallel_size=tp)


@pytest.mark.parametrize("world,tp", [(2, 1), (4, 1), (4, 2)])
def test_flex_token_dispatcher(world, tp, torch_distributed_initialised):
    """MoEFlexTokenDispatcher with --moe-token-dispatcher-type flex
    --moe-flex-dispatcher-backend hybridep, driven as MoELayer drives it:
    dispatch_preprocess, token_dispatch, dispatch_postprocess, (experts),
    combine_preprocess, token_combine, combine_postprocess; then backward. With expert
    tensor parallelism (tp > 1) every token goes to all tp ranks of its expert's rank."""
    ep = world // tp
    cfg = flex_config(world, tp)
    counts = COUNTS[world]
    g = torch.Generator().manual_seed(60 + world + tp)
    xs, maps, probs = [], [], []
    for r in range(world):
        T = counts[r]
        xs.append(torch.randint(-4, 5, (T, H), generator=g).to(torch.bfloat16))
        idx = torch.rand(T, ep * EL, generator=g).topk(K, dim=1).indices
        m = torch.zeros(T, ep * EL, dtype=torch.bool)
        m.scatter_(1, idx, True)
        maps.append(m)
        probs.append((torch.randint(1, 16, (T, ep * EL), generator=g).to(torch.float32) / 16) * m)

    def fn(group):
        r = group.rank()
        pgs = types.SimpleNamespace(ep=None, expt_tp=_SubGroup(r % tp, tp), tp_ep=group)
        pgs.ep = _SubGroup(r // tp, ep)
        with _CudaTensorsOnCpu():
            disp = token_dispatcher.MoEFlexTokenDispatcher(
                EL, [(r // tp) * EL + j for j in range(EL)], cfg, pg_collection=pgs)
        T = counts[r]
        x = xs[r].reshape(T, 1, H).clone().requires_grad_()
        p = probs[r].clone().requires_grad_()
        h, pp = disp.dispatch_preprocess(x, maps[r], p)
        h, pp = disp.token_dispatch(h, pp)
        h, tpe, pp = disp.dispatch_postprocess(h, pp)

        def combine(y):
            out = disp.combine_postprocess(disp.token_combine(disp.combine_preprocess(y)))
            assert out.shape == (T, 1, H)
            return out.reshape(T, H)

        combined, _ = moe_layer(r, x.reshape(T, H), h, pp, tpe, combine)
        return dict(rows=h.shape[0], hidden=h.detach().clone(), probs=pp.detach().clone(),
                    tokens_per_expert=tpe.clone(), combined=combined.detach().clone(),
                    xgrad=x.grad.reshape(T, H).clone(), pgrad=p.grad.clone(), overflow=0)

    # torch.compile (Megatron's jit_fuser on dispatch_preprocess) is not what is tested here
    set_stance = getattr(torch.compiler, "set_stance", None)
    with set_stance("force_eager") if set_stance is not None else contextlib.nullcontext():
        got = railyard.sim.run(world_size=world, fn=fn, ranks_per_domain=world, seed=world + tp)

    def over_tp(t):  # [T, ep * EL] -> [T, world * EL]: the copy for every tp rank
        return t.reshape(t.shape[0], ep, 1, EL).expand(-1, -1, tp, -1).reshape(t.shape[0], world * EL)

    perm, combined, xgrad, pgrad = expected(world, counts, xs, [over_tp(m) for m in maps],
                                            [over_tp(p) for p in probs])
    # the router's gradient sums the gradients of the tp copies
    pgrad = [pg.reshape(-1, ep, tp, EL).sum(dim=2).reshape(-1, ep * EL) for pg in pgrad]
    for d in range(world):
        check_rank(d, got[d], perm, combined, xgrad, pgrad)


# --------------------------------------------------------------------------- install / uninstall


def test_install_is_idempotent_and_uninstall_restores():
    assert railyard.megatron.is_installed()
    assert fused_a2a.HybridEPBuffer is railyard.megatron.HybridEPBuffer
    assert fused_a2a.HAVE_HYBRIDEP is True
    d, c = fused_a2a.hybrid_ep_dispatch, fused_a2a.hybrid_ep_combine
    assert d is not None and c is not None
    assert token_dispatcher.hybrid_ep_dispatch is d and token_dispatcher.hybrid_ep_combine is c
    railyard.megatron.install(max_num_of_tokens_per_rank=MAX_TOKENS)
    assert fused_a2a.hybrid_ep_dispatch is d and token_dispatcher.hybrid_ep_combine is c
    assert "deep_ep" not in sys.modules

    railyard.megatron.uninstall()
    try:
        assert not railyard.megatron.is_installed()
        assert "HybridEPBuffer" not in vars(fused_a2a)  # Megatron's import of it had failed
        assert fused_a2a.HAVE_HYBRIDEP is False
        assert fused_a2a.hybrid_ep_dispatch is None and fused_a2a.hybrid_ep_combine is None
        assert token_dispatcher.hybrid_ep_dispatch is None and token_dispatcher.hybrid_ep_combine is None
        with pytest.raises(ImportError):
            token_dispatcher._HybridEPManager(None, EL, 2 * EL, manager_config())
        railyard.megatron.uninstall()  # again: nothing to do
    finally:
        railyard.megatron.install(max_num_of_tokens_per_rank=MAX_TOKENS)
    assert token_dispatcher.hybrid_ep_dispatch is not None


def test_forwarders_have_megatrons_signatures():
    import inspect

    disp = inspect.signature(fused_a2a.hybrid_ep_dispatch)
    fwd = inspect.signature(fused_a2a.HybridEPDispatch.forward)
    assert list(disp.parameters) == list(fwd.parameters)[1:]
    comb = inspect.signature(fused_a2a.hybrid_ep_combine)
    assert list(comb.parameters)[:4] == ["x", "handle", "num_permuted_tokens", "pad_multiple"]


def _python_with_railyard(code):
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(railyard.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return subprocess.run([sys.executable, "-W", "ignore", "-c", textwrap.dedent(code)], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("order", ["install_first", "megatron_first"])
def test_install_before_or_after_megatron_import(order):
    """A fresh interpreter: install() before Megatron is imported, or after the
    dispatcher module already imported hybrid_ep_dispatch (as None)."""
    first = ("import railyard.megatron; railyard.megatron.install()" if order == "install_first"
             else "import megatron.core.transformer.moe.token_dispatcher as td; assert td.hybrid_ep_dispatch is None")
    then = ("import megatron.core.transformer.moe.token_dispatcher as td" if order == "install_first"
            else "import railyard.megatron; railyard.megatron.install()")
    proc = _python_with_railyard(f"""
        import sys
        {first}
        {then}
        import railyard.megatron
        from megatron.core.transformer.moe import fused_a2a, token_dispatcher as td
        assert fused_a2a.HAVE_HYBRIDEP is True
        assert fused_a2a.HybridEPBuffer is railyard.megatron.HybridEPBuffer
        assert td.hybrid_ep_dispatch is fused_a2a.hybrid_ep_dispatch is not None
        assert td.hybrid_ep_combine is fused_a2a.hybrid_ep_combine is not None
        assert "deep_ep" not in sys.modules
        print("ok")
    """)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr


# --------------------------------------------------------------------------- adapter arguments


def test_adapter_argument_mapping():
    """Constructor options: Megatron's names map onto railyard.Buffer's; DeepEP-only ones
    are accepted without effect; unknown ones warn."""
    buf = railyard.megatron.HybridEPBuffer(
        group=None, hidden_dim=H, max_num_of_tokens_per_rank=8, num_local_experts=EL, use_fp8=False,
        num_sms_dispatch_api=3, num_sms_combine_api=4, num_sms_preprocessing_api=108,
        num_blocks_permute=5, num_blocks_unpermute=6, nvlink_domain_size=8)
    assert buf.max_num_of_tokens_per_rank == 512  # install()'s floor, then DeepEP's sizing (>= 512)
    railyard.megatron.install(max_num_of_tokens_per_rank=1000)
    big = railyard.megatron.HybridEPBuffer(group=None, hidden_dim=H, max_num_of_tokens_per_rank=8, num_local_experts=EL)
    assert big.max_num_of_tokens_per_rank == 1024  # a multiple of 64
    railyard.megatron.install(max_num_of_tokens_per_rank=MAX_TOKENS)
    assert (buf.num_sms_dispatch_api, buf.num_sms_combine_api) == (3, 4)
    assert buf._buffer_options == {"ranks_per_domain": 8}
    with pytest.warns(UserWarning, match="no_such_option"):
        railyard.megatron.HybridEPBuffer(group=None, hidden_dim=H, max_num_of_tokens_per_rank=8,
                                         num_local_experts=EL, no_such_option=1)
    with pytest.raises(ValueError, match="group"):
        buf.dispatch_with_permute(hidden=torch.zeros(1, H, dtype=torch.bfloat16),
                                  routing_map=torch.zeros(1, 2 * EL, dtype=torch.bool))
