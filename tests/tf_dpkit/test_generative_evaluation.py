"""Tabular evaluation of synthetic data (tf_dpkit.generative.evaluation): AUROC and AUPRC
against brute-force definitions, TSTR over the fixed classifiers, argument checks."""
import itertools

import numpy as np
import pytest

from tf_dpkit.generative import evaluation as ev

pytest.importorskip("sklearn")


def _auroc_brute_force(y, s):
  pairs = [(p, n) for p, n in itertools.product(s[y == 1], s[y == 0])]
  return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs) / len(pairs)


def _auprc_brute_force(y, s):
  """Average precision: at each distinct threshold from the top, recall gained x precision."""
  total, recall_before = 0.0, 0.0
  for threshold in sorted(set(s.tolist()), reverse=True):
    chosen = s >= threshold
    precision = y[chosen].mean()
    recall = y[chosen].sum() / y.sum()
    total += (recall - recall_before) * precision
    recall_before = recall
  return total


@pytest.mark.parametrize("seed", range(4))
def test_auroc_and_auprc_match_brute_force_with_ties(seed):
  rng = np.random.default_rng(seed)
  y = rng.integers(0, 2, 40)
  y[:2] = [0, 1]
  s = np.round(rng.normal(size=40) + y, 1)  # rounding makes ties
  assert ev.binary_auroc(y, s) == pytest.approx(_auroc_brute_force(y, s), abs=1e-12)
  assert ev.binary_auprc(y, s) == pytest.approx(_auprc_brute_force(y, s), abs=1e-12)


def test_auroc_auprc_extremes_and_errors():
  y = np.array([0, 0, 1, 1])
  assert ev.binary_auroc(y, [0.1, 0.2, 0.8, 0.9]) == 1.0
  assert ev.binary_auroc(y, [0.9, 0.8, 0.2, 0.1]) == 0.0
  assert ev.binary_auroc(y, [0.5] * 4) == 0.5
  assert ev.binary_auprc(y, [0.5] * 4) == 0.5  # constant score: the prevalence
  with pytest.raises(ValueError, match="both labels"):
    ev.binary_auroc([1, 1], [0.1, 0.2])
  with pytest.raises(ValueError, match="y_true must be a 1-D array of 0/1"):
    ev.binary_auroc([0, 2], [0.1, 0.2])
  with pytest.raises(ValueError, match="scores must be 2 finite"):
    ev.binary_auprc([0, 1], [0.1, np.nan])
  with pytest.raises(ValueError, match="at least one label 1"):
    ev.binary_auprc([0, 0], [0.1, 0.2])


def _separable(n, seed):
  rng = np.random.default_rng(seed)
  y = np.repeat([0, 1], n // 2)
  x = rng.normal(size=(n, 5)) + 3.0 * y[:, None]
  return x, y


def test_tstr_tabular_on_separable_data_and_single_class_synthetic():
  xs, ys = _separable(200, 0)
  xt, yt = _separable(100, 1)
  out = ev.tstr_tabular(xs, ys, xt, yt, seed=0)
  assert set(out["auroc"]) == set(ev.TABULAR_CLASSIFIERS)
  assert min(out["auroc"].values()) > 0.99 and out["auroc_mean"] > 0.99
  assert out["auprc_mean"] == pytest.approx(np.mean(list(out["auprc"].values())))
  # Synthetic labels of one class: no classifier can learn; constant scores.
  flat = ev.tstr_tabular(xs, np.zeros(200, int), xt, yt, classifiers=("random_forest",))
  assert flat["auroc_mean"] == 0.5 and flat["auprc_mean"] == pytest.approx(0.5)


def test_tstr_tabular_argument_checks():
  xs, ys = _separable(20, 0)
  with pytest.raises(ValueError, match="classifiers"):
    ev.tstr_tabular(xs, ys, xs, ys, classifiers=("svm",))
  with pytest.raises(ValueError, match="x_synthetic has 5 features, x_test 4"):
    ev.tstr_tabular(xs, ys, xs[:, :4], ys)
  with pytest.raises(ValueError, match="x_test must be a non-empty finite"):
    ev.tstr_tabular(xs, ys, np.full((2, 5), np.inf), ys[:2])
  with pytest.raises(ValueError, match="y_synthetic must be a 1-D array of 0/1"):
    ev.tstr_tabular(xs, ys + 1, xs, ys)
  with pytest.raises(ValueError, match="one label per row"):
    ev.tstr_tabular(xs, ys[:5], xs, ys)
  with pytest.raises(ValueError, match="classifiers must name at least one"):
    ev.tstr_tabular(xs, ys, xs, ys, classifiers=())


def test_tstr_tabular_record_scores_closed_forms_locality_and_weights():
  xs, ys = _separable(200, 0)
  xr, yr = _separable(60, 1)
  # One-class synthetic labels: every classifier says P(label 1) = 1, so a record scores
  # w1 when its label is 1 and 0 otherwise (closed form).
  ones = ev.tstr_tabular_record_scores(xs, np.ones(200, int), xr, yr, class_weights=(1.0, 0.7))
  np.testing.assert_array_equal(ones, np.where(yr == 1, 0.7, 0.0))
  # The mean of the classifiers' probabilities of each record's own label, against the
  # probabilities recomputed from scikit-learn fits made here.
  names = ("logistic_regression", "random_forest")
  got = ev.tstr_tabular_record_scores(xs, ys, xr, yr, classifiers=names, seed=3)
  p1 = np.mean([ev.tabular_classifier(n, 3).fit(xs, ys).predict_proba(xr)[:, 1] for n in names],
               axis=0)
  np.testing.assert_allclose(got, np.where(yr == 1, p1, 1.0 - p1), rtol=0, atol=1e-12)
  assert got.min() >= 0.0 and got.max() <= 1.0 and got.mean() > 0.95  # separable
  # Public class weights scale each class's scores.
  half = ev.tstr_tabular_record_scores(xs, ys, xr, yr, classifiers=names, seed=3,
                                       class_weights=(0.25, 1.0))
  np.testing.assert_allclose(half, got * np.where(yr == 1, 1.0, 0.25), rtol=0, atol=1e-12)
  # Locality (the selection's sensitivity bound): a record's score does not depend on the
  # other records, so dropping or changing records leaves every other score as it was.
  changed = xr.copy()
  changed[0] += 100.0
  again = ev.tstr_tabular_record_scores(xs, ys, changed[:-5], yr[:-5], classifiers=names,
                                        seed=3)
  np.testing.assert_allclose(again[1:], got[1:-5], rtol=0, atol=1e-12)


def test_tstr_tabular_record_scores_argument_checks():
  xs, ys = _separable(20, 0)
  for bad in ((1.2, 1.0), (0.5,), (-0.1, 1.0), (np.nan, 1.0)):
    with pytest.raises(ValueError, match=r"class_weights must be two values \(w0, w1\) in"):
      ev.tstr_tabular_record_scores(xs, ys, xs, ys, class_weights=bad)
  with pytest.raises(ValueError, match="x_synthetic has 5 features, x_records 4"):
    ev.tstr_tabular_record_scores(xs, ys, xs[:, :4], ys)
  with pytest.raises(ValueError, match="y_records must be a 1-D array of 0/1"):
    ev.tstr_tabular_record_scores(xs, ys, xs, ys + 2)
  with pytest.raises(ValueError, match="x_records must be a non-empty finite"):
    ev.tstr_tabular_record_scores(xs, ys, np.zeros((0, 5)), ys[:0])
