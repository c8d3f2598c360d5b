"""An example with an inf/NaN feature, a NaN label or an infinite loss contributes exactly 0 to
the clipped sum on every path (so its presence does not show in the release), and the data
pipelines refuse non-finite features and out-of-range class ids up front.

Reference: the clipped sum of the same batch without that example (brute force), and the
removal sensitivity of ``tf_dpkit.clipping.testing.removal_sensitivity``.
"""
import numpy as np
import pytest
import keras
import tensorflow as tf

import tf_dpkit
from tf_dpkit.clipping import per_example
from tf_dpkit.clipping.testing import removal_sensitivity
from tf_dpkit.data import poisson
from tf_dpkit.dp_gradients import clipped_sum_for_model

C = 1.0
TOL = 1e-5
BAD = 2  # index of the non-finite example in every batch
MSE = keras.losses.MeanSquaredError(reduction=None)


def _inf_loss(y_true, y_pred):
  """Squared error, plus inf for labels above 1000: an infinite loss with a finite gradient."""
  extra = tf.where(y_true[:, 0] > 1e3, tf.constant(np.inf, y_pred.dtype),
                   tf.zeros([], y_pred.dtype))
  return tf.reduce_mean(tf.square(y_true - y_pred), axis=-1) + extra


class Gated(keras.layers.Layer):
  """A trainable layer without a rule: the fast path replays it per example."""

  def build(self, shape):
    self.w = self.add_weight(shape=(shape[-1], shape[-1]), initializer="glorot_uniform")

  def call(self, x):
    return x * tf.sigmoid(tf.matmul(x, self.w))


def _model(kind):
  keras.utils.set_random_seed(3)
  head = lambda h: keras.layers.Dense(1)(h)
  if kind in ("embedding", "attention"):
    inputs = keras.Input((5,), dtype="int32")
    h = keras.layers.Embedding(8, 4, mask_zero=True)(inputs)
    if kind == "attention":
      h = keras.layers.MultiHeadAttention(num_heads=2, key_dim=2)(h, h)
    return keras.Model(inputs, head(keras.layers.GlobalAveragePooling1D()(h)))
  if kind in ("conv", "depthwise"):
    inputs = keras.Input((6, 6, 2))
    layer = (keras.layers.Conv2D(3, 3, activation="relu") if kind == "conv" else
             keras.layers.DepthwiseConv2D(3, depth_multiplier=2, activation="relu"))
    return keras.Model(inputs, head(keras.layers.Flatten()(layer(inputs))))
  if kind == "masked_sequence":
    inputs = keras.Input((5, 3))
    h = keras.layers.Dense(4, activation="tanh")(keras.layers.Masking(0.0)(inputs))
    return keras.Model(inputs, head(keras.layers.GlobalAveragePooling1D()(h)))
  inputs = keras.Input((4,))
  h = {"dense": lambda: keras.layers.Dense(4, activation="tanh")(inputs),
       "layernorm": lambda: keras.layers.LayerNormalization()(keras.layers.Dense(4)(inputs)),
       "replayed": lambda: Gated()(inputs)}[kind]()
  return keras.Model(inputs, head(h))


def _batch(kind, corruption, batch=5, seed=0):
  """``(x, y, loss)`` of ``batch`` examples, example ``BAD`` corrupted as named."""
  rng = np.random.default_rng(seed)
  if kind in ("embedding", "attention"):
    x = rng.integers(1, 8, (batch, 5)).astype(np.int32)
  else:
    shape = {"conv": (6, 6, 2), "depthwise": (6, 6, 2), "masked_sequence": (5, 3)}.get(kind, (4,))
    x = rng.normal(size=(batch,) + shape).astype(np.float32) * 2
  y = rng.normal(size=(batch, 1)).astype(np.float32)
  loss = MSE
  if corruption in ("inf_x", "nan_x"):
    x.reshape(batch, -1)[BAD, 1] = np.inf if corruption == "inf_x" else np.nan
  elif corruption == "nan_y":
    y[BAD] = np.nan
  elif corruption == "inf_loss":
    y[BAD], loss = 2e3, _inf_loss
  else:
    raise ValueError(corruption)
  return x, y, loss


def _flat(grads):
  return np.concatenate([np.asarray(g, np.float64).ravel() for g in grads])


