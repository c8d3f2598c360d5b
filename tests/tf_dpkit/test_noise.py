"""The keyed Gaussian sampler: distribution (against scipy), keying, shapes and dtypes.

Fixed seeds make every statistical check deterministic; tolerances are stated per check and
are several standard errors wide, so a correct sampler passes for any seed and a sampler with a
wrong scale, a biased mean, correlated pairs or clipped tails fails.
"""
import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from tf_dpkit import native, noise

N = 1_000_001  # odd: the last Box-Muller pair is cut in half
SEED = tf.constant([11, 7], tf.int64)


@pytest.fixture(scope="module", params=["compiled", "tf_ops"])
def samples(request):
  """Both samplers: the compiled CPU kernels (tf_dpkit.native) and the TensorFlow-op one."""
  if request.param == "tf_ops":
    drawn = noise.tf_ops_standard_normal(tf.TensorShape([N]), SEED)
  else:
    if native.kernels("noise") is None:
      pytest.skip(f"compiled noise kernels unavailable here: {native.status('noise')}")
    drawn = noise.stateless_standard_normal(tf.TensorShape([N]), SEED, device="/CPU:0")
  return drawn.numpy().astype(np.float64)


def test_samples_follow_the_standard_normal(samples):
  assert samples.shape == (N,)
  # Kolmogorov-Smirnov against scipy's N(0, 1): a 1% error in scale gives p ~ 1e-20 at this n.
  assert stats.kstest(samples, "norm").pvalue > 1e-3
  se = 1 / np.sqrt(N)
  assert abs(samples.mean()) < 5 * se
  assert abs(samples.var() - 1) < 5 * np.sqrt(2) * se  # var of the sample variance: 2/n
  assert abs(stats.kurtosis(samples, fisher=False) - 3) < 5 * np.sqrt(24) * se


def test_tails_match_the_normal_up_to_the_float32_resolution(samples):
  for threshold in (2.0, 3.0, 4.0):
    expected = 2 * stats.norm.sf(threshold)
    observed = np.mean(np.abs(samples) > threshold)
    assert abs(observed - expected) < 5 * np.sqrt(expected / N), threshold
  # Uniforms are multiples of 2^-23: the radius, hence |z|, is at most sqrt(2 ln 2^23).
  assert np.abs(samples).max() <= np.sqrt(2 * 23 * np.log(2)) + 1e-5


def test_the_two_halves_of_each_pair_are_uncorrelated(samples):
  half = (N + 1) // 2
  cos_part, sin_part = samples[:half - 1], samples[half:2 * half - 1]
  se = 1 / np.sqrt(half)
  assert abs(np.corrcoef(cos_part, sin_part)[0, 1]) < 5 * se
  # Dependence through the shared radius would show in the squares.
  assert abs(np.corrcoef(cos_part**2, sin_part**2)[0, 1]) < 5 * se
  # Neighbours within one half come from different uniforms.
  assert abs(np.corrcoef(samples[:-1], samples[1:])[0, 1]) < 5 / np.sqrt(N)


def test_equal_seeds_give_equal_samples_and_other_seeds_other_samples():
  shape = tf.TensorShape([5, 3])
  a = noise.stateless_standard_normal(shape, SEED)
  b = noise.stateless_standard_normal(shape, SEED)
  c = noise.stateless_standard_normal(shape, SEED + [0, 1])
  np.testing.assert_array_equal(a.numpy(), b.numpy())
  assert not np.any(a.numpy() == c.numpy())


def test_dynamic_shapes_inside_tf_function():
  @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
  def like(x):
    return noise.stateless_standard_normal(tf.shape(x), SEED)

  out = like(tf.zeros([3, 5]))
  assert out.shape == (3, 5)
  np.testing.assert_array_equal(
      out.numpy(), noise.stateless_standard_normal(tf.TensorShape([3, 5]), SEED).numpy())
  assert like(tf.zeros([1, 1])).shape == (1, 1)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float32, tf.float64])
def test_dtypes(dtype):
  out = noise.stateless_standard_normal(tf.TensorShape([20_001]), SEED, dtype)
  assert out.dtype == dtype
  values = tf.cast(out, tf.float64).numpy()
  assert abs(values.std() - 1) < 0.05


def test_float64_uniforms_reach_further_into_the_tails():
  out = noise.stateless_standard_normal(tf.TensorShape([N]), SEED, tf.float64).numpy()
  assert stats.kstest(out, "norm").pvalue > 1e-3
  # Not the float32 grid: some radius differs from every float32-representable value.
  assert np.any(out != out.astype(np.float32))


