"""White-box gradient canaries for one-run and many-run audits of DP-SGD.

Two canary heads, each giving every canary a coordinate no real example touches, so that a
canary goes through the model's real loss, per-example clipping, noise, normalisation and
optimizer: :func:`canary_model` (a logit row per canary, ``logits = f(x) + c @ W``) and
:func:`dirac_canary_model` (Dirac canaries: a fixed unit gradient ``-scale e_j`` on an
embedding head, clipped to exactly ``C``).  Each canary is included independently w.p. 1/2
(:func:`make_canaries`; the bits are the auditor's secret); recorders keep the head after
every step and :func:`canary_scores` turns that into one score per canary.  Construction and
the maths: docs/design/auditing.md ("Canaries").
"""
from __future__ import annotations

import dataclasses

import keras
import numpy as np

from analysis import _checks

SCORES = ("sum", "step_range")


@dataclasses.dataclass(frozen=True)
class CanarySet:
  """``num_canaries`` canaries and which of them are included (the auditor's secret).

  Attributes:
    labels: int ``[m]``, canary ``j``'s label ``y_j`` in ``[0, num_classes)``.
    included: bool ``[m]``, canary ``j`` is in the training set (each w.p. 1/2, independently).
    scale: ``s > 0``, the value of a canary's code entry (its input on the canary head).
    num_classes: ``K``, the number of logits.
  """
  labels: np.ndarray
  included: np.ndarray = dataclasses.field(repr=False)
  scale: float
  num_classes: int

  @property
  def num_canaries(self) -> int:
    """``m``."""
    return int(self.labels.shape[0])

  def codes(self, indices=None) -> np.ndarray:
    """float32 ``[len(indices), m]``: ``scale * e_j`` for each canary ``j`` in ``indices``
    (all canaries by default)."""
    indices = np.arange(self.num_canaries) if indices is None else np.asarray(indices)
    codes = np.zeros((indices.shape[0], self.num_canaries), np.float32)
    codes[np.arange(indices.shape[0]), indices] = self.scale
    return codes


def make_canaries(num_canaries: int, num_classes: int, *, scale: float = 100.0,
                  seed: int | None = None) -> CanarySet:
  """``num_canaries`` canaries with uniform random labels, each included with probability 1/2.

  Args:
    num_canaries: m, an integer >= 2.
    num_classes: K >= 2, the model's number of logits.
    scale: s > 0 (default 100), a canary's code value; large, so that clipping binds and the
      clipped gradient lies on the canary's own row of the head.
    seed: ``None`` (OS entropy) or an integer seed of NumPy's generator for the labels and the
      inclusion bits.  The bits must stay hidden from whatever is audited.
  """
  m = _checks.check_integer("num_canaries", num_canaries, minimum=2)
  k = _checks.check_integer("num_classes", num_classes, minimum=2)
  scale = _checks.check_finite_positive("scale", scale)
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, k, size=m)
  included = rng.random(m) < 0.5
  return CanarySet(labels, included, scale, k)


def training_data(x, y, canaries: CanarySet):
  """The training set of the audited run: the real ``(x, y)`` plus the included canaries.

  Returns ``((x_all, c_all), y_all)``: the real examples with canary code 0, then each
  included canary as an all-zero ``x`` with its code ``scale e_j`` and label ``y_j`` -- the
  two-input form :func:`canary_model` takes (e.g. for ``tf_dpkit.data.poisson_batches``).

  Args:
    x: real inputs ``[n, ...]`` (float); y: integer labels ``[n]`` in ``[0, K)``.
    canaries: from :func:`make_canaries`.
  """
  x = np.asarray(x)
  y = np.asarray(y)
  if x.ndim < 1 or y.ndim != 1 or x.shape[0] != y.shape[0] or x.shape[0] < 1:
    raise ValueError(f"x and y must hold the same number n >= 1 of examples (y one label per "
                     f"example), got shapes {x.shape} and {y.shape}.")
  inside = np.flatnonzero(canaries.included)
  x_all = np.concatenate([x, np.zeros((inside.size,) + x.shape[1:], x.dtype)])
  codes = np.concatenate([np.zeros((x.shape[0], canaries.num_canaries), np.float32),
                          canaries.codes(inside)])
  y_all = np.concatenate([y, canaries.labels[inside].astype(y.dtype)])
  return (x_all, codes), y_all


def _checked_canary_model_arguments(base, num_canaries, model_class):
  """``(m, model_class)`` for a canary model builder: ``base`` one input and ``[batch, K]``
  logits, ``num_canaries`` an integer >= 2, ``model_class`` default ``tf_dpkit.DPModel``."""
  m = _checks.check_integer("num_canaries", num_canaries, minimum=2)
  if len(base.inputs) != 1 or len(base.outputs) != 1 or len(base.outputs[0].shape) != 2:
    raise ValueError("base must be a built Keras model with one input and one output of "
                     f"logits [batch, K]; got inputs {base.inputs} and outputs {base.outputs}.")
  if model_class is None:
    from tf_dpkit.dp_models import DPModel  # pylint: disable=g-import-not-at-top
    model_class = DPModel
  return m, model_class