def _assert_contributes_zero(clipped_sum, batch):
  """``clipped_sum(keep)``: the sum over the examples ``keep``.  With example BAD it is finite
  and equal to the sum without it; removing any one example moves it by at most C."""
  everyone = np.arange(batch)
  full = _flat(clipped_sum(everyone))
  assert np.all(np.isfinite(full))
  without = _flat(clipped_sum(everyone[everyone != BAD]))
  np.testing.assert_allclose(full, without, rtol=1e-5, atol=1e-6)
  assert np.abs(without).max() > 1e-3  # the others do contribute
  assert removal_sensitivity(clipped_sum, batch) <= C * (1 + TOL)


def _model_sum(model, x, y, loss, method, sample_weight=None, num_microbatches=None,
               loss_scale=None):
  def clipped_sum(keep):
    weights = None if sample_weight is None else tf.constant(sample_weight[keep])
    cs, _ = clipped_sum_for_model(model, loss, tf.constant(x[keep]), tf.constant(y[keep]),
                                  weights, C, num_microbatches, method, loss_scale=loss_scale)
    return cs.grads
  return clipped_sum


@pytest.mark.parametrize("kind, corruption", [
    ("dense", "inf_x"), ("dense", "nan_x"), ("dense", "nan_y"), ("dense", "inf_loss"),
    ("conv", "inf_x"), ("conv", "nan_x"), ("depthwise", "nan_x"), ("layernorm", "inf_x"),
    ("masked_sequence", "nan_x"), ("replayed", "nan_x"), ("replayed", "nan_y"),
    ("embedding", "nan_y"), ("embedding", "inf_loss"), ("attention", "nan_y")])
def test_fast_path_non_finite_example_contributes_zero(kind, corruption):
  model = _model(kind)
  x, y, loss = _batch(kind, corruption)
  _assert_contributes_zero(_model_sum(model, x, y, loss, "fast"), len(x))


@pytest.mark.parametrize("corruption", [
    "nan_x", "inf_loss", pytest.param("inf_x", marks=pytest.mark.slow),
    pytest.param("nan_y", marks=pytest.mark.slow)])
def test_vectorized_path_non_finite_example_contributes_zero(corruption):
  model = _model("dense")
  x, y, loss = _batch("dense", corruption)
  _assert_contributes_zero(_model_sum(model, x, y, loss, "vectorized"), len(x))


@pytest.mark.parametrize("method", ["fast", pytest.param("vectorized", marks=pytest.mark.slow)])
def test_with_sample_weights_the_example_still_contributes_zero(method):
  model = _model("dense")
  x, y, loss = _batch("dense", "nan_x")
  weights = np.random.default_rng(1).uniform(0.5, 2.0, len(x)).astype(np.float32)
  _assert_contributes_zero(_model_sum(model, x, y, loss, method, sample_weight=weights), len(x))
  weights[BAD] = 0.0  # a zero weight times a NaN loss is NaN: still left out
  _assert_contributes_zero(_model_sum(model, x, y, loss, method, sample_weight=weights), len(x))


@pytest.mark.parametrize("method", ["fast", pytest.param("vectorized", marks=pytest.mark.slow)])
def test_with_microbatches_the_microbatch_of_the_example_contributes_zero(method):
  model = _model("dense")
  x, y, loss = _batch("dense", "inf_x", batch=6)
  full = _model_sum(model, x, y, loss, method, num_microbatches=3)(np.arange(6))
  # Microbatch 1 holds examples 2 and 3: the sum is that of microbatches 0 and 2 alone.
  rest = _model_sum(model, x, y, loss, method, num_microbatches=2)(np.array([0, 1, 4, 5]))
  assert np.all(np.isfinite(_flat(full)))
  np.testing.assert_allclose(_flat(full), _flat(rest), rtol=1e-5, atol=1e-6)


def test_mixed_precision_fast_path_non_finite_example_contributes_zero():
  before = keras.config.dtype_policy()
  keras.config.set_dtype_policy("mixed_float16")
  try:
    model = _model("dense")
    for corruption in ("nan_x", "nan_y"):
      x, y, loss = _batch("dense", corruption)
      _assert_contributes_zero(_model_sum(model, x, y, loss, "fast", loss_scale=128.0), len(x))
  finally:
    keras.config.set_dtype_policy(before)


