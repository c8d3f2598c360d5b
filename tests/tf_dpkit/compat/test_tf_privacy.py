"""tf_dpkit.compat.tf_privacy: TF Privacy's names and signatures, on tf_dpkit's implementation.

References: TF Privacy 0.9.0's source (signature table below), tf_dpkit's own classes with the
same seed (the compat layer must add nothing), NumPy clipping, dp_accounting and the exact
Gaussian composition (tests/dp_references.py).
"""
import importlib
import inspect
import math
import re

import numpy as np
import pytest
import keras
import tensorflow as tf

import tf_dpkit
from analysis import calibration
from analysis import compute_dp_sgd_privacy as privacy_lib
from tf_dpkit import make_gaussian_optimizer_class
from tf_dpkit.compat import tf_privacy as tfp

import dp_references
import secret_search

# ------------------------------------------------------------------------------------------
# TF Privacy's signatures, written from the source of tensorflow_privacy 0.9.0 (PyPI wheel
# tensorflow_privacy-0.9.0-py3-none-any.whl, the last release):
#   privacy/optimizers/dp_optimizer_keras.py: make_keras_optimizer_class(cls), and
#     DPKeras{SGD,Adam,Adagrad}Optimizer = make_gaussian_query_optimizer_class(...), whose
#     return_gaussian_query_optimizer(l2_norm_clip, noise_multiplier, num_microbatches=None,
#     gradient_accumulation_steps=1, *args, **kwargs);
#   privacy/optimizers/dp_optimizer_keras_vectorized.py: make_vectorized_keras_optimizer_class
#     (cls), DPOptimizerClass.__init__(self, l2_norm_clip, noise_multiplier,
#     num_microbatches=None, unconnected_gradients_to_zero=False, *args, **kwargs);
#   privacy/keras_models/dp_keras_model.py: make_dp_model_class(cls), DPModelClass.__init__(
#     self, l2_norm_clip, noise_multiplier, num_microbatches=None, use_xla=True,
#     layer_registry=None, *args, **kwargs);
#   privacy/analysis/compute_dp_sgd_privacy_lib.py: compute_dp_sgd_privacy_statement(
#     number_of_examples, batch_size, num_epochs, noise_multiplier, delta,
#     used_microbatching=True, max_examples_per_user=None,
#     accountant_type=AccountantType.RDP); compute_dp_sgd_privacy(n, batch_size,
#     noise_multiplier, epochs, delta);
#   privacy/analysis/compute_noise_from_budget_lib.py: compute_noise(n, batch_size,
#     target_epsilon, epochs, delta, noise_lbd).
# ------------------------------------------------------------------------------------------
REQ, ARGS, KWARGS = "<required>", "*args", "**kwargs"
_OPT = [("l2_norm_clip", REQ), ("noise_multiplier", REQ), ("num_microbatches", None),
        ("gradient_accumulation_steps", 1), ARGS, KWARGS]
_VEC = [("l2_norm_clip", REQ), ("noise_multiplier", REQ), ("num_microbatches", None),
        ("unconnected_gradients_to_zero", False), ARGS, KWARGS]
_MODEL = [("l2_norm_clip", REQ), ("noise_multiplier", REQ), ("num_microbatches", None),
          ("use_xla", True), ("layer_registry", None), ARGS, KWARGS]
TF_PRIVACY_SIGNATURES = {
    "DPKerasSGDOptimizer": _OPT, "DPKerasAdamOptimizer": _OPT, "DPKerasAdagradOptimizer": _OPT,
    "VectorizedDPKerasSGDOptimizer": _VEC, "VectorizedDPKerasAdamOptimizer": _VEC,
    "VectorizedDPKerasAdagradOptimizer": _VEC,
    "DPModel": _MODEL, "DPSequential": _MODEL,
    "make_keras_optimizer_class": [("cls", REQ)],
    "make_vectorized_keras_optimizer_class": [("cls", REQ)],
    "make_dp_model_class": [("cls", REQ)],
    "compute_dp_sgd_privacy_statement": [
        ("number_of_examples", REQ), ("batch_size", REQ), ("num_epochs", REQ),
        ("noise_multiplier", REQ), ("delta", REQ), ("used_microbatching", True),
        ("max_examples_per_user", None), ("accountant_type", "AccountantType.RDP")],
    "compute_dp_sgd_privacy": [("n", REQ), ("batch_size", REQ), ("noise_multiplier", REQ),
                               ("epochs", REQ), ("delta", REQ)],
    "compute_noise": [("n", REQ), ("batch_size", REQ), ("target_epsilon", REQ), ("epochs", REQ),
                      ("delta", REQ), ("noise_lbd", REQ)],
}


def _described(fn):
  params = list(inspect.signature(fn).parameters.values())
  if params and params[0].name == "self":
    params = params[1:]
  out = []
  for p in params:
    if p.kind is p.VAR_POSITIONAL:
      out.append(ARGS)
    elif p.kind is p.VAR_KEYWORD:
      out.append(KWARGS)
    else:
      assert p.kind is p.POSITIONAL_OR_KEYWORD, p
      default = REQ if p.default is p.empty else p.default
      out.append((p.name, str(default) if isinstance(default, tfp.AccountantType) else default))
  return out


@pytest.mark.parametrize("name", sorted(TF_PRIVACY_SIGNATURES))
def test_every_name_has_tf_privacy_s_signature(name):
  obj = getattr(tfp, name)
  fn = obj.__init__ if isinstance(obj, type) else getattr(obj, "__wrapped__", obj)
  assert _described(fn) == TF_PRIVACY_SIGNATURES[name]
  assert name in tfp.__all__


