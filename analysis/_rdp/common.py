"""Constants and edge cases shared by the RDP pieces (docs/design/rdp_accountant.md, "Units and
conventions").
"""
from __future__ import annotations

import math

import numpy as np

from analysis._numerics import RDP_NOISE_CEILING, RDP_NOISE_FLOOR, clamp_noise

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


def _scale_by_steps(rdp: float, steps: int) -> float:
  if steps == 0 or rdp == 0.0:
    return 0.0
  return rdp * steps
