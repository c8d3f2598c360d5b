"""The statistics of privacy auditing: epsilon lower bounds at a stated confidence; ROC helpers.

An audit runs a mechanism (training) on inputs that differ in "canaries" and lets an attacker
guess which canaries were used.  If the mechanism is (eps, delta)-DP, the attacker cannot
guess too well; guessing better than that, beyond what chance explains at a stated
confidence, proves that the mechanism is NOT (eps, delta)-DP for that eps.  The functions here
turn the attacker's counts into that eps, a LOWER bound on the mechanism's true epsilon.

Contract shared by every bound
------------------------------
For every mechanism that is (eps_true, delta)-DP and every attacker,

    P[bound > eps_true] <= 1 - confidence,

the probability being over the mechanism's and the audit's randomness (canary inclusion,
training).  So a bound above the claimed epsilon refutes the claim at the given confidence.
This holds only if what the attacker does (its score, threshold, number of guesses) is fixed
without looking at which canaries were really included; trying several settings and reporting
the best needs a union bound (run each at confidence 1 - (1 - confidence) / settings).  A bound
is never negative; 0 means nothing can be claimed.  Units: eps in nats.  ``delta`` is in
[0, 1), ``confidence`` in (0, 1); counts are integers (an integral float is accepted).  Bad
arguments raise ``ValueError`` naming the argument and its allowed range.

One training run (Steinke, Nasr & Jagielski 2023)
-------------------------------------------------
"Privacy auditing with one (1) training run" (NeurIPS 2023; arXiv:2305.08846), Theorem 3.1;
the p-value and the bisection are those of the code in the paper's appendix.  Each of ``m``
canaries is included in the input independently with probability 1/2; after one run the
attacker makes ``r`` guesses (e.g. "in" for the k+ highest-scoring canaries, "out" for the
k- lowest; r = k+ + k-) and ``v`` of them are right.  If the mechanism is (eps, delta)-DP in
each canary's inclusion bit, then for every v

    P[W >= v] <= f(v) + 2 m delta max_{i = 1..m} (f(v - i) - f(v)) / i,

    f(u) = P[Binomial(r, p) >= u],   p = e^eps / (1 + e^eps),

W the number of correct guesses (f(u) = 1 for u <= 0; the maximum is attained at i <= v,
since for i > v the numerator stays 1 - f(v)).  The right side, capped at 1, is a p-value
p_eps(v) for the hypothesis "(eps, delta)-DP"; the bound is the largest eps whose hypothesis
is rejected at level 1 - confidence:

    bound = sup{eps >= 0 : p_eps'(v) < 1 - confidence for all eps' in [0, eps]},

found by bisection to ~1e-12 relative (the value returned is the bisection's lower end, at
which the hypothesis is rejected).  For delta = 0 the p-value is the binomial tail f(v), which
increases with eps, so the bound solves f(v) = 1 - confidence (randomized response with
that eps meets the tail exactly: the bound is tight for it).

Monotonicity in eps, which makes the sup above the one crossing and the contract hold
(P[bound > eps_true] <= P[p_eps_true(W) < 1 - confidence] <= 1 - confidence), is shown as
follows.  d f(u) / dp = r b(u - 1) with b the Binomial(r - 1, p) pmf, so each term
f(v) + c (f(v - i) - f(v)) / i, c = 2 m delta, has derivative
r [(1 - c / i) b(v - 1) + (c / i) b(v - i - 1)] >= 0 when c <= i: with 2 m delta <= 1 (the
usual setting, e.g. m = 1000, delta = 1e-5) every term increases and the p-value is exactly
the paper's.  Where 2 m delta > 1, each term with i < c is replaced by the larger
f(v) + (c / i) f(v - i) (dropping -(c / i) f(v) <= 0), which increases in eps: still a valid
p-value, slightly more conservative than the paper's.  The tails are computed on the number
of WRONG guesses, Binomial(r, 1 / (1 + e^eps)), so they keep their precision for large eps.

Many training runs (Jagielski, Ullman & Oprea 2020)
---------------------------------------------------
"Auditing differentially private machine learning: how private is private SGD?" (NeurIPS
2020), Algorithm 2.  The mechanism is run ``positives`` times on the input with the canary
and ``negatives`` times without (all runs independent); a membership test fixed in advance
says "in" ``true_positives`` and ``false_positives`` times respectively.  If the mechanism is
(eps, delta)-DP, for the test's true rates TPR and FPR (Kairouz, Oh & Viswanath 2015,
hypothesis-testing view of DP):

    TPR <= e^eps FPR + delta   and   1 - FPR <= e^eps (1 - TPR) + delta,

so eps >= log((TPR - delta) / FPR) and eps >= log((1 - FPR - delta) / (1 - TPR)).  Both
ratios decrease in FPR and increase in TPR, so only TPR_lo, a lower confidence bound on TPR,
and FPR_hi, an upper one on FPR, enter:

    bound = max(0, log((TPR_lo - delta) / FPR_hi), log((1 - FPR_hi - delta) / (1 - TPR_lo)))

(a form whose numerator is <= 0 gives nothing; the denominators are > 0, a Clopper-Pearson
upper bound being > 0 and a lower bound < 1).  How the confidence is split: with
alpha = 1 - confidence, each rate gets the two-sided Clopper-Pearson interval at the given
confidence (:func:`clopper_pearson`, alpha / 2 in each tail), of which one end is used; so
P[TPR < TPR_lo] <= alpha / 2 and P[FPR > FPR_hi] <= alpha / 2, and by the union bound both
hold with probability >= confidence, on which event both forms are <= eps_true together.
(The complement form with the other ends, (1 - FPR_lo - delta) / (1 - TPR_hi), would be an
UPPER confidence bound on the ratio: not sound.)  The complement form is the
first form of the same test with the two inputs' roles swapped (tp' = negatives -
false_positives, fp' = positives - true_positives); it is the better one when the test's
misses are rarer than its hits on non-members, e.g. a test that says "in" most of the time.

Membership-inference ROC
------------------------
Convention: a LARGER score means "member"; the test with threshold t says "member" when
score >= t.  ``roc_curve`` lists every distinct threshold; ``roc_auc`` is the area under that
curve (trapezoids), which equals P[S_member > S_nonmember] + P[S_member = S_nonmember] / 2;
``tpr_at_fpr`` reads the curve at a false-positive rate (its docstring states the rule).
These are point estimates with no confidence statement: for a bound, fix the threshold on
other data and pass the counts to :func:`epsilon_lower_bound`.

No TensorFlow import; numpy and scipy only.
"""
from __future__ import annotations

import math

import numpy as np
from scipy import special, stats

from analysis import _checks

__all__ = [
    "clopper_pearson",
    "epsilon_lower_bound",
    "max_one_run_epsilon_lower_bound",
    "one_run_epsilon_lower_bound",
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
  positives = _checks.check_count("positives", positives, minimum=1)
  true_positives = _check_count_at_most("true_positives", true_positives, "positives",
                                        positives)
  negatives = _checks.check_count("negatives", negatives, minimum=1)
  false_positives = _check_count_at_most("false_positives", false_positives, "negatives",
                                         negatives)
  delta = _check_delta_half_open(delta)
  confidence = _checks.check_delta("confidence", confidence)
  tpr_lo = clopper_pearson(true_positives, positives, confidence)[0]
  fpr_hi = clopper_pearson(false_positives, negatives, confidence)[1]
  bound = 0.0
  for numerator, denominator in ((tpr_lo - delta, fpr_hi), (1.0 - fpr_hi - delta, 1.0 - tpr_lo)):
    if numerator > 0.0 and denominator > 0.0:
      bound = max(bound, math.log(numerator) - math.log(denominator))
  return float(bound)


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
