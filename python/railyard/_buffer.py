"""railyard.Buffer: dispatch and combine for one rank of an expert-parallel group.

The methods are thin: argument forms (routing map or top-k, blocking or bounded) are
resolved here, every tensor check happens in C++ (python/csrc/ops.cpp), and the work
is one call of torch.ops.railyard.dispatch / .combine. Autograd wraps those calls
only when a gradient is wanted. docs/python-api.md is the reference.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from . import _flavours

RECEIVED = 0
EXPERT_GROUPED = 1
_LAYOUT_NAMES = {RECEIVED: "received", EXPERT_GROUPED: "expert_grouped"}

# Buffer id -> (hidden, num_experts, num_local_experts, fp8): what the fake
# implementations need to shape their outputs (python/railyard/_fake.py).
_configs: dict[int, tuple[int, int, int, bool]] = {}


class TimeoutError(RuntimeError):  # noqa: A001  (railyard.TimeoutError, by design)
    """A kernel's bounded wait gave up: the message names the rank, what it waited
    for (a peer's flag, a row) and the budget."""


class AbortedError(RuntimeError):
    """A kernel gave up the operation on every rank, each rank raising the same message:
    one rank's bad routing (``rank 1 gave up the operation: topk_idx[2][1] = 99 is not
    -1 or an expert id below num_experts``, with ``check_routing`` off) or ranks whose
    operations differ (``the ranks use different handles: rank 1's was made by operation
    3, rank 0's by operation 1``). On a GPU the CUDA context is lost, as after any
    kernel fault."""


# The start of the RuntimeError message by which the C++ side (python/csrc/ops.cpp,
# kernel_failure_prefix) marks a kernel failure, and the class raised for it.
_KERNEL_FAILURES = {"railyard.TimeoutError: ": TimeoutError, "railyard.AbortedError: ": AbortedError}


class Handle(NamedTuple):
    """What a dispatch leaves behind for its combine and for the backward pass.

    `token` carries the C++ handle (its storage keeps it alive); `totals` is an int64
    device view of its counts: received rows, permuted rows, the two overflow flags,
    then the padded and unpadded tokens per local expert.

    The last element is the overflow flag (``handle[-1]``, an int64 device scalar,
    nonzero when a bound dropped rows), where Megatron Core >= 0.18 reads it.
    """

    token: torch.Tensor
    totals: torch.Tensor
    buffer_id: int
    layout: str
    num_tokens: int
    pad_multiple: int
    num_rows: int  # rows of the dispatch's outputs (the bound when bounded)
    bounded: bool
    num_local_experts: int
    overflow_flag: torch.Tensor  # last: handle[-1] is the overflow flag

    @property
    def tokens_per_expert(self) -> torch.Tensor:
        """int64 [E_local] on the device: the true rows per local expert, padded
        (whether or not a bound dropped rows; see kept_tokens_per_expert)."""
        return self.totals[4 : 4 + self.num_local_experts]

    @property
    def kept_tokens_per_expert(self) -> torch.Tensor:
        """int64 [E_local] on the device: the expert-grouped rows actually written per
        local expert (padding included); sums to min(num_permuted_tokens, num_rows).
        Equal to tokens_per_expert unless a bound dropped rows. Computed on the device
        (no host sync). For the received layout see DispatchResult.tokens_per_expert."""
        if self.layout != "expert_grouped":
            raise ValueError("railyard.Handle.kept_tokens_per_expert: the handle is of dispatch (received "
                             "layout); expected one of dispatch_with_permute")
        padded = self.tokens_per_expert
        if not self.bounded:
            return padded
        starts = torch.cumsum(padded, 0) - padded
        return torch.minimum((self.num_rows - starts).clamp(min=0), padded)

    @property
    def required_rows(self) -> torch.Tensor:
        """int64 device scalar: the rows this dispatch needed (the capacity a bound
        must have for nothing to be dropped), whether or not it was bounded."""
        return self.totals[0] if self.layout == "received" else self.totals[1]

    @property
    def unpadded_tokens_per_expert(self) -> torch.Tensor:
        return self.totals[4 + self.num_local_experts : 4 + 2 * self.num_local_experts]

    @property
    def num_recv_tokens(self) -> torch.Tensor:
        return self.totals[0]

    @property
    def num_permuted_tokens(self) -> torch.Tensor:
        return self.totals[1]

    @property
    def overflow(self) -> torch.Tensor:
        """int64 scalar on the device: nonzero when the bound dropped rows (0 in
        blocking mode, where nothing is dropped). The same tensor as handle[-1]."""
        return self.overflow_flag


class DispatchResult(NamedTuple):
    hidden: torch.Tensor
    probs: Optional[torch.Tensor]
    scaling_factor: Optional[torch.Tensor]
    routing_map: torch.Tensor
    src_rank: torch.Tensor
    src_token: torch.Tensor
    tokens_per_expert: torch.Tensor
    handle: Handle


class PermutedDispatchResult(NamedTuple):
    """Megatron Core's 5-tuple: (tokens, probs, scales, tokens_per_expert, handle)."""

    hidden: torch.Tensor
    probs: Optional[torch.Tensor]
    scaling_factor: Optional[torch.Tensor]
    tokens_per_expert: torch.Tensor
    handle: Handle


class CombineResult(NamedTuple):
    hidden: torch.Tensor
    probs: Optional[torch.Tensor]


def _positive(name, value, minimum=1):
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"railyard.Buffer: {name} is {value!r}; expected an int >= {minimum}")
    return value


