"""The clock offset estimator (service/smartcache/server/storage/clock.py): jitter never moves it far, a step is
adopted at the second sample after it (forward or backward), a single noisy sample changes nothing."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from smartcache.server.storage.clock import MAX_RTT_MS, ClockOffset, Sample, sample

T0_S = 1_700_000_000.0  # our wall clock at the first ping
PING_EVERY_S = 0.5

#: one-way delays of a ping (ms): mostly quick, some slow (a busy machine)
delay = st.one_of(st.floats(0.01, 2.0), st.floats(2.0, 200.0))
trip = st.tuples(delay, delay)
offset = st.floats(-1e9, 1e9)  # about +-11 days
#: a step: far beyond any round trip here (at most 400 ms), forward or backward
jump = st.one_of(st.floats(1_000, 1e9), st.floats(-1e9, -1_000))


def ping(k: int, offset_ms: float, out_ms: float, back_ms: float, noise_ms: float = 0.0) -> Sample:
    """Ping number k: the instance reads its clock (whole ms, plus noise) out_ms after we send."""
    sent_s = T0_S + k * PING_EVERY_S
    remote_ms = math.floor((sent_s + out_ms / 1000) * 1000 + offset_ms + noise_ms)
    return sample(sent_s, sent_s + (out_ms + back_ms) / 1000, remote_ms)


def off_by(c: ClockOffset, true_ms: float) -> float:
    return abs(c.offset_ms - true_ms)


@given(offset, st.lists(trip, min_size=1, max_size=60))
def test_a_steady_offset_stays_within_the_estimate_s_own_bound_whatever_the_jitter(
    true_ms: float, trips: list[tuple[float, float]]
) -> None:
    c = ClockOffset()
    for k, (out, back) in enumerate(trips):
        c.add(ping(k, true_ms, out, back))
        assert off_by(c, true_ms) <= c.uncertainty_ms
    assert c.steps == 0


@given(
    offset,
    st.lists(st.tuples(jump, st.lists(trip, min_size=2, max_size=8)), min_size=1, max_size=6),
    st.lists(trip, min_size=1, max_size=8),
)
def test_each_step_forward_or_backward_is_adopted_at_the_second_sample_after_it(
    start_ms: float, segments: list[tuple[float, list[tuple[float, float]]]], before: list[tuple[float, float]]
) -> None:
    c = ClockOffset()
    k = 0
    for out, back in before:
        c.add(ping(k, start_ms, out, back))
        k += 1
    true_ms = start_ms
    for steps, (jump_ms, trips) in enumerate(segments, start=1):
        was_ms, true_ms = true_ms, true_ms + jump_ms
        for i, (out, back) in enumerate(trips):
            c.add(ping(k, true_ms, out, back))
            k += 1
            if i == 0:  # one sample could be noise: nothing moves yet
                assert off_by(c, was_ms) <= c.uncertainty_ms
            else:
                assert off_by(c, true_ms) <= c.uncertainty_ms
        assert c.steps == steps


@given(
    offset,
    st.lists(trip, min_size=3, max_size=40),
    st.data(),
)
def test_a_single_noisy_sample_now_and_then_changes_nothing(
    true_ms: float, trips: list[tuple[float, float]], data: st.DataObject
) -> None:
    """Noisy samples (a reading off by a second or more) never two in a row, and never the first."""
    noisy = data.draw(st.sets(st.integers(1, len(trips) - 1)).filter(lambda s: all(i + 1 not in s for i in s)))
    c = ClockOffset()
    for k, (out, back) in enumerate(trips):
        noise = data.draw(jump) if k in noisy else 0.0
        c.add(ping(k, true_ms, out, back, noise))
        assert off_by(c, true_ms) <= c.uncertainty_ms
    assert c.steps == 0


@given(offset, trip, trip, trip, st.floats(1_000, 1e6))
def test_two_noisy_samples_in_a_row_that_disagree_with_each_other_change_nothing(
    true_ms: float, a: tuple[float, float], b: tuple[float, float], good: tuple[float, float], gap_ms: float
) -> None:
    c = ClockOffset()
    c.add(ping(0, true_ms, *good))
    c.add(ping(1, true_ms, *a, noise_ms=gap_ms))
    c.add(ping(2, true_ms, *b, noise_ms=-gap_ms))
    assert off_by(c, true_ms) <= c.uncertainty_ms
    assert c.steps == 0


def test_the_quickest_recent_ping_wins_and_an_old_one_counts_less_with_every_sample() -> None:
    c = ClockOffset()
    c.add(Sample(100.0, 10.0))
    assert c.add(Sample(101.0, 1.0))  # quicker, and agrees: replaces
    assert c.offset_ms == 101.0
    assert not c.add(Sample(102.0, 5.0))  # agrees, but slower than the tolerance (1 ms grown 10 %)
    assert c.offset_ms == 101.0
    adopted_after = next(n for n in range(1, 100) if c.add(Sample(102.0, 5.0)))
    assert c.offset_ms == 102.0
    assert adopted_after > 1  # the tolerance grew back to 5 ms first (about 17 samples)
    assert c.tolerance_ms == 5.0


def test_a_step_is_adopted_from_slow_pings_too_and_the_tolerance_never_shrinks_below_the_kept_sample() -> None:
    c = ClockOffset()
    c.add(Sample(0.0, 0.1))
    assert not c.add(Sample(600_000.0, 300.0))
    assert c.add(Sample(600_050.0, 250.0))  # agrees with the first within their round trips
    assert c.offset_ms == 600_050.0
    assert c.tolerance_ms == 250.0 > MAX_RTT_MS
    assert c.add(Sample(600_010.0, 100.0))  # a better one agrees: refines at once
    assert c.steps == 1


def test_the_first_sample_is_taken_as_it_is() -> None:
    c = ClockOffset()
    assert not c.known
    assert c.uncertainty_ms == math.inf
    assert c.add(Sample(-42.0, 900.0))
    assert c.known
    assert c.offset_ms == -42.0
