"""The optimizer swap at the fast path's speed: ``optimizer.minimize(vector_loss, var_list,
tape=tape)`` on the outputs of a DP model.

A DP model called with ``training=True`` under a tape records the fast path's forward phase; a
DP optimizer's ``compute_gradients`` takes that record when ``var_list`` is exactly the model's
trainable variables, checks the per-example contract of the vector loss with random
power-of-two probes, and runs the fast path's backward phase.  Anything else takes the exact
Jacobian path and says once what it costs.  Design: ``docs/design/clipping_swap.md``.
"""
from __future__ import annotations

import contextlib
import threading
import warnings
import weakref

import keras
import numpy as np
import tensorflow as tf
from tensorflow.python.eager import record as tape_record  # pylint: disable=g-direct-tensorflow-import

from tf_dpkit.clipping import _keras_internals as internals
from tf_dpkit.clipping import fast_path
from tf_dpkit.clipping import groups as groups_lib
from tf_dpkit.clipping.clipped_sum import issue_clipped_sum
from tf_dpkit.clipping.per_example import split_into_microbatches
from tf_dpkit.clipping.rules._linear import per_example_groups

#: Random projections of the vector loss checked per step (the contract check in the module
#: docstring).
CONTRACT_PROBES = 3

_STATE = threading.local()
# model -> the record of its latest traced training call and how many there were since the
# last take_record (weak: a model that is gone takes its record with it).
_RECORDS = weakref.WeakKeyDictionary()


class SwapRecord:
  """One traced training call of a DP model (see the module docstring)."""

  def __init__(self, model, y_pred, records, finite_examples, inner_tape, batch):
    self.model = model
    self.y_pred = y_pred
    self.records = records
    self.finite_examples = finite_examples
    self.inner_tape = inner_tape
    self.batch = batch
    self.graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    self.calls = 1


@contextlib.contextmanager
def suspended():
  """Within the block, DP models called under a tape run as Keras runs them (tf_dpkit's own
  clipping paths call the model inside their tapes)."""
  depth = getattr(_STATE, "suspended", 0)
  _STATE.suspended = depth + 1
  try:
    yield
  finally:
    _STATE.suspended = depth


def _training_argument(args, kwargs):
  if "training" in kwargs:
    return kwargs["training"]
  return args[1] if len(args) > 1 else None


def should_trace(model, args, kwargs) -> bool:
  """True when this call of the DP model ``model`` is to be traced for the swap path: called
  with ``training=True`` (and no other arguments) while a tape records, on concrete inputs,
  the model built and its graph usable by the fast path."""
  if getattr(_STATE, "suspended", 0) or not tape_record.could_possibly_record():
    return False
  if _training_argument(args, kwargs) is not True or not args:
    return False
  if len(args) > 2 or set(kwargs) - {"training"}:
    return False
  leaves = tf.nest.flatten(args[0])
  if not leaves or any(isinstance(t, keras.KerasTensor) for t in leaves):
    return False
  if internals.unbuilt_layers(model):
    return False
  return fast_path.fast_path_available(model)


def traced_call(model, x):
  """Runs ``model`` on ``x`` with the fast path's forward phase under an inner persistent tape,
  records the call for :func:`take_record`, and returns the outputs."""
  x = tf.nest.map_structure(
      lambda t: tf.convert_to_tensor(t) if isinstance(t, (np.ndarray, np.generic)) else t, x)
  graph = fast_path.check_fast_path_model(model)
  batch = tf.shape(tf.nest.flatten(x)[0])[0]
  inner = tf.GradientTape(persistent=True)
  with inner:
    y_pred, records, finite_examples = fast_path.forward_with_rules(model, graph, x, batch)
  pending = _RECORDS.get(model)
  record = SwapRecord(model, y_pred, records, finite_examples, inner, batch)
  if pending is not None and pending.graph is record.graph:
    record.calls = pending.calls + 1
  _RECORDS[model] = record
  return y_pred


def take_record(var_list):
  """``(record, None)`` for the DP model whose trainable variables are exactly ``var_list`` and
  that was called once with ``training=True`` under a tape since the last step, else
  ``(None, why)`` (``why``: None when no DP model was traced).  The record is consumed."""
  current = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
  wanted = [id(v) for v in var_list]
  why = None
  for model, record in list(_RECORDS.items()):
    if record.graph is not current:
      continue
    have = [id(v) for v in model.trainable_variables]
    if len(wanted) != len(have) or set(wanted) != set(have):
      why = (f"var_list is not the trainable variables of the DP model {model.name!r} "
             "called under the tape")
      continue
    del _RECORDS[model]
    if record.calls != 1:
      return None, (f"the DP model {model.name!r} was called {record.calls} times with "
                    "training=True under the tape (the swap path differentiates one call)")
    return record, None
  return None, why


