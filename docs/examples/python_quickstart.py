"""docs/python-api.md's worked example: a MoE layer's dispatch, expert compute and
combine, with gradients, on 4 simulated GPUs (CPU tensors). With GPUs the same
Buffer calls run over a torch.distributed group on CUDA tensors.

    python docs/examples/python_quickstart.py
"""
import torch

import railyard
import railyard.sim

HIDDEN, TOKENS, LOCAL_EXPERTS, TOP_K = 256, 32, 2, 2


def moe_layer(group):
    rank, world = group.rank(), group.size()
    num_experts = world * LOCAL_EXPERTS
    buf = railyard.Buffer(group, hidden_dim=HIDDEN, max_num_of_tokens_per_rank=TOKENS,
                          num_local_experts=LOCAL_EXPERTS)

    g = torch.Generator().manual_seed(rank)
    x = torch.randn(TOKENS - rank, HIDDEN, generator=g).to(torch.bfloat16).requires_grad_()  # unequal counts
    logits = torch.randn(x.shape[0], num_experts, generator=g, requires_grad=True)
    probs = torch.softmax(logits, dim=-1)
    top = probs.topk(TOP_K, dim=-1)
    routing_map = torch.zeros_like(probs, dtype=torch.bool).scatter_(1, top.indices, True)
    probs = probs * routing_map  # the router's kept probabilities, [T, E]

    # Tokens to the ranks of their experts, grouped by local expert and padded to 8 rows.
    d = buf.dispatch_with_permute(hidden=x, routing_map=routing_map, probs=probs, pad_multiple=8)
    # The experts: here expert e of this rank scales its rows by (e + 1), weighted by the prob.
    scale = torch.repeat_interleave(torch.arange(1, LOCAL_EXPERTS + 1, dtype=torch.float32),
                                    d.tokens_per_expert)
    y = (d.hidden.float() * (scale * d.probs)[:, None]).to(torch.bfloat16)
    # Outputs back to their tokens' ranks, summed per token.
    out = buf.combine_with_unpermute(hidden=y, handle=d.handle, pad_multiple=8).hidden

    # The same layer in plain torch, for this rank's tokens.
    experts = torch.arange(num_experts) % LOCAL_EXPERTS + 1
    expected = (x.float()[:, None, :] * (experts * probs.detach())[:, :, None]).sum(1)
    assert torch.allclose(out.float(), expected, rtol=2e-2, atol=2e-2)

    out.float().sum().backward()  # gradients flow through combine, dispatch and the router
    assert x.grad.shape == x.shape and logits.grad.shape == logits.shape
    return out.shape[0], int(d.tokens_per_expert.sum())


if __name__ == "__main__":
    for rank, (tokens, rows) in enumerate(railyard.sim.run(world_size=4, fn=moe_layer)):
        print(f"rank {rank}: {tokens} tokens combined, {rows} expert rows (padded) received")
    print("python_quickstart: OK")
