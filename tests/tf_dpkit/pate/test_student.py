"""pate.least_confident: the public images a student is least sure about, by the margin
between its two largest class probabilities (checked against numpy on a model whose logits are
known in closed form); the student's small-loss rule for noisy labels (label_drop)."""
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


# ------------------------------------------------------------- label_drop (small-loss rule)
@pytest.mark.parametrize("keep", [1, 3, 8])
def test_small_loss_mask_keeps_the_smallest_losses(keep):
  from tf_dpkit.pate.student import small_loss_mask
  losses = np.random.default_rng(keep).exponential(size=8).astype(np.float32)
  mask = small_loss_mask(losses, keep).numpy()
  expected = np.zeros(8, np.float32)
  expected[np.argsort(losses)[:keep]] = 1.0
  np.testing.assert_array_equal(mask, expected)


def test_small_loss_mask_breaks_ties_by_position():
  from tf_dpkit.pate.student import small_loss_mask
  mask = small_loss_mask(np.array([2.0, 1.0, 1.0, 1.0, 0.5], np.float32), 3).numpy()
  np.testing.assert_array_equal(mask, [0, 1, 1, 0, 1])


def _tiny_student(**kwargs):
  rng = np.random.default_rng(0)
  x = rng.integers(0, 256, (16, 28, 28), dtype=np.uint8)
  y = rng.integers(0, 10, 16)
  model = pate.train_student(x, y, method="supervised", steps=3, batch_size=8, seed=0, **kwargs)
  return [w.copy() for w in model.get_weights()]


def test_label_drop_changes_training_only_after_its_warmup():
  base = _tiny_student()
  # The rule never starts: the same training as without it.
  never = _tiny_student(label_drop=0.5, label_drop_warmup=1.0)
  for a, b in zip(base, never):
    np.testing.assert_array_equal(a, b)
  # From the first step: half of each batch is left out, so the weights differ.
  dropped = _tiny_student(label_drop=0.5, label_drop_warmup=0.0)
  assert any(not np.array_equal(a, b) for a, b in zip(base, dropped))


@pytest.mark.parametrize("kwargs, name", [
    (dict(label_drop=1.0), "label_drop"), (dict(label_drop=-0.1), "label_drop"),
    (dict(label_drop=float("nan")), "label_drop"),
    (dict(label_drop=0.6, batch_size=1), "label_drop"),  # would keep 0 of 1
    (dict(label_drop_warmup=1.5), "label_drop_warmup"),
    (dict(label_drop_warmup=-0.5), "label_drop_warmup")])
def test_label_drop_arguments_are_checked_naming_them(kwargs, name):
  x = np.zeros((4, 28, 28), np.uint8)
  with pytest.raises(ValueError, match=name):
    pate.train_student(x, np.zeros(4, np.int64), method="supervised", steps=1, **kwargs)
