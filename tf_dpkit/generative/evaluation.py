"""Evaluating generators: TSTR accuracy, a Frechet distance on MNIST features, sample grids.

These numbers use real data (the test set; for the feature extractor, the real training
images) and are NOT covered by the generator's differential-privacy guarantee: they are
reported for evaluation only.

* :func:`tstr_accuracy` -- "train on synthetic, test on real": a classifier is trained on
  labelled synthetic images and its accuracy on the real test set is returned, in [0, 1].
  ``classifier="mlp"`` (the default): ``Flatten -> Dense(256, ReLU) -> Dense(K)``;
  ``classifier="cnn"``: :func:`tstr_classifier`'s small CNN ``Conv(32, 3, ReLU) ->
  MaxPool(2) -> Conv(64, 3, ReLU) -> MaxPool(2) -> Flatten -> Dense(128, ReLU) -> Dense(K)``
  (the architecture of the feature extractor below).  Either way: Adam, cross-entropy on
  logits, the given epochs and batch size, no validation split, no early stopping, so the
  test set is read only once, by the final evaluation.
  :func:`tstr_correct` gives the per-example outcomes (for a private choice among generators
  on validation records, :mod:`tf_dpkit.selection`).
* :func:`frechet_distance` -- ``||mu_a - mu_b||^2 + Tr(S_a + S_b - 2 (S_a S_b)^{1/2})``
  between Gaussians fitted (mean, covariance with ``n - 1``) to the features of two image sets,
  the FID formula of Heusel et al. 2017 with Inception replaced by an MNIST classifier.
  Features: the 128-unit penultimate layer (``Dense(128, ReLU)``, named ``"features"``) of
  :func:`mnist_feature_extractor`'s CNN ``Conv(32, 3, ReLU) -> MaxPool(2) -> Conv(64, 3, ReLU)
  -> MaxPool(2) -> Flatten -> Dense(128, ReLU) -> Dense(10)``, trained on real MNIST.  Units:
  squared feature units; 0 for identical distributions.
* :func:`save_sample_grid` -- a PNG of images tiled in a grid (matplotlib, its own Agg canvas;
  nothing is configured at import).
* :func:`tstr_tabular` -- TSTR for tables with a binary label: the scikit-learn classifiers of
  :data:`TABULAR_CLASSIFIERS` (:func:`tabular_classifier`) are each fitted on the synthetic rows
  and scored on the real test rows by :func:`binary_auroc` and :func:`binary_auprc`; the means
  over the classifiers are the figures the PATE-GAN literature reports.  Needs the ``tabular``
  extra (scikit-learn).
"""
from __future__ import annotations

import hashlib
import warnings

import numpy as np

from analysis import _checks

_FEATURE_CACHE: dict = {}


def _images(name, x):
  x = np.asarray(x, np.float32)
  if x.ndim < 2 or x.shape[0] < 1:
    raise ValueError(f"{name} must be a non-empty batch of images [n, ...], got shape {x.shape}.")
  return x


def _labels(name, y, n, num_classes):
  y = np.asarray(y)
  if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer):
    raise ValueError(f"{name} must be {n} integer labels, got {y.dtype} {y.shape}.")
  if n and (y.min() < 0 or y.max() >= num_classes):
    raise ValueError(f"{name} must hold labels in [0, {num_classes}), got values in "
                     f"[{y.min()}, {y.max()}].")
  return y.astype(np.int32)


TSTR_CLASSIFIERS = ("mlp", "cnn")


