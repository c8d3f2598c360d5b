"""Reading and checking the ``data`` a pipeline samples from, and arranging its elements.

``data`` is one array or tensor, tuples and dicts of them, or a finite ``tf.data.Dataset`` of
single examples (read into memory once); every leaf has the same first (example) dimension
``N >= 1``.  Element ``t`` of a pipeline is that structure gathered at the batch's indices plus
a float32 weight vector, arranged for Keras ``fit``.  The rules and the reasons for them:
``docs/design/data_pipelines.md`` ("Data").  Private to ``tf_dpkit``; the public names
(:func:`check_finite_features`, :func:`check_class_labels`) are exported by
``tf_dpkit.data``.
"""
from __future__ import annotations

import re

import numpy as np
import tensorflow as tf

from analysis import _checks

_READ_CHUNK = 2**16  # examples per chunk when reading a dataset of unknown cardinality
_ALLOWED = ("an array or tensor, a tuple or dict of them (nested as deep as you like, e.g. "
            "(x, y), {'image': x, 'label': y} or ({'image': x}, y)), or a finite tf.data.Dataset "
            "of single examples")


def _leaves(structure, path: str, out: list) -> list:
  """Appends ``(path, leaf)`` for ``structure``'s leaves in ``tf.nest.flatten`` order.

  Only tuples (namedtuples included) and dicts may nest: ``tf.data`` stacks a list into one
  tensor, so lists are refused rather than silently changed.
  """
  if isinstance(structure, list):
    raise TypeError(
        f"{path} is a list; tf.data would stack a list into one tensor, so give a tuple for "
        "several arrays (e.g. (x, y) or ((x1, x2), y)) or np.asarray(...) for one array. "
        f"data must be {_ALLOWED}.")
  if isinstance(structure, tuple):
    for i, item in enumerate(structure):
      _leaves(item, f"{path}[{i}]", out)
  elif isinstance(structure, dict):
    try:
      keys = sorted(structure)  # tf.nest's order
    except TypeError as e:
      raise TypeError(f"{path} is a dict whose keys cannot be sorted ({e}); tf.nest needs "
                      "sortable keys, e.g. all strings.") from None
    for key in keys:
      _leaves(structure[key], f"{path}[{key!r}]", out)
  elif tf.nest.is_nested(structure):
    raise TypeError(f"{path} is a {type(structure).__name__}; only tuples and dicts may nest. "
                    f"data must be {_ALLOWED}.")
  else:
    out.append((path, structure))
  return out


def _leaf_tensor(path: str, leaf) -> tf.Tensor:
  """``leaf`` (one array-like in ``data``) as a dense tensor, or a TypeError naming ``path``."""
  if leaf is None:
    raise TypeError(f"{path} is None; every leaf of data must be an array or tensor.")
  if isinstance(leaf, tf.data.Dataset):
    raise TypeError(f"{path} is a tf.data.Dataset; a Dataset must be the whole of data (combine "
                    "several with tf.data.Dataset.zip, e.g. zip((features, labels))).")
  if isinstance(leaf, (tf.RaggedTensor, tf.SparseTensor)):
    raise TypeError(f"{path} is a {type(leaf).__name__}; only dense arrays/tensors are supported "
                    "(pad it to a dense tensor first, e.g. .to_tensor() or tf.sparse.to_dense).")
  try:
    return tf.convert_to_tensor(leaf)
  except (TypeError, ValueError) as e:
    raise TypeError(f"{path} must be an array or tensor; a {type(leaf).__name__} could not be "
                    f"converted to a tensor ({e}).") from None


def _op_message(error: tf.errors.OpError) -> str:
  """``error``'s message without the ``{{function_node ...}}`` and ``[Op:...]`` decorations."""
  message = re.sub(r"\{\{[^}]*\}\}\s*", "", error.message)
  return re.sub(r"\s*\[Op:[^\]]*\].*$", "", message, flags=re.S).strip()


