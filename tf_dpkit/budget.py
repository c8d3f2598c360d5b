"""The privacy budget during training: an accountant that records what training did, a Keras
callback that reports (and enforces) epsilon, and "train to a budget" noise calibration.

The accountant delegates every number to the top-level ``analysis`` package; it only keeps the
record of phases ``(sampling probability q, noise multiplier sigma, steps, sampling,
microbatch size)``.  How each phase is accounted:

* ``sampling="poisson"`` (``tf_dpkit.data.poisson_batches``): the Poisson-subsampled Gaussian
  mechanism with rate q, composed ``steps`` times (RDP or PLD).
* ``sampling="shuffle"`` (shuffle-and-batch, each example once per epoch): no amplification by
  sampling is claimed.  An example sits in exactly one batch per epoch, so the phase is
  accounted as the plain Gaussian mechanism (q = 1) composed once per epoch started,
  ``ceil(steps / steps_per_epoch)`` times.  When every phase is of this kind the composition is
  exactly one Gaussian mechanism, and its exact epsilon is reported (``analysis.gaussian``, the
  analytic Gaussian mechanism); mixed with Poisson phases, RDP or PLD composes them.
* microbatches of more than one example: under add-or-remove adjacency a microbatch mean
  changes by up to the clip when one example joins, and the clipped-sum analysis needs twice
  the clip as sensitivity, so the phase is accounted with noise multiplier ``sigma / 2``.
"""
from __future__ import annotations

import dataclasses
import math
import numbers
import warnings

import keras

from analysis import _checks, gaussian, rdp_accountant

SAMPLINGS = ("poisson", "shuffle")
ACCOUNTANTS = ("rdp", "pld")


@dataclasses.dataclass
class Phase:
  """A run of identical DP-SGD steps."""
  sampling_probability: float
  noise_multiplier: float
  steps: int
  sampling: str = "poisson"
  microbatch_size: int = 1
  steps_per_epoch: int | None = None

  def mechanism(self):
    """Returns ``(q, sigma, compositions)`` of the mechanism this phase is accounted as."""
    sigma = self.noise_multiplier / 2 if self.microbatch_size > 1 else self.noise_multiplier
    if self.sampling == "shuffle":
      return 1.0, sigma, math.ceil(self.steps / self.steps_per_epoch)
    return self.sampling_probability, sigma, self.steps

  def same_kind(self, other) -> bool:
    return (self.sampling_probability, self.noise_multiplier, self.sampling,
            self.microbatch_size, self.steps_per_epoch) == (
                other.sampling_probability, other.noise_multiplier, other.sampling,
                other.microbatch_size, other.steps_per_epoch)


def _is_real(value):
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