def _optional_positive(name, value):
    return 0 if value is None else _positive(name, value)


def _check_devices(op, device, tensors):
    # The C++ ops check every tensor's device, but the dispatcher routes a call with
    # any meta tensor to the fake implementation, which cannot: check here first.
    for name, t in tensors:
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"railyard.{op}: {name} is a {type(t).__name__}; expected a torch.Tensor")
        if t is not None and t.device != device:
            raise ValueError(f"railyard.{op}: {name} is on {t.device}; expected {device} (the buffer's device)")


def _check_group(group):
    if not (callable(getattr(group, "size", None)) and callable(getattr(group, "rank", None))):
        raise TypeError(f"railyard.Buffer: group is a {type(group).__name__}; expected a "
                        "torch.distributed.ProcessGroup or the railyard.sim group a rank function receives")


def _reraise(error: RuntimeError):
    message = str(error)
    for prefix, kind in _KERNEL_FAILURES.items():
        if prefix in message:
            raise kind(message[message.index(prefix) + len(prefix) :]) from None
    raise error


def _dispatch_op(buffer_id, hidden, scales, topk_idx, topk_weights, routing_map, probs, token, layout,
                 pad_multiple, max_rows, num_sms):
    try:
        return torch.ops.railyard.dispatch(buffer_id, hidden, scales, topk_idx, topk_weights, routing_map, probs,
                                           token, layout, pad_multiple, max_rows, num_sms)
    except RuntimeError as e:
        _reraise(e)


def _combine_op(buffer_id, token, hidden, probs, num_tokens, num_sms):
    try:
        return torch.ops.railyard.combine(buffer_id, token, hidden, probs, num_tokens, num_sms)
    except RuntimeError as e:
        _reraise(e)


def _gather_topk(out_probs, topk_idx):
    """[T, E] per-expert values -> [T, K] at the token's top-k slots (0 at -1)."""
    valid = topk_idx >= 0
    picked = out_probs.gather(1, topk_idx.clamp(min=0))
    return torch.where(valid, picked, torch.zeros_like(picked))


class _DispatchFn(torch.autograd.Function):
    """Dispatch with a gradient: backward is combine on the same handle."""

    @staticmethod
    def forward(ctx, buffer_id, layout, pad_multiple, max_rows, num_sms, combine_sms, hidden, scales, topk_idx,
                topk_weights, routing_map, probs, token):
        outs = _dispatch_op(buffer_id, hidden, scales, topk_idx, topk_weights, routing_map, probs, token, layout,
                            pad_multiple, max_rows, num_sms)
        ctx.buffer_id = buffer_id
        ctx.num_tokens = hidden.shape[0]
        ctx.combine_sms = combine_sms
        ctx.topk = topk_idx is not None
        ctx.save_for_backward(outs[8], topk_idx if topk_idx is not None else torch.empty(0))
        ctx.mark_non_differentiable(outs[1], outs[3], outs[4], outs[5], outs[6], outs[7], outs[8])
        return outs

    @staticmethod
    def backward(ctx, grad_hidden, grad_scales, grad_probs, *unused):
        token, topk_idx = ctx.saved_tensors
        wants_probs = ctx.needs_input_grad[9] or ctx.needs_input_grad[11]
        rows_probs = grad_probs.contiguous() if wants_probs and grad_probs is not None else None
        out, out_probs = _combine_op(ctx.buffer_id, token, grad_hidden.to(torch.bfloat16).contiguous(), rows_probs,
                                     ctx.num_tokens, ctx.combine_sms)
        grad_in = out if ctx.needs_input_grad[6] else None
        grad_weights = grad_map_probs = None
        if rows_probs is not None:
            if ctx.topk:
                grad_weights = _gather_topk(out_probs, topk_idx)
            else:
                grad_map_probs = out_probs
        return (None, None, None, None, None, None, grad_in, None, None, grad_weights, None, grad_map_probs, None)


