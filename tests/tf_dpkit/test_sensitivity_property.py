"""Property: on random small models and batches, removing any one example moves the clipped sum
by at most C (relative tolerance 1e-5), on every clipping path.

Models are drawn from the supported layer set: Dense, Conv2D, DepthwiseConv2D, Embedding with
and without masks, SimpleRNN / GRU / LSTM, LayerNormalization, GroupNormalization,
MultiHeadAttention, a custom layer with a registered rule, custom layers without one (one of
them ``training``-dependent), a layer called twice (shared weights), and two-input models.
Models with a weightless layer drawn from a small family that mixes the examples of a batch
(``UnitNormalization`` / ``Softmax`` over axis 0, a minibatch standard deviation, MixUp with the
next example, batch centring with ``keras.ops``) or does not (a per-example ``Lambda``) check
that the fast path refuses what it cannot clear as per example and that ``"auto"`` stays bounded.
Paths: the fast per-layer path (where available), the whole-model vectorized path, a custom
``tf.function`` loop through ``private_gradients``' clipping, and the vector-loss Jacobian path
of the optimizers.  The default run draws a few models per path; ``pytest -m slow`` many more.
"""
import numpy as np
import pytest
import keras
import tensorflow as tf
from hypothesis import HealthCheck, given, settings, strategies as st

import warnings

from tf_dpkit.clipping import independence, per_example
from tf_dpkit.clipping.fast_path import fast_path_available, graph_walkable
from tf_dpkit.clipping.rules import LayerTrace, LinearNorms, register_layer_rule
from tf_dpkit.clipping.testing import removal_sensitivity
from tf_dpkit.dp_gradients import clipped_sum_for_model

TOL = 1e-5
SCE = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


class Affine(keras.layers.Layer):
  """A custom layer with its own registered rule."""

  def __init__(self, units, **kwargs):
    super().__init__(**kwargs)
    self.units = units

  def build(self, shape):
    self.w = self.add_weight(shape=(shape[-1], self.units), initializer="glorot_uniform")
    self.b = self.add_weight(shape=(self.units,), initializer="random_normal")

  def call(self, x):
    return tf.tanh(tf.matmul(x, self.w) + self.b)


@register_layer_rule(Affine)
def _affine_rule(layer, inputs):
  z = tf.matmul(inputs, layer.w) + layer.b
  linear = LinearNorms(with_bias=True)
  return LayerTrace(tf.tanh(z), z,
                    lambda g, m: linear.squared_norms(inputs[:, None], g[:, None], m))


class Gated(keras.layers.Layer):
  """No rule; its output depends on ``training``."""

  def build(self, shape):
    self.w = self.add_weight(shape=(shape[-1], shape[-1]), initializer="glorot_uniform")

  def call(self, x, training=None):
    gate = tf.sigmoid(tf.matmul(x, self.w))
    return x * gate * (2.0 if training else 1.0)


# Each builder draws its choices and returns a function that makes the model (called in the test
# body after seeding Keras, so that a failing example reproduces).


def _features_model(draw):
  kinds = draw(st.lists(st.sampled_from(["dense", "layernorm", "groupnorm", "affine", "gated"]),
                        min_size=1, max_size=3))
  shared_twice = draw(st.booleans())  # one Dense applied twice: tied weights

  def make():
    inputs = keras.Input((4,))
    h = inputs
    for kind in kinds:
      h = {"dense": lambda: keras.layers.Dense(4, activation="tanh"),
           "layernorm": keras.layers.LayerNormalization,
           "groupnorm": lambda: keras.layers.GroupNormalization(groups=2),
           "affine": lambda: Affine(4),
           "gated": Gated}[kind]()(h)
    if shared_twice:
      shared = keras.layers.Dense(4, activation="tanh")
      h = shared(shared(h))
    return keras.Model(inputs, keras.layers.Dense(3)(h))
  return make, "float"


