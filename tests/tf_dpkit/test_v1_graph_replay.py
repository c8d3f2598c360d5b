"""The tf.compat.v1 graph path's per-example replay (tf_dpkit.clipping.graph_replay)."""
import warnings

import numpy as np
import pytest
import tensorflow as tf

import tf_dpkit
from tf_dpkit.clipping import graph_replay
from tf_dpkit.clipping.per_example import clipped_sum_from_vector_loss

V1 = tf.compat.v1
B = 6
RNG = np.random.default_rng(7)
X = RNG.normal(size=(B, 6, 6, 1)).astype(np.float32)
Y = RNG.integers(0, 3, size=B).astype(np.int32)
MASK = np.array([1, 1, 0, 1, 1, 1], np.float32)
REPLAY_WARNING = "cannot replay this tf.compat.v1 graph"


def _logits(x, dropout=None):
  """A small conv + dense model with v1 resource variables."""
  with V1.variable_scope("cnn", reuse=V1.AUTO_REUSE):
    init = V1.glorot_uniform_initializer(seed=3)
    kernel = V1.get_variable("conv/kernel", [3, 3, 1, 2], initializer=init)
    bias = V1.get_variable("conv/bias", [2], initializer=V1.constant_initializer(0.1))
    h = tf.nn.relu(tf.nn.conv2d(x, kernel, 1, "VALID") + bias)
    h = tf.reshape(h, [-1, 4 * 4 * 2])
    if dropout is not None:
      h = dropout(h)
    dense = V1.get_variable("dense/kernel", [32, 3], initializer=init)
    dense_bias = V1.get_variable("dense/bias", [3], initializer=V1.zeros_initializer())
    return tf.matmul(h, dense) + dense_bias


def _vector_loss(x, y, mask, dropout=None):
  return tf.nn.sparse_softmax_cross_entropy_with_logits(
      labels=y, logits=_logits(x, dropout)) * mask


def _inputs(kind, batch=B):
  """(x, y, mask, feed) from placeholders or a tf.data iterator."""
  if kind == "placeholder":
    x = V1.placeholder(tf.float32, [None, 6, 6, 1])
    y = V1.placeholder(tf.int32, [None])
    mask = V1.placeholder(tf.float32, [None])
    return x, y, mask, {x: X[:batch], y: Y[:batch], mask: MASK[:batch]}
  data = tf.data.Dataset.from_tensor_slices((X[:batch], Y[:batch], MASK[:batch])).batch(batch)
  x, y, mask = V1.data.make_one_shot_iterator(data.repeat()).get_next()
  return x, y, mask, {}


def _brute_force(sess, var_list, clip, num_microbatches, x, y, mask):
  """sum_j clip_C(grad mean(loss of microbatch j)), each microbatch differentiated on its own
  rows in a graph of its own batch size."""
  k = 1 if num_microbatches is None else len(x) // num_microbatches
  xs = V1.placeholder(tf.float32, [k, 6, 6, 1])
  ys, ms = V1.placeholder(tf.int32, [k]), V1.placeholder(tf.float32, [k])
  grads = tf.gradients(tf.reduce_mean(_vector_loss(xs, ys, ms)), var_list)
  total = [np.zeros(v.shape, np.float64) for v in var_list]
  for start in range(0, len(x), k):
    rows = slice(start, start + k)
    g = sess.run(grads, {xs: x[rows], ys: y[rows], ms: mask[rows]})
    norm = np.sqrt(sum(np.sum(np.square(a)) for a in g))
    for t, a in zip(total, g):
      t += a * (min(1.0, clip / norm) if norm > 0 else 1.0)
  return total


def _no_replay_warning(caught):
  return not [w for w in caught if REPLAY_WARNING in str(w.message)]


def _replayed(graph):
  """Whether the optimizer built the replay (its ops are under the name scope dp_replay)."""
  return any(op.name.startswith("dp_replay/") for op in graph.get_operations())


