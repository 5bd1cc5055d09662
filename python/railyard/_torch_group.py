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
