"""Which Keras layer graphs compute each example's output from that example alone.

:func:`batch_mixing` clears each node of a layer graph by its exact Keras class and
configuration, or by a probe run once on a random batch; the fast path is used only when every
node is cleared, otherwise the vectorized path (one example per batch) computes the gradients.
A probe is evidence, not proof.  Design, allowlist and the probe's limits:
``docs/design/clipping_independence.md``.
"""
from __future__ import annotations

import re
import threading
import warnings
import weakref
from typing import NamedTuple, Optional

import keras
import numpy as np
import tensorflow as tf

from tf_dpkit.clipping import _keras_internals as internals

#: Examples in a probe batch.
PROBE_BATCH = 5
# Size given to unknown non-batch dimensions of a probe input.
_PROBE_DIM = 3
# Random batches on which the gradient check runs.
_PROBE_TRIALS = 2


class Mixing(NamedTuple):
  """A node that is not known to act per example: ``layer`` (its name, nested models' layers
  as ``"model/layer"``) and ``reason`` (a sentence)."""
  layer: str
  reason: str


def _classes(*names):
  return frozenset(getattr(keras.layers, n) for n in names if hasattr(keras.layers, n))


# Exact classes whose output for example i is computed from example i alone, whatever their
# configuration (their activation, where they have one, is checked separately).
_PER_EXAMPLE = _classes(
    "InputLayer", "Dense", "Conv1D", "Conv2D", "Conv3D", "Conv1DTranspose", "Conv2DTranspose",
    "Conv3DTranspose", "SeparableConv1D", "SeparableConv2D", "DepthwiseConv1D",
    "DepthwiseConv2D", "Embedding", "ReLU", "LeakyReLU", "PReLU", "ELU", "Dropout",
    "SpatialDropout1D", "SpatialDropout2D", "SpatialDropout3D", "GaussianDropout",
    "GaussianNoise", "AlphaDropout", "Reshape", "Flatten", "Permute", "RepeatVector",
    "Cropping1D", "Cropping2D", "Cropping3D", "ZeroPadding1D", "ZeroPadding2D", "ZeroPadding3D",
    "UpSampling1D", "UpSampling2D", "UpSampling3D", "Masking", "Identity", "MaxPooling1D",
    "MaxPooling2D", "MaxPooling3D", "AveragePooling1D", "AveragePooling2D", "AveragePooling3D",
    "GlobalMaxPooling1D", "GlobalMaxPooling2D", "GlobalMaxPooling3D", "GlobalAveragePooling1D",
    "GlobalAveragePooling2D", "GlobalAveragePooling3D", "AdaptiveAveragePooling1D",
    "AdaptiveAveragePooling2D", "AdaptiveAveragePooling3D", "AdaptiveMaxPooling1D",
    "AdaptiveMaxPooling2D", "AdaptiveMaxPooling3D", "Add", "Subtract", "Multiply", "Average",
    "Maximum", "Minimum", "Attention", "AdditiveAttention", "MultiHeadAttention",
    "GroupQueryAttention", "Rescaling", "CategoryEncoding", "Hashing", "Discretization",
    "IntegerLookup", "StringLookup")
# Exact classes whose ``axis`` (``axes`` for Dot) attribute must exclude the batch axis.
_AXIS_ATTRIBUTE = {cls: attr for names, attr in (
    (("LayerNormalization", "RMSNormalization", "GroupNormalization", "UnitNormalization",
      "Softmax", "Normalization", "Concatenate"), "axis"), (("Dot",), "axes"))
                   for cls in _classes(*names)}
_RECURRENT = _classes("SimpleRNN", "GRU", "LSTM", "ConvLSTM1D", "ConvLSTM2D", "ConvLSTM3D")
_CELLS = _classes("SimpleRNNCell", "GRUCell", "LSTMCell")

_verdicts = weakref.WeakKeyDictionary()  # layer graph -> Mixing or None
_warned = weakref.WeakKeyDictionary()  # layer graph or model -> True
_single_example_checked = weakref.WeakKeyDictionary()  # model -> True


def _is_keras_activation(fn) -> bool:
  """Keras's own activations act element-wise or along the last axis."""
  name = getattr(fn, "__name__", None)
  if not name or not getattr(fn, "__module__", "").startswith("keras.src.activations"):
    return False
  try:
    return keras.activations.get(name) is fn
  except (ValueError, TypeError):
    return False


def _activations_ok(*holders) -> Optional[str]:
  for holder in holders:
    for attr in ("activation", "recurrent_activation"):
      fn = getattr(holder, attr, None)
      if fn is not None and not _is_keras_activation(fn):
        return f"its {attr} {getattr(fn, '__name__', fn)!r} is not one of Keras's own"
  return None


