"""The bucket map's arithmetic and the plans of rebalance and drain (service/smartcache/ops/moves/bucketmap.py and
plan.py)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smartcache.ops import moves


def a_map(owner: list[str], shards: list[str]) -> dict[str, Any]:
    return {"version": 1, "buckets": len(owner), "shards": shards, "ranges": moves.ranges_of(owner)}


def test_ranges_and_owners_are_each_other_s_inverse() -> None:
    owner = ["s1"] * 3 + ["s2"] * 2 + ["s1"] + ["s3"] * 2
    assert moves.ranges_of(owner) == [[0, 2, "s1"], [3, 4, "s2"], [5, 5, "s1"], [6, 7, "s3"]]
    assert moves.owners(a_map(owner, ["s1", "s2", "s3"])) == owner


# no deadline: drawing up to 300 owners one by one outlasted hypothesis' 200 ms once, in a unit run beside
# integration tests on a loaded 2-core machine
@settings(deadline=None)
@given(
    count=st.integers(1, 300),
    shards=st.integers(1, 6),
    new=st.integers(0, 3),
    data=st.data(),
)
def test_a_rebalance_leaves_every_shard_within_one_bucket_of_the_others_with_the_fewest_moves(
    count: int, shards: int, new: int, data: st.DataObject
) -> None:
    names = [f"s{i}" for i in range(1, shards + 1)]
    owner = [data.draw(st.sampled_from(names)) for _ in range(count)]
    everyone = names + [f"n{i}" for i in range(new)]
    plan = moves.plan_even(a_map(owner, names), everyone)
    after = list(owner)
    for b, s in plan:
        assert after[b] != s, "a move to where the bucket is"
        after[b] = s
    held = Counter(after)
    sizes = [held.get(s, 0) for s in everyone]
    assert max(sizes) - min(sizes) <= 1
    assert len({b for b, _ in plan}) == len(plan), "a bucket moved twice"
    # the fewest: a balanced end needs each shard to give what it holds above its share, the larger shares going
    # to the larger shards (any other assignment makes some shard give more)
    base, extra = divmod(count, len(everyone))
    by_size = sorted(everyone, key=lambda s: -Counter(owner).get(s, 0))
    share = {s: base + (1 if i < extra else 0) for i, s in enumerate(by_size)}
    assert len(plan) == sum(max(0, Counter(owner).get(s, 0) - share[s]) for s in everyone)


def test_a_drain_moves_every_bucket_of_the_shard_and_only_those() -> None:
    owner = ["s1"] * 10 + ["s2"] * 10 + ["s3"] * 12
    plan = moves.plan_even(a_map(owner, ["s1", "s2", "s3"]), ["s1", "s2", "s3"], away=["s3"])
    assert sorted(b for b, _ in plan) == list(range(20, 32))
    after = list(owner)
    for b, s in plan:
        after[b] = s
    assert Counter(after) == {"s1": 16, "s2": 16}


def test_draining_the_last_shard_is_refused() -> None:
    with pytest.raises(moves.MoveError, match="no shard would be left"):
        moves.plan_even(a_map(["s1"] * 4, ["s1"]), ["s1"], away=["s1"])
