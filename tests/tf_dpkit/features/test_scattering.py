"""tf_dpkit.features.scattering: the 2-D scattering transform against Kymatio's own output
(an independent implementation), closed forms (a constant image, homogeneity, channel counts),
per-example independence (the reason it costs no privacy) and every refusal.

The reference file was made by ``make_kymatio_reference.py.txt`` (beside it) with kymatio
0.3.0's NumPy frontend, scipy 1.16.3, numpy 2.4.6, in float64 (kymatio's filters are float32,
hence agreement to about 1e-7).  Kymatio normalises its Gabor filters by ``2 * 3.1415 *
sigma^2`` where we use pi; every filter is then scaled by ``c = 3.1415 / pi``, and as the
transform is 1-homogeneous in each filter, order-m channels scale by ``c^(m + 1)``: the
reference is rescaled by that closed form before comparing.
"""
import math
import os

import numpy as np
import pytest

from tf_dpkit.features import scattering

_REF = os.path.join(os.path.dirname(__file__), "kymatio_scattering_reference.npz")
_C = 3.1415 / math.pi


def _reference(key, J, L, max_order=2):
  ref = np.load(_REF)[key].copy()
  first = 1 + J * L
  ref[:, 0] *= _C
  ref[:, 1:first] *= _C**2
  if max_order == 2:
    ref[:, first:] *= _C**3
  return ref


@pytest.mark.parametrize("key,J,L,max_order", [
    ("s_J2_L8", 2, 8, 2), ("s_J1_L8", 1, 8, 2), ("s_J2_L4", 2, 4, 2), ("s_J3_L4", 3, 4, 2),
    ("s_J2_L8_order1", 2, 8, 1)])
def test_matches_kymatio(key, J, L, max_order):
  """Every channel, in Kymatio's order (S0; order 1 by (j1, t1); order 2 by (j1, t1, j2, t2)),
  on random, impulse and oriented-stripe images; J = 3 has order-2 channels from two j2 per
  j1 (the ordering of blocks), max_order = 1 leaves order 2 out."""
  x = np.load(_REF)["x"]
  got = scattering.scattering_2d(x, J=J, L=L, max_order=max_order, dtype=np.float64)
  ref = _reference(key, J, L, max_order)
  assert got.shape == ref.shape == (len(x), scattering.scattering_channels(J, L, max_order),
                                    *scattering.scattering_output_shape(28, 28, J))
  np.testing.assert_allclose(got, ref, rtol=0, atol=1e-6)
  single = scattering.scattering_2d(x, J=J, L=L, max_order=max_order)  # float32 FFTs
  assert single.dtype == np.float32
  np.testing.assert_allclose(single, ref, rtol=0, atol=2e-6)


def test_matches_kymatio_on_a_non_square_image():
  """28 x 24 images: rows and columns are not swapped anywhere (padding, filters, cut)."""
  data = np.load(_REF)
  got = scattering.scattering_2d(data["x_rect"], J=2, L=8, dtype=np.float64)
  assert got.shape == (2, 81, 7, 6)
  np.testing.assert_allclose(got, _reference("s_rect_J2_L8", 2, 8), rtol=0, atol=1e-6)


def test_channel_counts_follow_the_closed_form():
  for J, L in [(1, 8), (2, 8), (3, 4), (4, 6)]:
    assert scattering.scattering_channels(J, L) == 1 + J * L + L * L * J * (J - 1) // 2
    assert scattering.scattering_channels(J, L, max_order=1) == 1 + J * L
  assert scattering.scattering_channels(2, 8) == 81  # Tramer & Boneh's 81 x 7 x 7 on MNIST
  assert scattering.scattering_output_shape(28, 28, 2) == (7, 7)
  assert scattering.scattering_output_shape(32, 30, 3) == (4, 3)