def _materialise(dataset: tf.data.Dataset):
  """The examples of a finite ``tf.data.Dataset`` of single examples as stacked tensors.

  Returns the element structure with each leaf of shape ``[N, ...]``.  Refuses (ValueError /
  TypeError naming ``data``) what cannot be stacked: infinite or empty datasets, elements with
  an unknown or ``None`` first dimension (probably already batched), non-dense components and
  elements whose shapes differ.
  """
  for path, spec in _leaves(dataset.element_spec, "data.element_spec", []):
    if not isinstance(spec, tf.TensorSpec):  # ragged, sparse, None, ...
      raise TypeError(
          f"data is a tf.data.Dataset with a {type(spec).__name__} component ({path}); only "
          "dense tensors are supported (e.g. map ragged/sparse components to dense tensors of a "
          "fixed shape with .to_tensor() / tf.sparse.to_dense, and drop None components).")
    if spec.shape.rank is None or (spec.shape.rank >= 1 and spec.shape[0] is None):
      raise ValueError(
          f"data is a tf.data.Dataset whose elements look batched: {path} has shape "
          f"{spec.shape}, with an unknown first dimension.  Its elements must be single "
          "examples of a fixed shape: pass data.unbatch() for a batched dataset, or give the "
          "elements a static shape (e.g. map tf.ensure_shape over them).")
  if not tf.executing_eagerly():
    raise ValueError("data: a tf.data.Dataset is read into memory eagerly, so build the "
                     "pipeline outside tf.function and tf.compat.v1 graphs (or pass arrays).")
  cardinality = int(dataset.cardinality())
  if cardinality == tf.data.INFINITE_CARDINALITY:
    raise ValueError("data is an infinite tf.data.Dataset (e.g. after .repeat()); Poisson "
                     "sampling needs the finite set of training examples: drop the repeat "
                     "(steps= sets the number of batches).")
  if cardinality == 0:
    raise ValueError("data is an empty tf.data.Dataset; it must hold at least 1 example.")
  # A known size is read as one batch: one copy of the data.  An unknown one (e.g. after
  # filter) in chunks, then concatenated: two copies for a moment.  (A batch size far above
  # the number of elements is no way out: TensorFlow aborts when size * element overflows.)
  size = cardinality if cardinality > 0 else _READ_CHUNK
  try:
    chunks = list(dataset.batch(size))
    if not chunks:
      raise ValueError("data is an empty tf.data.Dataset; it must hold at least 1 example.")
    stacked = chunks[0] if len(chunks) == 1 else tf.nest.map_structure(
        lambda *parts: tf.concat(parts, axis=0), *chunks)
  except tf.errors.InvalidArgumentError as e:
    raise ValueError(
        "data: could not stack the tf.data.Dataset's elements into in-memory tensors; its "
        "elements must be single examples that all have the same shape (pad or crop them "
        f"to one shape first).  TensorFlow said: {_op_message(e)}") from None
  return stacked


def as_structure(data):
  """``data`` as its structure of tensors (``tf.data.Dataset`` read into memory) and ``N``.

  Returns ``(structure, n)``: ``structure`` has ``data``'s nesting (for a dataset, its
  element's) with every leaf a tensor of shape ``[N, ...]``.  Float arrays holding inf or NaN
  are refused (:func:`check_finite_features`).
  """
  if isinstance(data, tf.data.Dataset):
    structure = _materialise(data)
    leaves = _leaves(structure, "data", [])
  else:
    leaves = _leaves(data, "data", [])
    if not leaves:
      raise ValueError("data must be an array, a non-empty tuple/dict of arrays or a "
                       f"tf.data.Dataset; got an empty {type(data).__name__} {data!r}.")
    leaves = [(path, _leaf_tensor(path, leaf)) for path, leaf in leaves]
    structure = tf.nest.pack_sequence_as(data, [t for _, t in leaves])
  sizes = []
  for path, t in leaves:
    if t.shape.rank is None or t.shape.rank < 1 or t.shape[0] is None:
      raise ValueError(f"{path} must have a known first (example) dimension, got shape "
                       f"{t.shape}.")
    sizes.append(int(t.shape[0]))
  if len(set(sizes)) != 1:
    raise ValueError("data: all arrays must have the same first dimension (number of "
                     f"examples), got first dimensions {sizes} for "
                     f"{', '.join(path for path, _ in leaves)}.")
  if sizes[0] < 1:
    raise ValueError("data must hold at least 1 example (first dimension >= 1), got 0.")
  check_finite_features(structure)
  return structure, sizes[0]