def _batch_axis_in(axes, rank) -> bool:
  if axes is None:
    return False
  axes = [axes] if isinstance(axes, int) else list(axes)
  if rank is None:  # unknown rank: only a non-negative axis other than 0 is safe
    return any(a <= 0 for a in axes)
  return any(a % rank == 0 for a in axes)


def _einsum_keeps_batch(equation) -> bool:
  match = re.fullmatch(r"\s*([a-zA-Z.]+)\s*,\s*([a-zA-Z.]+)\s*->\s*([a-zA-Z.]+)\s*", equation)
  if not match:
    return False
  inputs, kernel, output = match.groups()
  if inputs.startswith("..."):
    return output.startswith("...") and "..." not in kernel
  return output[0] == inputs[0] and inputs[0] not in kernel


def _cells_ok(cell) -> bool:
  if isinstance(cell, keras.layers.StackedRNNCells):
    return all(_cells_ok(c) for c in cell.cells)
  return type(cell) in _CELLS and _activations_ok(cell) is None


def _static_verdict(layer, rank):
  """``("ok", None)``, ``("mixes", reason)`` or ``("probe", None)`` for one layer by its exact
  class and configuration; ``rank``: its (first) input's rank, or None."""
  cls = type(layer)
  if cls in _PER_EXAMPLE:
    reason = _activations_ok(layer)
    return ("probe", None) if reason else ("ok", None)
  if cls is keras.layers.EinsumDense:
    return ("ok", None) if (_einsum_keeps_batch(layer.equation)
                            and _activations_ok(layer) is None) else ("probe", None)
  if cls in _AXIS_ATTRIBUTE:
    attr = _AXIS_ATTRIBUTE[cls]
    axes = getattr(layer, attr)
    if _batch_axis_in(axes, rank):
      return "mixes", (f"{cls.__name__}({attr}={axes!r}) acts along axis 0 of its input, the "
                       "batch axis, so each example's output depends on the other examples")
    return "ok", None
  if cls is keras.layers.Activation:
    if _activations_ok(layer) is not None:
      return "probe", None
    if rank is not None and rank < 2 and getattr(layer.activation, "__name__", "") in (
        "softmax", "log_softmax", "sparsemax", "glu"):
      return "mixes", (f"Activation({layer.activation.__name__}) on an input of rank {rank} acts "
                       "along its last axis, which is the batch axis")
    return "ok", None
  if cls in _RECURRENT:
    return ("ok", None) if _cells_ok(layer.cell) or (
        cls.__name__.startswith("ConvLSTM") and _activations_ok(layer.cell) is None) else (
            "probe", None)
  if cls is keras.layers.RNN:
    return ("ok", None) if _cells_ok(layer.cell) else ("probe", None)
  if cls is keras.layers.Bidirectional:
    ok = all(_static_verdict(sub, rank)[0] == "ok"
             for sub in (layer.forward_layer, layer.backward_layer))
    return ("ok", None) if ok else ("probe", None)
  if cls is keras.layers.TimeDistributed:
    # The wrapped layer sees [batch * time, ...]: per example on that axis is per example.
    inner, reason = _static_verdict(layer.layer, None if rank is None else rank - 1)
    if inner == "mixes":
      return "mixes", f"its wrapped layer: {reason}"
    return inner, None
  return "probe", None


def _rank(node):
  tensors = internals.node_input_tensors(node)
  if not tensors or tensors[0].shape is None:
    return None
  return len(tensors[0].shape)


def _random_value(spec, batch, rng):
  shape = [batch] + [_PROBE_DIM if d is None else int(d) for d in list(spec.shape)[1:]]
  dtype = tf.as_dtype(spec.dtype)
  if dtype.is_floating:
    return tf.constant(rng.normal(size=shape), dtype)
  if dtype.is_integer:
    return tf.constant(rng.integers(0, 2, size=shape), dtype)
  if dtype == tf.bool:
    return tf.constant(rng.random(shape) < 0.5)
  raise TypeError(f"inputs of dtype {dtype.name} cannot be probed")


def _replace_row(value, row, rng):
  """``value`` with example ``row`` replaced by a different one."""
  array = value.numpy().copy()
  if value.dtype.is_floating:
    array[row] = rng.normal(size=array[row].shape)
  elif value.dtype.is_integer:
    array[row] = 1 - array[row]
  else:
    array[row] = np.logical_not(array[row])
  return tf.constant(array, value.dtype)


def _float_outputs(outputs, batch):
  flat = [t for t in tf.nest.flatten(outputs) if isinstance(t, (tf.Tensor, tf.Variable))]
  for t in flat:
    if t.shape.rank == 0 or int(tf.shape(t)[0]) != batch:
      raise _Mixes(f"its output of shape {t.shape} does not keep the batch of {batch} examples "
                   "as its leading axis")
  return flat


