"""Fake (meta) implementations of torch.ops.railyard.*: output shapes without running
anything, so torch.compile can trace a module that calls the ops. Bounded
dispatches have static shapes; blocking ones an unbacked symbolic row count."""
import torch

from ._buffer import _configs


def _empty(shape, dtype, device):
    return torch.empty(shape, dtype=dtype, device=device)


@torch.library.register_fake("railyard::dispatch")
def _dispatch_fake(buffer, hidden, scales, topk_idx, topk_weights, routing_map, probs, handle, layout, pad_multiple,
                   max_rows, num_sms):
    H, _, El, fp8 = _configs[buffer]
    n = max_rows if max_rows is not None else torch.library.get_ctx().new_dynamic_size()
    dev = hidden.device
    received = layout == 0
    return (
        _empty((n, H), hidden.dtype, dev),
        _empty((n, H // 128) if fp8 else (0,), torch.float32, dev),
        _empty((n, El) if received else (n,), torch.float32, dev),
        _empty((n, El) if received else (0,), torch.bool, dev),
        _empty((n,) if received else (0,), torch.int32, dev),
        _empty((n,) if received else (0,), torch.int32, dev),
        _empty((0,) if received else (n,), torch.int64, dev),
        _empty((4 + 2 * El,), torch.int64, dev),
        _empty((2,), torch.int64, torch.device("cpu")),
    )


@torch.library.register_fake("railyard::combine")
def _combine_fake(buffer, handle, hidden, probs, num_tokens, num_sms):
    H, E, _, _ = _configs[buffer]
    dev = hidden.device
    return (_empty((num_tokens, H), torch.bfloat16, dev),
            _empty((num_tokens, E) if probs is not None else (0,), torch.float32, dev))


def _mark_collectives_effectful():
    """dispatch and combine are collectives: every rank must run each call, even when a
    graph leaves its outputs unused. An op with a registered effect is kept by FX's
    dead-code elimination and by inductor (torch.fx.node / torch._library.utils.is_impure
    test for it) and keeps its order among effectful ops (AOTAutograd threads a token
    through them)."""
    try:
        from torch._library.effects import EffectType
    except ImportError:  # torch < 2.6
        from torch._higher_order_ops.effects import _EffectType as EffectType
    register = getattr(torch.library, "_register_effectful_op", None)
    for op in (torch.ops.railyard.dispatch.default, torch.ops.railyard.combine.default):
        if register is not None:
            register(op, EffectType.ORDERED)
        else:
            from torch._higher_order_ops.effects import _register_effectful_op

            _register_effectful_op(op, EffectType.ORDERED)


_mark_collectives_effectful()