def test_fast_path_in_a_function_with_unknown_batch_size():
  model = _model("conv")
  x, y, _ = _batch("conv", "nan_x")

  @tf.function(input_signature=[tf.TensorSpec([None, 6, 6, 2]), tf.TensorSpec([None, 1])])
  def step(xs, ys):
    return clipped_sum_for_model(model, MSE, xs, ys, None, C, None, "fast")[0].grads
  _assert_contributes_zero(lambda keep: step(x[keep], y[keep]), len(x))


def _vector_loss_sum(model, x, y, loss, num_microbatches=None):
  def clipped_sum(keep):
    with tf.GradientTape() as tape:
      losses = loss(tf.constant(y[keep]), model(tf.constant(x[keep]), training=True))
    return per_example.clipped_sum_from_vector_loss(
        losses, model.trainable_variables, C, num_microbatches, tape=tape).grads
  return clipped_sum


@pytest.mark.parametrize("corruption", ["inf_x", "nan_x", "nan_y"])
def test_vector_loss_path_stops_when_one_example_makes_every_row_nan(corruption):
  # The Jacobian of a vector loss comes from the batch's one forward pass: x_i = inf enters
  # every row's kernel gradient (x_i * 0 = NaN), so no row can be kept and zeroing them all
  # would release 0 in place of the others' sum.  The step stops with the reason.
  model = _model("dense")
  x, y, loss = _batch("dense", corruption)
  with pytest.raises(tf.errors.InvalidArgumentError, match="Every per-microbatch gradient"):
    _vector_loss_sum(model, x, y, loss)(np.arange(len(x)))
  # Without it the step runs; one non-finite microbatch alone (M = 1) is simply zeroed.
  clean = np.delete(np.arange(len(x)), BAD)
  assert np.all(np.isfinite(_flat(_vector_loss_sum(model, x, y, loss)(clean))))
  assert np.all(_flat(_vector_loss_sum(model, x, y, loss)(np.array([BAD]))) == 0.0)


def test_vector_loss_path_an_infinite_loss_with_finite_gradient_contributes_zero():
  model = _model("dense")
  x, y, loss = _batch("dense", "inf_loss")
  _assert_contributes_zero(_vector_loss_sum(model, x, y, loss), len(x))


# ---------------------------------------------------------------------------------------------
# Data checks where the data is first read.

def _nan_features(n=10):
  x = np.random.default_rng(0).normal(size=(n, 3)).astype(np.float32)
  x[4, 1] = np.nan
  x[7, 0] = -np.inf
  return x, np.arange(n) % 3


@pytest.mark.parametrize("make", [
    lambda d: poisson.poisson_batches(d, expected_batch_size=3, steps=2, seed=1),
    lambda d: poisson.shuffled_batches(d, 2, 1, seed=1),
    lambda d: poisson.poisson_batches(tf.data.Dataset.from_tensor_slices(d),
                                      expected_batch_size=3, steps=2, seed=1),
    lambda d: tf_dpkit.make_private(d, batch_size=2, l2_norm_clip=1.0, delta=1e-5, epochs=1,
                                    noise_multiplier=1.0)])
def test_pipelines_refuse_non_finite_features_naming_count_and_first_example(make):
  with pytest.raises(ValueError, match=r"data\[0\] holds 2 non-finite \(inf or NaN\) entries, "
                                       r"the first in example 4"):
    make(_nan_features())


def test_non_finite_float_labels_are_refused_and_clean_data_passes():
  x, _ = _nan_features()
  x = np.nan_to_num(x)
  y = np.zeros((10, 1), np.float32)
  y[9] = np.nan
  with pytest.raises(ValueError, match=r"data\[1\] holds 1 non-finite .* entry, the first in "
                                       r"example 9"):
    poisson.poisson_batches((x, y), expected_batch_size=3, steps=1, seed=1)
  poisson.check_finite_features((x, np.zeros(10, np.float32)))  # clean: no error


