"""tf_dpkit.features.normalization: private per-channel statistics -- the removal bound by
brute force with the noise held fixed (one key), the noise against its stated scale, the
recorded epsilon against the Gaussian mechanism's exact curve, what ``apply`` computes, the
secret default key, and every refusal."""
import math

import numpy as np
import pytest
from scipy import optimize, stats

from analysis import events
from tf_dpkit.budget import PrivacyLedger
from tf_dpkit.features import normalization


def _features(n=30, k=5, seed=0, scale=1.0):
  return np.random.default_rng(seed).normal(0.5, 1.0, size=(n, k, 3, 3)) * scale


def _release(x, seed=0, **kwargs):
  settings = dict(mean_clip=1.0, second_moment_clip=2.0, noise_multiplier=3.0, seed=seed)
  settings.update(kwargs)
  return normalization.private_channel_normalization(x, **settings)


def _clipped_sums(x, c_a, c_b):
  """Independent recomputation: per-record channel means and mean squares, clipped in L2."""
  a = x.mean(axis=(2, 3))
  b = (x**2).mean(axis=(2, 3))
  clip = lambda v, c: v * np.minimum(1.0, c / np.linalg.norm(v, axis=1, keepdims=True))
  return clip(a, c_a).sum(axis=0), clip(b, c_b).sum(axis=0)


def test_removing_one_record_moves_the_sums_by_at_most_the_clips():
  """With the same key the noise is the same, so n * (released difference) is the difference of
  the clipped sums: over every record of a data set with outliers, never more than C_a and C_b,
  and the outlier reaches the bound (it is clipped, not passed through)."""
  x = _features(20, 4, scale=1.0)
  x[3] *= 50.0  # an outlier whose mean and mean square are far above the clips
  full = _release(x, dataset_size=20)
  moves_a, moves_b = [], []
  for i in range(len(x)):
    without = _release(np.delete(x, i, axis=0), dataset_size=20)
    moves_a.append(np.linalg.norm(full.mean - without.mean) * 20)
    m2_full, m2_without = full.variance + full.mean**2, without.variance + without.mean**2
    moves_b.append(np.linalg.norm(m2_full - m2_without) * 20)
  assert max(moves_a) <= 1.0 + 1e-9 and moves_a[3] == pytest.approx(1.0)
  # The variance is clipped at 0 below; the data here keep it positive in every channel.
  assert max(moves_b) <= 2.0 + 1e-9 and moves_b[3] == pytest.approx(2.0)


def test_released_values_are_clipped_sums_plus_noise_of_the_stated_scale():
  """(released - exact) / (C sigma / n) over 300 keys and 5 channels is N(0, 1) (KS test); a
  mutant with noise sigma / n (no clip factor) would give std 1/C_a = 2 for the mean."""
  x = _features(40, 5)
  c_a, c_b, sigma, n = 0.5, 2.0, 3.0, 40
  sum_a, sum_b = _clipped_sums(x, c_a, c_b)
  z_a, z_b = [], []
  for seed in range(300):
    got = _release(x, seed=seed, mean_clip=c_a, second_moment_clip=c_b, noise_multiplier=sigma)
    z_a.append((got.mean * n - sum_a) / (c_a * sigma))
    m2 = got.variance + got.mean**2
    keep = got.variance > 0
    z_b.append(((m2 * n - sum_b) / (c_b * sigma))[keep])
  z_a, z_b = np.concatenate(z_a), np.concatenate(z_b)
  assert stats.kstest(z_a, "norm").pvalue > 0.01
  assert stats.kstest(z_b, "norm").pvalue > 0.01
  assert len(z_b) > 1400  # the variance floor at 0 was rarely hit


def test_the_two_noises_are_independent():
  """Records of +-1 (mean 0, mean square 1, variance 1): with small noise the variance floor is
  never hit, so n * (released - exact) of the two sums are the two noises themselves."""
  x = np.ones((10, 3, 2, 2))
  x[:, :, 0, :] = -1.0
  za, zb = [], []
  for seed in range(400):
    got = _release(x, seed=seed, mean_clip=2.0, second_moment_clip=2.0, noise_multiplier=0.5)
    assert np.all(got.variance > 0)
    za.append(got.mean * 10)
    zb.append((got.variance + got.mean**2) * 10 - 10.0)
  za, zb = np.concatenate(za), np.concatenate(zb)
  assert abs(stats.pearsonr(za, zb)[0]) < 0.1
  assert za.std() == pytest.approx(1.0, rel=0.08) and zb.std() == pytest.approx(1.0, rel=0.08)


def _exact_gaussian_epsilon(mu, delta):
  """Exact epsilon of the Gaussian mechanism with mu = sensitivity / std (Balle & Wang 2018):
  delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)."""
  curve = lambda eps: (stats.norm.cdf(mu / 2 - eps / mu)
                       - math.exp(eps) * stats.norm.cdf(-mu / 2 - eps / mu) - delta)
  return optimize.brentq(curve, 0.0, 200.0)


