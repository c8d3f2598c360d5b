"""The DP-SGD hyper-parameters shared by every DP optimizer, validated once, and the step
that turns a clipped sum into the private average gradient."""
from __future__ import annotations


import tensorflow as tf

from analysis import _checks, _secrecy
from analysis import schedules
from tf_dpkit import distribute
from tf_dpkit import noise as noise_lib


@_secrecy.refuse_pickling("the secret noise key", copies=False,
                          instead="Save the model (its config holds no key); a process that "
                          "resumes draws a fresh key.")
class DPSettings:
  """Validated DP-SGD settings.

  It holds the noise key, so it (and the optimizer) cannot be pickled or copied
  (:mod:`analysis._secrecy`).

  Attributes:
    l2_norm_clip: C > 0, the L2 bound on each microbatch's gradient, or an
      ``analysis.schedules.PiecewiseConstant`` schedule of it over the optimizer's steps.
    noise_multiplier: sigma >= 0; the noise added to the clipped sum has std ``sigma * C``; or
      a ``PiecewiseConstant`` schedule of it (each step is then accounted with its own sigma).
    num_microbatches: ``None`` (one per example) or M >= 1 dividing every batch.
    expected_batch_size: ``None`` or the expected size of a Poisson-sampled batch; when set the
      noisy sum is divided by it instead of by the realised number of microbatches (the
      realised size depends on the data, the expected one does not).
    noise_key: the secret (or, with ``seed``, reproducible) key of the noise generator.
  """

  def __init__(self, l2_norm_clip, noise_multiplier, num_microbatches=None, *,
               expected_batch_size=None, seed=None):
    self.clip_schedule = schedules.as_schedule("l2_norm_clip", l2_norm_clip, positive=True)
    self.noise_schedule = schedules.as_schedule("noise_multiplier", noise_multiplier,
                                                positive=False)
    self.l2_norm_clip = (self.clip_schedule if self.clip_schedule is not None else
                         _checks.check_finite_positive("l2_norm_clip", l2_norm_clip))
    self.noise_multiplier = (self.noise_schedule if self.noise_schedule is not None else
                             _checks.check_finite_nonnegative("noise_multiplier",
                                                              noise_multiplier))
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
  def scheduled(self) -> bool:
    """True when the clip norm or the noise multiplier follows a schedule."""
    return self.clip_schedule is not None or self.noise_schedule is not None

  @property
  def noise_stddev(self) -> float:
    """Std of the Gaussian noise added to the clipped sum: ``noise_multiplier * l2_norm_clip``
    (constant settings only; see :meth:`scheduled_noise_stddev`)."""
    if self.scheduled:
      raise TypeError("noise_stddev is per step under a schedule: use scheduled_noise_stddev.")
    return self.noise_multiplier * self.l2_norm_clip

  def clip_for_step(self, step):
    """The clip norm of the optimizer step ``step`` (an int64 scalar tensor): the constant
    ``l2_norm_clip`` (a float), or the clip schedule's value there (a float32 tensor)."""
    if self.clip_schedule is None:
      return self.l2_norm_clip
    return schedule_value(self.clip_schedule, step)

  def scheduled_noise_stddev(self, clip, step):
    """``sigma_t * C``: the noise std of step ``step`` for a sum clipped at ``clip`` (the float
    or tensor the clipping was given), a float32 tensor; None without schedules."""
    if not self.scheduled:
      return None
    sigma = (tf.constant(self.noise_multiplier, tf.float32) if self.noise_schedule is None
             else schedule_value(self.noise_schedule, step))
    return sigma * tf.cast(clip, tf.float32)

  def config(self) -> dict:
    """The public settings for ``get_config`` (never the noise key)."""
    def plain(value):
      return value.get_config() if isinstance(value, schedules.PiecewiseConstant) else value
    return {
        "l2_norm_clip": plain(self.l2_norm_clip),
        "noise_multiplier": plain(self.noise_multiplier),
        "num_microbatches": self.num_microbatches,
        "expected_batch_size": self.expected_batch_size,
    }

  def normalizer(self, realised_microbatches, dtype=tf.float32):
    """``n``, what the noisy clipped sum is divided by: ``expected_batch_size`` when set, else
    the number of microbatches of the global batch (``realised_microbatches`` summed over the
    replicas), as a scalar tensor of ``dtype``."""
    if self.expected_batch_size is not None:
      return tf.constant(self.expected_batch_size, dtype=dtype)
    return tf.cast(distribute.global_sum(realised_microbatches), dtype)

  def private_average(self, clipped_grads, realised_microbatches, step, noise_stddev=None):
    """Returns ``(sum_j clip(g_j) + N(0, (sigma C)^2 I)) / normalizer`` per variable.

    Under a strategy with R replicas: this replica's term, ``(S_r + Z_r) / normalizer`` with the
    global normaliser, ``Z_r`` full-variance noise on replica r's slice of each variable
    (MirroredStrategy) or ``N(0, (sigma C)^2 / R I)`` (several workers); the terms sum to the
    above (tf_dpkit.distribute).

    The noise is keyed by ``(noise_key, step, next_noise_draw())``: ``step`` (the optimizer's
    iteration count, or 0) makes runs resumed from a checkpoint with a fixed ``seed`` continue
    the noise sequence instead of repeating it; the draw counter makes repeated calls at one
    step independent.

    ``normalizer`` is ``expected_batch_size`` when set, else the number of microbatches
    (``realised_microbatches``, a scalar tensor or int).  A ``None`` entry stays ``None`` (no
    noise); every caller in tf_dpkit passes zeros for variables the loss does not reach, so
    those variables do receive noise, as the DP-SGD analysis assumes.

    ``noise_stddev`` replaces ``sigma C`` as the std of the noise on the whole sum (a number or
    a scalar tensor; adaptive clipping passes ``z_Delta C_t``, see
    ``tf_dpkit.optimizers.adaptive_clipping``).
    """
    # Under R replicas each adds full-variance noise on its slice (one process) or a share of
    # variance sigma^2 C^2 / R everywhere (several workers) and divides by the global
    # normaliser; the optimizer's all-reduce sums them (tf_dpkit.distribute).
    stddev, replica, part = distribute.replica_noise(
        self.noise_stddev if noise_stddev is None else noise_stddev)
    noised = noise_lib.add_gaussian_noise(clipped_grads, stddev, self.noise_key, step,
                                          self.next_noise_draw(), replica, part=part)
    # float64 holds the expected batch size and any count exactly; cast once per dtype.
    normalizer = self.normalizer(realised_microbatches, tf.float64)
    return [None if g is None else g / tf.cast(normalizer, g.dtype) for g in noised]


def schedule_value(schedule, step):
  """The value of the ``PiecewiseConstant`` ``schedule`` at the 0-based ``step`` (an integer
  scalar tensor), as a float32 scalar tensor: ``values[#{boundaries <= step}]``, as
  ``PiecewiseConstant.value_at``."""
  values = tf.constant(schedule.values, tf.float32)
  if not schedule.boundaries:
    return values[0]
  boundaries = tf.constant(schedule.boundaries, tf.int64)
  index = tf.searchsorted(boundaries, tf.reshape(tf.cast(step, tf.int64), [1]), side="right")
  return tf.gather(values, index[0])