def tstr_classifier(kind, input_shape, num_classes):
  """The (uncompiled) TSTR classifier ``images [B, *input_shape] -> logits [B, K]``.

  ``kind``: ``"mlp"`` (``Flatten -> Dense(256, ReLU) -> Dense(K)``) or ``"cnn"``
  (``Conv(32, 3, ReLU) -> MaxPool(2) -> Conv(64, 3, ReLU) -> MaxPool(2) -> Flatten ->
  Dense(128, ReLU) -> Dense(K)``, valid padding; needs images ``[H, W, C]`` with H, W >= 10).
  Weights are drawn from Keras' global seed (``keras.utils.set_random_seed``).
  """
  import keras  # pylint: disable=g-import-not-at-top
  kind = _checks.check_choice("classifier", kind, TSTR_CLASSIFIERS)
  num_classes = _checks.check_integer("num_classes", num_classes, minimum=2)
  input_shape = tuple(input_shape)
  if kind == "mlp":
    return keras.Sequential([
        keras.Input(input_shape), keras.layers.Flatten(),
        keras.layers.Dense(256, activation="relu"), keras.layers.Dense(num_classes)])
  if len(input_shape) != 3 or min(input_shape[:2]) < 10:
    raise ValueError(f"classifier='cnn' needs images [H, W, C] with H, W >= 10, got shape "
                     f"{input_shape}.")
  return keras.Sequential([
      keras.Input(input_shape),
      keras.layers.Conv2D(32, 3, activation="relu"), keras.layers.MaxPooling2D(2),
      keras.layers.Conv2D(64, 3, activation="relu"), keras.layers.MaxPooling2D(2),
      keras.layers.Flatten(), keras.layers.Dense(128, activation="relu"),
      keras.layers.Dense(num_classes)])


def tstr_correct(x_synthetic, y_synthetic, x_test, y_test, *, num_classes=10, epochs=10,
                 batch_size=128, learning_rate=1e-3, seed=0, classifier="mlp") -> np.ndarray:
  """Per real example: does a classifier trained on the synthetic pairs label it correctly?

  The classifier (:func:`tstr_classifier` of kind ``classifier``) is trained with Adam
  (``learning_rate``) on the sparse softmax cross-entropy of the synthetic pairs for
  ``epochs`` epochs of shuffled mini-batches of ``batch_size``.  Returns a bool array
  ``[len(x_test)]``: entry i is True when the arg-max logit on ``x_test[i]`` equals
  ``y_test[i]`` (ties go to the smallest class).  Each entry depends on its own real example
  only, which is what a private selection on these records needs
  (:func:`tf_dpkit.selection.select_privately`).  Arguments as :func:`tstr_accuracy`.
  """
  import keras  # pylint: disable=g-import-not-at-top
  classifier = _checks.check_choice("classifier", classifier, TSTR_CLASSIFIERS)
  num_classes = _checks.check_integer("num_classes", num_classes, minimum=2)
  epochs = _checks.check_integer("epochs", epochs, minimum=1)
  batch_size = _checks.check_integer("batch_size", batch_size, minimum=1)
  learning_rate = _checks.check_finite_positive("learning_rate", learning_rate)
  seed = _checks.check_integer("seed", seed, minimum=0)
  x_synthetic, x_test = _images("x_synthetic", x_synthetic), _images("x_test", x_test)
  if x_synthetic.shape[1:] != x_test.shape[1:]:
    raise ValueError(f"x_synthetic images have shape {x_synthetic.shape[1:]}, x_test "
                     f"{x_test.shape[1:]}.")
  y_synthetic = _labels("y_synthetic", y_synthetic, len(x_synthetic), num_classes)
  y_test = _labels("y_test", y_test, len(x_test), num_classes)
  keras.utils.set_random_seed(seed)
  model = tstr_classifier(classifier, x_synthetic.shape[1:], num_classes)
  model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
  model.fit(x_synthetic, y_synthetic, epochs=epochs, batch_size=batch_size, verbose=0)
  logits = np.asarray(model.predict(x_test, batch_size=1000, verbose=0))
  return np.argmax(logits, axis=1) == y_test