def test_library_namespaces_and_aliases_are_the_same_functions():
  assert tfp.compute_noise_from_budget is tfp.compute_noise
  assert tfp.compute_noise_from_budget_lib.compute_noise is tfp.compute_noise
  lib = tfp.compute_dp_sgd_privacy_lib
  assert lib.compute_dp_sgd_privacy_statement is tfp.compute_dp_sgd_privacy_statement
  assert lib.compute_dp_sgd_privacy is tfp.compute_dp_sgd_privacy
  assert lib.AccountantType is tfp.AccountantType


# ------------------------------------------------------------------------------------------
# Optimizers.

RNG = np.random.default_rng(3)
X = RNG.normal(size=(8, 5)).astype(np.float32)
Y = RNG.normal(size=(8, 1)).astype(np.float32)
W0 = RNG.normal(size=(5, 1)).astype(np.float32)


def _vector_loss(w):
  return tf.reduce_sum(tf.square(tf.matmul(X, w) - Y), axis=1)  # one entry per example


def _private_grad(optimizer):
  w = tf.Variable(W0)
  with tf.GradientTape() as tape:
    loss = _vector_loss(w)
  (grad, _), = optimizer.compute_gradients(loss, [w], tape=tape)
  return grad.numpy()


COMPAT_OPTIMIZERS = [
    ("DPKerasSGDOptimizer", keras.optimizers.SGD),
    ("DPKerasAdamOptimizer", keras.optimizers.Adam),
    ("DPKerasAdagradOptimizer", keras.optimizers.Adagrad),
    ("VectorizedDPKerasSGDOptimizer", keras.optimizers.SGD),
    ("VectorizedDPKerasAdamOptimizer", keras.optimizers.Adam),
    ("VectorizedDPKerasAdagradOptimizer", keras.optimizers.Adagrad),
]


@pytest.mark.parametrize("name,base", COMPAT_OPTIMIZERS, ids=[n for n, _ in COMPAT_OPTIMIZERS])
def test_each_optimizer_is_tf_dpkit_s_class_with_tf_privacy_s_constructor(name, base):
  compat_cls = getattr(tfp, name)
  assert compat_cls.__name__ == name and issubclass(compat_cls, base)
  assert issubclass(compat_cls, make_gaussian_optimizer_class(base))
  opt = compat_cls(l2_norm_clip=0.7, noise_multiplier=1.3, num_microbatches=2, learning_rate=0.1)
  assert tf_dpkit.is_dp_optimizer(opt)
  assert (opt.l2_norm_clip, opt.noise_multiplier, opt.num_microbatches) == (0.7, 1.3, 2)


@pytest.mark.parametrize("name,num_microbatches", [("DPKerasSGDOptimizer", None),
                                                   ("VectorizedDPKerasAdamOptimizer", 2)])
def test_private_gradient_equals_tf_dpkit_s_with_the_same_seed(name, num_microbatches):
  # Every compat class computes gradients by the same inherited path (the update rule only
  # acts afterwards), so one plain and one vectorized class cover them.
  compat_cls = getattr(tfp, name)
  base = compat_cls._dp_base_class  # pylint: disable=protected-access
  compat = compat_cls(l2_norm_clip=0.7, noise_multiplier=1.3, num_microbatches=num_microbatches,
                      learning_rate=0.1, seed=11)
  ours = make_gaussian_optimizer_class(base)(0.7, 1.3, num_microbatches, learning_rate=0.1,
                                             seed=11)
  other_seed = compat_cls(0.7, 1.3, num_microbatches, learning_rate=0.1, seed=12)
  grads = [_private_grad(o) for o in (compat, ours, other_seed)]
  np.testing.assert_array_equal(grads[0], grads[1])
  assert np.abs(grads[2] - grads[1]).max() > 1e-3  # the noise is there, and keyed by the seed


def _clipped_reference(clip, m):
  per_example = 2 * (X @ W0 - Y) * X
  groups = per_example.reshape(m, -1, 5).mean(axis=1)
  norms = np.linalg.norm(groups, axis=1, keepdims=True)
  return (groups * np.minimum(1.0, clip / norms)).sum(axis=0).reshape(5, 1) / m


def test_positional_arguments_follow_tf_privacy_s_order():
  # TF Privacy: (l2_norm_clip, noise_multiplier, num_microbatches, gradient_accumulation_steps /
  # unconnected_gradients_to_zero, *args -> the Keras class: learning_rate first).
  vectorized = tfp.VectorizedDPKerasSGDOptimizer(0.5, 0.0, 4, True, 1.0)
  assert (vectorized.l2_norm_clip, vectorized.num_microbatches) == (0.5, 4)
  assert float(vectorized.learning_rate.numpy()) == 1.0
  opt = tfp.DPKerasSGDOptimizer(0.5, 0.0, 4, 1, 1.0)
  assert (opt.l2_norm_clip, opt.noise_multiplier, opt.num_microbatches) == (0.5, 0.0, 4)
  # One step with callables for the loss and var_list (TF Privacy allows both) against NumPy.
  w = keras.Variable(W0, name="w")
  opt.minimize(lambda: _vector_loss(w), var_list=lambda: [w])
  np.testing.assert_allclose(w.numpy(), W0 - _clipped_reference(0.5, 4), rtol=1e-5, atol=1e-6)


