"""The privacy budget during training: a ledger of what training did, a Keras callback that
reports (and enforces) epsilon, and "train to a budget" noise calibration.

Every number comes from the top-level ``analysis`` package, through one rule: each recorded
phase ``(sampling, q, sigma, steps, microbatch size, ...)`` becomes the event of
``analysis.dp_sgd.dp_sgd_event`` (read its docstring for how Poisson, shuffled and
without-replacement batches and microbatches are accounted), and the events are composed by
the accountant named ``"rdp"`` or ``"pld"`` (``analysis.accountants.make_accountant``).  A
composition with no amplification by sampling is reported exactly (one Gaussian mechanism).

The ledger travels with the model: the Keras DP optimizers hold it in a float64 state variable
(``optimizer.privacy_ledger``), which :class:`PrivacyBudget` keeps up to date after every batch,
so ``.keras`` files, ``save_weights``, ``ModelCheckpoint`` and ``BackupAndRestore`` carry it
whatever the order of the callbacks, and a fresh ``PrivacyBudget`` continues from it.
"""
from __future__ import annotations

import dataclasses
import math
import numbers

import keras
import numpy as np

from analysis import _checks, calibration, dp_sgd
from analysis import accountants as _accountants
from analysis import events as _events

from tf_dpkit import distribute

#: Samplings a :class:`PrivacyBudget` can observe in ``fit``; the accountant also records
#: ``"without_replacement"``.
SAMPLINGS = ("poisson", "shuffle")
_CODES = {"poisson": 1.0, "shuffle": 2.0, "without_replacement": 3.0}


@dataclasses.dataclass
class Phase:
  """A run of identical DP-SGD steps (see :meth:`PrivacyLedger.record` for the fields)."""
  sampling_probability: float
  noise_multiplier: float
  steps: int
  sampling: str = "poisson"
  microbatch_size: int = 1
  steps_per_epoch: int | None = None
  dataset_size: int | None = None
  batch_size: int | None = None

  def event(self, steps: int | None = None) -> _events.DpEvent:
    """The phase's mechanism (``analysis.dp_sgd.dp_sgd_event``), for ``steps`` (default all)."""
    return dp_sgd.dp_sgd_event(
        self.noise_multiplier, self.steps if steps is None else steps, sampling=self.sampling,
        sampling_probability=(self.sampling_probability if self.sampling == "poisson" else None),
        dataset_size=self.dataset_size, batch_size=self.batch_size,
        steps_per_epoch=self.steps_per_epoch, microbatch_size=self.microbatch_size)

  def same_kind(self, other) -> bool:
    return dataclasses.replace(self, steps=0) == dataclasses.replace(other, steps=0)


def _is_real(value):
  return isinstance(value, numbers.Real) and not isinstance(value, bool)


