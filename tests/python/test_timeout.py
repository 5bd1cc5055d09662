"""A rank that never joins a collective: its peers' kernels give up after the buffer's
handshake budget and the op raises railyard.TimeoutError naming the rank, what it waited
for and the peer, instead of hanging; with the default budgets too (the simulator's
clock jumps ahead while every thread waits)."""
import pytest
import torch

from helpers import import_railyard


@pytest.mark.parametrize("budgets", [dict(timeout_cycles=1 << 20, handshake_timeout_cycles=1 << 21), {}],
                         ids=["small_budgets", "default_budgets"])
def test_a_missing_peer_is_a_timeout_naming_it(budgets):
    railyard = import_railyard()

    def fn(group):
        buf = railyard.Buffer(group, hidden_dim=64, max_num_of_tokens_per_rank=4, num_local_experts=1, **budgets)
        if group.rank() == 1:
            return "skipped the dispatch"  # rank 1 never dispatches
        x = torch.zeros(2, 64, dtype=torch.bfloat16)
        buf.dispatch(x, topk_idx=torch.tensor([[0], [1]]), topk_weights=torch.ones(2, 1))
        return "dispatched"

    with pytest.raises(railyard.TimeoutError) as caught:
        # Rank 1 then waits in its buffer's collective destroy for rank 0, which has failed: it
        # gives up after `timeout` s, later than rank 0's kernel (the simulator lets a
        # waiting host thread 2 s before it advances the clock).
        railyard.sim.run(world_size=2, fn=fn, timeout=5.0)
    message = str(caught.value)
    assert "rank 0" in message and "peer" in message, message
    # The missing peer is caught in a handshake, so the handshake budget is the one that ran out.
    handshake_budget = budgets.get("handshake_timeout_cycles", 1 << 38)
    assert f"after {handshake_budget} cycles" in message, message
    assert "raised on rank 0" in "".join(getattr(caught.value, "__notes__", [])), caught.value.__notes__


def test_synchronize_after_ops_is_quiet():
    railyard = import_railyard()

    def fn(group):
        buf = railyard.Buffer(group, hidden_dim=64, max_num_of_tokens_per_rank=4, num_local_experts=1)
        x = torch.ones(3, 64, dtype=torch.bfloat16)
        r = buf.dispatch(x, topk_idx=torch.tensor([[0], [1], [0]]), topk_weights=torch.ones(3, 1))
        buf.synchronize()
        return r.hidden.shape[0]

    # Each rank's tokens 0 and 2 go to expert 0 (rank 0), token 1 to expert 1 (rank 1).
    assert railyard.sim.run(world_size=2, fn=fn) == [4, 2]