def test_keras_2_method_names_refuse_grad_loss():
  w = keras.Variable(W0, name="w")
  opt = tfp.DPKerasSGDOptimizer(0.5, 0.0, 4, learning_rate=1.0)
  keras_2_compute = opt._compute_gradients  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="grad_loss is not supported"):
    keras_2_compute(lambda: _vector_loss(w), [w], grad_loss=tf.ones([8]))
  with pytest.raises(ValueError, match="grad_loss is not supported"):
    opt.minimize(lambda: _vector_loss(w), [w], grad_loss=tf.ones([8]))
  np.testing.assert_array_equal(w.numpy(), W0)


def test_bad_dp_arguments_are_refused_before_anything_is_built():
  with pytest.raises(ValueError, match="l2_norm_clip"):
    tfp.DPKerasSGDOptimizer(0.0, 1.0)
  with pytest.raises(ValueError, match="noise_multiplier"):
    tfp.DPKerasAdamOptimizer(1.0, -1.0)
  with pytest.raises(ValueError, match="num_microbatches"):
    tfp.DPKerasSGDOptimizer(1.0, 1.0, True)
  with pytest.raises(ValueError, match="gradient_accumulation_steps must be"):
    tfp.DPKerasSGDOptimizer(1.0, 1.0, None, 0)
  with pytest.raises(ValueError, match="gradient_accumulation_steps must be"):
    tfp.DPKerasSGDOptimizer(1.0, 1.0, None, True)
  with pytest.raises(ValueError, match="noise_multiplier"):
    tfp.DPKerasSGDOptimizer(1.0, float("inf"), None, 2)
  with pytest.raises(TypeError, match="unconnected_gradients_to_zero must be True or False"):
    tfp.VectorizedDPKerasSGDOptimizer(1.0, 1.0, None, "yes")


def _accumulate(opt, w, micro_batches, loss_of):
  """One minimize per micro-batch; returns the weights after each."""
  out = []
  for rows in micro_batches:
    with tf.GradientTape() as tape:
      loss = loss_of(w, rows)
    opt.minimize(loss, [w], tape=tape)
    out.append(w.numpy().copy())
  return out


def _rows_loss(w, rows):
  return tf.reduce_sum(tf.square(tf.matmul(X[rows], w) - Y[rows]), axis=1)


def test_gradient_accumulation_gives_tf_privacy_s_update():
  halves = [slice(0, 4), slice(4, 8)]
  # Noise 0: TF Privacy applied, on the k-th call, the mean over the k micro-steps of
  # (clipped sum / M) -- a NumPy reference of that rule.
  opt = tfp.DPKerasSGDOptimizer(0.5, 0.0, 2, 2, 1.0)
  w = tf.Variable(W0)
  first, second = _accumulate(opt, w, halves, _rows_loss)
  np.testing.assert_array_equal(first, W0)  # nothing applied before the k-th micro-step
  per_example = 2 * (X @ W0 - Y) * X
  steps = []
  for rows in halves:
    groups = per_example[rows].reshape(2, -1, 5).mean(axis=1)
    norms = np.linalg.norm(groups, axis=1, keepdims=True)
    steps.append((groups * np.minimum(1.0, 0.5 / norms)).sum(axis=0).reshape(5, 1) / 2)
  np.testing.assert_allclose(second, W0 - np.mean(steps, axis=0), rtol=1e-5, atol=1e-6)
  # With noise: exactly tf_dpkit's accumulation at noise sigma sqrt(k), same seed.
  compat = tfp.DPKerasSGDOptimizer(0.5, 1.3, 2, 2, 1.0, seed=5)
  ours = tf_dpkit.DPGradientDescentGaussianOptimizer(0.5, 1.3 * math.sqrt(2), 2, 1.0, seed=5,
                                                     gradient_accumulation_steps=2)
  assert compat.noise_multiplier == ours.noise_multiplier and compat.accumulation_steps == 2
  w_compat, w_ours = tf.Variable(W0), tf.Variable(W0)
  np.testing.assert_array_equal(_accumulate(compat, w_compat, halves, _rows_loss)[-1],
                                _accumulate(ours, w_ours, halves, _rows_loss)[-1])
  config = compat.get_config()
  assert (config["noise_multiplier"], config["gradient_accumulation_steps"]) == (1.3, 2)
  assert tfp.DPKerasSGDOptimizer.from_config(config).noise_multiplier == compat.noise_multiplier


def test_gradient_accumulation_noise_std_is_tf_privacy_s():
  # Zero gradients: TF Privacy's update after k micro-steps of 8 examples was
  # (1/k) sum_j N(0, (sigma C)^2) / 8, std sigma C sqrt(k) / (8 k) = 1.0 * 2 / 32 for k = 4.
  # 20,000 coordinates: relative standard error 0.5%; we allow 3%.
  big = tf.Variable(tf.zeros([20000]))
  opt = tfp.DPKerasSGDOptimizer(1.0, 1.0, None, 4, 1.0, seed=3)
  _accumulate(opt, big, [None] * 4, lambda w, _: tf.zeros([8]) + 0.0 * tf.reduce_sum(w))
  assert np.std(big.numpy()) == pytest.approx(2 / 32, rel=0.03)


