"""tf_dpkit's code is not rewritten by autograph inside a user's ``tf.function``; the user's own
Python functions still are (``tf_dpkit._autograph``)."""
import functools

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_dpkit
from tf_dpkit import _autograph
from tf_dpkit.clipping import swap

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
B = 8


def _model(hidden=6, classes=3):
  """A small DP MLP (5 features), the same weights on every call."""
  keras.utils.set_random_seed(4)
  layers = [keras.layers.Dense(hidden, activation="tanh"), keras.layers.Dense(classes)]
  return tf_dpkit.DPSequential([keras.Input((5,))] + layers)


def _batch():
  rng = np.random.default_rng(0)
  return (rng.normal(size=(B, 5)).astype(np.float32) * 3,
          rng.integers(0, 3, B).astype(np.int32))


def test_the_cards_step_converts_no_library_function(monkeypatch):
  """In the README's loop (the user's @tf.function, autograph on) autograph transpiles the
  user's step and nothing of tf_dpkit (it transpiled a few hundred of its functions before)."""
  from tensorflow.python.autograph.impl import api  # pylint: disable=g-import-not-at-top,g-direct-tensorflow-import
  converted = []
  original = api._convert_actual  # pylint: disable=protected-access

  def recording(entity, program_ctx):
    converted.append(getattr(entity, "__module__", "") or "")
    return original(entity, program_ctx)

  monkeypatch.setattr(api, "_convert_actual", recording)
  model = _model()
  optimizer = tf_dpkit.DPAdamGaussianOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1,
                                               learning_rate=1e-3, seed=1)

  @tf.function
  def step(x, y):
    with tf.GradientTape() as tape:
      vector_loss = LOSS(y, model(x, training=True))
    optimizer.minimize(vector_loss, model.trainable_variables, tape=tape)

  step(*_batch())
  assert int(optimizer.iterations) == 1
  assert __name__.split(".")[-1] in " ".join(converted)  # the user's step itself (the probe works)
  assert not [m for m in converted if m.startswith("tf_dpkit")]


def _branchy_loss(model, x, y):
  """A vector loss with a Python `if` on a tensor: needs autograph in a graph."""
  per_example = LOSS(y, model(x, training=True))
  if tf.reduce_max(per_example) > -1.0:  # always true
    per_example = per_example * 1.0
  return per_example


@pytest.mark.parametrize("variant", ["keras", "tf_privacy"])
def test_a_zero_argument_loss_keeps_autograph(variant):
  """A callable loss is the user's code: its `if` on a tensor still works in a tf.function,
  and the step equals the one from the tensor loss (no noise, same clip)."""
  x, y = _batch()
  results = []
  for callable_loss in (True, False):
    model = _model()
    if variant == "keras":
      optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
          l2_norm_clip=0.5, noise_multiplier=0.0, learning_rate=1.0)
    else:
      from tf_dpkit.compat.tf_privacy import DPKerasSGDOptimizer  # pylint: disable=g-import-not-at-top
      optimizer = DPKerasSGDOptimizer(l2_norm_clip=0.5, noise_multiplier=0.0,
                                      learning_rate=1.0)

    @tf.function
    def step(x, y, model=model, optimizer=optimizer, callable_loss=callable_loss):
      if callable_loss:
        return optimizer.compute_gradients(lambda: _branchy_loss(model, x, y),
                                           model.trainable_variables)
      with tf.GradientTape() as tape:
        loss = LOSS(y, model(x, training=True))
      return optimizer.compute_gradients(loss, model.trainable_variables, tape=tape)

    results.append([g.numpy() for g, _ in step(x, y)])
  for a, b in zip(*results):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_a_v1_optimizer_callable_loss_keeps_autograph():
  x, y = _batch()
  model = _model()
  optimizer = tf_dpkit.v1.DPGradientDescentGaussianOptimizer(
      l2_norm_clip=0.5, noise_multiplier=0.0, learning_rate=1.0)

  @tf.function
  def step(x, y):
    return optimizer.compute_gradients(lambda: _branchy_loss(model, x, y),
                                       var_list=model.trainable_variables)

  grads = step(x, y)
  assert len(grads) == len(model.trainable_variables)
  # Clipped per example to 0.5 and averaged over B: the mean's norm is at most 0.5.
  norm = np.sqrt(sum(float(tf.reduce_sum(g * g)) for g, _ in grads))
  assert 0.0 < norm <= 0.5 + 1e-6


@_autograph.graph_code
def _library(fn, x):
  return _autograph.user_function(fn)(x)


def _branchy(x):
  if tf.reduce_sum(x) > 0:
    return x + 1.0
  return x - 1.0