def tstr_accuracy(x_synthetic, y_synthetic, x_test, y_test, *, num_classes=10, epochs=10,
                  batch_size=128, learning_rate=1e-3, seed=0, classifier="mlp") -> float:
  """Train-on-synthetic, test-on-real accuracy in [0, 1]: the mean of :func:`tstr_correct`.

  The classifier (:func:`tstr_classifier` of kind ``classifier``) is trained with Adam
  (``learning_rate``) on the sparse softmax cross-entropy of the synthetic pairs for
  ``epochs`` epochs of shuffled mini-batches of ``batch_size``; the returned value is the
  fraction of the real test images whose arg-max logit equals their label.  Given real
  training images in place of synthetic ones it is the ordinary test accuracy of that
  classifier (the test suite checks this).

  Args:
    x_synthetic: ``[n, ...]`` images and ``[n]`` integer labels in ``[0, K)``.
    y_synthetic: see ``x_synthetic`` (described together).
    x_test: the real test images (same image shape) and labels.
    y_test: see ``x_test`` (described together).
    num_classes: K >= 2; epochs, batch_size: integers >= 1; learning_rate: > 0 (Adam).
    seed: integer seed of the classifier's initialisation and shuffling
      (``keras.utils.set_random_seed``, which also reseeds Python, NumPy and TensorFlow).
    classifier: ``"mlp"`` (default) or ``"cnn"`` (module docstring).
  """
  return float(np.mean(tstr_correct(
      x_synthetic, y_synthetic, x_test, y_test, num_classes=num_classes, epochs=epochs,
      batch_size=batch_size, learning_rate=learning_rate, seed=seed, classifier=classifier)))


def _fingerprint(*arrays):
  digest = hashlib.sha256()
  for a in arrays:
    a = np.ascontiguousarray(a)
    digest.update(str((a.dtype, a.shape)).encode())
    digest.update(a.tobytes())
  return digest.hexdigest()


def mnist_feature_extractor(x_train=None, y_train=None, *, epochs=2, seed=0):
  """The penultimate-layer feature model of a CNN trained on real MNIST (cached in memory).

  The CNN and its 128-d ``"features"`` layer are described in the module docstring; it is
  trained with Adam (learning rate 1e-3, batch 128) for ``epochs`` epochs after
  ``keras.utils.set_random_seed(seed)``, so a given ``(data, epochs, seed)`` gives the same
  weights (on one machine and TensorFlow build).  The result is cached for the life of the
  process by (data fingerprint, epochs, seed): the classifier is trained once.

  Args:
    x_train: float images ``[n, 28, 28, 1]`` in [0, 1] and labels; default: the full
      real MNIST training set (``tf_dpkit.data.mnist.load()``).
    y_train: see ``x_train`` (described together).
    epochs: integer >= 1; seed: integer >= 0.

  Returns:
    ``(feature_model, test_accuracy)``: a Keras model ``images -> [n, 128]`` and the classifier's
    accuracy on the real MNIST test set (None when ``x_train`` is given: no test set is read).
  """
  import keras  # pylint: disable=g-import-not-at-top
  epochs = _checks.check_integer("epochs", epochs, minimum=1)
  seed = _checks.check_integer("seed", seed, minimum=0)
  x_test = y_test = None
  if x_train is None:
    if y_train is not None:
      raise ValueError("y_train was given without x_train.")
    from tf_dpkit.data import mnist  # pylint: disable=g-import-not-at-top
    (x_train, y_train), (x_test, y_test) = mnist.load()
    x_train = (x_train.astype(np.float32) / 255.0)[..., None]
    x_test = (x_test.astype(np.float32) / 255.0)[..., None]
  x_train = _images("x_train", x_train)
  y_train = _labels("y_train", y_train, len(x_train), 10)
  key = (_fingerprint(x_train, y_train), epochs, seed)
  if key in _FEATURE_CACHE:
    return _FEATURE_CACHE[key]
  keras.utils.set_random_seed(seed)
  inputs = keras.Input(x_train.shape[1:])
  h = keras.layers.Conv2D(32, 3, activation="relu")(inputs)
  h = keras.layers.MaxPooling2D(2)(h)
  h = keras.layers.Conv2D(64, 3, activation="relu")(h)
  h = keras.layers.MaxPooling2D(2)(h)
  h = keras.layers.Flatten()(h)
  features = keras.layers.Dense(128, activation="relu", name="features")(h)
  classifier = keras.Model(inputs, keras.layers.Dense(10)(features))
  classifier.compile(optimizer=keras.optimizers.Adam(1e-3),
                     loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                     metrics=["accuracy"])
  classifier.fit(x_train, y_train, epochs=epochs, batch_size=128, verbose=0)
  accuracy = None
  if x_test is not None:
    accuracy = float(classifier.evaluate(x_test, y_test.astype(np.int32), batch_size=1000,
                                         verbose=0)[1])
  result = (keras.Model(inputs, features, name="mnist_features"), accuracy)
  _FEATURE_CACHE[key] = result
  return result


