"""A torch.distributed process group as Railyard's bootstrap (the CUDA flavour): the
C++ side calls these two functions a few times while a Buffer is created."""
import torch
import torch.distributed as dist


def _device_for(group):
    backend = dist.get_backend(group)
    return torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")


def torch_bootstrap(module, group):
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    device = _device_for(group)

    def allgather(mine: bytes) -> bytes:
        local = torch.frombuffer(bytearray(mine), dtype=torch.uint8).to(device) if mine else \
            torch.empty(0, dtype=torch.uint8, device=device)
        out = torch.empty(size * len(mine), dtype=torch.uint8, device=device)
        dist.all_gather_into_tensor(out, local, group=group)
        return out.cpu().numpy().tobytes()

    def barrier() -> None:
        dist.barrier(group=group)

    return module.callback_bootstrap(rank, size, allgather, barrier)


def nccl_comm_of(group, device):
    """The NCCL communicator (ncclComm_t, as an int) of a torch.distributed group on
    `device`, where torch exposes it (ProcessGroupNCCL._comm_ptr); None otherwise: a
    group of another backend, a torch without it, or a communicator not made yet
    (init_process_group(device_id=...) makes it at once)."""
    try:
        backend = group._get_backend(device)
        comm_ptr = getattr(backend, "_comm_ptr", None)
        return int(comm_ptr()) or None if comm_ptr is not None else None
    except Exception:  # noqa: BLE001 - any failure means: no communicator to offer
        return None
