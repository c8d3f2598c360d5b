"""Batch pipelines for DP-SGD: Poisson sampling (what the accountants assume) and shuffle-and-batch.

Poisson sampling
----------------
The RDP and PLD accountants analyse the *Poisson-subsampled* Gaussian mechanism: at every step
``t`` each of the ``N`` training examples joins the batch independently with probability ``q``
(the sampling probability, ``0 < q <= 1``), independently of every other example and of every
other step.  The batch size is then ``|B_t| ~ Binomial(N, q)``, with mean ``qN`` (the *expected
batch size*) and variance ``qN(1 - q)``.  :func:`poisson_batches` implements exactly this:

* Step ``t`` draws ``N`` independent uniform 64-bit integers ``u_i`` from a counter-based
  (Philox) stateless generator whose key is derived from ``(seed, t)`` alone
  (``tf.random.experimental.stateless_fold_in``), and selects example ``i`` iff
  ``u_i < floor(q * 2**64)``.  So each example is included with probability
  ``q' = floor(q * 2**64) / 2**64``, with ``q - 2**-64 < q' <= q`` (``q' = 1`` when ``q = 1``):
  never more than the ``q`` handed to the accountant, and the privacy loss is monotone in
  ``q``, so the accounted epsilon is an upper bound.  Steps use unrelated keys, so their draws
  are independent; the same ``(seed, t)`` always gives the same batch (reproducible, and
  independent of how far an iterator has advanced or of ``tf.data`` parallelism).
* Every pass over the dataset draws fresh batches: the ``p``-th iteration (``p = 0, 1, ...``:
  a Keras epoch without ``steps_per_epoch``, a second ``fit``, ``repeat``, a custom loop's
  second ``for``) emits the batches of steps ``p * steps ... (p + 1) * steps - 1``, so no batch
  is ever released twice while the ledger counts it as a fresh sample.  Transformations that
  could replay batches (``cache``, ``snapshot``) or change the mechanism are refused by the DP
  models' ``fit`` (:func:`pipeline_of`).  (The pass counter is a stateful op, so, as before,
  TensorFlow refuses to checkpoint a Poisson pipeline's iterator.)  The shuffle pipeline
  replays its permutations on a second pass: harmless, since it is accounted per epoch as a
  pass holding every example once, which a replayed permutation still is.
* The selected examples are gathered in ascending index order.  There is NO cap and no
  padding to a fixed size: a cap (truncating large draws) or a fixed-size resample would change
  the mechanism away from the one that is accounted.  Batches therefore have variable size, and
  the dataset's ``element_spec`` has an unknown (``None``) batch dimension, so ``tf.function``
  / Keras trace the training step once for all sizes instead of retracing per size.
* The seed must stay secret for the epsilon to hold: amplification by subsampling assumes the
  adversary does not know which examples were in which batch, and a known seed reveals every
  batch.  ``seed=None`` (the default) draws a 63-bit seed from the operating system's entropy
  source (``secrets``); pass an integer only for tests and reproducible experiments.
  The seed is read from a variable inside the dataset's functions (``tf_dpkit.noise``), so no
  file tf_dpkit or Keras writes holds it: iterator checkpoints of the shuffle pipeline carry no
  seed, and those of the Poisson pipeline are refused by TensorFlow (a stateful read).  Caveat:
  TensorFlow replaces captured variables by their values when it *serializes* a dataset graph
  (``experimental_distribute_dataset``'s rebatching and auto-sharding, the tf.data service), so
  such an in-memory graph holds the seed; :func:`distributed_poisson_batches` builds each
  worker's dataset in place, without that rewrite.  Do not send Poisson pipelines to the
  tf.data service.
* Each element is ``(x, y, weight)`` with ``weight`` a float32 ``[b]`` vector of ones.  If a
  draw selects nobody (probability ``(1 - q)**N``), the element is a batch of size 1 holding
  example 0 with weight 0.0, so downstream code never sees a 0-size batch.  This leaves the
  mechanism unchanged: the DP step multiplies each example's loss by its weight, so the
  placeholder's gradient, and hence its clipped gradient, is exactly 0 (clipping maps the zero
  vector to itself), and the released sum is ``0 + N(0, sigma^2 C^2 I)`` -- the same
  distribution whatever example 0 is and whether or not it is in the data set.  (Caveat: a
  non-finite gradient at example 0 would give ``0 * inf = nan`` -- but then training is broken
  for every batch holding example 0 anyway.)  Keras ``fit`` unpacks a 3-tuple as
  ``(x, y, sample_weight)``, which is exactly how the weight is meant to be consumed.
* Normalisation: the DP step must divide the noisy clipped sum by the EXPECTED batch size
  ``qN``, not by the realised ``|B_t|`` (nor ``sum(weight)``).  The realised size is
  data-dependent -- removing one example changes it -- so dividing by it would change the
  sensitivity analysis the accountant relies on; ``qN`` is a public constant.  (In tf_dpkit,
  pass ``expected_batch_size=qN`` to the DP optimizer.)

Virtual batches: with ``gradient_accumulation_steps=k`` (:func:`poisson_batches`,
:func:`poisson_batches_for_memory`) each Poisson batch -- the same batch, by the same rule -- is
emitted as ``k`` disjoint chunks for a DP optimizer that noises once per ``k`` chunks
(``tf_dpkit.optimizers.accumulation``).  ``k`` independent Poisson batches would NOT do: an
example drawn into two of them would count twice in one release.

One "epoch" of Poisson sampling is ``steps_per_epoch = ceil(N / (qN)) = ceil(1 / q)`` steps:
the number of steps whose expected batch sizes add up to at least ``N`` examples
(:attr:`PoissonSampling.steps_per_epoch`).  Examples are not visited exactly once per epoch;
each is seen ``Binomial(steps, q)`` times over ``steps`` steps.

Shuffle-and-batch
-----------------
:func:`shuffled_batches` is the usual pipeline: every epoch a fresh random permutation
(stateless, keyed by ``(seed, epoch)``) is cut into batches of ``batch_size``, so every
example appears exactly once per epoch (minus the ``N mod batch_size`` left over when
``drop_remainder=True``).  Its elements have the same structure as the Poisson pipeline's
(``(x, y, weight)`` for ``(x, y)``; see Data), weights all 1.  The Poisson-sampling epsilon
does NOT hold for it: batches are neither independent across steps nor do examples join
independently, so amplification by subsampling cannot be claimed.
``tf_dpkit.budget`` accounts it as the unsubsampled Gaussian mechanism once per epoch.

Data
----
``data`` (the same for :func:`poisson_batches`, :func:`shuffled_batches` and
:meth:`PoissonSampling.dataset`) is either

* **Arrays**: one array or tensor, or tuples and dicts of them nested as deep as needed
  (``tf.nest`` structures; a namedtuple counts as a tuple), every leaf dense and with the same
  first (example) dimension ``N >= 1``: ``(x, y)``, ``{"image": x, "label": y}``,
  ``({"image": x, "mask": m}, y)``, ``x``.  Lists are refused, since ``tf.data`` would stack a
  list into one tensor: use a tuple (``((x1, x2), y)``), or ``np.asarray`` for one array.  The
  arrays are converted to tensors once and captured by the dataset's map function; batches are
  gathered from them, so the pipeline holds one copy of the data in memory.
* **A finite** ``tf.data.Dataset`` **of single examples**: each element is ONE example, of any
  such structure (e.g. ``(x, y)`` or ``({"image": x}, y)``), every component a dense tensor of
  one fixed shape.  Poisson sampling needs random access to all ``N`` examples, so the dataset
  is read once, eagerly, when the pipeline is built, and its elements are stacked into
  in-memory tensors (one ``[N, ...]`` tensor per component); these are then sampled exactly as
  the same arrays would be (same seed, same batches).  Cost: memory for one full copy of the
  data set (two for a moment while a dataset of unknown cardinality, e.g. after ``filter``,
  is read in chunks and concatenated) and one pass over the dataset, so any random
  augmentation inside it runs once and is frozen.  Example ``i`` is the dataset's ``i``-th
  element: for reproducible batches from a fixed seed the dataset must iterate in a fixed
  order (privacy does not depend on the order, each index being included independently of all
  others).  Refused, with a ValueError or TypeError naming ``data``: infinite datasets
  (``.repeat()``; one whose cardinality TensorFlow cannot tell, e.g. ``.repeat().filter(f)``,
  would be read until memory runs out), empty ones, components that are not dense tensors
  (ragged, sparse, None), elements of different shapes, and elements whose spec has an unknown
  or ``None`` first dimension -- what ``.batch()`` produces: pass ``.unbatch()``.  (A batch
  of static size, from ``.batch(b, drop_remainder=True)``, cannot be told from an example:
  such a dataset would be sampled as a dataset of whole batches, so unbatch it first.)  A
  dataset cannot be read inside ``tf.function`` or a ``tf.compat.v1`` graph: pass it from
  eager code, or pass the arrays.

Element ``t`` is the structure gathered at the batch's indices (every leaf ``a`` becomes
``a[idx_t]``, nesting kept) plus the weight vector, arranged for Keras ``fit``, which reads a
tuple element as ``(x, y, sample_weight)``:

* a tuple ``(a, b, ...)`` gives ``(a_b, b_b, ..., weight)``: ``(x, y)`` gives
  ``(x_b, y_b, weight)``, and ``({"image": x}, y)`` gives ``({"image": x_b}, y_b, weight)``,
  the form for a functional model with named ``keras.Input`` layers and a compiled loss.
* a dict ``d`` gives ``(d_b, None, weight)``: Keras reads it as inputs ``x = d_b``, no targets
  and ``sample_weight = weight``.  Which keys are targets cannot be told from a dict, so a dict
  is taken as inputs only: this suits models that compute their loss from their inputs (an
  overridden ``compute_loss`` or ``train_step``; Keras matches a dict to a functional model's
  inputs by name only when its keys are exactly the input names, so such a model declares a
  ``keras.Input`` for every key).  A compiled loss needs targets (so do tf_dpkit's DP
  models): split them off yourself -- ``({"image": x}, y)``, or for a dataset
  ``data.map(lambda d: ({"image": d["image"]}, d["label"]))``.  (``(d_b, weight)`` would make
  Keras read the weights as the targets.)
* one array ``x`` gives ``(x_b, weight)``, as in earlier versions (beware: Keras ``fit`` reads
  a 2-tuple as ``(x, y)``).
"""
from __future__ import annotations