def _restore(variables, saved):
  """Assigns back the values a probe changed (only those: a variable made under a distribution
  strategy is then written only where a probed layer really changed it)."""
  for v, value in zip(variables, saved):
    if not np.array_equal(v.numpy(), value, equal_nan=True):
      v.assign(value)


class _Mixes(Exception):
  pass


def _probe(node) -> Optional[str]:
  """None when the probe finds ``node``'s operation per example, else why it does not."""
  op = node.operation
  specs = internals.node_input_tensors(node)
  leading = {int(s.shape[0]) for s in specs if s.shape and s.shape[0] is not None}
  if len(leading) > 1:
    return "its inputs have different static batch sizes"
  batch = leading.pop() if leading else PROBE_BATCH
  if not 2 <= batch <= 64:
    return f"it needs a batch of {batch} examples, which the probe does not run"
  if isinstance(op, keras.layers.Layer) and internals.unbuilt_layers(op):
    return ("it has sublayers that are not built yet (call the model once on a batch before "
            "training; DPModel.fit does this)")
  call = internals.training_call(op)
  variables = list(getattr(op, "variables", []) or [])
  saved = [v.numpy() for v in variables]
  rng = np.random.default_rng(0)
  try:
    def run(values):
      args, kwargs = internals.node_call_arguments(node, values)
      return call(*args, **kwargs)

    def draw():
      return {id(s): _random_value(s, batch, rng) for s in specs}

    for _ in range(_PROBE_TRIALS):
      values = draw()
      watched = [values[id(s)] for s in specs if values[id(s)].dtype.is_floating]
      with tf.GradientTape(persistent=True) as tape:
        tape.watch(watched)
        outputs = _float_outputs(run(values), batch)
        floats = [tf.cast(t, tf.float32) for t in outputs if t.dtype.is_floating]
        cotangents = [tf.constant(rng.normal(size=t.shape), tf.float32) for t in floats]
        rows = [tf.add_n([tf.reduce_sum(t[i] * r[i]) for t, r in zip(floats, cotangents)])
                for i in range(batch)] if floats else []
      for i, row in enumerate(rows):
        grads = tape.gradient(row, watched, unconnected_gradients=tf.UnconnectedGradients.ZERO)
        for g in grads:
          others = np.delete(tf.convert_to_tensor(g).numpy(), i, axis=0)
          if others.size and not np.all(others == 0):  # NaN fails too
            raise _Mixes(f"the gradient of its output for example {i} with respect to the other "
                         "examples' inputs is not zero on a random batch")
      del tape
    values = draw()
    reference = [t.numpy() for t in _float_outputs(run(values), batch)]
    again = [t.numpy() for t in _float_outputs(run(values), batch)]
    deterministic = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(reference, again))
    if not deterministic and not any(values[id(s)].dtype.is_floating for s in specs):
      return "it is random and has no float input whose gradient could be checked"
    if deterministic:
      for j in range(batch):
        changed = {k: _replace_row(v, j, rng) for k, v in values.items()}
        outputs = [t.numpy() for t in _float_outputs(run(changed), batch)]
        for before, after in zip(reference, outputs):
          keep = np.arange(batch) != j
          if not np.allclose(before[keep], after[keep], rtol=1e-6, atol=1e-7, equal_nan=True):
            raise _Mixes(f"changing example {j}'s input changes other examples' outputs")
    return None
  except _Mixes as mixes:
    return str(mixes)
  except Exception as error:  # pylint: disable=broad-except
    return (f"the probe could not run it on a random batch ({type(error).__name__}: "
            f"{str(error).splitlines()[0] if str(error) else ''})")
  finally:
    _restore(variables, saved)
    if hasattr(op, "_clear_losses"):
      internals.clear_added_losses(op)


def _eagerly(fn):
  """``fn()`` run eagerly, with fresh gradient tapes, wherever the caller is (tracing a
  ``tf.function``, under a strategy's replica context, inside a tape): in a new thread, whose
  TensorFlow and Keras contexts are the defaults.  (``tf.init_scope`` would pause every tape.)"""
  result = {}

  def target():
    try:
      result["value"] = fn()
    except BaseException as error:  # pylint: disable=broad-except
      result["error"] = error
  thread = threading.Thread(target=target, name="tf_dpkit_independence_probe")
  thread.start()
  thread.join()
  if "error" in result:
    raise result["error"]
  return result["value"]


def _node_name(op):
  return getattr(op, "name", None) or type(op).__name__