class PrivacyAccountant:
  """Records DP-SGD steps and reports (epsilon, delta).

  Args:
    delta: target delta in (0, 1) for :meth:`epsilon`.
    accountant: ``"rdp"`` (Renyi DP over ``rdp_accountant.DEFAULT_ORDERS``) or ``"pld"``
      (privacy loss distributions, slower; the smaller of the PLD and the RDP bound, see
      ``analysis.pld_accountant.compute_epsilon_with_rdp_cap``).
  """

  def __init__(self, delta: float, accountant: str = "rdp"):
    _checks.check_delta("delta", delta)
    _checks.check_choice("accountant", accountant, ACCOUNTANTS)
    self.delta = float(delta)
    self.accountant = accountant
    self.phases: list[Phase] = []

  @property
  def steps(self) -> int:
    """Total number of recorded steps."""
    return sum(p.steps for p in self.phases)

  def record(self, sampling_probability, noise_multiplier, steps=1, *, sampling="poisson",
             microbatch_size=1, steps_per_epoch=None):
    """Records ``steps`` DP-SGD steps with the given settings (merged into the last phase if equal).

    Args:
      sampling_probability: q in (0, 1], the rate at which each example joins a batch
        (expected batch size / dataset size).
      noise_multiplier: sigma >= 0 (noise std / clip norm).
      steps: integer >= 0.
      sampling: ``"poisson"`` or ``"shuffle"`` (see the module docstring).
      microbatch_size: examples per microbatch (>= 1).
      steps_per_epoch: required for ``"shuffle"``: batches per pass over the data.
    """
    _checks.check_probability("sampling_probability", sampling_probability, allow_zero=False)
    _checks.check_nonnegative("noise_multiplier", noise_multiplier)
    steps = _checks.check_count("steps", steps, minimum=0)
    _checks.check_choice("sampling", sampling, SAMPLINGS)
    microbatch_size = _checks.check_count("microbatch_size", microbatch_size, minimum=1)
    if sampling == "shuffle" and steps_per_epoch is None:
      raise ValueError("sampling='shuffle' needs steps_per_epoch (an integer >= 1).")
    if steps_per_epoch is not None:
      steps_per_epoch = _checks.check_count("steps_per_epoch", steps_per_epoch, minimum=1)
    phase = Phase(float(sampling_probability), float(noise_multiplier), steps, sampling,
                  microbatch_size, steps_per_epoch)
    if self.phases and self.phases[-1].same_kind(phase):
      self.phases[-1].steps += phase.steps
    elif phase.steps:
      self.phases.append(phase)

  def epsilon(self, delta: float | None = None, extra: Phase | None = None) -> float:
    """Epsilon at ``delta`` (default: the accountant's) for the recorded steps.

    ``extra`` is an optional phase of future steps to include (a what-if for budget checks).
    """
    delta = self.delta if delta is None else delta
    phases = self.phases + ([extra] if extra is not None else [])
    mechanisms = [p.mechanism() for p in phases if p.steps]
    if not mechanisms:
      return 0.0
    qs, sigmas, counts = (list(column) for column in zip(*mechanisms))
    if all(q == 1.0 for q in qs):
      # No amplification anywhere: exactly one Gaussian mechanism (analysis.gaussian).
      if any(sigma == 0.0 for sigma, count in zip(sigmas, counts) if count):
        return math.inf
      return gaussian.composed_epsilon(sigmas, counts, delta)
    if self.accountant == "pld":
      from analysis import pld_accountant  # pylint: disable=g-import-not-at-top
      return pld_accountant.compute_epsilon_with_rdp_cap(qs, sigmas, counts, delta).epsilon
    orders = rdp_accountant.DEFAULT_ORDERS
    rdp = rdp_accountant.compute_heterogeneous_rdp(qs, sigmas, counts, orders)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      eps, _, _ = rdp_accountant.get_privacy_spent(orders, rdp, target_delta=delta)
    return float(eps)

  def state_dict(self) -> dict:
    """A JSON-serialisable snapshot (store it beside a checkpoint)."""
    return {"delta": self.delta, "accountant": self.accountant,
            "phases": [dataclasses.asdict(p) for p in self.phases]}

  def load_state_dict(self, state: dict) -> None:
    """Restores a snapshot from :meth:`state_dict` (a resumed run continues from there)."""
    try:
      restored = PrivacyAccountant(state["delta"], state["accountant"])
      for p in state["phases"]:
        restored._append_phase(Phase(**p))  # pylint: disable=protected-access
    except (KeyError, TypeError) as error:
      raise ValueError(f"Not a PrivacyAccountant state_dict: {error!r}.") from error
    self.delta, self.accountant, self.phases = restored.delta, restored.accountant, restored.phases

  def _append_phase(self, phase: Phase) -> None:
    """Validates ``phase`` like :meth:`record` and appends it (restoring keeps phase order)."""
    self.record(phase.sampling_probability, phase.noise_multiplier, phase.steps,
                sampling=phase.sampling, microbatch_size=phase.microbatch_size,
                steps_per_epoch=phase.steps_per_epoch)

  @classmethod
  def from_state_dict(cls, state: dict) -> "PrivacyAccountant":
    accountant = cls(state["delta"], state["accountant"])
    accountant.load_state_dict(state)
    return accountant


