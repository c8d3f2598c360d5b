"""Poisson sampling really is Poisson sampling; the shuffled pipeline covers each example once.

Statistical tests use fixed seeds, so they are deterministic; tolerances are stated as numbers of
standard errors (5 SE) or p-values (> 1e-3) and would pass for a correct sampler with
overwhelming probability for any seed.
"""
from __future__ import annotations

import collections
import math
from fractions import Fraction

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from tf_dpkit.data import poisson
from tf_dpkit.data.poisson import PoissonSampling, poisson_batches, shuffled_batches

N, Q, T = 1000, 0.05, 2000


def _index_data(n):
  """x[i] = (i, 2i) as float32, y[i] = i: the gathered y values are the selected indices."""
  i = np.arange(n)
  return np.stack([i, 2 * i], axis=1).astype(np.float32), i.astype(np.int64)


def _masks(ds, n):
  """[steps, n] 0/1 inclusion matrix (weight-0 placeholders count as not included)."""
  rows = []
  for _, y, w in ds.as_numpy_iterator():
    row = np.zeros(n, np.int64)
    row[y[w > 0]] = 1
    rows.append(row)
  return np.stack(rows)


@pytest.fixture(scope="module")
def draws():
  ds = poisson_batches(_index_data(N), sampling_probability=Q, steps=T, seed=1234)
  return _masks(ds, N)


def test_batch_sizes_follow_binomial(draws):
  sizes = draws.sum(axis=1)
  mean, var = N * Q, N * Q * (1 - Q)  # 50, 47.5
  # Mean within 5 standard errors (SE = sqrt(var / T) ~ 0.154).
  assert abs(sizes.mean() - mean) < 5 * math.sqrt(var / T)
  # Variance within 5 SE (SE of the sample variance ~ var * sqrt(2 / (T - 1)) ~ 1.50).
  assert abs(sizes.var(ddof=1) - var) < 5 * var * math.sqrt(2 / (T - 1))
  # Chi-square goodness of fit to Binomial(N, q), tails pooled so every bin expects >= 5.
  lo, hi = 34, 67  # every bin, pooled tails included, expects >= 6
  binned = np.clip(sizes, lo, hi)
  observed = np.bincount(binned - lo, minlength=hi - lo + 1)
  probs = stats.binom.pmf(np.arange(lo, hi + 1), N, Q)
  probs[0], probs[-1] = stats.binom.cdf(lo, N, Q), stats.binom.sf(hi - 1, N, Q)
  assert np.all(probs * T >= 5)
  assert stats.chisquare(observed, probs * T).pvalue > 1e-3
  # Kolmogorov-Smirnov: D = max_k |F_T(k) - F(k)| over integers k, the empirical CDF against
  # the binomial CDF.  (scipy.stats.kstest assumes a continuous law and overstates D at ties.)
  # For a discrete law the continuous-case Kolmogorov p-value is conservative (too small).
  k = np.arange(N + 1)
  empirical = np.searchsorted(np.sort(sizes), k, side="right") / T
  d = np.max(np.abs(empirical - stats.binom.cdf(k, N, Q)))
  assert stats.kstwo.sf(d, T) > 1e-3


def test_every_example_is_included_with_probability_q(draws):
  counts = draws.sum(axis=0)  # each ~ Binomial(T, q): mean 100, sd ~ 9.75
  sd = math.sqrt(T * Q * (1 - Q))
  assert np.max(np.abs(counts - T * Q)) < 5 * sd
  # Sum of squared z-scores ~ chi2(N) if the counts are independent Binomial(T, q); two-sided,
  # so both over-dispersion and too-even coverage (e.g. a hidden shuffle) fail.
  stat = np.sum((counts - T * Q) ** 2) / (T * Q * (1 - Q))
  p = 2 * min(stats.chi2.sf(stat, N), stats.chi2.cdf(stat, N))
  assert p > 1e-3


