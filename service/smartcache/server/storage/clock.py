"""How far a storage instance's wall clock is from ours, measured by pings.

Storage refuses a call that arrives after its deadline, and reads the
deadline on its own wall clock: the service sends ``our deadline + offset``.
A ping sent at our time ``s`` and answered at ``r`` carries the instance's
time ``t`` (whole milliseconds of its wall clock, read in between), so the
true offset lies in ``[t - r, t + 1 - s]``: a sample is its midpoint, good to
half the round trip.

:class:`ClockOffset` keeps one estimate:

* a sample that agrees with it (their intervals overlap, give or take
  ``SLACK_MS``) replaces it when its round trip is at most the *tolerance*:
  the round trip of the sample kept, grown 10 % per sample since (clocks
  drift, so an old sample is worth less), up to ``MAX_RTT_MS``. So the
  quickest recent ping wins;
* a sample that disagrees changes nothing by itself (one noisy sample: the
  instance's event loop time is cached from before our request arrived, or
  a clock set and set back at once). Two *consecutive* samples that both
  disagree with the estimate and agree with each other are a step -- a wall
  clock set by hand, an NTP step, a virtual machine resumed -- and the better
  of the two replaces the estimate at once. The clock-jump fault (the
  leader's wall clock 600 s ahead) showed why: waiting for the tolerance to
  grow back to the new pings' round trip answered every write EXPIRED for up
  to 3.8 s.

A step is adopted at the second ping after it. Calls sent meanwhile carry a
deadline on the wrong clock; storage refuses those that look late, and the
caller (service/smartcache/server/storage/routing.py) measures again and sends the call again when
its own clock says the lifetime is not over.
"""

from __future__ import annotations

import math
from typing import NamedTuple

#: samples slower than this are too imprecise to refine an estimate with (a step is adopted from any)
MAX_RTT_MS = 50.0
#: the tolerance grows by this factor per sample
GROWTH = 1.1
#: leeway when comparing samples: the instance reads whole ms, from its event loop's cached time
SLACK_MS = 2.0


class Sample(NamedTuple):
    """One ping: the offset it measured (the interval's midpoint) and its round trip, in ms."""

    offset_ms: float
    rtt_ms: float

    def agrees(self, offset_ms: float, width_ms: float) -> bool:
        """Could both be right: this sample and an estimate good to within width_ms (its round trip)?"""
        return abs(self.offset_ms - offset_ms) <= (self.rtt_ms + width_ms) / 2 + SLACK_MS


def sample(sent_s: float, returned_s: float, remote_ms: float) -> Sample:
    """A ping sent at our wall-clock time sent_s, answered at returned_s, carrying the instance's time_ms."""
    return Sample(remote_ms + 0.5 - (sent_s + returned_s) * 500, max(0.0, (returned_s - sent_s) * 1000))


class ClockOffset:
    """One instance's wall clock minus ours, in milliseconds (0 until the first sample)."""

    def __init__(self) -> None:
        self.offset_ms = 0.0
        #: how far the estimate may be off (half the kept sample's round trip, grown since, plus the slack)
        self.tolerance_ms = math.inf
        #: bumped whenever the estimate changes; ``steps`` counts the steps adopted
        self.generation = 0
        self.steps = 0
        self._candidate: Sample | None = None

    @property
    def known(self) -> bool:
        return self.generation > 0

    @property
    def uncertainty_ms(self) -> float:
        """How far the estimate may be from the truth, as far as the samples tell."""
        return self.tolerance_ms / 2 + SLACK_MS

    def add(self, s: Sample) -> bool:
        """Take one sample; True when the estimate changed (a step, or a better sample)."""
        if not self.known:
            self._adopt(s)
            return True
        self.tolerance_ms = max(self.tolerance_ms, min(self.tolerance_ms * GROWTH, MAX_RTT_MS))
        if s.agrees(self.offset_ms, self.tolerance_ms):
            self._candidate = None
            if s.rtt_ms <= self.tolerance_ms:
                self._adopt(s)
                return True
            return False
        candidate, self._candidate = self._candidate, s
        if candidate is None or not s.agrees(candidate.offset_ms, candidate.rtt_ms):
            return False
        self._candidate = None
        self.steps += 1
        self._adopt(min(candidate, s, key=lambda x: x.rtt_ms))
        return True

    def _adopt(self, s: Sample) -> None:
        self.offset_ms, self.tolerance_ms = s.offset_ms, s.rtt_ms
        self.generation += 1
