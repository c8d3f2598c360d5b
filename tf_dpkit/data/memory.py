"""Poisson batches split to fit memory: :func:`accumulation_steps_for_memory` and
:func:`poisson_batches_for_memory` (Opacus' ``BatchMemoryManager``;
``docs/design/data_pipelines.md``, "Virtual batches").  The mechanism is the accounted
Poisson batch whatever the split.
"""
from __future__ import annotations

import math

from analysis import _checks
from tf_dpkit.data._poisson import check_one_rate, make_sampling
from tf_dpkit.data._structure import as_structure


def accumulation_steps_for_memory(num_examples: int, expected_batch_size: float,
                                  max_physical_batch_size: int,
                                  overflow_probability: float = 1e-6) -> int:
  """The smallest k such that a Poisson batch split into k chunks overflows ``P`` rarely.

  With ``|B| ~ Binomial(N, q)``, ``q = expected_batch_size / N``, the chunks of
  ``poisson_batches(..., gradient_accumulation_steps=k)`` have at most ``ceil(|B| / k)``
  examples, which exceeds ``P = max_physical_batch_size`` iff ``|B| > kP``.  Returns the
  smallest integer ``k >= 1`` with ``P(|B| > kP) <= overflow_probability`` (exact binomial
  tail, computed in log space).  The bound concerns memory only: privacy holds for any k.

  Args:
    num_examples: N, an integer >= 1.
    expected_batch_size: qN in (0, N].
    max_physical_batch_size: P, an integer >= 1 (examples per physical chunk).
    overflow_probability: in (0, 1).
  """
  n = _checks.check_integer("num_examples", num_examples, minimum=1)
  b = _checks.check_finite_positive("expected_batch_size", expected_batch_size)
  if b > n:
    raise ValueError(f"expected_batch_size must be in (0, num_examples] = (0, {n}], got {b}.")
  p = _checks.check_integer("max_physical_batch_size", max_physical_batch_size, minimum=1)
  bound = _checks.check_probability("overflow_probability", overflow_probability,
                                    allow_zero=False)
  if bound >= 1:
    raise ValueError(f"overflow_probability must be in (0, 1), got {overflow_probability!r}.")
  q = b / n
  if q >= 1.0:
    return -(-n // p)

  def log_pmf(j):
    return (math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1)
            + j * math.log(q) + (n - j) * math.log1p(-q))

  def tail_above(m):  # P(|B| > m)
    if m >= n:
      return 0.0
    logs = [log_pmf(j) for j in range(m + 1, n + 1)]
    top = max(logs)
    return math.exp(top) * math.fsum(math.exp(v - top) for v in logs)

  k = max(1, math.floor(b / p))
  while tail_above(k * p) > bound:
    k += 1
  return k


def poisson_batches_for_memory(data, *, max_physical_batch_size: int,
                               sampling_probability: float | None = None,
                               expected_batch_size: float | None = None, steps: int,
                               seed: int | None = None, overflow_probability: float = 1e-6):
  """Poisson batches split to fit memory (Opacus' ``BatchMemoryManager``): ``(dataset, k)``.

  ``k = accumulation_steps_for_memory(N, qN, max_physical_batch_size, overflow_probability)``
  and ``dataset = poisson_batches(data, ..., gradient_accumulation_steps=k)``: every logical
  Poisson batch (rate ``q``, the accounted one) in ``k`` disjoint chunks, each of at most
  ``max_physical_batch_size`` examples except with probability ``overflow_probability`` per
  step (then ``ceil(|B| / k)``: the mechanism never changes, only the memory use).  Build the
  DP optimizer with ``gradient_accumulation_steps=k`` and ``expected_batch_size=qN``, and run
  ``k * steps`` micro-steps.  Arguments and errors as for :func:`poisson_batches` and
  :func:`accumulation_steps_for_memory`.
  """
  check_one_rate(sampling_probability, expected_batch_size)
  structure, n = as_structure(data)
  sampling = make_sampling(n, sampling_probability, expected_batch_size, steps, seed)
  k = accumulation_steps_for_memory(n, sampling.expected_batch_size, max_physical_batch_size,
                                    overflow_probability)
  return sampling._dataset(structure, k), k  # pylint: disable=protected-access


__all__ = ["accumulation_steps_for_memory", "poisson_batches_for_memory"]