def test_steps_are_independent(draws):
  # An example is in both of two consecutive batches with probability q^2 if steps are
  # independent (sampling without replacement across steps would give far fewer).
  overlaps = np.sum(draws[1:] * draws[:-1])
  pairs = (T - 1) * N
  assert abs(overlaps - pairs * Q * Q) < 5 * math.sqrt(pairs * Q * Q * (1 - Q * Q))
  # Correlation of consecutive batch sizes ~ 0 (SE ~ 1 / sqrt(T)).
  sizes = draws.sum(axis=1).astype(np.float64)
  assert abs(np.corrcoef(sizes[1:], sizes[:-1])[0, 1]) < 5 / math.sqrt(T)
  # No two of the first 50 steps give the same batch.
  assert len({row.tobytes() for row in draws[:50]}) == 50


def test_reproducible_per_seed_and_independent_of_iteration():
  data = _index_data(200)
  one = list(poisson_batches(data, sampling_probability=0.1, steps=20, seed=7).as_numpy_iterator())
  two = list(poisson_batches(data, sampling_probability=0.1, steps=20, seed=7).as_numpy_iterator())
  other = list(poisson_batches(data, sampling_probability=0.1, steps=20,
                               seed=8).as_numpy_iterator())
  for a, b in zip(one, two):
    for u, v in zip(a, b):
      np.testing.assert_array_equal(u, v)
  assert any(not np.array_equal(a[1], b[1]) for a, b in zip(one, other))
  # Batch t depends only on (seed, t): batch_indices(t) matches the dataset's element t.
  sampling = PoissonSampling(200, 0.1, 20, 7)
  indices, _ = sampling.batch_indices(13)
  np.testing.assert_array_equal(indices.numpy(), one[13][1])
  # x and y are gathered with the same indices.
  np.testing.assert_array_equal(one[13][0][:, 0], one[13][1])


def test_elements_structure_and_dynamic_batch_dimension():
  ds = poisson_batches(_index_data(100), expected_batch_size=10, steps=30, seed=0)
  x_spec, y_spec, w_spec = ds.element_spec
  assert x_spec.shape.as_list() == [None, 2] and x_spec.dtype == tf.float32
  assert y_spec.shape.as_list() == [None] and y_spec.dtype == tf.int64
  assert w_spec.shape.as_list() == [None] and w_spec.dtype == tf.float32
  traces = []

  @tf.function
  def step(iterator):  # the Keras pattern: next() inside the traced function
    traces.append(1)
    x, y, w = next(iterator)
    return tf.shape(x)[0], tf.reduce_sum(w)

  iterator = iter(ds)
  sizes = [int(step(iterator)[0]) for _ in range(30)]
  assert len(set(sizes)) > 3 and len(traces) == 1
  # In ascending index order, weights all one for non-empty draws.
  for _, y, w in ds.take(5).as_numpy_iterator():
    assert np.all(np.diff(y) > 0) and np.all(w == 1.0)


def test_single_array_gives_pairs():
  x = np.arange(50, dtype=np.float32)
  ds = poisson_batches(x, sampling_probability=0.5, steps=3, seed=0)
  assert len(ds.element_spec) == 2
  for xb, w in ds.as_numpy_iterator():
    assert xb.shape == w.shape


def test_expected_batch_size_equals_sampling_probability():
  data = _index_data(400)
  a = poisson_batches(data, expected_batch_size=20, steps=5, seed=3)
  b = poisson_batches(data, sampling_probability=20 / 400, steps=5, seed=3)
  for u, v in zip(a.as_numpy_iterator(), b.as_numpy_iterator()):
    np.testing.assert_array_equal(u[1], v[1])


def test_empty_draw_is_a_zero_weight_placeholder():
  data = _index_data(10)
  for x, y, w in poisson_batches(data, sampling_probability=1e-12, steps=5,
                                 seed=0).as_numpy_iterator():
    np.testing.assert_array_equal(y, [0])
    np.testing.assert_array_equal(x, [[0.0, 0.0]])
    np.testing.assert_array_equal(w, np.array([0.0], np.float32))
  # Mixed: P(empty) = 0.9^5 ~ 0.59; placeholders are exactly the weight-0 elements.
  seen_empty = seen_full = False
  for _, y, w in poisson_batches(_index_data(5), sampling_probability=0.1, steps=40,
                                 seed=1).as_numpy_iterator():
    if w.sum() == 0:
      seen_empty = True
      assert y.tolist() == [0] and w.tolist() == [0.0]
    else:
      seen_full = True
      assert np.all(w == 1.0)
  assert seen_empty and seen_full


