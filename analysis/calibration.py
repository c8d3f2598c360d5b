"""Calibration: the parameter of a mechanism that just meets an (epsilon, delta) budget.

One entry point, :func:`calibrate`: from ``event_of`` (a parameter -> the mechanism's
:mod:`analysis.events` event), a target epsilon, delta and an accountant named in
:mod:`analysis.accountants`, to the parameter.

* Continuous (a noise multiplier; epsilon non-increasing in it): the smallest parameter in
  ``[lower, upper]`` whose evaluated epsilon meets the target, found by a bracketed root search
  on log(parameter) (see :func:`calibrate`); the value returned was itself evaluated and met the
  budget, and it is at most ``tolerance`` relative above the exact smallest one.
* Integer (a count of steps, epochs or releases; epsilon non-decreasing in it): the largest
  count in ``[lower, upper]`` that meets the target, by doubling then bisection
  (:func:`largest_count_that_fits`, the one integer search).

With the RDP accountant each probe after the first evaluates only a sliding window of orders
around the previous probe's optimal order (same epsilon as the full list, fewer orders
evaluated; see ``_epsilon_function``).  The "pld" accountant's epsilon is the smaller of the PLD
and the RDP bound (``pld_accountant.compute_epsilon_with_rdp_cap``).

The DP-SGD forms :func:`compute_noise_multiplier` (TF Privacy's name),
:func:`compute_noise_multiplier_for_training` and :func:`noise_multiplier_for_event` are thin
documented wrappers of :func:`calibrate`.  No TensorFlow import.
"""
from __future__ import annotations

import math
from fractions import Fraction

from analysis import accountants as _accountants
from analysis import dp_sgd, events, rdp_accountant
from analysis._checks import (MAX_STEPS, _describe, check_choice, check_count, check_delta,
                              check_finite_positive, check_positive, check_probability,
                              check_real)
from analysis._numerics import SEARCH_MAX_NOISE, SEARCH_MIN_NOISE

__all__ = ["calibrate", "compute_noise_multiplier",
           "compute_noise_multiplier_for_training", "largest_count_that_fits",
           "noise_multiplier_for_event", "steps_for_training", "training_event_of"]

_MAX_ITERATIONS = 200
_ORDER_WINDOW = 6


def largest_count_that_fits(fits, *, start: int = 0, cap: int = 2**40):
  """The largest integer ``n`` >= ``start`` with ``fits(n)``, for a predicate that is true up to
  some ``n*`` and false after it (e.g. "``n`` more steps keep epsilon within budget").

  Doubling from ``start`` then bisection (:func:`_largest_count`): ``O(log n*)`` calls.
  Returns ``start - 1`` when ``fits(start)`` is false, and ``None`` when ``fits`` holds at
  ``cap + 1`` (e.g. no noise cost at all).

  Args:
    fits: ``int -> bool``, monotone (true, then false).
    start: the smallest count considered, an integer >= 0.
    cap: an integer > ``start``; counts above it are "unlimited".
  """
  found = _largest_count(fits, start, cap + 1)
  return None if found == cap + 1 else found


def _largest_count(fits, lower: int, upper: int) -> int:
  """The largest ``n`` in ``[lower, upper]`` with ``fits(n)`` (monotone: true, then false), or
  ``lower - 1``; never calls ``fits`` outside ``[lower, upper]``.  Doubling then bisection."""
  if not fits(lower):
    return lower - 1
  low = lower
  while low < upper:
    high = min(max(2 * low, low + 1), upper)
    if not fits(high):
      break
    low = high
  else:
    return upper
  while high - low > 1:
    mid = (low + high) // 2
    low, high = (mid, high) if fits(mid) else (low, mid)
  return low