def test_config_round_trip_keeps_tf_privacy_s_arguments_and_no_secret():
  opt = tfp.VectorizedDPKerasAdamOptimizer(1.5, 0.9, 2, True, 0.01, seed=123456789)
  config = opt.get_config()
  assert config["noise_multiplier"] == 0.9 and config["unconnected_gradients_to_zero"] is True
  assert "seed" not in config and "123456789" not in repr(config)
  again = tfp.VectorizedDPKerasAdamOptimizer.from_config(config)
  assert type(again) is type(opt) and again.get_config() == config
  sgd = tfp.DPKerasSGDOptimizer(1.0, 1.1, 4, learning_rate=0.5, momentum=0.9)
  restored = keras.optimizers.deserialize(keras.optimizers.serialize(sgd))
  assert type(restored) is tfp.DPKerasSGDOptimizer
  assert restored.get_config() == sgd.get_config()


def test_make_keras_optimizer_class_wraps_any_keras_class_and_refuses_the_rest():
  cls = tfp.make_keras_optimizer_class(keras.optimizers.RMSprop)
  assert cls is tfp.make_keras_optimizer_class(keras.optimizers.RMSprop)
  assert cls.__name__ == "DPKerasRMSpropOptimizer" and issubclass(cls, keras.optimizers.RMSprop)
  assert tf_dpkit.is_dp_optimizer(cls(1.0, 1.0, learning_rate=0.01))
  vec = tfp.make_vectorized_keras_optimizer_class(keras.optimizers.RMSprop)
  assert vec.__name__ == "VectorizedDPKerasRMSpropOptimizer"
  assert tfp.make_keras_optimizer_class(keras.optimizers.SGD) is tfp.DPKerasSGDOptimizer
  with pytest.raises(TypeError, match="Keras 3 has no legacy optimizers"):
    tfp.make_keras_optimizer_class(tf.keras.optimizers.legacy.SGD)
  with pytest.raises(TypeError, match="make_gaussian_optimizer_class"):
    tfp.make_keras_optimizer_class(tf.compat.v1.train.GradientDescentOptimizer)
  with pytest.raises(TypeError, match="optimizer class"):
    tfp.make_vectorized_keras_optimizer_class(keras.optimizers.SGD(0.1))


# ------------------------------------------------------------------------------------------
# Models.

XM = RNG.normal(size=(16, 3)).astype(np.float32)
YM = RNG.integers(0, 2, size=16)
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def _layers():
  return [keras.Input((3,)), keras.layers.Dense(4, activation="tanh", name="hidden"),
          keras.layers.Dense(2, name="out")]


def test_plain_keras_model_with_a_tf_privacy_optimizer_gets_the_one_line_change():
  model = tf.keras.Sequential(_layers())
  before = [w.copy() for w in model.get_weights()]
  model.compile(optimizer=tfp.DPKerasAdamOptimizer(1.0, 1.1, learning_rate=0.1), loss=LOSS)
  with pytest.raises(ValueError, match=r"(?s)DPKerasAdamOptimizer received.*WITHOUT privacy.*"
                     r"Keras 3.*One-line change.*tf_dpkit\.DPSequential\(\[\.\.\.same layers"
                     r".*tf_dpkit\.compat\.tf_privacy\.DPSequential"):
    model.fit(XM, YM, batch_size=8, verbose=0)
  for a, b in zip(before, model.get_weights()):
    np.testing.assert_array_equal(a, b)


def test_dp_sequential_with_model_settings_trains_exactly_like_tf_dpkit_s():
  # Noise 0 and an active clip (0.05): the step is deterministic, so the two must agree exactly.
  # Seeded initial weights: the check that every weight moved (> 1e-4) depended on the draw
  # (an unseeded run moved one array by 9.75e-5).
  keras.utils.set_random_seed(0)
  compat = tfp.DPSequential(l2_norm_clip=0.05, noise_multiplier=0.0, num_microbatches=4,
                            layers=_layers())
  ours = tf_dpkit.DPSequential(_layers())
  ours.set_weights(compat.get_weights())
  compat.compile(optimizer=keras.optimizers.SGD(learning_rate=0.5, momentum=0.5), loss=LOSS)
  ours.compile(optimizer=tf_dpkit.DPGradientDescentGaussianOptimizer(
      0.05, 0.0, 4, learning_rate=0.5, momentum=0.5), loss=LOSS)
  assert type(compat.optimizer) is make_gaussian_optimizer_class(keras.optimizers.SGD)
  assert compat.optimizer.get_config() | {"name": None} == ours.optimizer.get_config() | {
      "name": None}
  assert (compat.l2_norm_clip, compat.noise_multiplier) == (0.05, 0.0)
  start = compat.get_weights()
  compat.fit(XM, YM, batch_size=8, shuffle=False, verbose=0)
  ours.fit(XM, YM, batch_size=8, shuffle=False, verbose=0)
  for a, b, s in zip(compat.get_weights(), ours.get_weights(), start):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
    assert np.abs(a - s).max() > 1e-4


def test_functional_dp_model_wraps_optimizer_names_and_saves_no_noise_key(tmp_path):
  inputs = keras.Input((3,))
  outputs = keras.layers.Dense(2)(keras.layers.Dense(4, activation="tanh")(inputs))
  model = tfp.DPModel(l2_norm_clip=1.0, noise_multiplier=0.5, inputs=inputs, outputs=outputs)
  model.compile(optimizer="adam", loss=LOSS, metrics=["accuracy"])
  opt = model.optimizer
  assert isinstance(opt, keras.optimizers.Adam) and tf_dpkit.is_dp_optimizer(opt)
  assert (opt.l2_norm_clip, opt.noise_multiplier, opt.num_microbatches) == (1.0, 0.5, None)
  history = model.fit(XM, YM, batch_size=8, verbose=0)
  assert np.isfinite(history.history["loss"][0]) and int(opt.iterations.numpy()) == 2
  model.save(tmp_path / "m.keras")
  model.save_weights(tmp_path / "m.weights.h5")
  key = int(opt.dp_settings.noise_key)
  assert secret_search.files_holding(tmp_path, key) == []
  assert len(list(secret_search.written_bytes(tmp_path))) > 2  # the search did read the files


