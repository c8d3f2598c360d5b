"""Starting settings for Confident GNMax from the number of teachers, queries and a budget."""
from __future__ import annotations

import dataclasses
import math

from analysis import _checks, calibration, events
from analysis.pate._accountant import PateAccountant
from analysis.pate._common import _SQRT2

# PATE 2018's MNIST setting for 250 teachers: T = 200, sigma1 = 150, sigma2 = 40.
THRESHOLD_FRACTION = 0.8  # T / num_teachers (200 / 250)
SIGMA1_PER_SIGMA2 = 3.75  # sigma1 / sigma2 (150 / 40)
PAPER_NOISE_PER_TEACHER = 0.16  # sigma2 / num_teachers (40 / 250)


@dataclasses.dataclass(frozen=True)
class ConfidentGNMaxSettings:
  """Suggested Confident GNMax settings (:func:`suggest_confident_gnmax`); all publishable.

  Attributes:
    threshold: T, in votes.
    sigma1: noise standard deviation of the threshold check, in votes.
    sigma2: noise standard deviation of the GNMax answer, in votes.
    epsilon: the data-independent epsilon (nats) of ``num_queries`` checks and
      ``num_queries`` answers at ``delta``, by :meth:`PateAccountant.data_independent_epsilon`.
    delta: the delta it holds at.
    num_teachers: the ensemble size the settings are for.
    num_queries: the number of queries they are for.
  """
  threshold: float
  sigma1: float
  sigma2: float
  epsilon: float
  delta: float
  num_teachers: int
  num_queries: int

  @property
  def noise_per_teacher(self) -> float:
    """sigma2 / num_teachers: 0.16 in PATE 2018's MNIST setting; much larger means noisy labels
    (more teachers, fewer queries or a larger epsilon help)."""
    return self.sigma2 / self.num_teachers


def _queries_event(sigma2: float, num_queries: int) -> events.DpEvent:
  """``num_queries`` answered Confident GNMax queries, data-independently: the check is the
  Gaussian mechanism with sensitivity 1 (multiplier sigma1), GNMax the one with L2 sensitivity
  sqrt(2) (multiplier sigma2 / sqrt(2)), as :class:`PateAccountant` records them."""
  one = events.ComposedEvent((events.GaussianEvent(SIGMA1_PER_SIGMA2 * sigma2),
                              events.GaussianEvent(sigma2 / _SQRT2)))
  return events.SelfComposedEvent(one, num_queries)


def _epsilon(sigma2: float, num_queries: int, delta: float) -> float:
  return PateAccountant().compose(_queries_event(sigma2, num_queries)).data_independent_epsilon(
      delta)


def suggest_confident_gnmax(num_teachers: int, num_queries: int, epsilon: float,
                            delta: float) -> ConfidentGNMaxSettings:
  """Confident GNMax settings (threshold, sigma1, sigma2) whose data-independent epsilon fits.

  The shape follows PATE 2018's MNIST setting for 250 teachers (T = 200, sigma1 = 150,
  sigma2 = 40) scaled with the ensemble: T = 0.8 num_teachers (a fixed fraction of the votes,
  so a query is answered when about 80% of the teachers agree) and sigma1 = 3.75 sigma2.  The
  noise level is then calibrated: sigma2 is the smallest value (to a relative 1e-4, by
  :func:`analysis.calibration.calibrate` and checked with
  :class:`PateAccountant`) for which ``num_queries`` threshold checks (Gaussian, sensitivity 1,
  RDP lambda / (2 sigma1^2) each) and ``num_queries`` GNMax answers (RDP lambda / sigma2^2
  each) compose to at most ``epsilon`` at ``delta``:

      eps(sigma2) = min_lambda [num_queries lambda (1 / (2 sigma1^2) + 1 / sigma2^2)
                                + conversion(lambda, delta)] <= epsilon

  (RDP conversion of :func:`analysis.rdp_accountant.get_privacy_spent`).  Counting every query
  as answered makes it a guarantee whatever the outcomes; the data-dependent epsilon of an
  actual run is usually far smaller.  The absolute noise depends on the budget and the number
  of queries, not on the ensemble (one teacher moves one vote whatever the size); a larger
  ensemble makes the same noise relatively smaller (:attr:`ConfidentGNMaxSettings.
  noise_per_teacher`; 0.16 in the paper).  Use the numbers as a start: tune T and the noises
  on public validation data, not on the private votes.

  Args:
    num_teachers: integer >= 1.
    num_queries: integer >= 1 (queries to the aggregator, answered or not).
    epsilon: the target data-independent epsilon, finite and > 0 (nats).
    delta: in (0, 1).

  Returns:
    :class:`ConfidentGNMaxSettings`, with ``epsilon`` the value reached (<= the target).

  Raises:
    ValueError: an argument out of range, or a target so small that sigma2 would exceed 1e4.
  """
  num_teachers = _checks.check_integer("num_teachers", num_teachers, minimum=1)
  num_queries = _checks.check_integer("num_queries", num_queries, minimum=1,
                                      maximum=_checks.MAX_STEPS)
  target = _checks.check_finite_positive("epsilon", epsilon)
  delta = _checks.check_delta("delta", delta)
  try:
    sigma2 = calibration.calibrate(lambda s: _queries_event(s, num_queries), target, delta,
                                   name="sigma2")
  except ValueError as error:
    raise ValueError(f"epsilon={target!r} at delta={delta!r} cannot be met for "
                     f"num_queries={num_queries} even with sigma2 = 1e4: raise epsilon or ask "
                     f"fewer queries.") from error
  reached = _epsilon(sigma2, num_queries, delta)
  for _ in range(100):  # the check uses PateAccountant itself; step up if it disagrees
    if reached <= target:
      break
    sigma2 *= 1.0 + 1e-4
    reached = _epsilon(sigma2, num_queries, delta)
  if not reached <= target or not math.isfinite(sigma2):
    raise ValueError(f"epsilon={target!r} at delta={delta!r} cannot be met for "
                     f"num_queries={num_queries}: raise epsilon or ask fewer queries.")
  return ConfidentGNMaxSettings(
      threshold=THRESHOLD_FRACTION * num_teachers, sigma1=SIGMA1_PER_SIGMA2 * sigma2,
      sigma2=sigma2, epsilon=reached, delta=delta, num_teachers=num_teachers,
      num_queries=num_queries)