@pytest.mark.parametrize("kind", ["placeholder", "dataset"])
@pytest.mark.parametrize("num_microbatches", [None, 2])
def test_clipped_sum_equals_brute_force_and_the_jacobian_path(kind, num_microbatches):
  clip = 0.3
  with tf.Graph().as_default() as graph:
    x, y, mask, feed = _inputs(kind)
    loss = _vector_loss(x, y, mask)
    var_list = V1.trainable_variables()
    plan = graph_replay.plan_replay(loss, var_list)
    replayed = graph_replay.clipped_sum_replayed(plan, var_list, clip, num_microbatches)
    jacobian = clipped_sum_from_vector_loss(loss, var_list, clip, num_microbatches)
    with V1.Session(graph=graph) as sess:
      sess.run(V1.global_variables_initializer())
      got, norms, reference = sess.run([list(replayed.grads), replayed.norms,
                                        list(jacobian.grads)], feed)
      expected = _brute_force(sess, var_list, clip, num_microbatches, X, Y, MASK)
  assert np.max(norms) > clip  # clipping binds for some microbatch
  for g, e, r in zip(got, expected, reference):
    np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_microbatches", [None, 2])
def test_minimize_takes_the_replay_without_warning_and_applies_the_brute_force_step(
    num_microbatches):
  clip, lr = 0.3, 0.5
  with tf.Graph().as_default() as graph:
    x, y, mask, feed = _inputs("dataset")
    loss = _vector_loss(x, y, mask)
    var_list = V1.trainable_variables()
    opt = tf_dpkit.v1.DPGradientDescentGaussianOptimizer(
        clip, 0.0, num_microbatches, learning_rate=lr, seed=0)
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      train_op = opt.minimize(loss=loss)
    assert _no_replay_warning(caught) and _replayed(graph)
    with V1.Session(graph=graph) as sess:
      sess.run(V1.global_variables_initializer())
      before = sess.run(var_list)
      expected = _brute_force(sess, var_list, clip, num_microbatches, X, Y, MASK)
      sess.run(train_op)
      after = sess.run(var_list)
  divisor = num_microbatches or B
  for b, a, e in zip(before, after, expected):
    np.testing.assert_allclose(a, b - lr * e / divisor, rtol=1e-5, atol=1e-6)


def test_removing_one_example_moves_the_sum_by_at_most_c():
  clip = 0.05
  with tf.Graph().as_default() as graph:
    x, y, mask, _ = _inputs("placeholder")
    loss = _vector_loss(x, y, mask)
    var_list = V1.trainable_variables()
    clipped = graph_replay.clipped_sum_replayed(
        graph_replay.plan_replay(loss, var_list), var_list, clip)
    with V1.Session(graph=graph) as sess:
      sess.run(V1.global_variables_initializer())
      ones = np.ones(B, np.float32)
      full, norms = sess.run([list(clipped.grads), clipped.norms], {x: X, y: Y, mask: ones})
      assert np.min(norms) > clip  # clipping binds for every example
      for i in range(B):
        keep = np.arange(B) != i
        without = sess.run(list(clipped.grads), {x: X[keep], y: Y[keep], mask: ones[keep]})
        moved = np.sqrt(sum(np.sum(np.square(a - b)) for a, b in zip(full, without)))
        assert clip / 2 < moved <= clip * (1 + 1e-5)


def _mean_repeated(x, y, mask):
  per_example = _vector_loss(x, y, mask)
  return tf.ones_like(per_example) * tf.reduce_mean(per_example)


def _batch_norm_like(x, y, mask):
  mean, variance = tf.nn.moments(x, axes=[0], keepdims=True)
  return _vector_loss((x - mean) * tf.math.rsqrt(variance + 1e-3), y, mask)


def _minus_first(x, y, mask):
  return _vector_loss(x - x[0:1], y, mask)


def _slightly_mixed(x, y, mask):
  per_example = _vector_loss(x, y, mask)
  return per_example + 0.005 * tf.reduce_mean(per_example)  # about 0.5% of an entry


@pytest.mark.parametrize("mixing", [_mean_repeated, _batch_norm_like, _minus_first,
                                    _slightly_mixed])
@pytest.mark.parametrize("num_microbatches", [None, 2])
def test_a_loss_that_mixes_examples_is_stopped_before_any_update(mixing, num_microbatches):
  with tf.Graph().as_default() as graph:
    x, y, mask, feed = _inputs("placeholder")
    loss = mixing(x, y, mask)
    opt = tf_dpkit.v1.DPGradientDescentGaussianOptimizer(
        1.0, 0.0, num_microbatches, learning_rate=1.0, seed=0)
    train_op = opt.minimize(loss=loss)
    with V1.Session(graph=graph) as sess:
      sess.run(V1.global_variables_initializer())
      before = sess.run(V1.trainable_variables())
      with pytest.raises(tf.errors.InvalidArgumentError, match="not computed from each example"):
        sess.run(train_op, feed)
      after = sess.run(V1.trainable_variables())
  for b, a in zip(before, after):
    np.testing.assert_array_equal(a, b)