def _graph_mixing(graph, prefix="") -> tuple:
  """``(Mixing or None, cacheable)`` for the nodes of ``graph`` in forward order."""
  nodes = sorted(((depth, node) for depth, nodes in
                  internals.graph_depths(graph) for node in nodes),
                 key=lambda pair: -pair[0])
  cacheable = True
  for _, node in nodes:
    op = node.operation
    if op is None or node.is_input:
      continue
    name = prefix + _node_name(op)
    inner = internals.layer_graph(op) if isinstance(op, keras.Model) else None
    if inner is not None:
      found, ok = _graph_mixing(inner, name + "/")
      cacheable = cacheable and ok
      if found is not None:
        return found, cacheable
      continue
    status, reason = _static_verdict(op, _rank(node))
    if status == "probe":
      reason = _probe(node)
      status = "ok" if reason is None else "mixes"
      if reason is not None and "not built yet" in reason:
        cacheable = False
    if status == "mixes":
      return Mixing(name, reason), cacheable
  return None, cacheable


def batch_mixing(model) -> Optional[Mixing]:
  """The first node of ``model``'s layer graph not shown to act per example, or None.

  ``model``: a Keras functional or Sequential model (None is returned for any other model: the
  fast path does not run those).  The verdict is computed once per layer graph (see the module
  docstring: allowlisted classes with configuration checks, nested graphs, a probe for the
  rest), eagerly even when called while a ``tf.function`` is traced.
  """
  graph = internals.layer_graph(model)
  if graph is None:
    return None
  if graph in _verdicts:
    return _verdicts[graph]
  found, cacheable = _eagerly(lambda: _graph_mixing(graph))
  if cacheable:
    _verdicts[graph] = found
  return found


def describe(mixing: Mixing) -> str:
  return (f"layer {mixing.layer!r} is not known to treat the examples of a batch "
          f"independently: {mixing.reason}")


def warn_fast_path_refused(model, mixing: Mixing) -> None:
  """Says once per model that the fast path is not used because of ``mixing``."""
  key = internals.layer_graph(model)
  if key is None or key in _warned:
    return
  _warned[key] = True
  warnings.warn(
      f"tf_dpkit: the fast per-layer clipping path is not used for model {model.name!r}: "
      f"{describe(mixing)}. Per-example gradients come from the vectorized path instead, which "
      "computes each example's gradient from that example alone (the clip bound holds; it is "
      "slower). Pass method='vectorized' (DPModel.per_example_method) to choose it explicitly.",
      UserWarning, stacklevel=3)


def warn_if_single_example_gradients_not_finite(model, x) -> None:
  """Warns, once per model, when the gradient of ``model`` on one random example is not finite.

  The vectorized path computes each example's gradient from a batch of that example alone and
  zeroes a non-finite one (it contributes 0, within the clip bound); a model whose layers need
  other examples (a batch standard deviation is 0 for one example, and its square root has no
  finite gradient) then learns nothing.  ``x``: a batch (nest of tensors) giving the inputs'
  dtypes and non-batch shapes; the check runs on random values (normal floats, integers 0/1),
  never on ``x``'s values, so whether it warns does not depend on the private data.
  """
  if model in _single_example_checked:
    return
  _single_example_checked[model] = True
  if internals.layer_graph(model) is not None and batch_mixing(model) is None:
    return  # every node is per example: one example alone behaves as it does in a batch
  specs = tf.nest.map_structure(
      lambda t: tf.TensorSpec([1] + tf.convert_to_tensor(t).shape.as_list()[1:],
                              tf.convert_to_tensor(t).dtype), x)

  def single_example_finite():
    state = list(model.non_trainable_variables)
    saved = [v.numpy() for v in state]
    try:
      rng = np.random.default_rng(1)
      example = tf.nest.map_structure(lambda spec: _random_value(spec, 1, rng), specs)
      variables = model.trainable_variables
      with tf.GradientTape() as tape:
        outputs = [tf.cast(t, tf.float32) for t in tf.nest.flatten(model(example, training=True))
                   if t.dtype.is_floating]
        total = tf.add_n([tf.reduce_sum(t) for t in outputs])
      grads = tape.gradient(total, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO)
      return all(bool(tf.reduce_all(tf.math.is_finite(tf.convert_to_tensor(g)))) for g in grads)
    except Exception:  # pylint: disable=broad-except
      return True  # the check is advisory: a model it cannot run is left to the step itself
    finally:
      _restore(state, saved)
      internals.clear_added_losses(model)
  if _eagerly(single_example_finite):
    return
  mixing = batch_mixing(model)
  cause = (f" ({describe(mixing)})" if mixing is not None else "")
  warnings.warn(
      f"tf_dpkit: model {model.name!r} has a non-finite (NaN or inf) gradient on one random "
      f"example alone{cause}. The vectorized path computes each example's gradient from that "
      "example alone and an example whose gradient is not finite contributes 0, so this model "
      "would learn nothing: a layer that needs other examples of the batch (e.g. a minibatch "
      "standard deviation, which is 0 for one example) cannot be trained with per-example "
      "clipping. Remove it or make it finite for one example (e.g. sqrt(var + eps)).",
      UserWarning, stacklevel=3)