def clear_feature_cache():
  """Forgets the cached feature extractors."""
  _FEATURE_CACHE.clear()


def frechet_distance_from_features(features_a, features_b) -> float:
  """``||mu_a - mu_b||^2 + Tr(S_a + S_b - 2 (S_a S_b)^{1/2})`` for feature rows ``[n, d]``.

  Means and covariances (``n - 1`` normalisation) in float64; the matrix square root is
  ``scipy.linalg.sqrtm``'s, real part (imaginary round-off dropped).  Each set needs n >= 2.
  """
  import scipy.linalg  # pylint: disable=g-import-not-at-top
  a, b = np.asarray(features_a, np.float64), np.asarray(features_b, np.float64)
  for name, f in (("features_a", a), ("features_b", b)):
    if f.ndim != 2 or f.shape[0] < 2:
      raise ValueError(f"{name} must be [n >= 2, d] feature rows, got shape {f.shape}.")
  if a.shape[1] != b.shape[1]:
    raise ValueError(f"features_a has {a.shape[1]} features per row, features_b {b.shape[1]}.")
  mu_a, mu_b = a.mean(0), b.mean(0)
  cov_a, cov_b = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
  with warnings.catch_warnings():  # singular products (dead ReLU units) are fine here
    warnings.simplefilter("ignore")
    root = scipy.linalg.sqrtm(cov_a @ cov_b)
  root = np.real(root)
  value = float(np.sum((mu_a - mu_b) ** 2) + np.trace(cov_a + cov_b - 2.0 * root))
  return max(value, 0.0)


def frechet_distance(x_a, x_b, feature_model) -> float:
  """Frechet distance between two image sets in ``feature_model``'s feature space (>= 0).

  ``feature_model``: e.g. the first element of :func:`mnist_feature_extractor`'s result.
  """
  x_a, x_b = _images("x_a", x_a), _images("x_b", x_b)
  fa = feature_model.predict(x_a, batch_size=1000, verbose=0)
  fb = feature_model.predict(x_b, batch_size=1000, verbose=0)
  return frechet_distance_from_features(fa, fb)


