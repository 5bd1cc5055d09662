"""A kernel that gives up the operation (docs/python-api.md "Errors"): bad routing on one
rank, or ranks whose operations differ, raises railyard.AbortedError on every rank with
the same message, naming the rank and why. The message comes from the buffer's failure
record in pinned host memory, the path a GPU takes once its context is lost."""
import pytest
import torch

from helpers import import_railyard

H = 64


def _outcomes(world_size, fn):
    """Runs fn(rank, buf) on every rank and returns, per rank, what it raised
    (type, message); the run itself re-raises the first rank's error."""
    railyard = import_railyard()
    raised = {}

    def rank_fn(group):
        buf = railyard.Buffer(group, hidden_dim=H, max_num_of_tokens_per_rank=4, num_local_experts=2,
                              check_routing=False)
        try:
            fn(group.rank(), buf)
        except Exception as error:  # noqa: BLE001 - the type is checked by the test
            raised[group.rank()] = (type(error), str(error))
            raise

    with pytest.raises(railyard.AbortedError):
        railyard.sim.run(world_size=world_size, fn=rank_fn, timeout=5.0)
    return railyard, [raised.get(r) for r in range(world_size)]


def test_bad_routing_on_one_rank_is_the_same_error_on_every_rank():
    def fn(rank, buf):
        idx = torch.tensor([[0, 1], [2, 3], [1, 2]])
        if rank == 1:
            idx[2, 1] = 99  # not an expert id; the host check is off
        buf.dispatch(torch.ones(3, H, dtype=torch.bfloat16), topk_idx=idx, topk_weights=torch.ones(3, 2))

    railyard, outcomes = _outcomes(3, fn)
    want = "railyard Buffer: rank 1 gave up the operation: topk_idx[2][1] = 99 is not -1 or an expert id below num_experts"
    for rank, got in enumerate(outcomes):
        assert got == (railyard.AbortedError, want), f"rank {rank}: {got}"


def test_ranks_combining_different_handles_is_the_same_error_on_every_rank():
    def fn(rank, buf):
        x = torch.ones(2, H, dtype=torch.bfloat16)
        idx, w = torch.tensor([[0, 1], [2, 3]]), torch.ones(2, 2)
        first = buf.dispatch(x, topk_idx=idx, topk_weights=w)
        second = buf.dispatch(x, topk_idx=idx, topk_weights=w)
        mine = second if rank == 1 else first  # made by operations 3 and 1
        buf.combine(mine.hidden, handle=mine.handle)

    railyard, outcomes = _outcomes(2, fn)
    want = ("railyard Buffer: the ranks use different handles: rank 1's was made by operation 3, rank 0's by "
            "operation 1 (every rank must pass the handle of the same dispatch)")
    for rank, got in enumerate(outcomes):
        assert got == (railyard.AbortedError, want), f"rank {rank}: {got}"