class PrivacyLedger:
  """A ledger of the DP-SGD phases a run trained: records steps and reports (epsilon, delta).

  (It composes the phases with an ``analysis`` accountant named by ``accountant``; it is not
  itself an :class:`analysis.accountant_base.Accountant`.  Formerly ``PrivacyAccountant``, a name
  kept as an alias for one release.)

  Args:
    delta: target delta in (0, 1) for :meth:`epsilon`.
    accountant: ``"rdp"`` (Renyi DP over ``rdp_accountant.DEFAULT_ORDERS``) or ``"pld"``
      (privacy loss distributions, slower; the smaller of the PLD and the RDP bound, see
      ``analysis.pld_accountant.compute_epsilon_with_rdp_cap``).
  """

  def __init__(self, delta: float, accountant: str = "rdp"):
    _checks.check_delta("delta", delta)
    _checks.check_choice("accountant", accountant, _accountants.accountant_names())
    self.delta = float(delta)
    self.accountant = accountant
    self.phases: list[Phase] = []

  @property
  def steps(self) -> int:
    """Total number of recorded steps."""
    return sum(p.steps for p in self.phases)

  def record(self, sampling_probability, noise_multiplier, steps=1, *, sampling="poisson",
             microbatch_size=1, steps_per_epoch=None, dataset_size=None, batch_size=None):
    """Records ``steps`` DP-SGD steps with the given settings (merged into the last phase if equal).

    Args:
      sampling_probability: q in (0, 1], the rate at which each example joins a batch
        (expected batch size / dataset size).
      noise_multiplier: sigma >= 0 (noise std / clip norm).
      steps: integer >= 0.
      sampling: ``"poisson"``, ``"shuffle"`` or ``"without_replacement"``
        (``analysis.dp_sgd``).
      microbatch_size: examples per microbatch (>= 1).
      steps_per_epoch: required for ``"shuffle"``: batches per pass over the data.
      dataset_size: required for ``"without_replacement"`` (N and the fixed batch
        size).
      batch_size: see ``dataset_size`` (described together).

    Raises:
      ValueError: an argument out of range or missing for the sampling (named in the message).
    """
    _checks.check_probability("sampling_probability", sampling_probability, allow_zero=False)
    phase = Phase(float(sampling_probability), noise_multiplier, steps, sampling,
                  microbatch_size, steps_per_epoch, dataset_size, batch_size)
    phase.event()  # building its event is the one place that validates a phase
    phase = dataclasses.replace(
        phase, noise_multiplier=float(noise_multiplier),
        steps=_checks.check_steps("steps", steps),
        microbatch_size=_checks.check_integer("microbatch_size", microbatch_size, minimum=1),
        steps_per_epoch=(None if steps_per_epoch is None else int(steps_per_epoch)),
        dataset_size=None if dataset_size is None else int(dataset_size),
        batch_size=None if batch_size is None else int(batch_size))
    if self.phases and self.phases[-1].same_kind(phase):
      self.phases[-1].steps += phase.steps
    elif phase.steps:
      self.phases.append(phase)

  def epsilon(self, delta: float | None = None, extra: Phase | list | None = None) -> float:
    """Epsilon at ``delta`` (default: the accountant's) for the recorded steps.

    ``extra`` is an optional phase (or list of phases, e.g. the pieces of a noise schedule) of
    future steps to include (a what-if for budget checks).
    """
    delta = self.delta if delta is None else delta
    accountant = _accountants.make_accountant(self.accountant)
    extra = [] if extra is None else [extra] if isinstance(extra, Phase) else list(extra)
    for phase in self.phases + extra:
      accountant.compose(phase.event())
    return float(accountant.get_epsilon(delta))

  @property
  def ledger(self) -> _events.ComposedEvent:
    """The recorded run as one :mod:`analysis.events` event (export it with
    ``analysis.events.to_dp_accounting``)."""
    return _events.ComposedEvent(tuple(phase.event() for phase in self.phases))

  def state_dict(self) -> dict:
    """A JSON-serialisable snapshot (store it beside a checkpoint)."""
    return {"delta": self.delta, "accountant": self.accountant,
            "phases": [dataclasses.asdict(p) for p in self.phases]}

  def load_state_dict(self, state: dict) -> None:
    """Restores a snapshot from :meth:`state_dict` (a resumed run continues from there)."""
    try:
      restored = PrivacyLedger(state["delta"], state["accountant"])
      for p in state["phases"]:
        restored._append_phase(Phase(**p))  # pylint: disable=protected-access
    except (KeyError, TypeError) as error:
      raise ValueError(f"Not a PrivacyLedger state_dict: {error!r}.") from error
    self.delta, self.accountant, self.phases = restored.delta, restored.accountant, restored.phases

  def _append_phase(self, phase: Phase) -> None:
    """Validates ``phase`` like :meth:`record` and appends it (restoring keeps phase order)."""
    self.record(phase.sampling_probability, phase.noise_multiplier, phase.steps,
                sampling=phase.sampling, microbatch_size=phase.microbatch_size,
                steps_per_epoch=phase.steps_per_epoch, dataset_size=phase.dataset_size,
                batch_size=phase.batch_size)

  @classmethod
  def from_state_dict(cls, state: dict) -> "PrivacyLedger":
    accountant = cls(state["delta"], state["accountant"])
    accountant.load_state_dict(state)
    return accountant