def test_user_function_follows_the_callers_autograph_setting():
  converted = tf.function(lambda x: _library(_branchy, x))
  # One trace, both branches: the `if` became a tf.cond.
  assert float(converted(tf.constant([1.0]))[0]) == 2.0
  assert float(converted(tf.constant([-1.0]))[0]) == -2.0
  assert len(converted._list_all_concrete_functions()) == 1  # pylint: disable=protected-access
  assert float(_library(_branchy, tf.constant([-1.0]))[0]) == -2.0  # eager: as written
  as_written = tf.function(lambda x: _library(_branchy, x), autograph=False)
  with pytest.raises(TypeError, match="bool"):  # OperatorNotAllowedInGraphError
    as_written(tf.constant([1.0]))


class _Losses:
  """A user's loss as a method, and as a callable object."""

  def method(self, x):
    return _branchy(x)

  def __call__(self, x):
    return _branchy(x)


@pytest.mark.parametrize("kind", ["method", "partial", "object"])
def test_user_function_converts_methods_partials_and_callable_objects(kind):
  fn = {"method": _Losses().method, "object": _Losses(),
        "partial": functools.partial(lambda x, k: _branchy(x) * k, k=1.0)}[kind]
  converted = tf.function(lambda x: _library(fn, x))
  assert float(converted(tf.constant([1.0]))[0]) == 2.0
  assert float(converted(tf.constant([-1.0]))[0]) == -2.0


def test_user_function_leaves_other_callables_alone():
  assert _autograph.user_function(LOSS) is LOSS  # a Keras loss object
  assert _autograph.user_function(keras.losses.mean_squared_error) is (
      keras.losses.mean_squared_error)
  assert _autograph.user_function(swap.take_record) is swap.take_record
  assert _autograph.user_function(len) is len
  assert _autograph.user_function(_Losses) is _Losses  # a class
  assert _autograph.user_function(3) == 3
  assert _autograph.graph_code(_branchy) is _branchy  # marked, not wrapped


def test_user_function_without_source_runs_as_written():
  namespace = {}
  exec("def no_source(x):\n  return x * 3.0\n", namespace)  # pylint: disable=exec-used
  traced = tf.function(lambda x: _library(namespace["no_source"], x))
  assert float(traced(tf.constant(1.0))) == 3.0


def test_library_steps_refuse_an_autograph_argument():
  with pytest.raises(TypeError, match="autograph="):
    _autograph.function(lambda: 0, autograph=True)
  traced = _autograph.function(reduce_retracing=True)(lambda x: x + 1)
  assert int(traced(tf.constant(1))) == 2


def test_entry_points_keep_their_documentation():
  cls = tf_dpkit.DPAdamGaussianOptimizer
  assert "Private gradients of a vector loss" in cls.compute_gradients.__doc__
  assert cls.minimize.__name__ == "minimize"
  assert "private average gradients" in tf_dpkit.private_gradients.__doc__.lower()
  assert "swap" in tf_dpkit.DPSequential.__call__.__doc__


def _marked(fn):
  return hasattr(fn, "autograph_info__")  # autograph's own mark (tf_dpkit._autograph.graph_code)


def test_every_public_entry_point_is_marked():
  """What a user calls inside their own tf.function is graph code; a new public function that
  is not would make autograph transpile the library behind it again."""
  import tf_dpkit.clipping  # pylint: disable=g-import-not-at-top
  from tf_dpkit.compat import tf_privacy  # pylint: disable=g-import-not-at-top
  registry = {"lookup_rule", "register_layer_rule"}  # plain Python, never traced
  functions = [getattr(tf_dpkit.clipping, n) for n in tf_dpkit.clipping.__all__
               if n not in registry]
  functions = [f for f in functions if callable(f) and not isinstance(f, type)]
  assert len(functions) >= 9
  unmarked = [f.__name__ for f in functions + [tf_dpkit.private_gradients] if not _marked(f)]
  assert not unmarked
  for model_class in (tf_dpkit.DPSequential, tf_dpkit.DPModel, tf_privacy.DPSequential):
    assert _marked(model_class), model_class
  keras_classes = [tf_dpkit.DPAdamGaussianOptimizer, tf_dpkit.DPGradientDescentGaussianOptimizer,
                   tf_privacy.DPKerasAdamOptimizer, tf_privacy.VectorizedDPKerasSGDOptimizer]
  for cls in keras_classes:
    for method in ("compute_gradients", "minimize", "apply", "privatize"):
      assert _marked(getattr(cls, method)), (cls.__name__, method)
  for cls in (tf_dpkit.v1.DPAdamGaussianOptimizer, tf_dpkit.v1.DPGradientDescentGaussianOptimizer):
    for method in ("compute_gradients", "minimize", "apply_gradients", "privatize"):
      assert _marked(getattr(cls, method)), (cls.__name__, method)
