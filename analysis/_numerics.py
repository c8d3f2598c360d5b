"""Log-space numerics and noise ranges shared by the accountants (private; no TensorFlow).

One definition of each helper, so that every accountant rounds the same way:

* :func:`log1mexp` ``log(1 - exp(-x))`` and :func:`log_expm1` ``log(exp(x) - 1)`` for x >= 0,
  without overflow or cancellation, with ONE switch-over point, ``x = log 2`` (Maechler 2012,
  "Accurately Computing log(1 - exp(-|a|))"): below it ``log(-expm1(-x))`` (``1 - exp(-x)`` is
  small and expm1 keeps its relative precision), above it ``log1p(-exp(-x))`` (``exp(-x)`` is
  at most 1/2 and log1p keeps the precision of the small result).  ``log_expm1(x)`` is
  ``x + log1mexp(x)``, which never overflows.  Both are within a few ulps (absolute, of
  ``max(1, |result|, x)``) of the exact value: tests/analysis/test_numerics.py checks this
  against mpmath from 1e-300 to 1e300.
* :func:`logsumexp` of a 1-D array (cheaper than scipy's for the short arrays used here).
* :func:`finish`: a list of per-order values as a float (scalar input) or a float64 array.
* :func:`minimize_over_order`: the real Renyi order minimising a bound, searched in
  ``log(alpha - 1)``.
* :func:`clamp_noise`: the noise multiplier an accountant actually evaluates.  Clamping a
  positive noise multiplier below the floor down to 0 and one above the ceiling down to the
  ceiling is sound: the Gaussian mechanism with more noise is a post-processing (adding
  independent noise) of the one with less, so less noise never leaks less.

The noise constants have one name per meaning:

* :data:`RDP_NOISE_FLOOR` / :data:`RDP_NOISE_CEILING` (1e-100 / 1e100): where float64 stops
  holding ``1 / (2 sigma^2)`` and ``sigma^2`` in the RDP formulas;
* :data:`PLD_NOISE_FLOOR` / :data:`PLD_NOISE_CEILING` (1e-3 / 1e12): the range in which the PLD
  accountant can discretise the one-step privacy loss (see ``docs/design/pld_accountant.md``);
* :data:`SEARCH_MIN_NOISE` / :data:`SEARCH_MAX_NOISE` (1e-3 / 1e4): the ends of the interval in
  which :func:`analysis.calibration.calibrate` searches a noise multiplier.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import optimize

__all__ = ["LOG_EXPM1_SWITCH", "PLD_NOISE_CEILING", "PLD_NOISE_FLOOR", "RDP_NOISE_CEILING",
           "RDP_NOISE_FLOOR", "SEARCH_MAX_NOISE", "SEARCH_MIN_NOISE", "clamp_noise", "finish",
           "log1mexp", "log_expm1", "logsumexp", "minimize_over_order"]

#: The one switch-over point of :func:`log1mexp` and :func:`log_expm1` (module docstring).
LOG_EXPM1_SWITCH = math.log(2.0)

RDP_NOISE_FLOOR = 1e-100
RDP_NOISE_CEILING = 1e100
PLD_NOISE_FLOOR = 1e-3
PLD_NOISE_CEILING = 1e12
SEARCH_MIN_NOISE = 1e-3
SEARCH_MAX_NOISE = 1e4


def log1mexp(x):
  """``log(1 - exp(-x))`` for x >= 0 (-inf at 0), a float for a float, else elementwise.

  Switches at ``x = log 2`` (module docstring).  NaN for x < 0.
  """
  if isinstance(x, (float, int)) and not isinstance(x, bool):
    x = float(x)
    if x <= 0.0:
      return -math.inf if x == 0.0 else math.nan
    if x <= LOG_EXPM1_SWITCH:
      return math.log(-math.expm1(-x))
    return math.log1p(-math.exp(-x))
  x = np.asarray(x, dtype=np.float64)
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(x <= LOG_EXPM1_SWITCH, np.log(-np.expm1(-x)), np.log1p(-np.exp(-x)))


def log_expm1(x):
  """``log(exp(x) - 1)`` for x >= 0 (-inf at 0), as ``x + log1mexp(x)``: no overflow for large
  x, no cancellation for small x.  A float for a float, else elementwise."""
  if isinstance(x, (float, int)) and not isinstance(x, bool):
    x = float(x)
    return x + log1mexp(x)
  x = np.asarray(x, dtype=np.float64)
  return x + log1mexp(x)


def logsumexp(x) -> float:
  """``log(sum(exp(x)))`` of a non-empty 1-D array; its maximum when that is +-inf."""
  top = float(np.max(x))
  if not math.isfinite(top):
    return top
  return top + math.log(float(np.sum(np.exp(np.asarray(x, dtype=np.float64) - top))))


def finish(values, scalar: bool):
  """``values`` (one per order) as a float when ``scalar``, else as a float64 array."""
  values = np.asarray(values, dtype=np.float64)
  return float(values[0]) if scalar else values


def clamp_noise(sigma: float, floor: float, ceiling: float) -> float:
  """The noise multiplier an accountant evaluates: 0 for sigma in (0, floor), ``ceiling`` for
  sigma in (ceiling, inf), else sigma (sound by post-processing, module docstring)."""
  if 0.0 < sigma < floor:
    return 0.0
  if ceiling < sigma < math.inf:
    return ceiling
  return sigma


def minimize_over_order(value_of, lower: float, upper: float) -> float:
  """The order alpha in [lower, upper] (1 < lower < upper < inf) at which ``value_of(alpha)`` is
  smallest, by a bounded scalar search (scipy's ``minimize_scalar``, ``xatol`` 1e-4) in
  ``u = log(alpha - 1)``, where the bounds of the accountants are close to unimodal; a
  non-finite value counts as 1e300.  The caller re-evaluates its bound at the order returned
  (a search point, never an interpolation), so the result stays a valid bound.
  """
  def objective(u: float) -> float:
    value = value_of(1.0 + math.exp(u))
    return value if math.isfinite(value) else 1e300

  result = optimize.minimize_scalar(
      objective, bounds=(math.log(lower - 1.0), math.log(upper - 1.0)), method="bounded",
      options={"xatol": 1e-4})
  return 1.0 + math.exp(float(result.x))