def test_make_private_refuses_class_ids_outside_num_classes():
  x = np.zeros((6, 2), np.float32)
  y = np.array([0, 1, 2, 7, 2, -1])
  args = dict(batch_size=2, l2_norm_clip=1.0, delta=1e-3, epochs=1, noise_multiplier=1.0)
  with pytest.raises(ValueError, match=r"data\[1\] \(the labels y\) must be class ids in "
                                       r"\[0, 3\) \(num_classes=3\); 2 entries are outside, the "
                                       r"first 7 in example 3"):
    tf_dpkit.make_private((x, y), num_classes=3, **args)
  tf_dpkit.make_private((x, np.clip(y, 0, 2)), num_classes=3, **args)  # in range: accepted
  tf_dpkit.make_private((x, y), **args)  # no num_classes: not checked here
  with pytest.raises(ValueError, match=r"num_classes must be an integer in \[1, inf\], got 0"):
    tf_dpkit.make_private((x, y), num_classes=0, **args)
  with pytest.raises(ValueError, match=r"num_classes checks the labels y of data=\(x, y\)"):
    tf_dpkit.make_private({"x": x}, num_classes=3, **args)


def test_check_class_labels_leaves_float_labels_to_the_finite_check():
  poisson.check_class_labels(np.array([0.5, 7.0]), 3)  # not class ids: nothing to check
  with pytest.raises(ValueError, match=r"labels must be class ids in \[0, 2\).*first 5 in "
                                       r"example 1"):
    poisson.check_class_labels(np.array([[0], [5]]), 2)


# ---------------------------------------------------------------------------------------------
# Property: random models of the supported layer set, random batches, one example corrupted at
# a random place: it contributes 0 and removing any example moves the sum by at most C.

from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_FLOAT_KINDS = ["dense", "conv", "depthwise", "layernorm", "masked_sequence", "replayed"]


@st.composite
def _corrupted_cases(draw):
  kind = draw(st.sampled_from(_FLOAT_KINDS + ["embedding", "attention"]))
  corruptions = ["nan_y", "inf_loss"] + (["inf_x", "nan_x"] if kind in _FLOAT_KINDS else [])
  return (kind, draw(st.sampled_from(corruptions)), draw(st.integers(3, 6)),
          draw(st.integers(0, 2**16)), draw(st.sampled_from([None, 1])))


@settings(max_examples=5, deadline=None, derandomize=True, print_blob=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=_corrupted_cases())
def test_property_a_corrupted_example_contributes_zero_on_random_models(case):
  kind, corruption, batch, seed, weighted = case
  model = _model(kind)
  x, y, loss = _batch(kind, corruption, batch=batch, seed=seed)
  weights = (None if weighted is None else
             np.random.default_rng(seed).uniform(0.5, 2.0, batch).astype(np.float32))
  _assert_contributes_zero(_model_sum(model, x, y, loss, "fast", sample_weight=weights), batch)



# ---------------------------------------------------------------------------------------------
# Distributed replicas: under MirroredStrategy (2 logical CPUs, in a fresh process, since devices
# are configured before TensorFlow starts) the replica holding the NaN example contributes 0 for
# it: the update equals the single-device one and -lr * (clipped sum of the others) / B.

_DISTRIBUTED_SCRIPT = r'''
import json, sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
import tf_dpkit
from tf_dpkit.dp_gradients import clipped_sum_for_model

B, BAD = 8, 1
rng = np.random.default_rng(0)
x = rng.normal(size=(B, 3)).astype(np.float32)
y = rng.normal(size=(B, 2)).astype(np.float32)
x[BAD, 0] = np.nan
def loss(y_true, y_pred):
  return tf.reduce_mean(tf.square(y_true - y_pred), axis=-1)

def update(strategy):
  with strategy.scope():
    keras.utils.set_random_seed(1)
    model = tf_dpkit.DPSequential([keras.Input((3,)), keras.layers.Dense(2)])
    before = [w.copy() for w in model.get_weights()]
    opt = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 0.0, learning_rate=1.0, seed=3)
    model.compile(opt, loss=loss)
  model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0)
  return model, before, np.concatenate([(a - b).ravel() for a, b in zip(model.get_weights(), before)])

model, before, distributed = update(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
_, _, single = update(tf.distribute.get_strategy())
model.set_weights(before)
keep = np.delete(np.arange(B), BAD)
ref, _ = clipped_sum_for_model(model, loss, tf.constant(x[keep]), tf.constant(y[keep]), None, 1.0)
expected = -np.concatenate([g.numpy().ravel() for g in ref.grads]) / B
print("RESULT " + json.dumps({"distributed": distributed.tolist(), "single": single.tolist(),
                              "expected": expected.tolist()}))
'''


