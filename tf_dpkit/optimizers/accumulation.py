"""Virtual batches: DP-SGD over a logical batch assembled from ``k`` physical micro-batches.

With ``gradient_accumulation_steps=k`` micro-steps ``1..k-1`` only add clipped sums to an
untracked accumulator; micro-step ``k`` releases ``(S_1 + ... + S_k + N(0, sigma^2 C^2 I)) / n``
and steps once, so ``iterations`` and the accountant count logical steps.  Private only when
every example joins at most one micro-batch: one Poisson sample split in ``k`` chunks
(``poisson_batches(..., gradient_accumulation_steps=k)``) or consecutive shuffled batches.
Refused under ``MirroredStrategy`` / ``MultiWorkerMirroredStrategy``.  The privacy argument,
chunking and checkpoints: docs/design/optimizers_accumulation.md.
"""
from __future__ import annotations

import math

import tensorflow as tf

from analysis import _checks
from tf_dpkit.data.poisson import accumulation_steps_for_memory  # noqa: F401 (re-exported)


def check_accumulation_steps(value) -> int:
  """``gradient_accumulation_steps`` as an int: None or 1 -> 1 (off), an integer k >= 1.

  Raises:
    ValueError: not None and not an integer >= 1 (``True``, floats and strings included).
  """
  if value is None:
    return 1
  return _checks.check_integer("gradient_accumulation_steps", value, minimum=1)


class GradientAccumulation:
  """The accumulator of one DP optimizer (see the module docstring).

  A plain object (not trackable), so the un-noised sums in its variables reach no checkpoint.
  """

  __slots__ = ("steps", "_sums", "_count", "_position", "_graph", "_shapes", "_release")

  def __init__(self, steps: int):
    self.steps = steps
    self._sums, self._count, self._position, self._graph, self._shapes = None, None, None, None, None
    self._release = None
    with tf.init_scope():
      self._counter_variables()

  def _counter_variables(self):
    with tf.init_scope():
      graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
      if self._position is None or self._graph is not graph:
        self._position = tf.Variable(0, dtype=tf.int64, trainable=False,
                                     name="dp_accumulation_position")
        self._count = tf.Variable(0, dtype=tf.int64, trainable=False,
                                  name="dp_accumulation_microbatches")
        self._sums, self._shapes, self._graph = None, None, graph

  def _sum_variables(self, grads):
    """One float accumulator per non-None gradient, made on first use (outside any trace).

    The variables have no fixed shape (a traced gradient's static shape may be partly unknown):
    they start as a scalar 0 and take the gradient's shape on the first micro-step."""
    self._counter_variables()
    kinds = tuple(None if g is None else (g.shape.rank, g.dtype) for g in grads)
    if self._sums is None:
      with tf.init_scope():
        self._sums = [None if kind is None else tf.Variable(
            tf.zeros([], kind[1]), shape=tf.TensorShape(None), trainable=False,
            name="dp_accumulated_clipped_sum") for kind in kinds]
      self._shapes = kinds
    elif kinds != self._shapes:
      raise ValueError(
          "gradient_accumulation_steps: this micro-step's gradients do not match the variables "
          "of the earlier micro-steps (the same variables, in the same order, must be trained "
          "at every micro-step of a logical batch).")
    return self._sums

  @property
  def position(self) -> tf.Variable:
    """Micro-batches accumulated so far in the current logical batch, in [0, k)."""
    return self._position

  def completed_within(self, micro_steps: int) -> int:
    """Logical steps that the next ``micro_steps`` micro-steps complete (reads the position)."""
    return (int(self._position.numpy()) + int(micro_steps)) // self.steps

  def step(self, clipped_grads, microbatches, release):
    """Accumulates one micro-batch; returns ``(grads, is_release)``.

    ``release(sums, count)`` is called (inside ``tf.cond``) with the logical batch's clipped
    sums and microbatch count on the k-th micro-step only; it returns the private gradients.
    On the other micro-steps ``grads`` are zeros that ``apply`` never applies.
    """
    _check_strategy(tf.distribute.get_strategy() if tf.distribute.has_strategy() else None,
                    self.steps)
    sums = self._sum_variables(clipped_grads)
    position = self._position.read_value()
    is_release = tf.equal(position + 1, self.steps)
    totals = [None if g is None else _with_shape_of(s.read_value() + g, g)
              for s, g in zip(sums, clipped_grads)]
    count = self._count.read_value() + tf.cast(microbatches, tf.int64)
    present = [i for i, t in enumerate(totals) if t is not None]

    def released():
      out = release(totals, count)
      return [out[i] for i in present]

    def held():
      return [tf.zeros_like(totals[i]) for i in present]

    outputs = tf.cond(is_release, released, held)
    if not isinstance(outputs, (list, tuple)):
      outputs = [outputs]
    grads = [None] * len(totals)
    for i, value in zip(present, outputs):
      grads[i] = value
    with tf.control_dependencies([g for g in grads if g is not None]):
      updates = [self._count.assign(tf.where(is_release, tf.zeros_like(count), count)),
                 self._position.assign((position + 1) % self.steps)]
      for s, t in zip(sums, totals):
        if s is not None:
          updates.append(s.assign(tf.where(is_release, tf.zeros_like(t), t)))
    with tf.control_dependencies(updates):
      grads = [None if g is None else tf.identity(g) for g in grads]
      is_release = tf.identity(is_release)
    self._release = is_release
    return grads, is_release

  def discard(self) -> None:
    """Drops the micro-batches accumulated since the last release (nothing is released, so
    nothing is spent): the next micro-step starts a new logical batch.  DP models call it at
    the start of every ``fit``, so a logical batch never mixes chunks of two pipelines."""
    self._counter_variables()
    self._position.assign(0)
    self._count.assign(0)
    for s in self._sums or ():
      if s is not None:
        s.assign(tf.zeros([], s.dtype))

  def last_release_flag(self):
    """The ``is_release`` tensor of the latest :meth:`step` (for the optimizer's ``apply``)."""
    if self._release is None:
      raise ValueError("apply() before any private gradient was computed.")
    return self._release


