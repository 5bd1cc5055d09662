"""Railyard: mixture-of-experts dispatch and combine over NVLink, as PyTorch ops.

    buf = railyard.Buffer(group, hidden_dim, max_num_of_tokens_per_rank, num_local_experts)
    r = buf.dispatch_with_permute(hidden=x, routing_map=rmap, probs=probs)
    y = buf.combine_with_unpermute(hidden=experts(r.hidden), handle=r.handle).hidden

CUDA tensors run on GPUs; CPU tensors run on Railyard's simulator of the CUDA
execution model (``railyard.sim``). See docs/python-api.md.
"""
import os as _os

# In a build tree the compiled modules live in the build directory
# (build/python/railyard); an installed package has them beside this file.
_extension_dir = _os.environ.get("RAILYARD_EXTENSION_DIR")
if _extension_dir:
    __path__.append(_extension_dir)  # noqa: F821 (the package's own __path__)

import torch as _torch  # noqa: E402  (the extension needs libtorch loaded first)

try:
    from . import _schema  # noqa: F401  (defines torch.ops.railyard.*)
except ImportError as _error:
    raise ImportError(
        "railyard: the compiled modules (_schema, _C_sim, _C_cuda) were not found next to "
        f"{__file__} or in RAILYARD_EXTENSION_DIR ({_extension_dir!r}); install the package "
        "with `pip install .`, or point RAILYARD_EXTENSION_DIR at a build's python/railyard"
    ) from _error
from ._flavours import has_cuda_flavour, has_sim_flavour  # noqa: E402
from ._buffer import (  # noqa: E402
    AbortedError,
    Buffer,
    CombineResult,
    DispatchResult,
    Handle,
    PermutedDispatchResult,
    TimeoutError,
)
from . import _fake  # noqa: E402,F401  (fake implementations for torch.compile)

__all__ = [
    "AbortedError",
    "Buffer",
    "CombineResult",
    "DispatchResult",
    "Handle",
    "PermutedDispatchResult",
    "TimeoutError",
    "has_cuda_flavour",
    "has_sim_flavour",
]
