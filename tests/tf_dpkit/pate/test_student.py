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


def _layer_kinds(model):
  return [type(layer).__name__ for layer in model.layers]


def test_the_batch_norm_student_normalises_after_each_hidden_layer_and_saves(tmp_path):
  plain = pate.build_student_model()
  bn = pate.build_student_model(architecture="cnn_bn")
  assert "BatchNormalization" not in _layer_kinds(plain)
  # Each of the three hidden layers (two convolutions, Dense(128)) is followed by batch
  # normalisation and has no bias of its own; the shapes of the weights are otherwise the same.
  kinds = _layer_kinds(bn)
  assert kinds.count("BatchNormalization") == 3
  for i, kind in enumerate(kinds):
    if kind == "BatchNormalization":
      assert kinds[i - 1] in ("Conv2D", "Dense") and not bn.layers[i - 1].use_bias
      assert kinds[i + 1] == "ReLU"
  kernels = lambda m: [w.shape for w in m.weights if w.name == "kernel"]  # noqa: E731
  assert kernels(plain) == kernels(bn)
  assert bn.output_shape == (None, 10)
  # Only standard layers: the saved student reloads without custom objects, same outputs.
  x = np.random.default_rng(0).uniform(size=(3, 28, 28, 1)).astype(np.float32)
  bn.save(tmp_path / "student.keras")
  again = keras.models.load_model(tmp_path / "student.keras")
  np.testing.assert_allclose(again(x, training=False), bn(x, training=False), rtol=1e-5)


def test_train_student_builds_the_architecture_it_is_given():
  x = np.random.default_rng(1).integers(0, 256, (8, 28, 28), dtype=np.uint8)
  model = pate.train_student(x, np.arange(8) % 10, method="supervised", batch_size=2,
                             steps=pate.student.MIN_BN_STEPS, architecture="cnn_bn")
  assert _layer_kinds(model).count("BatchNormalization") == 3
  # The moving statistics moved: the batches (public images) were used in training mode.
  moving_mean = [w for w in model.weights if "moving_mean" in w.path][0]
  assert np.any(np.asarray(moving_mean) != 0.0)


@pytest.mark.parametrize("call, message", [
    (lambda: pate.build_student_model(architecture="resnet"), "architecture"),
    (lambda: pate.train_student(np.zeros((2, 28, 28), np.uint8), np.zeros(2, np.int64),
                                method="supervised", steps=1, architecture="cnn-bn"),
     "architecture"),
    (lambda: pate.train_student(np.zeros((2, 28, 28), np.uint8), np.zeros(2, np.int64),
                                method="supervised", steps=1, architecture="cnn_bn",
                                model=pate.build_student_model()), "architecture"),
    (lambda: pate.train_student(np.zeros((2, 28, 28), np.uint8), np.zeros(2, np.int64),
                                method="supervised", steps=999, architecture="cnn_bn"),
     r"steps must be >= 1000 with architecture='cnn_bn'.*got 999")])
def test_architecture_is_checked_naming_it(call, message):
  with pytest.raises(ValueError, match=message):
    call()