def test_q_one_takes_everyone():
  for _, y, w in poisson_batches(_index_data(7), expected_batch_size=7, steps=3,
                                 seed=0).as_numpy_iterator():
    assert y.tolist() == list(range(7)) and np.all(w == 1.0)


def test_sampling_properties():
  s = PoissonSampling.from_expected_batch_size(60000, 256, steps=10, seed=0)
  assert s.sampling_probability == 256 / 60000
  assert s.expected_batch_size == pytest.approx(256)
  assert s.steps_per_epoch == math.ceil(60000 / 256) == 235
  assert PoissonSampling(1000, 0.01, 1, 0).steps_per_epoch == 100
  assert PoissonSampling(1000, 0.1, 1, 0).steps_per_epoch == 10
  assert PoissonSampling(10, 0.5, 1, 0).inclusion_threshold == 2**63
  assert PoissonSampling(10, 1.0, 1, 0).inclusion_threshold == 2**64
  # floor(q 2^64) / 2^64 <= q < (floor(q 2^64) + 1) / 2^64, checked in exact rationals.
  threshold = PoissonSampling(10, 0.3, 1, 0).inclusion_threshold
  assert Fraction(threshold, 2**64) <= Fraction(0.3) < Fraction(threshold + 1, 2**64)
  assert PoissonSampling(10, 0.3, 1, 0).realised_sampling_probability <= 0.3


def test_keras_fit_consumes_weights_as_sample_weight():
  # An empty draw (q = 1e-12) is emitted as example 0 with weight 0: if Keras reads the third
  # element as sample_weight, the loss and the SGD update are exactly zero.
  import keras  # pylint: disable=g-import-not-at-top
  x, y = _index_data(4)
  ds = poisson_batches((x.astype(np.float32), np.ones(4, np.float32)), sampling_probability=1e-12,
                       steps=1, seed=0)
  (_, _, w), = list(ds.as_numpy_iterator())
  np.testing.assert_array_equal(w, [0.0])
  model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="ones")])
  model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
  before = [v.copy() for v in model.get_weights()]
  history = model.fit(ds, epochs=1, verbose=0, shuffle=False)
  assert history.history["loss"][0] == 0.0
  for a, b in zip(model.get_weights(), before):
    np.testing.assert_array_equal(a, b)


def test_default_seed_is_secret_and_hidden_from_repr():
  data = _index_data(1000)
  one = [b[0][:, 0] for b in poisson_batches(data, sampling_probability=0.5, steps=2).as_numpy_iterator()]
  two = [b[0][:, 0] for b in poisson_batches(data, sampling_probability=0.5, steps=2).as_numpy_iterator()]
  assert not np.array_equal(one[0], two[0])  # equal by chance with probability 2**-1000
  assert "12345" not in repr(PoissonSampling(10, 0.5, 1, 12345))
  a = list(shuffled_batches(data, 100, 1).as_numpy_iterator())[0][0][:, 0]
  b = list(shuffled_batches(data, 100, 1).as_numpy_iterator())[0][0][:, 0]
  assert not np.array_equal(a, b)


def test_graph_mode_one_shot_iterator():
  v1 = tf.compat.v1
  with tf.Graph().as_default():
    ds = poisson_batches(_index_data(30), expected_batch_size=5, steps=2, seed=0)
    x, y, w = v1.data.make_one_shot_iterator(ds).get_next()
    with v1.Session() as sess:
      xs, ys, ws = sess.run([x, y, w])
  assert xs.shape[0] == ys.shape[0] == ws.shape[0] >= 1


# ---------------------------------------------------------------------------- shuffled pipeline