def __getattr__(name: str):
  if name == "ACCOUNTANTS":  # the registered accountant names (analysis.accountants)
    return _accountants.accountant_names()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def calibrate(event_of, target_epsilon: float, delta: float, *, accountant: str = "rdp",
              lower=None, upper=None, integer: bool = False, tolerance: float = 1e-4,
              orders=None, name: str | None = None, context: str = "", also=()):
  """The parameter of ``event_of`` that just meets ``(target_epsilon, delta)``.

  ``event_of(p)`` is the :mod:`analysis.events` event of the mechanism with parameter ``p``;
  its epsilon at ``delta`` is computed by the accountant named ``accountant``
  (:func:`analysis.accountants.make_accountant`; ``orders`` for ``"rdp"``).

  * ``integer=False`` (e.g. a noise multiplier; epsilon must not increase with ``p``): the
    smallest ``p`` in ``[lower, upper]`` (default ``[1e-3, 1e4]``) with
    epsilon(p) <= target_epsilon, within ``tolerance`` relative above the exact smallest one.
    Search on log(p): start at 1 (clamped into the range), double or halve until the target is
    bracketed, then the Illinois variant of regula falsi on log(eps) - log(target) (bisection
    where it stalls) until the bracket is ``tolerance`` relative wide; the upper end, which was
    evaluated and met the budget, is returned.  When even ``p`` in ``[lower, 2 lower)`` meets
    the target that value is returned (the budget needs (almost) no noise); an infinite
    ``target_epsilon`` returns 0.0.
  * ``integer=True`` (e.g. steps, epochs or releases; epsilon must not decrease with ``p``):
    the largest integer ``p`` in ``[lower, upper]`` (default ``[0, 2**40]``) with
    epsilon(p) <= target_epsilon, or ``lower - 1`` when even ``lower`` does not fit
    (:func:`_largest_count`: doubling then bisection, ``O(log p)`` evaluations).

  Args:
    event_of: ``p -> DpEvent``.
    target_epsilon: in (0, inf] (nats).
    delta: in (0, 1).
    accountant: a registered accountant name (:data:`analysis.accountants.ACCOUNTANTS`).
    lower: smallest parameter searched (> 0 continuous, an integer >= 0 for ``integer``).
    upper: largest parameter searched (> lower).
    integer: search integers (largest that fits) instead of reals (smallest that fits).
    tolerance: relative tolerance of the continuous search, in (0, 1).
    orders: Renyi orders for ``"rdp"`` (default ``rdp_accountant.DEFAULT_ORDERS``).
    name: the parameter's name in error messages (default ``"noise_multiplier"``).
    context: words appended to ``"at delta=..."`` in the "cannot be met" error.
    also: an event, or an iterable of events (read once), of other mechanisms on the same
      records, composed with ``event_of(p)``: the parameter returned makes the whole
      composition meet the target.

  Returns:
    A float (continuous) or an int (``integer``).

  Raises:
    ValueError: an argument out of range (named in the message), a target that the ``also``
      events alone already spend, or, continuous, a target not met even at ``upper`` (the
      message names target_epsilon).
  """
  target_epsilon = check_positive("target_epsilon", target_epsilon)
  delta = check_delta("delta", delta)
  orders = _check_accountant_and_orders(accountant, orders)
  released = event_of  # "nothing released" is asked of this mechanism, not of the others
  event_of = _composed_with(event_of, also, target_epsilon, delta, accountant, orders)
  if integer:
    lower = 0 if lower is None else check_count("lower", lower, minimum=0)
    upper = 2**40 if upper is None else check_count("upper", upper, minimum=lower)
    if target_epsilon == math.inf:
      return upper
    eps_of = _epsilon_function(event_of, delta, accountant, orders)
    return _largest_count(lambda n: eps_of(n) <= target_epsilon, lower, upper)
  tolerance = _check_tolerance(tolerance)
  lower = SEARCH_MIN_NOISE if lower is None else check_finite_positive("lower", lower)
  upper = SEARCH_MAX_NOISE if upper is None else check_finite_positive("upper", upper)
  if not upper > lower:
    raise ValueError(f"upper must be > lower={lower!r}, got {upper!r}.")
  if target_epsilon == math.inf or not events.flatten(released(upper)):
    return 0.0  # no noise needed: an infinite budget, or nothing is released
  run = f"at delta={delta!r}" + (f" {context}" if context else "")
  return _smallest_parameter(_epsilon_function(event_of, delta, accountant, orders),
                             target_epsilon, tolerance, run, lower, upper,
                             name or "noise_multiplier")


