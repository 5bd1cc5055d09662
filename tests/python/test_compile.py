"""torch.compile (docs/python-api.md "torch.compile"): a module calling non-blocking
dispatch_with_permute, an elementwise op and combine_with_unpermute traces with
fullgraph=True (backend aot_eager) on two simulated ranks; its outputs (and gradients)
equal eager mode bit for bit, and both equal the reference.
"""

import pytest
import torch

import reference as ref
from helpers import assert_bits, make_buffer, make_case, run_ranks

PAD = 4


class MoELayer(torch.nn.Module):
    def __init__(self, buf, bound):
        super().__init__()
        self.buf = buf
        self.bound = bound

    def forward(self, x, routing_map, probs):
        r = self.buf.dispatch_with_permute(x, routing_map=routing_map, probs=probs, pad_multiple=PAD,
                                           num_permuted_tokens=self.bound, non_blocking=True)
        z = (r.hidden.float() * r.probs[:, None]).to(torch.bfloat16)  # the "expert"
        # combine's probs input carries no gradient (the router's flows through dispatch)
        c = self.buf.combine_with_unpermute(z, probs=r.probs.detach(), handle=r.handle, pad_multiple=PAD)
        return c.hidden, c.probs


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "backward"])
def test_compiled_module_equals_eager_and_reference(railyard, backward):
    torch._dynamo.reset()
    case = make_case(2, seed=100, pad_multiple=PAD, tokens=[13, 7], max_tokens=16)
    bound = max(pm.num_rows for pm in case.permuted) + 3  # static shapes, no overflow
    g = case.generator(3)
    W = [torch.randn(T, case.hidden_dim, generator=g).to(torch.bfloat16).float() for T in case.tokens]

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        layer = MoELayer(buf, bound)
        compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)
        kw = case.dispatch_kwargs(d)
        outs = []
        for mod in (compiled, layer, compiled):
            x = case.hidden[d].clone().requires_grad_(backward)
            p = kw["probs"].clone().requires_grad_(backward)
            h, cp = mod(x, kw["routing_map"], p)
            res = [h.detach().clone(), cp.detach().clone()]
            if backward:
                ((h.float() * W[d]).sum() + cp.sum()).backward()
                res += [x.grad.clone(), p.grad.clone()]
            outs.append(res)
        buf.destroy()
        return outs

    results = run_ranks(2, fn)
    zs = [(pm.hidden.float() * pm.probs[:, None]).to(torch.bfloat16) for pm in case.permuted]
    exp_h = ref.combine_with_unpermute_ref(zs, case.permuted, case.tokens)
    exp_p = ref.combine_probs_permuted_ref([pm.probs for pm in case.permuted], case.permuted, case.tokens)
    exp_gx = None
    if backward:
        # grad of z is W of the row's token (combine_with_unpermute's backward, a copy);
        # grad of the dispatched rows is bf16(fp32(W * prob)); hidden's grad is their
        # combine_with_unpermute.
        gz = []
        for pm in case.permuted:
            real = pm.recv_row >= 0
            rc = pm.received
            i = pm.recv_row.clamp(min=0)
            wrows = torch.stack([W[int(rc.src_rank[k])][int(rc.src_token[k])] for k in i.tolist()]) if len(i) else \
                torch.zeros(0, case.hidden_dim)
            g_rows = (wrows * pm.probs[:, None]).to(torch.bfloat16)
            gz.append(torch.where(real[:, None], g_rows, torch.zeros((), dtype=torch.bfloat16)))
        exp_gx = ref.combine_with_unpermute_ref(gz, case.permuted, case.tokens)
    for d, (comp, eager, comp2) in enumerate(results):
        assert_bits(eager[0], exp_h[d], f"rank {d} eager hidden vs reference")
        assert_bits(eager[1], exp_p[d], f"rank {d} eager probs vs reference")
        if backward:
            assert_bits(eager[2], exp_gx[d], f"rank {d} eager x.grad vs reference")
        for i, name in enumerate(["hidden", "probs", "x.grad", "probs.grad"][: len(eager)]):
            assert_bits(comp[i], eager[i], f"rank {d} compiled {name} vs eager")
            assert_bits(comp2[i], eager[i], f"rank {d} compiled (second call) {name} vs eager")


def _bytes_written_by(railyard, device):
    t = railyard.sim.traffic()
    n = t["num_devices"] + 1
    return sum(t["write_bytes"][device * n: (device + 1) * n])


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
@pytest.mark.parametrize("unused", ["dispatch", "combine"])
def test_collective_with_unused_outputs_still_runs(railyard, backend, unused):
    """A dispatch (or combine) whose outputs the graph never uses is a collective all the
    same: compiled with fullgraph=True it must still run on every rank and move the
    same bytes as in eager mode (were it dropped, 0 bytes would move, and a rank that
    kept it would wait for the others)."""
    torch._dynamo.reset()
    case = make_case(2, seed=101, pad_multiple=PAD, tokens=[9, 6], max_tokens=16)
    bound = max(pm.num_rows for pm in case.permuted) + 1

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        kw = case.dispatch_kwargs(d)

        def step(x, routing_map, probs):
            r = buf.dispatch_with_permute(x, routing_map=routing_map, probs=probs, pad_multiple=PAD,
                                          num_permuted_tokens=bound, non_blocking=True)
            if unused == "dispatch":
                return x * 2
            buf.combine_with_unpermute(r.hidden, handle=r.handle, pad_multiple=PAD)
            return r.hidden * 2

        compiled = torch.compile(step, backend=backend, fullgraph=True)
        moved = []
        for f in (step, compiled, compiled):
            group.barrier()
            before = _bytes_written_by(railyard, d)
            out = f(case.hidden[d], kw["routing_map"], kw["probs"])
            moved.append(_bytes_written_by(railyard, d) - before)
            group.barrier()
        buf.destroy()
        return moved, out

    for d, (moved, out) in enumerate(run_ranks(2, fn)):
        eager, first, second = moved
        assert eager > 0, f"rank {d}: the eager step moved no bytes"
        assert first == eager and second == eager, f"rank {d}: compiled steps moved {first}, {second} bytes; eager {eager}"
        if unused == "dispatch":
            assert_bits(out, case.hidden[d] * 2, f"rank {d} output")
        else:
            assert_bits(out[: case.permuted[d].num_rows], case.permuted[d].hidden * 2, f"rank {d} output")