def _epochs(ds, per_epoch):
  ys = [y for _, y, _ in ds.as_numpy_iterator()]
  return [np.concatenate(ys[e * per_epoch:(e + 1) * per_epoch])
          for e in range(len(ys) // per_epoch)]


def test_shuffled_covers_each_example_once_per_epoch():
  ds = shuffled_batches(_index_data(100), 10, 3, seed=5)
  assert ds.element_spec[0].shape.as_list() == [10, 2]
  epochs = _epochs(ds, 10)
  assert len(epochs) == 3
  for e in epochs:
    assert sorted(e.tolist()) == list(range(100))
  assert not np.array_equal(epochs[0], epochs[1])  # a fresh permutation each epoch
  assert not np.array_equal(epochs[0], np.arange(100))
  for _, _, w in ds.as_numpy_iterator():
    assert np.all(w == 1.0)
  again = _epochs(shuffled_batches(_index_data(100), 10, 3, seed=5), 10)
  np.testing.assert_array_equal(np.concatenate(epochs), np.concatenate(again))


def test_shuffled_remainder():
  kept = shuffled_batches(_index_data(25), 10, 2, seed=0, drop_remainder=False)
  assert kept.element_spec[0].shape.as_list() == [None, 2]
  sizes = [len(y) for _, y, _ in kept.as_numpy_iterator()]
  assert sizes == [10, 10, 5, 10, 10, 5]
  for e in _epochs(kept, 3):
    assert sorted(e.tolist()) == list(range(25))
  dropped = shuffled_batches(_index_data(25), 10, 2, seed=0)
  for e in _epochs(dropped, 2):
    assert len(set(e.tolist())) == 20  # each kept example exactly once


# ---------------------------------------------------- nested structures and tf.data datasets

SN, SQ, SSTEPS, SSEED = 40, 0.2, 6, 11  # P(empty draw) = 0.8**40 ~ 1e-4 per step


def _features(n=SN):
  """Rows that identify their example: image[i] = i + [[0, .1], [.2, .3]], meta[i] = (-i, i)."""
  i = np.arange(n, dtype=np.float32)
  image = i[:, None, None] + np.array([[0.0, 0.1], [0.2, 0.3]], np.float32)
  meta = np.stack([-i, i], axis=1)
  return {"image": image, "meta": meta}, np.arange(n, dtype=np.int64) % 3


def _kinds():
  """name -> (data, the same examples as a numpy structure, expected element structure kind)."""
  feats, y = _features()
  x = feats["meta"]
  slices = tf.data.Dataset.from_tensor_slices
  return {
      "tuple": ((x, y), (x, y), "tuple"),
      "dict": ({"image": feats["image"], "label": y}, {"image": feats["image"], "label": y},
               "dict"),
      "dict_and_y": ((feats, y), (feats, y), "tuple"),
      "array": (x, x, "array"),
      "nested": ((x, (y, {"m": feats["meta"]})), (x, (y, {"m": feats["meta"]})), "tuple"),
      "dataset_tuple": (slices((x, y)), (x, y), "tuple"),
      "dataset_dict_and_y": (slices((feats, y)), (feats, y), "tuple"),
      "dataset_dict": (slices({"image": feats["image"], "label": y}),
                       {"image": feats["image"], "label": y}, "dict"),
      "dataset_array": (slices(x), x, "array"),
      # Built with map + filter: unknown cardinality, elements made one by one.
      "dataset_mapped": (tf.data.Dataset.range(SN).filter(lambda i: i >= 0).map(
          lambda i: ({k: tf.gather(v, i) for k, v in feats.items()}, tf.gather(y, i))),
                         (feats, y), "tuple"),
  }


def _expected_element(arrays, kind, indices, weights):
  """The reference: the original numpy arrays indexed with batch_indices' rows."""
  batch = tf.nest.map_structure(lambda a: a[indices], arrays)
  if kind == "tuple":
    return tuple(batch) + (weights,)
  if kind == "dict":
    return batch, None, weights
  return batch, weights


def _assert_same_element(actual, expected):
  tf.nest.assert_same_structure(actual, expected)
  for a, e in zip(tf.nest.flatten(actual), tf.nest.flatten(expected)):
    if e is None:
      assert a is None
    else:
      assert a.dtype == e.dtype
      np.testing.assert_array_equal(a, e)


@pytest.mark.parametrize("name", sorted(_kinds()))
def test_structures_gather_exactly_the_rows_batch_indices_chooses(name):
  data, arrays, kind = _kinds()[name]
  sampling = PoissonSampling(SN, SQ, SSTEPS, SSEED)
  ds = poisson_batches(data, sampling_probability=SQ, steps=SSTEPS, seed=SSEED)
  via_function = list(ds.as_numpy_iterator())
  via_method = list(sampling.dataset(data).as_numpy_iterator())
  assert len(via_function) == len(via_method) == SSTEPS
  for t in range(SSTEPS):
    indices, weights = (v.numpy() for v in sampling.batch_indices(t))
    expected = _expected_element(arrays, kind, indices, weights)
    _assert_same_element(via_function[t], expected)
    _assert_same_element(via_method[t], expected)
  # The batch dimension is None for every leaf, whatever the structure (a dict's y: None).
  spec = ds.element_spec
  if kind == "dict":
    assert type(spec[1]).__name__ == "NoneTensorSpec"
    spec = (spec[0], spec[2])
  for leaf in tf.nest.flatten(spec):
    assert isinstance(leaf, tf.TensorSpec) and leaf.shape[0] is None


def test_dataset_and_the_same_arrays_give_identical_batches():
  feats, y = _features()
  poisson_pipeline = lambda d: poisson_batches(d, expected_batch_size=7, steps=5, seed=3)
  shuffled_pipeline = lambda d: shuffled_batches(d, 8, 2, seed=3, drop_remainder=False)
  for data, build in [((feats, y), poisson_pipeline), ({"label": y, **feats}, poisson_pipeline),
                      (feats["meta"], poisson_pipeline), ((feats, y), shuffled_pipeline)]:
    from_arrays = list(build(data).as_numpy_iterator())
    from_dataset = list(build(tf.data.Dataset.from_tensor_slices(data)).as_numpy_iterator())
    assert len(from_arrays) == len(from_dataset) > 0
    for a, b in zip(from_arrays, from_dataset):
      _assert_same_element(b, a)


def test_dataset_of_unknown_cardinality_is_read_in_chunks(monkeypatch):
  from tf_dpkit.data import _structure  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(_structure, "_READ_CHUNK", 7)  # 40 examples: 6 chunks, concatenated
  feats, y = _features()
  ds = tf.data.Dataset.from_tensor_slices((feats, y)).filter(lambda f, label: True)
  assert ds.cardinality() == tf.data.UNKNOWN_CARDINALITY
  from_arrays = poisson_batches((feats, y), expected_batch_size=9, steps=4, seed=2)
  from_dataset = poisson_batches(ds, expected_batch_size=9, steps=4, seed=2)
  for a, b in zip(from_arrays.as_numpy_iterator(), from_dataset.as_numpy_iterator()):
    _assert_same_element(b, a)
  # Shapes equal within each chunk but not across chunks: refused like any varying shape.
  varying = tf.data.Dataset.range(14).filter(lambda i: True).map(
      lambda i: tf.zeros(tf.stack([2, tf.cast(i // 7 + 1, tf.int32)])))
  with pytest.raises(ValueError, match=r"could not stack.*same shape.*TensorFlow said"):
    poisson_batches(varying, sampling_probability=0.5, steps=1, seed=0)


def test_empty_draw_placeholder_with_structures():
  feats, y = _features(5)
  ds = tf.data.Dataset.from_tensor_slices((feats, y))
  (element,) = list(poisson_batches(ds, sampling_probability=1e-12, steps=1,
                                    seed=0).as_numpy_iterator())
  weight = np.array([0.0], np.float32)
  _assert_same_element(element, _expected_element((feats, y), "tuple", [0], weight))
  (element,) = list(poisson_batches(feats, sampling_probability=1e-12, steps=1,
                                    seed=0).as_numpy_iterator())
  _assert_same_element(element, _expected_element(feats, "dict", [0], weight))


def test_shuffled_structures_cover_each_example_once_per_epoch():
  feats, y = _features(30)
  for data in [{"label": y, **feats}, tf.data.Dataset.from_tensor_slices((feats, y))]:
    batches = list(shuffled_batches(data, 10, 2, seed=4).as_numpy_iterator())
    assert len(batches) == 6
    for e in range(2):
      rows = []
      for element in batches[3 * e:3 * e + 3]:
        if isinstance(data, dict):
          batch, none, w = element
          assert none is None
        else:
          batch, labels, w = element
          np.testing.assert_array_equal(labels, y[batch["meta"][:, 1].astype(int)])
        assert np.all(w == 1.0)
        index = batch["meta"][:, 1].astype(int)  # meta[i] = (-i, i)
        np.testing.assert_array_equal(batch["image"], feats["image"][index])
        rows.extend(index.tolist())
      assert sorted(rows) == list(range(30))


def _dict_input_model(keras):
  image = keras.Input((2, 2), name="image")
  meta = keras.Input((2,), name="meta")
  hidden = keras.layers.Concatenate()([keras.layers.Flatten()(image), meta])
  return image, meta, hidden


def test_keras_fit_with_dict_inputs_consumes_dataset_pipeline():
  import keras  # pylint: disable=g-import-not-at-top
  keras.utils.set_random_seed(0)
  feats, _ = _features(32)
  feats = {k: v / 32.0 for k, v in feats.items()}
  y = (feats["meta"][:, 1] > 0.5).astype(np.float32)
  image, meta, hidden = _dict_input_model(keras)
  model = keras.Model({"image": image, "meta": meta}, keras.layers.Dense(1)(hidden))
  model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
  ds = tf.data.Dataset.from_tensor_slices((feats, y))  # elements ({"image", "meta"}, label)
  before = [w.copy() for w in model.get_weights()]
  history = model.fit(poisson_batches(ds, expected_batch_size=8, steps=6, seed=0), epochs=2,
                      verbose=0, shuffle=False)
  assert len(history.history["loss"]) == 2 and np.all(np.isfinite(history.history["loss"]))
  assert any(not np.array_equal(a, b) for a, b in zip(model.get_weights(), before))
  # Keras reads the third component as sample_weight: an empty draw (example 0, weight 0)
  # leaves the loss and the weights exactly unchanged.
  before = [w.copy() for w in model.get_weights()]
  history = model.fit(poisson_batches(ds, sampling_probability=1e-12, steps=1, seed=0),
                      verbose=0, shuffle=False)
  assert history.history["loss"][0] == 0.0
  for a, b in zip(model.get_weights(), before):
    np.testing.assert_array_equal(a, b)


def test_keras_fit_with_dict_alone_gets_no_targets_and_the_weights():
  # A dict is inputs only: (d_b, None, weight).  A model computing its loss from its inputs
  # sees y = None and sample_weight = weight (zero for the empty-draw placeholder).
  import keras  # pylint: disable=g-import-not-at-top
  seen = []

  class LossFromInputs(keras.Model):

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
      seen.append((y, sample_weight))
      per_example = keras.ops.square(y_pred[:, 0] - x["label"])
      return keras.ops.sum(per_example * sample_weight)

  feats, y = _features(16)
  image, meta, hidden = _dict_input_model(keras)
  label = keras.Input((), name="label")  # Keras maps a dict by name if keys == input names
  model = LossFromInputs({"image": image, "meta": meta, "label": label},
                         keras.layers.Dense(1, kernel_initializer="ones")(hidden))
  model.compile(optimizer=keras.optimizers.SGD(0.01))
  data = {**feats, "label": y.astype(np.float32)}
  before = [w.copy() for w in model.get_weights()]
  history = model.fit(poisson_batches(data, sampling_probability=1e-12, steps=1, seed=0),
                      verbose=0, shuffle=False)
  assert seen and seen[0][0] is None and seen[0][1] is not None
  assert history.history["loss"][0] == 0.0
  for a, b in zip(model.get_weights(), before):
    np.testing.assert_array_equal(a, b)
  model.fit(poisson_batches(data, expected_batch_size=8, steps=2, seed=0), verbose=0,
            shuffle=False)
  assert any(not np.array_equal(a, b) for a, b in zip(model.get_weights(), before))


# ---------------------------------------------------------------------------------- errors


@pytest.mark.parametrize("kwargs, match", [
    (dict(sampling_probability=0.0), r"sampling_probability must be in \(0, 1\]"),
    (dict(sampling_probability=1.5), r"sampling_probability must be in \(0, 1\]"),
    (dict(sampling_probability=-0.1), r"sampling_probability must be in \(0, 1\]"),
    (dict(sampling_probability=float("nan")), r"sampling_probability must be in \(0, 1\]"),
    (dict(sampling_probability=True), r"sampling_probability must be a real number"),
    (dict(expected_batch_size=0), r"expected_batch_size must be in \(0, num_examples\]"),
    (dict(expected_batch_size=-3), r"expected_batch_size must be in \(0, num_examples\]"),
    (dict(expected_batch_size=11),
     r"expected_batch_size must be in \(0, num_examples\] = \(0, 10\]"),
    (dict(), r"exactly one of sampling_probability"),
    (dict(sampling_probability=0.1, expected_batch_size=1), r"exactly one of sampling_probability"),
    (dict(sampling_probability=0.1, steps=0), r"steps must be an integer in \[1, inf\]"),
    (dict(sampling_probability=0.1, steps=2.0), r"steps must be an integer"),
    (dict(sampling_probability=0.1, steps=-1), r"steps must be an integer"),
    (dict(sampling_probability=0.1, seed=2**63), r"seed must be an integer"),
    (dict(sampling_probability=0.1, seed=1.5), r"seed must be an integer"),
])
def test_poisson_argument_errors(kwargs, match):
  kwargs = {"steps": 3, "seed": 0, **kwargs}
  with pytest.raises(ValueError, match=match):
    poisson_batches(_index_data(10), **kwargs)


@pytest.mark.parametrize("data, match", [
    ((np.zeros([10, 2]), np.zeros([9])), r"same first dimension.*\[10, 9\]"),
    ((), r"non-empty tuple"),
    ((np.zeros([0, 2]),), r"at least 1 example"),
    (np.float32(3.0), r"data must have a known first"),
])
def test_data_errors(data, match):
  with pytest.raises(ValueError, match=match):
    poisson_batches(data, sampling_probability=0.5, steps=1, seed=0)
  with pytest.raises(ValueError, match=match):
    shuffled_batches(data, 1, 1, 0)


def _slices(*args):
  return tf.data.Dataset.from_tensor_slices(*args)


_X10 = np.zeros([10, 2], np.float32)
_Y10 = np.zeros([10], np.float32)


@pytest.mark.parametrize("make_data, error, match", [
    # in-memory structures
    (lambda: [_X10, _Y10], TypeError, r"data is a list; tf\.data would stack.*give a tuple"),
    (lambda: ([_X10, _X10], _Y10), TypeError, r"data\[0\] is a list.*\(\(x1, x2\), y\)"),
    (lambda: {"a": _X10, "b": None}, TypeError, r"data\['b'\] is None"),
    (lambda: (tf.ragged.constant([[1]] * 10), _Y10), TypeError,
     r"data\[0\] is a RaggedTensor; only dense"),
    (lambda: {"s": tf.sparse.from_dense(_X10)}, TypeError, r"data\['s'\] is a SparseTensor"),
    (lambda: {"o": np.array([object()] * 10)}, TypeError,
     r"data\['o'\] must be an array or tensor; a ndarray could not be converted"),
    (lambda: (_slices(_X10), _Y10), TypeError,
     r"data\[0\] is a tf\.data\.Dataset; a Dataset must be the whole of data.*zip"),
    (lambda: {1: _X10, "a": _Y10}, TypeError, r"data is a dict whose keys cannot be sorted"),
    (lambda: collections.UserDict(a=_X10), TypeError,
     r"data is a UserDict; only tuples and dicts may nest"),
    (lambda: {"a": _X10, "b": np.zeros([9])}, ValueError,
     r"same first dimension.*\[10, 9\] for data\['a'\], data\['b'\]"),
    (lambda: {}, ValueError, r"non-empty tuple/dict of arrays or a tf\.data\.Dataset"),
    (lambda: ({"x": _X10, "s": 3.0}, _Y10), ValueError,
     r"data\[0\]\['s'\] must have a known first \(example\) dimension, got shape \(\)"),
    # tf.data datasets
    (lambda: _slices((_X10, _Y10)).repeat(), ValueError, r"data is an infinite tf\.data"),
    (lambda: _slices((_X10, _Y10)).take(0), ValueError, r"data is an empty tf\.data"),
    (lambda: _slices(_X10).filter(lambda x: False), ValueError, r"data is an empty tf\.data"),
    (lambda: _slices((_X10, _Y10)).batch(4), ValueError,
     r"elements look batched: data\.element_spec\[0\] has shape \(None, 2\).*\.unbatch\(\)"),
    (lambda: _slices(tf.ragged.constant([[[1], [1, 2]]])), TypeError,
     r"data is a tf\.data\.Dataset with a RaggedTensorSpec component \(data\.element_spec\)"),
    (lambda: _slices({"s": tf.sparse.from_dense(_X10)}), TypeError,
     r"SparseTensorSpec component \(data\.element_spec\['s'\]\); only dense"),
    (lambda: tf.data.Dataset.range(3).map(lambda i: (i, None)), TypeError,
     r"NoneTensorSpec component \(data\.element_spec\[1\]\)"),
    (lambda: tf.data.Dataset.range(3).map(lambda i: tf.zeros([2, i + 1])), ValueError,
     r"could not stack the tf\.data\.Dataset's elements.*same shape.*TensorFlow said: "
     r"Cannot add tensor to the batch: number of elements does not match. Shapes are: "
     r"\[tensor\]: \[2,\d\], \[batch\]: \[2,\d\]$"),  # no {{function_node}} / [Op:] clutter
])
def test_structure_errors(make_data, error, match):
  with pytest.raises(error, match=match):
    poisson_batches(make_data(), sampling_probability=0.5, steps=1, seed=0)
  with pytest.raises(error, match=match):
    shuffled_batches(make_data(), 1, 1, 0)
  with pytest.raises(error, match=match):
    PoissonSampling(10, 0.5, 1, 0).dataset(make_data())


def test_dataset_needs_eager_execution():
  with tf.Graph().as_default():
    with pytest.raises(ValueError, match=r"data: a tf\.data\.Dataset is read into memory "
                                         r"eagerly.*outside tf\.function"):
      poisson_batches(_slices(_X10), sampling_probability=0.5, steps=1, seed=0)


def test_dataset_size_mismatch():
  with pytest.raises(ValueError, match="num_examples=11"):
    PoissonSampling(11, 0.5, 1, 0).dataset(_index_data(10))
  with pytest.raises(ValueError, match="data has 10 examples .* num_examples=11"):
    PoissonSampling(11, 0.5, 1, 0).dataset(_slices(({"x": _X10}, _Y10)))
  with pytest.raises(ValueError, match=r"num_examples must be an integer in \[1, inf\]"):
    PoissonSampling(0, 0.5, 1, 0)


@pytest.mark.parametrize("args, match", [
    ((0, 1, 0), r"batch_size must be an integer in \[1, 10\]"),
    ((11, 1, 0), r"batch_size must be an integer in \[1, 10\]"),
    ((2, 0, 0), r"epochs must be an integer in \[1, inf\]"),
    ((2, 1.5, 0), r"epochs must be an integer"),
    ((2, 1, -2**63 - 1), r"seed must be an integer"),
])
def test_shuffled_argument_errors(args, match):
  with pytest.raises(ValueError, match=match):
    shuffled_batches(_index_data(10), *args)


def test_public_names():
  assert set(poisson.__all__) == {"Pipeline", "PoissonSampling", "accumulation_steps_for_memory",
                                  "check_class_labels", "check_finite_features", "pipeline_of", "poisson_batches", "poisson_batches_for_memory",
                                  "secret_seed", "shuffled_batches"}
  seeds = {poisson.secret_seed() for _ in range(64)}
  assert len(seeds) == 64 and all(0 <= s < 2**63 for s in seeds)
  assert max(seeds) >= 2**62  # uses the high bits (fails with probability 2**-64)


def test_pipelines_say_what_they_are_and_derived_datasets_keep_it():
  x = np.zeros((10, 2), np.float32)
  batches = poisson.poisson_batches(x, expected_batch_size=3, steps=4, seed=1)
  assert poisson.pipeline_of(batches) == poisson.Pipeline("poisson", 10, 3.0, 4, 0.3)
  assert poisson.pipeline_of(poisson.shuffled_batches(x, 3, 2, seed=1)) == poisson.Pipeline(
      "shuffle", 10, 3, 3)
  assert poisson.pipeline_of(poisson.shuffled_batches(x, 3, 2, seed=1, drop_remainder=False)) \
      == poisson.Pipeline("shuffle", 10, 3, 4)
  # take keeps each element a fresh batch of the pipeline (test_replay.py: what is refused).
  assert poisson.pipeline_of(batches.take(2)) == poisson.pipeline_of(batches)
  assert poisson.pipeline_of(x) is None