def test_dropout_reads_its_rows_of_the_batch_draw_and_matches_the_jacobian_path():
  clip = 0.3
  with tf.Graph().as_default() as graph:
    x, y, mask, feed = _inputs("placeholder")
    loss = _vector_loss(x, y, mask, dropout=lambda h: tf.nn.dropout(h, rate=0.5, seed=1))
    var_list = V1.trainable_variables()
    plan = graph_replay.plan_replay(loss, var_list)
    assert any(t.op.type == "RandomUniform" for t in plan.sources)
    replayed = graph_replay.clipped_sum_replayed(plan, var_list, clip)
    jacobian = clipped_sum_from_vector_loss(loss, var_list, clip)
    with V1.Session(graph=graph) as sess:
      sess.run(V1.global_variables_initializer())
      first, reference = sess.run([list(replayed.grads), list(jacobian.grads)], feed)
      second = sess.run(list(replayed.grads), feed)
  for g, r in zip(first, reference):
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
  assert not all(np.allclose(a, b) for a, b in zip(first, second))  # a fresh draw each run


def test_replayed_noise_has_the_calibrated_scale_and_is_fresh_every_run():
  clip, sigma = 2.0, 1.5
  with tf.Graph().as_default() as graph:
    x, y, mask, feed = _inputs("placeholder")
    loss = 0.0 * _vector_loss(x, y, mask)  # zero gradients: the update is the noise alone
    opt = tf_dpkit.v1.DPGradientDescentGaussianOptimizer(clip, sigma, learning_rate=1.0, seed=5)
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      grads = [g for g, _ in opt.compute_gradients(loss)]
    assert _no_replay_warning(caught) and _replayed(graph)
    with V1.Session(graph=graph) as sess:
      sess.run(V1.global_variables_initializer())
      draws = [np.concatenate([g.ravel() for g in sess.run(grads, feed)]) for _ in range(20)]
  draws = np.stack(draws)  # [20, P]: each entry N(0, (sigma C / B)^2)
  assert not np.allclose(draws[0], draws[1])
  np.testing.assert_allclose(np.std(draws), sigma * clip / B, rtol=0.08)


def _fallback_warnings(build_loss, calls=2):
  """Builds ``build_loss()`` and calls compute_gradients ``calls`` times on one optimizer;
  returns (replay warnings, graph, loss, grads of the last call)."""
  graph = tf.Graph()
  with graph.as_default():
    loss = build_loss()
    opt = tf_dpkit.v1.DPGradientDescentGaussianOptimizer(0.3, 0.0, learning_rate=1.0, seed=0)
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      for _ in range(calls):
        grads = [g for g, _ in opt.compute_gradients(loss)]
  return [str(w.message) for w in caught if REPLAY_WARNING in str(w.message)], graph, grads


def test_a_hard_coded_batch_size_falls_back_to_the_exact_jacobian_path_with_one_warning():
  def build():
    x = V1.placeholder(tf.float32, [B, 6, 6, 1])
    with V1.variable_scope("cnn", reuse=V1.AUTO_REUSE):
      kernel = V1.get_variable("conv/kernel", [3, 3, 1, 2],
                               initializer=V1.glorot_uniform_initializer(seed=3))
    h = tf.reshape(tf.nn.conv2d(x, kernel, 1, "VALID"), [B, 32])  # B rows, not "-1"
    build.x = x
    return tf.reduce_sum(tf.square(h), axis=1)

  messages, graph, grads = _fallback_warnings(build)
  assert len(messages) == 1
  assert "re-running the loss on one microbatch failed" in messages[0]
  assert "about B times a non-private step" in messages[0]
  with graph.as_default(), V1.Session(graph=graph) as sess:
    sess.run(V1.global_variables_initializer())
    kernel = sess.run(V1.trainable_variables()[0])
    got = sess.run(grads[0], {build.x: X})
  per_example = []  # d/dK sum((x * K)^2): brute force in numpy, one example at a time
  for i in range(B):
    patches = np.stack([X[i, r:r + 3, c:c + 3, 0] for r in range(4) for c in range(4)])
    out = np.einsum("pab,abf->pf", patches, kernel[:, :, 0, :])
    grad = 2 * np.einsum("pab,pf->abf", patches, out)
    per_example.append(grad * min(1.0, 0.3 / np.linalg.norm(grad)))
  np.testing.assert_allclose(got[:, :, 0, :], np.mean(per_example, axis=0), rtol=1e-4, atol=1e-6)


