"""The per-example contract: how a batch becomes one loss and one weight per example.

DP-SGD bounds the influence of one example only if the gradient it contributes depends on that
example alone.  This module is the one place that turns a loss function's output into the
``[B]`` per-example losses the clipping paths differentiate, and it enforces the contract:

* a loss must return ``[B]`` or ``[B, d_1, ..., d_r]`` where ``(d_1, ..., d_r)`` is a prefix of
  the prediction's non-batch shape (e.g. ``[B, T]`` per-token losses of ``[B, T, V]``
  predictions).  A scalar (already reduced over the batch), a wrong leading dimension or any
  other trailing shape (e.g. ``[B, B]`` from broadcasting ``[B] - [B, 1]``) is refused;
* losses known to compare examples within a batch (``keras.losses.Circle``) are refused;
* on the fast path the loss is evaluated on each example alone (:func:`map_examples`), so no
  entry can depend on another example whatever the loss function does; Keras's own
  per-example losses (exact classes, :func:`loss_is_isolated_per_example`) already are, and are
  evaluated on the batch.

:func:`map_examples` maps a function over the examples of a batch with ``tf.vectorized_map``
and, for functions that ``pfor`` cannot vectorise (recurrent layers with masks, stateful
random ops), with ``tf.map_fn``: slower, but every example is still computed alone.
"""
from __future__ import annotations

import contextlib
import logging

import keras
import tensorflow as tf

from tf_dpkit import _autograph
from tf_dpkit.clipping import _keras_internals

__all__ = ["check_loss_is_per_example", "check_per_example_shape", "isolated_per_example_losses",
           "loss_is_isolated_per_example", "map_examples", "mark_per_example", "pfor_is_safe",
           "per_example_loss_function", "per_example_losses", "per_example_weights"]

# Losses whose value for one example depends on the other examples of the batch.
_BATCH_MIXING_LOSSES = tuple(
    cls for cls in (getattr(keras.losses, "Circle", None),) if cls is not None)
_BATCH_MIXING_FUNCTIONS = tuple(
    fn for fn in (getattr(keras.losses, "circle", None),) if fn is not None)


# Keras losses (exact classes, and their functions) whose batched value for example i is computed
# from example i alone: evaluating them on the whole batch is already isolated per example.
_ISOLATED_LOSS_CLASSES = tuple(getattr(keras.losses, name) for name in (
    "SparseCategoricalCrossentropy", "CategoricalCrossentropy", "BinaryCrossentropy",
    "BinaryFocalCrossentropy", "CategoricalFocalCrossentropy", "MeanSquaredError",
    "MeanAbsoluteError", "MeanAbsolutePercentageError", "MeanSquaredLogarithmicError", "Huber",
    "LogCosh", "Hinge", "SquaredHinge", "CategoricalHinge", "KLDivergence", "Poisson",
    "CosineSimilarity") if hasattr(keras.losses, name))
_ISOLATED_LOSS_FUNCTIONS = tuple(getattr(keras.losses, name) for name in (
    "sparse_categorical_crossentropy", "categorical_crossentropy", "binary_crossentropy",
    "mean_squared_error", "mean_absolute_error", "huber", "log_cosh", "hinge",
    "squared_hinge", "kl_divergence", "poisson") if hasattr(keras.losses, name))


def _loss_axis(loss):
  """The ``axis`` a Keras loss object (``LossFunctionWrapper``) reduces over, else None."""
  owner = getattr(loss, "__self__", loss)
  return (getattr(owner, "_fn_kwargs", None) or {}).get("axis")


def loss_is_isolated_per_example(loss) -> bool:
  """True for Keras's own per-example losses (exact classes, their ``call`` methods and loss
  functions): their value for one example never reads another example's entries.

  A loss object configured with an ``axis`` is isolated only for ``axis=-1`` or a positive
  ``axis``: any other negative axis is the batch axis for some prediction rank (``axis=-2`` of
  ``[B, K]`` predictions), so such a loss is evaluated on each example alone instead.  (``-1``
  is the batch axis only of ``[B]`` predictions, whose reduction over it is a scalar, which
  :func:`check_per_example_shape` refuses.)
  """
  owner = getattr(loss, "__self__", loss)
  if type(owner) in _ISOLATED_LOSS_CLASSES:
    axis = _loss_axis(loss)
    return axis is None or (isinstance(axis, int) and (axis == -1 or axis >= 1))
  return any(loss is fn for fn in _ISOLATED_LOSS_FUNCTIONS)


