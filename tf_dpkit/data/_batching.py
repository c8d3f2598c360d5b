"""What the batch pipelines share: secret seeds and their streams, the pass counter that
makes every pass draw fresh batches, the selection of a batch's indices and weights, and the
split of a logical batch into chunks for gradient accumulation
(``docs/design/data_pipelines.md``).  Private to ``tf_dpkit.data``.
"""
from __future__ import annotations

import secrets

import numpy as np
import tensorflow as tf

from analysis import _checks
from tf_dpkit import noise as noise_lib
from tf_dpkit.data._structure import gather

# Second seed words, so the Poisson and the shuffle pipelines draw unrelated streams even when
# given the same seed.
POISSON_STREAM = 0x504F4953  # "POIS"
SHUFFLE_STREAM = 0x53485546  # "SHUF"
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
ALG = "philox"  # pinned, so batches do not depend on the device "auto_select" would pick


def secret_seed() -> int:
  """A sampling seed from the OS entropy source: a uniform integer in ``[0, 2**63)``."""
  return secrets.randbelow(2**63)


def seed_pair(seed: noise_lib.SecretInt, stream: int) -> tf.Tensor:
  """``[seed, stream]`` as an int64 seed; the seed enters the graph as no constant."""
  return tf.stack([seed.tensor(), tf.constant(stream, tf.int64)])


class Passes:
  """Counts the passes over one pipeline, so that every pass draws fresh batches.

  A ``tf.data`` pipeline is re-iterated whenever Keras starts an epoch without
  ``steps_per_epoch``, a second ``fit`` or a custom loop iterates it again, or ``repeat`` /
  ``concatenate`` reads it twice.  Batch ``t`` is a pure function of ``(seed, t)``, so a pass
  that restarted ``t`` at 0 would replay the very same batches, and each replayed batch would
  be released again under a ledger that counts it as a fresh Poisson sample.  Instead pass
  ``p`` (0 for the first) draws the batches of global steps ``p * count ... (p + 1) * count -
  1``: every step of every pass is a fresh, independent draw, exactly what the ledger counts.
  The first pass is the batches ``0 ... count - 1`` the pipeline always had.
  """

  def __init__(self):
    with tf.init_scope():
      self._eager = tf.executing_eagerly()
      if self._eager:
        with tf.device("/cpu:0"):
          self._counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="dp_passes")
      else:  # a tf.compat.v1 graph: a one-shot iterator cannot capture a variable
        self._passes = 0

  def _next_pass(self, _):
    if self._eager:
      return self._counter.assign_add(1) - 1

    def advance():
      self._passes += 1
      return np.int64(self._passes - 1)
    value = tf.compat.v1.py_func(advance, [], tf.int64, stateful=True, name="dp_passes")
    value.set_shape([])
    return value

  def indices(self, count: int) -> tf.data.Dataset:
    """``count`` consecutive int64 indices; pass ``p`` gives ``p * count`` to
    ``(p + 1) * count - 1``."""
    count = tf.constant(count, tf.int64)
    return tf.data.Dataset.range(1).map(self._next_pass).flat_map(
        lambda p: tf.data.Dataset.range(p * count, (p + 1) * count)).apply(
            tf.data.experimental.assert_cardinality(count))


def indices_and_weights(selected):
  """``(indices, weights)`` of the ``True`` entries of ``selected``: ascending int64 indices
  and float32 weights of ones; an empty selection gives index 0 with weight 0 (its clipped
  gradient is exactly 0: docs/design/data_pipelines.md)."""
  chosen = tf.where(selected)[:, 0]
  count = tf.size(chosen, out_type=tf.int64)
  size = tf.maximum(count, 1)
  indices = tf.concat([chosen, tf.zeros([1], tf.int64)], axis=0)[:size]
  weights = tf.cast(tf.range(size) < count, tf.float32)
  return indices, weights


def accumulation_steps(value) -> int:
  """``gradient_accumulation_steps`` of a pipeline: None or 1 -> 1, else an integer >= 2."""
  if value is None:
    return 1
  return _checks.check_integer("gradient_accumulation_steps", value, minimum=1)


def split_logical_batches(batches: tf.data.Dataset, structure, chunks: int) -> tf.data.Dataset:
  """Each element of ``batches`` (int64 example indices of one logical batch, possibly none)
  becomes ``chunks`` elements: balanced consecutive slices ``[floor(j n / k), floor((j+1) n /
  k))``, an empty slice as example 0 with weight 0."""
  k = tf.constant(chunks, tf.int64)

  def split(chosen):
    size = tf.size(chosen, out_type=tf.int64)

    def chunk(j):
      part = chosen[(j * size) // k:((j + 1) * size) // k]
      count = tf.size(part, out_type=tf.int64)
      padded = tf.maximum(count, 1)
      indices = tf.concat([part, tf.zeros([1], tf.int64)], axis=0)[:padded]
      weights = tf.cast(tf.range(padded) < count, tf.float32)
      return gather(structure, indices, weights)

    return tf.data.Dataset.range(chunks).map(chunk)

  return batches.flat_map(split)
