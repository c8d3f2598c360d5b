"""Noise calibration: the smallest noise multiplier that meets an (eps, delta) budget.

For the Poisson-subsampled Gaussian mechanism run for ``steps`` steps, epsilon at a fixed delta
is non-increasing in the noise multiplier sigma, so the smallest sigma with
eps(sigma) <= target_epsilon is found by a bracketed root search on log(sigma):

1. bracket: start at sigma = 1 and double (or halve) until [lo, hi] has eps(lo) > target and
   eps(hi) <= target; the upper end is capped at ``SEARCH_MAX_NOISE`` = 1e4;
2. shrink the bracket with the Illinois variant of regula falsi on
   log(eps) - log(target) versus log(sigma) (falling back to bisection when it stalls) until
   hi - lo <= tolerance * hi;
3. return hi, which always meets the budget (it was evaluated with the accountant, never
   interpolated); its excess over the exact smallest sigma is at most ``tolerance`` relative.

With the RDP accountant each probe after the first evaluates only a sliding window of orders
around the previous probe's optimal order (same epsilon as the full list, about 2x faster
overall; see ``_epsilon_function``).

The accountant is either the RDP accountant (:mod:`analysis.rdp_accountant`, tight RDP-to-DP
conversion over the given orders) or the PLD accountant (:mod:`analysis.pld_accountant`,
imported lazily), whose epsilon is the smaller of the PLD and the RDP bound
(``pld_accountant.compute_epsilon_with_rdp_cap``: PLD unless its grid had to be coarsened for
very many steps).  Both decrease with sigma (the RDP one up to its order search's tolerance),
and the sigma returned is always one whose evaluated epsilon meets the budget.  No TensorFlow
import.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from analysis import accountants as _accountants
from analysis import dp_sgd, rdp_accountant
from analysis._numerics import SEARCH_MAX_NOISE, SEARCH_MIN_NOISE
from analysis._checks import (MAX_STEPS, _describe, check_choice, check_count, check_delta,
                              check_orders, check_positive, check_probability, check_real,
                              check_steps)

__all__ = ["largest_count_that_fits", "compute_noise_multiplier", "compute_noise_multiplier_for_training",
           "noise_multiplier_for_event", "steps_for_training", "ACCOUNTANTS"]

ACCOUNTANTS = _accountants.ACCOUNTANTS
_MAX_ITERATIONS = 200
_ORDER_WINDOW = 6


def largest_count_that_fits(fits, *, start: int = 0, cap: int = 2**40):
  """The largest integer ``n`` in ``[start, cap]`` with ``fits(n)``, for a predicate that is true
  up to some ``n*`` and false after it (e.g. "``n`` more steps keep epsilon within budget").

  Doubling from ``start`` then bisection: ``O(log n*)`` calls.  Returns ``start - 1`` when
  ``fits(start)`` is false, and ``None`` when ``fits`` holds at a count above ``cap`` (e.g. no
  noise cost at all).

  Args:
    fits: ``int -> bool``, monotone (true, then false).
    start: the smallest count considered, an integer >= 0.
    cap: an integer > ``start``; counts above it are "unlimited".
  """
  if not fits(start):
    return start - 1
  low, high = start, max(2 * start, start + 1)
  while fits(high):
    if high > cap:
      return None
    low, high = high, high * 2
  while high - low > 1:
    mid = (low + high) // 2
    low, high = (mid, high) if fits(mid) else (low, mid)
  return low


def _epsilon_function(event_of, delta: float, accountant: str, orders):
  """sigma -> epsilon (nats, upper bound) of ``event_of(sigma)`` with the named accountant."""
  if accountant != "rdp":
    def eps_other(sigma: float) -> float:
      return _accountants.make_accountant(accountant).compose(event_of(sigma)).get_epsilon(delta)

    return eps_other

  def eps_over(window):
    rdp = rdp_accountant.RdpAccountant(window).compose(event_of(sigma_now[0]))
    eps, order, _ = rdp.epsilon_and_order(delta)
    return eps, (None if order is None else window.index(order))

  # The search probes nearby sigmas, whose optimal orders are near each other in the list: after
  # the first probe only a window of _ORDER_WINDOW orders each side of the last optimum is
  # evaluated, and the window slides while its optimum sits on one of its edges.  A minimum over
  # some of the orders is never below the minimum over all of them (sound), and it equals it
  # once the window's optimum is interior, since eps is unimodal in the order in practice.
  sigma_now = [0.0]
  center = [None]

  def eps_rdp(sigma: float) -> float:
    sigma_now[0] = sigma
    index = center[0]
    for _ in range(len(orders)):
      if index is None:
        break
      start = max(0, index - _ORDER_WINDOW)
      stop = min(len(orders), index + _ORDER_WINDOW + 1)
      eps, found = eps_over(orders[start:stop])
      if found is None:
        break
      found += start
      if start < found < stop - 1 or found in (0, len(orders) - 1) or found == index:
        center[0] = found
        return eps
      index = found  # the optimum is on the window's edge: slide towards it
    eps, center[0] = eps_over(orders)
    return eps

  return eps_rdp


def compute_noise_multiplier(target_epsilon: float, target_delta: float,
                             sampling_probability: float, steps: int, *,
                             accountant: str = "rdp", orders=None,
                             tolerance: float = 1e-4) -> float:
  """Smallest noise multiplier sigma whose ``steps``-step DP-SGD run is (eps, delta)-DP.

  Poisson sampling with probability q, add-or-remove-one adjacency.  Returns sigma (noise
  std / clipping norm) with eps(sigma) <= ``target_epsilon`` at ``target_delta`` according to
  the accountant, and sigma <= (1 + tolerance) * sigma_min, where sigma_min is the exact
  smallest such value for that accountant (bracketed root search, see module docstring).

  Args:
    target_epsilon: eps budget in nats, > 0 (inf allowed: returns 0 unless steps/q are 0).
    target_delta: delta in (0, 1).
    sampling_probability: q in [0, 1].
    steps: number of steps, an integer in [0, 2**53] for "rdp", [0, 1e10] for "pld".
    accountant: "rdp" (default) or "pld" (epsilon = min of the PLD and the RDP bound, see the
      module docstring).
    orders: RDP orders (non-empty, each in (1, 1e6] or inf) for accountant="rdp"; default
      ``rdp_accountant.DEFAULT_ORDERS``.  Must be None with "pld" (which has no orders).
    tolerance: relative tolerance on sigma, in (0, 1); default 1e-4.

  Returns:
    sigma in [SEARCH_MIN_NOISE = 1e-3, 1e4], or 0.0 when no noise is needed (q = 0, steps = 0 or
    an infinite target_epsilon).

  Raises:
    ValueError: an argument out of range (named in the message), or target_epsilon too small
      to be met even with sigma = 1e4 (the message names target_epsilon).
  """
  q = check_probability("sampling_probability", sampling_probability)
  target_epsilon, target_delta, orders, tolerance = _check_search(
      target_epsilon, target_delta, accountant, steps, orders, tolerance)
  steps = int(steps)
  if q == 0.0 or steps == 0 or target_epsilon == math.inf:
    return 0.0

  eps_of = _epsilon_function(
      lambda sigma: dp_sgd.dp_sgd_event(sigma, steps, sampling_probability=q), target_delta,
      accountant, orders)
  return _smallest_noise(eps_of, target_epsilon, tolerance,
                         f"at target_delta={target_delta!r} with q={q!r} over {steps} steps")


def noise_multiplier_for_event(event_of, target_epsilon: float, target_delta: float, *,
                               accountant: str = "rdp", tolerance: float = 1e-4) -> float:
  """Smallest sigma whose event ``event_of(sigma)`` is (target_epsilon, target_delta)-DP.

  The general form of the calibration (module docstring): ``event_of`` maps a noise
  multiplier to an :mod:`analysis.events` event whose epsilon does not increase with it (e.g.
  ``lambda s: analysis.dp_sgd.dp_sgd_event(s, steps, ...)``).  Returns sigma in
  [1e-3, 1e4] with eps <= target by the named accountant, at most ``tolerance`` relative
  above the smallest such sigma; 0.0 for an infinite target.

  Raises:
    ValueError: an argument out of range, or a target not met even at sigma = 1e4.
  """
  target_epsilon, target_delta, orders, tolerance = _check_search(
      target_epsilon, target_delta, accountant, 0, None, tolerance)
  if target_epsilon == math.inf:
    return 0.0
  return _smallest_noise(_epsilon_function(event_of, target_delta, accountant, orders),
                         target_epsilon, tolerance, f"at target_delta={target_delta!r}")


def _check_search(target_epsilon, target_delta, accountant, steps, orders, tolerance):
  """Validates the search arguments; returns (target_epsilon, target_delta, orders, tolerance)."""
  target_epsilon = check_positive("target_epsilon", target_epsilon)
  target_delta = check_delta("target_delta", target_delta)
  check_choice("accountant", accountant, ACCOUNTANTS)
  if accountant == "pld":
    from analysis import pld_accountant  # pylint: disable=g-import-not-at-top
    check_steps("steps", steps, maximum=pld_accountant.MAX_STEPS,
                why="the PLD accountant's supported range")
    if orders is not None:
      raise ValueError("orders must be None with accountant='pld' (the PLD accountant has no "
                       f"Renyi orders), got {orders!r}.")
  else:
    check_steps("steps", steps)
  tolerance = check_real("tolerance", tolerance)
  if not 0.0 < tolerance < 1.0:
    raise ValueError(f"tolerance must be in (0, 1), got {tolerance!r}.")
  if orders is None:
    orders = list(rdp_accountant.DEFAULT_ORDERS)
  else:
    orders = list(check_orders("orders", orders if not isinstance(orders, np.ndarray)
                               else list(orders), max_finite=rdp_accountant.MAX_ORDER)[0])
  return target_epsilon, target_delta, orders, tolerance


def _smallest_noise(eps_of, target_epsilon: float, tolerance: float, run: str) -> float:
  """Smallest sigma in [SEARCH_MIN_NOISE, SEARCH_MAX_NOISE] with eps_of(sigma) <= target."""
  cache: dict[float, float] = {}

  def excess(sigma: float) -> float:
    """log(eps(sigma)) - log(target): > 0 misses the budget, <= 0 meets it."""
    if sigma not in cache:
      eps = eps_of(sigma)
      cache[sigma] = math.inf if eps == math.inf else (
          -math.inf if eps <= 0.0 else math.log(eps) - math.log(target_epsilon))
    return cache[sigma]

  # 1. Bracket: excess(lo) > 0 >= excess(hi).
  hi = 1.0
  if excess(hi) > 0.0:
    lo = hi
    while True:
      hi = min(2.0 * hi, SEARCH_MAX_NOISE)
      if excess(hi) <= 0.0:
        break
      if hi >= SEARCH_MAX_NOISE:
        raise ValueError(
            f"target_epsilon={target_epsilon!r} cannot be met {run} even with "
            f"noise_multiplier={SEARCH_MAX_NOISE:g}; "
            "raise target_epsilon (or target_delta), or use fewer steps or a smaller q.")
      lo = hi
  else:
    while True:
      lo = hi / 2.0
      if lo < SEARCH_MIN_NOISE:
        return hi  # budget met by (almost) no noise; don't search below 1e-3
      if excess(lo) > 0.0:
        break
      hi = lo

  # 2. Shrink with Illinois regula falsi in log(sigma); bisection when it stalls.
  x_lo, x_hi = math.log(lo), math.log(hi)
  f_lo, f_hi = excess(lo), excess(hi)
  side = 0
  for _ in range(_MAX_ITERATIONS):
    if math.exp(x_hi) - math.exp(x_lo) <= tolerance * math.exp(x_hi):
      break
    width = x_hi - x_lo
    if math.isfinite(f_lo) and math.isfinite(f_hi) and f_lo != f_hi:
      x = x_hi - f_hi * (x_hi - x_lo) / (f_hi - f_lo)
    else:
      x = 0.5 * (x_lo + x_hi)
    # Keep the probe strictly inside, at least ~tolerance/2 away from either end, so that
    # landing on the right side closes the bracket.
    margin = min(0.5 * tolerance, 0.25 * width)
    x = min(max(x, x_lo + margin), x_hi - margin)
    f = excess(math.exp(x))
    if f > 0.0:
      x_lo, f_lo = x, f
      if side == -1:
        f_hi *= 0.5  # Illinois: halve the stale end's value
      side = -1
    else:
      x_hi, f_hi = x, excess(math.exp(x))
      if side == 1:
        f_lo *= 0.5
      side = 1
    if x_hi - x_lo > 0.5 * width:
      # Slow progress: one bisection step.
      mid = 0.5 * (x_lo + x_hi)
      if excess(math.exp(mid)) > 0.0:
        x_lo, f_lo = mid, excess(math.exp(mid))
      else:
        x_hi, f_hi = mid, excess(math.exp(mid))
      side = 0
  sigma = math.exp(x_hi)
  # The returned value was itself evaluated and met the budget.
  assert excess(sigma) <= 0.0
  return sigma


def steps_for_training(dataset_size: int, batch_size: int, epochs: float) -> int:
  """ceil(epochs * dataset_size / batch_size), computed exactly (no float rounding).

  dataset_size and batch_size are integers >= 1 with batch_size <= dataset_size; epochs is a
  real number >= 0 (fractions of an epoch allowed).  The result must not exceed 2**53 (the
  largest step count the accountants accept); a larger one raises a ValueError naming epochs.
  """
  dataset_size = check_count("dataset_size", dataset_size, minimum=1)
  batch_size = check_count("batch_size", batch_size, minimum=1)
  if batch_size > dataset_size:
    raise ValueError(f"batch_size must be in [1, dataset_size={dataset_size}], "
                     f"got {batch_size!r}.")
  epochs = check_real("epochs", epochs)
  if not 0.0 <= epochs < math.inf:
    raise ValueError(f"epochs must be finite and >= 0, got {epochs!r}.")
  steps = math.ceil(Fraction(epochs) * dataset_size / batch_size)
  if steps > MAX_STEPS:
    raise ValueError(
        f"epochs={epochs!r} with dataset_size={dataset_size} and batch_size={batch_size} "
        f"gives {_describe(steps)} steps; steps must be in [0, 2**53 = {MAX_STEPS}], so epochs must "
        f"be at most {MAX_STEPS * batch_size / dataset_size:.6g}.")
  return steps


def compute_noise_multiplier_for_training(target_epsilon: float, target_delta: float,
                                          dataset_size: int, batch_size: int, epochs: float,
                                          *, sampling: str = "poisson", microbatch_size: int = 1,
                                          steps_per_epoch: int | None = None,
                                          accountant: str = "rdp", orders=None,
                                          tolerance: float = 1e-4) -> float:
  """Smallest noise multiplier for DP-SGD training to an (eps, delta) budget.

  The run is the event of :func:`analysis.dp_sgd.dp_sgd_event` (the one rule shared with the
  command line and ``tf_dpkit``'s budget callback), searched over sigma as in
  :func:`compute_noise_multiplier`:

  * ``"poisson"``: q = batch_size / dataset_size for ``steps = ceil(epochs * dataset_size /
    batch_size)`` steps (:func:`steps_for_training`);
  * ``"without_replacement"``: fixed batches of ``batch_size`` for the same number of steps;
  * ``"shuffle"``: ``ceil(epochs)`` epochs of ``steps_per_epoch`` batches (default
    ``floor(dataset_size / batch_size)``); the epsilon is that of the Gaussian composed
    ``ceil(epochs)`` times whatever the batches per epoch.

  Args:
    target_epsilon: > 0 (nats); target_delta: in (0, 1).
    dataset_size: integer >= 1; batch_size: integer in [1, dataset_size] (the expected batch
      size under Poisson sampling); epochs: real >= 0.
    sampling: ``"poisson"``, ``"shuffle"`` or ``"without_replacement"``.
    microbatch_size: examples per clipped microbatch, integer >= 1 (> 1 halves the effective
      noise, so the returned sigma is about twice as large).
    steps_per_epoch: batches per epoch for ``"shuffle"``, integer >= 1.
    accountant: as in :func:`compute_noise_multiplier`.
    orders: as in :func:`compute_noise_multiplier`.
    tolerance: as in :func:`compute_noise_multiplier`.

  Returns:
    The noise multiplier (noise std / clipping norm); 0.0 when nothing is released (0 steps)
    or ``target_epsilon`` is inf.

  Raises:
    ValueError: as :func:`compute_noise_multiplier`, :func:`steps_for_training` and
      :func:`analysis.dp_sgd.dp_sgd_event`.
  """
  steps = steps_for_training(dataset_size, batch_size, epochs)
  check_choice("sampling", sampling, dp_sgd.SAMPLINGS)
  if sampling == "poisson" and microbatch_size == 1 and steps_per_epoch is None:
    return compute_noise_multiplier(target_epsilon, target_delta, batch_size / dataset_size,
                                    steps, accountant=accountant, orders=orders,
                                    tolerance=tolerance)
  if sampling == "shuffle":
    if steps_per_epoch is None:
      steps_per_epoch = max(1, int(dataset_size) // int(batch_size))
    steps_per_epoch = check_count("steps_per_epoch", steps_per_epoch, minimum=1)
    steps = math.ceil(Fraction(check_real("epochs", epochs))) * steps_per_epoch if steps else 0

  def event_of(sigma):
    return dp_sgd.dp_sgd_event(sigma, steps, sampling=sampling, dataset_size=dataset_size,
                               batch_size=batch_size, steps_per_epoch=steps_per_epoch,
                               microbatch_size=microbatch_size)

  event_of(1.0)  # validates every argument before the search
  target_epsilon, target_delta, orders, tolerance = _check_search(
      target_epsilon, target_delta, accountant, steps, orders, tolerance)
  if steps == 0 or target_epsilon == math.inf:
    return 0.0
  return _smallest_noise(_epsilon_function(event_of, target_delta, accountant, orders),
                         target_epsilon, tolerance,
                         f"at target_delta={target_delta!r} for {steps} steps of {sampling} "
                         f"batches of {batch_size} from {dataset_size} examples")