def check_loss_is_per_example(loss) -> None:
  """Raises ``ValueError`` for a loss known to mix the examples of a batch: ``Circle``, and a
  Keras loss object configured to reduce over axis 0 (``CategoricalCrossentropy(axis=0)``:
  axis 0 is the batch axis for every prediction shape), also given as a bound method of such
  a loss object (``keras.losses.Circle().call``)."""
  owner = getattr(loss, "__self__", None)  # a bound method: judge the loss it belongs to
  if owner is not None and owner is not loss:
    check_loss_is_per_example(owner)
  if isinstance(loss, _BATCH_MIXING_LOSSES) or any(loss is fn for fn in _BATCH_MIXING_FUNCTIONS):
    raise ValueError(
        f"{getattr(loss, 'name', None) or getattr(loss, '__name__', loss)!r} compares examples "
        "within a batch, so one example's loss depends on the others and its gradient cannot be "
        "bounded by clipping. DP-SGD needs a loss computed from each example alone.")
  axis = _loss_axis(loss)
  axes = [axis] if isinstance(axis, int) else list(axis) if isinstance(axis, (list, tuple)) else []
  if 0 in axes:
    raise ValueError(
        f"Loss {type(getattr(loss, '__self__', loss)).__name__}(axis={axis!r}) reduces over axis "
        "0, the batch axis, so one example's loss depends on the others and its gradient "
        "cannot be bounded by clipping. Use the axis of the classes or features (axis=-1).")
  inner = getattr(loss, "fn", None)  # keras.losses.LossFunctionWrapper
  if inner is not None and inner is not loss:
    check_loss_is_per_example(inner)


def _static_dim(dim):
  return tf.compat.dimension_value(dim)


def check_per_example_shape(values, batch=None, prediction_shape=None,
                            name="the per-example loss function") -> list:
  """Checks that ``values`` has one leading entry per example; returns run-time assertions.

  Args:
    values: the loss function's output.
    batch: the batch size (int or scalar tensor), or None when unknown.
    prediction_shape: ``tf.TensorShape`` of the predictions, or None; when given, the
      trailing shape of ``values`` must be a prefix of the prediction's non-batch shape.
    name: how the error names ``values``.

  Raises ``ValueError`` for shapes that are wrong statically; returns (possibly empty) a list of
  ``tf.debugging`` assertions for what only the running step can tell.
  """
  shape = values.shape
  if shape.rank == 0:
    raise ValueError(
        f"{name} returned a scalar; DP-SGD needs one loss per example (shape [batch] or [batch, ...]). "
        "Use an unreduced loss, e.g. a keras.losses function or a Loss with reduction=None.")
  checks = []
  if shape.rank is None:
    return checks
  static_batch = batch if isinstance(batch, int) else None
  leading = _static_dim(shape[0])
  if static_batch is not None and leading is not None and leading != static_batch:
    raise ValueError(f"{name} has shape {shape}, but the batch has {static_batch} examples: its "
                     "leading dimension must be the batch (one entry per example).")
  if batch is not None and (static_batch is None or leading is None):
    checks.append(tf.debugging.assert_equal(
        tf.shape(values, out_type=tf.int32)[0], tf.cast(batch, tf.int32),
        message=f"{name}'s leading dimension must be the batch size (one entry per example)"))
  if prediction_shape is not None and prediction_shape.rank is not None and shape.rank > 1:
    trailing, allowed = shape[1:], prediction_shape[1:]
    ok = trailing.rank <= allowed.rank and all(
        a is None or b is None or a == b
        for a, b in zip(trailing.as_list(), allowed.as_list()))
    if not ok:
      raise ValueError(
          f"{name} has shape {shape} for predictions of shape {prediction_shape}: beyond the "
          "batch axis a per-example loss may only keep leading axes of the prediction (e.g. "
          "[batch, time]). A shape like [batch, batch] comes from broadcasting y_true against "
          "y_pred (e.g. [batch] - [batch, 1]) and mixes examples; reshape y_true to match "
          "y_pred.")
  return checks


