"""The torch.distributed bootstrap (python/railyard/_torch_group.py) through the C++
side: two processes in a gloo group allgather through Railyard's CallbackBootstrap,
which first checks that every rank passes the same byte count."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import railyard
from railyard import _flavours
from railyard._torch_group import torch_bootstrap

pytestmark = pytest.mark.skipif(not railyard.has_sim_flavour(), reason="needs the simulator flavour (_C_sim)")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, size, port, payload_sizes, queue):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=size)
    try:
        bootstrap = torch_bootstrap(_flavours.sim, dist.group.WORLD)
        mine = bytes((rank * 16 + i) % 256 for i in range(payload_sizes[rank]))
        try:
            queue.put((rank, "ok", _flavours.sim.bootstrap_allgather(bootstrap, mine)))
        except Exception as error:  # noqa: BLE001  (reported to the parent)
            queue.put((rank, "error", str(error)))
    finally:
        dist.destroy_process_group()




def _allgather(payload_sizes):
    size = len(payload_sizes)
    port = _free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, size, port, payload_sizes, queue)) for r in range(size)]
    for p in procs:
        p.start()
    results = dict((r, (status, value)) for r, status, value in (queue.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return results


def test_allgather_returns_every_ranks_bytes_in_rank_order():
    results = _allgather([5, 5])
    expected = bytes(range(5)) + bytes(16 + i for i in range(5))
    assert results == {0: ("ok", expected), 1: ("ok", expected)}


def test_different_byte_counts_are_the_same_error_on_every_rank():
    results = _allgather([4, 6])
    for rank in (0, 1):
        status, message = results[rank]
        assert status == "error"
        assert "4" in message and "6" in message, message