def _tokens_model(draw):
  mask_zero = draw(st.booleans())
  kind = draw(st.sampled_from(["SimpleRNN", "GRU", "LSTM", "attention", "pool"]))

  def make():
    inputs = keras.Input((5,), dtype="int32")
    h = keras.layers.Embedding(8, 4, mask_zero=mask_zero)(inputs)
    if kind == "attention":
      h = keras.layers.MultiHeadAttention(num_heads=2, key_dim=2)(h, h)
      h = keras.layers.GlobalAveragePooling1D()(h)
    elif kind == "pool":
      h = keras.layers.GlobalAveragePooling1D()(keras.layers.Dense(4, activation="relu")(h))
    else:
      h = getattr(keras.layers, kind)(4)(h)
    return keras.Model(inputs, keras.layers.Dense(3)(h))
  return make, "tokens"


def _image_model(draw):
  conv = draw(st.sampled_from(["conv", "depthwise"]))
  padding = draw(st.sampled_from(["same", "valid"]))

  def make():
    inputs = keras.Input((5, 5, 2))
    layer = (keras.layers.Conv2D(3, 3, padding=padding, activation="relu") if conv == "conv"
             else keras.layers.DepthwiseConv2D(3, depth_multiplier=2, padding=padding,
                                               activation="relu"))
    return keras.Model(inputs, keras.layers.Dense(3)(keras.layers.Flatten()(layer(inputs))))
  return make, "image"


def _two_input_model(draw):
  mask_zero = draw(st.booleans())

  def make():
    a, b = keras.Input((4,)), keras.Input((5,), dtype="int32")
    tokens = keras.layers.GlobalAveragePooling1D()(
        keras.layers.Embedding(8, 3, mask_zero=mask_zero)(b))
    h = keras.layers.Concatenate()([keras.layers.Dense(3, activation="tanh")(a), tokens])
    return keras.Model([a, b], keras.layers.Dense(3)(h))
  return make, "two"


def _minibatch_stddev(x):
  std = tf.sqrt(tf.reduce_mean(tf.square(x - tf.reduce_mean(x, axis=0)), axis=0) + 1e-6)
  return tf.concat([x, tf.broadcast_to(tf.reduce_mean(std), tf.shape(x[:, :1]))], axis=-1)


# Weightless layers: all but "double" mix the examples of a batch.
_WEIGHTLESS = {
    "unit_norm_axis0": lambda h: keras.layers.UnitNormalization(axis=0)(h),
    "softmax_axis0": lambda h: keras.layers.Softmax(axis=0)(h),
    "minibatch_stddev": lambda h: keras.layers.Lambda(_minibatch_stddev)(h),
    "mixup_next": lambda h: keras.layers.Lambda(lambda x: 0.6 * x + 0.4 * tf.roll(x, 1, 0))(h),
    "ops_centring": lambda h: h - keras.ops.mean(h, axis=0, keepdims=True),
    "double": lambda h: keras.layers.Lambda(lambda x: 2.0 * x)(h),
}


def _weightless_model(draw):
  kind = draw(st.sampled_from(sorted(_WEIGHTLESS)))
  before = draw(st.booleans())  # the mixing layer before or after the hidden Dense

  def make():
    inputs = keras.Input((4,))
    h = _WEIGHTLESS[kind](inputs) if before else inputs
    h = keras.layers.Dense(4, activation="tanh")(h)
    h = h if before else _WEIGHTLESS[kind](h)
    return keras.Model(inputs, keras.layers.Dense(3)(h))
  return make, "float"


@st.composite
def cases(draw, builders=None):
  builder = draw(st.sampled_from(builders or [_features_model, _tokens_model, _image_model,
                                              _two_input_model, _weightless_model]))
  make, kind = builder(draw)
  seed = draw(st.integers(0, 2**16))
  batch = draw(st.integers(2, 5))
  scale = draw(st.sampled_from([0.3, 3.0]))
  clip = draw(st.sampled_from([0.05, 1.0]))
  return make, kind, seed, batch, scale, clip


