"""Layers and losses that mix the examples of a batch never reach the fast clipping path.

The fast path runs the forward pass on the whole batch, so its bound needs every layer to act on
each example alone (``tf_dpkit.clipping.independence``).  Run by the fast path's per-layer
machinery, each mixing model here moves its clipped sum by more than C (positive control below);
the fast path refuses it, ``"auto"`` routes it to the vectorized path with a warning naming the
layer, and the removal sensitivity measured by brute force is at most C.
"""
import warnings

import numpy as np
import pytest
import keras
import tensorflow as tf

from tf_dpkit.clipping import contract, independence
from tf_dpkit.clipping.fast_path import clipped_sum_fast, fast_path_available
from tf_dpkit.clipping.testing import removal_sensitivity
from tf_dpkit.dp_gradients import clipped_sum_for_model, resolve_method

C = 1.0
TOL = 1e-5
SCE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
RNG = np.random.default_rng(31)


def _minibatch_stddev(x):
  """The GAN discriminator's minibatch standard deviation feature (mixes the whole batch)."""
  std = tf.sqrt(tf.reduce_mean(tf.square(x - tf.reduce_mean(x, axis=0)), axis=0))
  return tf.concat([x, tf.broadcast_to(tf.reduce_mean(std), tf.shape(x[:, :1]))], axis=-1)


def _mixup_shift(x):
  """MixUp inside the model with a fixed partner (the next example): deterministic mixing."""
  return 0.6 * x + 0.4 * tf.roll(x, shift=1, axis=0)


def _mixup_random(x):
  """MixUp with a random partner per call, as an augmentation layer inside the model does."""
  return 0.6 * x + 0.4 * tf.gather(x, tf.random.shuffle(tf.range(tf.shape(x)[0])))


MIXING = {
    "unit_norm_axis0": lambda h: keras.layers.UnitNormalization(axis=0, name="mix")(h),
    "softmax_axis0": lambda h: keras.layers.Softmax(axis=0, name="mix")(h),
    "layer_norm_axis0": lambda h: keras.layers.LayerNormalization(
        axis=0, center=False, scale=False, name="mix")(h),
    "minibatch_stddev": lambda h: keras.layers.Lambda(_minibatch_stddev, name="mix")(h),
    "mixup_shift": lambda h: keras.layers.Lambda(_mixup_shift, name="mix")(h),
    "ops_batch_centring": lambda h: h - keras.ops.mean(h, axis=0, keepdims=True),
}
PER_EXAMPLE = {
    "lambda_times_two": lambda h: keras.layers.Lambda(lambda x: x * 2.0, name="double")(h),
    "ops_elementwise": lambda h: keras.ops.tanh(h) * 2.0 + h,
    "softmax_last_axis": lambda h: keras.layers.Softmax(axis=-1)(h),
    "unit_norm_axis1": lambda h: keras.layers.UnitNormalization(axis=1)(h),
    "random_noise_lambda": lambda h: keras.layers.Lambda(
        lambda x: x + tf.random.normal(tf.shape(x), stddev=1e-3))(h),
}


def _model(middle, seed=0):
  keras.utils.set_random_seed(seed)
  inputs = keras.Input((4,))
  h = keras.layers.Dense(4, activation="tanh")(inputs)
  return keras.Model(inputs, keras.layers.Dense(3)(middle(h)))


def _batch(n=5):
  return (tf.constant(RNG.normal(size=(n, 4)).astype(np.float32) * 2),
          tf.constant(RNG.integers(0, 3, n)))


def _sensitivity(model, x, y, method, loss=SCE):
  step = tf.function(lambda xs, ys: clipped_sum_for_model(model, loss, xs, ys, None, C, None,
                                                          method)[0].grads)
  return removal_sensitivity(lambda keep: step(tf.gather(x, keep), tf.gather(y, keep)), len(y))


