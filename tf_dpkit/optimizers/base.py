"""What every DP optimizer shares, Keras 3 and ``tf.compat.v1`` alike.

* the constructor's DP arguments, validated once (:class:`DPSettings`), and the learning rate
  (a finite number > 0, a tensor, or a schedule/callable);
* :meth:`DPOptimizerBase.privatize`: the only way to turn gradients into private ones.  It
  takes a :class:`~tf_dpkit.clipping.ClippedSum` (made only by tf_dpkit's clipping paths, so
  every microbatch's share is clipped to ``C``), adds ``N(0, (sigma C)^2 I)``, divides by the
  number of microbatches (or the expected batch size), adds data-independent gradients (weight
  regularisers) and certifies the result;
* the certificate check in ``apply`` / ``apply_gradients``: only the tensors ``privatize`` issued
  last, once.
"""
from __future__ import annotations

import inspect
import math
import numbers

import tensorflow as tf

from analysis import _checks, _secrecy
from tf_dpkit import _autograph, distribute
from tf_dpkit.clipping.clipped_sum import ClippedSum
from tf_dpkit.clipping.per_example import assert_nonempty
from tf_dpkit.optimizers.certificate import PrivateGradientCertificate
from tf_dpkit.optimizers.dp_settings import DPSettings

CONSTRUCTOR_ARGS_DOC = """Args:
      l2_norm_clip: C > 0; each microbatch gradient is clipped to L2 norm C.
      noise_multiplier: sigma >= 0; Gaussian noise of std sigma*C is added to the clipped sum.
      num_microbatches: None (one microbatch per example, default) or M dividing the batch.
      *args, **kwargs: passed to ``{base}`` (e.g. ``learning_rate``: a finite number > 0, or
        a schedule).
      seed: optional int key in [0, 2**62) for reproducible noise (tests); default: a secret
        key from the OS entropy source, never written to a config, checkpoint or graph.
      expected_batch_size: for Poisson-sampled batches, divide the noisy sum by this instead
        of the realised batch size (requires ``num_microbatches=None``)."""


#: The static loss scale ``S`` used under a float16 compute dtype (``mixed_float16``) when the
#: optimizer has no ``loss_scale_factor``: gradients of ``S * loss`` keep small per-example
#: gradients above float16's underflow while leaving a factor 65504 / S = 64 of headroom below
#: its overflow; a microbatch that still overflows contributes zero (see ``static_loss_scale``).
DEFAULT_FLOAT16_LOSS_SCALE = 2.0 ** 10


def check_loss_scale_factor(kwargs):
  """Raises ``ValueError`` unless ``kwargs["loss_scale_factor"]`` (Keras's static loss scale)
  is absent, None or a finite number in (0, inf)."""
  value = kwargs.get("loss_scale_factor")
  if value is not None:
    _checks.check_finite_positive("loss_scale_factor", value)


def check_learning_rate(base, args, kwargs):
  """Raises ``ValueError`` if ``base(*args, **kwargs)`` gets a NaN, infinite or non-positive
  numeric learning rate (tensors, variables, schedules and callables are passed through)."""
  try:
    bound = inspect.signature(base.__init__).bind_partial(None, *args, **kwargs)
  except TypeError:
    return  # the base constructor reports its own argument errors
  value = bound.arguments.get("learning_rate")
  if value is None or isinstance(value, bool) or not isinstance(value, numbers.Real):
    return
  if not (math.isfinite(value) and value > 0):
    raise ValueError(f"learning_rate must be a finite number in (0, inf) (or a schedule), got "
                     f"{value!r}.")


@_secrecy.refuse_pickling(
    "the secret noise key", copies=False,
    instead="Save the model (.keras, checkpoint: they hold no key); a process that resumes "
    "draws a fresh key.")
