"""The compiled flavours: the simulator (_C_sim, CPU tensors) and CUDA (_C_cuda)."""
import importlib


def _load(name):
    try:
        return importlib.import_module(f"railyard.{name}")
    except ImportError:
        return None


sim = _load("_C_sim")
cuda = _load("_C_cuda")


def has_sim_flavour() -> bool:
    return sim is not None


def has_cuda_flavour() -> bool:
    return cuda is not None
