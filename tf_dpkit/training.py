"""One DP-SGD training configuration: optimizer, batch pipeline and budget from the same numbers.

:func:`make_private` returns a :class:`DPTraining` whose optimizer, batches
(``fit_arguments()``) and :class:`tf_dpkit.budget.PrivacyBudget` are built from one event
(:attr:`DPTraining.event`), so the epsilon it states, the noise it calibrates and the epsilon
the callback logs cannot disagree.  Any two of ``noise_multiplier``, ``epochs`` and
``target_epsilon`` determine the third.  Sampling modes, virtual batches and augmentation:
docs/design/training.md; usage: docs/guides/make_private.md.
"""
from __future__ import annotations

import collections.abc
import math
import warnings

import keras

from analysis import _checks, _secrecy, calibration, dp_sgd
from analysis import adaptive_clipping as adaptive_maths
from analysis import accountants as _accountants
from tf_dpkit import augmentation as augmentation_lib
from tf_dpkit import budget as budget_lib
from tf_dpkit.data import poisson as pipelines
from tf_dpkit.data import _structure
from tf_dpkit.optimizers import make_gaussian_optimizer_class
from tf_dpkit.optimizers import accumulation as accumulation_lib
from tf_dpkit.optimizers.adaptive_clipping import AdaptiveClipping

__all__ = ["DPTraining", "make_private"]

_SAMPLINGS = budget_lib.SAMPLINGS
_MAX_EPOCHS = 10**6


@_secrecy.refuse_pickling(
    "the private training data (and its sampling seed and augmentation key)", copies=True,
    instead="Save the model and the run's settings (repr) instead.")