def _with_shape_of(value, like):
  """``value`` (the broadcast of a scalar 0 or a same-shape sum with ``like``) with ``like``'s
  shape, static dimensions included."""
  value = tf.broadcast_to(value, tf.shape(like))
  value.set_shape(like.shape)
  return value


def check_fit(model, pipeline) -> None:
  """Before ``fit`` of a DP model: refuses a tf_dpkit pipeline cut into another number of
  chunks than the optimizer's ``gradient_accumulation_steps``, and accumulation under several
  replicas;
  then discards any partial logical batch left by an earlier ``fit`` or custom loop."""
  optimizer = getattr(model, "optimizer", None)
  accumulation = getattr(optimizer, "_dp_accumulation", None)
  k = 1 if accumulation is None else accumulation.steps
  # An untagged input (arrays, other datasets) is checked by PrivacyBudget when one is used.
  chunks = k if pipeline is None else pipeline.accumulation_steps
  if chunks != k:
    raise ValueError(
        f"x: batches split into {chunks} chunk(s) per logical batch "
        f"(gradient_accumulation_steps={chunks} in the pipeline), but the optimizer has "
        f"gradient_accumulation_steps={k}: each {'chunk would be noised and applied as a step' if k == 1 else 'release would mix chunks of different logical batches'}. "
        "Build both with the same gradient_accumulation_steps.")
  if accumulation is None:
    return
  _check_strategy(model.distribute_strategy, k)
  accumulation.discard()


def check_array_epochs(optimizer, num_examples: int, batch_size: int,
                       steps_per_epoch=None) -> None:
  """Before ``fit`` of a DP model on in-memory arrays: refuses virtual batches that could
  straddle two epochs.

  Keras cuts each epoch's fresh permutation of the N examples into ``ceil(N / batch_size)``
  batches.  A logical batch is ``k`` consecutive micro-batches; when the batches per pass (and
  ``steps_per_epoch``, when given) are not multiples of ``k``, one logical batch takes its
  first micro-batches from one permutation and the rest from the next, so it can hold one
  example twice and its released sum moves by ``2C`` when that example is removed, which
  no epsilon computed for sensitivity ``C`` covers.  Raises ``ValueError`` then (nothing runs).
  """
  accumulation = getattr(optimizer, "_dp_accumulation", None)
  if accumulation is None:
    return
  k = accumulation.steps
  per_pass = max(1, math.ceil(num_examples / batch_size))
  bad = [(what, value) for what, value in (
      (f"N={num_examples} examples in batches of {batch_size} give {per_pass} batches per "
       "epoch", per_pass),
      (f"steps_per_epoch={steps_per_epoch}", steps_per_epoch)) if value is not None and value % k]
  if bad:
    whole = (per_pass - per_pass % k) * batch_size
    fix = (f"e.g. train on the first {whole} examples" if whole else
           f"e.g. a batch_size of at most {max(1, num_examples // k)}")
    raise ValueError(
        f"{bad[0][0]}, not a multiple of gradient_accumulation_steps={k}: a logical batch of "
        f"{k} micro-batches would straddle two epochs, whose shuffles are independent, so it "
        "could hold one example twice (the released sum would move by 2 C when it is "
        "removed, twice what the noise is calibrated to). Make every epoch a whole number of "
        f"logical batches ({fix}; steps_per_epoch, when given, a multiple of {k}), or use "
        f"tf_dpkit.data.poisson_batches(..., gradient_accumulation_steps={k}).")


def _check_strategy(strategy, k) -> None:
  """Refuses strategies that update in a cross-replica merge (Mirrored, MultiWorkerMirrored):
  Keras's update would have to run inside the release condition, where TensorFlow forbids a
  merge; each replica would also keep its own un-noised sum.  No strategy and
  ``OneDeviceStrategy`` are fine."""
  if strategy is None or isinstance(strategy, tf.distribute.OneDeviceStrategy):
    return
  if type(strategy).__name__ == "_DefaultDistributionStrategy":
    return
  raise NotImplementedError(
      f"gradient_accumulation_steps={k} is not supported under {type(strategy).__name__} "
      f"({strategy.num_replicas_in_sync} replica(s)): Keras applies the update in a "
      "cross-replica merge, which TensorFlow cannot run inside the once-per-logical-batch "
      "condition, and each replica would keep its own un-noised sum. Train without a strategy "
      "or under OneDeviceStrategy, or use a larger global batch instead of accumulation.")