#: The former name of :class:`PrivacyLedger`, kept for one release.
PrivacyAccountant = PrivacyLedger


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
      microbatch size): an integer multiple of ``num_microbatches`` (of ``k *
      num_microbatches``, the logical batch's, with ``gradient_accumulation_steps=k``).

  With an optimizer built with ``gradient_accumulation_steps=k`` (virtual batches,
  ``tf_dpkit.optimizers.accumulation``) every number here is about LOGICAL batches:
  ``sampling_probability`` is the logical batch's rate, ``steps_per_epoch`` counts logical
  steps, and a step is recorded when the optimizer releases a logical batch (its
  ``iterations``), never per micro-batch.  Refused: a Poisson pipeline that is not one
  ``poisson_batches(..., gradient_accumulation_steps=k)`` (k independent Poisson micro-batches
  are not one Poisson batch), a pipeline split into another number of chunks, and fixed-size
  batches whose micro-batches per epoch are not a multiple of k (a logical batch would
  straddle two epochs).
    accountant: ``"rdp"``/``"pld"``, or a :class:`PrivacyLedger` to continue (resumed runs).
    verbose: print a line when the budget stops training (on the chief only, under a
      multi-worker strategy).
  """

  #: Marks callbacks that DP models run before all others in ``fit`` (so that the ledger is
  #: current when checkpointing callbacks save, and ``epsilon`` is in the logs they see).
  _dp_runs_first = True

  def __init__(self, sampling_probability, delta=None, target_epsilon=None, *,
               sampling="poisson", steps_per_epoch=None, batch_size=None, accountant="rdp",
               verbose=True):
    super().__init__()
    if target_epsilon is not None:
      _checks.check_positive("target_epsilon", target_epsilon)
    self._given_accountant = isinstance(accountant, PrivacyLedger)
    if self._given_accountant:
      if delta is not None and delta != accountant.delta:
        raise ValueError(f"delta={delta!r} differs from the given accountant's delta="
                         f"{accountant.delta!r}; pass one of them.")
      self.accountant = accountant
    else:
      self.accountant = PrivacyLedger(1e-5 if delta is None else delta, accountant)
    _checks.check_choice("sampling", sampling, SAMPLINGS)
    self.sampling_probability = sampling_probability
    self.target_epsilon = target_epsilon
    self.sampling = sampling
    self.steps_per_epoch = steps_per_epoch
    self.batch_size = batch_size
    self.verbose = verbose
    self.stopped_at_step = None
    self._seen_iterations = 0
    self._epoch_start_iterations = 0
    self._max_steps = None
    self._planned_end = None
    PrivacyLedger(0.5).record(sampling_probability, 1.0, 0, sampling=sampling,
                                  steps_per_epoch=steps_per_epoch)  # validates now

  def _current_phase(self, steps, noise_multiplier=None):
    """The phase of ``steps`` steps with the optimizer's settings (``noise_multiplier``: the
    value to use under a noise schedule)."""
    optimizer = self.model.optimizer
    microbatch_size = 1
    if optimizer.num_microbatches is not None:
      # Microbatches of the logical batch: k micro-batches of num_microbatches each.
      m = optimizer.num_microbatches * _accumulation_steps(optimizer)
      if (self.batch_size is None or not _is_real(self.batch_size) or self.batch_size < m
          or int(self.batch_size) != self.batch_size or self.batch_size % m):
        raise ValueError(
            f"PrivacyBudget needs batch_size= (an integer multiple of the optimizer's "
            f"num_microbatches={m} per logical batch) to know the microbatch size, got "
            f"{self.batch_size!r}.")
      microbatch_size = int(self.batch_size) // m
    sigma = optimizer.noise_multiplier if noise_multiplier is None else noise_multiplier
    return Phase(float(self.sampling_probability), float(sigma), steps, self.sampling,
                 microbatch_size, self.steps_per_epoch)

  def _phases(self, start, stop):
    """The phases of the optimizer steps ``start <= t < stop``: one, or one per piece of the
    optimizer's noise-multiplier schedule (each step accounted with its own sigma)."""
    schedule = getattr(self.model.optimizer, "noise_multiplier_schedule", None)
    if schedule is None:
      return [self._current_phase(stop - start)]
    return [self._current_phase(count, sigma) for sigma, count in schedule.pieces(start, stop)]

  def _check_ledger_capacity(self):
    """Refuses, before training, a noise schedule whose phases would overflow the ledger."""
    schedule = getattr(self.model.optimizer, "noise_multiplier_schedule", None)
    variable = self._ledger_variable()
    if schedule is None or variable is None:
      return
    epochs, steps = (self.params or {}).get("epochs"), (self.params or {}).get("steps")
    if epochs and steps:
      stop = self._seen_iterations + int(epochs) * int(steps)
    else:  # length unknown: through the schedule's last change
      stop = max(self._seen_iterations, schedule.boundaries[-1] if schedule.boundaries else 0) + 1
    trial = PrivacyLedger(self.accountant.delta, self.accountant.accountant)
    trial.phases = [dataclasses.replace(p) for p in self.accountant.phases]
    for phase in self._phases(self._seen_iterations, stop):
      trial.record(phase.sampling_probability, phase.noise_multiplier, phase.steps,
                   sampling=phase.sampling, microbatch_size=phase.microbatch_size,
                   steps_per_epoch=phase.steps_per_epoch)
    rows = int(variable.shape[0])
    if len(trial.phases) > rows:
      raise ValueError(
          f"The noise_multiplier schedule {schedule} would make this run's privacy ledger hold "
          f"{len(trial.phases)} phases (runs of steps with one noise multiplier) by step "
          f"{stop}, but optimizer.privacy_ledger holds at most {rows}. Use a schedule with "
          "fewer changes, or train fewer steps per fit.")

  def _check_batches_can_be_poisson(self):
    """Refuses to account as Poisson-sampled what certainly is not (fixed-size batches)."""
    steps = (self.params or {}).get("steps")
    per_epoch = steps if steps else "<batches per epoch>"
    m = self.model.optimizer.num_microbatches
    size = (f", batch_size=<examples per batch, a multiple of num_microbatches={m}>"
            if m is not None else "")
    fix = ("Either sample with tf_dpkit.data.poisson_batches and build the optimizer with "
           "expected_batch_size=q*N, or account the batches as they are with "
           f"PrivacyBudget(<batch_size / N>, delta, sampling='shuffle', "
           f"steps_per_epoch={per_epoch}{size}).")
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

  def _check_pipeline(self):
    """Refuses numbers that disagree with a tf_dpkit pipeline given to ``fit``."""
    pipeline = getattr(self.model, "_dp_fit_pipeline", None)
    _check_accumulated_batches(self, pipeline)
    if pipeline is None:
      return
    where = (f"fit was given {pipeline.sampling} batches ("
             f"{'poisson_batches' if pipeline.sampling == 'poisson' else 'shuffled_batches'} of "
             f"{pipeline.num_examples} examples)")
    if pipeline.sampling != self.sampling:
      raise ValueError(f"{where}, but PrivacyBudget has sampling={self.sampling!r}: the "
                       f"epsilon would be for another mechanism. Use "
                       f"sampling={pipeline.sampling!r}.")
    if self.sampling == "poisson":
      if not math.isclose(pipeline.sampling_probability, self.sampling_probability,
                          rel_tol=1e-12):
        raise ValueError(f"{where} with sampling probability q = "
                         f"{pipeline.sampling_probability!r}, but PrivacyBudget was given "
                         f"sampling_probability={self.sampling_probability!r}.")
      expected = self.model.optimizer.expected_batch_size
      if expected is not None and not math.isclose(expected, pipeline.batch_size,
                                                   rel_tol=1e-12):
        raise ValueError(f"{where} with expected batch size qN = {pipeline.batch_size!r}, but "
                         f"the optimizer normalises by expected_batch_size={expected!r}.")
    else:
      if self.steps_per_epoch != pipeline.steps_per_epoch:
        raise ValueError(f"{where} with {pipeline.steps_per_epoch} batches per epoch, but "
                         f"PrivacyBudget was given steps_per_epoch={self.steps_per_epoch!r}.")
      if self.batch_size is not None and self.batch_size != pipeline.batch_size:
        raise ValueError(f"{where} with batch size {pipeline.batch_size}, but PrivacyBudget "
                         f"was given batch_size={self.batch_size!r}.")

  # -- the ledger ----------------------------------------------------------------------------

  def _ledger_variable(self):
    return getattr(self.model.optimizer, "privacy_ledger", None)

  def _write_ledger(self):
    variable = self._ledger_variable()
    if variable is not None:
      variable.assign(ledger_array(self.accountant.phases, tuple(variable.shape)))

  def _adopt_saved_ledger(self):
    """Continues from the ledger saved with the optimizer when it records more steps."""
    variable = self._ledger_variable()
    if variable is None:
      return
    saved = phases_from_ledger(variable.numpy())
    if sum(p.steps for p in saved) > self.accountant.steps:
      if self.accountant.phases:
        # Ambiguous: an earlier snapshot of the saved run, or a fresh release (e.g. feature
        # statistics computed again) that replacing it would drop from the accounting.
        raise ValueError(
            f"The ledger passed to PrivacyBudget records {self.accountant.steps} steps and the "
            f"optimizer's saved ledger {sum(p.steps for p in saved)}: continuing from the "
            "saved one would drop what the passed ledger recorded since (e.g. statistics "
            "released again on resuming). Resume with the saved run's ledger "
            "(accountant=PrivacyLedger.from_state_dict(saved state)) and reuse the released "
            "values it accounts for, or record the new release in that ledger.")
      self.accountant.phases = []
      for phase in saved:
        self.accountant._append_phase(phase)  # pylint: disable=protected-access

  def _record_until(self, iterations: int):
    """Records the steps between the last seen optimizer iteration and ``iterations``."""
    if iterations > self._seen_iterations:
      for phase in self._phases(self._seen_iterations, iterations):
        self.accountant.record(phase.sampling_probability, phase.noise_multiplier, phase.steps,
                               sampling=phase.sampling, microbatch_size=phase.microbatch_size,
                               steps_per_epoch=phase.steps_per_epoch)
      self._seen_iterations = iterations
      self._write_ledger()

  def _record_new_steps(self):
    self._record_until(int(self.model.optimizer.iterations.numpy()))

  def _largest_affordable_total(self):
    """Largest total step count whose epsilon stays within the target (doubling + bisection)."""
    def fits(extra_steps):
      extra = self._phases(self._seen_iterations, self._seen_iterations + extra_steps)
      return self.accountant.epsilon(extra=extra) <= self.target_epsilon
    extra = calibration.largest_count_that_fits(fits)
    if extra is None:
      return None  # never exceeded (e.g. infinite noise)
    return self.accountant.steps + max(extra, 0)

  # -- callback hooks ------------------------------------------------------------------------

  def on_train_begin(self, logs=None):
    if not hasattr(self.model.optimizer, "noise_multiplier"):
      raise TypeError("PrivacyBudget needs a model compiled with a tf_dpkit DP optimizer.")
    self._adopt_saved_ledger()
    self._seen_iterations = int(self.model.optimizer.iterations.numpy())
    if self._seen_iterations > self.accountant.steps:
      raise ValueError(
          f"The optimizer has already taken {self._seen_iterations} steps but the privacy "
          f"ledger records {self.accountant.steps}: epsilon would leave out the earlier steps "
          "(trained without a PrivacyBudget, or restored from a checkpoint made before the "
          "ledger existed). Train every step with a PrivacyBudget, or pass the earlier run's "
          "accountant (accountant=PrivacyLedger.from_state_dict(saved)).")
    self._check_pipeline()
    if self.sampling == "poisson":  # before batch_size's check: its advice names batch_size too
      self._check_batches_can_be_poisson()
    self._current_phase(0, 0.0)  # validates batch_size against num_microbatches before training
    self._check_ledger_capacity()
    self._write_ledger()
    self._epoch_start_iterations = self._seen_iterations
    epochs, steps = (self.params or {}).get("epochs"), (self.params or {}).get("steps")
    # The optimizer iteration at which this fit ends by itself (None: unknown length).
    self._planned_end = (self._seen_iterations + int(epochs) * int(steps)
                         if epochs and steps and not _accumulation_steps(self.model.optimizer) > 1
                         else None)
    steps_before = self.accountant.steps
    if self.target_epsilon is not None:
      # The settings are fixed during fit, so the budget becomes a step count, computed once.
      self._max_steps = self._largest_affordable_total()
      if self._max_steps is not None and self._max_steps <= steps_before:
        raise ValueError(
            f"target_epsilon={self.target_epsilon} does not allow even one more step at "
            f"delta={self.accountant.delta} (epsilon so far {self.accountant.epsilon():.4f}); "
            "raise the target or the noise multiplier.")
      # In optimizer iterations (the ledger may hold more steps than the optimizer took).
      self._max_steps -= steps_before - self._seen_iterations

  def on_epoch_begin(self, epoch, logs=None):
    self._epoch_start_iterations = self._seen_iterations

  def on_train_batch_end(self, batch, logs=None):
    # Keras reports the index of the last step of the execution just run, so the step count is
    # known without reading the optimizer's counter from the device every step.
    iterations = self._epoch_start_iterations + int(batch) + 1
    steps_per_execution = int(getattr(self.model, "steps_per_execution", 1) or 1)
    accumulation = getattr(self.model.optimizer, "_dp_accumulation", None)
    if accumulation is not None:
      # Keras's batch index counts micro-batches; the optimizer counts released logical steps.
      iterations = int(self.model.optimizer.iterations.numpy())
      next_steps = accumulation.completed_within(steps_per_execution)
    else:
      next_steps = steps_per_execution
    self._record_until(iterations)  # keeps the saved ledger current for checkpoints
    if self._max_steps is None or self.model.stop_training:
      return
    if self._planned_end is not None and iterations >= self._planned_end:
      return  # the planned end of this fit: nothing to stop
    if iterations + next_steps > self._max_steps:
      self._record_new_steps()
      self.model.stop_training = True
      self.stopped_at_step = iterations  # optimizer steps (the ledger may hold other mechanisms)
      if self.verbose and distribute.is_chief(self.model.distribute_strategy):
        planned = ("more steps" if self._planned_end is None
                   else f"to run to optimizer step {self._planned_end}")
        print(f"\nPrivacyBudget: stopping early, after {iterations} steps (this fit "
              f"planned {planned}): the next "
              f"step would exceed target_epsilon={self.target_epsilon} at "
              f"delta={self.accountant.delta} (epsilon now {self.accountant.epsilon():.4f}).")

  def on_epoch_end(self, epoch, logs=None):
    self._record_new_steps()
    if logs is not None:
      logs["epsilon"] = self.accountant.epsilon()

  def on_train_end(self, logs=None):
    self._record_new_steps()


