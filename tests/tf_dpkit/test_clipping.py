"""Clipping and microbatch splitting against NumPy references."""
import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings, strategies as st

from tf_dpkit.clipping import clip_and_sum, global_norms, split_into_microbatches


def _numpy_clip_and_sum(grads, clip):
  flat = np.concatenate([g.reshape(g.shape[0], -1) for g in grads], axis=1)
  norms = np.linalg.norm(flat, axis=1)
  factors = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
  return [np.tensordot(factors, g, axes=[[0], [0]]) for g in grads], norms


def test_clip_and_sum_matches_numpy_reference():
  rng = np.random.default_rng(0)
  grads = [rng.normal(size=(6, 3, 2)) * 3, rng.normal(size=(6, 4))]
  expected, expected_norms = _numpy_clip_and_sum(grads, 1.5)
  summed, norms = clip_and_sum([tf.constant(g) for g in grads], 1.5)
  np.testing.assert_allclose(norms.numpy(), expected_norms, rtol=1e-12)
  for got, want in zip(summed, expected):
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)


def test_zero_gradient_is_not_nan_and_none_stays_none():
  summed, norms = clip_and_sum([tf.zeros([3, 2]), None], 1.0)
  assert summed[1] is None
  np.testing.assert_array_equal(summed[0].numpy(), np.zeros(2))
  np.testing.assert_array_equal(norms.numpy(), np.zeros(3))


def test_global_norms_rejects_all_none():
  with pytest.raises(ValueError, match="No variable has a gradient"):
    global_norms([None])


@settings(max_examples=40, deadline=None)
@given(scale=st.floats(1e-3, 1e3), clip=st.floats(1e-2, 10.0), seed=st.integers(0, 2**31 - 1))
def test_each_clipped_contribution_is_within_the_clip(scale, clip, seed):
  rng = np.random.default_rng(seed)
  grads = [tf.constant(rng.normal(size=(5, 7)) * scale), tf.constant(rng.normal(size=(5,)) * scale)]
  # A single microbatch's contribution is the clipped sum of that microbatch alone.
  for j in range(5):
    single = [g[j:j + 1] for g in grads]
    summed, _ = clip_and_sum(single, clip)
    total = np.sqrt(sum(np.sum(s.numpy() ** 2) for s in summed))
    assert total <= clip * (1 + 1e-9)


def test_split_into_microbatches_means_groups_in_order():
  loss = tf.constant([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
  np.testing.assert_allclose(split_into_microbatches(loss, 3).numpy(), [1.5, 3.5, 5.5])
  np.testing.assert_allclose(split_into_microbatches(loss, None).numpy(), loss.numpy())


def test_split_rejects_scalar_loss():
  with pytest.raises(ValueError, match="vector loss"):
    split_into_microbatches(tf.constant(1.0), 2)


def test_split_rejects_indivisible_batch_statically():
  with pytest.raises(ValueError, match="num_microbatches=4 must divide the batch size \\(6\\).*drop_remainder"):
    split_into_microbatches(tf.ones([6]), 4)


def test_split_rejects_indivisible_batch_at_run_time():
  fn = tf.function(lambda x: split_into_microbatches(x, 4),
                   input_signature=[tf.TensorSpec([None], tf.float32)])
  with pytest.raises(tf.errors.InvalidArgumentError, match="num_microbatches=4 must divide"):
    fn(tf.ones([6]))