def _reference_fast_sensitivity(model, x, y):
  """What the fast path's per-layer machinery gives when the independence check is skipped."""
  original = independence.batch_mixing
  independence.batch_mixing = lambda model: None
  try:
    return removal_sensitivity(
        lambda keep: clipped_sum_fast(model, SCE, (tf.gather(x, keep), tf.gather(y, keep), None),
                                      C)[0].grads, len(y))
  finally:
    independence.batch_mixing = original


@pytest.mark.parametrize("kind", sorted(MIXING))
def test_mixing_layers_are_refused_by_the_fast_path_and_bounded_on_auto(kind):
  model = _model(MIXING[kind])
  x, y = _batch()
  assert not fast_path_available(model)
  with pytest.raises(ValueError, match="not known to treat the examples of a batch"):
    clipped_sum_for_model(model, SCE, x, y, None, C, None, "fast")
  with pytest.raises(ValueError, match="not known to treat the examples of a batch"):
    clipped_sum_fast(model, SCE, (x, y, None), C)
  with pytest.warns(UserWarning, match="fast per-layer clipping path is not used"):
    assert resolve_method(model, "auto") == "vectorized"
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    assert _sensitivity(model, x, y, "auto") <= C * (1 + TOL)


@pytest.mark.parametrize("kind", ["unit_norm_axis0", "mixup_shift", "layer_norm_axis0",
                                  "ops_batch_centring"])
def test_the_fast_machinery_really_leaks_for_these_layers(kind):
  # Positive control: with the check skipped, the batch forward pass exceeds C (so the
  # refusal above is what keeps the bound, not a weak measurement).
  model = _model(MIXING[kind])
  x, y = _batch()
  assert _reference_fast_sensitivity(model, x, y) > 1.05 * C


def test_the_warning_names_the_layer_and_is_given_once():
  model = _model(MIXING["softmax_axis0"])
  with pytest.warns(UserWarning, match=r"layer 'mix'.*Softmax\(axis=0\)"):
    resolve_method(model, "auto")
  with warnings.catch_warnings():
    warnings.filterwarnings("error", message="tf_dpkit")
    assert resolve_method(model, "auto") == "vectorized"


def test_random_mixup_inside_the_model_is_refused():
  model = _model(lambda h: keras.layers.Lambda(_mixup_random, name="mix")(h))
  found = independence.batch_mixing(model)
  assert found is not None and found.layer == "mix"
  assert "gradient of its output" in found.reason


@pytest.mark.parametrize("kind", sorted(PER_EXAMPLE))
def test_per_example_custom_layers_keep_the_fast_path(kind):
  model = _model(PER_EXAMPLE[kind])
  x, y = _batch()
  assert fast_path_available(model)
  with warnings.catch_warnings():
    warnings.filterwarnings("error", message="tf_dpkit")
    assert resolve_method(model, "auto") == "fast"
  if kind != "random_noise_lambda":
    fast, _ = clipped_sum_for_model(model, SCE, x, y, None, C, None, "fast")
    vectorized, _ = clipped_sum_for_model(model, SCE, x, y, None, C, None, "vectorized")
    for a, b in zip(fast.grads, vectorized.grads):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_minibatch_stddev_on_the_vectorized_path_warns_that_nothing_is_learned():
  model = _model(MIXING["minibatch_stddev"])
  x, y = _batch()
  with pytest.warns(UserWarning, match="non-finite .* gradient on one random example"):
    clipped, _ = clipped_sum_for_model(model, SCE, x, y, None, C, None, "vectorized")
  # What the warning is about: every example's gradient was zeroed.
  assert all(float(tf.reduce_max(tf.abs(g))) == 0.0 for g in clipped.grads)


def test_a_finite_single_example_model_gets_no_nan_warning():
  model = _model(MIXING["softmax_axis0"])  # softmax over one example is 1: finite
  x, y = _batch()
  with warnings.catch_warnings():
    warnings.filterwarnings("error", message="tf_dpkit")
    clipped_sum_for_model(model, SCE, x, y, None, C, None, "vectorized")


class _Counting(keras.layers.Layer):
  """Per example, but counts its calls in a variable: the probe must leave the count alone."""

  def build(self, shape):
    self.calls = self.add_weight(shape=(), initializer="zeros", trainable=False)

  def call(self, x):
    self.calls.assign_add(1.0)
    return x * 3.0


