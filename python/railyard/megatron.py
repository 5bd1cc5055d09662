"""Megatron Core drop-in: Railyard as the "hybridep" backend of the flex token dispatcher.

Usage (see docs/megatron.md)::

    import railyard.megatron
    railyard.megatron.install()      # before the model is built; no edit to Megatron's files

then train with ``--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep``.

``install()`` patches ``megatron.core.transformer.moe.fused_a2a`` in memory:
``HybridEPBuffer`` becomes :class:`HybridEPBuffer` below, ``HAVE_HYBRIDEP`` becomes True,
and, when Megatron found no DeepEP (``hybrid_ep_dispatch`` / ``hybrid_ep_combine`` are
None there and in every ``megatron.*`` module that imported them by name, such as
``token_dispatcher``), it defines those two functions the way Megatron does: thin calls
of Megatron's own ``HybridEPDispatch.apply`` / ``HybridEPCombine.apply``. Megatron's
autograd functions, its module-global buffer and its dispatcher then run unchanged; only
the buffer object is Railyard's. ``uninstall()`` puts every patched name back.

:class:`HybridEPBuffer` has DeepEP's ``HybridEPBuffer`` constructor, attributes and
methods (``dispatch`` / ``combine``, ``dispatch_with_permute`` /
``combine_with_unpermute``) with their return tuples, and delegates to
:class:`railyard.Buffer`'s methods of the same names. Its token capacity is DeepEP's (at
least 512, a multiple of 64) and grows when a batch needs more (docs/megatron.md).

One Railyard buffer per rank. Megatron keeps one module-global buffer per process.
On GPUs a process is a rank, so that is one :class:`railyard.Buffer`. Under
``railyard.sim`` the ranks are threads of one process and share Megatron's global, so
the adapter keeps one :class:`railyard.Buffer` per rank: it is created on the rank
thread's first call, with that thread's own group (``railyard.sim.current_group()``),
and later calls on that thread find it again. Adapters built with the same settings
during a simulation are one object, so the race in Megatron's "create the global buffer
if it is None" (two rank threads may both create one) cannot give a rank two
Railyard buffers.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import threading
import warnings
import weakref
from typing import Any, Dict, Optional, Tuple

import torch

__all__ = ["HybridEPBuffer", "install", "uninstall", "is_installed"]

_FUSED_A2A = "megatron.core.transformer.moe.fused_a2a"
_TOKEN_DISPATCHER = "megatron.core.transformer.moe.token_dispatcher"

_MISSING = object()  # "the module had no such attribute" (restored by deleting it)


def _railyard():
    # Imported lazily: the ops extension loads on first use of the adapter, not when
    # ``install()`` patches Megatron.
    import railyard

    return railyard


def _current_sim_group():
    """The calling rank thread's group under ``railyard.sim.run``, else None."""
    try:
        import railyard.sim as sim
    except ImportError:  # a build without the simulator
        return None
    current = getattr(sim, "current_group", None)
    return current() if current is not None else None


# --------------------------------------------------------------------------- buffer


# Keyword arguments of DeepEP's HybridEPBuffer constructor that Railyard accepts and
# ignores (docs/megatron.md, "How the options map"): Railyard has no separate
# preprocessing, permute or unpermute kernels, and derives the expert count from the
# group (world size x num_local_experts).
_IGNORED_INIT_OPTIONS = ("num_sms_preprocessing_api", "num_blocks_permute", "num_blocks_unpermute",
                         "num_of_experts", "load_cached_kernels", "use_shared_buffer", "enable_custom_allgather",
                         "num_of_hybrid_ep_ranks_per_nvlink_domain", "use_mnnvl")
# Keyword arguments passed through to railyard.Buffer unchanged.
_BUFFER_OPTIONS = ("max_top_k", "ranks_per_domain", "timeout_cycles", "handshake_timeout_cycles", "transport")

# Settings from install(): applied to every buffer created afterwards.
_install_options: Dict[str, Any] = {}