import dataclasses
import fractions
import math
import re
import secrets

import numpy as np
import tensorflow as tf

from analysis import _checks, _secrecy
from tf_dpkit import distribute
from tf_dpkit import noise as noise_lib

# Second seed words, so the Poisson and the shuffle pipelines draw unrelated streams even when
# given the same seed.
_POISSON_STREAM = 0x504F4953  # "POIS"
_SHUFFLE_STREAM = 0x53485546  # "SHUF"
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_ALG = "philox"  # pinned, so batches do not depend on the device "auto_select" would pick
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


def _as_structure(data):
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


def _seed_pair(seed: noise_lib.SecretInt, stream: int) -> tf.Tensor:
  """``[seed, stream]`` as an int64 seed; the seed enters the graph as no constant."""
  return tf.stack([seed.tensor(), tf.constant(stream, tf.int64)])


def _gather(structure, indices, weights):
  """The batch ``indices`` of ``structure``, as the element structure of the module doc."""
  batch = tf.nest.map_structure(lambda t: tf.gather(t, indices), structure)
  if isinstance(structure, tuple):
    return tuple(batch) + (weights,)  # (x_b, y_b, ..., weight)
  if isinstance(structure, dict):
    return batch, None, weights  # Keras: x = the dict, no y, sample_weight = weight
  return batch, weights  # one array


