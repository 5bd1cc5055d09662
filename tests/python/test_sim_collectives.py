"""railyard.sim's host-side collectives for rank threads (SimGroup.barrier, all_gather,
all_to_all, all_gather_object): correct results, usable between Railyard calls (the
simulated GPUs keep running while a rank waits in one), and a rank that raises breaks
the group, so its peers fail at once instead of waiting for the timeout.
"""

import time

import pytest
import torch

import reference as ref
from helpers import assert_bits, make_buffer, make_case, run_ranks


def test_collectives_give_every_rank_the_same_answer(railyard):
    world = 4

    def fn(group):
        r = group.rank()
        group.barrier()
        mine = torch.arange(r + 1, dtype=torch.int64) * 10 + r  # a different shape per rank
        gathered = group.all_gather(mine)
        sent = [torch.full((r + 1, j + 1), 100 * r + j, dtype=torch.int32) for j in range(world)]
        received = group.all_to_all(sent)
        objects = group.all_gather_object({"rank": r})
        mine.fill_(-1)  # the gathered copies must not change with the source
        return gathered, received, objects

    for d, (gathered, received, objects) in enumerate(run_ranks(world, fn)):
        for src in range(world):
            assert torch.equal(gathered[src], torch.arange(src + 1, dtype=torch.int64) * 10 + src), (d, src)
            assert torch.equal(received[src], torch.full((src + 1, d + 1), 100 * src + d, dtype=torch.int32)), (d, src)
        assert objects == [{"rank": s} for s in range(world)]


def test_collectives_between_dispatch_and_combine(railyard):
    """A reference check inside the rank function: every rank gathers all ranks'
    received rows right after dispatch (the engine must run while ranks wait), then
    combines; both match the reference."""
    world = 4
    case = make_case(world, seed=61, max_tokens=12)

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        r = buf.dispatch(case.hidden[d], **case.dispatch_kwargs(d))
        every_rank_rows = group.all_gather(r.hidden)
        group.barrier()
        c = buf.combine(r.hidden, handle=r.handle)
        return every_rank_rows, c.hidden.clone()

    exp = ref.combine_ref([rc.hidden for rc in case.received], case.received, case.tokens)
    for d, (rows, combined) in enumerate(run_ranks(world, fn)):
        for src in range(world):
            assert_bits(rows[src], case.received[src].hidden, f"rank {d}: rank {src}'s received rows")
        assert_bits(combined, exp[d], f"rank {d} combine")


@pytest.mark.parametrize("peer_waits_in", ["barrier", "all_gather", "buffer_creation"])
def test_a_failing_rank_fails_its_peers_at_once(railyard, peer_waits_in):
    """Rank 1 raises before the collective; rank 0, already waiting in it, raises a
    RuntimeError naming rank 1 and its error long before the 60 s timeout, and run()
    re-raises rank 1's own error."""
    case = make_case(2, seed=62, max_tokens=8)
    waited = {}

    def fn(group):
        if group.rank() == 1:
            time.sleep(0.2)  # rank 0 is waiting by then
            raise KeyError("rank 1's own failure")
        start = time.monotonic()
        try:
            if peer_waits_in == "barrier":
                group.barrier()
            elif peer_waits_in == "all_gather":
                group.all_gather(torch.zeros(3))
            else:
                make_buffer(group, case)
        finally:
            waited["seconds"] = time.monotonic() - start

    with pytest.raises(KeyError, match="rank 1's own failure") as info:
        railyard.sim.run(world_size=2, fn=fn, timeout=60.0)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "raised on rank 1 first; ranks [0] failed later" in notes, notes
    assert waited["seconds"] < 20, f"rank 0 waited {waited['seconds']:.1f} s for a rank that had failed"


def test_peer_error_names_the_failed_rank(railyard):
    """What the peers raise names the rank that failed and its error."""
    seen = []

    def fn(group):
        if group.rank() == 0:
            raise ValueError("bad input on rank 0")
        try:
            group.barrier()
        except RuntimeError as e:
            seen.append(str(e))
            raise

    with pytest.raises(ValueError):
        railyard.sim.run(world_size=3, fn=fn, timeout=60.0)
    assert len(seen) == 2 and all("rank 0 failed: ValueError: bad input on rank 0" in s for s in seen), seen


def test_collective_argument_errors(railyard):
    def fn(group):
        with pytest.raises(ValueError, match="expected a list of 2 tensors"):
            group.all_to_all([torch.zeros(1)])
        with pytest.raises(TypeError, match=r"tensor is a list; expected a torch\.Tensor"):
            group.all_gather([1, 2])
        group.barrier()

    run_ranks(2, fn)