def _composed_with(event_of, also, target_epsilon, delta, accountant, orders):
  """``event_of`` composed with the events ``also``, after checking they leave some budget."""
  if isinstance(also, events.DpEvent):
    also = (also,)
  try:
    also = tuple(also)
  except TypeError:
    raise TypeError(f"also must be an analysis.events event or an iterable of them, got "
                    f"{also!r}.") from None
  if not also:
    return event_of
  for event in also:
    if not isinstance(event, events.DpEvent):
      raise TypeError(f"also must hold analysis.events events, got {type(event).__name__}.")
  spent = _accountants.make_accountant(accountant, orders=orders).compose(
      events.ComposedEvent(also)).get_epsilon(delta)
  if spent >= target_epsilon:
    raise ValueError(f"target_epsilon={target_epsilon!r} is already spent by the also= events "
                     f"alone (epsilon {spent:.4f} at delta={delta!r}); raise the target or "
                     "their noise.")
  return lambda p: events.ComposedEvent((event_of(p),) + also)


def _epsilon_function(event_of, delta: float, accountant: str, orders):
  """p -> epsilon (nats, upper bound) of ``event_of(p)`` with the named accountant (a fresh one
  per call; over ``orders`` for a Renyi accountant)."""
  cls = _accountants.accountant_class(accountant)
  if orders is None or not hasattr(cls, "epsilon_and_order"):
    def eps_other(sigma: float) -> float:
      return _accountants.make_accountant(accountant, orders=orders).compose(
          event_of(sigma)).get_epsilon(delta)

    return eps_other

  def eps_over(window):
    rdp = _accountants.make_accountant(accountant, orders=window).compose(event_of(sigma_now[0]))
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

  TF Privacy's name, kept as a thin wrapper of :func:`calibrate` (the event of
  :func:`analysis.dp_sgd.dp_sgd_event` with sampling probability q).  Poisson sampling with
  probability q, add-or-remove-one adjacency.  Returns sigma (noise std / clipping norm) with
  eps(sigma) <= ``target_epsilon`` at ``target_delta`` according to
  the accountant, and sigma <= (1 + tolerance) * sigma_min, where sigma_min is the exact
  smallest such value for that accountant (bracketed root search, :func:`calibrate`).

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
  return calibrate(lambda sigma: dp_sgd.dp_sgd_event(sigma, steps, sampling_probability=q),
                   target_epsilon, target_delta, accountant=accountant, orders=orders,
                   tolerance=tolerance, context=f"with q={q!r} over {steps} steps")


def noise_multiplier_for_event(event_of, target_epsilon: float, target_delta: float, *,
                               accountant: str = "rdp", tolerance: float = 1e-4) -> float:
  """Smallest sigma whose event ``event_of(sigma)`` is (target_epsilon, target_delta)-DP.

  :func:`calibrate` with its defaults, kept under this name for its callers: ``event_of`` maps
  a noise multiplier to an :mod:`analysis.events` event whose epsilon does not increase with it
  (e.g. ``lambda s: analysis.dp_sgd.dp_sgd_event(s, steps, ...)``).  Returns sigma in
  [1e-3, 1e4] with eps <= target by the named accountant, at most ``tolerance`` relative
  above the smallest such sigma; 0.0 for an infinite target.

  Raises:
    ValueError: an argument out of range, or a target not met even at sigma = 1e4.
  """
  return calibrate(event_of, target_epsilon, target_delta, accountant=accountant,
                   tolerance=tolerance)


def _check_search(target_epsilon, target_delta, accountant, steps, orders, tolerance):
  """Validates the DP-SGD wrappers' arguments (steps in the accountant's range); returns
  (target_epsilon, target_delta, orders, tolerance)."""
  target_epsilon = check_positive("target_epsilon", target_epsilon)
  target_delta = check_delta("target_delta", target_delta)
  orders = _check_accountant_and_orders(accountant, orders)
  _accountants.check_steps_for(accountant, steps)
  return target_epsilon, target_delta, orders, _check_tolerance(tolerance)


def _check_accountant_and_orders(accountant, orders):
  """The accountant name checked (a registered one) and ``orders`` as a list
  (``DEFAULT_ORDERS`` when None) for a Renyi accountant, or None for one without orders
  (where ``orders`` must be None)."""
  check_choice("accountant", accountant, _accountants.accountant_names())
  orders = _accountants.check_orders_for(accountant, orders)
  if orders is None and _accountants.takes_orders(accountant):
    return list(rdp_accountant.DEFAULT_ORDERS)
  return orders