def _ceil_ratio(numerator: float, denominator: float) -> int:
  """``ceil(numerator / denominator)``, forgiving float round-off of ~1e-9 relative."""
  ratio = numerator / denominator
  nearest = round(ratio)
  if abs(ratio - nearest) <= 1e-9 * max(1.0, ratio):
    return int(nearest)
  return math.ceil(ratio)


class _Passes:
  """Counts the passes over one pipeline, so that every pass draws fresh batches.

  A ``tf.data`` pipeline is re-iterated whenever Keras starts an epoch without
  ``steps_per_epoch``, a second ``fit`` or a custom loop iterates it again, or ``repeat`` /
  ``concatenate`` reads it twice.  Batch ``t`` is a pure function of ``(seed, t)``, so a pass
  that restarted ``t`` at 0 would replay the very same batches, and each replayed batch would
  be released again under a ledger that counts it as a fresh Poisson sample.  Instead pass
  ``p`` (0 for the first) draws the batches of global steps ``p * count ... (p + 1) * count -
  1``: every step of every pass is a fresh, independent draw, exactly what the ledger counts.
  The first pass is the batches ``0 ... count - 1`` the pipeline always had.
  """

  def __init__(self):
    with tf.init_scope():
      self._eager = tf.executing_eagerly()
      if self._eager:
        with tf.device("/cpu:0"):
          self._counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="dp_passes")
      else:  # a tf.compat.v1 graph: a one-shot iterator cannot capture a variable
        self._passes = 0

  def _next_pass(self, _):
    if self._eager:
      return self._counter.assign_add(1) - 1

    def advance():
      self._passes += 1
      return np.int64(self._passes - 1)
    value = tf.compat.v1.py_func(advance, [], tf.int64, stateful=True, name="dp_passes")
    value.set_shape([])
    return value

  def indices(self, count: int) -> tf.data.Dataset:
    """``count`` consecutive int64 indices; pass ``p`` gives ``p * count ... (p + 1) * count - 1``."""
    count = tf.constant(count, tf.int64)
    return tf.data.Dataset.range(1).map(self._next_pass).flat_map(
        lambda p: tf.data.Dataset.range(p * count, (p + 1) * count)).apply(
            tf.data.experimental.assert_cardinality(count))


def _indices_and_weights(selected):
  """``(indices, weights)`` of the ``True`` entries of ``selected`` (module doc): ascending
  int64 indices and float32 weights of ones; an empty selection gives index 0 with weight 0."""
  chosen = tf.where(selected)[:, 0]
  count = tf.size(chosen, out_type=tf.int64)
  size = tf.maximum(count, 1)
  indices = tf.concat([chosen, tf.zeros([1], tf.int64)], axis=0)[:size]
  weights = tf.cast(tf.range(size) < count, tf.float32)
  return indices, weights