def _known_values(leaf):
  """``leaf``'s values as a NumPy array when they are known without running a graph (arrays,
  eager tensors, graph constants), else None."""
  if isinstance(leaf, np.ndarray):
    return leaf
  try:
    return tf.get_static_value(tf.convert_to_tensor(leaf))
  except (TypeError, ValueError):
    return None


def _is_float(dtype) -> bool:
  """Whether ``dtype`` (NumPy's, bfloat16 included) is a real floating type."""
  try:
    return tf.as_dtype(dtype).is_floating
  except TypeError:
    return False


def _first_bad_example(bad: np.ndarray) -> tuple[int, int]:
  """``(count, first example index)`` of the True entries of ``bad`` [N, ...] (one pass)."""
  count = int(np.count_nonzero(bad))
  first = int(np.argmax(bad.reshape(len(bad), -1).any(axis=1))) if count else -1
  return count, first


def check_finite_features(data, name: str = "data") -> None:
  """Raises ``ValueError`` when a float array of ``data`` holds an inf or NaN entry.

  ``data``: an array or tensor, or a tuple/dict nest of them, each of shape ``[N, ...]``.  The
  message names the array (``name`` and its place in the nest), the number of non-finite
  entries and the first example holding one.  The clipping paths never let such an example move
  a clipped sum (it contributes 0), but it trains nothing either: clean or drop it first, e.g.
  ``keep = np.isfinite(x).reshape(len(x), -1).all(axis=1)``.  One vectorised pass per array;
  symbolic tensors of a graph being built (values unknown) are not checked.
  """
  for path, leaf in _leaves(data, name, []):
    values = _known_values(leaf)
    if values is None or values.ndim < 1 or not _is_float(values.dtype):
      continue
    count, first = _first_bad_example(~np.isfinite(values))
    if count:
      raise ValueError(
          f"{path} holds {count} non-finite (inf or NaN) entr{'y' if count == 1 else 'ies'}, the "
          f"first in example {first}. Such an example contributes nothing to DP-SGD's clipped "
          "sums (so it is bounded), but it trains nothing either: drop or repair it first, e.g. "
          "keep = np.isfinite(x).reshape(len(x), -1).all(axis=1); x, y = x[keep], y[keep].")


def check_class_labels(labels, num_classes: int, name: str = "labels") -> None:
  """Raises ``ValueError`` unless every entry of the integer array ``labels`` is a class id in
  ``[0, num_classes)`` (``num_classes`` an int >= 1); float labels are not class ids and are
  left alone, as are symbolic tensors (values unknown).  The message names ``name``, the range,
  the number of entries outside it and the first example holding one."""
  num_classes = _checks.check_integer("num_classes", num_classes, minimum=1)
  values = _known_values(labels)
  if values is None or values.ndim < 1 or not np.issubdtype(values.dtype, np.integer):
    return
  bad = (values < 0) | (values >= num_classes)
  count, first = _first_bad_example(bad)
  if count:
    value = int(values[first][bad[first]].ravel()[0]) if values.ndim > 1 else int(values[first])
    raise ValueError(
        f"{name} must be class ids in [0, {num_classes}) (num_classes={num_classes}); {count} "
        f"entr{'y is' if count == 1 else 'ies are'} outside, the first {value} in example "
        f"{first}.")


def gather(structure, indices, weights):
  """The batch ``indices`` of ``structure`` plus ``weights``, arranged for Keras ``fit``
  (docs/design/data_pipelines.md, "Data")."""
  batch = tf.nest.map_structure(lambda t: tf.gather(t, indices), structure)
  if isinstance(structure, tuple):
    return tuple(batch) + (weights,)  # (x_b, y_b, ..., weight)
  if isinstance(structure, dict):
    return batch, None, weights  # Keras: x = the dict, no y, sample_weight = weight
  return batch, weights  # one array
