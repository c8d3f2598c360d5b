"""Constants and edge cases shared by the RDP pieces (docs/design/rdp_accountant.md, "Units and
conventions").
"""
from __future__ import annotations

import math

import numpy as np

from analysis._checks import check_nonnegative, check_orders, check_probability, check_steps
from analysis._numerics import RDP_NOISE_CEILING, RDP_NOISE_FLOOR, clamp_noise, finish

#: Orders used when none are given: 1.25, 1.5, ..., 10.5; 11, 12, ..., 64; 128, 256, 512, 1024.
DEFAULT_ORDERS: tuple[float, ...] = tuple(
    [1.0 + x / 4.0 for x in range(1, 39)] + [float(a) for a in range(11, 65)]
    + [128.0, 256.0, 512.0, 1024.0])

_EPS = np.finfo(np.float64).eps

_TINY = math.ulp(0.0)  # a positive RDP that underflows is reported as this, not 0

#: Largest finite order accepted by the functions that compute RDP (the integer-order sums and
#: the fractional-order series allocate O(alpha) terms, so the cost grows linearly with it).
MAX_ORDER = 1e6


class OrderAtBoundaryWarning(UserWarning):
  """The optimal Renyi order is the first or last order given: widen the list of orders."""


def _accounted_noise_rdp(s: float) -> float:
  """s with (0, 1e-100) accounted as 0 (RDP inf) and (1e100, inf) as 1e100: beyond these
  1/(2 s^2) and s^2 leave float64's range (sound: :func:`analysis._numerics.clamp_noise`)."""
  return clamp_noise(s, RDP_NOISE_FLOOR, RDP_NOISE_CEILING)


def _edge_case_rdp(q: float, s: float, alpha: float) -> float | None:
  """RDP of one step in the closed-form cases (q in {0, 1}, s in {0, inf}, alpha = inf)."""
  if q == 0.0 or s == math.inf:
    return 0.0
  if s == 0.0 or alpha == math.inf:
    return math.inf
  if q == 1.0:
    return alpha / (2.0 * s * s)
  return None


def _one_step(q: float, s: float, alpha: float, interior) -> float:
  """RDP of one step: the closed form in the edge cases, else ``interior(q, s, alpha)`` with the
  noise clamped (:func:`_accounted_noise_rdp`); a positive RDP is never reported as 0 (an
  underflow becomes the smallest positive float)."""
  s = _accounted_noise_rdp(s)
  edge = _edge_case_rdp(q, s, alpha)
  if edge is not None:
    return max(edge, _TINY) if 0.0 < edge else edge
  return max(interior(q, s, alpha), _TINY)


def _scale_by_steps(rdp: float, steps: int) -> float:
  if steps == 0 or rdp == 0.0:
    return 0.0
  return rdp * steps


def _rdp_curve(one_step, q, noise_multiplier, steps, orders):
  """``steps * one_step(q, sigma, alpha)`` at each order, the arguments checked as
  ``compute_rdp`` documents them (``q`` in [0, 1], ``noise_multiplier`` in [0, inf], ``steps``
  in [0, 2**53], orders in (1, 1e6] or inf); a float for a scalar ``orders``, else an array."""
  q = check_probability("q", q)
  s = check_nonnegative("noise_multiplier", noise_multiplier)
  steps = check_steps("steps", steps)
  alphas, scalar = check_orders("orders", orders, max_finite=MAX_ORDER)
  return finish([_scale_by_steps(one_step(q, s, float(a)), steps) for a in alphas], scalar)
