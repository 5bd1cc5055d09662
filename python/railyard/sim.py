"""Railyard on the CPU: ranks as threads of this process, each a simulated GPU.

    def fn(group):
        buf = railyard.Buffer(group, hidden_dim=128, max_num_of_tokens_per_rank=64,
                              num_local_experts=2)
        r = buf.dispatch(x, topk_idx=idx, topk_weights=w)   # CPU tensors
        ...
        return something
    results = railyard.sim.run(world_size=8, fn=fn)

Every kernel runs unmodified in Railyard's simulator of the CUDA execution model
(docs/simulator.md): the interleaving of the simulated GPU threads is chosen by a
seeded scheduler, so a run is reproducible. Nothing here is a GPU timing.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from . import _flavours

_local = threading.local()


class SimGroup:
    """The process group of one simulated rank: rank() and size() as in
    torch.distributed; railyard.Buffer takes it as its group."""

    def __init__(self, sim_rank):
        self._sim_rank = sim_rank
        self._buffers = []

    def rank(self) -> int:
        return self._sim_rank.rank

    def size(self) -> int:
        return self._sim_rank.size

    def _railyard_bootstrap(self):
        return self._sim_rank.bootstrap()

    def _register_buffer(self, buffer) -> None:
        self._buffers.append(buffer)

    def _destroy_buffers(self) -> None:
        # Collective like Buffer.destroy: every rank destroys in creation order.
        for buffer in self._buffers:
            buffer.destroy()
        self._buffers.clear()

    def __repr__(self):
        return f"railyard.sim.SimGroup(rank={self.rank()}, size={self.size()})"


def current_group() -> Optional[SimGroup]:
    """The calling rank thread's group inside run(), else None."""
    return getattr(_local, "group", None)


def run(world_size: int, fn: Callable[[SimGroup], Any], ranks_per_domain: Optional[int] = None, seed: int = 1,
        device: str = "h100", preemption: float = 1.0, timeout: float = 120.0, sm_count: int = 0) -> list:
    """Runs fn(group) on `world_size` simulated GPUs, one thread per rank, and returns
    the ranks' results in rank order. Re-raises the first exception a rank raised
    (first in time: a failing rank's peers fail later, waiting for it).

    ranks_per_domain: ranks per NVLink domain (default: all); device: "h100" or
    "b200"; preemption: the scheduler's preemption probability in (0, 1] (lower runs
    faster, still seeded); timeout: seconds a rank waits for the others in a
    bootstrap collective; sm_count: SMs per simulated GPU (0: the device's).
    Buffers still alive when fn returns are destroyed (collectively) after it.
    """
    if _flavours.sim is None:
        raise RuntimeError("railyard.sim: this installation has no simulator flavour (_C_sim)")
    results: list = [None] * world_size
    errors: list = []

    def rank_main(sim_rank):
        group = SimGroup(sim_rank)
        _local.group = group
        try:
            results[sim_rank.rank] = fn(group)
            group._destroy_buffers()
        except BaseException as error:  # reported below, on the caller's thread
            errors.append((time.monotonic(), sim_rank.rank, error))
        finally:
            _local.group = None

    _flavours.sim.sim_run(world_size, ranks_per_domain or world_size, seed, device, preemption, timeout, sm_count,
                          rank_main)
    if errors:
        errors.sort(key=lambda e: e[0])
        _, rank, error = errors[0]
        others = sorted(r for _, r, _ in errors[1:])
        if others:
            error.add_note(f"railyard.sim.run: raised on rank {rank} first; ranks {others} failed later")
        else:
            error.add_note(f"railyard.sim.run: raised on rank {rank}")
        raise error
    return results


def traffic() -> dict:
    """Bytes kernels moved, by (executing device, owner of the memory): a dict with
    num_devices, write_bytes and read_bytes, each indexed
    [device * (num_devices + 1) + owner + 1] (owner -1: pinned host memory)."""
    return _flavours.sim.sim_traffic()


def reset_traffic() -> None:
    _flavours.sim.sim_reset_traffic()