def canary_model(base: keras.Model, num_canaries: int, *, model_class=None) -> keras.Model:
  """``base`` with a canary head: inputs ``[x, c]``, logits ``base(x) + c @ W`` (module doc).

  Args:
    base: a Keras model with one input and ``K`` logits ``[batch, K]``.
    num_canaries: m, the canary code's length.
    model_class: the class of the returned functional model; default ``tf_dpkit.DPModel``.

  The head is the layer named ``"canary_head"`` (a ``Dense(K, use_bias=False)``, kernel 0).
  """
  m, model_class = _checked_canary_model_arguments(base, num_canaries, model_class)
  num_classes = int(base.outputs[0].shape[-1])
  x = keras.Input(base.inputs[0].shape[1:], name="x")
  code = keras.Input((m,), name="canary_code")
  head = keras.layers.Dense(num_classes, use_bias=False, kernel_initializer="zeros",
                            name="canary_head")
  logits = keras.layers.Add()([base(x), head(code)])
  return model_class([x, code], logits)


class _TrajectoryRecorder(keras.callbacks.Callback):
  """Reads a ``[m]`` vector of canary weights (``_read``) before training and after every step."""

  def __init__(self, layer_name: str):
    super().__init__()
    self._layer_name = layer_name
    self._values = []

  def _read(self):
    raise NotImplementedError

  def on_train_begin(self, logs=None):
    if not self._values:
      self._read()

  def on_train_batch_end(self, batch, logs=None):
    self._read()

  @property
  def trajectory(self) -> np.ndarray:
    """``[steps + 1, m]``: row 0 before training, row t after step t."""
    return np.array(self._values)


class CanaryRecorder(_TrajectoryRecorder):
  """Records ``W[j, y_j]`` of the canary head before training and after every step.

  After ``fit``, :attr:`trajectory` is float64 ``[steps + 1, m]``.
  """

  def __init__(self, canaries: CanarySet, layer_name: str = "canary_head"):
    super().__init__(layer_name)
    self._rows = np.arange(canaries.num_canaries)
    self._labels = canaries.labels

  def _read(self):
    kernel = self.model.get_layer(self._layer_name).kernel.numpy()
    self._values.append(kernel[self._rows, self._labels].astype(np.float64))



def canary_scores(trajectory, score: str = "sum") -> np.ndarray:
  """One white-box score per canary from a :class:`CanaryRecorder` trajectory.

  Args:
    trajectory: ``[steps + 1, m]`` values of ``W[j, y_j]``.
    score: ``"sum"``: ``W_T - W_0``, the whole update along the canary's direction (the
      sufficient statistic when every step's noise is independent); ``"step_range"``: the
      largest minus the smallest per-step update ``W_t - W_(t-1)`` (sensitive to noise that
      repeats across steps: it is exactly 0 for an excluded canary then).
  """
  score = _checks.check_choice("score", score, SCORES)
  values = np.asarray(trajectory, np.float64)
  if values.ndim != 2 or values.shape[0] < 2:
    raise ValueError("trajectory must be [steps + 1, num_canaries] with steps >= 1, got shape "
                     f"{values.shape}.")
  if score == "sum":
    return values[-1] - values[0]
  steps = np.diff(values, axis=0)
  return steps.max(axis=0) - steps.min(axis=0)


def black_box_scores(model: keras.Model, canaries: CanarySet, loss_fn, *,
                     input_shape=None) -> np.ndarray:
  """Black-box scores: minus each canary's loss under the trained ``model`` (float64 ``[m]``).

  Needs only the model's outputs (no weights, no trajectory): an included canary was trained on,
  so its loss tends to be lower.  Weaker than :func:`canary_scores` but it audits what a
  black-box attacker sees.

  Args:
    model: the trained :func:`canary_model`.
    canaries: the :class:`CanarySet` it was audited with.
    loss_fn: ``f(y_true, y_pred) -> [batch]`` per-example losses.
    input_shape: shape of one real input; default the model's first input's.
  """
  shape = tuple(model.inputs[0].shape[1:]) if input_shape is None else tuple(input_shape)
  m = canaries.num_canaries
  x = np.zeros((m,) + shape, np.float32)
  predictions = model([x, canaries.codes()], training=False)
  return -np.asarray(loss_fn(canaries.labels, predictions), np.float64)


