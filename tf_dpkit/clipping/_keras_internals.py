"""Every private Keras 3 internal the fast path relies on, in one place.

The fast path must run a functional model's layer graph itself (to execute trainable layers by
their rules) and must replay a layer's ``call`` with exactly the arguments Keras resolved
(``training``, masks).  Keras offers no public API for either, so these wrappers are the only
code in tf_dpkit that touches ``keras.src``; a Keras upgrade that moves them breaks here, not
silently elsewhere.
"""
from __future__ import annotations

import contextlib

import keras
from keras.src import backend as keras_backend
from keras.src.models import functional as keras_functional


def layer_graph(model):
  """The Keras functional graph that runs ``model`` (Sequential or functional), else None."""
  if isinstance(model, keras.Sequential):
    return getattr(model, "_functional", None)
  if isinstance(model, keras_functional.Functional):
    return model
  return None


def graph_nodes(graph):
  """All nodes of a functional graph (each one call of an operation)."""
  for nodes in graph._nodes_by_depth.values():  # pylint: disable=protected-access
    yield from nodes


def graph_depths(graph):
  """``(depth, nodes)`` pairs of a functional graph (inputs have the largest depth)."""
  return list(graph._nodes_by_depth.items())  # pylint: disable=protected-access


def run_graph(graph, x, operation_fn):
  """Runs ``graph`` on inputs ``x`` calling ``operation_fn(layer)(*args, **kwargs)`` per node."""
  x = graph._standardize_inputs(x)  # pylint: disable=protected-access
  return graph._run_through_graph(x, operation_fn=operation_fn)  # pylint: disable=protected-access


def node_input_tensors(node):
  """The symbolic (Keras) tensors a graph node's call reads."""
  return list(node.arguments.keras_tensors)


def node_call_arguments(node, values):
  """``(args, kwargs)`` of a graph node's call with each symbolic tensor ``t`` replaced by
  ``values[id(t)]`` (other arguments as recorded)."""
  return node.arguments.fill_in(values)


def clear_added_losses(layer):
  """Forgets the losses ``layer`` (and its sublayers) recorded with ``add_loss``."""
  layer._clear_losses()  # pylint: disable=protected-access


def training_call(layer):
  """``layer``'s ``__call__`` with ``training=True`` injected as Keras's functional graph does."""
  return keras_functional.operation_fn(layer, training=True)


def sublayers(layer, include_self=False):
  """All layers nested in ``layer`` (depth first)."""
  return layer._flatten_layers(include_self=include_self)  # pylint: disable=protected-access


def added_losses(layer):
  """Losses ``layer`` itself recorded with ``add_loss`` during its last call."""
  return getattr(layer, "_losses", None)


def autocast_scope(layer):
  """The scope in which ``layer.call`` reads its variables in its compute dtype.

  Keras's ``Layer.__call__`` enters it for mixed-precision layers; code that runs ``call`` (or
  a rule) directly must enter it too, else float32 variables meet bfloat16 inputs.
  """
  if layer.compute_dtype != layer.variable_dtype and keras_backend.is_float_dtype(
      layer.compute_dtype):
    return keras_backend.AutocastScope(layer.compute_dtype)
  return contextlib.nullcontext()


def keras_mask(tensor):
  """The Keras mask attached to ``tensor`` (None if none)."""
  return keras_backend.get_keras_mask(tensor)


def set_keras_mask(tensor, mask):
  """Attaches ``mask`` to ``tensor`` as Keras does for masking layers (no-op if impossible)."""
  try:
    keras_backend.set_keras_mask(tensor, mask)
  except AttributeError:
    pass


def no_autocast():
  """A scope in which Keras variables read in their own (variable) dtype."""
  return keras_backend.AutocastScope(None)


@contextlib.contextmanager
def recording_call(layer):
  """Within the block, every ``layer.call(*args, **kwargs)`` is recorded exactly as Keras made
  it (``training`` and masks resolved by ``Layer.__call__``).

  Yields ``(calls, call)``: the list that receives ``(args, kwargs)`` per call, and the
  layer's own ``call`` to replay them with.
  """
  original = layer.call
  calls = []

  def spy(*args, **kwargs):
    calls.append((args, kwargs))
    return original(*args, **kwargs)
  object.__setattr__(layer, "call", spy)
  try:
    yield calls, original
  finally:
    object.__delattr__(layer, "call")


