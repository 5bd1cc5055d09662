"""The same checks as test_dispatch_combine.py on real GPUs: one process per GPU in an
NCCL process group, railyard.Buffer over torch.distributed, CUDA tensors, compared
with tests/python/reference.py. Skipped without the CUDA flavour and two GPUs (every
machine that builds Railyard's CI has none: these run only where users have GPUs).

    pytest tests/python/test_gpu.py      # uses min(8, torch.cuda.device_count()) GPUs
"""
import os
import socket

import pytest
import torch

import reference as ref
from helpers import assert_bits, check_permuted, check_received, expert_rows, make_case, random_fp32_rows

NUM_GPUS = min(8, torch.cuda.device_count()) if torch.cuda.is_available() else 0


def _has_cuda_flavour():
    try:
        import railyard

        return railyard.has_cuda_flavour()
    except Exception:  # noqa: BLE001
        return False


pytestmark = pytest.mark.skipif(NUM_GPUS < 2 or not _has_cuda_flavour(),
                                reason=f"needs the CUDA flavour and 2 GPUs (found {NUM_GPUS})")


def _cpu(t):
    return None if t is None else t.detach().cpu()


def _snap(r):
    out = {k: _cpu(getattr(r, k)) for k in r._fields if k != "handle"}
    h = r.handle
    out["handle"] = {
        "layout": h.layout, "num_tokens": h.num_tokens, "pad_multiple": h.pad_multiple, "num_rows": h.num_rows,
        "bounded": h.bounded, "overflow": int(h.overflow.item()), "tokens_per_expert": _cpu(h.tokens_per_expert),
        "count": int((h.num_recv_tokens if h.layout == "received" else h.num_permuted_tokens).item()),
    }
    return out


def _worker(rank, world_size, port, fp8, form, queue):
    import torch.distributed as dist

    import railyard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    try:
        case = make_case(world_size, fp8=fp8, form=form, seed=3, hidden_dim=256, pad_multiple=8)
        dev = torch.device("cuda", rank)
        kw = {k: v.to(dev) for k, v in case.dispatch_kwargs(rank).items()}
        buf = railyard.Buffer(dist.group.WORLD, hidden_dim=case.hidden_dim, max_num_of_tokens_per_rank=case.max_tokens,
                              num_local_experts=case.num_local_experts, use_fp8=fp8)
        N = [rc.num_rows for rc in case.received]
        P = [pm.num_rows for pm in case.permuted]
        ys, zs = expert_rows(case, N, salt=2), expert_rows(case, P, salt=4)
        qs = random_fp32_rows(case, [(n, case.num_local_experts) for n in N], salt=3)
        r = buf.dispatch(case.hidden[rank].to(dev), **kw)
        c = buf.combine(ys[rank].to(dev), probs=qs[rank].to(dev), handle=r.handle)
        p = buf.dispatch_with_permute(case.hidden[rank].to(dev), pad_multiple=8, **kw)
        u = buf.combine_with_unpermute(zs[rank].to(dev), handle=p.handle, pad_multiple=8)
        torch.cuda.synchronize()
        queue.put((rank, None, (_snap(r), _cpu(c.hidden), _cpu(c.probs), _snap(p), _cpu(u.hidden))))
        buf.destroy()
    except Exception as error:  # noqa: BLE001  (reported to the parent)
        queue.put((rank, repr(error), None))
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("fp8", [False, True], ids=["bf16", "fp8"])
@pytest.mark.parametrize("form", ["map", "topk"])
def test_dispatch_and_combine_on_gpus(fp8, form):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, NUM_GPUS, port, fp8, form, queue)) for r in range(NUM_GPUS)]
    for proc in procs:
        proc.start()
    results = {}
    for _ in procs:
        rank, error, value = queue.get(timeout=300)
        assert error is None, f"rank {rank}: {error}"
        results[rank] = value
    for proc in procs:
        proc.join(timeout=60)

    case = make_case(NUM_GPUS, fp8=fp8, form=form, seed=3, hidden_dim=256, pad_multiple=8)
    N = [rc.num_rows for rc in case.received]
    P = [pm.num_rows for pm in case.permuted]
    ys, zs = expert_rows(case, N, salt=2), expert_rows(case, P, salt=4)
    qs = random_fp32_rows(case, [(n, case.num_local_experts) for n in N], salt=3)
    exp_c = ref.combine_ref(ys, case.received, case.tokens)
    exp_q = ref.combine_probs_ref(qs, case.received, case.tokens)
    exp_u = ref.combine_with_unpermute_ref(zs, case.permuted, case.tokens)
    for d in range(NUM_GPUS):
        got_r, c_hidden, c_probs, got_p, u_hidden = results[d]
        check_received(case, d, got_r)
        check_permuted(case, d, got_p)
        assert_bits(c_hidden, exp_c[d], f"rank {d} combine hidden")
        assert_bits(c_probs, exp_q[d], f"rank {d} combine probs")
        assert_bits(u_hidden, exp_u[d], f"rank {d} combine_with_unpermute hidden")