def test_mirrored_replicas_leave_the_non_finite_example_out():
  import json
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""),
             TF_CPP_MIN_LOG_LEVEL="3")
  proc = subprocess.run([sys.executable, "-c", _DISTRIBUTED_SCRIPT], capture_output=True,
                        text=True, timeout=600, env=env, cwd=root)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  assert lines, proc.stdout[-2000:] + proc.stderr[-3000:]
  result = {k: np.array(v) for k, v in json.loads(lines[0][len("RESULT "):]).items()}
  assert np.all(np.isfinite(result["distributed"]))
  assert np.abs(result["expected"]).max() > 1e-2  # a real update
  np.testing.assert_allclose(result["distributed"], result["single"], atol=1e-6)
  np.testing.assert_allclose(result["distributed"], result["expected"], atol=1e-6)


# The finite-entry helpers skip their select when a cheap test (the sum of all entries is
# finite) proves every entry finite, and take the exact entry-by-entry branch otherwise.  The
# reference is numpy's entry-by-entry isfinite, on inputs that drive each branch: all finite;
# one inf / NaN; +inf and -inf in different rows (their sum is NaN); and finite entries whose
# sum overflows float32 (the cheap test fails although every entry is finite).
_BIG = np.float32(3e38)
_CASES = {
    "finite": np.arange(24, dtype=np.float32).reshape(4, 3, 2),
    "one_inf": np.where(np.arange(24).reshape(4, 3, 2) == 9, np.inf, 1.0).astype(np.float32),
    "nan": np.where(np.arange(24).reshape(4, 3, 2) == 20, np.nan, 1.0).astype(np.float32),
    "cancelling_infs": np.where(np.arange(24).reshape(4, 3, 2) == 1, np.inf, np.where(
        np.arange(24).reshape(4, 3, 2) == 13, -np.inf, 2.0)).astype(np.float32),
    "sum_overflows": np.full((4, 3, 2), _BIG, np.float32),
}


def _reference_entries(x):
  ok = np.isfinite(x)
  return np.where(ok, x, 0.0), ok.reshape(len(x), -1).all(axis=1)