def test_add_gaussian_noise_scales_keys_by_step_and_variable():
  zeros = [tf.zeros([200_000]), tf.zeros([100, 1000])]
  first = [t.numpy().ravel() for t in noise.add_gaussian_noise(zeros, 0.3, key=5, step=0)]
  again = [t.numpy().ravel() for t in noise.add_gaussian_noise(zeros, 0.3, key=5, step=0)]
  later = [t.numpy().ravel() for t in noise.add_gaussian_noise(zeros, 0.3, key=5, step=1)]
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a, b)
  for a in first:
    assert abs(a.std() - 0.3) < 0.3 * 5 * np.sqrt(2 / a.size)  # relative se of std: 1/sqrt(2n)
  se = 1 / np.sqrt(first[1].size)
  assert abs(np.corrcoef(first[0][:first[1].size], first[1])[0, 1]) < 5 * se  # per variable
  assert abs(np.corrcoef(first[0], later[0])[0, 1]) < 5 / np.sqrt(first[0].size)  # per step


def test_add_gaussian_noise_keeps_none_and_skips_zero_stddev():
  x = tf.ones([3])
  out = noise.add_gaussian_noise([None, x], 0, key=1, step=0)
  assert out[0] is None and out[1] is x


@pytest.mark.parametrize("seed", [-1, 2**62, 1.5, True, "1"])
def test_fresh_key_rejects_bad_seeds(seed):
  with pytest.raises(ValueError, match=r"seed must be None or an integer in \[0, 2\*\*62\)"):
    noise.fresh_key(seed)


def test_fresh_key_is_random_without_a_seed_and_the_seed_with_one():
  assert int(noise.fresh_key(123)) == 123
  assert len({noise.fresh_key() for _ in range(4)}) == 4


def test_add_gaussian_noise_streams_fold_in_64_bit_draw_and_variable_index():
  # Reference seed chain written out with explicit int64 fold-ins: an int32 fold-in (a plain
  # Python int) would derive each variable's stream from only 32 random bits.
  key, step, draw = 2**61 + 12345, 7, 3
  zeros = [tf.zeros([5]), tf.zeros([2, 3])]
  out = noise.add_gaussian_noise(zeros, 1.0, key=key, step=step, draw=draw)
  fold = tf.random.experimental.stateless_fold_in
  base = fold(tf.constant([key, step], tf.int64), tf.constant(draw, tf.int64))
  for index, (z, got) in enumerate(zip(zeros, out)):
    seed = fold(base, tf.constant(index, tf.int64))
    want = noise.stateless_standard_normal(z.shape, seed, tf.float32)
    np.testing.assert_array_equal(got.numpy(), want.numpy())
  other_draw = noise.add_gaussian_noise(zeros, 1.0, key=key, step=step, draw=draw + 1)
  assert not np.allclose(out[0].numpy(), other_draw[0].numpy())


@pytest.mark.parametrize("shape, count", [((5, 3), 2), ((5, 3), 3), ((7,), 4), ((2,), 5),
                                          ((300, 40), 2)])
@pytest.mark.parametrize("dynamic", [False, True])
def test_noise_parts_cover_every_element_once_with_the_full_variance(shape, count, dynamic):
  # add_gaussian_noise(part=(r, R)) puts N(0, s^2) on slice r of the flattened tensor (slices of
  # ceil(n / R)) and nothing elsewhere: over r = 0..R-1 (different replica ids, as the
  # replicas of one process call it) every element gets exactly one draw.
  n, s = int(np.prod(shape)), 0.7
  key = noise.as_secret(11)
  key.tensor()
  if dynamic:
    fn = tf.function(lambda x, r: noise.add_gaussian_noise([x], s, key, 3, 0, r, part=(r, count)),
                     input_signature=[tf.TensorSpec([None] + list(shape[1:])),
                                      tf.TensorSpec([], tf.int32)])
  else:
    fn = lambda x, r: noise.add_gaussian_noise([x], s, key, 3, 0, r, part=(r, count))
  parts = np.stack([fn(tf.zeros(shape), tf.constant(r))[0].numpy().ravel() for r in range(count)])
  chunk = -(-n // count)
  for r in range(count):
    support = np.zeros(n, bool)
    support[r * chunk:(r + 1) * chunk] = True
    assert np.all(parts[r, ~support] == 0)
    assert np.all(parts[r, support] != 0)
  assert np.all(np.count_nonzero(parts, axis=0) == 1)
  assert parts[0].shape == (n,)
  if n >= 10000:  # 12,000 draws: std's standard error 0.65%; tolerance 5% (7.7 of them)
    assert np.std(parts.sum(axis=0)) == pytest.approx(s, rel=0.05)
    assert stats.kstest(parts.sum(axis=0) / s, "norm").pvalue > 1e-3


def test_noise_part_count_must_be_a_positive_int():
  for count in (0, 1.0, True):
    with pytest.raises(ValueError, match=r"part's count must be an int >= 1, got"):
      noise.add_gaussian_noise([tf.zeros([3])], 1.0, 1, 0, part=(0, count))
