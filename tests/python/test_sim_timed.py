"""railyard.sim's timed mode (run(timed=True)): events on a rank's stream time its
operations in SIMULATED microseconds, busy_time() tells which resource was busy, the
outputs are the same as untimed, and the timing calls refuse the untimed mode.
"""

import pytest

import reference as ref
from helpers import assert_bits, make_buffer, make_case


def timed_dispatch_combine(case, timed):
    """Per rank: (dispatch us, combine us, busy per device after dispatch, received rows,
    combined rows); the times are None when not timed."""
    import railyard
    import railyard.sim

    def fn(group):
        d = group.rank()
        buf = make_buffer(group, case)
        times = []

        def timed_op(op):
            group.barrier()
            railyard.sim.reset_traffic()
            start = railyard.sim.record_event()
            result = op()
            times.append(railyard.sim.elapsed_us(start, railyard.sim.record_event()) if timed else None)
            busy = railyard.sim.busy_time()
            group.barrier()
            return result, busy

        r, busy = timed_op(lambda: buf.dispatch(case.hidden[d], **case.dispatch_kwargs(d)))
        c, _ = timed_op(lambda: buf.combine(r.hidden, handle=r.handle))
        return times[0], times[1], busy, r.hidden.clone(), c.hidden.clone()

    return railyard.sim.run(world_size=case.world_size, fn=fn, seed=5, timed=timed)


def test_timed_run_times_the_operations_and_keeps_their_results(railyard):
    case = make_case(2, seed=71, max_tokens=16, hidden_dim=256)
    timed = timed_dispatch_combine(case, True)
    untimed = timed_dispatch_combine(case, False)
    exp = ref.combine_ref([rc.hidden for rc in case.received], case.received, case.tokens)
    for d in range(case.world_size):
        dispatch_us, combine_us, busy, rows, combined = timed[d]
        # The H100 preset's launch alone is 2.5 us.
        assert 2.5 < dispatch_us < 1000 and 2.5 < combine_us < 1000, (d, dispatch_us, combine_us)
        assert len(busy) == case.world_size and busy[d]["nvlink_out"] > 0 and busy[d]["hbm"] > 0, busy
        assert_bits(rows, case.received[d].hidden, f"rank {d}: timed dispatch")
        assert_bits(combined, exp[d], f"rank {d}: timed combine")
        assert_bits(rows, untimed[d][3], f"rank {d}: timed and untimed dispatch")
        assert untimed[d][0] is None and untimed[d][2] == []


def test_more_bytes_take_more_simulated_time(railyard):
    # Enough rows (64 tokens of 16 KiB, about 1 MiB a rank) that their bytes, not the
    # handshakes' latencies, decide: with 16 tokens of 8 KiB the two runs were within
    # 0.5 us of each other, either way round.
    small = timed_dispatch_combine(make_case(2, seed=72, max_tokens=64, hidden_dim=64), True)
    large = timed_dispatch_combine(make_case(2, seed=72, max_tokens=64, hidden_dim=8192), True)
    assert max(r[0] for r in large) > max(r[0] for r in small)
    assert max(r[1] for r in large) > max(r[1] for r in small)


def test_elapsed_time_needs_the_timed_mode(railyard):
    import railyard.sim

    def fn(group):
        a = railyard.sim.record_event()
        b = railyard.sim.record_event()
        with pytest.raises(RuntimeError, match="timed mode"):
            railyard.sim.elapsed_us(a, b)
        return railyard.sim.busy_time()

    assert railyard.sim.run(world_size=1, fn=fn) == [[]]