def test_dp_model_errors_name_the_argument():
  with pytest.raises(ValueError, match="Boolean value supplied for num_microbatches.*use_xla"):
    tfp.DPSequential(1.0, 1.0, True, layers=_layers())
  with pytest.raises(ValueError, match="layer_registry is not supported.*register_layer_rule"):
    tfp.DPSequential(1.0, 1.0, layer_registry=object(), layers=_layers())
  with pytest.raises(ValueError, match="l2_norm_clip"):
    tfp.DPSequential(float("nan"), 1.0, layers=_layers())
  with pytest.raises(ValueError, match="num_microbatches"):
    tfp.DPSequential(1.0, 1.0, 0, layers=_layers())
  model = tfp.DPSequential(1.0, 1.1, 4, use_xla=False, layers=_layers())
  with pytest.raises(ValueError, match=r"DP optimizer passed to compile\(\) has 1.0, 1.2, 4"):
    model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.2, 4), loss=LOSS)
  model.compile(tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.1, 4), loss=LOSS)  # same: ok
  used = keras.optimizers.SGD(0.1)
  used.build([keras.Variable(np.zeros(2, np.float32))])
  with pytest.raises(ValueError, match="already used"):
    model.compile(used, loss=LOSS)
  with pytest.raises(TypeError, match="needs a Keras optimizer"):
    model.compile(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)), loss=LOSS)


# ------------------------------------------------------------------------------------------
# Privacy statement and calibration.

_LINE = re.compile(r"^    (Epsilon with each example occurring once per epoch:|"
                   r"Epsilon assuming Poisson sampling \(\*\):)\s+(\S+)", re.M)


def _epsilons(text):
  return [(label, float(value)) for label, value in _LINE.findall(text)]


def test_statement_numbers_are_analysis_own_and_match_independent_references():
  n, b, epochs, sigma, delta = 60000, 256, 3, 1.1, 1e-5
  text = tfp.compute_dp_sgd_privacy_statement(n, b, epochs, sigma, delta)  # microbatching: TF
  # Privacy's default, sensitivity 2C: effective noise multiplier sigma / 2.
  result = privacy_lib.compute_dp_sgd_privacy(n, b, sigma, epochs, delta, used_microbatching=True)
  (l0, once), (l1, poisson) = _epsilons(text)
  assert "once per epoch" in l0 and "Poisson" in l1
  assert f"{once:.3f}" == f"{result.epsilon_no_amplification:.3f}"
  assert f"{poisson:.3f}" == f"{result.epsilon:.3f}"
  exact = dp_references.exact_gaussian_epsilon(sigma / 2, epochs, delta)
  assert once == pytest.approx(exact, abs=6e-4)
  dpa = dp_references.dp_accounting()
  steps = math.ceil(epochs * n / b)
  event = dpa.SelfComposedDpEvent(
      dpa.PoissonSampledDpEvent(b / n, dpa.GaussianDpEvent(sigma / 2)), steps)
  reference = dpa.rdp.RdpAccountant().compose(event).get_epsilon(delta)
  assert poisson == pytest.approx(reference, rel=0.015)  # RDP bounds over different order grids
  # Without microbatching the per-example noise multiplier is used.
  text = tfp.compute_dp_sgd_privacy_statement(n, b, epochs, sigma, delta,
                                              used_microbatching=False)
  (_, once_pe), (_, poisson_pe) = _epsilons(text)
  assert once_pe == pytest.approx(dp_references.exact_gaussian_epsilon(sigma, epochs, delta),
                                  abs=6e-4)
  assert poisson_pe < poisson / 2


def test_statement_has_tf_privacy_s_layout_and_user_level_lines():
  text = tfp.compute_dp_sgd_privacy_statement(
      number_of_examples=60000, batch_size=256, num_epochs=2, noise_multiplier=1.1, delta=1e-5,
      used_microbatching=False, max_examples_per_user=3,
      accountant_type=tfp.AccountantType.RDP)
  paragraphs = text.split("\n\n")
  assert text.endswith("\n") and all(len(line) <= 80 for line in text.splitlines())
  assert paragraphs[0].replace("\n", " ") == (
      "DP-SGD performed over 60000 examples with 256 examples per iteration, noise multiplier "
      "1.1 for 2 epochs without microbatching, and at most 3 examples per user.")
  flat = [p.replace("\n", " ") for p in paragraphs]
  assert flat[2].startswith("Example-level DP with add-or-remove-one adjacency at delta = "
                            "1e-05 computed with RDP accounting:")
  assert flat[3].startswith("User-level DP with add-or-remove-one adjacency")
  assert flat[-1].startswith("(*) Holds only if every batch was a Poisson sample")
  # The two labels line their numbers up in one column, as in TF Privacy.
  lines = [line for line in text.splitlines() if line.startswith("    Epsilon")]
  assert len(lines) == 4 and len({len(line) for line in lines}) == 1
  result = privacy_lib.compute_dp_sgd_privacy(60000, 256, 1.1, 2, 1e-5, max_examples_per_user=3)
  values = [v for _, v in _epsilons(text)]
  assert values == [round(x, 3) for x in (result.epsilon_no_amplification, result.epsilon,
                                          result.user_epsilon_no_amplification,
                                          result.user_epsilon)]
  # user-level once per epoch: the Gaussian with noise / k, exact.
  assert values[2] == pytest.approx(dp_references.exact_gaussian_epsilon(1.1 / 3, 2, 1e-5),
                                    abs=6e-4)
  no_users = tfp.compute_dp_sgd_privacy_statement(60000, 256, 2, 1.1, 1e-5)
  assert "no bound on number of examples per user" in no_users.split("\n\n")[0].replace("\n", " ")
  assert "no user-level guarantee" in no_users.replace("\n", " ")


