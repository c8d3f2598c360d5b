"""Poisson sampling, the batches the RDP and PLD accountants assume: :class:`PoissonSampling`
and :func:`poisson_batches` (``docs/design/data_pipelines.md``, "Poisson sampling").  Users
import these names from ``tf_dpkit.data`` or ``tf_dpkit.data.poisson``.
"""
from __future__ import annotations

import dataclasses
import fractions
import math

import tensorflow as tf

from analysis import _checks, _secrecy
from tf_dpkit import noise as noise_lib
from tf_dpkit.data._batching import (ALG, INT64_MAX, INT64_MIN, POISSON_STREAM, Passes,
                                     accumulation_steps, indices_and_weights, secret_seed,
                                     seed_pair, split_logical_batches)
from tf_dpkit.data._structure import as_structure, gather
from tf_dpkit.data.pipelines import Pipeline, tagged


def _ceil_ratio(numerator: float, denominator: float) -> int:
  """``ceil(numerator / denominator)``, forgiving float round-off of ~1e-9 relative."""
  ratio = numerator / denominator
  nearest = round(ratio)
  if abs(ratio - nearest) <= 1e-9 * max(1.0, ratio):
    return int(nearest)
  return math.ceil(ratio)


@_secrecy.refuse_pickling("its secret sampling seed", copies=False)
@dataclasses.dataclass(frozen=True)
class PoissonSampling:
  """Poisson sampling of ``num_examples`` examples with probability ``sampling_probability``.

  Attributes:
    num_examples: ``N >= 1``, the number of training examples.
    sampling_probability: ``q`` in ``(0, 1]``, each example's probability of joining each batch.
    steps: number of batches (training steps), a positive integer.
    seed: integer in ``[-2**63, 2**63 - 1]``; with ``steps`` it fixes every batch.  Keep it
      secret (docs/design/data_pipelines.md); hidden from ``repr``.

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
    seed = _checks.check_integer("seed", self.seed, minimum=INT64_MIN, maximum=INT64_MAX)
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
    return indices_and_weights(self.selected(step))

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
    seed = seed_pair(self._secret_seed, POISSON_STREAM)
    if stream:
      seed = tf.random.experimental.stateless_fold_in(seed, stream, alg=ALG)
    step_seed = tf.random.experimental.stateless_fold_in(seed, step, alg=ALG)
    draws = tf.random.stateless_uniform([n], seed=step_seed, minval=None, maxval=None,
                                        dtype=tf.uint64, alg=ALG)
    return draws < tf.constant(self.inclusion_threshold, tf.uint64)

  def dataset(self, data) -> tf.data.Dataset:
    """The ``tf.data.Dataset`` of :attr:`steps` Poisson batches of ``data``.

    ``data``: as for :func:`poisson_batches` (arrays in a tuple/dict structure, one array, or a
    finite ``tf.data.Dataset`` of single examples, read into memory once).  Element ``t``:
    ``(x[idx_t], y[idx_t], weight_t)`` for ``data = (x, y)``, with
    ``idx_t, weight_t = self.batch_indices(t)``; ``(d[idx_t], None, weight_t)`` for a dict
    ``d``; ``(x[idx_t], weight_t)`` for one array (docs/design/data_pipelines.md, "Data").
    Batch dimension ``None`` in ``element_spec``.

    Raises:
      ValueError: ``data``'s number of examples is not :attr:`num_examples`, or ``data`` is
        malformed (see :func:`poisson_batches`).
      TypeError: ``data`` is not an accepted structure (see :func:`poisson_batches`).
    """
    structure, n = as_structure(data)
    if n != self.num_examples:
      raise ValueError(f"data has {n} examples (first dimension) but this PoissonSampling has "
                       f"num_examples={self.num_examples}.")
    return self._dataset(structure)

  def _dataset(self, structure, accumulation_steps: int = 1) -> tf.data.Dataset:
    if accumulation_steps == 1:
      def element(step):
        indices, weights = self.batch_indices(step)
        return gather(structure, indices, weights)

      dataset = Passes().indices(self.steps).map(
          element, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    else:
      dataset = split_logical_batches(
          Passes().indices(self.steps).map(
              lambda step: tf.where(self.selected(step))[:, 0],
              num_parallel_calls=tf.data.AUTOTUNE, deterministic=True),
          structure, accumulation_steps)
    return tagged(dataset, Pipeline("poisson", self.num_examples, self.expected_batch_size,
                                    self.steps_per_epoch, self.sampling_probability,
                                    accumulation_steps=accumulation_steps))


def poisson_batches(data, *, sampling_probability: float | None = None,
                    expected_batch_size: float | None = None, steps: int,
                    seed: int | None = None,
                    gradient_accumulation_steps: int | None = None) -> tf.data.Dataset:
  """A ``tf.data.Dataset`` of ``steps`` Poisson-sampled batches of ``data``.

  Each batch includes every example independently with probability ``q`` (the exact
  construction and why it matches the accountants' assumption:
  docs/design/data_pipelines.md).

  Args:
    data: the training examples (docs/design/data_pipelines.md, "Data"): arrays/tensors with
      equal first dimension ``N >= 1``, as one array or nested in tuples and dicts (``(x, y)``,
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
    A dataset of ``steps`` elements (``k * steps`` chunks with accumulation):
    ``(x_b, y_b, weight)`` for ``data = (x, y)`` (in general a tuple's gathered components
    then ``weight``, e.g. ``({"image": x_b}, y_b, weight)`` for ``({"image": x}, y)``);
    ``(d_b, None, weight)`` for a dict ``d`` (inputs only, see docs/design/data_pipelines.md);
    ``(x_b, weight)`` for one array.  A dataset ``data`` gives what its element structure
    would give as arrays.  ``x_b = x[idx]``, ``y_b = y[idx]`` for the selected
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
  check_one_rate(sampling_probability, expected_batch_size)
  chunks = accumulation_steps(gradient_accumulation_steps)
  structure, n = as_structure(data)
  sampling = make_sampling(n, sampling_probability, expected_batch_size, steps, seed)
  return sampling._dataset(structure, chunks)  # pylint: disable=protected-access


def check_one_rate(sampling_probability, expected_batch_size) -> None:
  if (sampling_probability is None) == (expected_batch_size is None):
    raise ValueError("Give exactly one of sampling_probability (q in (0, 1]) and "
                     "expected_batch_size (qN in (0, N]); got "
                     f"sampling_probability={sampling_probability!r}, "
                     f"expected_batch_size={expected_batch_size!r}.")


def make_sampling(n, sampling_probability, expected_batch_size, steps, seed) -> PoissonSampling:
  """The :class:`PoissonSampling` of ``n`` examples at the one rate given (secret seed if None)."""
  if seed is None:
    seed = secret_seed()
  if expected_batch_size is not None:
    return PoissonSampling.from_expected_batch_size(n, expected_batch_size, steps=steps,
                                                    seed=seed)
  return PoissonSampling(n, sampling_probability, steps, seed)