# ------------------------------------------------------------------------------------------
# Dirac canaries: each canary's gradient is a fixed unit vector in its own coordinate.

DIRAC_HEAD = "dirac_canary_head"


def dirac_canary_model(base: keras.Model, num_canaries: int, *, model_class=None) -> keras.Model:
  """``base`` plus a Dirac canary head (docs/design/auditing.md, "Dirac canaries").

  Inputs ``[x, index]``: ``index`` an int32 ``[batch]``, canary ``j``'s number for a canary
  and 0 for a real example.  Output ``[batch, K + 1]``: ``base(x)``'s ``K`` logits followed
  by ``w[index]``, ``w`` in R^m the head (an ``Embedding(m, 1)`` named ``"dirac_canary_head"``,
  initialised to 0).  Train it with :func:`dirac_loss`, under which a real example never
  touches ``w`` and canary ``j``'s gradient is ``-scale e_j`` (on ``w`` only).

  Args:
    base: a Keras model with one input and ``K`` logits ``[batch, K]``.
    num_canaries: m, an integer >= 2.
    model_class: the returned model's class; default ``tf_dpkit.DPModel``.
  """
  m, model_class = _checked_canary_model_arguments(base, num_canaries, model_class)
  x = keras.Input(base.inputs[0].shape[1:], name="x")
  index = keras.Input((), dtype="int32", name="canary_index")
  head = keras.layers.Embedding(m, 1, embeddings_initializer="zeros", name=DIRAC_HEAD)
  outputs = keras.layers.Concatenate(name="logits_and_canary")([base(x), head(index)])
  return model_class([x, index], outputs)


def dirac_loss(scale: float = 10.0):
  """The per-example loss of :func:`dirac_canary_model`: ``f(y_true, y_pred) -> [batch]``.

  A real example (label ``y >= 0``) has the softmax cross-entropy of ``y_pred[:, :K]``
  (logits); a canary (label ``-1``) has ``-scale * y_pred[:, K]`` (its head entry ``w_j``),
  whose gradient is ``-scale e_j``: with ``scale >= C`` it is clipped to exactly ``-C e_j``, so
  gradient descent moves ``w_j`` up by ``lr C / n`` each time the canary is in a batch and no
  other example moves ``w_j`` at all.

  Args:
    scale: > 0, the canary gradient's norm before clipping (default 10; keep it >= the clip
      norm C so that clipping binds).
  """
  scale = _checks.check_finite_positive("scale", scale)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top

  def loss(y_true, y_pred):
    y_true = tf.reshape(tf.cast(y_true, tf.int32), [-1])
    logits, canary = y_pred[:, :-1], y_pred[:, -1]
    is_canary = y_true < 0
    cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(
        labels=tf.maximum(y_true, 0), logits=logits)
    return tf.where(is_canary, -scale * tf.cast(canary, cross_entropy.dtype), cross_entropy)
  return loss


def dirac_training_data(x, y, canaries: CanarySet):
  """The audited run's training set for :func:`dirac_canary_model`: ``((x_all, index_all),
  y_all)``, the real ``(x, y)`` with index 0, then each included canary ``j`` as an all-zero
  ``x`` with index ``j`` and label ``-1``.

  Args:
    x: real inputs ``[n, ...]``; y: integer labels ``[n]`` in ``[0, K)``.
    canaries: from :func:`make_canaries` (only ``included`` is used).
  """
  x = np.asarray(x)
  y = np.asarray(y)
  if x.ndim < 1 or y.ndim != 1 or x.shape[0] != y.shape[0] or x.shape[0] < 1:
    raise ValueError(f"x and y must hold the same number n >= 1 of examples (y one label per "
                     f"example), got shapes {x.shape} and {y.shape}.")
  if not np.issubdtype(y.dtype, np.integer) or np.any(y < 0):
    raise ValueError("y must be integer class labels >= 0 (-1 marks the canaries).")
  inside = np.flatnonzero(canaries.included).astype(np.int32)
  x_all = np.concatenate([x, np.zeros((inside.size,) + x.shape[1:], x.dtype)])
  index = np.concatenate([np.zeros(x.shape[0], np.int32), inside])
  y_all = np.concatenate([y.astype(np.int32), np.full(inside.size, -1, np.int32)])
  return (x_all, index), y_all


class DiracRecorder(_TrajectoryRecorder):
  """Records the Dirac head ``w`` (float64 ``[m]``) before training and after every step;
  :attr:`trajectory` is ``[steps + 1, m]`` (row t after step t), for :func:`canary_scores`."""

  def __init__(self, layer_name: str = DIRAC_HEAD):
    super().__init__(layer_name)

  def _read(self):
    table = self.model.get_layer(self._layer_name).embeddings.numpy()
    self._values.append(table[:, 0].astype(np.float64))