# What TF Privacy 0.9.0 itself prints (its compute_dp_sgd_privacy_lib and
# compute_noise_from_budget_lib, run with dp_accounting on this project's machine, 2026-11-24):
# (number_of_examples, batch_size, num_epochs, noise_multiplier, delta, used_microbatching,
#  max_examples_per_user) -> the epsilon lines, in order.
TF_PRIVACY_0_9_0_STATEMENTS = {
    (60000, 250, 15, 1.3, 1e-5, False, None): [17.648, 0.942],
    (60000, 256, 60, 1.1, 1e-5, False, None): [56.950, 2.597],
    (60000, 256, 3, 1.1, 1e-5, True, None): [18.950, 5.824],
    (60000, 256, 2, 1.1, 1e-5, False, 3): [6.327, 0.807, 32.503, 3.055],
}
TF_PRIVACY_0_9_0_FIRST_PARAGRAPH = (
    "DP-SGD performed over 60000 examples with 250 examples per iteration, noise multiplier 1.3 "
    "for 15 epochs without microbatching, and no bound on number of examples per user.")
TF_PRIVACY_0_9_0_COMPUTE_NOISE = 1.0144944982347233  # compute_noise(60000, 256, 3.0, 60, 1e-5, 1e-6)


@pytest.mark.parametrize("args", sorted(TF_PRIVACY_0_9_0_STATEMENTS, key=str))
def test_statement_against_tf_privacy_s_own_output(args):
  text = tfp.compute_dp_sgd_privacy_statement(*args)
  ours = [v for _, v in _epsilons(text)]
  theirs = TF_PRIVACY_0_9_0_STATEMENTS[args]
  assert len(ours) == len(theirs)
  for i, (a, b) in enumerate(zip(ours, theirs)):
    if i % 2 == 0:  # once per epoch: exact here, an RDP or group-privacy bound there
      assert a <= b
    else:  # Poisson: RDP bounds over different orders; user level: group privacy, two ways
      assert a == pytest.approx(b, rel=0.01 if i == 1 else 0.08)
  if args[0:4] == (60000, 250, 15, 1.3):
    assert text.split("\n\n")[0].replace("\n", " ") == TF_PRIVACY_0_9_0_FIRST_PARAGRAPH


def test_compute_noise_against_tf_privacy_s_own_output():
  sigma = tfp.compute_noise(60000, 256, 3.0, 60, 1e-5, 1e-6)
  assert sigma == pytest.approx(TF_PRIVACY_0_9_0_COMPUTE_NOISE, rel=0.005)


def test_statement_pld_accountant_and_errors():
  text = tfp.compute_dp_sgd_privacy_statement(60000, 256, 2, 1.1, 1e-5, False, None, "PLD")
  result = privacy_lib.compute_dp_sgd_privacy(60000, 256, 1.1, 2, 1e-5, accountant="pld")
  assert "computed with PLD accounting" in text.replace("\n", " ")
  assert [v for _, v in _epsilons(text)] == [round(result.epsilon_no_amplification, 3),
                                             round(result.epsilon, 3)]
  rdp = tfp.compute_dp_sgd_privacy_statement(60000, 256, 2, 1.1, 1e-5, False)
  assert _epsilons(text)[1][1] <= _epsilons(rdp)[1][1]
  with pytest.raises(ValueError, match="accountant_type must be"):
    tfp.compute_dp_sgd_privacy_statement(60000, 256, 2, 1.1, 1e-5, accountant_type="GDP")
  with pytest.raises(ValueError, match="batch_size must be in"):
    tfp.compute_dp_sgd_privacy_statement(100, 256, 2, 1.1, 1e-5)
  with pytest.raises(ValueError, match="delta"):
    tfp.compute_dp_sgd_privacy_statement(60000, 256, 2, 1.1, 1.5)


def test_deprecated_compute_dp_sgd_privacy_returns_epsilon_and_order():
  eps, order = tfp.compute_dp_sgd_privacy(n=60000, batch_size=256, noise_multiplier=1.1,
                                          epochs=60, delta=1e-5)
  result = privacy_lib.compute_dp_sgd_privacy(60000, 256, 1.1, 60, 1e-5)
  assert (eps, order) == (result.epsilon, result.optimal_order)
  dpa = dp_references.dp_accounting()
  # TF Privacy's own orders and dp_accounting's RDP: ours is never above, and close.
  orders = [1.25, 1.5, 1.75, 2.0, 2.25, 2.5, 3.0, 3.5, 4.0, 4.5] + list(range(5, 64)) + [128]
  event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(256 / 60000, dpa.GaussianDpEvent(1.1)),
                                  math.ceil(60 * 60000 / 256))
  reference = dpa.rdp.RdpAccountant(orders).compose(event).get_epsilon(1e-5)
  assert reference * 0.98 <= eps <= reference * (1 + 1e-9)