def _accumulation_steps(optimizer) -> int:
  """k of a DP optimizer built with ``gradient_accumulation_steps`` (1 without)."""
  return int(getattr(optimizer, "accumulation_steps", 1) or 1)


def _check_accumulated_batches(budget, pipeline) -> None:
  """Refuses to account virtual batches that are not logical batches of the stated sampling
  (see :class:`PrivacyBudget`); a no-op for optimizers without accumulation."""
  k = _accumulation_steps(budget.model.optimizer)
  chunks = 1 if pipeline is None else pipeline.accumulation_steps
  if pipeline is not None and chunks != k:
    raise ValueError(
        f"fit was given batches split into {chunks} chunk(s) per logical batch "
        f"(gradient_accumulation_steps={chunks} in the pipeline), but the optimizer accumulates "
        f"gradient_accumulation_steps={k} micro-batches per step: the released sums would not "
        "be those of the pipeline's logical batches. Use the same value in both.")
  if k == 1:
    return
  if budget.sampling == "poisson" and pipeline is None:
    raise ValueError(
        f"PrivacyBudget(sampling='poisson') with gradient_accumulation_steps={k} needs the "
        "dataset returned by tf_dpkit.data.poisson_batches(..., gradient_accumulation_steps="
        f"{k}) passed to fit as it is: only then are the {k} micro-batches of a step one "
        "Poisson batch split into disjoint chunks. Independent Poisson micro-batches can hold "
        "one example twice (sensitivity 2C), which the accounted epsilon does not cover.")
  micro_steps = (budget.params or {}).get("steps")
  if budget.sampling == "shuffle" and pipeline is None and micro_steps:
    if micro_steps % k:
      raise ValueError(
          f"fit runs {micro_steps} micro-batches per epoch, not a multiple of "
          f"gradient_accumulation_steps={k}: a logical batch would straddle two epochs and "
          "could hold an example twice. Choose steps per epoch divisible by k.")
    if budget.steps_per_epoch != micro_steps // k:
      raise ValueError(
          f"fit runs {micro_steps} micro-batches, i.e. {micro_steps // k} logical steps, per "
          f"epoch (gradient_accumulation_steps={k}), but PrivacyBudget was given "
          f"steps_per_epoch={budget.steps_per_epoch!r}; steps_per_epoch counts logical steps.")