@_autograph.graph_code
def per_example_losses(values, batch, mask=None, name="the per-example loss function",
                       prediction_shape=None) -> tf.Tensor:
  """Returns ``values`` ([B] or [B, ...]) as [B] per-example losses (mean over trailing axes).

  With a ``mask`` (a Keras output mask, [B, T] or matching ``values``'s leading axes) and
  ``values`` of rank >= 2, each example's loss is the mean over its unmasked positions,
  ``sum_t m_t v_t / max(1, sum_t m_t)``; an example with no unmasked position gets 0.  Shapes are
  checked by :func:`check_per_example_shape`.  Half-precision losses (mixed-precision
  policies) are returned as float32.
  """
  values = tf.convert_to_tensor(values)
  if values.dtype in (tf.float16, tf.bfloat16):  # mixed precision: reduce in float32
    values = tf.cast(values, tf.float32)
  checks = check_per_example_shape(values, batch, prediction_shape, name)
  with tf.control_dependencies(checks):
    if mask is not None and values.shape.rank is not None and values.shape.rank >= 2:
      mask = tf.cast(mask, values.dtype)
      while mask.shape.rank < values.shape.rank:
        mask = mask[..., None]
      mask = tf.broadcast_to(mask, tf.shape(values))
      masked_sum = tf.reduce_sum(tf.reshape(values * mask, [batch, -1]), axis=1)
      count = tf.reduce_sum(tf.reshape(mask, [batch, -1]), axis=1)
      return masked_sum / tf.maximum(count, 1.0)
    return tf.reduce_mean(tf.reshape(values, [batch, -1]), axis=1)


@_autograph.graph_code
def per_example_weights(sample_weight, batch) -> tf.Tensor:
  """Returns ``sample_weight`` ([B] or [B, 1]) as float32 [B]; ones when it is ``None``.

  Raises ``ValueError`` for any other static shape (e.g. per-timestep weights [B, T]): each
  example must enter the clipped sum with one scalar weight.
  """
  if sample_weight is None:
    return tf.ones([batch], tf.float32)
  sample_weight = tf.convert_to_tensor(sample_weight)
  shape = sample_weight.shape
  if shape.rank is not None and (shape.rank == 0 or any(
      d is not None and d != 1 for d in shape.as_list()[1:])):
    raise ValueError(
        f"sample_weight must have shape [batch] or [batch, 1] (one weight per example), got "
        f"{shape}.")
  return tf.cast(tf.reshape(sample_weight, [batch]), tf.float32)


def pfor_is_safe(layers) -> bool:
  """False when vectorising ``layers`` with ``pfor`` is known to crash the process: under
  oneDNN, TensorFlow 2.21's kernels for the batched einsums ``pfor`` makes of ``EinsumDense``
  (and so ``MultiHeadAttention``) corrupt memory and abort."""
  from tf_dpkit.clipping.rules.conv import onednn_enabled  # pylint: disable=g-import-not-at-top
  if not onednn_enabled():
    return True
  return not any(isinstance(sub, keras.layers.EinsumDense)
                 for layer in layers for sub in _keras_internals.sublayers(layer, True))


def _pfor_failure_is_quiet(record) -> bool:
  """Logging filter: drops ``pfor``'s own log of an op it failed to convert (the error, then
  the op's whole definition and where it was created, at ERROR level), which
  :func:`map_examples` answers by falling back to ``tf.map_fn``; every other record passes."""
  message = str(record.msg)
  return not (message.startswith("Got error while pfor was converting op") or
              message == "%s\ncreated at:\n  %s")


@contextlib.contextmanager
def _quiet_pfor_failures():
  """While active, :func:`_pfor_failure_is_quiet` filters TensorFlow's logger (removed on
  exit: the process's logging is left as it was)."""
  logger = logging.getLogger("tensorflow")
  logger.addFilter(_pfor_failure_is_quiet)
  try:
    yield
  finally:
    logger.removeFilter(_pfor_failure_is_quiet)