def test_compute_noise_is_analysis_calibration_and_meets_the_budget(capsys):
  sigma = tfp.compute_noise(60000, 256, 3.0, 60, 1e-5, 1e-6)
  steps = math.ceil(60 * 60000 / 256)
  assert sigma == calibration.compute_noise_multiplier(3.0, 1e-5, 256 / 60000, steps)
  assert "noise_multiplier = " in capsys.readouterr().out
  eps_at = lambda s: privacy_lib.compute_dp_sgd_privacy(60000, 256, s, 60, 1e-5).epsilon
  assert eps_at(sigma) <= 3.0 < eps_at(sigma * (1 - 2e-4))
  dpa = dp_references.dp_accounting()
  event = dpa.SelfComposedDpEvent(dpa.PoissonSampledDpEvent(256 / 60000,
                                                            dpa.GaussianDpEvent(sigma)), steps)
  assert dpa.rdp.RdpAccountant().compose(event).get_epsilon(1e-5) == pytest.approx(3.0, rel=0.02)
  # TF Privacy returned 0 (no noise) when noise_lbd already met the budget: here, the noise.
  assert tfp.compute_noise(60000, 256, 3.0, 60, 1e-5, noise_lbd=5.0) == sigma
  with pytest.raises(ValueError, match="noise_lbd"):
    tfp.compute_noise(60000, 256, 3.0, 60, 1e-5, 0.0)
  with pytest.raises(ValueError, match="batch_size must be in"):
    tfp.compute_noise(100, 256, 3.0, 60, 1e-5, 1e-6)
  with pytest.raises(ValueError, match="target_epsilon"):
    tfp.compute_noise(60000, 256, -1.0, 60, 1e-5, 1e-6)


# ------------------------------------------------------------------------------------------
# TF Privacy's Keras tutorials (tutorials/Classification_Privacy.ipynb: DPKerasSGDOptimizer on a
# tf.keras.Sequential; tutorials/mnist_dpsgd_tutorial_keras_model.py: DPSequential with a plain
# optimizer), their code kept as it is except the imports, on a slice of MNIST.

def _tutorial_mnist(examples=None, split="train"):
  from tf_dpkit.data import mnist  # pylint: disable=g-import-not-at-top
  train, test = mnist.load()
  data, labels = train if split == "train" else test
  data = np.array(data[:examples], dtype=np.float32) / 255
  data = data.reshape(data.shape[0], 28, 28, 1)
  labels = np.array(labels[:examples], dtype=np.int32)
  labels = tf.keras.utils.to_categorical(labels, num_classes=10)
  return data, labels


def _tutorial_layers():
  return [
      tf.keras.layers.Conv2D(16, 8, strides=2, padding="same", activation="relu",
                             input_shape=(28, 28, 1)),
      tf.keras.layers.MaxPool2D(2, 1),
      tf.keras.layers.Conv2D(32, 4, strides=2, padding="valid", activation="relu"),
      tf.keras.layers.MaxPool2D(2, 1),
      tf.keras.layers.Flatten(),
      tf.keras.layers.Dense(32, activation="relu"),
      tf.keras.layers.Dense(10),
  ]


def _classification_tutorial(train_data, train_labels, epochs, one_line_change):
  """The tutorial's cells; only `DPKerasSGDOptimizer`'s import differs (from tf_dpkit.compat),
  and with ``one_line_change`` the model line reads `tf_dpkit.DPSequential([` for
  `tf.keras.Sequential([`."""
  from tf_dpkit.compat.tf_privacy import DPKerasSGDOptimizer  # pylint: disable=g-import-not-at-top
  batch_size = 250
  l2_norm_clip = 1.5
  noise_multiplier = 1.3
  num_microbatches = 250
  learning_rate = 0.25
  if batch_size % num_microbatches != 0:
    raise ValueError("Batch size should be an integer multiple of the number of microbatches")
  sequential = tf_dpkit.DPSequential if one_line_change else tf.keras.Sequential
  model = sequential(_tutorial_layers())
  optimizer = DPKerasSGDOptimizer(
      l2_norm_clip=l2_norm_clip,
      noise_multiplier=noise_multiplier,
      num_microbatches=num_microbatches,
      learning_rate=learning_rate)
  loss = tf.keras.losses.CategoricalCrossentropy(
      from_logits=True, reduction=tf.losses.Reduction.NONE)
  model.compile(optimizer=optimizer, loss=loss, metrics=["accuracy"])
  history = model.fit(train_data, train_labels, epochs=epochs, batch_size=batch_size, verbose=0)
  return model, history


@pytest.mark.filterwarnings("ignore:Do not pass an `input_shape`")  # the tutorials' layers
def test_tf_privacy_keras_tutorials_run_with_the_imports_changed():
  train_data, train_labels = _tutorial_mnist(250)
  # Unchanged: Keras 3 cannot make a plain Sequential private through the optimizer.
  with pytest.raises(ValueError, match=r"(?s)WITHOUT privacy.*One-line change.*"
                     r"model = tf_dpkit\.DPSequential\(\[\.\.\.same layers\.\.\.\]\)"):
    _classification_tutorial(train_data, train_labels, 1, one_line_change=False)
  # With the one-line change it trains: one private step of the tutorial's optimizer.
  model, history = _classification_tutorial(train_data, train_labels, 1, one_line_change=True)
  assert int(model.optimizer.iterations.numpy()) == 1 and np.isfinite(history.history["loss"][0])
  assert (model.optimizer.l2_norm_clip, model.optimizer.noise_multiplier,
          model.optimizer.num_microbatches) == (1.5, 1.3, 250)