class _CombineFn(torch.autograd.Function):
    """Combine with a gradient: backward is dispatch on the same handle."""

    @staticmethod
    def forward(ctx, buffer_id, token, num_tokens, num_sms, dispatch_sms, layout, pad_multiple, max_rows,
                hidden, probs):
        out, out_probs = _combine_op(buffer_id, token, hidden, probs, num_tokens, num_sms)
        ctx.args = (buffer_id, layout, pad_multiple, max_rows, dispatch_sms, hidden.shape[0])
        ctx.save_for_backward(token)
        return out, out_probs

    @staticmethod
    def backward(ctx, grad_out, grad_out_probs):
        (token,) = ctx.saved_tensors
        buffer_id, layout, pad_multiple, max_rows, dispatch_sms, num_rows = ctx.args
        if ctx.needs_input_grad[9]:
            raise RuntimeError("railyard: combine's probs input has no gradient; pass probs.detach() "
                               "(the router's gradient flows through dispatch)")
        if _configs[buffer_id][3]:
            raise RuntimeError("railyard: combine's backward dispatches BF16 gradients, but this buffer was made "
                               "with use_fp8=True; expected a BF16 buffer for a differentiable combine")
        outs = _dispatch_op(buffer_id, grad_out.to(torch.bfloat16).contiguous(), None, None, None, None, None, token,
                            layout, pad_multiple, max_rows, dispatch_sms)
        grad = outs[0]
        if grad.shape[0] != num_rows:  # combine was given fewer rows than the dispatch wrote
            grad = grad[:num_rows]
        return (None, None, None, None, None, None, None, None, grad, None)


