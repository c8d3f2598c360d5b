"""RDP -> (eps, delta), over a grid of orders or with the order optimised over the reals
(docs/design/rdp_accountant.md, "RDP -> (eps, delta)").
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from analysis._checks import (check_delta, check_nonnegative, check_orders, check_probability,
                              check_real, check_same_length, check_steps)
from analysis._numerics import minimize_over_order
from analysis._rdp.common import DEFAULT_ORDERS, MAX_ORDER, OrderAtBoundaryWarning
from analysis._rdp.sampled_gaussian import compute_rdp

_MAX_SEARCH_ORDER = 1e4    # upper end of the continuous order search


def _eps_tight(alpha: float, rdp: float, log_delta: float) -> float:
  """The tight conversion alone (no KL route) at one order; inf where rdp is inf."""
  if rdp == math.inf or alpha == math.inf:
    return math.inf
  return rdp + math.log1p(-1.0 / alpha) - (log_delta + math.log(alpha)) / (alpha - 1.0)


def _log_delta_tight(alpha: float, rdp: float, eps: float) -> float:
  """The tight conversion alone (log delta, no KL route) at one order; inf where rdp is inf."""
  if rdp == math.inf or alpha == math.inf:
    return math.inf
  return (alpha - 1.0) * (rdp - eps + math.log1p(-1.0 / alpha)) - math.log(alpha)


def _eps_at(alpha: float, rdp: float, log_delta: float) -> float:
  """Tight conversion at one order; inf where rdp is inf.  Not clamped."""
  eps = _eps_tight(alpha, rdp, log_delta)
  if eps == math.inf:
    return eps
  # KL route: delta(0) <= sqrt(1 - exp(-KL)) <= sqrt(1 - exp(-rdp)), so eps = 0 suffices.
  if rdp == 0.0 or 0.5 * math.log(-math.expm1(-rdp)) <= log_delta:
    eps = min(eps, 0.0)
  return eps


def _log_delta_at(alpha: float, rdp: float, eps: float) -> float:
  """Tight conversion at one order (log delta, not clamped); inf where rdp is inf."""
  log_delta = _log_delta_tight(alpha, rdp, eps)
  if log_delta == math.inf:
    return log_delta
  kl = 0.5 * math.log(-math.expm1(-rdp)) if rdp > 0 else -math.inf
  return min(log_delta, kl)


def _check_targets(target_eps, target_delta):
  if (target_eps is None) == (target_delta is None):
    raise ValueError("Exactly one of target_eps and target_delta must be given "
                     f"(got target_eps={target_eps!r}, target_delta={target_delta!r}).")
  if target_delta is not None:
    return None, check_delta("target_delta", target_delta)
  eps = check_nonnegative("target_eps", target_eps)
  return eps, None


def _best(orders: np.ndarray, rdp: np.ndarray, target_eps, target_delta):
  """(eps, delta, optimal order, index) over the orders, or index None if all are inf."""
  if target_delta is not None:
    log_delta = math.log(target_delta)
    values = [_eps_at(float(a), float(r), log_delta) for a, r in zip(orders, rdp)]
  else:
    values = [_log_delta_at(float(a), float(r), target_eps) for a, r in zip(orders, rdp)]
  finite = [i for i, v in enumerate(values) if v != math.inf]
  if not finite:
    if target_delta is not None:
      return math.inf, target_delta, None, None
    return target_eps, 1.0, None, None
  best = min(finite, key=lambda i: values[i])
  if target_delta is not None:
    return max(values[best], 0.0), target_delta, float(orders[best]), best
  return target_eps, min(math.exp(values[best]), 1.0), float(orders[best]), best


def _checked_rdp_curve(orders, rdp):
  """``(alphas, values)``: an RDP curve given as ``orders`` (each in (1, inf], scalars allowed)
  and ``rdp`` (nats, each in [0, inf], same length) as float64 arrays; ValueError naming the
  argument otherwise."""
  if isinstance(orders, (int, float, np.floating, np.integer)):
    orders = [orders]
  if isinstance(rdp, (int, float, np.floating, np.integer)):
    rdp = [rdp]
  check_same_length(orders=orders, rdp=rdp)
  alphas, _ = check_orders("orders", list(orders))
  values = np.empty(len(rdp), dtype=np.float64)
  for i, r in enumerate(rdp):
    r = check_real(f"rdp[{i}]", r)
    if r < 0.0:
      raise ValueError(f"rdp[{i}] must be in [0, inf], got {r!r}.")
    values[i] = r
  return alphas, values


def get_privacy_spent(orders, rdp, target_eps: float | None = None,
                      target_delta: float | None = None):
  """Converts RDP at several orders to (eps, delta)-DP, choosing the best order.

  Uses the tight conversion (Balle et al. 2020, Thm 21; Asoodeh et al. 2020): at order alpha,

    eps   = rdp + log1p(-1/alpha) - (log(delta) + log(alpha)) / (alpha - 1),
    delta = exp((alpha - 1) (rdp - eps + log1p(-1/alpha)) - log(alpha)),

  and the KL bound delta <= sqrt(1 - exp(-rdp)) valid at every eps >= 0; the minimum over the
  orders is returned.  Orders whose RDP is inf are skipped.

  Args:
    orders: non-empty sequence of orders, each in (1, inf].
    rdp: sequence of RDP values (nats, in [0, inf]), same length as ``orders``.
    target_eps: give this (>= 0) to get the smallest delta, or
    target_delta: give this (in (0, 1)) to get the smallest eps.  Exactly one of the two.

  Returns:
    ``(eps, delta, optimal_order)``.  eps >= 0 (inf if every rdp is inf); delta in [0, 1];
    optimal_order is the order attaining the optimum, or None if every rdp is inf.  The
    given target is returned unchanged in its slot.

  Warns:
    OrderAtBoundaryWarning: when the optimum is at the first or last order of a list of two or
      more (and the result is not already eps = 0 / delta = 0): a wider list may do better.

  Raises:
    ValueError: both or neither target, target_delta outside (0, 1), target_eps < 0 or NaN,
      mismatched lengths, empty ``orders``, an order <= 1, or an rdp value that is negative or
      NaN.
  """
  target_eps, target_delta = _check_targets(target_eps, target_delta)
  alphas, values = _checked_rdp_curve(orders, rdp)
  eps, delta, order, index = _best(alphas, values, target_eps, target_delta)
  trivial = (eps == 0.0) if target_delta is not None else (delta == 0.0)
  if (index is not None and alphas.size > 1 and not trivial
      and index in (0, alphas.size - 1)):
    where = "first" if index == 0 else "last"
    warnings.warn(
        f"The optimal Renyi order {order:g} is the {where} of the orders given; a wider range "
        "of orders may give a smaller bound.", OrderAtBoundaryWarning, stacklevel=2)
  return eps, delta, order


# ------------------------------------------------------------------------------------------
# Continuous order search.


def get_privacy_spent_optimal_order(q: float, noise_multiplier: float, steps: int, *,
                                    target_eps: float | None = None,
                                    target_delta: float | None = None, orders=None):
  """(eps, delta, order) for the Poisson-subsampled Gaussian with the order optimised over reals.

  First evaluates the grid ``orders`` (default :data:`DEFAULT_ORDERS`) as
  :func:`get_privacy_spent` does.  The per-order bound is the minimum of two functions of
  alpha: the tight conversion, which is unimodal in alpha, and the KL route
  (delta <= sqrt(1 - exp(-rdp))), which is non-decreasing in alpha because the RDP is.  So
  the real-order optimum is the better of (a) a bounded scalar search, in u = log(alpha - 1),
  of the tight conversion over the bracket around its best grid order (extended down towards
  1, to 1 + (orders[0] - 1) * 1e-3, or up to 1e4, when that order is at an end of the grid),
  and (b) the KL route at the lowest order of that domain.  (Searching the minimum of the two
  directly is wrong: it has two basins, and the search can stall in the KL one.)  Each
  candidate is re-evaluated with the sound :func:`compute_rdp` at its order, and the best of
  the grid answer and the candidates is returned, so the result is never worse than the
  grid's and is a valid (eps, delta)-DP guarantee.

  Args:
    q: sampling probability in [0, 1]; noise_multiplier: in [0, inf]; steps: integer in
      [0, 2**53].
    target_eps: eps >= 0 for which to minimise delta, or target_delta in (0, 1) for which to
      minimise eps.  Exactly one.
    orders: non-empty grid of orders (each in (1, 1e6] or inf); default DEFAULT_ORDERS.

  Returns:
    ``(eps, delta, optimal_order)`` as in :func:`get_privacy_spent` (order None if every
    order gives inf).

  Raises:
    ValueError: as :func:`compute_rdp` and :func:`get_privacy_spent`.
  """
  q = check_probability("q", q)
  s = check_nonnegative("noise_multiplier", noise_multiplier)
  steps = check_steps("steps", steps)
  target_eps, target_delta = _check_targets(target_eps, target_delta)
  grid, _ = check_orders("orders", list(DEFAULT_ORDERS if orders is None else orders),
                         max_finite=MAX_ORDER)
  grid = np.sort(grid)
  rdp = compute_rdp(q, s, steps, grid)
  eps, delta, order, index = _best(grid, rdp, target_eps, target_delta)
  if index is None or (eps == 0.0 if target_delta is not None else delta == 0.0):
    return eps, delta, order
  if target_delta is not None:
    log_delta = math.log(target_delta)
    tight = lambda a, r: _eps_tight(a, r, log_delta)  # noqa: E731
    full = lambda a, r: _eps_at(a, r, log_delta)  # noqa: E731
  else:
    tight = lambda a, r: _log_delta_tight(a, r, target_eps)  # noqa: E731
    full = lambda a, r: _log_delta_at(a, r, target_eps)  # noqa: E731

  finite_grid = grid[np.isfinite(grid)]
  bottom = 1.0 + (grid[0] - 1.0) * 1e-3  # lowest order searched
  candidates = [bottom]  # the KL route is best at the lowest order
  tight_values = [tight(float(a), float(r)) for a, r in zip(grid, rdp)]
  finite = [i for i, v in enumerate(tight_values) if v != math.inf]
  if finite:
    i = min(finite, key=lambda j: tight_values[j])
    lo = grid[i - 1] if i > 0 else bottom
    hi = grid[i + 1] if i + 1 < grid.size else max(_MAX_SEARCH_ORDER, grid[i])
    if not math.isfinite(hi):
      hi = max(_MAX_SEARCH_ORDER, float(finite_grid.max(initial=2.0)))
    if math.isfinite(lo) and hi > lo:
      candidates.append(minimize_over_order(
          lambda alpha: tight(alpha, compute_rdp(q, s, steps, alpha)), lo, hi))

  best_value, best_alpha = None, None
  for alpha in candidates:
    value = full(alpha, compute_rdp(q, s, steps, alpha))  # sound value at this order
    if best_value is None or value < best_value:
      best_value, best_alpha = value, alpha
  if target_delta is not None:
    cont = max(best_value, 0.0)
    if cont < eps:
      return cont, delta, best_alpha
  else:
    cont = min(math.exp(min(best_value, 0.0)), 1.0)
    if cont < delta:
      return eps, cont, best_alpha
  return eps, delta, order