@_secrecy.refuse_pickling("its secret sampling seed", copies=False)
@dataclasses.dataclass(frozen=True)
class PoissonSampling:
  """Poisson sampling of ``num_examples`` examples with probability ``sampling_probability``.

  Attributes:
    num_examples: ``N >= 1``, the number of training examples.
    sampling_probability: ``q`` in ``(0, 1]``, each example's probability of joining each batch.
    steps: number of batches (training steps), a positive integer.
    seed: integer in ``[-2**63, 2**63 - 1]``; with ``steps`` it fixes every batch.  Keep it
      secret (see the module doc); hidden from ``repr``.

  Build from an expected batch size with :meth:`from_expected_batch_size`.  Derived values:
  :attr:`expected_batch_size` ``= qN`` (examples, a float), :attr:`steps_per_epoch`
  ``= ceil(1/q)``, :attr:`realised_sampling_probability` ``= floor(q 2^64) / 2^64 <= q``.
  """
  num_examples: int
  sampling_probability: float
  steps: int
  seed: int = dataclasses.field(repr=False)

  def __post_init__(self):
    n = _checks.check_integer("num_examples", self.num_examples, minimum=1)
    q = _checks.check_probability("sampling_probability", self.sampling_probability,
                                  allow_zero=False)
    steps = _checks.check_integer("steps", self.steps, minimum=1)
    seed = _checks.check_integer("seed", self.seed, minimum=_INT64_MIN, maximum=_INT64_MAX)
    object.__setattr__(self, "num_examples", n)
    object.__setattr__(self, "sampling_probability", q)
    object.__setattr__(self, "steps", steps)
    object.__setattr__(self, "seed", seed)
    object.__setattr__(self, "_secret_seed", noise_lib.SecretInt(seed).prepare())

  @classmethod
  def from_expected_batch_size(cls, num_examples: int, expected_batch_size: float, *, steps: int,
                               seed: int) -> PoissonSampling:
    """Sampling with ``q = expected_batch_size / num_examples``; needs ``0 < expected <= N``."""
    n = _checks.check_integer("num_examples", num_examples, minimum=1)
    b = _checks.check_real("expected_batch_size", expected_batch_size, allow_nan=True)
    if not 0.0 < b <= n:
      raise ValueError(f"expected_batch_size must be in (0, num_examples] = (0, {n}], got {b}.")
    return cls(n, min(1.0, b / n), steps, seed)

  @property
  def expected_batch_size(self) -> float:
    """``qN``: the mean batch size (examples); the DP step's normaliser."""
    return self.sampling_probability * self.num_examples

  @property
  def steps_per_epoch(self) -> int:
    """``ceil(N / (qN)) = ceil(1/q)``: steps whose expected batch sizes add up to >= N."""
    return _ceil_ratio(1.0, self.sampling_probability)

  @property
  def inclusion_threshold(self) -> int:
    """``floor(q * 2**64)`` (exact), or ``2**64`` for ``q = 1``: include iff ``u < threshold``."""
    return math.floor(fractions.Fraction(self.sampling_probability) * 2**64)

  @property
  def realised_sampling_probability(self) -> float:
    """``floor(q * 2**64) / 2**64``, the exact inclusion probability; ``q - 2**-64 < it <= q``."""
    return float(fractions.Fraction(self.inclusion_threshold, 2**64))

  def batch_indices(self, step) -> tuple[tf.Tensor, tf.Tensor]:
    """Returns ``(indices, weights)`` of batch ``step`` (an int or int64 scalar tensor).

    ``indices``: int64 ``[b]``, the selected example indices in ascending order;
    ``weights``: float32 ``[b]``, all 1.  For an empty draw ``b = 1``, ``indices = [0]`` and
    ``weights = [0.]``.  Works eagerly, in ``tf.function`` and in ``tf.data`` map functions.
    """
    return _indices_and_weights(self.selected(step))

  def selected(self, step, stream: int = 0) -> tf.Tensor:
    """The inclusion mask of batch ``step``: bool ``[N]``, ``True`` for the chosen examples.

    Example ``i`` is chosen iff its uniform 64-bit draw is below :attr:`inclusion_threshold`;
    the draws are keyed by ``(seed, stream, step)``.  ``stream`` (an int in [0, 2**31)) tells
    apart independent samplers sharing one seed (the workers of
    :func:`distributed_poisson_batches` that each sample their own shard); 0 is the stream of
    :meth:`batch_indices`.
    """
    step = tf.cast(step, tf.int64)
    n = self.num_examples
    if self.inclusion_threshold >= 2**64:  # q == 1: everyone, every step
      return tf.ones([n], tf.bool)
    seed = _seed_pair(self._secret_seed, _POISSON_STREAM)
    if stream:
      seed = tf.random.experimental.stateless_fold_in(seed, stream, alg=_ALG)
    step_seed = tf.random.experimental.stateless_fold_in(seed, step, alg=_ALG)
    draws = tf.random.stateless_uniform([n], seed=step_seed, minval=None, maxval=None,
                                        dtype=tf.uint64, alg=_ALG)
    return draws < tf.constant(self.inclusion_threshold, tf.uint64)

  def dataset(self, data) -> tf.data.Dataset:
    """The ``tf.data.Dataset`` of :attr:`steps` Poisson batches of ``data`` (see module doc).

    ``data``: as for :func:`poisson_batches` (arrays in a tuple/dict structure, one array, or a
    finite ``tf.data.Dataset`` of single examples, read into memory once).  Element ``t``:
    ``(x[idx_t], y[idx_t], weight_t)`` for ``data = (x, y)``, with
    ``idx_t, weight_t = self.batch_indices(t)``; ``(d[idx_t], None, weight_t)`` for a dict
    ``d``; ``(x[idx_t], weight_t)`` for one array (module doc, "Data").  Batch dimension
    ``None`` in ``element_spec``.

    Raises:
      ValueError: ``data``'s number of examples is not :attr:`num_examples`, or ``data`` is
        malformed (see :func:`poisson_batches`).
      TypeError: ``data`` is not an accepted structure (see :func:`poisson_batches`).
    """
    structure, n = _as_structure(data)
    if n != self.num_examples:
      raise ValueError(f"data has {n} examples (first dimension) but this PoissonSampling has "
                       f"num_examples={self.num_examples}.")
    return self._dataset(structure)

  def _dataset(self, structure, accumulation_steps: int = 1) -> tf.data.Dataset:
    if accumulation_steps == 1:
      def element(step):
        indices, weights = self.batch_indices(step)
        return _gather(structure, indices, weights)

      dataset = _Passes().indices(self.steps).map(
          element, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    else:
      dataset = _split_logical_batches(
          _Passes().indices(self.steps).map(
              lambda step: tf.where(self.selected(step))[:, 0],
              num_parallel_calls=tf.data.AUTOTUNE, deterministic=True),
          structure, accumulation_steps)
    return _tagged(dataset, Pipeline("poisson", self.num_examples, self.expected_batch_size,
                                     self.steps_per_epoch, self.sampling_probability,
                                     accumulation_steps=accumulation_steps))


def secret_seed() -> int:
  """A sampling seed from the OS entropy source: a uniform integer in ``[0, 2**63)``."""
  return secrets.randbelow(2**63)


def poisson_batches(data, *, sampling_probability: float | None = None,
                    expected_batch_size: float | None = None, steps: int,
                    seed: int | None = None,
                    gradient_accumulation_steps: int | None = None) -> tf.data.Dataset:
  """A ``tf.data.Dataset`` of ``steps`` Poisson-sampled batches of ``data``.

  Each batch includes every example independently with probability ``q`` (see module doc for
  the exact construction and why it matches the accountants' assumption).

  Args:
    data: the training examples (module doc, "Data"): arrays/tensors with equal first
      dimension ``N >= 1``, as one array or nested in tuples and dicts (``(x, y)``,
      ``{"image": x, "label": y}``, ``({"image": x}, y)``); or a finite ``tf.data.Dataset``
      whose elements are single examples of such a structure, each component of one fixed
      shape -- read into memory once (one copy of the data set) and then sampled as arrays.
    sampling_probability: ``q`` in ``(0, 1]``.  Give exactly one of this and
      ``expected_batch_size``.
    expected_batch_size: ``qN`` in ``(0, N]`` (examples); sets ``q = expected_batch_size / N``.
    steps: number of batches, a positive integer (e.g. ``epochs * steps_per_epoch``).
    seed: ``None`` (default: a secret seed from :func:`secret_seed`) or an integer in
      ``[-2**63, 2**63 - 1]``; batch ``t`` depends only on ``(seed, t)``.  A seed that others
      know reveals every batch and voids the subsampling amplification the accounted epsilon
      relies on: fix it only for tests and reproducible experiments.
    gradient_accumulation_steps: None or 1 (default: one element per batch), or k >= 2:
      virtual batches (``tf_dpkit.optimizers.accumulation``).  Each Poisson batch ``B_t``
      (the same batch as without k, for the same seed) is emitted as k consecutive chunks,
      chunk ``j`` holding the examples at positions ``[floor(j|B|/k), floor((j+1)|B|/k))`` of
      ``B_t``'s ascending indices (sizes ``floor`` or ``ceil`` of ``|B|/k``; an empty chunk is
      one example of weight 0).  The chunks are disjoint and their union is ``B_t``: train
      with a DP optimizer built with the same ``gradient_accumulation_steps`` and
      ``expected_batch_size = qN`` (the logical batch's), which noises once per ``B_t``.
      ``steps`` still counts logical batches; the dataset has ``k * steps`` elements.

  Returns:
    A dataset of ``steps`` elements (``k * steps`` chunks with accumulation): ``(x_b, y_b, weight)`` for ``data = (x, y)`` (in general
    a tuple's gathered components then ``weight``, e.g. ``({"image": x_b}, y_b, weight)`` for
    ``({"image": x}, y)``); ``(d_b, None, weight)`` for a dict ``d`` (inputs only, see the
    module doc); ``(x_b, weight)`` for one array.  A dataset ``data`` gives what its element
    structure would give as arrays.  ``x_b = x[idx]``, ``y_b = y[idx]`` for the selected
    indices ``idx`` in ascending order (every leaf gathered, nesting kept), ``weight`` float32
    ``[b]`` of ones; batch size ``b ~ Binomial(N, q)``, variable, with ``None`` batch dimension
    in ``element_spec``.  An empty draw is emitted as ``b = 1``: example 0 with weight 0.0.
    Train with the per-example loss multiplied by ``weight`` and normalise the noisy sum by
    ``qN`` (the expected batch size).

  Raises:
    ValueError: both or neither of ``sampling_probability`` / ``expected_batch_size``;
      ``q`` not in ``(0, 1]``; ``expected_batch_size`` not in ``(0, N]``; ``steps`` not a
      positive integer; ``seed`` not an int64 integer; arrays with different or no first
      dimensions, or no examples; a dataset that is infinite, empty, batched-looking or with
      elements of different shapes.
    TypeError: ``data`` holds a list, ``None``, a ragged or sparse tensor, or something not
      convertible to a tensor (for a dataset: a component that is not a dense tensor).
  """
  _check_one_rate(sampling_probability, expected_batch_size)
  chunks = _accumulation_steps(gradient_accumulation_steps)
  structure, n = _as_structure(data)
  sampling = _sampling(n, sampling_probability, expected_batch_size, steps, seed)
  return sampling._dataset(structure, chunks)  # pylint: disable=protected-access


def accumulation_steps_for_memory(num_examples: int, expected_batch_size: float,
                                  max_physical_batch_size: int,
                                  overflow_probability: float = 1e-6) -> int:
  """The smallest k such that a Poisson batch split into k chunks overflows ``P`` rarely.

  With ``|B| ~ Binomial(N, q)``, ``q = expected_batch_size / N``, the chunks of
  ``poisson_batches(..., gradient_accumulation_steps=k)`` have at most ``ceil(|B| / k)``
  examples, which exceeds ``P = max_physical_batch_size`` iff ``|B| > kP``.  Returns the
  smallest integer ``k >= 1`` with ``P(|B| > kP) <= overflow_probability`` (exact binomial
  tail, computed in log space).  The bound concerns memory only: privacy holds for any k.

  Args:
    num_examples: N, an integer >= 1.
    expected_batch_size: qN in (0, N].
    max_physical_batch_size: P, an integer >= 1 (examples per physical chunk).
    overflow_probability: in (0, 1).
  """
  n = _checks.check_integer("num_examples", num_examples, minimum=1)
  b = _checks.check_finite_positive("expected_batch_size", expected_batch_size)
  if b > n:
    raise ValueError(f"expected_batch_size must be in (0, num_examples] = (0, {n}], got {b}.")
  p = _checks.check_integer("max_physical_batch_size", max_physical_batch_size, minimum=1)
  bound = _checks.check_probability("overflow_probability", overflow_probability,
                                    allow_zero=False)
  if bound >= 1:
    raise ValueError(f"overflow_probability must be in (0, 1), got {overflow_probability!r}.")
  q = b / n
  if q >= 1.0:
    return -(-n // p)

  def log_pmf(j):
    return (math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1)
            + j * math.log(q) + (n - j) * math.log1p(-q))

  def tail_above(m):  # P(|B| > m)
    if m >= n:
      return 0.0
    logs = [log_pmf(j) for j in range(m + 1, n + 1)]
    top = max(logs)
    return math.exp(top) * math.fsum(math.exp(v - top) for v in logs)

  k = max(1, math.floor(b / p))
  while tail_above(k * p) > bound:
    k += 1
  return k


def poisson_batches_for_memory(data, *, max_physical_batch_size: int,
                               sampling_probability: float | None = None,
                               expected_batch_size: float | None = None, steps: int,
                               seed: int | None = None, overflow_probability: float = 1e-6):
  """Poisson batches split to fit memory (Opacus' ``BatchMemoryManager``): ``(dataset, k)``.

  ``k = accumulation_steps_for_memory(N, qN, max_physical_batch_size, overflow_probability)``
  and ``dataset = poisson_batches(data, ..., gradient_accumulation_steps=k)``: every logical
  Poisson batch (rate ``q``, the accounted one) in ``k`` disjoint chunks, each of at most
  ``max_physical_batch_size`` examples except with probability ``overflow_probability`` per
  step (then ``ceil(|B| / k)``: the mechanism never changes, only the memory use).  Build the
  DP optimizer with ``gradient_accumulation_steps=k`` and ``expected_batch_size=qN``, and run
  ``k * steps`` micro-steps.  Arguments and errors as for :func:`poisson_batches` and
  :func:`accumulation_steps_for_memory`.
  """
  _check_one_rate(sampling_probability, expected_batch_size)
  structure, n = _as_structure(data)
  sampling = _sampling(n, sampling_probability, expected_batch_size, steps, seed)
  k = accumulation_steps_for_memory(n, sampling.expected_batch_size, max_physical_batch_size,
                                    overflow_probability)
  return sampling._dataset(structure, k), k  # pylint: disable=protected-access


def _accumulation_steps(value) -> int:
  """``gradient_accumulation_steps`` of a pipeline: None or 1 -> 1, else an integer >= 2."""
  if value is None:
    return 1
  return _checks.check_integer("gradient_accumulation_steps", value, minimum=1)


def _split_logical_batches(batches: tf.data.Dataset, structure, chunks: int) -> tf.data.Dataset:
  """Each element of ``batches`` (int64 example indices of one logical batch, possibly none)
  becomes ``chunks`` elements: balanced consecutive slices ``[floor(j n / k), floor((j+1) n /
  k))``, an empty slice as example 0 with weight 0 (module doc)."""
  k = tf.constant(chunks, tf.int64)

  def split(chosen):
    size = tf.size(chosen, out_type=tf.int64)

    def chunk(j):
      part = chosen[(j * size) // k:((j + 1) * size) // k]
      count = tf.size(part, out_type=tf.int64)
      padded = tf.maximum(count, 1)
      indices = tf.concat([part, tf.zeros([1], tf.int64)], axis=0)[:padded]
      weights = tf.cast(tf.range(padded) < count, tf.float32)
      return _gather(structure, indices, weights)

    return tf.data.Dataset.range(chunks).map(chunk)

  return batches.flat_map(split)


def _check_one_rate(sampling_probability, expected_batch_size) -> None:
  if (sampling_probability is None) == (expected_batch_size is None):
    raise ValueError("Give exactly one of sampling_probability (q in (0, 1]) and "
                     "expected_batch_size (qN in (0, N]); got "
                     f"sampling_probability={sampling_probability!r}, "
                     f"expected_batch_size={expected_batch_size!r}.")


def _sampling(n, sampling_probability, expected_batch_size, steps, seed) -> PoissonSampling:
  """The :class:`PoissonSampling` of ``n`` examples at the one rate given (secret seed if None)."""
  if seed is None:
    seed = secret_seed()
  if expected_batch_size is not None:
    return PoissonSampling.from_expected_batch_size(n, expected_batch_size, steps=steps,
                                                    seed=seed)
  return PoissonSampling(n, sampling_probability, steps, seed)


def distributed_poisson_batches(strategy, data, *, sampling_probability: float | None = None,
                                expected_batch_size: float | None = None, steps: int,
                                seed: int | None = None, num_examples: int | None = None):
  """Poisson batches for ``R`` replicas of a ``tf.distribute`` strategy, on any number of workers.

  Every example joins the global batch of step ``t`` independently with probability ``q``,
  exactly as in :func:`poisson_batches`, and each replica receives its own part of it:

  * The ``N`` examples are split into ``R`` disjoint shards by a public rule that does not look
    at the data: replica ``r`` (``r = worker * L + local``, ``L`` replicas per worker) owns
    the examples at positions ``i`` with ``i mod R = r`` (``num_examples=None``), or, when each
    worker holds only its own shard of the data set (``num_examples`` given), worker ``w``'s
    ``L`` replicas split that shard by ``i mod L``.
  * At every step each replica's part is the subset of its shard whose draws are below
    ``floor(q 2^64)``.  Each example is decided by exactly one independent Bernoulli(q) draw,
    so the union over replicas and workers -- the global batch the DP step clips, sums and
    noises once -- is a Poisson sample of the whole data set with rate ``q``, expected size
    ``qN``.  The accountant therefore analyses it exactly as one device's Poisson batches:
    the global step is one Poisson-subsampled Gaussian release, counted once.
  * With one data set on every worker (``num_examples=None``) and a shared integer ``seed``,
    all workers draw the same mask, so the global batch of step ``t`` of pass ``p`` is exactly
    ``poisson_batches(data, ..., seed=seed)``'s batch ``t`` of the same pass (every pass draws
    fresh batches, see the module doc; ``fit`` under a strategy may start at a later pass than
    a single-device ``fit``, since ``tf.distribute`` can open an iterator first).  With ``seed=None`` every worker
    draws its own secret seed; the union is still a Poisson sample, since each example is
    drawn by one worker only.  With per-worker shards, worker ``w``'s draws use stream ``w + 1``
    of the seed, so shards never share draws.
  * A replica whose part is empty receives one example (its shard's first, or example 0) with
    weight 0, whose clipped gradient is exactly 0 (module doc): the released sum is unchanged.

  Normalise by the global expected batch size ``qN`` (the DP optimizer's
  ``expected_batch_size``); tf_dpkit's optimizers then add noise once per global step
  (:mod:`tf_dpkit.distribute`).  Pass the result to ``model.fit`` (``steps_per_epoch`` as for
  :func:`poisson_batches`) or iterate it in a custom loop with ``strategy.run``.

  Args:
    strategy: the ``tf.distribute`` strategy that will train (any supported one, one replica
      included); its ``distribute_datasets_from_function`` is used.
    data: as for :func:`poisson_batches`: the whole training set (the same examples, in the
      same order, on every worker), or with ``num_examples`` this worker's disjoint shard.
    sampling_probability: ``q`` in ``(0, 1]``; or give ``expected_batch_size`` ``qN`` in
      ``(0, N]`` (examples), exactly one of the two.
    steps: global steps, a positive integer.
    seed: ``None`` (a secret seed) or an int64 integer, for tests and reproducible runs only.
    num_examples: ``None`` when ``data`` is the whole data set; else ``N``, the size of the
      whole data set (an integer >= this worker's shard), when ``data`` is this worker's
      shard -- the shards of all workers must be disjoint and together make up the data set.

  Returns:
    A ``tf.distribute.DistributedDataset`` of ``steps`` global batches; each replica's element
    is ``(x_r, y_r, weight_r)`` for ``data = (x, y)`` (structures as in :func:`poisson_batches`),
    with a ``None`` batch dimension.

  Raises:
    ValueError: as :func:`poisson_batches`; ``num_examples`` smaller than the shard; a
      strategy whose replicas are not spread evenly over its workers.
    NotImplementedError: a strategy DP-SGD does not support (:mod:`tf_dpkit.distribute`).
  """
  distribute.check_strategy(strategy, "distributed_poisson_batches")
  _check_one_rate(sampling_probability, expected_batch_size)
  structure, local_n = _as_structure(data)
  sharded = num_examples is not None
  n = _checks.check_integer("num_examples", num_examples, minimum=local_n) if sharded else local_n
  whole = _sampling(n, sampling_probability, expected_batch_size, steps, seed)
  # The draws over the examples this worker holds: all N, or its shard.
  local = dataclasses.replace(whole, num_examples=local_n) if sharded else whole
  replicas = int(strategy.num_replicas_in_sync)
  passes = _Passes()  # each worker process counts its own passes (all iterate in step)

  def dataset_fn(context):
    pipelines = int(context.num_input_pipelines)
    if replicas % pipelines:
      raise ValueError(f"strategy: {replicas} replicas cannot be spread evenly over "
                       f"{pipelines} workers.")
    per_worker = replicas // pipelines
    worker = int(context.input_pipeline_id)
    if sharded:
      stream, first, stride = worker + 1, 0, per_worker
    else:
      stream, first, stride = 0, worker * per_worker, replicas
    positions = tf.range(local_n, dtype=tf.int64)

    def element(k):
      step, part = k // per_worker, k % per_worker
      mine = tf.equal(positions % stride, first + part)
      indices, weights = _indices_and_weights(
          tf.logical_and(local.selected(step, stream), mine))
      return _gather(structure, indices, weights)

    return passes.indices(whole.steps * per_worker).map(
        element, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)

  distributed = strategy.distribute_datasets_from_function(dataset_fn)
  return _tagged(distributed, Pipeline("poisson", n, whole.expected_batch_size,
                                       whole.steps_per_epoch, whole.sampling_probability,
                                       replicas=replicas))


def shuffled_batches(data, batch_size: int, epochs: int, seed: int | None = None,
                     drop_remainder: bool = True,
                     gradient_accumulation_steps: int | None = None) -> tf.data.Dataset:
  """Shuffle-and-batch: each epoch, a fresh permutation of ``data`` cut into batches.

  WARNING: the Poisson-sampling epsilon does NOT hold for this pipeline.  Examples do not join
  batches independently with probability ``q`` (each sits in exactly one batch per epoch), so
  no privacy amplification by subsampling may be claimed; account it as the unsubsampled
  Gaussian mechanism once per epoch (``sampling="shuffle"`` in ``tf_dpkit.budget``).

  Args:
    data: the training examples (module doc, "Data"): arrays/tensors with equal first
      dimension ``N >= 1``, as one array or nested in tuples and dicts (``(x, y)``,
      ``{"image": x, "label": y}``, ``({"image": x}, y)``); or a finite ``tf.data.Dataset``
      whose elements are single examples of such a structure, each component of one fixed
      shape -- read into memory once (one copy of the data set) and then sampled as arrays.
    batch_size: examples per batch, an integer in ``[1, N]``.
    epochs: number of passes, a positive integer.
    seed: ``None`` (default: a secret seed from :func:`secret_seed`) or an integer in
      ``[-2**63, 2**63 - 1]``; epoch ``e``'s permutation depends only on ``(seed, e)``.
    drop_remainder: drop the last ``N mod batch_size`` examples of each epoch's permutation
      (a different random subset each epoch), giving ``N // batch_size`` full batches per epoch
      and a static batch dimension; if False, ``ceil(N / batch_size)`` batches per epoch, the
      last one smaller, and batch dimension ``None``.
    gradient_accumulation_steps: None or 1, or k >= 2: every batch of ``batch_size`` (the
      logical batch) is emitted as k consecutive chunks of sizes ``floor`` or ``ceil`` of
      ``batch_size / k`` (split as in :func:`poisson_batches`), for a DP optimizer with the
      same ``gradient_accumulation_steps``.  Needs ``drop_remainder=True`` and ``batch_size
      >= k`` (no chunk is empty, so the optimizer's microbatch count is ``batch_size``).

  Returns:
    A dataset of ``epochs * batches_per_epoch`` elements ``(x_b, y_b, weight)`` for ``(x, y)``
    (``(d_b, None, weight)`` for a dict, ``(x_b, weight)`` for one array), ``weight`` float32
    ``[b]`` of ones -- the same structure as :func:`poisson_batches`, so training code can
    consume either.

  Raises:
    ValueError: ``batch_size`` not in ``[1, N]``, ``epochs`` not a positive integer, ``seed``
      not an int64 integer, or ``data`` malformed (as for :func:`poisson_batches`).
    TypeError: ``data`` not an accepted structure (as for :func:`poisson_batches`).
  """
  chunks = _accumulation_steps(gradient_accumulation_steps)
  structure, n = _as_structure(data)
  batch_size = _checks.check_integer("batch_size", batch_size, minimum=1, maximum=n)
  epochs = _checks.check_integer("epochs", epochs, minimum=1)
  if chunks > 1 and (not drop_remainder or batch_size < chunks):
    raise ValueError(
        f"gradient_accumulation_steps={chunks} needs drop_remainder=True and batch_size >= "
        f"{chunks} (every chunk non-empty), got batch_size={batch_size}, "
        f"drop_remainder={drop_remainder!r}.")
  seed = _checks.check_integer("seed", secret_seed() if seed is None else seed,
                               minimum=_INT64_MIN, maximum=_INT64_MAX)
  base_seed = _seed_pair(noise_lib.SecretInt(seed).prepare(), _SHUFFLE_STREAM)

  def epoch_batches(epoch):
    epoch_seed = tf.random.experimental.stateless_fold_in(base_seed, epoch, alg=_ALG)
    order = tf.random.experimental.stateless_shuffle(
        tf.range(n, dtype=tf.int64), seed=epoch_seed, alg=_ALG)
    return tf.data.Dataset.from_tensor_slices(order).batch(batch_size,
                                                           drop_remainder=drop_remainder)

  def element(indices):
    return _gather(structure, indices, tf.ones(tf.shape(indices), tf.float32))

  batches = tf.data.Dataset.range(epochs).flat_map(epoch_batches)
  if chunks == 1:
    dataset = batches.map(element, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  else:
    dataset = _split_logical_batches(batches, structure, chunks)
  per_epoch = n // batch_size if drop_remainder else -(-n // batch_size)
  return _tagged(dataset, Pipeline("shuffle", n, batch_size, per_epoch,
                                   accumulation_steps=chunks))


@dataclasses.dataclass(frozen=True)
class Pipeline:
  """What a dataset made here is, for the privacy checks of ``tf_dpkit.budget``.

  ``sampling`` is ``"poisson"`` or ``"shuffle"``; ``num_examples`` N; ``batch_size`` the
  expected (Poisson: qN) or fixed batch size; ``steps_per_epoch``; ``sampling_probability`` q
  for Poisson (None for shuffle); ``replicas``: the number of replicas a
  :func:`distributed_poisson_batches` dataset feeds (1 for the others, which feed one replica
  or are split by ``tf.distribute``); ``accumulation_steps``: k, the chunks each logical batch
  is emitted as (``gradient_accumulation_steps``; ``batch_size`` and ``steps_per_epoch`` are
  those of the logical batches).  Read it with :func:`pipeline_of`.
  """
  sampling: str
  num_examples: int
  batch_size: float
  steps_per_epoch: int
  sampling_probability: float | None = None
  replicas: int = 1
  accumulation_steps: int = 1


def _tagged(dataset: tf.data.Dataset, pipeline: Pipeline) -> tf.data.Dataset:
  dataset._tf_dpkit_pipeline = pipeline  # pylint: disable=protected-access
  return dataset


#: Transformations of a pipeline's dataset that keep what it is: each element is still one
#: fresh batch of the pipeline (or the element mapped on its own), in some order, possibly fewer
#: of them.  ``repeat`` qualifies because every pass draws fresh batches (:class:`_Passes`).
_KEEPING = frozenset(["PrefetchDataset", "TakeDataset", "SkipDataset", "RepeatDataset",
                      "ShuffleDataset", "MapDataset", "ParallelMapDataset", "OptionsDataset",
                      "AssertCardinalityDataset", "ModelDataset", "MaxIntraOpParallelismDataset",
                      "PrivateThreadPoolDataset"])


def _inputs(dataset) -> list:
  inputs = getattr(dataset, "_inputs", None)
  try:
    return list(inputs()) if callable(inputs) else []
  except (NotImplementedError, TypeError, AttributeError):
    return []


def _tagged_ancestor(dataset, seen: set):
  """``(pipeline, path)`` of the nearest tagged dataset ``dataset`` is derived from, where
  ``path`` lists the transformations in between (outermost first); ``(None, [])`` if none."""
  if id(dataset) in seen:
    return None, []
  seen.add(id(dataset))
  tag = getattr(dataset, "_tf_dpkit_pipeline", None)
  if tag is not None:
    return tag, []
  for parent in _inputs(dataset):
    tag, path = _tagged_ancestor(parent, seen)
    if tag is not None:
      return tag, [type(dataset).__name__.lstrip("_")] + path
  return None, []


def pipeline_of(dataset) -> Pipeline | None:
  """The :class:`Pipeline` a dataset is, or None when it comes from no tf_dpkit pipeline.

  A dataset returned by :func:`poisson_batches` / :func:`shuffled_batches` /
  :func:`distributed_poisson_batches` carries its :class:`Pipeline`.  A dataset derived from one
  keeps it through transformations that emit each element as one fresh batch of the pipeline
  (``prefetch``, ``take``, ``skip``, ``repeat``, ``shuffle``, an element-wise ``map``,
  ``with_options``); any other transformation between them is refused, since it can replay
  batches (``cache``, ``snapshot``: each replayed batch would be released again while the ledger
  counts a fresh sample), select steps by their content (``filter``, ``ignore_errors``) or
  re-cut the batches (``batch``, ``unbatch``, ``rebatch``, ``concatenate``, ``zip``), all of
  which change the mechanism the ledger accounts.

  Raises:
    ValueError: ``dataset`` derives from a tf_dpkit pipeline through such a transformation.
  """
  tag, path = _tagged_ancestor(dataset, set())
  bad = [name for name in path if name not in _KEEPING]
  if bad:
    raise ValueError(
        f"x: this dataset is a tf_dpkit {tag.sampling} pipeline transformed by {bad[0]} "
        f"(transformations from the pipeline outwards: {list(reversed(path))}). {bad[0]} can "
        "replay batches (cache, snapshot), choose steps by their content (filter, "
        "ignore_errors) or re-cut them (batch, unbatch, concatenate, zip), so the accounted "
        "mechanism would not be the one that ran. Only prefetch, take, skip, repeat, shuffle, "
        "element-wise map and with_options are allowed; every pass over the pipeline draws "
        "fresh batches, so no cache is needed.")
  return tag


__all__ = ["Pipeline", "PoissonSampling", "accumulation_steps_for_memory", "check_class_labels",
           "check_finite_features", "pipeline_of", "poisson_batches", "poisson_batches_for_memory",
           "secret_seed", "shuffled_batches"]
