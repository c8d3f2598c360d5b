"""DP versions of Keras 3 optimizers.

``make_keras_dp_class(Base)`` returns a subclass of ``Base`` whose gradients are computed from a
*vector* loss with per-microbatch clipping and Gaussian noise; the update rule of ``Base``
(momentum, Adam moments, weight decay, ...) then acts on the private gradient, which is
post-processing and costs no privacy.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tf_dpkit import _autograph
from tf_dpkit.clipping import clipped_sum_from_vector_loss
from tf_dpkit.clipping import groups as groups_lib
from tf_dpkit.clipping import swap
from tf_dpkit.optimizers import accumulation as accumulation_lib
from tf_dpkit.optimizers.adaptive_clipping import AdaptiveClipState, AdaptiveClipping
from tf_dpkit.optimizers.base import CONSTRUCTOR_ARGS_DOC, DPOptimizerBase

#: Rows x fields of the privacy ledger variable (format owned by ``tf_dpkit.budget``).
PRIVACY_LEDGER_SHAPE = (64, 8)


def _check_schedules(settings, accumulation):
  """Refuses schedules the ledger cannot hold or that virtual batches do not follow."""
  for name, schedule in (("noise_multiplier", settings.noise_schedule),
                         ("l2_norm_clip", settings.clip_schedule)):
    if schedule is None:
      continue
    if accumulation is not None:
      raise ValueError(f"A {name} schedule is not supported with gradient_accumulation_steps "
                       "> 1; use one of them.")
    # Each run of equal noise multipliers is a ledger phase.  Clip changes cost nothing, but one
    # documented limit holds for both schedules (README: more than 64 pieces are refused).
    if schedule.num_pieces > PRIVACY_LEDGER_SHAPE[0]:
      why = ("the privacy ledger (optimizer.privacy_ledger) holds at most "
             f"{PRIVACY_LEDGER_SHAPE[0]} phases (runs of steps with one noise multiplier)"
             if name == "noise_multiplier" else
             f"a schedule may have at most {PRIVACY_LEDGER_SHAPE[0]} pieces")
      raise ValueError(
          f"{name}: the schedule has {schedule.num_pieces} pieces (runs of equal values), but "
          f"{why}; use between 1 and {PRIVACY_LEDGER_SHAPE[0]} pieces.")


def _check_grads_match_variables(owner, grads, variables):
  """Raises ``ValueError`` unless ``grads`` pairs one gradient of the variable's shape with each
  of ``variables`` (``apply(grads, trainable_variables)``)."""
  if len(grads) != len(variables):
    raise ValueError(
        f"{owner}.apply got {len(grads)} gradients for {len(variables)} trainable_variables: "
        "pass the variables the private gradients were computed for, in the same order (or "
        "use optimizer.minimize / apply_gradients(zip(grads, var_list))).")
  for i, (grad, variable) in enumerate(zip(grads, variables)):
    if grad is None or not hasattr(grad, "shape") or not hasattr(variable, "shape"):
      continue
    if not tf.TensorShape(grad.shape).is_compatible_with(tf.TensorShape(variable.shape)):
      raise ValueError(
          f"{owner}.apply: gradient {i} has shape {tuple(grad.shape)}, but trainable_variables"
          f"[{i}] ({getattr(variable, 'path', None) or getattr(variable, 'name', '?')}) has "
          f"shape {tuple(variable.shape)}: these gradients were computed for other variables. "
          "Pass the variables the private gradients were computed for, in the same order.")


def _check_adaptive_combinations(adaptive_clipping, layer_clips, accumulation_steps):
  """Refuses adaptive clipping with per-layer clip norms or gradient accumulation (ValueError
  naming both arguments, why and what to use instead), before anything else is checked."""
  if AdaptiveClipping.coerce(adaptive_clipping) is None:
    return
  if layer_clips is not None:
    raise ValueError(
        "adaptive_clipping cannot be combined with per-layer clip norms (layer_clip_norms / "
        "LayerClipNorms): adaptive clipping adapts one global clip norm C_t from the noisy "
        "count of examples whose whole gradient is within C_t, and no per-layer version of that "
        "count is analysed. Use either per-layer clip norms with fixed clipping, or "
        "adaptive_clipping with a single l2_norm_clip.")
  if accumulation_steps > 1:
    raise ValueError(
        f"adaptive_clipping cannot be combined with gradient_accumulation_steps="
        f"{accumulation_steps}: adaptive clipping releases the noisy unclipped count and updates "
        "C_t at every micro-batch, while a virtual batch releases its noisy gradient sum once per "
        "k micro-batches, so the clip norm would change inside one release. Use "
        "gradient_accumulation_steps=1 (with a larger expected_batch_size if memory allows) or "
        "a fixed l2_norm_clip.")


def make_keras_dp_class(base):
  """Builds the DP subclass of the Keras 3 optimizer class ``base`` (see the factory)."""

  class KerasDPOptimizer(DPOptimizerBase, base):
    __doc__ = f"""Differentially private {base.__name__} (DP-SGD gradient, {base.__name__} update).

    {CONSTRUCTOR_ARGS_DOC.format(base="keras.optimizers." + base.__name__)}

    One step: split the vector loss into M microbatches, clip each microbatch's gradient to
    C, sum, add N(0, (sigma C)^2 I), divide by M (or ``expected_batch_size``), apply the
    {base.__name__} update.  ``gradient_accumulation_steps=k`` (k >= 2): virtual batches of k
    micro-batches, clipped sums accumulated, noise added and the update applied once per
    logical batch (``tf_dpkit.optimizers.accumulation``; Keras's own accumulation, which would
    noise every micro-step, is not used).
    """

    _dp_base_class = base

    def __init__(self, l2_norm_clip, noise_multiplier, num_microbatches=None, *args,
                 seed=None, expected_batch_size=None, adaptive_clipping=None, **kwargs):
      # Not passed to Keras: its accumulation would noise every micro-step (see accumulation).
      steps = accumulation_lib.check_accumulation_steps(
          kwargs.pop("gradient_accumulation_steps", None))
      # Per-layer clip norms (tf_dpkit.clipping.groups): the settings hold their total C.
      layer_clips, l2_norm_clip = groups_lib.split_clip_argument(
          l2_norm_clip, kwargs.pop("layer_clip_norms", None))
      settings = self._validated_settings(args, kwargs, l2_norm_clip, noise_multiplier,
                                          num_microbatches, expected_batch_size, seed)
      super().__init__(*args, **kwargs)
      self._attach_dp(settings)
      self._dp_accumulation = accumulation_lib.GradientAccumulation(steps) if steps > 1 else None
      self._dp_layer_clips = layer_clips
      # The privacy ledger (tf_dpkit.budget): optimizer state, so it is saved and restored with
      # the model (.keras files, save_weights, ModelCheckpoint, BackupAndRestore).
      self._privacy_ledger = self.add_variable(
          shape=PRIVACY_LEDGER_SHAPE, initializer="zeros", dtype="float64",
          name="dp_privacy_ledger")
      # Adaptive clipping (tf_dpkit.optimizers.adaptive_clipping): C_t is optimizer state too.
      # What it cannot combine with is refused first, so the error names the real conflict
      # (not a missing count_noise_stddev).
      _check_adaptive_combinations(adaptive_clipping, layer_clips, steps)
      self._dp_adaptive = AdaptiveClipState.attach(self, adaptive_clipping, settings)
      _check_schedules(settings, self._dp_accumulation)

    @property
    def privacy_ledger(self):
      """float64 variable holding the record of the DP steps taken (see ``tf_dpkit.budget``)."""
      return self._privacy_ledger

    @property
    def accumulation_steps(self) -> int:
      """k: micro-batches per logical batch (1: no accumulation).  Keras's own
      ``gradient_accumulation_steps`` attribute stays None (its accumulation is not used)."""
      return 1 if self._dp_accumulation is None else self._dp_accumulation.steps

    def get_config(self):
      config = super().get_config()
      config.update(self._dp.config())
      if self._dp_layer_clips is not None:
        config["layer_clip_norms"] = self._dp_layer_clips.config()
      config["gradient_accumulation_steps"] = (None if self._dp_accumulation is None
                                               else self._dp_accumulation.steps)
      config["adaptive_clipping"] = (None if self._dp_adaptive is None
                                     else self._dp_adaptive.config())
      return config

    def _noise_step(self):
      return self.iterations

    def _loss_scale(self):
      return self.loss_scale_factor

    @_autograph.graph_code
    def compute_gradients(self, loss, var_list, tape=None):
      """Private gradients of a vector loss: ``[(grad, var), ...]``.

      When the loss comes from one ``training=True`` call of a DP model
      (``tf_dpkit.DPSequential`` / ``DPModel``) inside ``tape`` and ``var_list`` is that model's
      trainable variables, the per-layer fast path clips it (``tf_dpkit.clipping.swap``: about
      the cost of a non-private step; a loss whose entry i depends on another example's
      outputs is refused).  Otherwise per-microbatch gradients are rows of the full Jacobian
      (about B backward passes; said once per optimizer).

      Under a float16 compute dtype (global ``mixed_float16`` policy) or with
      ``loss_scale_factor`` set, gradients are computed at the static loss scale
      ``static_loss_scale()`` and unscaled before clipping (see there).

      Args:
        loss: float tensor [batch] recorded on ``tape``, or a zero-argument callable returning
          one (then a tape is opened here).
        var_list: the variables to train.
        tape: the ``tf.GradientTape`` that recorded ``loss`` (required for a tensor loss).
      """
      var_list = list(var_list)
      if callable(loss):
        with tf.GradientTape() as tape:
          loss = _autograph.user_function(loss)()
      elif tape is None:
        raise ValueError(
            f"{type(self).__name__}.compute_gradients needs `tape=` (the GradientTape that "
            "recorded the vector loss), or pass the loss as a zero-argument callable.")
      # The swap path (tf_dpkit.clipping.swap): a DP model traced this loss's forward pass.
      clipped = swap.clipped_sum_for_optimizer(
          self, loss, var_list, tape, self.l2_norm_clip_for_step(),
          self.replica_num_microbatches())
      if clipped is not None:
        return list(zip(self.privatize(clipped), var_list))
      if self._dp_layer_clips is not None:
        raise ValueError(
            f"{type(self).__name__} has per-layer clip norms, which are grouped by the model's "
            "layers; a vector loss and var_list have none. Use tf_dpkit.private_gradients("
            "optimizer, model, ...), a DP model's fit, or a DP model called under the tape "
            "with var_list=model.trainable_variables.")
      clipped = clipped_sum_from_vector_loss(
          loss, var_list, self.l2_norm_clip_for_step(), self.replica_num_microbatches(),
          tape=tape, loss_scale=self.static_loss_scale())
      return list(zip(self.privatize(clipped), var_list))

    @_autograph.graph_code
    def minimize(self, loss, var_list, tape=None):
      """``compute_gradients`` then ``apply_gradients``; returns ``iterations`` after the step."""
      grads_and_vars = self.compute_gradients(loss, var_list, tape=tape)
      self.apply_gradients(grads_and_vars)
      return self.iterations

    @_autograph.graph_code
    def apply(self, grads, trainable_variables=None):
      grads = list(grads)
      if trainable_variables is not None:
        trainable_variables = list(trainable_variables)
        # Before the certificate is spent and before Keras builds its slots for these
        # variables: a refused call leaves the optimizer as it was.
        _check_grads_match_variables(type(self).__name__, grads, trainable_variables)
      self._check_certified(grads)
      if self._dp_accumulation is None:
        return super().apply(grads, trainable_variables)
      return self._apply_at_release(grads, trainable_variables)

    def _apply_at_release(self, grads, trainable_variables):
      """Keras's update, run only on the micro-step that releases the logical batch."""
      release = self._dp_accumulation.last_release_flag()
      if not self.built and trainable_variables is not None:
        with tf.init_scope():  # slots made outside the branch (and outside any trace)
          self.build(list(trainable_variables))
      parent = super()

      def update():
        parent.apply(grads, trainable_variables)
        return tf.constant(True)

      tf.cond(release, update, lambda: tf.constant(False))

  KerasDPOptimizer.__name__ = f"DP{base.__name__}"
  KerasDPOptimizer.__qualname__ = KerasDPOptimizer.__name__
  return keras.saving.register_keras_serializable(
      package="tf_dpkit", name=KerasDPOptimizer.__name__)(KerasDPOptimizer)
