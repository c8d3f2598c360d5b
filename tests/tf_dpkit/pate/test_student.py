"""pate.least_confident: the public images a student is least sure about, by the margin
between its two largest class probabilities (checked against numpy on a model whose logits are
known in closed form)."""
import keras
import numpy as np
import pytest

from tf_dpkit import pate

VALUES = np.array([0.9, -0.05, 0.3, 0.01, -0.6, 2.0, -0.2], np.float32)


def _model_with_logits_3v_0_minus_v():
  """Logits (3v, 0, -v) for a 1x1 image of value v (one Dense layer, fixed weights)."""
  model = keras.Sequential([keras.Input((1, 1, 1)), keras.layers.Flatten(),
                            keras.layers.Dense(3)])
  model.layers[-1].set_weights([np.array([[3.0, 0.0, -1.0]], np.float32),
                                np.zeros(3, np.float32)])
  return model


def _reference_order(values, exclude=()):
  logits = np.stack([3 * values, np.zeros_like(values), -values], 1).astype(np.float64)
  p = np.exp(logits - logits.max(1, keepdims=True))
  p /= p.sum(1, keepdims=True)
  top = np.sort(p, 1)
  margin = top[:, -1] - top[:, -2]
  order = [i for i in np.argsort(margin) if i not in set(exclude)]
  return order, margin


@pytest.mark.parametrize("k, exclude", [(0, None), (1, None), (3, None), (7, None),
                                        (2, [3]), (4, [1, 6, 3])])
def test_the_k_smallest_margins_are_chosen(k, exclude):
  model = _model_with_logits_3v_0_minus_v()
  x = VALUES.reshape(-1, 1, 1, 1)
  order, margin = _reference_order(VALUES, exclude or ())
  assert len(set(np.round(margin, 6))) == len(VALUES)  # no ties: the order is defined
  got = pate.least_confident(model, x, k, exclude=exclude)
  np.testing.assert_array_equal(got, np.sort(order[:k]))
  assert got.dtype == np.int64
  if exclude:
    assert not set(got) & set(exclude)


def test_k_and_exclude_are_checked_naming_the_argument():
  model = _model_with_logits_3v_0_minus_v()
  x = VALUES.reshape(-1, 1, 1, 1)
  with pytest.raises(ValueError, match=r"k must be an integer in \[0, 5\], got 6"):
    pate.least_confident(model, x, 6, exclude=[0, 1])
  with pytest.raises(ValueError, match=r"k must be an integer in \[0, 7\], got -1"):
    pate.least_confident(model, x, -1)
  with pytest.raises(ValueError, match=r"exclude must hold indices in \[0, 6\]"):
    pate.least_confident(model, x, 1, exclude=[7])
