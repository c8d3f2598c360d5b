"""Fast-path rules for GroupNormalization and Conv1D after an Embedding, and what the recurrent
layers do (per-example replay): per-example norms and clipped sums against a per-example
``tf.GradientTape`` loop, and removing one example moves the clipped sum by at most C (and by
more than C/2 where clipping binds)."""
import keras
import numpy as np
import pytest
import tensorflow as tf

from tf_dpkit.clipping import clipped_sum_fast, fast_path
from tf_dpkit.clipping.rules import lookup_rule
from tf_dpkit.clipping.testing import check_layer_rule, removal_sensitivity

RNG = np.random.default_rng(32)
XENT = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
CLIP = 0.5


def _x(*shape, scale=1.0, shift=0.0):
  return tf.constant((RNG.normal(size=shape) * scale + shift).astype(np.float32))


def _built(layer, inputs):
  layer(inputs)
  # Non-trivial scale and shift (the initial gamma = 1, beta = 0 would hide a wrong factor).
  for v in layer.trainable_variables:
    v.assign(RNG.normal(size=v.shape).astype(np.float32))
  return layer


GROUP_NORM_CASES = [
    ("image_2_groups", lambda: keras.layers.GroupNormalization(groups=2), lambda: _x(6, 5, 4, 6)),
    ("image_instance_norm", lambda: keras.layers.GroupNormalization(groups=-1),
     lambda: _x(4, 3, 3, 4, scale=3.0, shift=1.0)),
    ("image_layer_norm_like", lambda: keras.layers.GroupNormalization(groups=1),
     lambda: _x(4, 4, 4, 3)),
    ("sequence", lambda: keras.layers.GroupNormalization(groups=4), lambda: _x(6, 7, 8)),
    ("features_only", lambda: keras.layers.GroupNormalization(groups=3), lambda: _x(6, 9)),
    ("no_center", lambda: keras.layers.GroupNormalization(groups=2, center=False),
     lambda: _x(4, 5, 5, 4)),
    ("no_scale", lambda: keras.layers.GroupNormalization(groups=2, scale=False),
     lambda: _x(4, 5, 5, 4)),
    ("large_epsilon", lambda: keras.layers.GroupNormalization(groups=2, epsilon=0.5),
     lambda: _x(4, 3, 3, 4, scale=0.3)),
]


@pytest.mark.parametrize("num_microbatches", [None, 2])
@pytest.mark.parametrize("name, make_layer, make_inputs", GROUP_NORM_CASES,
                         ids=[c[0] for c in GROUP_NORM_CASES])
def test_group_normalization_rule_matches_per_example_reference(name, make_layer, make_inputs,
                                                                num_microbatches):
  inputs = make_inputs()
  layer = _built(make_layer(), inputs)
  assert lookup_rule(layer) is not None
  check_layer_rule(layer, inputs, num_microbatches=num_microbatches)  # asserts inside


@pytest.mark.slow  # 12 s on 2 cores: the replay's per-example gradients are traced with pfor
def test_group_normalization_over_another_axis_is_declined_and_replayed_exactly():
  # axis=1 (channels first): the rule declines, the layer is replayed per example (still exact).
  inputs = keras.Input((4, 3, 3))
  h = keras.layers.GroupNormalization(groups=2, axis=1)(inputs)
  model = keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(h)))
  x = _x(8, 4, 3, 3, scale=2.0)
  y = tf.constant(RNG.integers(0, 3, 8))
  replayed = _check_model(model, x, y)
  assert replayed == [model.layers[1].name]


def _brute_force(model, x, y, clip):
  """Per-example ``tf.GradientTape`` loop: each example's gradient, norm, and the clipped sum."""
  grads, norms = [], []
  for i in range(int(x.shape[0])):
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(XENT(y[i:i + 1], model(x[i:i + 1], training=True)))
    g = [tf.convert_to_tensor(t).numpy().astype(np.float64)
         for t in tape.gradient(loss, model.trainable_variables)]
    grads.append(g)
    norms.append(np.sqrt(sum(np.sum(t ** 2) for t in g)))
  factors = np.minimum(1.0, clip / np.array(norms))
  return [sum(f * g[v] for f, g in zip(factors, grads)) for v in range(len(grads[0]))], norms


