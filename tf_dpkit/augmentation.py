"""Augmentation multiplicity for DP-SGD (De et al. 2022, arXiv 2204.13650).

Each example is augmented ``K`` times by ``augment_fn(example, seed)`` (one example, stateless
ops keyed by ``seed`` only) and contributes the clipped MEAN of its ``K`` copies' gradients, so
the sensitivity stays ``C`` and the accounting (rate ``q`` over examples, noise multiplier) is
unchanged; the optimizer still divides by the expected number of EXAMPLES.  Refused: ``K``
outside [1, 1024], ``K > 1`` with ``num_microbatches``, a non-callable ``augment_fn`` or one
that changes the structure.  Privacy argument, seeds and the full contract:
docs/design/augmentation.md.
"""
from __future__ import annotations

import tensorflow as tf

from analysis import _checks, _secrecy
from tf_dpkit import distribute
from tf_dpkit import noise as noise_lib
from tf_dpkit.clipping.contract import map_examples
from tf_dpkit.clipping.per_example import MAX_MICROBATCH_SIZE

__all__ = ["AugmentationMultiplicity", "MAX_MULTIPLICITY", "check_augmentation"]

#: The largest augmentation multiplicity K accepted.
MAX_MULTIPLICITY = MAX_MICROBATCH_SIZE


@_secrecy.refuse_pickling("its secret augmentation key", copies=False,
                          instead="Make a new AugmentationMultiplicity where one is needed.")
class AugmentationMultiplicity:
  """K random per-example augmentations whose mean gradient is clipped once per example.

  See the module docstring for the maths, the privacy argument and ``augment_fn``'s contract.

  Args:
    augment_fn: ``augment_fn(example, seed) -> augmented example`` for ONE example (no batch
      axis) and an int64 seed of shape [2], its only source of randomness.
    multiplicity: K, an integer in [1, 1024]: augmented copies per example.
    seed: None (default: a secret key from the operating system) or an integer in
      [0, 2**62) for reproducible augmentations, for tests only: the privacy argument (module
      docstring) treats the copies' randomness as fresh draws the adversary does not know, as
      for the noise key (a known key lets removing one example shift the other examples'
      position-keyed augmentations).
  """

  def __init__(self, augment_fn, multiplicity, seed=None):
    if not callable(augment_fn):
      raise TypeError(f"augment_fn must be callable as augment_fn(example, seed), got "
                      f"{augment_fn!r}.")
    self._augment_fn = augment_fn
    self._multiplicity = _checks.check_integer("multiplicity", multiplicity, minimum=1,
                                               maximum=MAX_MULTIPLICITY)
    self._key = noise_lib.fresh_key(seed)
    # Made now (eagerly): a variable first created while tf.function traces the train step
    # would make it trace twice.  Held by this object only, never checkpointed.
    with tf.init_scope():
      self._draws = tf.Variable(0, dtype=tf.int64, trainable=False,
                                name="dp_augmentation_draws",
                                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)

  multiplicity = property(lambda self: self._multiplicity, doc="K: copies per example.")
  augment_fn = property(lambda self: self._augment_fn)

  @property
  def microbatch_size(self):
    """Rows per clipped unit for the clipping paths: K, or None for K = 1 (one row per example,
    the clipping of training without augmentation multiplicity)."""
    return None if self._multiplicity == 1 else self._multiplicity

  def __repr__(self):
    name = getattr(self._augment_fn, "__name__", type(self._augment_fn).__name__)
    return f"AugmentationMultiplicity({name}, multiplicity={self._multiplicity})"

  def step_seed(self, step):
    """A fresh int64 [2] seed for one call at optimizer step ``step``: ``fold_in((key, step),
    draw)`` with the call counter ``draw`` incremented, then the replica id folded in under a
    strategy with several replicas."""
    draw = self._draws.assign_add(1)
    seed = tf.random.experimental.stateless_fold_in(
        tf.stack([self._key.tensor(), tf.cast(step, tf.int64)]), tf.cast(draw, tf.int64))
    replica = distribute.replica_id()
    if replica is not None:
      seed = tf.random.experimental.stateless_fold_in(seed, tf.cast(replica, tf.int64))
    return seed

  def augmented_rows(self, x, y, sample_weight, seed):
    """The batch of B examples as B*K rows, each example's K copies consecutive.

    Row ``i*K + k`` is ``augment_fn(x_i, s_{iK+k})`` with ``y_i`` and ``sample_weight_i``; the
    per-row seeds ``s`` are a stateless draw of shape [B*K, 2] from ``seed``.  A pure function
    of ``(x, seed)``: equal seeds give equal rows.

    Args:
      x: nest of tensors [B, ...] (the model's inputs).
      y: nest of tensors [B, ...] or None.
      sample_weight: [B] or [B, 1] or None.
      seed: int64 tensor [2] (e.g. from :meth:`step_seed`).

    Returns:
      ``(x_rows, y_rows, sample_weight_rows)``.
    """
    k = self._multiplicity
    repeat = lambda t: None if t is None else tf.repeat(tf.convert_to_tensor(t), k, axis=0)
    x_repeated = tf.nest.map_structure(repeat, x)
    rows = tf.shape(tf.nest.flatten(x_repeated)[0])[0]
    seeds = tf.random.stateless_uniform(tf.stack([rows, 2]), seed=seed, minval=None,
                                        maxval=None, dtype=tf.int64)
    augment_fn = self._augment_fn

    def one_row(element):
      example, row_seed = element
      out = augment_fn(example, row_seed)
      try:
        tf.nest.assert_same_structure(example, out)
      except (TypeError, ValueError) as error:
        raise ValueError(
            "augment_fn(example, seed) must return the structure of the example it was given "
            f"(one example of x, no batch axis): {error}") from None
      return tf.nest.map_structure(tf.convert_to_tensor, out)

    try:  # fully vectorised when pfor converts every op of augment_fn ...
      x_rows = tf.vectorized_map(one_row, (x_repeated, seeds), fallback_to_while_loop=False)
    except (TypeError, ValueError, NotImplementedError, tf.errors.OpError, LookupError):
      # ... else one row at a time (pfor has no converter for the stateless random ops, and
      # its per-op while-loop fallback stacks uint64 keys, which have no GPU kernel).
      x_rows = map_examples(one_row, (x_repeated, seeds), vectorize=False)
    y_rows = tf.nest.map_structure(repeat, y)
    return x_rows, y_rows, repeat(sample_weight)

  def augment_batch(self, x, y, sample_weight, step):
    """:meth:`augmented_rows` with a fresh :meth:`step_seed` for optimizer step ``step``."""
    return self.augmented_rows(x, y, sample_weight, self.step_seed(step))


