"""The DP-SGD hyper-parameters shared by every DP optimizer, validated once, and the step
that turns a clipped sum into the private average gradient."""
from __future__ import annotations

import math

import tensorflow as tf

from analysis import _checks
from tf_dpkit import distribute
from tf_dpkit import noise as noise_lib


class DPSettings:
  """Validated DP-SGD settings.

  Attributes:
    l2_norm_clip: C > 0, the L2 bound on each microbatch's gradient.
    noise_multiplier: sigma >= 0; the noise added to the clipped sum has std ``sigma * C``.
    num_microbatches: ``None`` (one per example) or M >= 1 dividing every batch.
    expected_batch_size: ``None`` or the expected size of a Poisson-sampled batch; when set the
      noisy sum is divided by it instead of by the realised number of microbatches (the
      realised size depends on the data, the expected one does not).
    noise_key: the secret (or, with ``seed``, reproducible) key of the noise generator.
  """

  def __init__(self, l2_norm_clip, noise_multiplier, num_microbatches=None, *,
               expected_batch_size=None, seed=None):
    self.l2_norm_clip = _checks.check_finite_positive("l2_norm_clip", l2_norm_clip)
    self.noise_multiplier = _checks.check_finite_nonnegative("noise_multiplier", noise_multiplier)
    self.num_microbatches = (None if num_microbatches is None else
                             _checks.check_integer("num_microbatches", num_microbatches, minimum=1,
                                                   none_allowed=True))
    if expected_batch_size is not None:
      expected_batch_size = _checks.check_finite_positive("expected_batch_size",
                                                          expected_batch_size)
      if self.num_microbatches is not None:
        raise ValueError(
            "expected_batch_size (Poisson-sampled batches of variable size) needs "
            f"num_microbatches=None (one microbatch per example), got {num_microbatches}.")
    self.expected_batch_size = expected_batch_size
    self.noise_key = noise_lib.fresh_key(seed)
    self._noise_draws, self._noise_draws_graph = None, None
    # Made here, not on first use: a variable created while tf.function traces the train step
    # would make it trace twice.
    self._noise_draw_counter()

  def _noise_draw_counter(self):
    """The draw counter of the current outermost context (eager, or a ``tf.compat.v1`` graph:
    an optimizer made outside the graph it is used in gets a counter in that graph)."""
    with tf.init_scope():
      graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
      if self._noise_draws is None or self._noise_draws_graph is not graph:
        # ONLY_FIRST_REPLICA: under a strategy every replica counts the same draw (their noise
        # differs by the replica id folded into the seed).
        self._noise_draws = tf.Variable(
            0, dtype=tf.int64, trainable=False, name="dp_noise_step",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
        self._noise_draws_graph = graph
    return self._noise_draws

  def next_noise_draw(self):
    """Increments and returns the count of noise draws (an int64 variable).

    Folded into the noise seed so that every private gradient gets fresh noise, also when a
    caller computes two at the same optimizer step.  In a ``tf.compat.v1`` graph the counter is
    a global variable (``dp_noise_step``) of the graph the optimizer was made in: initialise it
    with the others.
    """
    return self._noise_draw_counter().assign_add(1)

  @property
  def noise_stddev(self) -> float:
    """Std of the Gaussian noise added to the clipped sum: ``noise_multiplier * l2_norm_clip``."""
    return self.noise_multiplier * self.l2_norm_clip

  def config(self) -> dict:
    """The public settings for ``get_config`` (never the noise key)."""
    return {
        "l2_norm_clip": self.l2_norm_clip,
        "noise_multiplier": self.noise_multiplier,
        "num_microbatches": self.num_microbatches,
        "expected_batch_size": self.expected_batch_size,
    }

  def private_average(self, clipped_grads, realised_microbatches, step):
    """Returns ``(sum_j clip(g_j) + N(0, (sigma C)^2 I)) / normalizer`` per variable.

    Under a strategy with R replicas: this replica's share, ``(S_r + N(0, (sigma C)^2 / R I)) /
    normalizer`` with the global normaliser; the shares sum to the above (tf_dpkit.distribute).

    The noise is keyed by ``(noise_key, step, next_noise_draw())``: ``step`` (the optimizer's
    iteration count, or 0) makes runs resumed from a checkpoint with a fixed ``seed`` continue
    the noise sequence instead of repeating it; the draw counter makes repeated calls at one
    step independent.

    ``normalizer`` is ``expected_batch_size`` when set, else the number of microbatches
    (``realised_microbatches``, a scalar tensor or int).  A ``None`` entry stays ``None`` (no
    noise); every caller in tf_dpkit passes zeros for variables the loss does not reach, so
    those variables do receive noise, as the DP-SGD analysis assumes.
    """
    # Under R replicas each adds an independent share of variance sigma^2 C^2 / R and divides
    # by the global normaliser; the optimizer's all-reduce sums them (tf_dpkit.distribute).
    replicas = distribute.num_replicas()
    stddev = self.noise_stddev if replicas == 1 else self.noise_stddev / math.sqrt(replicas)
    noised = noise_lib.add_gaussian_noise(clipped_grads, stddev, self.noise_key, step,
                                          self.next_noise_draw(), distribute.replica_id())
    if self.expected_batch_size is None:
      realised_microbatches = distribute.global_sum(realised_microbatches)
    out = []
    for g in noised:
      if g is None:
        out.append(None)
        continue
      if self.expected_batch_size is not None:
        normalizer = tf.constant(self.expected_batch_size, dtype=g.dtype)
      else:
        normalizer = tf.cast(realised_microbatches, g.dtype)
      out.append(g / normalizer)
    return out