@pytest.mark.parametrize("sigma", [2.0, 8.0])
def test_recorded_epsilon_is_one_gaussian_mechanism_of_mu_sqrt2_over_sigma(sigma):
  ledger = PrivacyLedger(1e-5)
  got = _release(_features(), noise_multiplier=sigma, ledger=ledger)
  assert got.event == events.GaussianEvent(sigma / math.sqrt(2.0))
  assert ledger.steps == 2
  exact = _exact_gaussian_epsilon(math.sqrt(2.0) / sigma, 1e-5)
  assert ledger.epsilon() == pytest.approx(exact, rel=1e-4)
  # Composed with DP-SGD steps in the same ledger, the epsilon grows.
  ledger.record(0.02, 1.0, 100)
  assert ledger.epsilon() > exact


def test_apply_standardises_with_the_released_statistics():
  x = _features(30, 4)
  got = _release(x)
  out = got.apply(x)
  expect = (x - got.mean[None, :, None, None]) / np.sqrt(got.variance[None, :, None, None] + 1e-5)
  np.testing.assert_allclose(out, expect * (got.variance > 0)[None, :, None, None])
  last = got.apply(np.moveaxis(x, 1, -1), channel_axis=-1)
  np.testing.assert_allclose(last, np.moveaxis(out, 1, -1))
  assert got.apply(x.astype(np.float32)).dtype == np.float32
  zero = normalization.ChannelNormalization(np.zeros(2), np.array([0.0, 4.0]), 1.0,
                                            events.GaussianEvent(1.0))
  np.testing.assert_allclose(zero.apply(np.full((1, 2, 1, 1), 3.0))[0, :, 0, 0],
                             [0.0, 3.0 / math.sqrt(4.0 + 1e-5)])
  with pytest.raises(ValueError, match="features have 3 channels on axis 1, the statistics 4"):
    got.apply(np.zeros((1, 3, 2, 2)))
  with pytest.raises(ValueError, match="epsilon must be"):
    got.apply(x, epsilon=0.0)
  for axis in (4, -5, 1.5, True):
    with pytest.raises(ValueError, match="channel_axis must be"):
      got.apply(x, channel_axis=axis)
  with pytest.raises(ValueError, match="channel_axis must not be 0"):
    got.apply(np.zeros((4, 4)), channel_axis=0)
  with pytest.raises(ValueError, match="features must have a record axis"):
    got.apply(np.float64(3.0))


def test_mean_and_variance_are_close_for_large_data_and_clips_that_do_not_bind():
  """n = 20,000 records, clips above every record's norm here, sigma 0.5: the released
  statistics are the exact ones within 5 noise std (C sigma / n = 7.5e-5), far below the
  smallest variance (0.01), so a release that dropped or zeroed a variance would fail."""
  rng = np.random.default_rng(5)
  x = rng.normal([[0.2], [1.0], [-0.5]], [[0.1], [0.3], [0.2]], size=(20000, 3, 4))
  a, b = x.mean(axis=2), (x * x).mean(axis=2)
  assert np.linalg.norm(a, axis=1).max() < 3.0 and np.linalg.norm(b, axis=1).max() < 3.0
  got = normalization.private_channel_normalization(
      x, mean_clip=3.0, second_moment_clip=3.0, noise_multiplier=0.5, seed=1)
  std = 3.0 * 0.5 / 20000
  np.testing.assert_allclose(got.mean, x.mean(axis=(0, 2)), rtol=0, atol=5 * std)
  np.testing.assert_allclose(got.variance, x.var(axis=(0, 2)), rtol=0, atol=5 * std * 4)
  assert np.all(got.variance > 0.009)


def test_default_key_is_secret_and_fresh():
  x = _features()
  a = normalization.private_channel_normalization(
      x, mean_clip=1.0, second_moment_clip=1.0, noise_multiplier=1.0)
  b = normalization.private_channel_normalization(
      x, mean_clip=1.0, second_moment_clip=1.0, noise_multiplier=1.0)
  assert not np.array_equal(a.mean, b.mean)
  np.testing.assert_array_equal(_release(x, seed=4).mean, _release(x, seed=4).mean)


@pytest.mark.parametrize("kwargs,match", [
    ({"mean_clip": 0.0}, "mean_clip must be"), ({"mean_clip": math.inf}, "mean_clip must be"),
    ({"second_moment_clip": -1.0}, "second_moment_clip must be"),
    ({"noise_multiplier": 0.0}, "noise_multiplier must be"),
    ({"noise_multiplier": math.nan}, "noise_multiplier must be"),
    ({"dataset_size": 0}, "dataset_size must be"),
    ({"channel_axis": 0}, "channel_axis must not be 0"),
    ({"channel_axis": 4}, "channel_axis must be"),
    ({"seed": -1}, "seed must be None or an integer")])
def test_refuses_bad_arguments(kwargs, match):
  with pytest.raises(ValueError, match=match):
    _release(_features(), **kwargs)


@pytest.mark.parametrize("x,match", [
    (np.zeros((0, 3, 2)), r"features must have shape \[n >= 1"),
    (np.zeros(5), r"features must have shape \[n >= 1"),
    (np.full((2, 3, 2), np.nan), "features must hold finite real values"),
    (np.full((2, 3, 2), np.inf), "features must hold finite real values"),
    (np.full((2, 3, 2), "a"), "features must hold finite real values"),
    (np.zeros((2, 3, 2), complex), "features must hold finite real values")])
def test_refuses_bad_features(x, match):
  with pytest.raises(ValueError, match=match):
    _release(x)
