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
from typing import Any, Callable, List, Optional, Sequence

import torch

from . import _flavours

_local = threading.local()


class SimGroup:
    """The process group of one simulated rank: rank() and size() as in
    torch.distributed; railyard.Buffer takes it as its group.

    barrier(), all_gather(), all_to_all() and all_gather_object() are host-side
    collectives for the rank threads. Use them, not a threading.Barrier: the simulated
    GPUs run only while every rank thread waits in a simulator call, and these waits are
    such calls. They raise at once on every rank when a rank's fn raised (the group is
    then broken), and after run(timeout=) seconds when a rank never arrives.
    """

    def __init__(self, sim_rank, slots):
        self._sim_rank = sim_rank
        self._slots = slots  # one per rank, shared by the run's groups
        self._buffers = []

    def rank(self) -> int:
        return self._sim_rank.rank

    def size(self) -> int:
        return self._sim_rank.size

    def barrier(self) -> None:
        """Returns once every rank has called barrier()."""
        self._sim_rank.exchange(b"", "barrier")

    def all_gather_object(self, obj: Any) -> List[Any]:
        """Every rank's obj, in rank order (the objects themselves: threads share them)."""
        rank = self.rank()
        self._slots[rank] = obj
        self._sim_rank.exchange(b"", "all_gather_object")
        out = list(self._slots)
        self._sim_rank.exchange(b"", "all_gather_object")  # every rank has read the slots
        self._slots[rank] = None
        return out

    def all_gather(self, tensor: torch.Tensor) -> List[torch.Tensor]:
        """Every rank's CPU tensor (copies), in rank order; shapes may differ by rank."""
        _check_cpu_tensor("all_gather", "tensor", tensor)
        return [t.clone() for t in self.all_gather_object(tensor)]

    def all_to_all(self, tensors: Sequence[torch.Tensor]) -> List[torch.Tensor]:
        """tensors[j] (a CPU tensor) goes to rank j; returns what each rank sent this one,
        in rank order (copies)."""
        if not isinstance(tensors, (list, tuple)) or len(tensors) != self.size():
            raise ValueError(f"railyard.sim all_to_all: tensors is {type(tensors).__name__} of "
                             f"{len(tensors) if hasattr(tensors, '__len__') else '?'}; expected a list of "
                             f"{self.size()} tensors (one per rank)")
        for j, t in enumerate(tensors):
            _check_cpu_tensor("all_to_all", f"tensors[{j}]", t)
        rows = self.all_gather_object(list(tensors))
        return [rows[src][self.rank()].clone() for src in range(self.size())]

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


def _check_cpu_tensor(op, name, t):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"railyard.sim {op}: {name} is a {type(t).__name__}; expected a torch.Tensor")
    if t.device.type != "cpu":
        raise ValueError(f"railyard.sim {op}: {name} is on {t.device}; expected a CPU tensor")


def current_group() -> Optional[SimGroup]:
    """The calling rank thread's group inside run(), else None."""
    return getattr(_local, "group", None)


def run(world_size: int, fn: Callable[[SimGroup], Any], ranks_per_domain: Optional[int] = None, seed: int = 1,
        device: str = "h100", preemption: float = 1.0, timeout: float = 120.0, sm_count: int = 0,
        timed: bool = False) -> list:
    """Runs fn(group) on `world_size` simulated GPUs, one thread per rank, and returns
    the ranks' results in rank order. Re-raises the first exception a rank raised
    (first in time). A rank that raises breaks the group: its peers' collectives
    (Buffer creation and destruction, SimGroup.barrier and the others) raise at once,
    naming it. Peers waiting for it inside a kernel fail at the kernel's budget.

    ranks_per_domain: ranks per NVLink domain (default: all); device: "h100" or
    "b200"; preemption: the scheduler's preemption probability in (0, 1] (lower runs
    faster, still seeded); timeout: seconds a rank waits for the others in a
    collective (Buffer creation, SimGroup.barrier, ...); sm_count: SMs per simulated GPU (0: the device's);
    timed: the simulator's timed mode (docs/simulator.md, "Timed mode"): every operation
    costs simulated time by the device's cost model, and record_event() / elapsed_us()
    time the ranks' operations. Such times are SIMULATED, never a GPU's.
    Buffers still alive when fn returns are destroyed (collectively) after it.
    """
    if _flavours.sim is None:
        raise RuntimeError("railyard.sim: this installation has no simulator flavour (_C_sim)")
    results: list = [None] * world_size
    errors: list = []
    slots: list = [None] * world_size

    def rank_main(sim_rank):
        group = SimGroup(sim_rank, slots)
        _local.group = group
        try:
            results[sim_rank.rank] = fn(group)
            group._destroy_buffers()
        except BaseException as error:  # reported below, on the caller's thread
            errors.append((time.monotonic(), sim_rank.rank, error))
            # Peers waiting in (or later entering) a collective raise now, not at the timeout.
            sim_rank.abort(f"{type(error).__name__}: {error}")
        finally:
            _local.group = None

    _flavours.sim.sim_run(world_size, ranks_per_domain or world_size, seed, device, preemption, timeout, sm_count,
                          timed, rank_main)
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
    """Restarts traffic()'s counts, and busy_time()'s."""
    _flavours.sim.sim_reset_traffic()


def record_event() -> int:
    """Records an event on the calling rank's stream (the one its Buffer uses); returns
    its id. Inside run()."""
    return _flavours.sim.sim_record_event()


def wait_event(event: int) -> None:
    """The calling rank's later work waits for `event` (of any rank: ranks can start an
    operation together)."""
    _flavours.sim.sim_wait_event(event)


def elapsed_us(start: int, end: int) -> float:
    """run(timed=True) only: SIMULATED microseconds between two recorded events (it
    waits for both). Raises outside the timed mode."""
    return _flavours.sim.sim_elapsed_ns(start, end) / 1e3


def busy_time() -> list:
    """run(timed=True) only: per device, the ns each resource of the cost model was busy
    since reset_traffic() (nvlink_out, nvlink_in, hbm; sm_issue, sm_smem, sm_tma: the busiest
    SM's). Empty outside the timed mode."""
    return _flavours.sim.sim_busy_time()