# Adapters created under the simulator, by settings (see the module docstring).
_sim_adapters: "weakref.WeakValueDictionary[Tuple, HybridEPBuffer]" = weakref.WeakValueDictionary()
_sim_adapters_lock = threading.Lock()


def _int_or_none(value, name):
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name}: expected an int or a one-element tensor, got shape {tuple(value.shape)}")
        return int(value.item())  # a host read: pass an int to avoid it
    return int(value)


_warned = set()

# DeepEP's sizing of the token capacity (its Configurer): at least 512, a multiple of 64
# (its combine chunk). Megatron's moe_hybridep_pad_uneven_dispatch_inputs pads token
# counts to a multiple of 64 (HYBRIDEP_TOKEN_ALIGNMENT), so the padding of a batch that
# fitted before rounding fits after it.
_MIN_TOKENS = 512
_TOKEN_ALIGNMENT = 64


def _capacity_for(num_tokens: int) -> int:
    return max(_MIN_TOKENS, -(-int(num_tokens) // _TOKEN_ALIGNMENT) * _TOKEN_ALIGNMENT)


def _as_fp8(hidden):
    """DeepEP takes FP8 tokens as torch.uint8 bytes too: view them as float8_e4m3fn."""
    return hidden.view(torch.float8_e4m3fn) if hidden.dtype == torch.uint8 else hidden


def _warn_unknown(method, kwargs):
    for name in kwargs:
        if (method, name) not in _warned:
            _warned.add((method, name))
            warnings.warn(f"railyard.megatron.HybridEPBuffer.{method}: option {name!r} is not known to "
                          "Railyard and has no effect", stacklevel=3)


class HybridEPBuffer:
    """DeepEP's ``HybridEPBuffer`` interface over :class:`railyard.Buffer`.

    Arguments map as follows (docs/megatron.md has the table):

    * ``group``, ``hidden_dim``, ``num_local_experts``, ``use_fp8``: the same arguments
      of :class:`railyard.Buffer` (under ``railyard.sim`` each rank uses its own group);
    * ``max_num_of_tokens_per_rank``: the same, raised to
      ``install(max_num_of_tokens_per_rank=...)`` when that is larger, then to DeepEP's
      size (at least 512, a multiple of 64); every rank must end up with the same value
      (Railyard checks it at creation). A larger batch grows it, on every rank in the
      same call;
    * ``num_sms_dispatch_api`` / ``num_sms_combine_api``: ``num_sms_dispatch`` /
      ``num_sms_combine`` (None: Railyard's default);
    * ``nvlink_domain_size``: ``ranks_per_domain``; ``max_top_k``, ``ranks_per_domain``,
      ``timeout_cycles``, ``handshake_timeout_cycles``, ``transport``: passed through;
    * ``num_sms_preprocessing_api``, ``num_blocks_permute``, ``num_blocks_unpermute``:
      accepted, no effect (Railyard's metadata kernel is one block per rank, and the
      permute / unpermute are done inside the dispatch / combine kernels).

    The :class:`railyard.Buffer` is created on the first ``dispatch_with_permute`` (a
    collective: every rank dispatches together), not here.
    """

    def __new__(cls, group=None, hidden_dim=None, max_num_of_tokens_per_rank=None, num_local_experts=None,
                use_fp8=False, num_sms_dispatch_api=None, num_sms_combine_api=None,
                num_sms_preprocessing_api=None, num_blocks_permute=None, num_blocks_unpermute=None,
                **kwargs):
        if _current_sim_group() is None:
            return super().__new__(cls)
        key = cls._settings_key(hidden_dim, max_num_of_tokens_per_rank, num_local_experts, use_fp8,
                                num_sms_dispatch_api, num_sms_combine_api, kwargs)
        with _sim_adapters_lock:
            obj = _sim_adapters.get(key)
            if obj is None:
                obj = super().__new__(cls)
                obj._initialised = False
                _sim_adapters[key] = obj
            return obj

    @staticmethod
    def _settings_key(hidden_dim, max_tokens, num_local_experts, use_fp8, sms_dispatch, sms_combine, kwargs):
        extra = tuple(sorted((k, repr(v)) for k, v in kwargs.items()))
        opts = tuple(sorted((k, repr(v)) for k, v in _install_options.items()))
        if max_tokens is not None:  # the capacity the buffer will have (install()'s floor applied)
            max_tokens = _capacity_for(max(int(max_tokens), int(_install_options.get("max_num_of_tokens_per_rank") or 0)))
        return (hidden_dim, max_tokens, num_local_experts, bool(use_fp8),
                sms_dispatch, sms_combine, extra, opts)

    def __init__(self, group=None, hidden_dim=None, max_num_of_tokens_per_rank=None, num_local_experts=None,
                 use_fp8=False, num_sms_dispatch_api=None, num_sms_combine_api=None,
                 num_sms_preprocessing_api=None, num_blocks_permute=None, num_blocks_unpermute=None,
                 **kwargs):
        if getattr(self, "_initialised", False):
            return  # the shared adapter of these settings (simulator), already set up
        if hidden_dim is None or max_num_of_tokens_per_rank is None or num_local_experts is None:
            raise TypeError("HybridEPBuffer: hidden_dim, max_num_of_tokens_per_rank and num_local_experts are required")
        self.group = group
        self.hidden_dim = int(hidden_dim)
        self.num_local_experts = int(num_local_experts)
        self.use_fp8 = bool(use_fp8)
        self.num_sms_dispatch_api = num_sms_dispatch_api
        self.num_sms_combine_api = num_sms_combine_api
        # Accepted for DeepEP compatibility; no effect (see the class docstring).
        self.num_sms_preprocessing_api = num_sms_preprocessing_api
        self.num_blocks_permute = num_blocks_permute
        self.num_blocks_unpermute = num_blocks_unpermute

        floor = _install_options.get("max_num_of_tokens_per_rank")
        self._max_tokens = _capacity_for(max(int(max_num_of_tokens_per_rank), int(floor or 0)))

        options: Dict[str, Any] = {}
        for name, value in kwargs.items():
            if name == "nvlink_domain_size":
                if value is not None:
                    options["ranks_per_domain"] = int(value)
            elif name in _BUFFER_OPTIONS:
                if value is not None:
                    options[name] = value
            elif name in _IGNORED_INIT_OPTIONS:
                pass
            else:
                warnings.warn(f"railyard.megatron.HybridEPBuffer: option {name!r} is not known to Railyard and has no effect",
                              stacklevel=2)
        for name in _BUFFER_OPTIONS:
            if name in _install_options and _install_options[name] is not None:
                options[name] = _install_options[name]
        if _install_options.get("num_sms_dispatch") is not None:
            self.num_sms_dispatch_api = _install_options["num_sms_dispatch"]
        if _install_options.get("num_sms_combine") is not None:
            self.num_sms_combine_api = _install_options["num_sms_combine"]
        self._buffer_options = options

        # One railyard.Buffer per rank: key id(group) -> (group, Buffer). The group is
        # held so that its id is not reused while the entry lives.
        self._buffers: Dict[int, Tuple[Any, Any]] = {}
        # Buffers replaced by a larger one (growth), per group: their handles stay valid.
        self._retired: Dict[int, list] = {}
        self._lock = threading.Lock()
        self._initialised = True

    # -- the rank's railyard.Buffer ------------------------------------------------

    def _rank_group(self):
        g = _current_sim_group()
        if g is not None:
            return g
        if self.group is None:
            raise ValueError("railyard.megatron.HybridEPBuffer: no group (pass group=, or run under railyard.sim)")
        return self.group

    def _get_buffer(self, create: bool):
        group = self._rank_group()
        entry = self._buffers.get(id(group))
        if entry is not None:
            return entry[1]
        if not create:
            raise RuntimeError(
                "railyard.megatron.HybridEPBuffer: this rank has no Railyard buffer yet "
                "(combine_with_unpermute, or dispatch_with_permute with a handle, before any dispatch)")
        return self._create(group, self._max_tokens)

    def _create(self, group, max_tokens):
        """Collective: the rank's railyard.Buffer with `max_tokens` of capacity."""
        buf = _railyard().Buffer(
            group,
            hidden_dim=self.hidden_dim,
            max_num_of_tokens_per_rank=max_tokens,
            num_local_experts=self.num_local_experts,
            use_fp8=self.use_fp8,
            num_sms_dispatch=self.num_sms_dispatch_api,
            num_sms_combine=self.num_sms_combine_api,
            **self._buffer_options,
        )
        with self._lock:
            self._buffers[id(group)] = (group, buf)
        return buf

    def _buffer_for(self, num_tokens: int, handle):
        """The rank's buffer for a call: the one that made `handle`, or one with room
        for `num_tokens` (grown collectively, as DeepEP's update_template_config: the
        capacity only grows)."""
        if handle is not None:
            return self._buffer_of_handle(handle)
        group = self._rank_group()
        entry = self._buffers.get(id(group))
        if entry is None:  # the first dispatch: room for its batch from the start
            return self._create(group, max(self._max_tokens, _capacity_for(num_tokens)))
        buf = entry[1]
        if num_tokens <= buf.max_num_of_tokens_per_rank:
            return buf
        # Every rank must grow in the same call: under Megatron's padding of uneven
        # inputs every rank has the same token count. A barrier on the old buffer comes
        # first: a rank that is not growing is in a dispatch of it instead, and the two
        # operations differ, so every rank fails at once with the same report (rather
        # than the growing ranks waiting in the creation and the others in the dispatch
        # until a budget runs out). The new buffer's creation checks that the ranks
        # agree on its capacity.
        try:
            buf.barrier()
        except RuntimeError as e:  # railyard.AbortedError: keep the class, add the batch and capacity
            raise type(e)(
                f"railyard.megatron.HybridEPBuffer: this rank's batch of {num_tokens} tokens exceeds the buffer's "
                f"capacity of {buf.max_num_of_tokens_per_rank}, and not every rank grows its buffer in the same call "
                f"(every rank must; pass the largest count up front with install(max_num_of_tokens_per_rank=...)): "
                f"{e}") from e
        with self._lock:  # handles of the old buffer stay valid: keep it until destroy()
            self._retired.setdefault(id(group), []).append(buf)
        return self._create(group, _capacity_for(num_tokens))

    def _buffer_of_handle(self, handle):
        if not isinstance(handle, _railyard().Handle):
            raise TypeError(f"railyard.megatron.HybridEPBuffer: handle is a {type(handle).__name__}; expected "
                            "the railyard.Handle a dispatch returned")
        group = self._rank_group()
        current = self._get_buffer(create=False)
        for buf in [current] + self._retired.get(id(group), []):
            if buf.id == handle.buffer_id:
                return buf
        raise ValueError("railyard.megatron.HybridEPBuffer: handle belongs to a buffer this rank has destroyed; "
                         "expected the handle of a dispatch of this buffer")

    @property
    def max_num_of_tokens_per_rank(self) -> int:
        """The calling rank's token capacity: its buffer's (grown, if a batch needed
        more), else what the buffer will be created with."""
        group = self._rank_group() if (self.group is not None or _current_sim_group() is not None) else None
        entry = self._buffers.get(id(group)) if group is not None else None
        return entry[1].max_num_of_tokens_per_rank if entry is not None else self._max_tokens

    @property
    def buffer(self):
        """The calling rank's :class:`railyard.Buffer` (created by its first dispatch)."""
        return self._get_buffer(create=False)

    def destroy(self):
        """Collective: release the calling rank's :class:`railyard.Buffer` (if any)."""
        group = self._rank_group()
        with self._lock:
            entry = self._buffers.pop(id(group), None)
            retired = self._retired.pop(id(group), [])
        for buf in retired + ([entry[1]] if entry is not None else []):
            buf.destroy()

    # -- Megatron's calls ----------------------------------------------------------

    # -- DeepEP's attributes (of the calling rank) ------------------------------------

    @property
    def rank(self) -> int:
        return self._rank_group().rank()

    @property
    def group_size(self) -> int:
        return self._rank_group().size()

    @property
    def num_of_hybrid_ep_ranks_per_nvlink_domain(self) -> int:
        """Ranks per NVLink domain: ``nvlink_domain_size`` / ``ranks_per_domain`` when
        given, else what the rank's buffer detected, else (no buffer yet) the whole
        group. ``num_of_nodes`` (DeepEP's name for the domains) follows from it."""
        given = self._buffer_options.get("ranks_per_domain")
        if given:
            return int(given)
        entry = self._buffers.get(id(self._rank_group()))
        return int(entry[1].ranks_per_domain) if entry is not None else self.group_size

    @property
    def local_rank(self) -> int:
        return self.rank % self.num_of_hybrid_ep_ranks_per_nvlink_domain

    @property
    def node_rank(self) -> int:
        return self.rank // self.num_of_hybrid_ep_ranks_per_nvlink_domain

    @property
    def num_of_nodes(self) -> int:
        return self.group_size // self.num_of_hybrid_ep_ranks_per_nvlink_domain

    # -- DeepEP's calls ----------------------------------------------------------------

    def _tokens(self, hidden, scaling_factor, use_fp8=None):
        """DeepEP's token forms: uint8 bytes for FP8, scaling_factor ignored with BF16."""
        if not isinstance(hidden, torch.Tensor):
            raise TypeError(f"railyard.megatron.HybridEPBuffer: hidden is a {type(hidden).__name__}; "
                            "expected a torch.Tensor")
        if use_fp8 is not None and bool(use_fp8) != self.use_fp8:
            raise ValueError(f"railyard.megatron.HybridEPBuffer: use_fp8 is {use_fp8}; expected {self.use_fp8} "
                             "(the buffer's, fixed at creation)")
        if self.use_fp8:
            hidden = _as_fp8(hidden)
        elif hidden.dtype == torch.bfloat16:
            scaling_factor = None  # DeepEP ignores it for BF16 tokens
        scaling_factor = scaling_factor.contiguous() if scaling_factor is not None else None
        return hidden.contiguous(), scaling_factor

    def _check_num_of_experts(self, num_of_experts):
        expected = self.num_local_experts * self.group_size
        if num_of_experts is not None and int(num_of_experts) != expected:
            raise ValueError(f"railyard.megatron.HybridEPBuffer: num_of_experts is {num_of_experts}; expected "
                             f"{expected} (num_local_experts x the group's ranks)")

    def dispatch(self, hidden, scaling_factor=None, topk_idx=None, topk_weights=None, num_of_experts=None,
                 probs=None, routing_map=None, num_dispatched_tokens_tensor=None, num_dispatched_tokens=None,
                 handle=None, **kwargs):
        """DeepEP's non-permuted dispatch: ``railyard.Buffer.dispatch``.

        Returns DeepEP's ``(hidden [N, H], probs fp32 [N, E_local x ranks per domain] or
        None, scaling_factor or None, handle)``: the probs columns of this rank's
        experts, ``[local_rank x E_local, (local_rank + 1) x E_local)``, hold its
        experts' probabilities; the other columns are 0. FP8 tokens may be uint8
        (returned as uint8). ``num_dispatched_tokens`` bounds the rows (no host sync);
        ``num_dispatched_tokens_tensor`` is not read.
        """
        _warn_unknown("dispatch", kwargs)
        self._check_num_of_experts(num_of_experts)
        tokens, scaling_factor = self._tokens(hidden, scaling_factor)
        buf = self._buffer_for(tokens.shape[0], handle)
        r = buf.dispatch(tokens, routing_map=routing_map.contiguous() if routing_map is not None else None,
                         probs=probs.contiguous() if probs is not None else None, topk_idx=topk_idx,
                         topk_weights=topk_weights, scaling_factor=scaling_factor, handle=handle,
                         num_recv_tokens=_int_or_none(num_dispatched_tokens, "num_dispatched_tokens"))
        out = r.hidden.view(torch.uint8) if hidden.dtype == torch.uint8 else r.hidden
        domain_probs = None
        if r.probs is not None:
            El, lr = self.num_local_experts, self.local_rank
            domain_probs = r.probs.new_zeros(r.probs.shape[0], El * self.num_of_hybrid_ep_ranks_per_nvlink_domain)
            domain_probs[:, lr * El:(lr + 1) * El] = r.probs
        return out, domain_probs, r.scaling_factor, r.handle

    def combine(self, hidden, probs=None, handle=None, **kwargs):
        """DeepEP's non-permuted combine: ``railyard.Buffer.combine``. ``probs`` is
        ``[N, E_local x ranks per domain]`` (DeepEP's layout; this rank's columns are
        read). Returns ``(combined [T, H], combined_probs fp32 [T, E] or None)``."""
        _warn_unknown("combine", kwargs)
        if handle is None:
            raise ValueError("railyard.megatron.HybridEPBuffer.combine: handle is required (the handle of the dispatch)")
        buf = self._buffer_of_handle(handle)
        if probs is not None:
            El, lr = self.num_local_experts, self.local_rank
            width = El * self.num_of_hybrid_ep_ranks_per_nvlink_domain
            if probs.dim() != 2 or probs.shape[1] != width:
                raise ValueError(f"railyard.megatron.HybridEPBuffer.combine: probs has shape {tuple(probs.shape)}; "
                                 f"expected [rows, {width}] (experts per rank x ranks per NVLink domain)")
            probs = probs[:, lr * El:(lr + 1) * El].contiguous()
        c = buf.combine(hidden.contiguous(), probs=probs, handle=handle)
        return c.hidden, c.probs

    # -- Megatron's calls ----------------------------------------------------------

    def dispatch_with_permute(self, *, hidden, topk_idx=None, topk_weights=None, routing_map=None, probs=None,
                              scaling_factor=None, num_of_experts_per_rank=None, num_of_experts=None,
                              use_fp8=None, pad_multiple=None, num_permuted_tokens=None, non_blocking=False,
                              fuse_permute_dispatch=True, handle=None, num_dispatched_tokens=None,
                              use_host_meta=None, num_sms=None, **kwargs):
        """Dispatch with the expert-grouped layout: ``railyard.Buffer.dispatch_with_permute``.

        Returns ``(hidden [P, H], probs fp32 [P], scaling_factor, tokens_per_expert int64
        [E_local] (padded; when a bound dropped rows, the rows kept), handle)``. With
        ``handle`` (the backward of Megatron's ``HybridEPCombine``) the handle fixes the
        layout and the row count, and ``num_permuted_tokens`` is not needed (Megatron
        passes it, sometimes as a device tensor; it is not read then).
        ``num_dispatched_tokens`` and ``use_host_meta`` (DeepEP) have no effect.
        """
        self._check_num_of_experts(num_of_experts)
        tokens, scaling_factor = self._tokens(hidden, scaling_factor, use_fp8)
        buf = self._buffer_for(tokens.shape[0], handle)
        if handle is not None:
            num_permuted_tokens = None
            non_blocking = False
        else:
            num_permuted_tokens = _int_or_none(num_permuted_tokens, "num_permuted_tokens")
            if num_permuted_tokens is not None and not non_blocking:
                # DeepEP sizes its outputs with num_permuted_tokens and skips the host
                # read whenever it is given; that is Railyard's bounded mode.
                non_blocking = True
        if probs is not None:
            probs = probs.contiguous()
        if routing_map is not None:
            routing_map = routing_map.contiguous()
        _warn_unknown("dispatch_with_permute", kwargs)
        r = buf.dispatch_with_permute(
            tokens,
            routing_map=routing_map,
            probs=probs,
            scaling_factor=scaling_factor,
            topk_idx=topk_idx,
            topk_weights=topk_weights,
            num_of_experts_per_rank=num_of_experts_per_rank,
            pad_multiple=pad_multiple,
            num_permuted_tokens=num_permuted_tokens,
            non_blocking=non_blocking,
            fuse_permute_dispatch=fuse_permute_dispatch,
            handle=handle,
            num_sms=num_sms,
        )
        if hidden.dtype == torch.uint8:
            r = r._replace(hidden=r.hidden.view(torch.uint8))
        return r

    def combine_with_unpermute(self, *, hidden, probs=None, handle=None, pad_multiple=None,
                               fuse_unpermute_combine=True, num_dispatched_tokens=None, num_sms=None, **kwargs):
        """Combine from the expert-grouped layout: ``railyard.Buffer.combine_with_unpermute``.

        Returns ``(combined [T, H], combined_probs fp32 [T, E] or None)``: an unweighted
        sum, fp32-accumulated in a fixed order.
        """
        if handle is None:
            raise ValueError("combine_with_unpermute: handle is required (the handle of the dispatch)")
        _warn_unknown("combine_with_unpermute", kwargs)
        buf = self._buffer_of_handle(handle)
        hidden = hidden.contiguous()
        if probs is not None:
            probs = probs.contiguous()
        return buf.combine_with_unpermute(
            hidden,
            probs=probs,
            handle=handle,
            pad_multiple=pad_multiple,
            fuse_unpermute_combine=fuse_unpermute_combine,
            num_sms=num_sms,
        )

    def __repr__(self):
        return (f"railyard.megatron.HybridEPBuffer(hidden_dim={self.hidden_dim}, "
                f"max_num_of_tokens_per_rank={self.max_num_of_tokens_per_rank}, "
                f"num_local_experts={self.num_local_experts}, use_fp8={self.use_fp8}, "
                f"ranks_with_buffers={len(self._buffers)})")


# --------------------------------------------------------------------------- install


_installed = False
_saved = []  # (module, name, original value or _MISSING), in patch order
_install_lock = threading.RLock()


def _make_forwarders(fused_a2a):
    """``hybrid_ep_dispatch`` / ``hybrid_ep_combine`` as Megatron defines them when DeepEP
    is present: the arguments, bound to the signature of Megatron's own autograd
    function's ``forward`` (minus ``ctx``), go positionally to its ``apply``."""

    def forwarder(fn_cls, name):
        params = list(inspect.signature(fn_cls.forward).parameters.values())[1:]  # drop ctx
        sig = inspect.Signature(params)

        def call(*args, **kwargs):
            bound = sig.bind(*args, **kwargs)
            bound.apply_defaults()
            return fn_cls.apply(*bound.args)

        call.__name__ = call.__qualname__ = name
        call.__module__ = fused_a2a.__name__
        call.__signature__ = sig
        call.__doc__ = (f"{name}: Railyard's stand-in for Megatron's function of that name "
                        f"(railyard.megatron.install); calls {fn_cls.__name__}.apply.")
        call._railyard_forwarder = True
        return call

    return (forwarder(fused_a2a.HybridEPDispatch, "hybrid_ep_dispatch"),
            forwarder(fused_a2a.HybridEPCombine, "hybrid_ep_combine"))


def _patch(module, name, value):
    _saved.append((module, name, getattr(module, name, _MISSING)))
    setattr(module, name, value)


def install(*, max_num_of_tokens_per_rank: Optional[int] = None, num_sms_dispatch: Optional[int] = None,
            num_sms_combine: Optional[int] = None, max_top_k: Optional[int] = None,
            ranks_per_domain: Optional[int] = None, timeout_cycles: Optional[int] = None,
            handshake_timeout_cycles: Optional[int] = None, transport: Optional[str] = None) -> None:
    """Make Railyard the backend of Megatron Core's ``hybridep`` flex dispatcher.

    Call once per process, before the MoE layers are built (the dispatcher checks for
    ``hybrid_ep_dispatch`` in its constructor) and before the first forward step.
    Works whether or not Megatron was imported already (it imports
    ``megatron.core.transformer.moe.fused_a2a`` and ``token_dispatcher``). Calling it
    again only updates the options. Megatron's files are not modified and no
    ``deep_ep`` module is created.

    Options (None: keep Megatron's value / Railyard's default), for buffers created
    afterwards:

    * ``max_num_of_tokens_per_rank``: a floor for the buffer's token capacity. Megatron
      sizes the buffer from the first batch's token count; set this when later batches
      (or other ranks) can have more tokens.
    * ``num_sms_dispatch`` / ``num_sms_combine``: override Megatron's
      ``moe_hybridep_num_sms``.
    * ``max_top_k``, ``ranks_per_domain``, ``timeout_cycles``, ``handshake_timeout_cycles``,
      ``transport`` (between NVLink domains: ``"auto"``, ``"mlx5"`` or ``"gin"``; GIN takes
      the process group's NCCL communicator): :class:`railyard.Buffer`'s.
    """
    global _installed
    with _install_lock:
        options = dict(max_num_of_tokens_per_rank=max_num_of_tokens_per_rank, num_sms_dispatch=num_sms_dispatch,
                       num_sms_combine=num_sms_combine, max_top_k=max_top_k, ranks_per_domain=ranks_per_domain,
                       timeout_cycles=timeout_cycles, handshake_timeout_cycles=handshake_timeout_cycles,
                       transport=transport)
        _install_options.clear()
        _install_options.update({k: v for k, v in options.items() if v is not None})
        if _installed:
            return
        try:
            fused_a2a = importlib.import_module(_FUSED_A2A)
        except ImportError as exc:
            raise ImportError(f"railyard.megatron.install: Megatron Core is not importable ({exc}); "
                              "pip install megatron-core") from exc
        try:
            _patch(fused_a2a, "HybridEPBuffer", HybridEPBuffer)
            _patch(fused_a2a, "HAVE_HYBRIDEP", True)
            previous = fused_a2a.__dict__.get("_hybrid_ep_buffer")
            if previous is not None and not isinstance(previous, HybridEPBuffer):
                # A DeepEP buffer made before install(): the next dispatch makes ours.
                _patch(fused_a2a, "_hybrid_ep_buffer", None)
            dispatch_fn, combine_fn = _make_forwarders(fused_a2a)
            if getattr(fused_a2a, "hybrid_ep_dispatch", None) is None:
                _patch(fused_a2a, "hybrid_ep_dispatch", dispatch_fn)
            if getattr(fused_a2a, "hybrid_ep_combine", None) is None:
                _patch(fused_a2a, "hybrid_ep_combine", combine_fn)
            # Modules that imported the names before install() hold the old None.
            importlib.import_module(_TOKEN_DISPATCHER)
            for mod_name, mod in list(sys.modules.items()):
                if mod is None or mod is fused_a2a or not (mod_name == "megatron" or mod_name.startswith("megatron.")):
                    continue
                names = getattr(mod, "__dict__", {})
                if "hybrid_ep_dispatch" in names and names["hybrid_ep_dispatch"] is None:
                    _patch(mod, "hybrid_ep_dispatch", fused_a2a.hybrid_ep_dispatch)
                if "hybrid_ep_combine" in names and names["hybrid_ep_combine"] is None:
                    _patch(mod, "hybrid_ep_combine", fused_a2a.hybrid_ep_combine)
        except BaseException:
            _restore()
            raise
        _installed = True


def _restore():
    while _saved:
        module, name, value = _saved.pop()
        if value is _MISSING:
            module.__dict__.pop(name, None)
        else:
            setattr(module, name, value)


def uninstall() -> None:
    """Undo :func:`install`: every patched name gets its previous value back (names
    Megatron did not define are removed again), and Megatron's global buffer is dropped
    if it is Railyard's. Does nothing if not installed."""
    global _installed
    with _install_lock:
        if not _installed:
            return
        fused_a2a = sys.modules.get(_FUSED_A2A)
        if fused_a2a is not None and isinstance(fused_a2a.__dict__.get("_hybrid_ep_buffer"), HybridEPBuffer):
            fused_a2a._hybrid_ep_buffer = None
        _restore()
        _install_options.clear()
        _installed = False


def is_installed() -> bool:
    """Whether :func:`install` is in effect."""
    return _installed
