"""The PATE accountant: composes PATE queries and reports the data-dependent (private),
data-independent (publishable) and smooth-sensitivity-sanitised (publishable) epsilons."""
from __future__ import annotations

import dataclasses
import math
import warnings

import numpy as np
from scipy import optimize

from analysis import _checks, _secrecy
from analysis import accountant_base as _accountant
from analysis import events
from analysis import rdp_accountant
from analysis._numerics import finish as _finish
from analysis.pate._common import _check_beta, _check_order, _laplace_rdp
from analysis.pate._events import (ConfidentGNMaxEvent, GNMaxEvent, InteractiveGNMaxEvent,
                                   LNMaxEvent, PateEvent, _atomic_parts, _ledger_is_gaussian)
from analysis.pate._smooth import _discounted_max, rdp_smooth_sensitivity_release

_MAX_SEARCH_ORDER = 1e4  # upper end of the real-order search

# ------------------------------------------------------------------------------------------
# The accountant.


@dataclasses.dataclass(frozen=True)
class SanitizedEpsilon:
  """The smooth-sensitivity-sanitised privacy cost (every field publishable).

  Attributes:
    epsilon: nats; min of the sanitised value's conversion and the data-independent epsilon.
    delta: the delta it holds at.
    order: the Renyi order it was computed at (fixed in advance by the caller).
    beta, sigma_ss: the GNSS parameters (fixed in advance by the caller).
    sanitized_rdp: the GNSS release of the data-dependent RDP at ``order``, clamped at >= 0.
    release_rdp: the RDP of that release itself (Theorem 23), included in ``epsilon``.
  """
  epsilon: float
  delta: float
  order: float
  beta: float
  sigma_ss: float
  sanitized_rdp: float
  release_rdp: float


@_secrecy.refuse_pickling(
    "every composed query's raw vote histogram (private data)", copies=True,
    instead="Publish its ledger or data_independent_epsilon() instead.")