def test_the_probe_restores_layer_state():
  layer = _Counting(name="counting")
  model = _model(layer)
  assert independence.batch_mixing(model) is None
  assert float(layer.calls) == 0.0


class _ReverseTokens(keras.layers.Layer):
  """Reverses the batch of integer tokens: only the forward check can see it."""

  def call(self, x):
    return tf.reverse(x, axis=[0])


def test_integer_inputs_are_probed_by_the_forward_check():
  inputs = keras.Input((3,), dtype="int32")
  h = keras.layers.Embedding(4, 2)(_ReverseTokens(name="reverse")(inputs))
  model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(h)))
  found = independence.batch_mixing(model)
  assert found is not None and found.layer == "reverse"
  assert "changes other examples' outputs" in found.reason


@pytest.mark.parametrize("make, needle", [
    (lambda h: keras.ops.mean(h, axis=0, keepdims=True), "does not keep the batch"),
    (lambda h: keras.layers.Concatenate(axis=0)([h, h]), "axis=0"),
    (lambda h: keras.layers.Dense(4, activation=lambda z: z - keras.ops.mean(z, axis=0))(h),
     "gradient of its output"),
    (lambda h: keras.layers.TimeDistributed(keras.layers.Softmax(axis=0))(
        keras.layers.Reshape((2, 2))(h)), "wrapped layer"),
])
def test_other_ways_of_mixing_are_found(make, needle):
  found = independence.batch_mixing(_model(make))
  assert found is not None and needle in found.reason


def test_mixing_inside_a_nested_model_is_found():
  inner_in = keras.Input((4,))
  inner = keras.Model(inner_in, keras.layers.UnitNormalization(axis=0, name="inner_mix")(
      keras.layers.Dense(4)(inner_in)), name="inner")
  found = independence.batch_mixing(_model(inner))
  assert found is not None and found.layer == "inner/inner_mix"


def test_keras_per_example_layers_need_no_probe():
  inputs = keras.Input((6, 4))
  h = keras.layers.LayerNormalization()(keras.layers.Conv1D(4, 3, padding="same")(inputs))
  h = keras.layers.MultiHeadAttention(2, 2)(h, h)
  h = keras.layers.Bidirectional(keras.layers.LSTM(3, return_sequences=True))(h)
  h = keras.layers.GlobalAveragePooling1D()(keras.layers.Dropout(0.1)(h))
  model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax")(h))
  original = independence._probe  # pylint: disable=protected-access
  independence._probe = lambda node: pytest.fail(f"probed {node.operation.name}")  # pylint: disable=protected-access
  try:
    assert independence.batch_mixing(model) is None
  finally:
    independence._probe = original  # pylint: disable=protected-access


# -- losses ----------------------------------------------------------------------------------

@pytest.mark.parametrize("method", ["fast", "vectorized"])
def test_a_loss_reducing_over_the_batch_axis_is_refused(method):
  model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
  x = tf.constant(RNG.normal(size=(3, 4)).astype(np.float32))
  y = tf.one_hot(RNG.integers(0, 3, 3), 3)  # [3, 3]: the batch equals the class count
  loss = keras.losses.CategoricalCrossentropy(from_logits=True, axis=0, reduction=None)
  with pytest.raises(ValueError, match=r"axis=0\) reduces over axis 0, the batch axis"):
    clipped_sum_for_model(model, loss, x, y, None, C, None, method)


def test_only_the_last_or_a_positive_loss_axis_counts_as_already_per_example():
  cce = keras.losses.CategoricalCrossentropy
  assert contract.loss_is_isolated_per_example(cce(reduction=None))
  assert contract.loss_is_isolated_per_example(cce(axis=1, reduction=None))
  assert not contract.loss_is_isolated_per_example(cce(axis=-2, reduction=None))
  assert not contract.loss_is_isolated_per_example(keras.losses.CosineSimilarity(axis=-2))
