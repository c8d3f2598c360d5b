"""Fast-path rules for GroupNormalization, Conv1D after an Embedding and the recurrent layers
(SimpleRNN, LSTM, GRU): per-example norms and clipped sums against a per-example
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
    # A mean 40 standard deviations from zero: the rule's dgamma = dL/dscale / sigma, where
    # dL/dscale = sum g x - mean sum g cancels, as in Keras's own backward pass.
    ("offset_inputs", lambda: keras.layers.GroupNormalization(groups=2),
     lambda: _x(4, 5, 5, 4, scale=0.5, shift=20.0)),
]


def _frozen_gamma_layer():
  layer = keras.layers.GroupNormalization(groups=2)
  layer.build((None, 5, 5, 4))
  layer.gamma.trainable = False
  return layer


GROUP_NORM_CASES.append(("frozen_gamma", _frozen_gamma_layer, lambda: _x(4, 5, 5, 4)))


@pytest.mark.parametrize("num_microbatches", [None, 2])
@pytest.mark.parametrize("name, make_layer, make_inputs", GROUP_NORM_CASES,
                         ids=[c[0] for c in GROUP_NORM_CASES])
def test_group_normalization_rule_matches_per_example_reference(name, make_layer, make_inputs,
                                                                num_microbatches):
  inputs = make_inputs()
  layer = _built(make_layer(), inputs)
  assert lookup_rule(layer) is not None
  check_layer_rule(layer, inputs, num_microbatches=num_microbatches)  # asserts inside


def test_group_normalization_norms_form_no_tensor_the_size_of_the_activations():
  # The per-example gradients come from the backward pass at the [B, 1, G, C/G] scale and
  # shift, so the norms and the clipped sum add no activation-sized tensor (a normalised copy
  # of the input would be one).
  layer = _built(keras.layers.GroupNormalization(groups=4), _x(2, 6, 6, 8))

  @tf.function(input_signature=[tf.TensorSpec([16, 6, 6, 8])])
  def step(x):
    with tf.GradientTape() as tape:
      tape.watch(x)
      trace = lookup_rule(layer)(layer, x)
      total = tf.reduce_sum(trace.outputs * tf.ones_like(trace.outputs))
    g = tape.gradient(total, trace.watched)
    with tf.name_scope("norms_and_sum"):
      squared = trace.squared_norms(g, 4)
      return squared, trace.clipped_sum(tf.ones([4]))

  graph = step.get_concrete_function().graph
  added = [op for op in graph.get_operations() if op.name.startswith("norms_and_sum")]
  assert added
  sizes = {op.name: max([t.shape.num_elements() or 0 for t in op.outputs] + [0]) for op in added}
  assert max(sizes.values()) < 16 * 6 * 6 * 8 // 8, sizes


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


RECURRENT_CASES = [
    ("simple_rnn", lambda: keras.layers.SimpleRNN(3), lambda: _x(6, 5, 4)),
    ("simple_rnn_sequences_backwards", lambda: keras.layers.SimpleRNN(
        3, return_sequences=True, go_backwards=True, activation="relu"), lambda: _x(6, 5, 4)),
    ("lstm", lambda: keras.layers.LSTM(3), lambda: _x(6, 5, 4)),
    ("lstm_sequences_no_bias", lambda: keras.layers.LSTM(2, return_sequences=True,
                                                         use_bias=False), lambda: _x(4, 6, 3)),
    ("gru", lambda: keras.layers.GRU(3), lambda: _x(6, 5, 4)),
    ("gru_sequences_backwards_unrolled", lambda: keras.layers.GRU(
        2, return_sequences=True, go_backwards=True, unroll=True), lambda: _x(4, 4, 3)),
    ("gru_no_bias", lambda: keras.layers.GRU(3, use_bias=False), lambda: _x(4, 5, 2)),
]


@pytest.mark.parametrize("num_microbatches", [None, 2])
@pytest.mark.parametrize("name, make_layer, make_inputs", RECURRENT_CASES,
                         ids=[c[0] for c in RECURRENT_CASES])
def test_recurrent_rule_matches_per_example_reference(name, make_layer, make_inputs,
                                                      num_microbatches):
  inputs = make_inputs()
  layer = _built(make_layer(), inputs)
  assert lookup_rule(layer) is not None
  check_layer_rule(layer, inputs, num_microbatches=num_microbatches)  # asserts inside


@pytest.mark.parametrize("kind", ["SimpleRNN", "LSTM", "GRU"])
def test_text_rnn_takes_rules_only(kind):
  keras.utils.set_random_seed(7)
  model = keras.Sequential([
      keras.Input((6,), dtype="int32"), keras.layers.Embedding(20, 4),
      getattr(keras.layers, kind)(5), keras.layers.Dense(3)])
  x = tf.constant(RNG.integers(0, 20, (8, 6)).astype(np.int32))
  y = tf.constant(RNG.integers(0, 3, 8))
  assert _check_model(model, x, y, clip=0.05) == []


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_masked_text_rnn_is_exact(kind):
  # Padding id 0 masked by the Embedding: masked steps carry the state over.
  keras.utils.set_random_seed(8)
  model = keras.Sequential([
      keras.Input((6,), dtype="int32"), keras.layers.Embedding(20, 4, mask_zero=True),
      getattr(keras.layers, kind)(5), keras.layers.Dense(3)])
  tokens = RNG.integers(1, 20, (8, 6))
  tokens[:, 4:] = 0
  tokens[0, 2:] = 0
  x = tf.constant(tokens.astype(np.int32))
  y = tf.constant(RNG.integers(0, 3, 8))
  assert _check_model(model, x, y, clip=0.05) == []


def test_recurrent_rule_declines_dropout_state_and_reset_before():
  inputs = _x(4, 5, 3)
  for layer in [keras.layers.LSTM(2, dropout=0.5), keras.layers.SimpleRNN(2, recurrent_dropout=0.5),
                keras.layers.GRU(2, return_state=True), keras.layers.GRU(2, reset_after=False)]:
    layer(inputs)
    assert lookup_rule(layer)(layer, inputs) is None, layer.get_config()


@pytest.mark.slow  # 15 s (pfor of the recurrent loop in the replay)
def test_declined_recurrent_configuration_is_replayed_exactly():
  keras.utils.set_random_seed(9)
  model = keras.Sequential([
      keras.Input((6,), dtype="int32"), keras.layers.Embedding(20, 4),
      keras.layers.GRU(5, reset_after=False), keras.layers.Dense(3)])
  x = tf.constant(RNG.integers(0, 20, (8, 6)).astype(np.int32))
  y = tf.constant(RNG.integers(0, 3, 8))
  assert _check_model(model, x, y, clip=0.05) == [model.layers[1].name]


def test_check_layer_rule_checks_the_clipped_sum_the_rule_returns():
  # The recurrent rule's clipped sum is its own (its probe does not depend on the weights, so a
  # VJP through it would be zero): check_layer_rule checks the sum the fast path would use.
  from tf_dpkit.clipping.rules import LayerTrace, register_layer_rule
  from tf_dpkit.clipping.rules.group_normalization import group_normalization_rule

  class Doubled(keras.layers.GroupNormalization):
    pass

  def wrong_sum(layer, inputs):
    trace = group_normalization_rule(layer, inputs)
    return LayerTrace(trace.outputs, trace.watched, trace.squared_norms,
                      lambda factors: [2.0 * s for s in trace.clipped_sum(factors)])
  register_layer_rule(Doubled, wrong_sum)
  inputs = _x(4, 3, 3, 4)
  layer = _built(Doubled(groups=2), inputs)
  with pytest.raises(AssertionError, match="clipped sum .book-keeping clipped_sum. differs"):
    check_layer_rule(layer, inputs)


@pytest.mark.parametrize("name, make_layer, make_inputs", GROUP_NORM_CASES,
                         ids=[c[0] for c in GROUP_NORM_CASES])
def test_group_normalization_rule_output_is_keras_output_bit_for_bit(name, make_layer,
                                                                     make_inputs):
  """The rule forms the output with Keras's own operations in Keras's order (the backward pass
  then costs what Keras's does); a reformulation would differ in the last bits."""
  del name
  inputs = make_inputs()
  layer = _built(make_layer(), inputs)
  np.testing.assert_array_equal(lookup_rule(layer)(layer, inputs).outputs.numpy(),
                                layer(inputs).numpy())