class PateAccountant(_accountant.Accountant):
  """Composes PATE queries (GNMax, LNMax, Confident and Interactive GNMax) and reports epsilon.

  Each query is a :class:`analysis.pate.PateEvent` (``GNMaxEvent``, ``LNMaxEvent``,
  ``ConfidentGNMaxEvent``, ``InteractiveGNMaxEvent``, ``ThresholdCheckEvent`` or a new
  aggregator's own event class) composed by :meth:`compose`; ``compose_gnmax`` and the other
  ``compose_*`` methods build the event for you.  The accountant sums what each event states
  (data-dependent and data-independent RDP, ledger, local-sensitivity bounds), so a new
  aggregator needs no change here (docs/design/pate.md, "PATE events").

  Each query's actual outcome is composed: the threshold check's cost always, the GNMax cost
  only when the query was answered (as PATE 2018 does: a refused query releases only the
  check).  Composition is the sum of per-query RDP at each order (RDP composition, Mironov 2017,
  Proposition 1, applied to the bounds at the actual data as in PATE 2018).
  Counting the GNMax cost only for answered queries follows the paper; it is the ex-post sum
  of a fully adaptive composition (validated by RDP filters, Feldman & Zrnic 2021, when the
  total is held to a budget fixed in advance).

  What may be published:

  * :attr:`ledger`, :meth:`get_epsilon` / :meth:`get_delta` (the generic
    :class:`analysis.accountant_base.Accountant` interface) and their explicit names
    :meth:`data_independent_epsilon`, :meth:`data_independent_delta`: only noise levels and how many checks and answers there were: the data-independent
    description (GNMax: ``GaussianEvent(sigma / sqrt(2))``; threshold check:
    ``GaussianEvent(sigma1)``; LNMax: ``LaplaceEvent(b / 2)``, L1 sensitivity 2).  The
    answered/refused outcomes it records are outputs of the private mechanism already released
    to the student.
  * :meth:`smooth_sensitivity_epsilon`: the GNSS-sanitised data-dependent epsilon, whose
    release is itself accounted (PATE 2018, Section 4.2).
  * :attr:`queries`, :attr:`answered`, :attr:`orders`.

  What must NOT be published (computed from the teachers' votes, i.e. from the private data):
  :meth:`private_data_dependent_epsilon`, :meth:`private_data_dependent_delta`, :meth:`rdp`
  (unless ``data_independent``) and :meth:`smooth_sensitivity`.  Those are the data-dependent
  quantities (upper bounds on the privacy loss at the actual data, never above the
  data-independent ones); publishing them leaks about the votes.  Code written against the
  generic interface therefore gets the publishable number from :meth:`get_epsilon`.  "pate" is
  not one of :func:`analysis.accountants.make_accountant`'s names.

  The accountant holds every composed histogram, so it cannot be pickled
  (:mod:`analysis._secrecy`); ``copy.deepcopy`` works (an in-process copy releases nothing).

  :meth:`compose` also takes plain events (``GaussianEvent``, ``LaplaceEvent`` and
  ``SelfComposedEvent`` / ``ComposedEvent`` of them), accounted data-independently; sampled
  and shuffled events are refused with :class:`analysis.events.UnsupportedEventError`.  All
  guarantees are for neighbouring data sets whose teachers' data differ in one teacher (one
  vote moved); with the position-based partition of ``tf_dpkit.pate`` that is replacing one
  record (:attr:`neighboring_relation`; docs/design/pate.md, "Notation and units").

  Args:
    orders: RDP orders for the grid, a non-empty sequence each in (1, 1e6]; default
      :data:`analysis.rdp_accountant.DEFAULT_ORDERS`.  Epsilon is minimised over the grid and
      then over real orders around the best grid order.
    num_teachers: integer >= 1 or None.  Used by the smooth sensitivity (the distance at which
      every histogram is in reach); None takes each query's number of votes.  When given, every
      histogram composed must have at most this many votes.
  """

  def __init__(self, orders=None, num_teachers: int | None = None):
    super().__init__()
    alphas, _ = _checks.check_orders(
        "orders", list(rdp_accountant.DEFAULT_ORDERS if orders is None else orders),
        max_finite=rdp_accountant.MAX_ORDER)
    if not np.all(np.isfinite(alphas)):
      raise ValueError("orders must be finite for the PATE accountant (the real-order search "
                       "needs a finite grid), got inf.")
    self._orders = tuple(sorted(set(float(a) for a in alphas)))
    self._num_teachers = (None if num_teachers is None else
                          _checks.check_integer("num_teachers", num_teachers, minimum=1))
    self._parts: list[PateEvent] = []  # the composed queries' atomic parts, in order
    self._gaussian_ledger = True  # every ledger entry a Gaussian release (exact composition)
    self._plain: list[tuple[str, float, int]] = []  # ("gaussian"|"laplace", multiplier, count)
    self._queries = 0
    self._answered = 0
    self._cache: dict = {}

  # -- public counters -----------------------------------------------------------------------

  @property
  def orders(self) -> tuple:
    """The grid of orders."""
    return self._orders

  @property
  def queries(self) -> int:
    """PATE queries composed (each compose_* call or composed :class:`PateEvent`)."""
    return self._queries

  @property
  def answered(self) -> int:
    """Queries answered (:attr:`PateEvent.answered`; GNMax and LNMax queries always are)."""
    return self._answered

  # -- composing queries ---------------------------------------------------------------------

  def _record(self, event: PateEvent) -> None:
    parts: list = []
    _atomic_parts(event, parts)
    gaussian = _ledger_is_gaussian(event)
    self._parts.extend(parts)
    self._events.extend(event.ledger)
    self._gaussian_ledger = self._gaussian_ledger and gaussian
    self._queries += 1
    self._answered += int(bool(event.answered))
    self._cache.clear()

  def compose_gnmax(self, votes, sigma: float) -> "PateAccountant":
    """One GNMax answer on ``votes`` (noise std ``sigma`` > 0, finite); returns self.

    The same as ``compose(GNMaxEvent(votes, sigma))``."""
    return self.compose(GNMaxEvent(votes, sigma))

  def compose_lnmax(self, votes, laplace_scale: float) -> "PateAccountant":
    """One LNMax answer on ``votes`` (Laplace scale ``laplace_scale`` > 0, finite).

    The same as ``compose(LNMaxEvent(votes, laplace_scale))``."""
    return self.compose(LNMaxEvent(votes, laplace_scale))

  def compose_confident_gnmax(self, votes, threshold: float, sigma1: float, sigma2: float,
                              answered: bool) -> "PateAccountant":
    """One Confident GNMax query (PATE 2018, Algorithm 1) with its actual outcome.

    The check ``max votes + N(0, sigma1^2) >= threshold`` is always paid; the GNMax step
    (noise ``sigma2``) only when ``answered`` (a bool) is True.  The same as
    ``compose(ConfidentGNMaxEvent(votes, threshold, sigma1, sigma2, answered))``.
    """
    return self.compose(ConfidentGNMaxEvent(votes, threshold, sigma1, sigma2, answered))

  def compose_interactive_gnmax(self, votes, thresholded_votes, threshold: float,
                                sigma1: float, sigma2: float,
                                answered: bool) -> "PateAccountant":
    """One Interactive GNMax query (PATE 2018, Algorithm 2) with its actual outcome.

    The check runs on ``thresholded_votes`` (= votes - alpha * student probabilities: any
    finite reals, same length as ``votes``); GNMax (noise ``sigma2``) on ``votes`` only when
    ``answered`` is True (a query the student answers itself costs only the check).  The same
    as ``compose(InteractiveGNMaxEvent(votes, thresholded_votes, threshold, sigma1, sigma2,
    answered))``.
    """
    return self.compose(InteractiveGNMaxEvent(votes, thresholded_votes, threshold, sigma1,
                                              sigma2, answered))

  # -- the Accountant interface ----------------------------------------------------------------

  def compose(self, event, count: int = 1) -> "PateAccountant":
    """Adds ``count`` PATE queries or ``count`` runs of a plain event; returns self.

    Args:
      event: a :class:`analysis.pate.PateEvent` (one query with its actual outcome; each of
        the ``count`` runs counts as one query), or a plain :mod:`analysis.events` event
        (``GaussianEvent``, ``LaplaceEvent`` and compositions of them), accounted
        data-independently (class docstring).
      count: integer >= 0.
    """
    if isinstance(event, PateEvent):
      count = _checks.check_steps("count", count)
      event.check_num_teachers(self._num_teachers)
      for _ in range(count):
        self._record(event)
      return self
    if not isinstance(event, events.DpEvent):
      raise ValueError(f"event must be an analysis.pate.PateEvent or an analysis.events "
                       f"event, got {event!r:.80}.")
    count = _checks.check_steps("count", count)
    plain: list = []
    self._plain_parts(event, count, plain)
    self._plain.extend(plain)
    self._events.append(event if count == 1 else events.SelfComposedEvent(event, count))
    self._cache.clear()
    return self

  def _plain_parts(self, event, count: int, out: list) -> None:
    if isinstance(event, events.GaussianEvent):
      if count and not math.isinf(event.noise_multiplier):
        out.append(("gaussian", event.noise_multiplier, count))
    elif isinstance(event, events.LaplaceEvent):
      if count and not math.isinf(event.noise_multiplier):
        out.append(("laplace", event.noise_multiplier, count))
    elif isinstance(event, events.SelfComposedEvent):
      self._plain_parts(event.event, _checks.check_steps("count", count * event.count), out)
    elif isinstance(event, events.ComposedEvent):
      for part in event.events:
        self._plain_parts(part, count, out)
    else:
      raise events.UnsupportedEventError(
          f"PateAccountant composes PATE queries and plain GaussianEvent / LaplaceEvent "
          f"releases (and compositions of them), got {type(event).__name__}; account sampled "
          f"or shuffled releases with analysis.rdp_accountant.RdpAccountant.")

  @property
  def atoms(self) -> tuple:
    """The data-independent Gaussian parts as :class:`analysis.events.Atom` s.

    Raises:
      analysis.events.UnsupportedEventError: the ledger holds Laplace releases (LNMax), which
        are not Gaussian atoms.
    """
    return tuple(events.flatten(self.ledger))

  @property
  def num_teachers(self) -> int | None:
    """The number of teachers given at construction (None: taken from each histogram)."""
    return self._num_teachers

  @property
  def neighboring_relation(self) -> str:
    """``"replace_one"``: one record replaced, which changes one teacher's data under a
    position-based partition (docs/design/pate.md, "Notation and units")."""
    return events.REPLACE_ONE

  def _check_atoms(self, atoms) -> None:  # compose is overridden
    pass

  def get_epsilon(self, delta: float) -> float:
    """PUBLISHABLE epsilon (nats) at ``delta`` in (0, 1): :meth:`data_independent_epsilon`.

    The generic :class:`analysis.accountant_base.Accountant` interface reports a guarantee that
    holds for every data set; the data-dependent bound is :meth:`private_data_dependent_epsilon`.
    """
    return self.data_independent_epsilon(delta)

  def get_delta(self, epsilon: float) -> float:
    """PUBLISHABLE delta at ``epsilon`` >= 0: :meth:`data_independent_delta`."""
    return self.data_independent_delta(epsilon)

  def private_data_dependent_epsilon(self, delta: float) -> float:
    """PRIVATE data-dependent epsilon (nats) at ``delta`` in (0, 1): never publish it.

    min(the data-dependent RDP converted over the grid and over real orders near the best grid
    order (:func:`analysis.rdp_accountant.get_privacy_spent` at each order), the
    data-independent epsilon).  Computed from the votes, so it leaks about the private data
    (class docstring); publish :meth:`get_epsilon` or :meth:`smooth_sensitivity_epsilon`.
    """
    delta = _checks.check_delta("delta", delta)
    if not self._events:
      return 0.0
    eps = self._convert(self._rdp_curve, "dep", target_delta=delta)
    return min(eps, self.data_independent_epsilon(delta))

  def private_data_dependent_delta(self, epsilon: float) -> float:
    """PRIVATE data-dependent delta at ``epsilon`` >= 0 (as
    :meth:`private_data_dependent_epsilon`): never publish it."""
    epsilon = _checks.check_nonnegative("epsilon", epsilon)
    if not self._events:
      return 0.0
    delta = self._convert(self._rdp_curve, "dep", target_eps=epsilon)
    return min(delta, self.data_independent_delta(epsilon))

  def _epsilon(self, delta: float) -> float:  # pragma: no cover - get_epsilon is overridden
    return self.get_epsilon(delta)

  def _delta(self, epsilon: float) -> float:  # pragma: no cover - get_delta is overridden
    return self.get_delta(epsilon)

  def data_independent_epsilon(self, delta: float) -> float:
    """Epsilon (nats) at ``delta`` in (0, 1) that holds for every data set: publishable.

    With only Gaussian parts (no LNMax / Laplace) the ledger is composed exactly by
    :class:`analysis.rdp_accountant.RdpAccountant` (an exact Gaussian composition); otherwise
    the data-independent RDP curve is converted as in :meth:`private_data_dependent_epsilon`.
    """
    delta = _checks.check_delta("delta", delta)
    if not self._events:
      return 0.0
    if not self._has_laplace():
      return rdp_accountant.RdpAccountant(self._orders).compose(self.ledger).get_epsilon(delta)
    return self._convert(self._independent_curve, "indep", target_delta=delta)

  def data_independent_delta(self, epsilon: float) -> float:
    """Delta at ``epsilon`` >= 0 that holds for every data set: publishable."""
    epsilon = _checks.check_nonnegative("epsilon", epsilon)
    if not self._events:
      return 0.0
    if not self._has_laplace():
      return rdp_accountant.RdpAccountant(self._orders).compose(self.ledger).get_delta(epsilon)
    return self._convert(self._independent_curve, "indep", target_eps=epsilon)

  def rdp(self, orders=None, *, data_independent: bool = False):
    """The composed RDP at ``orders`` (default: the grid), nats.

    Data-dependent (PRIVATE) unless ``data_independent``.
    """
    alphas, scalar = _checks.check_orders(
        "orders", list(self._orders) if orders is None else orders)
    curve = self._independent_curve if data_independent else self._rdp_curve
    return _finish(curve(alphas), scalar)

  # -- RDP curves ------------------------------------------------------------------------------

  def _has_laplace(self) -> bool:
    return (not self._gaussian_ledger
            or any(kind == "laplace" for kind, _, _ in self._plain))

  def _plain_curve(self, alphas: np.ndarray) -> np.ndarray:
    total = np.zeros(alphas.shape)
    for kind, multiplier, count in self._plain:
      if kind == "gaussian":
        rdp = (np.full(alphas.shape, np.inf) if multiplier == 0.0
               else alphas / (2.0 * multiplier**2))
      else:
        rdp = _laplace_rdp(1.0 / multiplier, alphas)
      total += count * rdp
    return total

  def _groups(self):
    """The parts grouped for vectorised evaluation: (class, parts) in order of first
    appearance; parts of one class with equal non-None ``batch_key`` share a group."""
    groups: dict = {}
    for i, part in enumerate(self._parts):
      key = part.batch_key
      groups.setdefault((type(part), ("batch", key) if key is not None else ("part", i)),
                        []).append(part)
    return [(klass, parts) for (klass, _), parts in groups.items()]

  def _curve(self, alphas, data_independent: bool) -> np.ndarray:
    """The composed RDP at ``alphas``: plain parts, then each group of PATE parts."""
    alphas = np.asarray(alphas, dtype=np.float64)
    total = self._plain_curve(alphas)
    for klass, parts in self._groups():
      total += (klass.batch_data_independent_rdp(parts, alphas) if data_independent
                else klass.batch_rdp(parts, alphas))
    return total

  def _rdp_curve(self, alphas) -> np.ndarray:
    return self._curve(alphas, False)

  def _independent_curve(self, alphas) -> np.ndarray:
    return self._curve(alphas, True)

  def _convert(self, curve, key: str, *, target_delta=None, target_eps=None) -> float:
    """Grid conversion by get_privacy_spent, then a bounded search over real orders."""
    cache_key = (key, target_delta, target_eps)
    if cache_key in self._cache:
      return self._cache[cache_key]
    grid = np.array(self._orders)
    want_eps = target_delta is not None

    def at(alphas, values):
      with warnings.catch_warnings():
        warnings.simplefilter("ignore", rdp_accountant.OrderAtBoundaryWarning)
        eps, delta, order = rdp_accountant.get_privacy_spent(
            alphas, values, target_eps=target_eps, target_delta=target_delta)
      return (eps if want_eps else delta), order

    best, order = at(grid, curve(grid))
    if order is not None and best > 0.0:
      i = int(np.searchsorted(grid, order))
      lo = grid[i - 1] if i > 0 else 1.0 + (grid[0] - 1.0) * 1e-3
      hi = grid[i + 1] if i + 1 < grid.size else max(_MAX_SEARCH_ORDER, 2.0 * grid[i])

      def objective(u: float) -> float:
        alpha = 1.0 + math.exp(u)
        value = at([alpha], curve(np.array([alpha])))[0]
        if not want_eps:
          value = math.log(value) if value > 0.0 else -1e300
        return value if math.isfinite(value) else 1e300

      result = optimize.minimize_scalar(
          objective, bounds=(math.log(lo - 1.0), math.log(hi - 1.0)), method="bounded",
          options={"xatol": 1e-4})
      alpha = 1.0 + math.exp(float(result.x))
      best = min(best, at([alpha], curve(np.array([alpha])))[0])
    self._cache[cache_key] = float(best)
    return float(best)

  # -- smooth sensitivity ----------------------------------------------------------------------

  def _ls_total(self, order: float) -> np.ndarray:
    """Sum of the parts' U^(d) at ``order`` (parts without a local-sensitivity bound: 0)."""
    arrays = []
    for part in self._parts:
      if part.has_local_sensitivity:
        ls = np.asarray(part.local_sensitivity(order, self._num_teachers), dtype=np.float64)
        if ls.ndim != 1 or ls.size == 0:
          raise ValueError(f"{type(part).__name__}.local_sensitivity must return a non-empty "
                           f"1-D array (U^(d) for d = 0, 1, ...), got shape {ls.shape}.")
        arrays.append(ls)
    if not arrays:
      return np.zeros(1)
    length = max(a.size for a in arrays)
    total = np.zeros(length)
    for a in arrays:  # beyond its length an array's bound is its global maximum (last entry)
      total[:a.size] += a
      total[a.size:] += a[-1]
    return total

  def _sanitizable_rdp(self, order: float) -> float:
    """f(D) at ``order``: data-dependent RDP of the parts with a local-sensitivity bound,
    data-independent RDP of the rest."""
    alphas = np.array([order])
    total = float(self._plain_curve(alphas)[0])
    for klass, parts in self._groups():
      if parts[0].has_local_sensitivity:  # one batch: one kind of event
        total += float(klass.batch_rdp(parts, alphas).sum())
      else:
        total += float(klass.batch_data_independent_rdp(parts, alphas)[0])
    return total

  def smooth_sensitivity(self, beta: float, order: float) -> float:
    """PRIVATE: the beta-smooth sensitivity of the composed data-dependent RDP at ``order``.

    max_d e^(-beta d) sum_i U_i^(d) over the threshold checks and answered GNMax steps (a sum
    of local-sensitivity bounds bounds the local sensitivity of the sum, at every distance).
    LNMax and plain parts enter the sanitised value data-independently and contribute 0.
    """
    beta = _check_beta(beta)
    order = _check_order("order", order)
    return _discounted_max(beta, self._ls_total(order))

  def smooth_sensitivity_epsilon(self, delta: float, beta: float, sigma_ss: float,
                                 order: float, *, rng=None) -> SanitizedEpsilon:
    """The GNSS-sanitised epsilon: publishable (PATE 2018, Section 4.2 and Appendix C).

    Procedure, at an order, beta and sigma_ss the caller fixes WITHOUT looking at the votes
    (choosing them from the data makes the choice itself a leak; the paper tuned them on the
    data and says so):

    1. f = the data-dependent RDP at ``order`` of the threshold checks and answered GNMax steps
       plus the data-independent RDP of LNMax and plain parts;
    2. SS = :meth:`smooth_sensitivity` (beta, order);
    3. sanitized_rdp = max(0, f + SS * z), z ~ N(0, sigma_ss^2) drawn from ``rng`` (the GNSS
       mechanism; clamping is post-processing);
    4. release_rdp = :func:`rdp_smooth_sensitivity_release` (beta, sigma_ss, order): the cost
       of step 3 itself (Theorem 23);
    5. epsilon = the conversion (:func:`analysis.rdp_accountant.get_privacy_spent`) of
       sanitized_rdp + release_rdp at ``order`` and ``delta``, capped by the (public)
       data-independent epsilon.

    The result is a noisy estimate of the privacy cost (the noise is zero-mean; it is not a
    guaranteed upper bound on the data-dependent epsilon), whose publication is private.
    Each call draws fresh noise and is a new release: publish one.

    Args:
      delta: in (0, 1).
      beta: in [0, 1 / (2 order)).
      sigma_ss: finite, > 0.
      order: finite, in (1, 1e6].
      rng: a ``numpy.random.Generator``, an integer seed or None (fresh entropy).
    """
    delta = _checks.check_delta("delta", delta)
    release = rdp_smooth_sensitivity_release(beta, sigma_ss, order)
    order = float(order)
    beta = float(beta)
    sigma_ss = float(sigma_ss)
    if not isinstance(rng, np.random.Generator):
      if rng is not None:
        rng = _checks.check_integer("rng", rng, minimum=0)
      rng = np.random.default_rng(rng)
    smooth = self.smooth_sensitivity(beta, order)
    sanitized = max(0.0, self._sanitizable_rdp(order) + smooth * float(rng.normal(0.0, sigma_ss)))
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", rdp_accountant.OrderAtBoundaryWarning)
      eps, _, _ = rdp_accountant.get_privacy_spent([order], [sanitized + release],
                                                   target_delta=delta)
    eps = min(float(eps), self.data_independent_epsilon(delta)) if self._events else float(eps)
    return SanitizedEpsilon(eps, delta, order, beta, sigma_ss, sanitized, release)
