"""Shuffle-and-batch: :func:`shuffled_batches`.  Every epoch a fresh permutation cut into
batches; no amplification by subsampling may be claimed for it (``tf_dpkit.budget`` accounts
it once per epoch; ``docs/design/data_pipelines.md``, "Shuffle-and-batch").
"""
from __future__ import annotations

import tensorflow as tf

from analysis import _checks
from tf_dpkit import noise as noise_lib
from tf_dpkit.data._batching import (ALG, INT64_MAX, INT64_MIN, SHUFFLE_STREAM,
                                     accumulation_steps, secret_seed, seed_pair,
                                     split_logical_batches)
from tf_dpkit.data._structure import as_structure, gather
from tf_dpkit.data.pipelines import Pipeline, tagged


def shuffled_batches(data, batch_size: int, epochs: int, seed: int | None = None,
                     drop_remainder: bool = True,
                     gradient_accumulation_steps: int | None = None) -> tf.data.Dataset:
  """Shuffle-and-batch: each epoch, a fresh permutation of ``data`` cut into batches.

  WARNING: the Poisson-sampling epsilon does NOT hold for this pipeline.  Examples do not join
  batches independently with probability ``q`` (each sits in exactly one batch per epoch), so
  no privacy amplification by subsampling may be claimed; account it as the unsubsampled
  Gaussian mechanism once per epoch (``sampling="shuffle"`` in ``tf_dpkit.budget``).

  Args:
    data: the training examples, as for :func:`poisson_batches`
      (docs/design/data_pipelines.md, "Data"): ``N >= 1`` examples as arrays in a tuple/dict
      structure, one array, or a finite ``tf.data.Dataset`` of single examples.
    batch_size: examples per batch, an integer in ``[1, N]``.
    epochs: number of passes, a positive integer.
    seed: ``None`` (default: a secret seed from :func:`secret_seed`) or an integer in
      ``[-2**63, 2**63 - 1]``; epoch ``e``'s permutation depends only on ``(seed, e)``.
    drop_remainder: drop the last ``N mod batch_size`` examples of each epoch's permutation
      (a different random subset each epoch), giving ``N // batch_size`` full batches per epoch
      and a static batch dimension; if False, ``ceil(N / batch_size)`` batches per epoch, the
      last one smaller, and batch dimension ``None``.
    gradient_accumulation_steps: None or 1, or k >= 2: every batch of ``batch_size`` (the
      logical batch) is emitted as k consecutive chunks of sizes ``floor`` or ``ceil`` of
      ``batch_size / k`` (split as in :func:`poisson_batches`), for a DP optimizer with the
      same ``gradient_accumulation_steps``.  Needs ``drop_remainder=True`` and ``batch_size
      >= k`` (no chunk is empty, so the optimizer's microbatch count is ``batch_size``).

  Returns:
    A dataset of ``epochs * batches_per_epoch`` elements ``(x_b, y_b, weight)`` for ``(x, y)``
    (``(d_b, None, weight)`` for a dict, ``(x_b, weight)`` for one array), ``weight`` float32
    ``[b]`` of ones -- the same structure as :func:`poisson_batches`, so training code can
    consume either.

  Raises:
    ValueError: ``batch_size`` not in ``[1, N]``, ``epochs`` not a positive integer, ``seed``
      not an int64 integer, or ``data`` malformed (as for :func:`poisson_batches`).
    TypeError: ``data`` not an accepted structure (as for :func:`poisson_batches`).
  """
  chunks = accumulation_steps(gradient_accumulation_steps)
  structure, n = as_structure(data)
  batch_size = _checks.check_integer("batch_size", batch_size, minimum=1, maximum=n)
  epochs = _checks.check_integer("epochs", epochs, minimum=1)
  if chunks > 1 and (not drop_remainder or batch_size < chunks):
    raise ValueError(
        f"gradient_accumulation_steps={chunks} needs drop_remainder=True and batch_size >= "
        f"{chunks} (every chunk non-empty), got batch_size={batch_size}, "
        f"drop_remainder={drop_remainder!r}.")
  seed = _checks.check_integer("seed", secret_seed() if seed is None else seed,
                               minimum=INT64_MIN, maximum=INT64_MAX)
  base_seed = seed_pair(noise_lib.SecretInt(seed).prepare(), SHUFFLE_STREAM)

  def epoch_batches(epoch):
    epoch_seed = tf.random.experimental.stateless_fold_in(base_seed, epoch, alg=ALG)
    order = tf.random.experimental.stateless_shuffle(
        tf.range(n, dtype=tf.int64), seed=epoch_seed, alg=ALG)
    return tf.data.Dataset.from_tensor_slices(order).batch(batch_size,
                                                           drop_remainder=drop_remainder)

  def element(indices):
    return gather(structure, indices, tf.ones(tf.shape(indices), tf.float32))

  batches = tf.data.Dataset.range(epochs).flat_map(epoch_batches)
  if chunks == 1:
    dataset = batches.map(element, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  else:
    dataset = split_logical_batches(batches, structure, chunks)
  per_epoch = n // batch_size if drop_remainder else -(-n // batch_size)
  return tagged(dataset, Pipeline("shuffle", n, batch_size, per_epoch,
                                  accumulation_steps=chunks))


__all__ = ["shuffled_batches"]