def test_data_held_in_a_constant_falls_back_with_one_warning():
  def build():
    w = V1.get_variable("w", initializer=np.ones((36, 1), np.float32))
    return tf.reduce_sum(tf.matmul(tf.reshape(X, [B, 36]), w), axis=1)

  messages, _, _ = _fallback_warnings(build, calls=3)
  assert len(messages) == 1
  assert "does not depend on a placeholder or tf.data iterator input" in messages[0]


def _plan_error(build):
  with tf.Graph().as_default():
    loss, var_list = build()
    with pytest.raises(graph_replay.Unreplayable) as error:
      graph_replay.plan_replay(loss, var_list)
  return str(error.value)


def _simple(transform=lambda x: x, x=None):
  x = V1.placeholder(tf.float32, [None, 4]) if x is None else x
  w = V1.get_variable("w", initializer=np.ones((4, 1), np.float32))
  return tf.reduce_sum(tf.matmul(transform(x), w), axis=1), [w]


def test_plan_refuses_what_it_cannot_replay_and_says_why():
  assert "stateful" in _plan_error(lambda: _simple(tf.random.shuffle))
  assert "control flow" in _plan_error(
      lambda: _simple(lambda x: tf.raw_ops.Switch(data=x, pred=tf.constant(True))[1]))

  def with_control_dependency(x):
    with tf.control_dependencies([tf.debugging.assert_all_finite(x, "finite")]):
      return tf.identity(x)
  assert "control dependencies" in _plan_error(lambda: _simple(with_control_dependency))
  assert "unknown rank" in _plan_error(lambda: _simple(x=V1.placeholder(tf.float32, None)))
  assert "is unclear" in _plan_error(
      lambda: _simple(lambda x: x * V1.placeholder(tf.float32, [4])))
  assert "scalar of batch-dependent shape" in _plan_error(
      lambda: _simple(lambda x: x * tf.random.uniform(tf.shape(x)[2:])))
  assert "inside a tf.function" in _plan_error(_in_function)

  def reference_variable():
    w = V1.Variable(np.ones((4, 1), np.float32), use_resource=False)
    x = V1.placeholder(tf.float32, [None, 4])
    return tf.reduce_sum(tf.matmul(x, w), axis=1), [w]
  assert "reference variable" in _plan_error(reference_variable)


def _in_function():
  """A vector loss inside a tf.function's graph."""
  holder = {}

  @tf.function
  def f(x):
    holder["loss"] = tf.reduce_sum(x, axis=1)
    return holder["loss"]
  f.get_concrete_function(tf.TensorSpec([None, 4]))
  return holder["loss"], []


def test_replay_refuses_a_loss_whose_copy_is_not_one_entry_per_row():
  with tf.Graph().as_default():
    loss, var_list = _simple(x=V1.placeholder(tf.float32, [B, 4]))
    loss = loss + tf.constant(np.zeros(B, np.float32))  # broadcasts the copy to B entries
    plan = graph_replay.plan_replay(loss, var_list)
    with pytest.raises(graph_replay.Unreplayable, match=r"has shape \(6,\), not \[rows\]"):
      graph_replay.clipped_sum_replayed(plan, var_list, 1.0)


def test_an_input_without_one_row_per_example_is_stopped_when_the_step_runs():
  with tf.Graph().as_default() as graph:
    x = V1.placeholder(tf.float32, [None, 4])
    offset = V1.placeholder(tf.float32, [None, 1])  # fed with one row: not per example
    loss, var_list = _simple(lambda t: t + offset, x=x)
    clipped = graph_replay.clipped_sum_replayed(
        graph_replay.plan_replay(loss, var_list), var_list, 1.0)
    with V1.Session(graph=graph) as sess:
      sess.run(V1.global_variables_initializer())
      with pytest.raises(tf.errors.InvalidArgumentError, match="is not the batch size of the loss"):
        sess.run(clipped.grads, {x: np.ones((3, 4), np.float32), offset: [[1.0]]})
