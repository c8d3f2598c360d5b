"""Poisson batches for the replicas of a ``tf.distribute`` strategy:
:func:`distributed_poisson_batches` (``docs/design/data_pipelines.md``; the global batch is
one Poisson sample of the whole data set, accounted once per step).
"""
from __future__ import annotations

import dataclasses

import tensorflow as tf

from analysis import _checks
from tf_dpkit import distribute
from tf_dpkit.data._batching import Passes, indices_and_weights
from tf_dpkit.data._poisson import check_one_rate, make_sampling
from tf_dpkit.data._structure import as_structure, gather
from tf_dpkit.data.pipelines import Pipeline, tagged


def distributed_poisson_batches(strategy, data, *, sampling_probability: float | None = None,
                                expected_batch_size: float | None = None, steps: int,
                                seed: int | None = None, num_examples: int | None = None):
  """Poisson batches for ``R`` replicas of a ``tf.distribute`` strategy, on any number of workers.

  Every example joins the global batch of step ``t`` independently with probability ``q``,
  exactly as in :func:`poisson_batches`, and each replica receives its own part of it:

  * The ``N`` examples are split into ``R`` disjoint shards by a public rule that does not look
    at the data: replica ``r`` (``r = worker * L + local``, ``L`` replicas per worker) owns
    the examples at positions ``i`` with ``i mod R = r`` (``num_examples=None``), or, when each
    worker holds only its own shard of the data set (``num_examples`` given), worker ``w``'s
    ``L`` replicas split that shard by ``i mod L``.
  * At every step each replica's part is the subset of its shard whose draws are below
    ``floor(q 2^64)``.  Each example is decided by exactly one independent Bernoulli(q) draw,
    so the union over replicas and workers -- the global batch the DP step clips, sums and
    noises once -- is a Poisson sample of the whole data set with rate ``q``, expected size
    ``qN``.  The accountant therefore analyses it exactly as one device's Poisson batches:
    the global step is one Poisson-subsampled Gaussian release, counted once.
  * With one data set on every worker (``num_examples=None``) and a shared integer ``seed``,
    all workers draw the same mask, so the global batch of step ``t`` of pass ``p`` is exactly
    ``poisson_batches(data, ..., seed=seed)``'s batch ``t`` of the same pass (every pass
    draws fresh batches; a DP model's ``fit`` under a strategy, like a single-device
    ``fit``, trains pass 0 first, since its build reads the element spec and draws no batch).  With
    ``seed=None`` every worker draws its own secret seed; the union is still a Poisson
    sample, since each example is drawn by one worker only.  With per-worker shards, worker
    ``w``'s draws use stream ``w + 1`` of the seed, so shards never share draws.
  * A replica whose part is empty receives one example (its shard's first, or example 0) with
    weight 0, whose clipped gradient is exactly 0: the released sum is unchanged.

  Normalise by the global expected batch size ``qN`` (the DP optimizer's
  ``expected_batch_size``); tf_dpkit's optimizers then add noise once per global step
  (:mod:`tf_dpkit.distribute`).  Pass the result to ``model.fit`` (``steps_per_epoch`` as for
  :func:`poisson_batches`) or iterate it in a custom loop with ``strategy.run``.

  Args:
    strategy: the ``tf.distribute`` strategy that will train (any supported one, one replica
      included); its ``distribute_datasets_from_function`` is used.
    data: as for :func:`poisson_batches`: the whole training set (the same examples, in the
      same order, on every worker), or with ``num_examples`` this worker's disjoint shard.
    sampling_probability: ``q`` in ``(0, 1]``; or give ``expected_batch_size`` ``qN`` in
      ``(0, N]`` (examples), exactly one of the two.
    steps: global steps, a positive integer.
    seed: ``None`` (a secret seed) or an int64 integer, for tests and reproducible runs only.
    num_examples: ``None`` when ``data`` is the whole data set; else ``N``, the size of the
      whole data set (an integer >= this worker's shard), when ``data`` is this worker's
      shard -- the shards of all workers must be disjoint and together make up the data set.

  Returns:
    A ``tf.distribute.DistributedDataset`` of ``steps`` global batches; each replica's element
    is ``(x_r, y_r, weight_r)`` for ``data = (x, y)`` (structures as in :func:`poisson_batches`),
    with a ``None`` batch dimension.

  Raises:
    ValueError: as :func:`poisson_batches`; ``num_examples`` smaller than the shard; a
      strategy whose replicas are not spread evenly over its workers.
    NotImplementedError: a strategy DP-SGD does not support (:mod:`tf_dpkit.distribute`).
  """
  distribute.check_strategy(strategy, "distributed_poisson_batches")
  check_one_rate(sampling_probability, expected_batch_size)
  structure, local_n = as_structure(data)
  sharded = num_examples is not None
  n = _checks.check_integer("num_examples", num_examples, minimum=local_n) if sharded else local_n
  whole = make_sampling(n, sampling_probability, expected_batch_size, steps, seed)
  # The draws over the examples this worker holds: all N, or its shard.
  local = dataclasses.replace(whole, num_examples=local_n) if sharded else whole
  replicas = int(strategy.num_replicas_in_sync)
  passes = Passes()  # each worker process counts its own passes (all iterate in step)

  def dataset_fn(context):
    pipelines = int(context.num_input_pipelines)
    if replicas % pipelines:
      raise ValueError(f"strategy: {replicas} replicas cannot be spread evenly over "
                       f"{pipelines} workers.")
    per_worker = replicas // pipelines
    worker = int(context.input_pipeline_id)
    if sharded:
      stream, first, stride = worker + 1, 0, per_worker
    else:
      stream, first, stride = 0, worker * per_worker, replicas
    positions = tf.range(local_n, dtype=tf.int64)

    def element(k):
      step, part = k // per_worker, k % per_worker
      mine = tf.equal(positions % stride, first + part)
      indices, weights = indices_and_weights(
          tf.logical_and(local.selected(step, stream), mine))
      return gather(structure, indices, weights)

    return passes.indices(whole.steps * per_worker).map(
        element, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

  distributed = strategy.distribute_datasets_from_function(dataset_fn)
  return tagged(distributed, Pipeline("poisson", n, whole.expected_batch_size,
                                      whole.steps_per_epoch, whole.sampling_probability,
                                      replicas=replicas))


__all__ = ["distributed_poisson_batches"]