def _check_tolerance(tolerance) -> float:
  tolerance = check_real("tolerance", tolerance)
  if not 0.0 < tolerance < 1.0:
    raise ValueError(f"tolerance must be in (0, 1), got {tolerance!r}.")
  return tolerance


def _smallest_parameter(eps_of, target_epsilon: float, tolerance: float, run: str,
                        lower: float, upper: float, name: str) -> float:
  """Smallest p in [lower, upper] with eps_of(p) <= target (:func:`calibrate`)."""
  cache: dict[float, float] = {}

  def excess(sigma: float) -> float:
    """log(eps(sigma)) - log(target): > 0 misses the budget, <= 0 meets it."""
    if sigma not in cache:
      eps = eps_of(sigma)
      cache[sigma] = math.inf if eps == math.inf else (
          -math.inf if eps <= 0.0 else math.log(eps) - math.log(target_epsilon))
    return cache[sigma]

  # 1. Bracket: excess(lo) > 0 >= excess(hi).
  hi = min(max(1.0, lower), upper)
  if excess(hi) > 0.0:
    lo = hi
    while True:
      if hi >= upper:
        raise ValueError(
            f"target_epsilon={target_epsilon!r} cannot be met {run} even with "
            f"{name}={upper:g}; "
            "raise target_epsilon (or target_delta), or use fewer steps or a smaller q.")
      hi = min(2.0 * hi, upper)
      if excess(hi) <= 0.0:
        break
      lo = hi
  else:
    while True:
      lo = hi / 2.0
      if lo < lower:
        return hi  # budget met by (almost) no noise: nothing is searched below ``lower``
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

  :func:`calibrate` on :func:`training_event_of`'s event (the one rule shared with the command
  line and ``tf_dpkit``'s budget callback), as in :func:`compute_noise_multiplier`:

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
  event_of, steps = training_event_of(dataset_size, batch_size, epochs, sampling=sampling,
                                      microbatch_size=microbatch_size,
                                      steps_per_epoch=steps_per_epoch)
  target_epsilon, target_delta, orders, tolerance = _check_search(
      target_epsilon, target_delta, accountant, steps, orders, tolerance)
  return calibrate(event_of, target_epsilon, target_delta, accountant=accountant,
                   orders=orders, tolerance=tolerance, context=_training_context(
                       steps, sampling, batch_size, dataset_size))


def training_event_of(dataset_size: int, batch_size: int, epochs: float, *,
                      sampling: str = "poisson", microbatch_size: int = 1,
                      steps_per_epoch: int | None = None):
  """``(event_of, steps)``: the noise multiplier -> event of a DP-SGD training run, and its steps.

  ``event_of(sigma)`` is :func:`analysis.dp_sgd.dp_sgd_event` for ``steps`` steps: for
  ``"poisson"`` and ``"without_replacement"`` ``steps = ceil(epochs * dataset_size /
  batch_size)`` (:func:`steps_for_training`); for ``"shuffle"`` ``ceil(epochs)`` epochs of
  ``steps_per_epoch`` batches (default ``floor(dataset_size / batch_size)``, at least 1).
  Every argument is checked here (``event_of(1.0)`` is built once), so that a search over
  sigma (:func:`calibrate`) starts from valid arguments.

  Raises:
    ValueError: as :func:`steps_for_training` and :func:`analysis.dp_sgd.dp_sgd_event`.
  """
  steps = steps_for_training(dataset_size, batch_size, epochs)
  check_choice("sampling", sampling, dp_sgd.SAMPLINGS)
  if sampling == "shuffle":
    if steps_per_epoch is None:
      steps_per_epoch = max(1, int(dataset_size) // int(batch_size))
    steps_per_epoch = check_count("steps_per_epoch", steps_per_epoch, minimum=1)
    steps = math.ceil(Fraction(check_real("epochs", epochs))) * steps_per_epoch if steps else 0

  def event_of(sigma):
    return dp_sgd.dp_sgd_event(sigma, steps, sampling=sampling, dataset_size=dataset_size,
                               batch_size=batch_size, steps_per_epoch=steps_per_epoch,
                               microbatch_size=microbatch_size)

  event_of(1.0)  # validates every argument before any search
  return event_of, steps


def _training_context(steps, sampling, batch_size, dataset_size) -> str:
  return (f"for {steps} steps of {sampling} batches of {batch_size} from {dataset_size} "
          "examples")