def _keras_model_tutorial(train_data, train_labels, epochs):
  """tutorials/mnist_dpsgd_tutorial_keras_model.py's model, compile and fit (its flag
  defaults), with only the import of DPSequential changed."""
  from tf_dpkit.compat.tf_privacy import DPSequential  # pylint: disable=g-import-not-at-top
  layers = _tutorial_layers()
  model = DPSequential(
      l2_norm_clip=1.0,
      noise_multiplier=1.1,
      num_microbatches=250,
      layers=layers,
  )
  optimizer = tf.keras.optimizers.SGD(learning_rate=0.15)
  loss = tf.keras.losses.CategoricalCrossentropy(from_logits=True)
  model.compile(optimizer=optimizer, loss=loss, metrics=["accuracy"])
  model.fit(train_data, train_labels, epochs=epochs, batch_size=250, verbose=0)
  return model


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:Do not pass an `input_shape`")
def test_tf_privacy_keras_tutorials_learn():
  # Full MNIST, 3 of the tutorials' epochs (720 noisy steps of batch 250), test set accuracy.
  x, y = _tutorial_mnist()
  x_test, y_test = _tutorial_mnist(split="test")
  model, _ = _classification_tutorial(x, y, 3, one_line_change=True)
  _, accuracy = model.evaluate(x_test, y_test, verbose=0)
  model = _keras_model_tutorial(x, y, 3)
  _, accuracy_model = model.evaluate(x_test, y_test, verbose=0)
  assert (model.optimizer.l2_norm_clip, model.optimizer.noise_multiplier) == (1.0, 1.1)
  print(f"test accuracy after 3 epochs: {accuracy:.4f} (DPKerasSGDOptimizer), "
        f"{accuracy_model:.4f} (DPSequential)")
  assert accuracy > 0.85 and accuracy_model > 0.85, (accuracy, accuracy_model)


def test_dp_sequential_given_layers_first_shows_both_right_calls():
  # Issue 34: tensorflow_privacy.DPSequential([...layers...]) put the layer list into
  # l2_norm_clip and failed with "missing 1 required positional argument".
  layers = [keras.Input((3,)), keras.layers.Dense(2)]
  with pytest.raises(TypeError, match=re.escape(
      "DPSequential(...) got a list of layers as its first argument. TF Privacy's DPSequential "
      "takes the DP settings first: tf_dpkit.compat.tf_privacy.DPSequential(l2_norm_clip=1.0, "
      "noise_multiplier=1.1, layers=[...])")) as raised:
    tfp.DPSequential(layers)
  assert "tf_dpkit.DPSequential([...layers...])" in str(raised.value)
  with pytest.raises(TypeError, match="got no noise_multiplier"):
    tfp.DPSequential(l2_norm_clip=1.0, layers=layers)
  with pytest.raises(TypeError, match=re.escape("DPModel(l2_norm_clip=1.0, noise_multiplier=1.1, "
                                                "inputs=..., outputs=...)")):
    tfp.DPModel([layers[0]])
  model = tfp.DPSequential(l2_norm_clip=1.0, noise_multiplier=1.1, layers=layers)
  assert len(model.layers) == 1


@pytest.mark.parametrize("path, names", [
    ("privacy.optimizers.dp_optimizer_keras", ["DPKerasSGDOptimizer", "DPKerasAdamOptimizer",
                                               "DPKerasAdagradOptimizer",
                                               "make_keras_optimizer_class"]),
    ("privacy.optimizers.dp_optimizer_keras_vectorized", ["VectorizedDPKerasSGDOptimizer"]),
    ("privacy.keras_models.dp_keras_model", ["DPModel", "DPSequential", "make_dp_model_class"]),
    ("privacy.analysis.compute_dp_sgd_privacy_lib", ["compute_dp_sgd_privacy_statement",
                                                     "compute_dp_sgd_privacy"]),
    ("privacy.analysis.compute_noise_from_budget_lib", ["compute_noise"]),
])
def test_tf_privacys_deep_module_paths_import_the_same_objects(path, names):
  # Issue 34: a find-and-replace of `tensorflow_privacy` left deep imports that raised a bare
  # ModuleNotFoundError.
  module = importlib.import_module(f"tf_dpkit.compat.tf_privacy.{path}")
  for name in names:
    assert getattr(module, name) is getattr(tfp, name)


def test_tf_privacys_v1_optimizer_and_rdp_paths_are_tf_dpkits():
  from tf_dpkit.compat.tf_privacy.privacy.analysis import rdp_accountant as deep  # pylint: disable=g-import-not-at-top
  from tf_dpkit.compat.tf_privacy.privacy.optimizers import dp_optimizer  # pylint: disable=g-import-not-at-top
  from analysis import rdp_accountant  # pylint: disable=g-import-not-at-top
  assert deep.compute_rdp is rdp_accountant.compute_rdp
  assert deep.get_privacy_spent is rdp_accountant.get_privacy_spent
  assert dp_optimizer.DPGradientDescentGaussianOptimizer is (
      tf_dpkit.v1.DPGradientDescentGaussianOptimizer)