class DPTraining:
  """A DP-SGD configuration; build it with :func:`make_private` (see the module docstring).

  It holds the private training data, so it cannot be pickled (:mod:`analysis._secrecy`).

  Attributes (read-only): ``dataset_size`` N, ``batch_size`` b (expected for Poisson),
  ``sampling_probability`` q = b / N, ``epochs``, ``steps_per_epoch``, ``steps``,
  ``l2_norm_clip`` C, ``noise_multiplier`` sigma, ``num_microbatches``, ``delta``,
  ``target_epsilon`` (None: not enforced), ``sampling``, ``accountant``,
  ``gradient_accumulation_steps`` k (1: none; ``steps`` and ``steps_per_epoch`` count
  logical steps), ``adaptive_clipping`` (None, or the optimizer's
  :class:`tf_dpkit.AdaptiveClipping` with ``count_noise_stddev`` resolved; ``l2_norm_clip`` is
  then the initial clip norm), ``augmentation`` (None, or the
  :class:`tf_dpkit.AugmentationMultiplicity` to pass to ``compile``; the accounting does not
  depend on it).
  """

  def __init__(self, structure, dataset_size, *, batch_size, epochs, l2_norm_clip,
               noise_multiplier, delta, target_epsilon, sampling, num_microbatches,
               accountant, gradient_accumulation_steps=1, adaptive_clipping=None,
               augmentation=None):
    self._data = structure
    self.dataset_size = dataset_size
    self.batch_size = batch_size
    self.epochs = epochs
    self.l2_norm_clip = l2_norm_clip
    self.noise_multiplier = noise_multiplier
    self.delta = delta
    self.target_epsilon = target_epsilon
    self.sampling = sampling
    self.num_microbatches = num_microbatches
    self.accountant = accountant
    self.gradient_accumulation_steps = gradient_accumulation_steps
    self.adaptive_clipping = adaptive_clipping
    self.augmentation = augmentation

  def __repr__(self):
    return (f"DPTraining(N={self.dataset_size}, batch_size={self.batch_size}, "
            f"sampling={self.sampling!r}, epochs={self.epochs}, steps={self.steps}, "
            f"l2_norm_clip={self.l2_norm_clip}, noise_multiplier={self.noise_multiplier:.6g}, "
            f"epsilon={self.epsilon:.4g}, delta={self.delta:g})")

  @property
  def sampling_probability(self) -> float:
    """q = batch_size / dataset_size."""
    return self.batch_size / self.dataset_size

  @property
  def steps_per_epoch(self) -> int:
    """Poisson: ceil(N / b); shuffle: N // b (the remainder of each permutation is dropped)."""
    return _steps_per_epoch(self.sampling, self.dataset_size, self.batch_size)

  @property
  def steps(self) -> int:
    """Training steps of the whole run: epochs * steps_per_epoch."""
    return self.epochs * self.steps_per_epoch

  @property
  def microbatch_size(self) -> int:
    return 1 if self.num_microbatches is None else self.batch_size // self.num_microbatches

  @property
  def event(self):
    """The whole run as an ``analysis.events`` event (``analysis.dp_sgd.dp_sgd_event``)."""
    return _event(self.sampling, self.dataset_size, self.batch_size, self.microbatch_size,
                  self.noise_multiplier, self.steps)

  @property
  def epsilon(self) -> float:
    """Epsilon (nats) of the whole run at :attr:`delta`, by :attr:`accountant`."""
    return _accountants.make_accountant(self.accountant).compose(self.event).get_epsilon(
        self.delta)

  def optimizer(self, base=keras.optimizers.SGD, **kwargs):
    """The DP version of the Keras optimizer class ``base`` with this run's settings.

    ``kwargs`` go to ``base`` (e.g. ``learning_rate``); the DP settings (clip, noise,
    microbatches, Poisson normaliser ``expected_batch_size = qN``) come from here and may not
    be overridden.
    """
    if not (isinstance(base, type) and issubclass(base, keras.optimizers.Optimizer)):
      raise TypeError("DPTraining.optimizer needs a Keras 3 optimizer class (e.g. "
                      f"keras.optimizers.SGD), got {base!r}.")
    clash = sorted(set(kwargs) & {"l2_norm_clip", "noise_multiplier", "num_microbatches",
                                  "expected_batch_size", "gradient_accumulation_steps",
                                  "adaptive_clipping"})
    if clash:
      raise ValueError(f"{clash} are set by the DPTraining configuration; change them there.")
    expected = float(self.batch_size) if self.sampling == "poisson" else None
    if self.gradient_accumulation_steps > 1:
      kwargs["gradient_accumulation_steps"] = self.gradient_accumulation_steps
    if self.adaptive_clipping is not None:
      kwargs["adaptive_clipping"] = self.adaptive_clipping
    optimizer = make_gaussian_optimizer_class(base)(
        self.l2_norm_clip, self.noise_multiplier, self.num_microbatches,
        expected_batch_size=expected, **kwargs)
    optimizer._dp_plan = _Plan(self)  # pylint: disable=protected-access
    return optimizer

  def dataset(self, seed: int | None = None):
    """The batches: ``poisson_batches`` or ``shuffled_batches`` of the data, for all steps.

    ``seed``: None (default: secret, from the OS) or an integer, for tests only (a known seed
    voids amplification by sampling).
    """
    k = self.gradient_accumulation_steps
    if self.sampling == "poisson":
      return pipelines.poisson_batches(self._data, expected_batch_size=self.batch_size,
                                       steps=self.steps, seed=seed,
                                       gradient_accumulation_steps=k)
    return pipelines.shuffled_batches(self._data, self.batch_size, self.epochs, seed=seed,
                                      drop_remainder=True, gradient_accumulation_steps=k)

  def budget(self, *, verbose: bool = True) -> budget_lib.PrivacyBudget:
    """The :class:`tf_dpkit.budget.PrivacyBudget` for this run (enforces ``target_epsilon``)."""
    return budget_lib.PrivacyBudget(
        self.sampling_probability, self.delta, self.target_epsilon, sampling=self.sampling,
        steps_per_epoch=self.steps_per_epoch if self.sampling == "shuffle" else None,
        batch_size=self.batch_size if self.num_microbatches else None,
        accountant=self.accountant, verbose=verbose)

  def fit_arguments(self, *, seed: int | None = None, callbacks=(),
                    verbose: bool = True) -> "FitArguments":
    """``model.fit(**these)``: the batches, epochs, steps per epoch (micro-steps: ``k *
    steps_per_epoch`` with ``gradient_accumulation_steps=k``) and callbacks (the
    :meth:`budget` first, then ``callbacks``).

    The callbacks travel with the batches (see :class:`FitArguments`), so your own may be
    given either here or to ``fit``: ``model.fit(**private.fit_arguments(),
    callbacks=[keras.callbacks.EarlyStopping(monitor="val_loss")], validation_data=...)``.
    A DP model's ``fit`` refuses callbacks that decide from statistics of the private
    training batches (``monitor="loss"``; ``tf_dpkit.dp_models``)."""
    x = self.dataset(seed)
    carried = [self.budget(verbose=verbose), *callbacks]
    # A DP model's fit adds these to the callbacks it is given (tf_dpkit.dp_models).
    x._tf_dpkit_fit_callbacks = carried  # pylint: disable=protected-access
    return FitArguments(
        {"x": x, "epochs": self.epochs, "shuffle": False,
         "steps_per_epoch": self.steps_per_epoch * self.gradient_accumulation_steps},
        carried)