def save_sample_grid(images, path, *, columns=10, title=None):
  """Saves ``images`` (``[n, H, W]`` or ``[n, H, W, 1]``, values in [0, 1]) as a PNG grid.

  Row-major tiling, ``columns`` per row (integer >= 1), 1-pixel gaps; values are clipped to
  [0, 1] and drawn in grey scale.  Returns ``path``.  Drawn on its own figure and Agg canvas:
  matplotlib's backend and pyplot's figures are left as they are.
  """
  # pylint: disable=g-import-not-at-top
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  from matplotlib.figure import Figure
  # pylint: enable=g-import-not-at-top
  columns = _checks.check_integer("columns", columns, minimum=1)
  images = _images("images", images)
  if images.ndim == 4 and images.shape[-1] == 1:
    images = images[..., 0]
  if images.ndim != 3:
    raise ValueError(f"images must be [n, H, W] or [n, H, W, 1], got shape {images.shape}.")
  n, h, w = images.shape
  rows = -(-n // columns)
  grid = np.ones((rows * (h + 1) + 1, columns * (w + 1) + 1), np.float32)
  for i, img in enumerate(np.clip(images, 0.0, 1.0)):
    r, c = divmod(i, columns)
    grid[1 + r * (h + 1):1 + r * (h + 1) + h, 1 + c * (w + 1):1 + c * (w + 1) + w] = img
  fig = Figure(figsize=(columns * 0.6 + 0.2, rows * 0.6 + (0.5 if title else 0.2)))
  FigureCanvasAgg(fig)
  ax = fig.add_axes([0, 0, 1, 0.92 if title else 1])
  ax.imshow(grid, cmap="gray", vmin=0.0, vmax=1.0, interpolation="nearest")
  ax.axis("off")
  if title:
    fig.suptitle(title, fontsize=8)
  fig.savefig(path, dpi=100)
  return path


#: The fixed set of TSTR classifiers for tables (:func:`tabular_classifier`).
TABULAR_CLASSIFIERS = ("logistic_regression", "random_forest", "gradient_boosting", "mlp")


def tabular_classifier(name, seed=0):
  """An unfitted scikit-learn classifier of :data:`TABULAR_CLASSIFIERS` (fixed settings).

  * ``"logistic_regression"``: standardise (fitted on the training rows), then
    ``LogisticRegression(max_iter=1000)`` (L2, C = 1).
  * ``"random_forest"``: ``RandomForestClassifier(n_estimators=100, random_state=seed)``.
  * ``"gradient_boosting"``: ``HistGradientBoostingClassifier(random_state=seed)`` (100
    boosting iterations of depth-unlimited trees with 31 leaves, learning rate 0.1).
  * ``"mlp"``: standardise, then ``MLPClassifier(hidden_layer_sizes=(100,), max_iter=300,
    random_state=seed)`` (Adam, ReLU).
  """
  # pylint: disable=g-import-not-at-top
  try:
    from sklearn import ensemble, linear_model, neural_network, pipeline, preprocessing
  except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("tabular TSTR needs scikit-learn: pip install 'tf_dpkit[tabular]'.") \
        from error
  # pylint: enable=g-import-not-at-top
  name = _checks.check_choice("classifier", name, TABULAR_CLASSIFIERS)
  seed = _checks.check_integer("seed", seed, minimum=0, maximum=2**32 - 1)
  scaled = lambda model: pipeline.make_pipeline(preprocessing.StandardScaler(), model)
  if name == "logistic_regression":
    return scaled(linear_model.LogisticRegression(max_iter=1000))
  if name == "random_forest":
    return ensemble.RandomForestClassifier(n_estimators=100, random_state=seed, n_jobs=1)
  if name == "gradient_boosting":
    return ensemble.HistGradientBoostingClassifier(random_state=seed)
  return scaled(neural_network.MLPClassifier(hidden_layer_sizes=(100,), max_iter=300,
                                             random_state=seed))


def _binary(name, y):
  y = np.asarray(y)
  if y.ndim != 1 or not np.isin(y, (0, 1)).all():
    raise ValueError(f"{name} must be a 1-D array of 0/1 labels, got {y.dtype} {y.shape}.")
  return y.astype(np.int64)


def _scores(name, s, n):
  s = np.asarray(s, np.float64)
  if s.shape != (n,) or not np.isfinite(s).all():
    raise ValueError(f"{name} must be {n} finite scores, got shape {s.shape}.")
  return s


def binary_auroc(y_true, scores) -> float:
  """Area under the ROC curve: ``P(s_pos > s_neg) + P(s_pos = s_neg) / 2`` over all
  (positive, negative) pairs, in [0, 1] (the Mann-Whitney statistic, ties counted half).

  Needs at least one positive and one negative label.
  """
  y = _binary("y_true", y_true)
  s = _scores("scores", scores, len(y))
  pos, neg = int(y.sum()), int(len(y) - y.sum())
  if pos == 0 or neg == 0:
    raise ValueError("binary_auroc needs both labels 0 and 1 in y_true.")
  from scipy import stats  # pylint: disable=g-import-not-at-top
  ranks = stats.rankdata(s)  # average ranks for ties
  return float((ranks[y == 1].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def binary_auprc(y_true, scores) -> float:
  """Area under the precision-recall curve as average precision:
  ``sum_k (R_k - R_{k-1}) P_k`` over the distinct score thresholds from the highest down
  (``P_k``, ``R_k``: precision and recall of "score >= k-th threshold"; tied scores enter
  together), in [0, 1]; scikit-learn's ``average_precision_score``.  Needs a positive label.
  """
  y = _binary("y_true", y_true)
  s = _scores("scores", scores, len(y))
  pos = int(y.sum())
  if pos == 0:
    raise ValueError("binary_auprc needs at least one label 1 in y_true.")
  order = np.argsort(-s, kind="stable")
  s, y = s[order], y[order]
  last = np.r_[np.flatnonzero(np.diff(s) != 0), len(s) - 1]  # end of each tie group
  tp = np.cumsum(y)[last]
  precision = tp / (last + 1.0)
  recall = tp / pos
  return float(np.sum(np.diff(np.r_[0.0, recall]) * precision))


def _tabular_inputs(x_synthetic, y_synthetic, x_test, y_test, classifiers, test_name):
  """Checked arrays and classifier names shared by the tabular TSTR functions."""
  xs, xt = np.asarray(x_synthetic, np.float64), np.asarray(x_test, np.float64)
  for name, x in (("x_synthetic", xs), (test_name, xt)):
    if x.ndim != 2 or x.shape[0] < 1 or not np.isfinite(x).all():
      raise ValueError(f"{name} must be a non-empty finite [n, d] array, got shape {x.shape}.")
  if xs.shape[1] != xt.shape[1]:
    raise ValueError(f"x_synthetic has {xs.shape[1]} features, {test_name} {xt.shape[1]}.")
  ys, yt = _binary("y_synthetic", y_synthetic), _binary("y_" + test_name[2:], y_test)
  if len(ys) != len(xs) or len(yt) != len(xt):
    raise ValueError(f"y_synthetic / y_{test_name[2:]} must have one label per row of "
                     f"x_synthetic / {test_name}.")
  classifiers = tuple(_checks.check_choice("classifiers", c, TABULAR_CLASSIFIERS)
                      for c in classifiers)
  if not classifiers:
    raise ValueError("classifiers must name at least one of " + ", ".join(TABULAR_CLASSIFIERS))
  return xs, ys, xt, yt, classifiers


def _tabular_probabilities(xs, ys, xt, classifiers, seed):
  """``{name: P(label 1 | row)}`` on the rows ``xt`` of each classifier fitted on the synthetic
  rows (constant ``ys[0]`` when the synthetic labels hold one class only)."""
  out = {}
  for name in classifiers:
    if len(np.unique(ys)) < 2:
      out[name] = np.full(len(xt), float(ys[0]))
    else:
      model = tabular_classifier(name, seed).fit(xs, ys)
      out[name] = model.predict_proba(xt)[:, list(model.classes_).index(1)]
  return out


def tstr_tabular(x_synthetic, y_synthetic, x_test, y_test, *,
                 classifiers=TABULAR_CLASSIFIERS, seed=0) -> dict:
  """Train on synthetic rows, test on real rows, for a binary label.

  Each classifier of ``classifiers`` (:func:`tabular_classifier`, seeded with ``seed``) is
  fitted on ``(x_synthetic, y_synthetic)`` and scores the real test rows by its probability
  of label 1; if the synthetic labels hold one class only, no classifier can be fitted and
  every score is constant (AUROC 0.5, AUPRC the test prevalence).  The real test data are read
  once per classifier, for the final scores only.

  Args:
    x_synthetic: ``[n, d]`` finite features and ``[n]`` 0/1 labels.
    y_synthetic: see ``x_synthetic`` (described together).
    x_test: ``[m, d]`` real features and ``[m]`` 0/1 labels (both labels present).
    y_test: see ``x_test`` (described together).
    classifiers: names from :data:`TABULAR_CLASSIFIERS`.
    seed: integer in [0, 2**32).

  Returns:
    ``{"auroc": {name: value}, "auprc": {name: value}, "auroc_mean": ..., "auprc_mean":
    ...}`` (means over ``classifiers``), all in [0, 1].
  """
  xs, ys, xt, yt, classifiers = _tabular_inputs(x_synthetic, y_synthetic, x_test, y_test,
                                                classifiers, "x_test")
  auroc, auprc = {}, {}
  for name, score in _tabular_probabilities(xs, ys, xt, classifiers, seed).items():
    auroc[name], auprc[name] = binary_auroc(yt, score), binary_auprc(yt, score)
  return {"auroc": auroc, "auprc": auprc,
          "auroc_mean": float(np.mean(list(auroc.values()))),
          "auprc_mean": float(np.mean(list(auprc.values())))}


def tstr_tabular_record_scores(x_synthetic, y_synthetic, x_records, y_records, *,
                               classifiers=TABULAR_CLASSIFIERS, class_weights=(1.0, 1.0),
                               seed=0) -> np.ndarray:
  """Per real record: how well the synthetic-trained classifiers label it, in [0, 1].

  ``score_i = w[y_i] * mean_c p_c(y_i | x_i)``: ``p_c`` the probability that classifier ``c``
  of ``classifiers`` (fitted on the synthetic rows exactly as in :func:`tstr_tabular`) gives
  record i's own label, ``w`` = ``class_weights``.  Each entry depends on its own record only
  (the classifiers see only synthetic rows), so one record moves the sum of the scores by at
  most ``max(w)`` <= 1: the bounded per-record scores that
  :func:`tf_dpkit.selection.select_privately` needs to choose among generators (for a fixed
  number of records: with replace-one adjacency).  With ``p1`` the fraction of label 1, the
  weights ``w = (p1 / (1 - p1), 1)`` make the sum ``n1 (mean_1 + mean_0)`` (``n1`` records of
  label 1, ``mean_c`` the mean unweighted score over label c): the class-balanced sum, equal
  weight to each class as AUROC gives.  ``p1`` must be a public number (e.g. from the data
  set's description), never computed from the private records.

  Args:
    x_synthetic: ``[n, d]`` finite features and ``[n]`` 0/1 labels.
    y_synthetic: see ``x_synthetic`` (described together).
    x_records: ``[m, d]`` real features and ``[m]`` 0/1 labels.
    y_records: see ``x_records`` (described together).
    classifiers: names from :data:`TABULAR_CLASSIFIERS`.
    class_weights: ``(w0, w1)``, each finite and in [0, 1] (public constants).
    seed: integer in [0, 2**32).

  Returns:
    ``[m]`` float64 scores in [0, 1].
  """
  xs, ys, xr, yr, classifiers = _tabular_inputs(x_synthetic, y_synthetic, x_records,
                                                y_records, classifiers, "x_records")
  weights = np.asarray(class_weights, np.float64)
  if (weights.shape != (2,) or not np.isfinite(weights).all() or np.any(weights < 0.0)
      or np.any(weights > 1.0)):
    raise ValueError(f"class_weights must be two values (w0, w1) in [0, 1], got "
                     f"{class_weights!r}.")
  probabilities = _tabular_probabilities(xs, ys, xr, classifiers, seed)
  p1 = np.mean(np.stack(list(probabilities.values())), axis=0)
  own = np.where(yr == 1, p1, 1.0 - p1)
  return np.clip(weights[yr] * own, 0.0, 1.0)