def _output_tensors(y_pred):
  return [t for t in tf.nest.flatten(y_pred) if isinstance(t, tf.Tensor) and t.dtype.is_floating]


MIXING_MESSAGE = (
    "The vector loss is not per example: entry i depends on the model's outputs for example "
    "j in another microbatch (dL_i/dy_j != 0), e.g. a batch mean repeated or a loss centred on "
    "the batch mean. Removing one example could then move the clipped sum by more than "
    "l2_norm_clip, so the noise would not cover it. Compute the loss with reduction=None so "
    "that entry i is example i's loss alone (e.g. keras.losses.SparseCategoricalCrossentropy("
    "reduction=None)).")


def _probe_weights(batch, group_size, seed):
  """[P + 1, B]: row 0 ones, rows 1..P entries ``+-2^e`` (``e`` in 0..3) drawn per microbatch
  from ``seed`` (stateless: no random state of the process is touched)."""
  groups = (batch + group_size - 1) // group_size
  seed = tf.stack([tf.cast(seed, tf.int64), tf.constant(0x5a17, tf.int64)])
  draws = tf.random.stateless_uniform([CONTRACT_PROBES, groups], seed, minval=0, maxval=8,
                                      dtype=tf.int64)
  values = tf.pow(2.0, tf.cast(draws % 4, tf.float32)) * tf.where(draws < 4, 1.0, -1.0)
  rows = tf.gather(values, tf.range(batch) // group_size, axis=1)
  return tf.concat([tf.ones([1, batch]), rows], axis=0)


def _mixing(jacobians, weights):
  """Whether row ``p`` of a loss-output Jacobian differs from ``weights[p] *`` row 0 at any
  entry where both are finite (module docstring)."""
  bad = []
  for jac in jacobians:
    rank = jac.shape.rank
    base = jac[:1]
    scale = tf.reshape(tf.cast(weights[1:], jac.dtype),
                       tf.concat([tf.shape(weights[1:]), tf.ones([rank - 2], tf.int32)], 0))
    probes = jac[1:]
    finite = tf.logical_and(tf.math.is_finite(probes), tf.math.is_finite(base))
    bad.append(tf.reduce_any(tf.logical_and(finite, tf.not_equal(probes, base * scale))))
  return tf.reduce_any(tf.stack(bad))


def clipped_sum_from_record(record, vector_loss, var_list, tape, l2_norm_clip,
                            num_microbatches=None, loss_scale=None, probe_seed=0):
  """The clipped sum of the per-microbatch gradients of ``vector_loss`` for the traced call
  ``record`` (module docstring), aligned with ``var_list``.

  Args:
    record: from :func:`take_record`.
    vector_loss: float [B] recorded on ``tape`` from ``record``'s outputs.
    var_list: the model's trainable variables (any order).
    tape: the caller's tape (one gradient call is made on it).
    l2_norm_clip: C > 0, or the optimizer's per-layer clip norms (resolved for the model here).
    num_microbatches: None (one per example) or M dividing B.
    loss_scale: optional static loss scale ``S > 0``.
    probe_seed: an integer (tensor) that changes from step to step (the optimizer's step
      counter), keying the contract check's random projections.
  """
  model = record.model
  if isinstance(l2_norm_clip, groups_lib.LayerClipNorms):  # per-layer (tf_dpkit.clipping.groups)
    l2_norm_clip = l2_norm_clip.resolve(model)
  batch = record.batch
  groups = per_example_groups(batch) if num_microbatches is None else num_microbatches
  group_size = batch // tf.maximum(groups, 1)
  scale = 1.0 if loss_scale is None else float(loss_scale)
  with tape:  # recorded on the caller's tape, which differentiates it
    # Checks the rank (a vector), a non-empty batch and that M divides B.
    split_into_microbatches(vector_loss, num_microbatches)
    per_example = tf.convert_to_tensor(vector_loss)
    size_check = tf.debugging.assert_equal(
        tf.shape(per_example)[0], batch, message="The vector loss must have one entry per "
        "example of the model's training call (shape [batch])")
    with tf.control_dependencies([size_check]):
      per_example = tf.identity(per_example)
    target = per_example * tf.cast(scale / tf.cast(group_size, tf.float64), per_example.dtype)
  outputs = _output_tensors(record.y_pred)
  with tape:
    weights = _probe_weights(batch, group_size, probe_seed)
    projected = tf.linalg.matvec(tf.cast(weights, target.dtype), target)  # [P + 1]
  jacobians = tape.jacobian(projected, outputs, experimental_use_pfor=True)
  if all(j is None for j in jacobians):
    raise ValueError(_NOT_CONNECTED.format(name=model.name))
  jacobians = [tf.zeros(tf.concat([[CONTRACT_PROBES + 1], tf.shape(y)], 0), y.dtype)
               if j is None else j for j, y in zip(jacobians, outputs)]
  mixing = _mixing(jacobians, weights)
  if tf.executing_eagerly():
    if bool(mixing):
      raise ValueError(MIXING_MESSAGE)
    checks = []
  else:
    checks = [tf.debugging.Assert(tf.logical_not(mixing), [MIXING_MESSAGE])]
  with tf.control_dependencies(checks):
    output_grads = [tf.identity(j[0]) for j in jacobians]
  layer_grads = record.inner_tape.gradient(
      outputs, [trace.watched for _, trace in record.records],
      output_gradients=[tf.cast(g, y.dtype) for g, y in zip(output_grads, outputs)],
      unconnected_gradients=tf.UnconnectedGradients.ZERO)
  clipped = fast_path.backward_with_rules(
      model, record.inner_tape, record.records, layer_grads, record.finite_examples,
      per_example, groups, group_size, batch, scale, l2_norm_clip)
  index = {id(v): i for i, v in enumerate(model.trainable_variables)}
  return issue_clipped_sum([clipped.grads[index[id(v)]] for v in var_list], clipped.norms,
                           clipped.losses, l2_norm_clip)


_NOT_CONNECTED = (
    "The vector loss does not depend on the outputs of the last training call of the DP model "
    "{name!r} recorded on this tape: compute the loss from `model(x, training=True)` called "
    "once inside the same `with tf.GradientTape() as tape:` block.")


def jacobian_path_message(owner, why=None) -> str:
  """What the exact Jacobian path costs and which form is fast (said once per optimizer)."""
  reason = f" ({why})" if why else (
      " (no DP model traced the call this loss comes from: a plain Keras model, a subclassed "
      "model, or a graph the fast path cannot use)")
  return (
      f"{owner}.minimize/compute_gradients is clipping a vector loss through its full "
      "Jacobian d loss / d var_list, a [B, P] matrix (B examples x P weights) that costs about "
      f"B backward passes per step{reason}. The per-layer fast path costs about one: build the "
      "model as tf_dpkit.DPSequential or tf_dpkit.DPModel (a Keras Sequential or functional "
      "layer graph), call it once with training=True inside the tape and pass var_list="
      "model.trainable_variables; or use tf_dpkit.private_gradients(optimizer, model, loss_fn, "
      "x, y).")


def warn_jacobian_path(optimizer, why=None, *, message=None, stacklevel=3) -> None:
  """Warns once per ``optimizer`` that it takes the Jacobian path (at trace time under
  ``tf.function``): ``message``, or :func:`jacobian_path_message` with ``why``."""
  if getattr(optimizer, "_dp_warned_jacobian", False):
    return
  object.__setattr__(optimizer, "_dp_warned_jacobian", True)
  if message is None:
    message = jacobian_path_message(type(optimizer).__name__, why)
  warnings.warn(message, UserWarning, stacklevel=stacklevel)


def clipped_sum_for_optimizer(optimizer, vector_loss, var_list, tape, l2_norm_clip,
                              num_microbatches):
  """The swap path when a traced DP model call matches ``var_list``, else None (after warning
  once that the Jacobian path is taken)."""
  record, why = take_record(var_list) if tape is not None else (None, None)
  if record is None:
    warn_jacobian_path(optimizer, why)
    return None
  return clipped_sum_from_record(
      record, vector_loss, var_list, tape, l2_norm_clip, num_microbatches,
      loss_scale=optimizer.static_loss_scale(record.model),
      probe_seed=getattr(optimizer, "iterations", 0))
