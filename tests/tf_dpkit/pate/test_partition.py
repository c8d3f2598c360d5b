"""Teacher shards: disjoint, covering, balanced, reproducible; bad arguments are named."""
import numpy as np
import pytest

from tf_dpkit.pate import partition_indices, shard_of


@pytest.mark.parametrize("n, k", [(60000, 250), (1001, 10), (7, 7), (5, 1)])
def test_shards_are_disjoint_cover_everything_and_are_balanced(n, k):
  shards = partition_indices(n, k, seed=3)
  assert len(shards) == k
  joined = np.concatenate(shards)
  assert len(joined) == n and len(np.unique(joined)) == n  # disjoint and covering
  assert set(joined.tolist()) == set(range(n))
  sizes = [len(s) for s in shards]
  assert max(sizes) - min(sizes) <= 1 and min(sizes) == n // k
  owner = shard_of(shards, n)
  assert np.all(owner >= 0)
  for t in (0, k - 1):
    assert np.all(owner[shards[t]] == t)


def test_the_partition_is_a_seeded_shuffle():
  a, b = partition_indices(1000, 10, seed=1), partition_indices(1000, 10, seed=1)
  c = partition_indices(1000, 10, seed=2)
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  assert not all(np.array_equal(x, y) for x, y in zip(a, c))
  assert not np.array_equal(a[0], np.arange(100))  # shuffled, not contiguous
  unseeded = [partition_indices(1000, 10)[0] for _ in range(2)]
  assert not np.array_equal(*unseeded)


@pytest.mark.parametrize("kwargs, match", [
    ({"num_examples": 10, "num_teachers": 0}, r"num_teachers must be an integer in \[1, inf\]"),
    ({"num_examples": 5, "num_teachers": 6}, r"num_examples must be an integer in \[6, inf\]"),
    ({"num_examples": 10, "num_teachers": 2.0}, "num_teachers"),
    ({"num_examples": 10, "num_teachers": 2, "seed": -1}, "seed"),
])
def test_bad_arguments_name_the_argument_and_range(kwargs, match):
  with pytest.raises(ValueError, match=match):
    partition_indices(**kwargs)


def test_the_guarantee_is_for_replacing_a_record_not_adding_one():
  # Replacing record 7's value keeps every record in its shard (positions decide), so one
  # teacher's data changes: the accountant's relation is replace-one.  Adding a record at the
  # end reshuffles positions: many records change shard, so add/remove is not claimed.
  from analysis import events, pate  # pylint: disable=g-import-not-at-top
  assert pate.PateAccountant().neighboring_relation == events.REPLACE_ONE
  before = shard_of(partition_indices(1000, 10, seed=3), 1000)
  after = shard_of(partition_indices(1001, 10, seed=3), 1001)[:1000]
  assert np.sum(before != after) > 100