class FitArguments(collections.abc.Mapping):
  """The keyword arguments of ``model.fit(**arguments)`` for one :class:`DPTraining` run.

  ``x``, ``epochs``, ``shuffle`` and ``steps_per_epoch`` are unpacked by ``**``;
  ``arguments["callbacks"]`` (the :class:`tf_dpkit.budget.PrivacyBudget` first, then the
  callbacks given to :meth:`DPTraining.fit_arguments`) can be read but is NOT unpacked: those
  callbacks travel with ``x``, and a DP model's ``fit`` runs them before any it is given with
  ``callbacks=`` (so ``model.fit(**arguments, callbacks=[...])`` is not a duplicate keyword).
  """

  def __init__(self, unpacked: dict, callbacks: list):
    self._unpacked, self._callbacks = dict(unpacked), list(callbacks)

  def __getitem__(self, key):
    return self._callbacks if key == "callbacks" else self._unpacked[key]

  def __iter__(self):
    return iter(self._unpacked)

  def __len__(self):
    return len(self._unpacked)

  def __repr__(self):
    return f"FitArguments({self._unpacked!r}, callbacks={self._callbacks!r})"


class _Plan:
  """What an optimizer made by :meth:`DPTraining.optimizer` was configured for.

  A DP model's ``fit`` calls :meth:`check_fit` before training: the configuration's epsilon
  holds only for its own batches, accounted by a :class:`tf_dpkit.budget.PrivacyBudget`, so a
  ``fit`` given anything else (in-memory arrays, which Keras cuts into shuffled fixed-size
  batches; another pipeline; no budget, so no epsilon is reported) is refused.
  """

  def __init__(self, training: DPTraining):
    self.sampling = training.sampling
    self.sampling_probability = training.sampling_probability
    self.description = repr(training)
    # The labels of (x, y) data, for the DP model's class-id check (not kept otherwise).
    data = training._data  # pylint: disable=protected-access
    self.labels = data[1] if isinstance(data, tuple) and len(data) == 2 else None

  def check_fit(self, pipeline, callbacks) -> None:
    """Raises ValueError unless ``fit`` gets this plan's pipeline and a PrivacyBudget."""
    fix = ("Train with model.fit(**private.fit_arguments()) (add your own callbacks with "
           "fit(**private.fit_arguments(), callbacks=[...])), or, for another run, build it "
           "with make_private(...) again.")
    if pipeline is None:
      raise ValueError(
          f"fit: this optimizer comes from {self.description}, whose epsilon holds for its "
          f"{self.sampling} batches only, but fit was given something else (e.g. in-memory "
          "arrays, which Keras cuts into shuffled fixed-size batches) and would train a "
          f"mechanism no epsilon was stated for. {fix}")
    if (pipeline.sampling != self.sampling
        or (self.sampling == "poisson"
            and not math.isclose(pipeline.sampling_probability, self.sampling_probability,
                                 rel_tol=1e-12))):
      raise ValueError(
          f"fit: this optimizer comes from {self.description}, but fit was given "
          f"{pipeline.sampling} batches of {pipeline.num_examples} examples at another rate: the "
          f"stated epsilon would be for another mechanism. {fix}")
    callbacks = callbacks.callbacks if isinstance(callbacks, keras.callbacks.CallbackList) else (
        callbacks or [])
    if not any(isinstance(c, budget_lib.PrivacyBudget) for c in callbacks):
      raise ValueError(
          f"fit: this optimizer comes from {self.description}, but fit has no "
          "tf_dpkit.budget.PrivacyBudget callback, so nothing would account or report the "
          f"epsilon of what runs. {fix}")