class Buffer:
    """One rank's expert-parallel buffer (collective: every rank of `group` makes one).

    group: a torch.distributed ProcessGroup (CUDA) or the group railyard.sim.run gives
    each rank (the simulator). See docs/python-api.md for every argument.
    """

    def __init__(self, group, hidden_dim: int, max_num_of_tokens_per_rank: int, num_local_experts: int,
                 use_fp8: bool = False, num_sms_dispatch: Optional[int] = None,
                 num_sms_combine: Optional[int] = None, max_top_k: Optional[int] = None,
                 ranks_per_domain: Optional[int] = None, timeout_cycles: Optional[int] = None,
                 check_routing: Optional[bool] = None, dispatch_chunk_rows: Optional[int] = None,
                 combine_chunk_rows: Optional[int] = None, handshake_timeout_cycles: Optional[int] = None,
                 transport: str = "auto", nccl_comm: Optional[int] = None):
        _positive("hidden_dim", hidden_dim)
        _positive("max_num_of_tokens_per_rank", max_num_of_tokens_per_rank)
        _positive("num_local_experts", num_local_experts)
        self._dispatch_sms = _optional_positive("num_sms_dispatch", num_sms_dispatch)
        self._combine_sms = _optional_positive("num_sms_combine", num_sms_combine)
        chunks = (_optional_positive("dispatch_chunk_rows", dispatch_chunk_rows),
                  _optional_positive("combine_chunk_rows", combine_chunk_rows))
        _check_group(group)
        world_size = group.size()
        num_experts = world_size * num_local_experts
        if max_top_k is None:
            max_top_k = num_experts
        elif isinstance(max_top_k, bool) or not isinstance(max_top_k, int) or not 1 <= max_top_k <= num_experts:
            raise ValueError(f"railyard.Buffer: max_top_k is {max_top_k!r}; expected 1..{num_experts} "
                             f"(the group's experts)")
        if ranks_per_domain is not None:
            _positive("ranks_per_domain", ranks_per_domain)
        if timeout_cycles is not None:
            _positive("timeout_cycles", timeout_cycles)
        if handshake_timeout_cycles is not None:
            _positive("handshake_timeout_cycles", handshake_timeout_cycles)
        if transport not in ("auto", "mlx5", "gin"):
            raise ValueError(f"railyard.Buffer: transport is {transport!r}; expected 'auto', 'mlx5' or 'gin'")
        if nccl_comm is not None and (isinstance(nccl_comm, bool) or not isinstance(nccl_comm, int) or nccl_comm <= 0):
            raise ValueError(f"railyard.Buffer: nccl_comm is {nccl_comm!r}; expected an ncclComm_t as a positive int")

        module, bootstrap, device = self._bootstrap(group)
        if nccl_comm is None and device.type == "cuda" and transport != "mlx5":
            from ._torch_group import nccl_comm_of

            nccl_comm = nccl_comm_of(group, device)  # GIN's, where torch exposes the group's
        if check_routing is None:
            check_routing = device.type == "cpu"  # free on the CPU; a sync on a GPU
        info = module.create_buffer(bootstrap, hidden_dim, max_num_of_tokens_per_rank, num_local_experts,
                                    bool(use_fp8), max_top_k, ranks_per_domain, self._dispatch_sms,
                                    self._combine_sms, *chunks, timeout_cycles or 0,
                                    handshake_timeout_cycles or 0, bool(check_routing), transport, nccl_comm or 0)
        self._module = module
        self._id = info["id"]
        self.group = group
        self.rank = info["rank"]
        self.world_size = world_size
        self.device = device
        self.hidden_dim = hidden_dim
        self.max_num_of_tokens_per_rank = max_num_of_tokens_per_rank
        self.num_local_experts = num_local_experts
        self.num_experts = num_experts
        self.max_top_k = max_top_k
        self.use_fp8 = bool(use_fp8)
        self.required_bytes = info["required_bytes"]
        # Ranks per NVLink domain: the override, else detected. Fewer than world_size:
        # the group spans several domains, joined by RDMA between rail peers.
        self.ranks_per_domain = info["ranks_per_domain"]
        # Between domains: "mlx5" or "gin" (transport="auto" resolved); "auto" for one domain.
        self.transport = info["transport"]
        _configs[self._id] = (hidden_dim, num_experts, num_local_experts, self.use_fp8)
        register = getattr(group, "_register_buffer", None)
        if register is not None:
            register(self)

    @staticmethod
    def _bootstrap(group):
        make = getattr(group, "_railyard_bootstrap", None)
        if make is not None:  # railyard.sim's group
            if _flavours.sim is None:
                raise RuntimeError("railyard: this installation has no simulator flavour (_C_sim)")
            return _flavours.sim, make(), torch.device("cpu")
        if _flavours.cuda is None or not torch.cuda.is_available():
            raise RuntimeError("railyard.Buffer over a torch.distributed group needs the CUDA flavour and a GPU; "
                               "on a machine without one, use railyard.sim.run (CPU tensors on simulated GPUs)")
        from ._torch_group import torch_bootstrap

        return _flavours.cuda, torch_bootstrap(_flavours.cuda, group), torch.device("cuda", torch.cuda.current_device())

    @property
    def id(self) -> int:
        return self._id

    def destroy(self) -> None:
        """Collective: releases the registered buffer. Handles and outputs stay valid."""
        if self._id is not None:
            self._module.destroy_buffer(self._id)
            self._id = None

    def synchronize(self) -> None:
        """Waits for this rank's stream (PyTorch's current CUDA stream; in the simulator
        every op has already finished). A kernel's wait that timed out raises
        railyard.TimeoutError naming the rank, what it waited for and the peer or row;
        a kernel that gave up the operation (bad routing on a rank, ranks whose
        operations differ) raises railyard.AbortedError naming the rank and why: where
        CUDA itself would only report a launch failure."""
        if self._id is None:
            raise RuntimeError("railyard.Buffer: this buffer was destroyed")
        try:
            self._module.synchronize_buffer(self._id)
        except RuntimeError as e:
            _reraise(e)

    def barrier(self) -> None:
        """Collective: returns once every rank of the group has entered this barrier on
        its buffer (after the buffer's earlier operations). Ranks that run different
        operations (one rank's barrier against another's dispatch) fail, every one with
        the same railyard.AbortedError naming the first rank that differs from rank 0."""
        if self._id is None:
            raise RuntimeError("railyard.Buffer: this buffer was destroyed")
        try:
            self._module.barrier_buffer(self._id)
        except RuntimeError as e:
            _reraise(e)

    # ---- dispatch -----------------------------------------------------------------------
    def _dispatch(self, layout, hidden, routing_map, probs, topk_idx, topk_weights, scaling_factor, handle,
                  max_rows, pad_multiple, num_sms):
        if self._id is None:
            raise RuntimeError("railyard.Buffer: this buffer was destroyed")
        num_sms = self._dispatch_sms if num_sms is None else _positive("num_sms", num_sms)
        _check_devices("dispatch", self.device, (("hidden", hidden), ("routing_map", routing_map), ("probs", probs),
                                                 ("topk_idx", topk_idx), ("topk_weights", topk_weights),
                                                 ("scaling_factor", scaling_factor)))
        token = None
        if handle is not None:
            if not isinstance(handle, Handle):
                raise TypeError(f"railyard.dispatch: handle is {type(handle).__name__}; expected a railyard.Handle")
            if routing_map is not None or probs is not None or topk_idx is not None or topk_weights is not None:
                raise ValueError("railyard.dispatch: routing (routing_map/probs/topk_idx/topk_weights) is given with "
                                 "handle; expected none (the handle holds the routing)")
            if _LAYOUT_NAMES[layout] != handle.layout:
                raise ValueError(f"railyard.dispatch: handle has the {handle.layout} layout; expected a handle of "
                                 f"{'dispatch' if layout == RECEIVED else 'dispatch_with_permute'}")
            token = handle.token
            max_rows = handle.num_rows if handle.bounded else None
            pad_multiple = handle.pad_multiple
            weights_given = True  # the handle's probabilities come along
        else:
            weights_given = probs is not None or topk_weights is not None
            if routing_map is not None and probs is None:
                probs = routing_map.to(torch.float32)
            if topk_idx is not None and topk_weights is None:
                topk_weights = torch.ones(topk_idx.shape, dtype=torch.float32, device=topk_idx.device)
        grad = torch.is_grad_enabled() and (hidden.requires_grad or (probs is not None and probs.requires_grad) or
                                            (topk_weights is not None and topk_weights.requires_grad))
        if grad:
            outs = _DispatchFn.apply(self._id, layout, pad_multiple, max_rows, num_sms, self._combine_sms, hidden,
                                     scaling_factor, topk_idx, topk_weights, routing_map, probs, token)
        else:
            outs = _dispatch_op(self._id, hidden, scaling_factor, topk_idx, topk_weights, routing_map, probs, token,
                                layout, pad_multiple, max_rows, num_sms)
        if handle is not None:
            return outs, handle, weights_given
        new_handle = Handle(token=outs[8], totals=outs[7], buffer_id=self._id, layout=_LAYOUT_NAMES[layout],
                            num_tokens=hidden.shape[0], pad_multiple=pad_multiple,
                            num_rows=outs[0].shape[0] if max_rows is None else max_rows,
                            bounded=max_rows is not None, num_local_experts=self.num_local_experts,
                            overflow_flag=outs[7][2] if layout == RECEIVED else outs[7][3])
        return outs, new_handle, weights_given

    def dispatch(self, hidden, routing_map=None, probs=None, topk_idx=None, topk_weights=None, scaling_factor=None,
                 handle=None, num_recv_tokens=None, num_sms=None) -> DispatchResult:
        """Each token to every rank holding one of its experts; rows by (source rank,
        source token). num_recv_tokens: a bound on received rows (no host sync)."""
        if num_recv_tokens is not None:
            _positive("num_recv_tokens", num_recv_tokens, minimum=0)
        outs, h, weights_given = self._dispatch(RECEIVED, hidden, routing_map, probs, topk_idx, topk_weights,
                                                   scaling_factor, handle, num_recv_tokens, 1, num_sms)
        tokens_per_expert = h.tokens_per_expert
        if h.bounded:  # count the rows written: rows past the true count hold nothing
            written = torch.arange(h.num_rows, device=outs[3].device) < h.num_recv_tokens
            tokens_per_expert = (outs[3] & written[:, None]).sum(0, dtype=torch.int64)
        return DispatchResult(hidden=outs[0], probs=outs[2] if weights_given else None,
                              scaling_factor=outs[1] if self.use_fp8 else None, routing_map=outs[3],
                              src_rank=outs[4], src_token=outs[5], tokens_per_expert=tokens_per_expert, handle=h)

    def dispatch_with_permute(self, hidden, routing_map=None, probs=None, scaling_factor=None, topk_idx=None,
                              topk_weights=None, num_of_experts_per_rank=None, pad_multiple=None,
                              num_permuted_tokens=None, non_blocking=False, fuse_permute_dispatch=True, handle=None,
                              num_sms=None) -> PermutedDispatchResult:
        """Rows grouped by local expert, each group zero-padded to pad_multiple.
        non_blocking=True needs num_permuted_tokens (the bound on rows)."""
        if num_of_experts_per_rank is not None and num_of_experts_per_rank != self.num_local_experts:
            raise ValueError(f"railyard.dispatch_with_permute: num_of_experts_per_rank is {num_of_experts_per_rank}; "
                             f"expected {self.num_local_experts} (the buffer's num_local_experts)")
        pad = 1 if pad_multiple is None else _positive("pad_multiple", pad_multiple)
        if handle is not None:
            if pad_multiple is not None and pad != handle.pad_multiple:
                raise ValueError(f"railyard.dispatch_with_permute: pad_multiple is {pad}; expected "
                                 f"{handle.pad_multiple} (the handle's)")
            pad = handle.pad_multiple
            max_rows = None  # the handle's bound; num_permuted_tokens, if given, describes the same rows
        elif non_blocking:
            if num_permuted_tokens is None:
                raise ValueError("railyard.dispatch_with_permute: non_blocking=True needs num_permuted_tokens (an "
                                 "upper bound on this rank's permuted rows); expected an int")
            max_rows = _positive("num_permuted_tokens", int(num_permuted_tokens), minimum=0)
        else:
            max_rows = None
        outs, h, weights_given = self._dispatch(EXPERT_GROUPED, hidden, routing_map, probs, topk_idx, topk_weights,
                                                   scaling_factor, handle, max_rows, pad, num_sms)
        return PermutedDispatchResult(hidden=outs[0], probs=outs[2] if weights_given else None,
                                      scaling_factor=outs[1] if self.use_fp8 else None,
                                      tokens_per_expert=h.kept_tokens_per_expert, handle=h)

    # ---- combine ------------------------------------------------------------------------
    def _combine(self, hidden, probs, handle, num_sms):
        if self._id is None:
            raise RuntimeError("railyard.Buffer: this buffer was destroyed")
        if not isinstance(handle, Handle):
            raise TypeError(f"railyard.combine: handle is {type(handle).__name__}; expected the railyard.Handle "
                            f"of a dispatch")
        num_sms = self._combine_sms if num_sms is None else _positive("num_sms", num_sms)
        _check_devices("combine", self.device, (("hidden", hidden), ("probs", probs)))
        if torch.is_grad_enabled() and (hidden.requires_grad or (probs is not None and probs.requires_grad)):
            layout = RECEIVED if handle.layout == "received" else EXPERT_GROUPED
            out, out_probs = _CombineFn.apply(self._id, handle.token, handle.num_tokens, num_sms, self._dispatch_sms,
                                              layout, handle.pad_multiple,
                                              handle.num_rows if handle.bounded else None, hidden, probs)
        else:
            out, out_probs = _combine_op(self._id, handle.token, hidden, probs, handle.num_tokens, num_sms)
        return CombineResult(hidden=out, probs=out_probs if probs is not None else None)

    def combine(self, hidden, probs=None, handle=None, num_sms=None) -> CombineResult:
        """Sums each token's rows (fp32, fixed order, one rounding to bf16)."""
        if handle is not None and handle.layout != "received":
            raise ValueError("railyard.combine: handle is of dispatch_with_permute; expected combine_with_unpermute")
        return self._combine(hidden, probs, handle, num_sms)

    def combine_with_unpermute(self, hidden, probs=None, handle=None, pad_multiple=None,
                               fuse_unpermute_combine=True, num_sms=None) -> CombineResult:
        """combine for the expert-grouped rows of dispatch_with_permute."""
        if handle is not None and handle.layout != "expert_grouped":
            raise ValueError("railyard.combine_with_unpermute: handle is of dispatch; expected combine")
        if handle is not None and pad_multiple is not None and pad_multiple != handle.pad_multiple:
            raise ValueError(f"railyard.combine_with_unpermute: pad_multiple is {pad_multiple}; expected "
                             f"{handle.pad_multiple} (the handle's)")
        return self._combine(hidden, probs, handle, num_sms)

    def __repr__(self):
        return (f"railyard.Buffer(rank={self.rank}/{self.world_size}, hidden_dim={self.hidden_dim}, "
                f"max_num_of_tokens_per_rank={self.max_num_of_tokens_per_rank}, "
                f"num_local_experts={self.num_local_experts}, use_fp8={self.use_fp8}, device={self.device})")