def map_examples(fn, elems, vectorize=True):
  """``tf.stack([fn(e) for e in unstack(elems)])`` with each example computed alone.

  Uses ``tf.vectorized_map``; when ``pfor`` cannot vectorise ``fn`` (it raises while tracing,
  as for masked recurrent layers, or an ``AttributeError`` from inside ``pfor`` for a
  ``tf.cond`` on a value of the example) or ``vectorize`` is False (see :func:`pfor_is_safe`), uses
  ``tf.map_fn``, whose output signature is read from ``fn`` applied to the first example.

  Args:
    fn: maps one example (the structure of ``elems`` without the leading axis) to a nest of
      tensors.
    elems: nest of tensors sharing the leading (batch) dimension.
    vectorize: whether to try ``tf.vectorized_map`` first.
  """
  if vectorize:
    try:
      with _quiet_pfor_failures():
        return tf.vectorized_map(fn, elems)
    except (TypeError, ValueError, NotImplementedError, tf.errors.OpError, LookupError,
            AttributeError):
      pass  # an error of ``fn`` itself is raised again by ``fn(first)`` below
  first = tf.nest.map_structure(lambda t: t[0], elems)
  signature = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), fn(first))
  return tf.map_fn(fn, elems, fn_output_signature=signature)


def per_example_loss_function(loss_fn):
  """``f(y_true, y_pred) -> [b]``: ``loss_fn``'s output reduced per example.

  ``loss_fn(y_true, y_pred)`` may return ``[b]`` or ``[b, ...]``; the result is the mean over
  the trailing axes (over unmasked positions when ``y_pred`` carries a Keras mask), with the
  shape checked by :func:`check_per_example_shape`.  Losses known to mix examples are refused.
  Functions made here (or by ``tf_dpkit.dp_models`` for several outputs) are returned unchanged.
  """
  if getattr(loss_fn, "_tf_dpkit_per_example", False):
    return loss_fn
  check_loss_is_per_example(loss_fn)

  def reduced(y_true, y_pred):
    pred = tf.nest.flatten(y_pred)[0]
    return per_example_losses(loss_fn(y_true, y_pred), tf.shape(pred)[0],
                              mask=_keras_internals.keras_mask(pred),
                              prediction_shape=pred.shape)
  return mark_per_example(reduced, isolated=loss_is_isolated_per_example(loss_fn))


def mark_per_example(fn, isolated: bool):
  """Marks ``fn`` as a reduced per-example loss; ``isolated``: its batched values are already
  computed per example alone (see :func:`loss_is_isolated_per_example`)."""
  fn._tf_dpkit_per_example = True  # pylint: disable=protected-access
  fn._tf_dpkit_isolated = isolated  # pylint: disable=protected-access
  return fn


def isolated_per_example_losses(loss_fn, y_true, y_pred, batch) -> tf.Tensor:
  """[B] losses, each from ``loss_fn`` applied to that example alone (see the module docstring).

  Args:
    loss_fn: ``f(y_true, y_pred) -> [b]`` per-example losses (see
      :func:`per_example_loss_function`) for a batch of ``b`` examples.
    y_true, y_pred: nests of tensors with leading dimension ``batch`` (``y_true`` may be None);
      Keras masks attached to ``y_pred``'s tensors are sliced with them.
    batch: the batch size (scalar tensor or int).
  """
  loss_fn = per_example_loss_function(loss_fn)
  if getattr(loss_fn, "_tf_dpkit_isolated", False):  # Keras's own losses: batched is isolated
    return loss_fn(y_true, y_pred)
  flat_pred = tf.nest.flatten(y_pred)
  checks = [tf.debugging.assert_equal(tf.shape(t)[0], tf.cast(batch, tf.int32),
                                      message="y_pred's leading dimension must be the batch")
            for t in flat_pred]
  masks = {str(i): m for i, m in enumerate(_keras_internals.keras_mask(t) for t in flat_pred)
           if m is not None}
  present = {"y_pred": flat_pred, "masks": masks}
  if y_true is not None:
    present["y_true"] = y_true

  def one(example):
    preds = [t[None] for t in example["y_pred"]]
    for i, mask in example["masks"].items():
      _keras_internals.set_keras_mask(preds[int(i)], mask[None])
    one_true = tf.nest.map_structure(lambda t: t[None], example.get("y_true"))
    values = loss_fn(one_true, tf.nest.pack_sequence_as(y_pred, preds))
    return tf.reshape(values, [-1])[0]

  with tf.control_dependencies(checks):
    return map_examples(one, present)