def _steps_per_epoch(sampling, n, b):
  return -(-n // b) if sampling == "poisson" else n // b


def _event(sampling, n, b, microbatch_size, sigma, steps):
  return dp_sgd.dp_sgd_event(
      sigma, steps, sampling=sampling, dataset_size=n, batch_size=b,
      steps_per_epoch=_steps_per_epoch(sampling, n, b) if sampling == "shuffle" else None,
      microbatch_size=microbatch_size)


def make_private(data, *, batch_size: int, l2_norm_clip: float, delta: float,
                 epochs: int | None = None, noise_multiplier: float | None = None,
                 target_epsilon: float | None = None, sampling: str = "poisson",
                 num_microbatches: int | None = None, accountant: str = "rdp",
                 gradient_accumulation_steps: int | None = None,
                 adaptive_clipping=None, augmentation=None,
                 num_classes: int | None = None) -> DPTraining:
  """Builds the :class:`DPTraining` of a run (see the module docstring).

  Args:
    data: the training data: a tuple ``(x, y)`` or dict of arrays, or a finite
      ``tf.data.Dataset`` of single examples (read into memory once), as for
      ``tf_dpkit.data.poisson_batches``.
    batch_size: b, an integer in [1, N]: the expected batch size (Poisson) or the batch size.
    l2_norm_clip: C > 0, finite.
    delta: in (0, 1); a ``UserWarning`` when it is not below 1/N (a mechanism that publishes
      one random example outright is (0, 1/N)-DP).
    epochs: whole epochs, an integer in [1, 1e6].
    noise_multiplier: sigma >= 0.
    target_epsilon: > 0; enforced during training by the callback.
      Give two of ``epochs``, ``noise_multiplier``, ``target_epsilon`` (or all three, when
      they agree): the missing one is the smallest noise (to a 1e-4 relative tolerance) or
      the most epochs that meet the budget.
    sampling: ``"poisson"`` or ``"shuffle"``.
    num_microbatches: microbatches per batch (``"shuffle"`` only), dividing ``batch_size``.
    accountant: ``"rdp"`` or ``"pld"``.
    gradient_accumulation_steps: None or 1 (off), or k >= 2: each logical batch of (expected)
      size ``batch_size`` is trained as k physical chunks, noised and applied once (module
      docstring).  Not with ``num_microbatches``; with ``"shuffle"`` needs ``batch_size >= k``.
    adaptive_clipping: None, True or a :class:`tf_dpkit.AdaptiveClipping` (or its config
      dict): the clip norm starts at ``l2_norm_clip`` and tracks a quantile of the gradient
      norms (``tf_dpkit.optimizers.adaptive_clipping``).  The noise multiplier is split between
      the clipped sum and the unclipped count so that the epsilon is the one stated here for
      ``noise_multiplier``; ``count_noise_stddev`` defaults to the (expected) examples, or
      microbatches, per step / 20.  Not with ``gradient_accumulation_steps``.
    augmentation: None, or a :class:`tf_dpkit.AugmentationMultiplicity` (K augmented copies
      per example, their mean gradient clipped once per example), kept as
      :attr:`DPTraining.augmentation` for ``model.compile(..., augmentation=...)``.  The
      privacy unit stays the example: q = batch_size / N, sensitivity C, noise and epsilon
      unchanged.  With K > 1 not with ``num_microbatches``.
    num_classes: None, or the number of classes ``K >= 1`` of a classifier (its output
      size) when ``data`` is ``(x, y)`` with integer class ids ``y``: every label must lie in
      ``[0, K)``, checked here (a ``ValueError`` naming the range and the first bad example)
      rather than as an error deep inside the first training step.  Float arrays in ``data``
      must be finite whatever ``num_classes`` is (``tf_dpkit.data.check_finite_features``).

  Raises:
    ValueError / TypeError: an argument out of range (named in the message), a missing one,
      or a budget that the given numbers cannot meet.
  """
  _checks.check_choice("sampling", sampling, _SAMPLINGS)
  _checks.check_choice("accountant", accountant, _accountants.ACCOUNTANTS)
  structure, n = _structure.as_structure(data)
  if num_classes is not None:
    if not isinstance(structure, tuple) or len(structure) < 2:
      raise ValueError("num_classes checks the labels y of data=(x, y); data is not a tuple "
                       "(x, y, ...), so leave num_classes=None.")
    pipelines.check_class_labels(structure[1], num_classes, name="data[1] (the labels y)")
  b = _checks.check_integer("batch_size", batch_size, minimum=1, maximum=n)
  clip = _checks.check_finite_positive("l2_norm_clip", l2_norm_clip)
  delta = _checks.check_delta("delta", delta)
  warning = _checks.delta_warning(delta, n)
  if warning:
    warnings.warn(warning, UserWarning, stacklevel=2)
  if num_microbatches is not None:
    if sampling != "shuffle":
      raise ValueError("num_microbatches needs sampling='shuffle': Poisson batches have "
                       "variable size, which cannot be cut into a fixed number of "
                       "microbatches.")
    num_microbatches = _checks.check_integer("num_microbatches", num_microbatches, minimum=1,
                                             maximum=b)
    if b % num_microbatches:
      raise ValueError(f"num_microbatches must divide batch_size={b}, got {num_microbatches}.")
  augmentation = augmentation_lib.check_augmentation(augmentation, num_microbatches)
  k = accumulation_lib.check_accumulation_steps(gradient_accumulation_steps)
  if k > 1 and num_microbatches is not None:
    raise ValueError(f"gradient_accumulation_steps={k} with num_microbatches is not supported "
                     "by make_private; leave num_microbatches=None (per-example clipping).")
  if k > 1 and sampling == "shuffle" and b < k:
    raise ValueError(f"gradient_accumulation_steps={k} splits each batch of batch_size={b} "
                     f"into {k} non-empty chunks: needs batch_size >= {k}.")
  if sampling == "shuffle" and n // b < 1:
    raise ValueError(f"batch_size={b} leaves no full batch of N={n} examples.")
  given = [name for name, value in (("epochs", epochs), ("noise_multiplier", noise_multiplier),
                                    ("target_epsilon", target_epsilon)) if value is not None]
  if len(given) < 2:
    raise ValueError("Give two of epochs, noise_multiplier and target_epsilon (the third is "
                     f"derived), got only {given or 'none'}.")
  if epochs is not None:
    epochs = _checks.check_integer("epochs", epochs, minimum=1, maximum=_MAX_EPOCHS)
  if noise_multiplier is not None:
    noise_multiplier = _checks.check_nonnegative("noise_multiplier", noise_multiplier)
  if target_epsilon is not None:
    target_epsilon = _checks.check_positive("target_epsilon", target_epsilon)
  microbatch_size = 1 if num_microbatches is None else b // num_microbatches
  per_epoch = _steps_per_epoch(sampling, n, b)

  def epsilon_of(sigma, whole_epochs):
    event = _event(sampling, n, b, microbatch_size, sigma, whole_epochs * per_epoch)
    return _accountants.make_accountant(accountant).compose(event).get_epsilon(delta)

  if noise_multiplier is None:
    noise_multiplier = calibration.calibrate(
        lambda sigma: _event(sampling, n, b, microbatch_size, sigma, epochs * per_epoch),
        target_epsilon, delta, accountant=accountant)
  elif epochs is None:
    epochs = calibration.calibrate(
        lambda e: _event(sampling, n, b, microbatch_size, noise_multiplier, e * per_epoch),
        target_epsilon, delta, accountant=accountant, integer=True, lower=1,
        upper=_MAX_EPOCHS, name="epochs")
    if epochs == 0:
      raise ValueError(f"noise_multiplier={noise_multiplier} does not allow even one epoch "
                       f"within target_epsilon={target_epsilon} at delta={delta:g}; raise one "
                       "of them.")
  elif target_epsilon is not None:
    spent = epsilon_of(noise_multiplier, epochs)
    if spent > target_epsilon:
      raise ValueError(f"noise_multiplier={noise_multiplier} for {epochs} epochs spends "
                       f"epsilon={spent:.4g} > target_epsilon={target_epsilon} at "
                       f"delta={delta:g}; leave one of the three out to derive it.")
  return DPTraining(structure, n, batch_size=b, epochs=epochs, l2_norm_clip=clip,
                    noise_multiplier=noise_multiplier, delta=delta,
                    target_epsilon=target_epsilon, sampling=sampling,
                    num_microbatches=num_microbatches, accountant=accountant,
                    gradient_accumulation_steps=k, augmentation=augmentation,
                    adaptive_clipping=_resolved_adaptive_clipping(
                        adaptive_clipping, noise_multiplier, k,
                        b if num_microbatches is None else num_microbatches))


def _resolved_adaptive_clipping(adaptive_clipping, noise_multiplier, accumulation_steps,
                                per_step):
  """``adaptive_clipping`` as an ``AdaptiveClipping`` with ``count_noise_stddev`` set (default
  ``per_step / 20``, per_step the (expected) examples or microbatches of a step) and its noise
  split checked for ``noise_multiplier`` (``analysis.adaptive_clipping``); None stays None."""
  settings = AdaptiveClipping.coerce(adaptive_clipping)
  if settings is None:
    return None
  if accumulation_steps > 1:
    raise ValueError("adaptive_clipping is not supported with gradient_accumulation_steps > 1 "
                     "(the unclipped count is not accumulated); use one of them.")
  if settings.count_noise_stddev is None:
    settings = AdaptiveClipping(settings.target_quantile, settings.learning_rate,
                                adaptive_maths.default_count_noise_stddev(per_step))
  adaptive_maths.sum_noise_multiplier(noise_multiplier, settings.count_noise_stddev)
  return settings