@contextlib.contextmanager
def calls_replaced(layers_and_calls):
  """Within the block, ``layer.call`` is ``call`` for each ``(layer, call)`` pair."""
  replaced = []
  try:
    for layer, call in layers_and_calls:
      object.__setattr__(layer, "call", call)
      replaced.append(layer)
    yield
  finally:
    for layer in replaced:
      object.__delattr__(layer, "call")


def unbuilt_layers(model):
  """Names of ``model``'s layers (nested ones too) whose weights do not exist yet."""
  return [layer.name for layer in sublayers(model, include_self=True) if not layer.built]


def build_from_batch(model, data) -> None:
  """Builds an unbuilt model (and its compiled loss, metrics and optimizer) from one batch, as
  Keras ``fit`` does before the first step (a Sequential model without ``Input``).  Layers that a
  symbolic build leaves unbuilt (a sublayer first called inside a recurrent cell's loop) are
  built by one forward pass whose output is discarded."""
  if unbuilt_layers(model):
    model._symbolic_build(data_batch=data)  # pylint: disable=protected-access
  if unbuilt_layers(model):
    x, _, _ = keras.utils.unpack_x_y_sample_weight(data)
    model(x, training=False)


# ------------------------------------------------------------------------------------------
# Keras 3.15's fit under MultiWorkerMirroredStrategy (several workers).  Two of its steps fail
# there, for any model: the symbolic build reduces the first distributed batch with
# `strategy.reduce("MEAN", batch, axis=None)`, which the collective strategy cannot do eagerly
# ("Attempt to convert a value (PerReplica...)"), and the train function reduces scalar logs
# with `strategy.reduce("MEAN", value, axis=0)` ("Invalid reduction dimension 0 for input with
# 0 dimensions").  DP models work around both (tf_dpkit.dp_models).


def multi_worker(model) -> bool:
  """True when ``model`` trains under a multi-worker collective strategy."""
  from keras.src.backend.tensorflow import trainer as tf_trainer  # pylint: disable=g-import-not-at-top
  strategy = getattr(model, "_distribute_strategy", None)
  return strategy is not None and tf_trainer._collective_all_reduce_multi_worker(strategy)  # pylint: disable=protected-access


def _local_element_spec(iterator):
  """One local replica's element spec of the epoch iterator's distributed dataset, or None."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  try:
    spec = iterator._distributed_dataset.element_spec  # pylint: disable=protected-access
  except (AttributeError, TypeError, NotImplementedError):
    return None

  def local(s):
    values = getattr(s, "_value_specs", None)  # PerReplicaSpec: one spec per local replica
    return values[0] if values else s
  spec = tf.nest.map_structure(local, spec)
  if all(isinstance(s, tf.TensorSpec) for s in tf.nest.flatten(spec)):
    return spec
  return None


def symbolic_build_from_local_batch(model, iterator=None, data_batch=None) -> None:
  """Keras's symbolic build from one local replica's element spec (no reduction).

  The build needs only shapes and dtypes, so it reads them from the dataset's element spec
  and draws no batch: pulling one would open (and throw away) an iterator, which for the
  fresh-pass Poisson pipelines (:mod:`tf_dpkit.data`) would make ``fit`` under a strategy
  train the second pass instead of the first.  Falls back to this worker's first local
  batch when the spec cannot be read.
  """
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  strategy = model.distribute_strategy
  if iterator is not None and data_batch is None:
    data_batch = _local_element_spec(iterator)
  if iterator is not None and data_batch is None:
    for _, _, it in iterator:
      batch = next(it)
      data_batch = tf.nest.map_structure(
          lambda v: (strategy.experimental_local_results(v)[0]
                     if isinstance(v, tf.distribute.DistributedValues) else v), batch)
      break
  with strategy.scope():
    model._symbolic_build(data_batch=data_batch)  # pylint: disable=protected-access


def logs_for_multi_worker(logs):
  """Scalar logs as shape [1], which Keras's multi-worker reduction (axis 0) accepts."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf.nest.map_structure(
      lambda v: tf.reshape(v, [1]) if isinstance(v, tf.Tensor) and v.shape.rank == 0 else v,
      logs)


def rnn_loop():
  """Keras's backend recurrence ``rnn(step, sequences, initial_states, go_backwards, mask,
  unroll, input_length, zero_output_for_mask, return_all_outputs)``, the loop its RNN layers
  run (masks, reversal and zeroed outputs handled exactly as the layers do)."""
  return keras_backend.rnn
