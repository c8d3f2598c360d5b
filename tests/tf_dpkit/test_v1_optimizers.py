"""tf.compat.v1 DP optimizers: graph mode with a Session (no tape), and eager with a tape."""
import numpy as np
import pytest
import tensorflow as tf

import tf_dpkit
from tf_dpkit import make_gaussian_optimizer_class

V1 = tf.compat.v1
V1_CLASSES = [
    (V1.train.GradientDescentOptimizer, {}), (V1.train.MomentumOptimizer, {"momentum": 0.9}),
    (V1.train.AdamOptimizer, {}), (V1.train.AdagradOptimizer, {}), (V1.train.RMSPropOptimizer, {}),
    (V1.train.AdadeltaOptimizer, {}), (V1.train.FtrlOptimizer, {}),
    (V1.train.ProximalGradientDescentOptimizer, {}), (V1.train.ProximalAdagradOptimizer, {}),
]
RNG = np.random.default_rng(1)
X = RNG.normal(size=(6, 4)).astype(np.float32)
Y = RNG.normal(size=(6, 1)).astype(np.float32)
W0 = RNG.normal(size=(4, 1)).astype(np.float32)


def _graph_run(make_optimizer, dp, steps=3):
  graph = tf.Graph()
  with graph.as_default():
    w = V1.get_variable("w", initializer=W0)
    vector_loss = tf.reduce_sum(tf.square(tf.matmul(X, w) - Y), axis=1)
    optimizer = make_optimizer()
    train_op = optimizer.minimize(loss=vector_loss if dp else tf.reduce_mean(vector_loss))
    with V1.Session(graph=graph) as sess:
      sess.run(V1.global_variables_initializer())
      for _ in range(steps):
        sess.run(train_op)
      return sess.run(w)


@pytest.mark.parametrize("base, kwargs", V1_CLASSES, ids=lambda c: getattr(c, "__name__", ""))
def test_graph_mode_no_noise_huge_clip_equals_non_private(base, kwargs):
  dp_cls = make_gaussian_optimizer_class(base)
  private = _graph_run(lambda: dp_cls(1e9, 0.0, 2, learning_rate=0.05, seed=0, **kwargs), True)
  plain = _graph_run(lambda: base(learning_rate=0.05, **kwargs), False)
  np.testing.assert_allclose(private, plain, rtol=1e-5, atol=1e-6)


def test_graph_mode_clipping_matches_numpy_reference():
  clip = 0.4
  got = _graph_run(lambda: tf_dpkit.v1.DPGradientDescentGaussianOptimizer(
      clip, 0.0, None, learning_rate=1.0, seed=0), True, steps=1)
  per_example = 2 * (X @ W0 - Y) * X
  norms = np.linalg.norm(per_example, axis=1, keepdims=True)
  expected = W0 - (per_example * np.minimum(1, clip / norms)).mean(axis=0).reshape(4, 1)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("made_outside_the_graph", [False, True])
def test_graph_mode_draws_fresh_noise_every_run(made_outside_the_graph):
  # An optimizer made before entering the graph gets its noise-draw counter in that graph.
  made = tf_dpkit.v1.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=1.0, seed=3)
  graph = tf.Graph()
  with graph.as_default():
    w = V1.get_variable("w", initializer=np.zeros(3, np.float32))
    loss = tf.zeros([4]) * tf.reduce_sum(w)
    opt = made if made_outside_the_graph else tf_dpkit.v1.DPGradientDescentGaussianOptimizer(
        1.0, 1.0, learning_rate=1.0, seed=3)
    grads = opt.compute_gradients(loss, var_list=[w])[0][0]
    with V1.Session(graph=graph) as sess:
      sess.run(V1.global_variables_initializer())
      first, second = sess.run(grads), sess.run(grads)
  assert not np.allclose(first, second)


@pytest.mark.parametrize("ready", ["DPGradientDescentGaussianOptimizer", "DPAdamGaussianOptimizer",
                                   "DPAdagradGaussianOptimizer", "DPRMSPropGaussianOptimizer"])
def test_eager_with_tape_and_tf_function(ready):
  cls = getattr(tf_dpkit.v1, ready)
  assert issubclass(cls, V1.train.Optimizer)
  base = cls._dp_base_class
  w_dp, w_plain = tf.Variable(W0), tf.Variable(W0)
  dp, plain = cls(1e9, 0.0, learning_rate=0.05, seed=0), base(learning_rate=0.05)

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_sum(tf.square(tf.matmul(X, w_dp) - Y), axis=1)
    dp.minimize(loss, var_list=[w_dp], tape=tape)
  for _ in range(2):
    step()
    plain.minimize(lambda: tf.reduce_mean(tf.reduce_sum(tf.square(tf.matmul(X, w_plain) - Y), axis=1)),
                   var_list=[w_plain])
  np.testing.assert_allclose(w_dp.numpy(), w_plain.numpy(), rtol=1e-5, atol=1e-6)


def test_eager_without_tape_is_rejected_and_grad_loss_refused():
  opt = tf_dpkit.v1.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=0.1)
  w = tf.Variable(W0)
  with pytest.raises(ValueError, match="needs the `tape=`"):
    opt.compute_gradients(tf.reduce_sum(tf.matmul(X, w), axis=1), var_list=[w])
  with pytest.raises(ValueError, match="grad_loss"):
    opt.compute_gradients(tf.ones([2]), var_list=[w], grad_loss=tf.ones([2]))


def test_graph_mode_non_private_gradients_refused():
  with tf.Graph().as_default():
    w = V1.get_variable("w", initializer=W0)
    loss = tf.reduce_mean(tf.matmul(X, w))
    opt = tf_dpkit.v1.DPGradientDescentGaussianOptimizer(1.0, 1.0, learning_rate=0.1)
    with pytest.raises(ValueError, match="WITHOUT privacy"):
      opt.apply_gradients([(tf.gradients(loss, w)[0], w)])
