"""Audits: turn an attacker's success into a statistically valid lower bound on epsilon.

* :func:`one_run_audit` (Steinke, Nasr & Jagielski 2023): m canaries, each in the training set
  with probability 1/2, ONE training run, one score per canary.  The auditor guesses the
  ``num_guesses / 2`` highest-scored canaries "included" and the ``num_guesses / 2`` lowest
  "excluded" (abstaining on the rest) and counts the correct guesses v; if the training run is
  (eps, delta)-DP, v is stochastically dominated by a binomial with success probability
  e^eps / (1 + e^eps) (plus a delta term), which :func:`analysis.auditing.one_run_epsilon_lower_bound`
  inverts at the given confidence; the same count also gives the f-DP bound of Mahloujifar,
  Melis & Chaudhuri 2024 (:func:`analysis.auditing.one_run_gdp_lower_bound`, tighter for
  Gaussian mechanisms such as DP-SGD).  The bounds hold for any score and any number of
  guesses fixed before the inclusion bits are looked at.
* :func:`many_run_audit` (Jagielski, Ullman & Oprea 2020): repeated trainings with and without
  one canary; a threshold on the score chosen on one half of the runs, the true- and
  false-positive counts of the other half turned into Clopper-Pearson bounds
  (:func:`analysis.auditing.epsilon_lower_bound`).
* :func:`membership_inference_report`: the usual loss-threshold attack numbers (ROC AUC, TPR at
  low FPR); descriptive, not a bound.

A lower bound above the epsilon the accountant claims means the code that ran is not the
mechanism that was accounted (or the confidence event failed, with probability at most
``1 - confidence``).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from analysis import _checks
from analysis import auditing as _stats


@dataclasses.dataclass(frozen=True)
class OneRunAudit:
  """Result of :func:`one_run_audit`.

  Attributes:
    epsilon_lower_bound: eps such that the run is not (eps', delta)-DP for any eps' < eps,
      at the stated confidence (nats, >= 0).
    max_epsilon_lower_bound: the bound had every guess been correct (the most this audit can
      show with ``num_guesses`` guesses).
    num_canaries, num_guesses, num_correct: m, r and v.
    delta, confidence: as given.
    gdp_mu_lower_bound: the f-DP audit's bound (Mahloujifar, Melis & Chaudhuri 2024) on the
      same guesses: the run is not mu'-GDP for any mu' below it, at the stated confidence.
    fdp_epsilon_lower_bound: that mu's epsilon at ``delta`` (Gaussian tradeoff curves only;
      docs/design/auditing.md); None when ``delta`` is 0.
  """
  epsilon_lower_bound: float
  max_epsilon_lower_bound: float
  num_canaries: int
  num_guesses: int
  num_correct: int
  delta: float
  confidence: float
  gdp_mu_lower_bound: float = 0.0
  fdp_epsilon_lower_bound: float | None = None


def one_run_audit(scores, included, num_guesses: int, *, delta: float = 0.0,
                  confidence: float = 0.95) -> OneRunAudit:
  """The one-run audit's guesses and epsilon lower bound (module doc).

  Args:
    scores: float ``[m]``, one score per canary, higher meaning "more likely included"
      (e.g. :func:`tf_dpkit.auditing.canary_scores`).
    included: bool ``[m]``, the true inclusion bits (each drawn w.p. 1/2).
    num_guesses: r, an even integer in ``[2, m]``: ``r / 2`` guesses "in" (the highest scores)
      and ``r / 2`` "out" (the lowest); ties are broken by canary index (lower index first in
      each direction), a rule fixed in advance.
    delta: in [0, 1), the delta of the guarantee being audited.
    confidence: in (0, 1), the probability with which the bound holds.
  """
  scores = np.asarray(scores, np.float64)
  included = np.asarray(included)
  if scores.ndim != 1 or included.shape != scores.shape or scores.size < 2:
    raise ValueError("scores and included must be 1-D of the same length m >= 2, got shapes "
                     f"{scores.shape} and {included.shape}.")
  if included.dtype != bool:
    raise ValueError(f"included must be boolean, got dtype {included.dtype}.")
  if not np.all(np.isfinite(scores)):
    raise ValueError("scores must be finite.")
  m = scores.size
  r = _checks.check_integer("num_guesses", num_guesses, minimum=2, maximum=m)
  if r % 2:
    raise ValueError(f"num_guesses must be even (half 'in', half 'out'), got {r}.")
  # Stable sorts: ties keep index order.
  order = np.argsort(-scores, kind="stable")
  guessed_in = order[:r // 2]
  guessed_out = np.argsort(scores, kind="stable")[:r // 2]
  correct = int(included[guessed_in].sum() + (~included[guessed_out]).sum())
  bound = _stats.one_run_epsilon_lower_bound(m, r, correct, delta=delta, confidence=confidence)
  best = _stats.max_one_run_epsilon_lower_bound(m, r, delta=delta, confidence=confidence)
  mu = _stats.one_run_gdp_lower_bound(m, r, correct, confidence=confidence)
  fdp = None if delta == 0.0 else _stats.one_run_fdp_epsilon_lower_bound(
      m, r, correct, delta, confidence=confidence)
  return OneRunAudit(float(bound), float(best), m, r, correct, float(delta), float(confidence),
                     float(mu), fdp)


@dataclasses.dataclass(frozen=True)
class ManyRunAudit:
  """Result of :func:`many_run_audit`: the bound and the counts of the evaluation half."""
  epsilon_lower_bound: float
  threshold: float
  true_positives: int
  positives: int
  false_positives: int
  negatives: int
  delta: float
  confidence: float


def many_run_audit(scores_with, scores_without, *, delta: float = 0.0,
                   confidence: float = 0.95) -> ManyRunAudit:
  """Jagielski et al.'s audit from the scores of repeated trainings (module doc).

  The first half of each list picks the threshold ``t`` (among the observed scores, the one
  whose bound on that half is largest) and is then discarded; on the second
  half a run is called "with canary" when its score is ``>= t``, and the counts give the
  Clopper-Pearson bound of :func:`analysis.auditing.epsilon_lower_bound`.  Splitting keeps
  the threshold independent of the counts it is evaluated on, which the bound needs.

  Args:
    scores_with: 1-D float scores of runs trained with and without the canary
      (each at least 2 runs; higher = "with").
    scores_without: see ``scores_with`` (described together).
    delta: in [0, 1); confidence: in (0, 1).
  """
  with_ = np.asarray(scores_with, np.float64)
  without = np.asarray(scores_without, np.float64)
  for name, values in (("scores_with", with_), ("scores_without", without)):
    if values.ndim != 1 or values.size < 2 or not np.all(np.isfinite(values)):
      raise ValueError(f"{name} must be a 1-D array of >= 2 finite scores, got {values!r}.")
  delta = _checks.check_probability("delta", delta)
  confidence = _checks.check_probability("confidence", confidence, allow_zero=False)
  pick_with, eval_with = with_[:with_.size // 2], with_[with_.size // 2:]
  pick_without, eval_without = without[:without.size // 2], without[without.size // 2:]
  best, threshold = -np.inf, float(np.max(np.concatenate([pick_with, pick_without])))
  for t in np.unique(np.concatenate([pick_with, pick_without])):
    value = _stats.epsilon_lower_bound(
        int(np.sum(pick_with >= t)), pick_with.size, int(np.sum(pick_without >= t)),
        pick_without.size, delta=delta, confidence=confidence)
    if value > best:
      best, threshold = value, float(t)
  tp, fp = int(np.sum(eval_with >= threshold)), int(np.sum(eval_without >= threshold))
  bound = _stats.epsilon_lower_bound(tp, eval_with.size, fp, eval_without.size, delta=delta,
                                     confidence=confidence)
  return ManyRunAudit(float(bound), threshold, tp, int(eval_with.size), fp,
                      int(eval_without.size), float(delta), float(confidence))


@dataclasses.dataclass(frozen=True)
class MembershipInferenceReport:
  """Loss-threshold attack (member iff loss is low): ROC AUC and TPR at fixed FPRs."""
  auc: float
  tpr_at_fpr: dict
  num_members: int
  num_nonmembers: int


def membership_inference_report(model, members, nonmembers, loss_fn, *, batch_size: int = 256,
                                fprs=(0.001, 0.01, 0.1)) -> MembershipInferenceReport:
  """The loss-threshold membership-inference attack on ``model`` (Yeom et al. 2018).

  Each example's score is minus its loss; members (training examples) tend to have lower loss.
  Reports the ROC AUC (0.5 = chance) and the TPR at each FPR in ``fprs``
  (:func:`analysis.auditing.tpr_at_fpr`).  These are the usual attack numbers, not a bound on
  epsilon (use :func:`one_run_audit` for that).

  Args:
    model: a Keras model; members, nonmembers: ``(x, y)`` pairs of arrays.
    loss_fn: ``f(y_true, y_pred) -> [batch]`` per-example losses.
    batch_size: evaluation batch size, integer >= 1; fprs: FPRs in (0, 1).
  """
  batch_size = _checks.check_integer("batch_size", batch_size, minimum=1)
  for value in fprs:
    _checks.check_probability("fprs", value, allow_zero=False)

  def scores(pair, name):
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
      raise ValueError(f"{name} must be an (x, y) pair of arrays.")
    x, y = pair
    out = []
    for start in range(0, len(y), batch_size):
      predictions = model(x[start:start + batch_size], training=False)
      out.append(-np.asarray(loss_fn(y[start:start + batch_size], predictions), np.float64))
    return np.concatenate(out)
  member_scores, nonmember_scores = scores(members, "members"), scores(nonmembers, "nonmembers")
  return MembershipInferenceReport(
      float(_stats.roc_auc(member_scores, nonmember_scores)),
      {float(f): float(_stats.tpr_at_fpr(member_scores, nonmember_scores, f)) for f in fprs},
      int(member_scores.size), int(nonmember_scores.size))