class DPOptimizerBase:
  """Mixin placed before the wrapped optimizer class; see the module docstring.  A DP
  optimizer holds the secret noise key, so it cannot be pickled or copied
  (:mod:`analysis._secrecy`)."""

  _dp_base_class = None  # set on each generated class
  _supports_replicas = True  # DP-SGD over the global batch under tf.distribute (see there)

  @classmethod
  def _validated_settings(cls, args, kwargs, l2_norm_clip, noise_multiplier, num_microbatches,
                          expected_batch_size, seed) -> DPSettings:
    """Checks every constructor argument before the wrapped class sees any of them."""
    check_learning_rate(cls._dp_base_class, args, kwargs)
    check_loss_scale_factor(kwargs)
    return DPSettings(l2_norm_clip, noise_multiplier, num_microbatches,
                      expected_batch_size=expected_batch_size, seed=seed)

  def _attach_dp(self, settings: DPSettings):
    self._dp = settings
    self._dp_certificate = PrivateGradientCertificate()

  l2_norm_clip = property(lambda self: self._dp.l2_norm_clip)
  # Per-layer clip norms (tf_dpkit.clipping.groups.LayerClipNorms; l2_norm_clip is their total).
  layer_clip_norms = property(lambda self: getattr(self, "_dp_layer_clips", None))
  # Adaptive clipping (tf_dpkit.optimizers.adaptive_clipping): its settings, or None.
  adaptive_clipping = property(
      lambda self: None if getattr(self, "_dp_adaptive", None) is None
      else self._dp_adaptive.settings)
  noise_multiplier = property(lambda self: self._dp.noise_multiplier)
  # The noise-multiplier schedule (analysis.schedules.PiecewiseConstant), or None.
  noise_multiplier_schedule = property(lambda self: self._dp.noise_schedule)
  num_microbatches = property(lambda self: self._dp.num_microbatches)
  expected_batch_size = property(lambda self: self._dp.expected_batch_size)
  dp_settings = property(lambda self: self._dp)

  def l2_norm_clip_for_step(self):
    """The clip norm to clip this step's gradients at: ``l2_norm_clip`` (a float); under
    adaptive clipping the optimizer variable holding the current ``C_t`` (``l2_norm_clip`` is
    ``C_0`` there); under an ``l2_norm_clip`` schedule its value at this step (a tensor).
    ``privatize`` requires a sum clipped at exactly this."""
    if getattr(self, "_dp_layer_clips", None) is not None:  # per-layer (tf_dpkit.clipping.groups)
      return self._dp_layer_clips
    adaptive = getattr(self, "_dp_adaptive", None)
    if adaptive is not None:
      return adaptive.variable
    if self._dp.clip_schedule is None:
      return self._dp.l2_norm_clip
    # A clip-norm schedule: its value at this step, a tensor that privatize then requires.
    self._dp_scheduled_clip = self._dp.clip_for_step(self._noise_step())
    return self._dp_scheduled_clip

  def dp_logs(self) -> dict:
    """Values for ``fit``'s logs: ``{"l2_norm_clip": C_t}`` under adaptive clipping, else {}."""
    adaptive = getattr(self, "_dp_adaptive", None)
    return {} if adaptive is None else adaptive.logs()

  def replica_num_microbatches(self):
    """The microbatches this replica cuts its local batch into (``tf_dpkit.distribute``):
    ``num_microbatches / R`` under R replicas, ``num_microbatches`` otherwise."""
    return distribute.local_num_microbatches(self._dp.num_microbatches)

  def _noise_step(self):
    """The optimizer step folded into the noise seed (0 when the optimizer has none)."""
    return 0

  def _loss_scale(self):
    """The factor the wrapped ``apply`` divides gradients by (None: none)."""
    return None

  def static_loss_scale(self, model=None):
    """The static loss scale ``S`` tf_dpkit's clipping paths compute gradients at, or None.

    ``loss_scale_factor`` when the optimizer has one; else ``DEFAULT_FLOAT16_LOSS_SCALE``
    (2**10) when ``model`` (or, without a model, the global Keras dtype policy) computes in
    float16 (``mixed_float16``); else None.  Gradients of ``S * loss`` are divided by ``S`` in
    float32 *before* clipping, so ``S`` never changes which gradient is clipped, and a
    microbatch whose gradient overflows (inf/NaN) contributes zero
    (``tf_dpkit.clipping.clipped_sum.unscaled_finite_float32``).

    Why static: Keras's dynamic loss scaling (``LossScaleOptimizer``) skips the whole step
    and halves ``S`` when any gradient of the batch is non-finite.  That decision is a
    function of the private batch that the accountant does not cover, and one example can
    force it (an example whose gradient overflows makes every step it is in a no-op and
    shows in the released scale).  A fixed ``S`` with per-microbatch zeroing makes the step a
    sum of per-microbatch terms of norm at most ``C``, so the usual sensitivity bound holds,
    the step is always taken and the noise is unchanged.
    """
    scale = self._loss_scale()
    if scale is not None:
      return float(scale)
    if model is not None:
      from tf_dpkit.clipping import _keras_internals  # pylint: disable=g-import-not-at-top
      dtypes = {getattr(layer, "compute_dtype", None)
                for layer in _keras_internals.sublayers(model, include_self=True)}
    else:
      import keras  # pylint: disable=g-import-not-at-top
      dtypes = {keras.config.dtype_policy().compute_dtype}
    return DEFAULT_FLOAT16_LOSS_SCALE if "float16" in dtypes else None

  @_autograph.graph_code
  def privatize(self, clipped: ClippedSum, data_independent_grads=None):
    """Private average gradients from a clipped sum, certified for ``apply``.

    ``(S + N(0, (sigma C)^2 I)) / n + R`` per variable, where ``S`` is ``clipped.grads``, ``n``
    the expected batch size when set, else the number of microbatches, and ``R`` the optional
    ``data_independent_grads`` (gradients that do not depend on the data, e.g. of weight
    regularisers; post-processing, no privacy cost).  With ``loss_scale_factor`` set, the result
    is multiplied by it, because Keras's ``apply`` divides by it.

    Args:
      clipped: a :class:`~tf_dpkit.clipping.ClippedSum` from ``tf_dpkit.private_gradients``'
        clipping paths; anything else raises ``TypeError``.
      data_independent_grads: optional list aligned with ``clipped.grads`` (None entries
        allowed).
    """
    distribute.check_supported_strategy(type(self).__name__,
                                        replicas_supported=self._supports_replicas)
    if not isinstance(clipped, ClippedSum):
      raise TypeError(
          f"{type(self).__name__}.privatize takes the ClippedSum made by tf_dpkit's clipping "
          f"(e.g. tf_dpkit.private_gradients), got {type(clipped).__name__}: noising gradients "
          "that were not clipped per example would not be private.")
    adaptive = getattr(self, "_dp_adaptive", None)
    if adaptive is not None:
      adaptive.check_clipped_at_current_clip(clipped, type(self).__name__)
    elif self._dp.clip_schedule is not None:
      if clipped.l2_norm_clip is not getattr(self, "_dp_scheduled_clip", None):
        raise ValueError(
            f"{type(self).__name__} has an l2_norm_clip schedule, but this sum was not clipped "
            "at the clip norm optimizer.l2_norm_clip_for_step() gave for this step (call it "
            "once per step and clip with its result; tf_dpkit's training paths do).")
    elif (isinstance(clipped.l2_norm_clip, numbers.Real)
          and clipped.l2_norm_clip > self._dp.l2_norm_clip):
      raise ValueError(
          f"{type(self).__name__}.privatize got a sum clipped at {clipped.l2_norm_clip!r}, above "
          f"the optimizer's l2_norm_clip={self._dp.l2_norm_clip!r} that its noise is calibrated "
          "to. Clip with optimizer.l2_norm_clip_for_step().")
    microbatches = tf.shape(clipped.losses)[0]
    # The update must depend on this check: with an empty batch the average would be inf.
    with tf.control_dependencies([assert_nonempty(microbatches)]):
      clipped_grads = [None if g is None else tf.identity(g) for g in clipped.grads]
    accumulation = getattr(self, "_dp_accumulation", None)
    if adaptive is not None:  # one Gaussian release of (sum, unclipped count), then C_t+1
      grads = adaptive.private_average(self._dp, clipped, clipped_grads, microbatches,
                                       self._noise_step(), type(self).__name__)
    elif accumulation is None:
      # Under a schedule: sigma_t times the clip this sum was clipped at (None: sigma C).
      stddev = self._dp.scheduled_noise_stddev(
          self._dp.l2_norm_clip if self._dp.clip_schedule is None else clipped.l2_norm_clip,
          self._noise_step())
      grads = self._dp.private_average(clipped_grads, microbatches, self._noise_step(),
                                       noise_stddev=stddev)
    else:  # virtual batches: noise once per logical batch (tf_dpkit.optimizers.accumulation)
      grads, _ = accumulation.step(
          clipped_grads, microbatches,
          lambda sums, count: self._dp.private_average(sums, count, self._noise_step()))
    if data_independent_grads is not None:
      extra = list(data_independent_grads)
      if len(extra) != len(grads):
        raise ValueError(f"data_independent_grads has {len(extra)} entries for {len(grads)} "
                         "variables.")
      grads = [g if r is None else (r if g is None else g + tf.cast(r, g.dtype))
               for g, r in zip(grads, extra)]
    scale = self._loss_scale()
    if scale is not None:
      grads = [None if g is None else g * tf.constant(scale, dtype=g.dtype) for g in grads]
    return self._dp_certificate.issue(grads)

  def _check_certified(self, grads):
    self._dp_certificate.check(list(grads), type(self).__name__)
    self._dp_certificate.clear()
