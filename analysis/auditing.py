"""The statistics of privacy auditing: epsilon lower bounds at a stated confidence; ROC helpers.

An audit lets an attacker guess which "canaries" a mechanism (training) used; guessing better
than an (eps, delta)-DP mechanism allows, beyond chance at the stated confidence, refutes the
claim.  Every bound here is a LOWER bound with ``P[bound > true value] <= 1 - confidence``,
provided the attacker's score, threshold and number of guesses are fixed without looking at
the true inclusion bits.  Units: eps in nats; bad arguments raise ``ValueError`` naming the
argument and its allowed range.  The maths (theorems, monotonicity, confidence splits) is in
docs/design/auditing.md:

* one run, (eps, delta)-DP: Steinke, Nasr & Jagielski 2023 (:func:`one_run_epsilon_lower_bound`);
* one run, f-DP: Mahloujifar, Melis & Chaudhuri 2024 (:func:`one_run_fdp_p_value`,
  :func:`one_run_gdp_lower_bound`, :func:`one_run_fdp_epsilon_lower_bound`);
* many runs: Jagielski, Ullman & Oprea 2020 (:func:`epsilon_lower_bound`), and the Gaussian
  (mu-GDP) reading of the same counts (:func:`gdp_lower_bound`, Nasr et al. 2023);
* membership-inference ROC helpers (point estimates, no confidence statement).

No TensorFlow import; numpy and scipy only.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import special, stats

from analysis import _checks
from analysis import gaussian as _gaussian

__all__ = [
    "clopper_pearson",
    "epsilon_lower_bound",
    "gdp_lower_bound",
    "max_one_run_epsilon_lower_bound",
    "one_run_epsilon_lower_bound",
    "one_run_fdp_epsilon_lower_bound",
    "one_run_fdp_p_value",
    "one_run_gdp_lower_bound",
    "one_run_p_value",
    "roc_auc",
    "roc_curve",
    "tpr_at_fpr",
]

_BISECTION_REL_TOL = 1e-12
_MAX_EPSILON_SEARCH = 4096.0  # p_eps(v) -> 1 well before: 1 / (1 + e^eps) underflows near 745


# ------------------------------------------------------------------------------------------
# Argument checks (built on analysis._checks, same message style).


def _check_delta_half_open(value) -> float:
  """``delta`` in [0, 1)."""
  value = _checks.check_real("delta", value, allow_nan=True)
  if not 0.0 <= value < 1.0:
    raise ValueError(f"delta must be in [0, 1), got {_checks._describe(value)}.")
  return value


def _check_count_at_most(name: str, value, bound_name: str, bound: int) -> int:
  """An integer in [0, bound], the upper end named after the argument it comes from."""
  value = _checks.check_count(name, value)
  if value > bound:
    raise ValueError(f"{name} must be an integer in [0, {bound_name}] = [0, {bound}], got "
                     f"{_checks._describe(value)}.")
  return value


def _check_scores(name: str, scores) -> np.ndarray:
  """A non-empty 1-D list/tuple/array of real scores in [-inf, inf) (+inf would tie with the
  threshold +inf that calls nobody a member)."""
  _checks.check_same_length(**{name: scores})
  try:
    array = np.asarray(scores, dtype=np.float64)
  except (TypeError, ValueError):
    raise ValueError(f"{name} must hold real numbers, got {_checks._describe(scores)}.") from None
  if array.size == 0:
    raise ValueError(f"{name} must hold at least one score, got an empty sequence.")
  bad = np.isnan(array) | (array == math.inf)
  if bad.any():
    raise ValueError(f"{name} must hold real numbers in [-inf, inf), got "
                     f"{array[bad][0]} at index {int(np.argmax(bad))}.")
  return array


# ------------------------------------------------------------------------------------------
# One training run: Steinke, Nasr & Jagielski 2023.


def _one_run_p_value(m: int, r: int, v: int, eps: float, delta: float) -> float:
  """p_eps(v) of the module docstring (arguments already checked)."""
  if v == 0:
    return 1.0
  wrong = special.expit(-eps)  # P[a guess is wrong] for eps-randomized response
  # f(v) = P[correct >= v] = P[wrong guesses <= r - v].
  tail = float(stats.binom.cdf(r - v, r, wrong))
  if delta == 0.0:
    return min(tail, 1.0)
  c = 2.0 * m * delta
  # g_i = f(v - i) - f(v) = P[r - v + 1 <= wrong <= r - v + i], i = 1..v.
  pmf = stats.binom.pmf(np.arange(r - v + 1, r + 1), r, wrong)
  g = np.cumsum(pmf)
  i = np.arange(1, v + 1, dtype=np.float64)
  terms = g / i
  small = i < c  # replaced by the monotone f(v - i) / i (module docstring)
  terms[small] = (tail + g[small]) / i[small]
  return float(min(tail + c * float(np.max(terms)), 1.0))


def _check_one_run(num_canaries, num_guesses, num_correct, delta, confidence):
  m = _checks.check_count("num_canaries", num_canaries)
  r = _check_count_at_most("num_guesses", num_guesses, "num_canaries", m)
  v = _check_count_at_most("num_correct", num_correct, "num_guesses", r)
  delta = _check_delta_half_open(delta)
  confidence = _checks.check_delta("confidence", confidence)
  return m, r, v, delta, confidence


def one_run_p_value(num_canaries: int, num_guesses: int, num_correct: int, epsilon: float,
                    delta: float = 0.0) -> float:
  """p-value of "the mechanism is (epsilon, delta)-DP" given ``num_correct`` of ``num_guesses``.

  Steinke, Nasr & Jagielski 2023, Theorem 3.1 (module docstring):
  ``min(1, f(v) + 2 m delta max_i (f(v - i) - f(v)) / i)`` with
  ``f(u) = P[Binomial(r, e^eps / (1 + e^eps)) >= u]`` (for 2 m delta > 1 the terms with
  i < 2 m delta use f(v - i) / i instead, see the module docstring).  Non-decreasing in
  ``epsilon``.

  Args:
    num_canaries: m, integer >= 0 (each included independently with probability 1/2).
    num_guesses: r, integer in [0, num_canaries].
    num_correct: v, integer in [0, num_guesses].
    epsilon: the hypothesised eps, in [0, inf] (nats).
    delta: the hypothesised delta, in [0, 1).
  """
  m, r, v, delta, _ = _check_one_run(num_canaries, num_guesses, num_correct, delta, 0.5)
  epsilon = _checks.check_nonnegative("epsilon", epsilon)
  return _one_run_p_value(m, r, v, epsilon, delta)


def one_run_epsilon_lower_bound(num_canaries: int, num_guesses: int, num_correct: int,
                                delta: float = 0.0, confidence: float = 0.95) -> float:
  """Epsilon lower bound from one training run (Steinke, Nasr & Jagielski 2023, Theorem 3.1).

  The largest eps (nats) such that the hypothesis "(eps', delta)-DP" is rejected at level
  ``1 - confidence`` by :func:`one_run_p_value` for every eps' <= eps; 0 when even eps = 0 is
  not rejected (e.g. guesses at chance).  If the mechanism is (eps_true, delta)-DP in each
  canary's inclusion, ``P[bound > eps_true] <= 1 - confidence``, provided the guesses (and
  their number) do not depend on which canaries were included (module docstring).

  Args:
    num_canaries: m, integer >= 0: canaries, each included independently with probability 1/2.
    num_guesses: r, integer in [0, num_canaries]: guesses made (abstentions excluded).
    num_correct: v, integer in [0, num_guesses]: correct guesses.
    delta: in [0, 1).
    confidence: in (0, 1), e.g. 0.95.
  """
  m, r, v, delta, confidence = _check_one_run(num_canaries, num_guesses, num_correct, delta,
                                              confidence)
  level = 1.0 - confidence
  if _one_run_p_value(m, r, v, 0.0, delta) >= level:
    return 0.0
  low, high = 0.0, 1.0
  while _one_run_p_value(m, r, v, high, delta) < level:
    low, high = high, 2.0 * high
    if high > _MAX_EPSILON_SEARCH:
      return low
  while high - low > _BISECTION_REL_TOL * high:
    mid = 0.5 * (low + high)
    if _one_run_p_value(m, r, v, mid, delta) < level:
      low = mid
    else:
      high = mid
  return float(low)


def max_one_run_epsilon_lower_bound(num_canaries: int, num_guesses: int, delta: float = 0.0,
                                    confidence: float = 0.95) -> float:
  """The largest bound :func:`one_run_epsilon_lower_bound` can give with ``num_guesses``
  guesses: the bound when all of them are correct (the bound increases with num_correct).

  For delta = 0 it is the eps solving p^r = 1 - confidence, p = e^eps / (1 + e^eps), i.e.
  ``log(x / (1 - x))`` with ``x = (1 - confidence)^(1 / r)``: the most that ``r`` guesses can
  ever show.  Arguments as for :func:`one_run_epsilon_lower_bound`.
  """
  return one_run_epsilon_lower_bound(num_canaries, num_guesses, num_guesses, delta, confidence)


# ------------------------------------------------------------------------------------------
# One training run, f-DP: Mahloujifar, Melis & Chaudhuri 2024.

FDP_FAMILIES = ("gaussian", "epsilon_delta")
_MAX_MU_SEARCH = 64.0  # Phi(Phi^-1(y) - mu) underflows to 0 for every y < 1 well before


def _gdp_inverse_blow_up(mu: float):
  """y -> Phi(Phi^-1(y) - mu): the least probability under one input of an event whose
  probability under its neighbour is y, for a mu-GDP mechanism (design doc)."""
  if math.isinf(mu):
    return lambda y: 1.0 if y >= 1.0 else 0.0
  return lambda y: float(special.ndtr(special.ndtri(y) - mu))


def _dp_inverse_blow_up(epsilon: float, delta: float):
  """The same for the (eps, delta)-DP tradeoff curve:
  y -> max(0, (y - delta) e^-eps, 1 - delta - e^eps (1 - y))."""
  shrink = math.exp(-epsilon)
  def inverse(y):
    best = max(0.0, (y - delta) * shrink)
    if y < 1.0 and epsilon < 700.0:
      best = max(best, 1.0 - delta - math.exp(epsilon) * (1.0 - y))
    elif y >= 1.0:
      best = max(best, 1.0 - delta)
    return best
  return inverse


def _fdp_feasible(m: int, r: int, v: int, tau: float, inverse_blow_up) -> bool:
  """Whether an f-DP mechanism can give ``>= v`` of ``r`` guesses right with probability
  ``tau`` (design doc, "the recursion"): builds the least total probability mass
  ``(m / r) (R_0 + H_0)`` any distribution of the number of correct guesses with
  ``P[N >= v] = tau`` needs, and compares it with 1."""
  cap = r / m
  right, wrong = tau * v / m, tau * (r - v) / m
  if right + wrong > cap:
    return False
  for i in range(v - 1, -1, -1):
    new_wrong = max(wrong, inverse_blow_up(right))
    right += i / (r - i) * (new_wrong - wrong)
    wrong = new_wrong
    if right + wrong > cap:
      return False
  return True


def _check_fdp_one_run(num_canaries, num_guesses, num_correct, confidence):
  m = _checks.check_count("num_canaries", num_canaries, minimum=1)
  r = _check_count_at_most("num_guesses", num_guesses, "num_canaries", m)
  v = _check_count_at_most("num_correct", num_correct, "num_guesses", r)
  confidence = _checks.check_delta("confidence", confidence)
  return m, r, v, confidence


def one_run_fdp_p_value(num_canaries: int, num_guesses: int, num_correct: int, *,
                        mu: float | None = None, epsilon: float | None = None,
                        delta: float = 0.0) -> float:
  """p-value of "the mechanism is f-DP" given ``num_correct`` of ``num_guesses`` correct
  (Mahloujifar, Melis & Chaudhuri 2024; docs/design/auditing.md).

  The largest ``P[N >= v]`` that any f-DP mechanism and any attacker making ``r`` guesses
  (each of the ``m`` canaries included independently w.p. 1/2) can reach, found by bisection
  on ``tau`` over the paper's recursion (to ~1e-12 absolute); 1 when ``v = 0``.  The
  curve ``f`` is mu-GDP (``mu``) or (eps, delta)-DP (``epsilon``, ``delta``); give exactly
  one of ``mu`` and ``epsilon``.  Non-decreasing in ``mu`` / ``epsilon`` / ``delta``.
  Closed form: m = r = v = 1 gives the best accuracy of one test, ``Phi(mu / 2)`` and
  ``(e^eps + delta) / (1 + e^eps)``.

  Args:
    num_canaries: m, integer >= 1.
    num_guesses: r, integer in [0, m].
    num_correct: v, integer in [0, r].
    mu: the hypothesised mu of mu-GDP, in [0, inf].
    epsilon: the hypothesised eps, in [0, inf] (with ``delta``).
    delta: in [0, 1), only with ``epsilon``.
  """
  m, r, v, _ = _check_fdp_one_run(num_canaries, num_guesses, num_correct, 0.5)
  inverse = _inverse_blow_up_from(mu, epsilon, delta)
  if v == 0 or _fdp_feasible(m, r, v, 1.0, inverse):
    return 1.0
  low, high = 0.0, 1.0
  while high - low > 1e-12:
    mid = 0.5 * (low + high)
    if _fdp_feasible(m, r, v, mid, inverse):
      low = mid
    else:
      high = mid
  return float(high)


def _inverse_blow_up_from(mu, epsilon, delta):
  if (mu is None) == (epsilon is None):
    raise ValueError(f"give exactly one of mu (mu-GDP) and epsilon ((epsilon, delta)-DP), got "
                     f"mu={mu!r} and epsilon={epsilon!r}.")
  if mu is not None:
    if delta != 0.0:
      raise ValueError(f"delta goes with epsilon, not with mu; got delta={delta!r}.")
    return _gdp_inverse_blow_up(_checks.check_nonnegative("mu", mu))
  return _dp_inverse_blow_up(_checks.check_nonnegative("epsilon", epsilon),
                             _check_delta_half_open(delta))


def _largest_rejected(rejected, high_limit: float) -> float:
  """sup{x >= 0: rejected(x') for all x' in [0, x]} for a ``rejected`` that turns False once
  and stays False (bisection to ~1e-12 relative; the returned end is rejected)."""
  if not rejected(0.0):
    return 0.0
  low, high = 0.0, 1.0
  while rejected(high):
    low, high = high, 2.0 * high
    if high > high_limit:
      return low
  while high - low > _BISECTION_REL_TOL * high:
    mid = 0.5 * (low + high)
    if rejected(mid):
      low = mid
    else:
      high = mid
  return float(low)


def one_run_gdp_lower_bound(num_canaries: int, num_guesses: int, num_correct: int,
                            confidence: float = 0.95) -> float:
  """Lower bound on mu from one run: the mechanism is not mu'-GDP for any mu' below it.

  The largest mu such that "mu'-GDP" is rejected at level ``1 - confidence`` by
  :func:`one_run_fdp_p_value` for every mu' <= mu (bisection, ~1e-12 relative; 0 when
  0-GDP is not rejected).  If the mechanism is mu_true-GDP in each canary's inclusion bit,
  ``P[bound > mu_true] <= 1 - confidence`` for guesses fixed without the bits.

  Args: as for :func:`one_run_epsilon_lower_bound` (``num_canaries`` >= 1).
  """
  m, r, v, confidence = _check_fdp_one_run(num_canaries, num_guesses, num_correct, confidence)
  tau = 1.0 - confidence
  return _largest_rejected(
      lambda mu: not _fdp_feasible(m, r, v, tau, _gdp_inverse_blow_up(mu)), _MAX_MU_SEARCH)


def one_run_fdp_epsilon_lower_bound(num_canaries: int, num_guesses: int, num_correct: int,
                                    delta: float, confidence: float = 0.95,
                                    family: str = "gaussian") -> float:
  """Epsilon lower bound from one run by the f-DP audit (Mahloujifar, Melis & Chaudhuri 2024).

  ``family="gaussian"`` (the paper's choice, as for DP-SGD): the eps at ``delta`` of
  mu-GDP for mu = :func:`one_run_gdp_lower_bound`, i.e. ``analysis.gaussian.epsilon_for_delta
  (1 / mu, delta)``.  It refutes every Gaussian-shaped guarantee with that (eps, delta): sound
  for mechanisms whose tradeoff curve is Gaussian (DP-SGD without sampling; with sampling the
  curve is close to Gaussian), not for an arbitrary (eps, delta) claim.
  ``family="epsilon_delta"``: the largest eps such that the (eps', delta)-DP tradeoff curve is
  rejected for every eps' <= eps: valid against any (eps, delta)-DP mechanism.
  In both, ``P[bound > eps_true] <= 1 - confidence`` for guesses fixed without the bits.

  Args:
    num_canaries: m >= 1.
    num_guesses: r in [0, m].
    num_correct: v in [0, r].
    delta: in (0, 1) for "gaussian" (mu-GDP is not (eps, 0)-DP for any finite eps), [0, 1)
      for "epsilon_delta".
    confidence: in (0, 1).
    family: ``"gaussian"`` or ``"epsilon_delta"``.
  """
  family = _checks.check_choice("family", family, FDP_FAMILIES)
  m, r, v, confidence = _check_fdp_one_run(num_canaries, num_guesses, num_correct, confidence)
  if family == "gaussian":
    delta = _checks.check_delta("delta", delta)
    mu = one_run_gdp_lower_bound(m, r, v, confidence)
    return 0.0 if mu == 0.0 else _gaussian.epsilon_for_delta(1.0 / mu, delta)
  delta = _check_delta_half_open(delta)
  tau = 1.0 - confidence
  return _largest_rejected(
      lambda eps: not _fdp_feasible(m, r, v, tau, _dp_inverse_blow_up(eps, delta)),
      _MAX_EPSILON_SEARCH)


# ------------------------------------------------------------------------------------------
# Many training runs: Clopper-Pearson and Jagielski, Ullman & Oprea 2020.


def clopper_pearson(successes: int, trials: int, confidence: float = 0.95) -> tuple[float, float]:
  """Exact (Clopper-Pearson 1934) two-sided interval for a binomial proportion.

  With alpha = 1 - confidence, ``low`` is the alpha/2 quantile of Beta(k, n - k + 1) (0 when
  k = 0) and ``high`` the 1 - alpha/2 quantile of Beta(k + 1, n - k) (1 when k = n): each
  side fails with probability <= alpha/2 whatever the true proportion, so the interval covers
  it with probability >= confidence.  Closed forms: k = 0 gives high = 1 - (alpha/2)^(1/n),
  k = n gives low = (alpha/2)^(1/n).  ``high`` is computed as 1 - (the alpha/2 quantile of
  Beta(n - k, k + 1)), which keeps its precision when it is close to 1.

  Args:
    successes: k, integer in [0, trials].
    trials: n, integer >= 1.
    confidence: in (0, 1).

  Returns:
    ``(low, high)``, 0 <= low < high <= 1.
  """
  n = _checks.check_count("trials", trials, minimum=1)
  k = _check_count_at_most("successes", successes, "trials", n)
  confidence = _checks.check_delta("confidence", confidence)
  half = 0.5 * (1.0 - confidence)
  low = 0.0 if k == 0 else float(special.betaincinv(k, n - k + 1, half))
  high = 1.0 if k == n else 1.0 - float(special.betaincinv(n - k, k + 1, half))
  return low, high


def epsilon_lower_bound(true_positives: int, positives: int, false_positives: int,
                        negatives: int, delta: float = 0.0, confidence: float = 0.95) -> float:
  """Epsilon lower bound from repeated runs (Jagielski, Ullman & Oprea 2020, Algorithm 2).

  ``max(0, log((TPR_lo - delta) / FPR_hi), log((1 - FPR_hi - delta) / (1 - TPR_lo)))`` in nats,
  where TPR_lo = clopper_pearson(true_positives, positives, confidence)[0] and
  FPR_hi = clopper_pearson(false_positives, negatives, confidence)[1]: each fails with
  probability <= (1 - confidence) / 2, so both hold with probability >= confidence (union
  bound; the split is even between the two rates).  A form whose numerator is <= 0
  contributes nothing.  If the mechanism is (eps_true, delta)-DP and the runs are
  independent, ``P[bound > eps_true] <= 1 - confidence`` (module docstring), provided the
  membership test was fixed without these runs.

  Args:
    true_positives: integer in [0, positives]: runs WITH the canary the test called "member".
    positives: integer >= 1: runs with the canary.
    false_positives: integer in [0, negatives]: runs WITHOUT the canary called "member".
    negatives: integer >= 1: runs without the canary.
    delta: in [0, 1).
    confidence: in (0, 1), overall.
  """
  true_positives, positives, false_positives, negatives = _check_run_counts(
      true_positives, positives, false_positives, negatives)
  delta = _check_delta_half_open(delta)
  confidence = _checks.check_delta("confidence", confidence)
  tpr_lo = clopper_pearson(true_positives, positives, confidence)[0]
  fpr_hi = clopper_pearson(false_positives, negatives, confidence)[1]
  bound = 0.0
  for numerator, denominator in ((tpr_lo - delta, fpr_hi), (1.0 - fpr_hi - delta, 1.0 - tpr_lo)):
    if numerator > 0.0 and denominator > 0.0:
      bound = max(bound, math.log(numerator) - math.log(denominator))
  return float(bound)


def _check_run_counts(true_positives, positives, false_positives, negatives):
  """The four counts of a many-run audit, checked (positives, negatives >= 1; each count of
  "member" calls within its total)."""
  positives = _checks.check_count("positives", positives, minimum=1)
  true_positives = _check_count_at_most("true_positives", true_positives, "positives",
                                        positives)
  negatives = _checks.check_count("negatives", negatives, minimum=1)
  false_positives = _check_count_at_most("false_positives", false_positives, "negatives",
                                         negatives)
  return true_positives, positives, false_positives, negatives


def gdp_lower_bound(true_positives: int, positives: int, false_positives: int,
                    negatives: int, confidence: float = 0.95) -> float:
  """Lower bound on mu from repeated runs, reading the counts through mu-GDP (Nasr et al. 2023).

  A mu-GDP mechanism lets no test exceed ``TPR = Phi(Phi^-1(FPR) + mu)`` (Dong, Roth & Su
  2022), so ``mu >= Phi^-1(TPR) - Phi^-1(FPR)``; with the Clopper-Pearson ends of
  :func:`epsilon_lower_bound` (TPR_lo, FPR_hi, each failing w.p. <= (1 - confidence) / 2):

      bound = max(0, Phi^-1(TPR_lo) - Phi^-1(FPR_hi)),

  and ``P[bound > mu_true] <= 1 - confidence`` for a mu_true-GDP mechanism and a test fixed
  without these runs.  ``analysis.gaussian.epsilon_for_delta(1 / bound, delta)`` is the eps
  of that Gaussian curve at delta; it refutes Gaussian-shaped claims (the mechanism's curve
  must be Gaussian, as for DP-SGD without sampling), while :func:`epsilon_lower_bound`
  refutes any (eps, delta) claim.  Arguments as for :func:`epsilon_lower_bound`.
  """
  true_positives, positives, false_positives, negatives = _check_run_counts(
      true_positives, positives, false_positives, negatives)
  confidence = _checks.check_delta("confidence", confidence)
  tpr_lo = clopper_pearson(true_positives, positives, confidence)[0]
  fpr_hi = clopper_pearson(false_positives, negatives, confidence)[1]
  if tpr_lo <= 0.0 or fpr_hi >= 1.0:
    return 0.0
  return float(max(0.0, special.ndtri(tpr_lo) - special.ndtri(fpr_hi)))


# ------------------------------------------------------------------------------------------
# Membership-inference ROC (larger score = "member").


def roc_curve(scores_members, scores_nonmembers) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """ROC of the tests "member iff score >= t" over every threshold t.

  Args:
    scores_members: non-empty 1-D sequence of the members' scores, reals in [-inf, inf).
    scores_nonmembers: the same for non-members.

  Returns:
    ``(fpr, tpr, thresholds)``: ``thresholds`` starts at +inf (nobody called a member: the
    point (0, 0)) followed by every distinct score in decreasing order; ``fpr[j]`` and
    ``tpr[j]`` are the fractions of non-members and members with score >= thresholds[j]
    (so the first point is (0, 0)).  Both are non-decreasing and end at 1 (the lowest score).
    Ties between a member and a non-member give a diagonal segment.
  """
  members = _check_scores("scores_members", scores_members)
  nonmembers = _check_scores("scores_nonmembers", scores_nonmembers)
  thresholds = np.concatenate([[math.inf], np.unique(np.concatenate([members, nonmembers]))[::-1]])
  # Number of scores >= t: len - (number < t), by binary search on the sorted scores.
  def _rate(scores):
    return (scores.size - np.searchsorted(np.sort(scores), thresholds, side="left")) / scores.size
  fpr, tpr = _rate(nonmembers), _rate(members)
  return fpr, tpr, thresholds


def roc_auc(scores_members, scores_nonmembers) -> float:
  """Area under :func:`roc_curve` (trapezoidal rule), in [0, 1].

  Equals the Mann-Whitney statistic P[S_m > S_n] + P[S_m = S_n] / 2 for S_m, S_n drawn
  uniformly from the member and non-member scores (ties count one half).  Arguments as for
  :func:`roc_curve`.
  """
  fpr, tpr, _ = roc_curve(scores_members, scores_nonmembers)
  return float(np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1]) * 0.5))


def tpr_at_fpr(scores_members, scores_nonmembers, fpr: float,
               interpolation: str = "step") -> float:
  """True-positive rate of the membership test at a false-positive rate (larger = member).

  Rules:
    ``"step"`` (default): the largest TPR over the deterministic threshold tests of
      :func:`roc_curve` whose FPR is <= ``fpr`` (at least the (0, 0) test): what a single
      threshold achieves without exceeding the FPR.
    ``"linear"``: the ROC curve linearly interpolated at ``fpr`` (what a test randomising
      between the two neighbouring thresholds achieves), >= the step value.

  Args:
    scores_members: as for :func:`roc_curve`.
    scores_nonmembers: as for :func:`roc_curve`.
    fpr: the false-positive rate, in [0, 1].
    interpolation: ``"step"`` or ``"linear"``.
  """
  target = _checks.check_probability("fpr", fpr)
  _checks.check_choice("interpolation", interpolation, ("step", "linear"))
  rates_fp, rates_tp, _ = roc_curve(scores_members, scores_nonmembers)
  if interpolation == "step":
    return float(np.max(rates_tp[rates_fp <= target]))
  # The curve at ``target``: the top of the points with that FPR, and of the segments
  # (point j to j + 1, FPR strictly increasing) that cross it.
  candidates = [rates_tp[rates_fp == target]]
  j = np.nonzero((rates_fp[:-1] < target) & (target < rates_fp[1:]))[0]
  slope = (rates_tp[j + 1] - rates_tp[j]) / (rates_fp[j + 1] - rates_fp[j])
  candidates.append(rates_tp[j] + slope * (target - rates_fp[j]))
  return float(np.max(np.concatenate(candidates)))