def noise_multiplier_for_budget(target_epsilon, delta, dataset_size, batch_size, epochs, *,
                                accountant="rdp", sampling="poisson", microbatch_size=1,
                                steps_per_epoch=None, also=()):
  """Train to a budget: the smallest noise multiplier meeting ``(target_epsilon, delta)``.

  The run is accounted exactly as :class:`PrivacyLedger` will account it (the same
  ``analysis.dp_sgd`` rule, ``analysis.calibration.training_event_of``) and calibrated by
  ``analysis.calibration.calibrate`` (tolerance 1e-4 relative on sigma).
  ``"poisson"``: q = batch_size / dataset_size for ``ceil(epochs * dataset_size / batch_size)``
  steps; ``"shuffle"``: the Gaussian once per epoch started, ``ceil(epochs)`` times;
  ``microbatch_size > 1`` halves the effective noise, so the sigma returned is about doubled.

  Args:
    target_epsilon: > 0; delta: in (0, 1); dataset_size, batch_size: integers with
      ``1 <= batch_size <= dataset_size``; epochs: real >= 0.
    accountant: ``"rdp"`` or ``"pld"``; sampling: ``"poisson"`` or ``"shuffle"``;
    microbatch_size: examples per microbatch, integer >= 1;
    steps_per_epoch: batches per epoch for ``"shuffle"`` (default ``dataset_size //
      batch_size``; only whole epochs count).
    also: ``analysis.events`` events of other mechanisms run on the same records (e.g. the
      private feature statistics of ``tf_dpkit.features``), composed with the training: the
      sigma returned makes the composition meet the target.

  Raises:
    ValueError: an argument out of range, or a target the ``also`` events alone exceed.
  """
  from analysis import calibration  # pylint: disable=g-import-not-at-top
  _checks.check_choice("sampling", sampling, SAMPLINGS)
  event_of, steps = calibration.training_event_of(
      dataset_size, batch_size, epochs, sampling=sampling, microbatch_size=microbatch_size,
      steps_per_epoch=steps_per_epoch)
  return calibration.calibrate(
      event_of, target_epsilon, delta, accountant=accountant, also=also,
      context=f"for {steps} steps of {sampling} batches of {batch_size} from {dataset_size} "
              "examples")


