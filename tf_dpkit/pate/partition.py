"""Partition of a private data set into disjoint teacher shards.

PATE trains ``num_teachers`` teachers on disjoint parts of the private data.  A record then
influences exactly one teacher, hence at most one vote of each query: replacing one record
changes one teacher's vote, i.e. moves one count from a class to another (L1 distance 2,
L2 distance sqrt(2) between vote histograms).  The aggregators' privacy analysis
(:mod:`analysis.pate`) rests on this, for the *replace-one* neighbouring relation: the
assignment of positions to shards is a fixed permutation that does not depend on the records'
values, so replacing a record keeps every other record in its shard.
"""
from __future__ import annotations

import numpy as np

from analysis import _checks


def partition_indices(num_examples: int, num_teachers: int, seed: int | None = None
                      ) -> list[np.ndarray]:
  """Splits ``range(num_examples)`` into ``num_teachers`` disjoint shards covering it.

  The indices are shuffled by a NumPy ``Generator(PCG64(seed))`` permutation and cut into
  ``num_teachers`` contiguous pieces of sizes ``floor(n / k)`` or ``ceil(n / k)`` (the first
  ``n mod k`` shards get one more), as ``np.array_split`` does.  Each shard is returned sorted.

  The permutation is public (it depends on positions only, never on record values); a seed of
  ``None`` draws one from the OS entropy source.

  Args:
    num_examples: n, the number of private records, an integer >= num_teachers.
    num_teachers: k, the number of shards, an integer in [1, num_examples].
    seed: None or an integer in [0, 2**63).

  Returns:
    A list of ``num_teachers`` sorted int64 arrays, pairwise disjoint, whose union is
    ``0 .. num_examples - 1``.
  """
  num_teachers = _checks.check_integer("num_teachers", num_teachers, minimum=1)
  num_examples = _checks.check_integer("num_examples", num_examples, minimum=num_teachers)
  if seed is not None:
    seed = _checks.check_integer("seed", seed, minimum=0, maximum=2**63 - 1, none_allowed=True)
  order = np.random.Generator(np.random.PCG64(seed)).permutation(num_examples)
  return [np.sort(part).astype(np.int64) for part in np.array_split(order, num_teachers)]


def shard_of(shards: list[np.ndarray], num_examples: int) -> np.ndarray:
  """Returns an int64 array ``owner`` of length ``num_examples``: ``owner[i]`` is the shard that
  holds record ``i``, or -1 if none does."""
  num_examples = _checks.check_integer("num_examples", num_examples, minimum=0)
  owner = np.full(num_examples, -1, np.int64)
  for teacher, part in enumerate(shards):
    owner[part] = teacher
  return owner