def rows_for_step(augmentation, x, y, sample_weight, step):
  """What the clipping paths receive at optimizer step ``step``: ``(x, y, sample_weight,
  microbatch_size)``.  Without augmentation the batch as given and ``microbatch_size=None``
  (one row per clipped unit); with it the B*K augmented rows (:meth:`AugmentationMultiplicity.
  augment_batch`) and ``microbatch_size`` = K (None for K = 1).  The one place where both
  ``fit`` and ``tf_dpkit.private_gradients`` turn examples into clipped units."""
  if augmentation is None:
    return x, y, sample_weight, None
  x, y, sample_weight = augmentation.augment_batch(x, y, sample_weight, step)
  return x, y, sample_weight, augmentation.microbatch_size


def check_augmentation(augmentation, num_microbatches=None):
  """Returns ``augmentation`` (None or an :class:`AugmentationMultiplicity`) after checking it.

  Raises ``TypeError`` for any other object, and ``ValueError`` when K > 1 and
  ``num_microbatches`` (the DP optimizer's, or a training configuration's) is set: a microbatch
  would then hold several examples' copies, another privacy unit than the one example this
  feature clips.
  """
  if augmentation is None:
    return None
  if not isinstance(augmentation, AugmentationMultiplicity):
    raise TypeError("augmentation must be None or a tf_dpkit.AugmentationMultiplicity("
                    f"augment_fn, multiplicity=K), got {augmentation!r}.")
  if augmentation.multiplicity > 1 and num_microbatches is not None:
    raise ValueError(
        f"AugmentationMultiplicity(multiplicity={augmentation.multiplicity}) clips each "
        "example's mean gradient over its augmented copies, so it needs the DP optimizer's "
        f"num_microbatches=None, got num_microbatches={num_microbatches}.")
  return augmentation