# ------------------------------------------------------------------------------------------
# The ledger as optimizer state.

_FIELDS = ("sampling", "sampling_probability", "noise_multiplier", "steps", "microbatch_size",
           "steps_per_epoch", "dataset_size", "batch_size")


def ledger_array(phases, shape) -> np.ndarray:
  """Encodes phases as the float64 ``shape = (rows, 8)`` table of ``optimizer.privacy_ledger``.

  Row i: (sampling code 1/2/3, q, sigma, steps, microbatch size, steps per epoch or 0, dataset
  size or 0, batch size or 0); unused rows are all 0.  Integers up to 2**53 are exact.

  Raises:
    ValueError: more phases than rows.
  """
  table = np.zeros(shape, np.float64)
  if len(phases) > shape[0]:
    raise ValueError(
        f"The privacy ledger holds at most {shape[0]} phases (runs of steps with different "
        f"settings); this run has {len(phases)}. Record fewer distinct settings.")
  for i, p in enumerate(phases):
    table[i] = (_CODES[p.sampling], p.sampling_probability, p.noise_multiplier, p.steps,
                p.microbatch_size, p.steps_per_epoch or 0, p.dataset_size or 0,
                p.batch_size or 0)
  return table


def phases_from_ledger(table) -> list:
  """Decodes :func:`ledger_array`; raises ValueError for a table that is not a ledger."""
  names = {code: name for name, code in _CODES.items()}
  phases = []
  for row in np.asarray(table, np.float64):
    if not row.any():
      continue
    if row[0] not in names:
      raise ValueError(f"Not a privacy ledger row: {row.tolist()}.")
    phases.append(Phase(float(row[1]), float(row[2]), int(row[3]), names[row[0]], int(row[4]),
                        int(row[5]) or None, int(row[6]) or None, int(row[7]) or None))
  return phases
