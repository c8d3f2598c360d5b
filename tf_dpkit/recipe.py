"""Training ingredients that cost no privacy: weight averaging (EMA) and a learning-rate schedule.

:class:`LinearDecayTail` (a schedule of the step index only) and :class:`EMAEvaluation`
(evaluate with Keras's ``use_ema`` averages during ``fit``, then restore the raw weights) only
post-process the released noisy gradients, so the run's epsilon is that of the same q, sigma
and steps without them.  Example, privacy argument and the callback's contract:
docs/design/recipe.md; usage: docs/guides/published_accuracy.md.
"""
from __future__ import annotations

import keras

from analysis import _checks

__all__ = ["EMAEvaluation", "LinearDecayTail", "averaged_variables"]


def averaged_variables(optimizer) -> list:
  """``[(model variable, its moving average), ...]`` of a Keras 3 optimizer with ``use_ema``.

  The pairs are those Keras itself uses (the variables the optimizer was built with and their
  ``average`` slots), in the same order.

  Raises:
    TypeError: ``optimizer`` is not a Keras 3 optimizer.
    ValueError: it was not built with ``use_ema=True``, or has not been built yet (no step).
  """
  if not isinstance(optimizer, keras.optimizers.Optimizer):
    raise TypeError(f"optimizer must be a Keras 3 optimizer, got {type(optimizer).__name__}.")
  if not getattr(optimizer, "use_ema", False):
    raise ValueError(f"optimizer {type(optimizer).__name__} was built without use_ema=True: it "
                     "keeps no averaged weights. Pass use_ema=True (and ema_momentum in [0, 1]) "
                     "to the optimizer.")
  if not optimizer.built:
    raise ValueError("the optimizer has not been built (no training step yet): it holds no "
                     "averaged weights.")
  # Keras keeps these as private attributes (keras/src/optimizers/base_optimizer.py); the
  # tests compare the averages with an independent recomputation.
  variables = list(optimizer._trainable_variables)  # pylint: disable=protected-access
  averages = list(optimizer._model_variables_moving_average)  # pylint: disable=protected-access
  return [(v, a) for v, a in zip(variables, averages) if a is not None]


def _averaged_variables_or_none(optimizer):
  """:func:`averaged_variables`, or None for an EMA optimizer that is not built yet."""
  if (isinstance(optimizer, keras.optimizers.Optimizer) and getattr(optimizer, "use_ema", False)
      and not optimizer.built):
    return None
  return averaged_variables(optimizer)


class EMAEvaluation(keras.callbacks.Callback):
  """Evaluates with the optimizer's exponential moving average of the weights, then restores.

  On ``on_test_begin`` (every validation pass inside ``fit``, or ``model.evaluate(...,
  callbacks=[this])``) the model's trainable variables are set to their averages a_t; on
  ``on_test_end`` the raw weights are written back.  Before the first training step (nothing
  averaged yet) evaluation uses the weights as they are.  See the module docstring for the
  privacy argument (post-processing) and the contract.

  Raises (at ``on_train_begin`` / ``on_test_begin``):
    TypeError / ValueError: the model's optimizer is not a Keras 3 optimizer with
      ``use_ema=True`` (:func:`averaged_variables`).
  """

  def __init__(self):
    super().__init__()
    self._saved = None

  def on_train_begin(self, logs=None):
    _averaged_variables_or_none(self.model.optimizer)  # fail before training, not after an epoch

  def on_test_begin(self, logs=None):
    pairs = _averaged_variables_or_none(self.model.optimizer)
    if not pairs or int(self.model.optimizer.iterations.numpy()) == 0:
      self._saved = None
      return
    self._saved = [(v, v.numpy()) for v, _ in pairs]
    for v, a in pairs:
      v.assign(a)

  def on_test_end(self, logs=None):
    if self._saved is None:
      return
    for v, value in self._saved:
      v.assign(value)
    self._saved = None


@keras.saving.register_keras_serializable(package="tf_dpkit", name="LinearDecayTail")
class LinearDecayTail(keras.optimizers.schedules.LearningRateSchedule):
  """Constant learning rate, then a linear decay over the last part of training.

  eta_t = eta_0 * max(floor, min(1, (1 - t / T) / f)),   t = 0, 1, ... (the optimizer's
  ``iterations`` when the step is taken), T = ``total_steps``, f = ``decay_fraction``:
  eta_0 for the first (1 - f) T steps, then falling linearly towards 0 (reached at t = T),
  never below ``floor * eta_0`` (also after T).  Data-independent: it costs no privacy (module
  docstring).

  Args:
    initial_learning_rate: eta_0, a finite number > 0.
    total_steps: T, an integer >= 1 (the run's steps, e.g. ``DPTraining.steps``).
    decay_fraction: f in (0, 1].  Default 0.25.
    floor: in [0, 1].  Default 0.1.

  Raises:
    ValueError: an argument out of range (named in the message).
  """

  def __init__(self, initial_learning_rate, total_steps, decay_fraction=0.25, floor=0.1):
    self.initial_learning_rate = _checks.check_finite_positive("initial_learning_rate",
                                                               initial_learning_rate)
    self.total_steps = _checks.check_integer("total_steps", total_steps, minimum=1)
    self.decay_fraction = _checks.check_probability("decay_fraction", decay_fraction,
                                                    allow_zero=False)
    self.floor = _checks.check_probability("floor", floor)

  def __call__(self, step):
    t = keras.ops.cast(step, "float32")
    remaining = (1.0 - t / float(self.total_steps)) / self.decay_fraction
    factor = keras.ops.maximum(self.floor, keras.ops.minimum(1.0, remaining))
    return self.initial_learning_rate * factor

  def get_config(self):
    return {"initial_learning_rate": self.initial_learning_rate,
            "total_steps": self.total_steps, "decay_fraction": self.decay_fraction,
            "floor": self.floor}
