"""The one rule that turns a DP-SGD training configuration into its mechanism (an event).

Every epsilon the toolkit reports for DP-SGD (the command line, noise calibration,
``tf_dpkit``'s budget callback and training configuration) is the epsilon of
:func:`dp_sgd_event`'s event, composed by an :mod:`analysis.accountant_base`.  Per-example clipping
at norm ``C`` gives the Gaussian with noise multiplier ``sigma`` (add-or-remove-one); microbatches
of more than one example, or replace-one adjacency, give ``sigma / 2``.  ``"poisson"``,
``"shuffle"`` and ``"without_replacement"`` sampling map to the Poisson-sampled, shuffled and
without-replacement events; a step is one noised release (one logical batch).  The rules and
why they hold: docs/design/dp_sgd.md.  No TensorFlow import.
"""
from __future__ import annotations

from analysis import _checks, events

__all__ = ["SAMPLINGS", "dp_sgd_event", "effective_noise_multiplier"]

#: The batch samplings :func:`dp_sgd_event` knows (docs/design/dp_sgd.md).
SAMPLINGS = ("poisson", "shuffle", "without_replacement")


def effective_noise_multiplier(noise_multiplier: float, *, sampling: str = "poisson",
                               microbatch_size: int = 1) -> float:
  """Noise std over the sensitivity of one step's clipped sum (docs/design/dp_sgd.md).

  ``noise_multiplier`` (sigma, noise std / clipping norm) in [0, inf]; returns sigma, or
  sigma / 2 when ``microbatch_size > 1`` or ``sampling == "without_replacement"``.
  """
  sigma = _checks.check_nonnegative("noise_multiplier", noise_multiplier)
  _checks.check_choice("sampling", sampling, SAMPLINGS)
  microbatch_size = _checks.check_integer("microbatch_size", microbatch_size, minimum=1)
  if microbatch_size > 1 or sampling == "without_replacement":
    return sigma / 2.0
  return sigma


def dp_sgd_event(noise_multiplier: float, steps: int, *, sampling: str = "poisson",
                 sampling_probability: float | None = None, dataset_size: int | None = None,
                 batch_size: int | None = None, steps_per_epoch: int | None = None,
                 microbatch_size: int = 1, examples_per_user: int = 1) -> events.DpEvent:
  """The event of ``steps`` DP-SGD steps with one configuration (docs/design/dp_sgd.md).

  Args:
    noise_multiplier: sigma = noise std / clipping norm, in [0, inf].
    steps: integer in [0, 2**53].
    sampling: ``"poisson"``, ``"shuffle"`` or ``"without_replacement"``.
    sampling_probability: for ``"poisson"``: q in (0, 1].  May be left out when
      ``dataset_size`` and ``batch_size`` (the expected batch size) are given:
      ``q = batch_size / dataset_size``.
    dataset_size: N, integer >= 1.  Required for ``"without_replacement"``.
    batch_size: the (expected, for Poisson) batch size, integer in [1, dataset_size].
      Required for ``"without_replacement"``.
    steps_per_epoch: for ``"shuffle"``: batches per epoch, integer >= 1.  May be left out
      when ``dataset_size`` and ``batch_size`` are given: ``floor(N / b)`` is used (at most the
      true count whether or not the last partial batch is kept, so epochs are never
      undercounted).
    microbatch_size: examples per clipped microbatch, integer >= 1.
    examples_per_user: k, integer >= 1: the event of user-level privacy (neighbours differ in
      all examples of one user, at most k), for ``"shuffle"`` only.  A user's examples change
      the clipped sums of one epoch by at most ``k`` sensitivities in L2 norm in total
      (``sum_b s_b^2 <= (sum_b s_b)^2``), and the epoch is a Gaussian mechanism, so the noise
      multiplier is divided by k (exact).  Under Poisson sampling a user's examples are not
      sampled together and no such event exists; use group privacy
      (:func:`analysis.accountant_base.group_privacy_epsilon`).

  Returns:
    An immutable :mod:`analysis.events` event.

  Raises:
    ValueError: an argument out of range or missing for the sampling (the message names it).
  """
  _checks.check_choice("sampling", sampling, SAMPLINGS)
  steps = _checks.check_steps("steps", steps)
  sigma = effective_noise_multiplier(noise_multiplier, sampling=sampling,
                                     microbatch_size=microbatch_size)
  examples_per_user = _checks.check_integer("examples_per_user", examples_per_user, minimum=1)
  if examples_per_user > 1:
    if sampling != "shuffle":
      raise ValueError(f"examples_per_user={examples_per_user} is supported for "
                       "sampling='shuffle' only; for Poisson sampling use group privacy "
                       "(analysis.accountant_base.group_privacy_epsilon).")
    sigma /= examples_per_user
  if dataset_size is not None:
    dataset_size = _checks.check_integer("dataset_size", dataset_size, minimum=1)
  if batch_size is not None:
    if dataset_size is None:
      batch_size = _checks.check_integer("batch_size", batch_size, minimum=1)
    else:
      batch_size = _checks.check_integer("batch_size", batch_size, minimum=1,
                                         maximum=dataset_size)
  gaussian = events.GaussianEvent(sigma)
  if sampling == "poisson":
    if sampling_probability is None:
      if dataset_size is None or batch_size is None:
        raise ValueError("sampling='poisson' needs sampling_probability (q in (0, 1]) or both "
                         "dataset_size and batch_size (q = batch_size / dataset_size).")
      sampling_probability = batch_size / dataset_size
    q = _checks.check_probability("sampling_probability", sampling_probability,
                                  allow_zero=False)
    if dataset_size is not None and batch_size is not None and q != batch_size / dataset_size:
      raise ValueError(f"sampling_probability={q!r} disagrees with batch_size / dataset_size = "
                       f"{batch_size}/{dataset_size}; give one of them.")
    return events.SelfComposedEvent(events.PoissonSampledEvent(q, gaussian), steps)
  if sampling == "shuffle":
    if steps_per_epoch is None:
      if dataset_size is None or batch_size is None:
        raise ValueError("sampling='shuffle' needs steps_per_epoch (batches per epoch, an "
                         "integer >= 1) or both dataset_size and batch_size.")
      steps_per_epoch = dataset_size // batch_size
    steps_per_epoch = _checks.check_integer("steps_per_epoch", steps_per_epoch, minimum=1)
    return events.ShuffledEvent(gaussian, steps, steps_per_epoch)
  if dataset_size is None or batch_size is None:
    raise ValueError("sampling='without_replacement' needs dataset_size and batch_size (the "
                     "fixed batch size).")
  return events.SelfComposedEvent(
      events.SampledWithoutReplacementEvent(dataset_size, batch_size, gaussian), steps)