def test_constant_image():
  """The wavelets have zero mean and the low-pass sums to one, and reflect padding keeps a
  constant image constant: order 0 is the constant, orders 1 and 2 are zero."""
  x = np.full((2, 28, 28), 0.7)
  s = scattering.scattering_2d(x, J=2, L=8, dtype=np.float64)
  np.testing.assert_allclose(s[:, 0], 0.7, rtol=1e-9)
  np.testing.assert_allclose(s[:, 1:], 0.0, atol=1e-9)


def test_homogeneous_of_degree_one():
  """Linear filters and moduli only: S_0(c x) = c S_0(x) for order 0 (no modulus) and
  S_m(c x) = |c| S_m(x) for orders m >= 1."""
  x = np.random.default_rng(1).uniform(size=(3, 20, 20))
  s = scattering.scattering_2d(x, J=2, L=4, dtype=np.float64)
  np.testing.assert_allclose(scattering.scattering_2d(2.5 * x, J=2, L=4, dtype=np.float64),
                             2.5 * s, rtol=1e-10, atol=1e-12)
  negative = scattering.scattering_2d(-x, J=2, L=4, dtype=np.float64)
  np.testing.assert_allclose(negative[:, 1:], s[:, 1:], rtol=1e-10, atol=1e-12)
  np.testing.assert_allclose(negative[:, 0], -s[:, 0], rtol=1e-10, atol=1e-12)


def test_each_image_is_transformed_on_its_own():
  """The privacy argument: an image's features do not depend on the other images of the batch
  or on how the data are cut into batches (changing every other image changes nothing)."""
  rng = np.random.default_rng(2)
  x = rng.uniform(size=(7, 28, 28))
  together = scattering.scattering_2d(x, batch_size=7, dtype=np.float64)
  alone = np.concatenate([scattering.scattering_2d(x[i:i + 1], dtype=np.float64)
                          for i in range(len(x))])
  np.testing.assert_array_equal(
      scattering.scattering_2d(x, batch_size=3, dtype=np.float64), together)
  np.testing.assert_allclose(together, alone, rtol=0, atol=1e-12)
  others = x.copy()
  others[1:] = rng.uniform(size=others[1:].shape)
  np.testing.assert_allclose(scattering.scattering_2d(others, dtype=np.float64)[0],
                             together[0], rtol=0, atol=1e-12)


def test_channel_axis_of_one_and_empty_batch():
  x = np.random.default_rng(3).uniform(size=(2, 28, 28))
  np.testing.assert_array_equal(scattering.scattering_2d(x[..., None]),
                                scattering.scattering_2d(x))
  assert scattering.scattering_2d(np.zeros((0, 28, 28))).shape == (0, 81, 7, 7)


@pytest.mark.parametrize("kwargs,match", [
    ({"J": 0}, "J must be"), ({"J": 1.5}, "J must be"), ({"J": 5}, r"2\*\*J <= min"),
    ({"L": 0}, "L must be"), ({"max_order": 3}, "max_order must be"),
    ({"max_order": 0}, "max_order must be"), ({"batch_size": 0}, "batch_size must be"),
    ({"dtype": np.float16}, "dtype must be float32 or float64"),
    ({"dtype": np.int32}, "dtype must be float32 or float64"),
    ({"dtype": "foo"}, "dtype must be float32 or float64")])
def test_refuses_bad_settings(kwargs, match):
  with pytest.raises(ValueError, match=match):
    scattering.scattering_2d(np.zeros((1, 28, 28)), **kwargs)


@pytest.mark.parametrize("images,match", [
    (np.zeros((28, 28)), "images must have shape"),
    (np.zeros((1, 28, 28, 3)), "images must have shape"),
    (np.full((1, 28, 28), np.nan), "finite real"),
    (np.full((1, 28, 28), np.inf), "finite real"),
    (np.zeros((1, 28, 28), complex), "finite real"),
    (np.array([[["a"] * 28] * 28]), "finite real")])
def test_refuses_bad_images(images, match):
  with pytest.raises(ValueError, match=match):
    scattering.scattering_2d(images)


def test_settings_are_checked_by_the_count_function_too():
  with pytest.raises(ValueError, match="L must be"):
    scattering.scattering_channels(2, 0)