@pytest.mark.parametrize("case", sorted(_CASES))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("traced", [False, True])
def test_finite_entries_and_rows_match_numpy_on_both_branches(case, dtype, traced):
  from tf_dpkit.clipping.clipped_sum import finite_entries, finite_rows
  x = _CASES[case].astype(dtype)  # float16: 3e38 is inf there, handled as inf
  spec = tf.TensorSpec([None, 3, 2], dtype)
  entries = tf.function(finite_entries, input_signature=[spec]) if traced else finite_entries
  rows = (tf.function(lambda t: finite_rows([t, None], tf.shape(t)[0] // 2), input_signature=[spec])
          if traced else (lambda t: finite_rows([t, None], t.shape[0] // 2)))
  want_x, want_rows = _reference_entries(x)
  got_x, got_rows = entries(tf.constant(x))
  np.testing.assert_array_equal(got_x.numpy(), want_x)
  np.testing.assert_array_equal(got_rows.numpy(), want_rows)
  # finite_rows groups rows two at a time (M = 2 microbatches of 2).
  np.testing.assert_array_equal(rows(tf.constant(x)).numpy(), want_rows.reshape(2, 2).all(axis=1))


@pytest.mark.parametrize("keep", [[True, True], [True, False], [False, False]])
def test_zero_rows_zeroes_exactly_the_dropped_groups_and_passes_the_rest_unchanged(keep):
  from tf_dpkit.clipping.clipped_sum import zero_rows
  x = _CASES["nan"]  # NaN in row 3 (group 1): kept as it is when group 1 is kept
  want = np.where(np.repeat(keep, 2)[:, None, None], x, 0.0)
  got = zero_rows(tf.constant(x), tf.constant(keep)).numpy()
  np.testing.assert_array_equal(got, want)
  traced = tf.function(zero_rows)(tf.constant(x), tf.constant(keep)).numpy()
  np.testing.assert_array_equal(traced, want)


@pytest.mark.parametrize("case", sorted(_CASES))
@pytest.mark.parametrize("traced", [False, True])
def test_gradient_through_finite_entries_is_the_upstream_gradient_on_both_branches(case, traced):
  # Straight-through: the exact gradient on finite rows; the rows with an inf/NaN entry are
  # left out by the fast path (clip factor 0, non-finite rows of every output gradient zeroed).
  from tf_dpkit.clipping.clipped_sum import finite_entries
  x = tf.constant(_CASES[case])
  upstream = tf.constant(np.arange(1.0, 25.0, dtype=np.float32).reshape(4, 3, 2))

  def grad(t):
    with tf.GradientTape() as tape:
      tape.watch(t)
      cleaned, rows = finite_entries(t)
      total = tf.reduce_sum(cleaned * upstream)
    return tape.gradient(total, t), rows
  got, rows = (tf.function(grad) if traced else grad)(x)
  np.testing.assert_array_equal(got.numpy(), upstream.numpy())
  np.testing.assert_array_equal(rows.numpy(), _reference_entries(_CASES[case])[1])


def test_rule_inputs_are_read_once_per_tensor_and_dtype():
  # Self-attention's query, key and value projections share one input: one guard, one flag.
  from tf_dpkit.clipping.fast_path import _FiniteInputs
  reader = _FiniteInputs()
  x = tf.constant(_CASES["nan"])
  first, again = reader.read(x, tf.float32), reader.read(x, tf.float32)
  assert first is again and len(reader) == 1
  want_x, want_rows = _reference_entries(_CASES["nan"])
  np.testing.assert_array_equal(first.numpy(), want_x)
  np.testing.assert_array_equal(reader[0].numpy(), want_rows)
  half = reader.read(x, tf.float16)  # a cast is a different input
  assert half.dtype == tf.float16 and len(reader) == 2
  np.testing.assert_array_equal(half.numpy(), want_x.astype(np.float16))
  other = reader.read(tf.constant(_CASES["one_inf"]), tf.float32)
  assert len(reader) == 3
  np.testing.assert_array_equal(other.numpy(), _reference_entries(_CASES["one_inf"])[0])


@pytest.mark.parametrize("case", sorted(_CASES))
@pytest.mark.parametrize("traced", [False, True])
def test_finite_rows_zeroed_matches_numpy_on_both_branches(case, traced):
  # Rows grouped two at a time (M = 2): a group with an inf/NaN entry has all its rows zeroed.
  from tf_dpkit.clipping.clipped_sum import finite_rows_zeroed
  x = _CASES[case]
  fn = (tf.function(lambda t: finite_rows_zeroed(t, 2), input_signature=[
      tf.TensorSpec([None, 3, 2], tf.float32)]) if traced else (lambda t: finite_rows_zeroed(t, 2)))
  got_x, got_ok = fn(tf.constant(x))
  want_ok = np.isfinite(x).reshape(2, -1).all(axis=1)
  np.testing.assert_array_equal(got_ok.numpy(), want_ok)
  np.testing.assert_array_equal(got_x.numpy(), np.where(np.repeat(want_ok, 2)[:, None, None], x, 0.0))


def _placeholders_behind(tensor):
  """Names of the placeholder ops ``tensor`` depends on (data and control inputs)."""
  seen, stack, found = set(), [tensor.op], set()
  while stack:
    op = stack.pop()
    if op.name in seen:
      continue
    seen.add(op.name)
    if op.type == "Placeholder":
      found.add(op.name)
    stack.extend(t.op for t in op.inputs)
    stack.extend(op.control_inputs)
  return found


def test_each_output_gradient_is_gated_on_its_own_and_flags_combine():
  # Each record's norms see its own output gradient, gated on its own rows, so they can run
  # (and free what only they need) before the other records' gradients exist; a microbatch is
  # finite only where every record's rows, every rule input and its loss are.
  from tf_dpkit.clipping import fast_path
  from tf_dpkit.clipping.rules import LayerTrace
  seen = {}

  def record(name):
    def squared_norms(g, num_groups):
      seen[name] = g
      return tf.reduce_sum(tf.reshape(tf.square(g), [num_groups, -1]), axis=1)
    return (None, LayerTrace(None, None, squared_norms))

  names = ["first", "second", "third"]
  graph = tf.Graph()
  with graph.as_default():
    grads = [tf.compat.v1.placeholder(tf.float32, [4, 3], name=n) for n in names]
    inputs_ok = tf.compat.v1.placeholder(tf.bool, [4], name="inputs_ok")
    losses = tf.compat.v1.placeholder(tf.float32, [4], name="losses")
    gated, squared, norms, finite = fast_path._finite_microbatch_norms(
        [record(n) for n in names], grads, [inputs_ok], losses, 2, 1.0)
  for name in names:
    assert _placeholders_behind(seen[name]) == {name}, name
  g = [np.arange(12, dtype=np.float32).reshape(4, 3) + k for k in range(3)]
  g[1][2, 0] = np.nan  # record "second", example 2: microbatch 1
  with tf.compat.v1.Session(graph=graph) as session:
    feed = {grads[k]: g[k] for k in range(3)}
    feed.update({inputs_ok: [True] * 4, losses: [1.0] * 4})
    got_gated, got_finite, got_squared = session.run([gated, finite, squared], feed)
    feed.update({inputs_ok: [False, True, True, True]})  # example 0: microbatch 0
    both_out = session.run(finite, feed)
  np.testing.assert_array_equal(got_finite, [True, False])
  np.testing.assert_array_equal(got_gated[0], g[0])  # another record's rows are not touched
  np.testing.assert_array_equal(got_gated[1][2:], 0.0)
  np.testing.assert_array_equal(got_gated[1][:2], g[1][:2])
  for k in range(3):  # squares of the flagged microbatch are 0, the others the gated rows'
    np.testing.assert_allclose(got_squared[k][0], np.sum(g[k][:2] ** 2), rtol=1e-6)
    assert got_squared[k][1] == 0.0
  np.testing.assert_array_equal(both_out, [False, False])


@pytest.mark.parametrize("traced", [False, True])
def test_scaled_row_sum_leaves_out_non_finite_rows_whose_factor_is_zero(traced):
  from tf_dpkit.clipping.clipped_sum import scaled_row_sum
  rows = np.arange(24, dtype=np.float32).reshape(4, 3, 2)
  factors = np.array([0.5, 0.0, 1.0, 0.0], np.float32)
  fn = tf.function(scaled_row_sum) if traced else scaled_row_sum
  want = np.tensordot(factors, rows, axes=1)
  np.testing.assert_allclose(fn(tf.constant(factors), tf.constant(rows)).numpy(), want)
  broken = rows.copy()
  broken[1, 0, 0], broken[3, 2, 1] = np.inf, np.nan  # rows left out (factor 0)
  np.testing.assert_allclose(fn(tf.constant(factors), tf.constant(broken)).numpy(), want)
  broken[0, 1, 1] = np.inf  # a row with a nonzero factor is never non-finite on the fast path
  assert not np.all(np.isfinite(fn(tf.constant(factors), tf.constant(broken)).numpy()))


@pytest.mark.parametrize("use_bias", [False, True])
def test_a_left_out_example_whose_kept_gradient_overflows_adds_exactly_zero(use_bias):
  # A Dense layer on 4 positions of 1 feature keeps its per-example gradients (explicit form).
  # Example 0 has a finite feature of 1e20: its loss (1e40) overflows to inf, so it is left out
  # (factor 0), while its output gradient (5e19) stays finite and its kept kernel gradient
  # (2e40) overflows; 0 * inf would make the whole clipped sum NaN.  Example 1 alone must be in
  # the sum, clipped.  (Found by review: it was NaN after output gradients were gated one at a
  # time, and when the overflow alone flagged the example, before that too.)
  from tf_dpkit.clipping import fast_path
  model = keras.Sequential([keras.Input((4, 1)), keras.layers.Dense(
      1, use_bias=use_bias, kernel_initializer="ones")])
  x = np.ones((2, 4, 1), np.float32)
  x[0] = 1e20
  x[1] = [[1.0], [2.0], [-1.0], [3.0]]
  y = np.zeros((2, 4, 1), np.float32)
  loss = lambda yt, yp: tf.reduce_mean(tf.square(yt - yp), axis=[1, 2])  # noqa: E731
  result, _ = fast_path.clipped_sum_fast(model, loss, (tf.constant(x), tf.constant(y), None), 1.0)
  with tf.GradientTape() as tape:
    alone = loss(tf.constant(y[1:]), model(tf.constant(x[1:])))[0]
  reference = tape.gradient(alone, model.trainable_variables)
  norm = np.sqrt(sum(np.sum(np.square(g.numpy().astype(np.float64))) for g in reference))
  assert norm > 1.0  # clipping binds
  for got, want in zip(result.grads, reference):
    np.testing.assert_allclose(got.numpy(), want.numpy() / norm, rtol=1e-5)
  np.testing.assert_allclose(result.norms.numpy(), [0.0, norm], rtol=1e-5)