def _check_model(model, x, y, clip=CLIP):
  """The fast path's norms and clipped sum equal the brute force; with clipping binding for
  every example, removing any one moves the clipped sum by more than C/2 and at most C.
  Returns the names of the layers the fast path replayed per example (no rule)."""
  replayed = []
  original = fast_path._replayed_trace

  def recording(layer, *args, **kwargs):
    replayed.append(layer.name)
    return original(layer, *args, **kwargs)

  fast_path._replayed_trace = recording
  try:
    @tf.function(reduce_retracing=True)
    def clipped(keep):
      xs, ys = tf.gather(x, keep), tf.gather(y, keep)
      result = clipped_sum_fast(model, XENT, (xs, ys, tf.ones(tf.shape(keep))), clip)[0]
      return result.norms, result.grads

    def fast(keep):
      norms, grads = clipped(tf.constant(keep, tf.int32))
      return type("Result", (), {"norms": norms, "grads": grads})
    everyone = np.arange(int(x.shape[0]))
    result = fast(everyone)
    expected, norms = _brute_force(model, x, y, clip)
    np.testing.assert_allclose(result.norms.numpy(), norms, rtol=2e-4)
    for got, want in zip(result.grads, expected):
      np.testing.assert_allclose(tf.convert_to_tensor(got).numpy(), want, rtol=2e-4, atol=2e-5)
    assert np.min(norms) > clip  # clipping binds for every example
    moved = removal_sensitivity(lambda keep: fast(keep).grads, int(x.shape[0]))
    assert clip / 2 < moved <= clip * (1 + 1e-5)
  finally:
    fast_path._replayed_trace = original
  return sorted(set(replayed))


def test_tanh_cnn_with_group_normalization_takes_rules_only():
  keras.utils.set_random_seed(5)
  model = keras.Sequential([
      keras.Input((8, 8, 3)), keras.layers.Conv2D(8, 3, padding="same"),
      keras.layers.GroupNormalization(groups=4), keras.layers.Activation("tanh"),
      keras.layers.MaxPooling2D(), keras.layers.Conv2D(8, 3, activation="tanh"),
      keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(4)])
  x = _x(8, 8, 8, 3, scale=2.0)
  y = tf.constant(RNG.integers(0, 4, 8))
  assert _check_model(model, x, y) == []


def test_text_cnn_conv1d_after_embedding_takes_rules_only():
  keras.utils.set_random_seed(6)
  model = keras.Sequential([
      keras.Input((12,), dtype="int32"), keras.layers.Embedding(30, 6),
      keras.layers.Conv1D(5, 3, activation="relu"), keras.layers.GlobalMaxPooling1D(),
      keras.layers.Dense(3)])
  x = tf.constant(RNG.integers(0, 30, (8, 12)).astype(np.int32))
  y = tf.constant(RNG.integers(0, 3, 8))
  assert _check_model(model, x, y, clip=0.05) == []


@pytest.mark.slow  # 15-20 s each on 2 cores (pfor of the recurrent loop)
@pytest.mark.parametrize("kind", ["SimpleRNN", "GRU", "LSTM"])
def test_recurrent_layers_are_replayed_per_example_and_exact(kind):
  # No rule for the recurrent layers: their weights act at every time step inside a loop, so
  # the fast path replays the layer's exact call on each example alone (per-example gradients
  # of that layer only); the rest of the model keeps its rules.
  keras.utils.set_random_seed(7)
  model = keras.Sequential([
      keras.Input((6,), dtype="int32"), keras.layers.Embedding(20, 4),
      getattr(keras.layers, kind)(5), keras.layers.Dense(3)])
  x = tf.constant(RNG.integers(0, 20, (8, 6)).astype(np.int32))
  y = tf.constant(RNG.integers(0, 3, 8))
  assert _check_model(model, x, y, clip=0.05) == [model.layers[1].name]