class PrivacyBudget(keras.callbacks.Callback):
  """Keras callback: logs ``epsilon`` each epoch and stops before a step would exceed a target.

  Steps are counted from the optimizer's ``iterations`` (so ``steps_per_execution`` is handled);
  the noise multiplier and ``num_microbatches`` come from the DP optimizer; the sampling
  probability is given here because it is a property of the input pipeline.

  Args:
    sampling_probability: q = expected batch size / dataset size, in (0, 1].
    delta: delta in (0, 1) at which epsilon is reported; default 1e-5, or the delta of a given
      ``accountant`` (a different explicit value is refused, never silently ignored).
    target_epsilon: optional budget > 0; training stops before the step that would exceed it.
    sampling: ``"poisson"`` or ``"shuffle"`` (then ``steps_per_epoch`` is required).  With
      ``"poisson"``, training is refused when the batches certainly are not Poisson samples:
      ``fit`` on in-memory arrays (Keras cuts fixed-size shuffled batches) or an optimizer
      without ``expected_batch_size`` (it normalises by the realised batch size).  A
      ``tf.data.Dataset`` is taken to be what ``sampling`` says; make it with
      ``tf_dpkit.data.poisson_batches``.
    steps_per_epoch: batches per epoch, for ``"shuffle"``.
    batch_size: needed only when the optimizer has ``num_microbatches`` (to know the
      microbatch size): an integer multiple of ``num_microbatches``.
    accountant: ``"rdp"``/``"pld"``, or a :class:`PrivacyAccountant` to continue (resumed runs).
    verbose: print a line when the budget stops training.
  """

  def __init__(self, sampling_probability, delta=None, target_epsilon=None, *,
               sampling="poisson", steps_per_epoch=None, batch_size=None, accountant="rdp",
               verbose=True):
    super().__init__()
    if target_epsilon is not None:
      _checks.check_positive("target_epsilon", target_epsilon)
    if isinstance(accountant, PrivacyAccountant):
      if delta is not None and delta != accountant.delta:
        raise ValueError(f"delta={delta!r} differs from the given accountant's delta="
                         f"{accountant.delta!r}; pass one of them.")
      self.accountant = accountant
    else:
      self.accountant = PrivacyAccountant(1e-5 if delta is None else delta, accountant)
    self.sampling_probability = sampling_probability
    self.target_epsilon = target_epsilon
    self.sampling = sampling
    self.steps_per_epoch = steps_per_epoch
    self.batch_size = batch_size
    self.verbose = verbose
    self.stopped_at_step = None
    self._seen_iterations = 0
    self._epoch_start_steps = 0
    self._max_steps = None
    PrivacyAccountant(0.5).record(sampling_probability, 1.0, 0, sampling=sampling,
                                  steps_per_epoch=steps_per_epoch)  # validates now

  def _current_phase(self, steps):
    optimizer = self.model.optimizer
    microbatch_size = 1
    if optimizer.num_microbatches is not None:
      m = optimizer.num_microbatches
      if (self.batch_size is None or not _is_real(self.batch_size) or self.batch_size < m
          or int(self.batch_size) != self.batch_size or self.batch_size % m):
        raise ValueError(
            f"PrivacyBudget needs batch_size= (an integer multiple of the optimizer's "
            f"num_microbatches={m}) to know the microbatch size, got {self.batch_size!r}.")
      microbatch_size = int(self.batch_size) // m
    return Phase(float(self.sampling_probability), float(optimizer.noise_multiplier), steps,
                 self.sampling, microbatch_size, self.steps_per_epoch)

  def _check_batches_can_be_poisson(self):
    """Refuses to account as Poisson-sampled what certainly is not (fixed-size batches)."""
    fix = ("Either sample with tf_dpkit.data.poisson_batches and build the optimizer with "
           "expected_batch_size=q*N, or account the batches as they are with "
           "PrivacyBudget(..., sampling='shuffle', steps_per_epoch=<batches per epoch>).")
    if getattr(self.model, "_dp_keras_batches_arrays", False):
      raise ValueError(
          "PrivacyBudget(sampling='poisson') cannot account this fit: it was given in-memory "
          "arrays, which Keras cuts into shuffled fixed-size batches, not Poisson samples, so "
          f"the subsampled epsilon would not hold. {fix}")
    if self.model.optimizer.expected_batch_size is None:
      raise ValueError(
          "PrivacyBudget(sampling='poisson') needs an optimizer built with "
          "expected_batch_size=q*N: this one divides by the realised batch size, which is how "
          f"fixed-size batches are trained, not the Poisson-sampled mechanism. {fix}")

  def _record_new_steps(self):
    now = int(self.model.optimizer.iterations.numpy())
    if now > self._seen_iterations:
      phase = self._current_phase(now - self._seen_iterations)
      self.accountant.record(phase.sampling_probability, phase.noise_multiplier, phase.steps,
                             sampling=phase.sampling, microbatch_size=phase.microbatch_size,
                             steps_per_epoch=phase.steps_per_epoch)
    self._seen_iterations = now

  def _largest_affordable_total(self):
    """Largest total step count whose epsilon stays within the target (doubling + bisection)."""
    def fits(extra_steps):
      extra = self._current_phase(extra_steps)
      return self.accountant.epsilon(extra=extra) <= self.target_epsilon
    if not fits(0):
      return self.accountant.steps
    low, high = 0, 1
    while fits(high):
      low, high = high, high * 2
      if high > 2**40:
        return None  # never exceeded (e.g. infinite noise)
    while high - low > 1:
      mid = (low + high) // 2
      low, high = (mid, high) if fits(mid) else (low, mid)
    return self.accountant.steps + low

  def on_train_begin(self, logs=None):
    if not hasattr(self.model.optimizer, "noise_multiplier"):
      raise TypeError("PrivacyBudget needs a model compiled with a tf_dpkit DP optimizer.")
    self._seen_iterations = int(self.model.optimizer.iterations.numpy())
    if self._seen_iterations > self.accountant.steps:
      raise ValueError(
          f"The optimizer has already taken {self._seen_iterations} steps but the accountant "
          f"recorded {self.accountant.steps}: epsilon would leave out the earlier steps. Pass "
          "the earlier run's accountant (accountant=PrivacyAccountant.from_state_dict(saved)) "
          "or the same PrivacyBudget to every fit() call.")
    self._current_phase(0)  # validates batch_size against num_microbatches before training
    if self.sampling == "poisson":
      self._check_batches_can_be_poisson()
    self._epoch_start_steps = self.accountant.steps
    if self.target_epsilon is not None:
      # The settings are fixed during fit, so the budget becomes a step count, computed once.
      self._max_steps = self._largest_affordable_total()
      if self._max_steps is not None and self._max_steps <= self.accountant.steps:
        raise ValueError(
            f"target_epsilon={self.target_epsilon} does not allow even one more step at "
            f"delta={self.accountant.delta} (epsilon so far {self.accountant.epsilon():.4f}); "
            "raise the target or the noise multiplier.")

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch_start_steps = self.accountant.steps

  def on_train_batch_end(self, batch, logs=None):
    if self._max_steps is None or self.model.stop_training:
      return  # nothing to enforce: no per-step work (and no device sync) at all
    # Keras reports the index of the last step of the execution just run, so the step count is
    # known without reading the optimizer's counter from the device every step.
    steps_now = self._epoch_start_steps + int(batch) + 1
    steps_per_execution = int(getattr(self.model, "steps_per_execution", 1) or 1)
    if steps_now + steps_per_execution > self._max_steps:
      self._record_new_steps()
      self.model.stop_training = True
      self.stopped_at_step = self.accountant.steps
      if self.verbose:
        print(f"\nPrivacyBudget: stopping after {self.accountant.steps} steps: the next step "
              f"would exceed target_epsilon={self.target_epsilon} at delta={self.accountant.delta} "
              f"(epsilon now {self.accountant.epsilon():.4f}).")

  def on_epoch_end(self, epoch, logs=None):
    self._record_new_steps()
    if logs is not None:
      logs["epsilon"] = self.accountant.epsilon()