def _materialise(case):
  make, kind, seed, batch, scale, clip = case
  keras.utils.set_random_seed(seed)
  model = make()
  rng = np.random.default_rng(seed)

  def tokens():
    x = rng.integers(1, 8, (batch, 5))
    x[:, 2:] *= rng.random((batch, 3)) < 0.6
    return tf.constant(x, tf.int32)
  x = {"float": lambda: tf.constant(rng.normal(size=(batch, 4)) * scale, tf.float32),
       "tokens": tokens,
       "image": lambda: tf.constant(rng.normal(size=(batch, 5, 5, 2)) * scale, tf.float32),
       "two": lambda: [tf.constant(rng.normal(size=(batch, 4)) * scale, tf.float32), tokens()],
       }[kind]()
  return model, x, tf.constant(rng.integers(0, 3, batch)), clip


def _gather(x, keep):
  return tf.nest.map_structure(lambda t: tf.gather(t, keep), x)


def _check(model, x, y, clip, method):
  step = (tf.function(lambda xs, ys: clipped_sum_for_model(model, SCE, xs, ys, None, clip)[0].grads)
          if method == "loop" else
          lambda xs, ys: clipped_sum_for_model(model, SCE, xs, ys, None, clip, None, method)[0].grads)
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="tf_dpkit")  # "auto" says it left the fast path
    sensitivity = removal_sensitivity(lambda keep: step(_gather(x, keep), tf.gather(y, keep)),
                                      int(y.shape[0]))
  assert sensitivity <= clip * (1 + TOL), (method, sensitivity / clip)


def _check_vector_loss(model, x, y, clip):
  variables = model.trainable_variables

  def clipped(keep):
    with tf.GradientTape() as tape:
      loss = SCE(tf.gather(y, keep), model(_gather(x, keep), training=True))
    return per_example.clipped_sum_from_vector_loss(loss, variables, clip, tape=tape).grads
  assert removal_sensitivity(clipped, int(y.shape[0])) <= clip * (1 + TOL)


def _property(case, method):
  model, x, y, clip = _materialise(case)
  if method == "fast" and not fast_path_available(model):
    with pytest.raises(ValueError, match="shares no variable between layers|not known to treat"):
      clipped_sum_for_model(model, SCE, x, y, None, clip, None, "fast")
    if not graph_walkable(model):
      return
    method = "auto"  # refused for a layer that may mix the batch: what "auto" (fit) runs
  if method == "jacobian":
    if independence.batch_mixing(model) is not None:
      return  # the vector-loss interface takes the caller's batch loss as per example
    recurrent = any(isinstance(layer, keras.layers.RNN) for layer in model._flatten_layers())  # pylint: disable=protected-access
    if recurrent:  # pfor cannot take the Jacobian through a while loop; covered by the others
      return
    _check_vector_loss(model, x, y, clip)
    return
  _check(model, x, y, clip, method)


PATHS = ["fast", "vectorized", "loop", "jacobian"]
_COMMON = dict(deadline=None, derandomize=True, print_blob=True,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# Default run: the fast path (what fit uses) and the Jacobian path; the vectorized_map and
# loop paths (20-30 s each here) run in the slow suite, with the 60-model version of all four.
@pytest.mark.parametrize("method", [
    "fast", pytest.param("vectorized", marks=pytest.mark.slow),
    pytest.param("loop", marks=pytest.mark.slow), "jacobian"])
@settings(max_examples=6, **_COMMON)
@given(case=cases())
def test_removing_one_example_moves_the_clipped_sum_by_at_most_c(case, method):
  _property(case, method)


# Weightless layers drawn from the family above (most mix the batch), on the fast path (refused
# for mixing layers, then "auto") and the vectorized path.
@pytest.mark.parametrize("method", ["fast", "vectorized"])
@settings(max_examples=4, **_COMMON)
@given(case=cases(builders=[_weightless_model]))
def test_weightless_layers_that_mix_the_batch_keep_the_bound(case, method):
  _property(case, method)


@pytest.mark.slow
@pytest.mark.parametrize("method", PATHS)
@settings(max_examples=60, **_COMMON)
@given(case=cases())
def test_removing_one_example_moves_the_clipped_sum_by_at_most_c_many_models(case, method):
  _property(case, method)