def noise_multiplier_for_budget(target_epsilon, delta, dataset_size, batch_size, epochs, *,
                                accountant="rdp", sampling="poisson", microbatch_size=1):
  """Train to a budget: the smallest noise multiplier meeting ``(target_epsilon, delta)``.

  Accounted exactly as :class:`PrivacyAccountant` will account the run:

  * ``sampling="poisson"``: q = batch_size / dataset_size for ``ceil(epochs * dataset_size /
    batch_size)`` steps (``analysis.calibration.compute_noise_multiplier_for_training``);
  * ``sampling="shuffle"``: the plain Gaussian mechanism (q = 1) once per epoch started,
    ``ceil(epochs)`` times, calibrated exactly (``analysis.gaussian``) whatever ``accountant``;
  * ``microbatch_size > 1`` doubles the returned sigma (the accountant uses ``sigma / 2``).

  Args:
    target_epsilon: > 0; delta: in (0, 1); dataset_size, batch_size: integers with
      ``1 <= batch_size <= dataset_size``; epochs: real >= 0.
    accountant: ``"rdp"`` or ``"pld"``; sampling: ``"poisson"`` or ``"shuffle"``;
    microbatch_size: examples per microbatch, integer >= 1.
  """
  from analysis import calibration  # pylint: disable=g-import-not-at-top
  _checks.check_choice("sampling", sampling, SAMPLINGS)
  microbatch_size = _checks.check_count("microbatch_size", microbatch_size, minimum=1)
  if sampling == "poisson":
    sigma = calibration.compute_noise_multiplier_for_training(
        target_epsilon, delta, dataset_size, batch_size, epochs, accountant=accountant)
  else:
    steps = calibration.steps_for_training(dataset_size, batch_size, epochs)  # validates
    _checks.check_choice("accountant", accountant, ACCOUNTANTS)
    passes = math.ceil(epochs) if steps else 0
    target_epsilon = _checks.check_positive("target_epsilon", target_epsilon)
    sigma = (0.0 if passes == 0 or math.isinf(target_epsilon) else
             gaussian.noise_multiplier_for_epsilon(target_epsilon, delta, passes))
  return 2 * sigma if microbatch_size > 1 else sigma
