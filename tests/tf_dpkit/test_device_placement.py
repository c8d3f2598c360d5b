"""Where the DP training step runs: on one device, with no host round trip per step.

What is checked, and how (this file must also protect the GPU path on machines without one):

* ``test_every_op_of_the_traced_step_has_a_gpu_kernel`` (CPU-runnable; the test that guards
  the GPU path here): the DP train step is traced (``DPSequential.fit``'s ``train_step`` for a
  CNN with a depthwise layer, an MLP and an Embedding model; ``optimizer.minimize(vector_loss)``
  and ``tf_dpkit.private_gradients`` + ``apply`` for the MLP) and every op of its graph, nested
  function bodies included, must have a GPU (or device-independent "DEFAULT") kernel registered
  for the dtypes and attributes it uses (``kernels.get_registered_kernels_for_op``, which lists
  the GPU kernels of TensorFlow's CUDA build on any machine).  Allowed without one, as they
  move no device data when soft placement puts them on the host: a string ``Const`` whose only
  consumers are ``Assert`` ops (the assertion messages; ``Assert`` has a DEFAULT kernel taking
  its data in host memory), and int32 shape arithmetic on ``Shape``/``Size``/``Const`` outputs
  (the ``Split`` of a shape in TensorFlow's own pfor, in the ``minimize`` path).  The same
  trace, made without any device scope, must contain no Python callback op (``PyFunc``,
  ``EagerPyFunc``, ``numpy_function``) and no op with a device set by tf_dpkit's code.
* ``test_step_runs_hard_placed_on_device`` (CPU, and GPU where present): with
  ``tf.config.set_soft_device_placement(False)`` the step runs with ``tf.device(dev)`` *inside*
  the ``tf.function``.  That placement matters: TensorFlow traces a function called under an
  outer ``tf.device`` scope without device names on its ops, and its placer puts such ops on
  any device that has a kernel, soft placement or not (``ColocationGraph::GetDevicesForNode``);
  only ops that carry a device name fail for a missing kernel.  The clipped sum, the noised
  gradient and the updated variables must then be on ``dev`` (``.device``).
* ``test_no_host_reads_per_step``: in ``fit`` and in a custom loop, after the first call the
  step is one ``tf.function`` call (no retrace) and tf_dpkit's code reads no tensor on the host
  (``.numpy()``, ``int()``, ``bool()``, ``np.asarray``: all go through ``_numpy``, which is
  counted when the innermost caller outside TensorFlow is one of tf_dpkit's files).  Keras's
  own loop reads one value on the host per ``train_function`` call (``opt_outputs.has_value()``
  in keras/src/backend/tensorflow/trainer.py, Keras 3.15): that sync is Keras's, once per call,
  and ``compile(steps_per_execution=k)`` spreads it over k steps.

What happens on the CPU with soft placement off: every op of these steps (stateless random
ops, ``DepthwiseConv2dNativeBackpropFilter`` of the Conv2D rule with oneDNN, the assertions)
has a CPU kernel, and the hard-placed steps run (the Embedding model's step too, checked by
hand; not part of the hard-placement test).

The kernel test found that the Embedding rule gathered a bool tensor with ``tf.gather_nd``
(no GPU kernel for bool: the op would have run on the host every step); it gathers int32 now
and KNOWN_GPU_GAPS is empty.  Also predicted, not run: under hard placement with an explicit
GPU device scope the assertion messages (string ``Const``) cannot be placed, since no GPU or
DEFAULT kernel exists for a string ``Const``; the GPU case of the hard-placement test therefore
expects that failure while the assertions carry strings.
"""
from __future__ import annotations

import contextlib
import os
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import types_pb2
from tensorflow.python.framework import kernels
from tensorflow.python.framework import op_def_registry
from tensorflow.python.framework import ops as tf_ops

import tf_dpkit
from tf_dpkit import native

TF_DPKIT_DIR = os.path.dirname(os.path.abspath(tf_dpkit.__file__))
HAS_GPU = bool(tf.config.list_physical_devices("GPU"))
DEVICES = [
    pytest.param("CPU", id="CPU"),
    pytest.param("GPU", id="GPU", marks=pytest.mark.skipif(
        not HAS_GPU, reason="no GPU (tf.config.list_physical_devices('GPU') is empty); the GPU "
        "kernels of the traced step are checked on the CPU by "
        "test_every_op_of_the_traced_step_has_a_gpu_kernel")),
]
PY_CALLBACK_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc"}
LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
BATCH = 8

# Ops of a traced step without a GPU kernel, per model: known defects, each with its fix.  The
# kernel test fails when this list is wrong in either direction (a new gap, or a fixed one).
KNOWN_GPU_GAPS = {
    # Ops of tf_dpkit's steps known to lack a GPU kernel, by model name; empty since the
    # Embedding rule gathers int32 instead of bool (GatherNd has no bool GPU kernel).
}


def _cnn():
  return [keras.Input((10, 10, 1)),
          keras.layers.Conv2D(4, 3, strides=2, padding="same", activation="relu"),
          keras.layers.MaxPool2D(2, 1), keras.layers.DepthwiseConv2D(2),
          keras.layers.Flatten(), keras.layers.Dense(3)]


def _mlp():
  return [keras.Input((6,)), keras.layers.Dense(5, activation="relu"), keras.layers.Dense(3)]


def _embedding():
  return [keras.Input((5,), dtype="int32"), keras.layers.Embedding(20, 4),
          keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(3)]


MODELS = {"cnn": _cnn, "mlp": _mlp, "embedding": _embedding}


def _batch(name, seed=0):
  rng = np.random.default_rng(seed)
  x = {"cnn": lambda: rng.random((BATCH, 10, 10, 1), np.float32),
       "mlp": lambda: rng.random((BATCH, 6), np.float32),
       "embedding": lambda: rng.integers(0, 20, (BATCH, 5)).astype(np.int32)}[name]()
  return x, rng.integers(0, 3, BATCH).astype(np.int32)


def _dp_model(name):
  keras.utils.set_random_seed(0)
  model = tf_dpkit.DPSequential(MODELS[name]())
  model.compile(optimizer=tf_dpkit.DPGradientDescentGaussianOptimizer(
      1.0, 1.1, learning_rate=0.1, seed=0), loss=LOSS)
  return model


def _step_fn(path, model):
  """The step of one path, as a Python function of (x, y)."""
  optimizer = model.optimizer
  per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
  if path == "fit":
    return lambda x, y: model.train_step((x, y))
  if path == "minimize":
    def minimize(x, y):
      with tf.GradientTape() as tape:
        loss = per_example(y, model(x, training=True))
      return optimizer.minimize(loss, model.trainable_variables, tape=tape)
    return minimize
  if path == "private_gradients":
    def private(x, y):
      grads = tf_dpkit.private_gradients(optimizer, model, per_example, x, y, method="fast")
      optimizer.apply(grads, model.trainable_variables)
      return grads
    return private
  raise ValueError(path)


def _graph_nodes(concrete):
  """[(nodes, library function name or None)] of a concrete function: the outer graph and
  every nested function body (while/cond branches, called functions)."""
  graph_def = concrete.graph.as_graph_def()
  bodies = [(list(graph_def.node), None)]
  bodies += [(list(f.node_def), f.signature.name) for f in graph_def.library.function]
  return bodies, {f.signature.name for f in graph_def.library.function}


def _attr(node, name):
  if name in node.attr:
    return node.attr[name]
  for attr in op_def_registry.get(node.op).attr:
    if attr.name == name and attr.HasField("default_value"):
      return attr.default_value
  return None


def _satisfies(node, constraint):
  """Whether ``node``'s attribute meets one kernel constraint (a type, a type list, a string)."""
  value = _attr(node, constraint.name)
  if value is None:
    return False
  allowed = constraint.allowed_values.list
  kind = value.WhichOneof("value")
  if kind == "type":
    return value.type in allowed.type
  if kind == "list":
    return set(value.list.type) <= set(allowed.type)
  if kind == "s":
    return value.s in allowed.s
  if kind == "i":
    return value.i in allowed.i
  return False


def has_gpu_kernel(node) -> bool:
  """Whether a GPU or DEFAULT kernel is registered that matches ``node``'s attributes."""
  label = node.attr["_kernel"].s.decode() if "_kernel" in node.attr else ""
  return any(kernel.device_type in ("GPU", "DEFAULT") and kernel.label == label
             and all(_satisfies(node, c) for c in kernel.constraint)
             for kernel in kernels.get_registered_kernels_for_op(node.op).kernel)


def describe(node) -> str:
  """``Op(attr=DT_..., ...)`` with the node's type attributes, sorted."""
  names = types_pb2.DataType.Name
  return f"{node.op}(" + ", ".join(
      f"{k}={names(v[0])}" if len(v) == 1 and k not in _list_attrs(node) else f"{k}={[names(t) for t in v]}"
      for k, v in sorted(_type_attrs(node).items())) + ")"


def _list_attrs(node):
  return {a.name for a in op_def_registry.get(node.op).attr if a.type == "list(type)"}


# Ops whose int32 outputs TensorFlow keeps in host memory on a GPU (shape metadata).
SHAPE_OPS = {"Shape", "ShapeN", "Size", "Rank", "Const"}


def _host_side(node, by_name, consumers):
  """Whether a node without a GPU kernel moves no device data when soft placement puts it on the
  host: a string Const feeding nothing but Asserts (an assertion message; Assert has a DEFAULT
  kernel taking its data in host memory), or int32 shape arithmetic (all its types int32, all
  its data inputs Shape/Size/Rank/Const outputs, e.g. the Split of a Shape in TensorFlow's pfor)."""
  if node.op == "Const" and _attr(node, "dtype").type == types_pb2.DT_STRING:
    return all(u.op == "Assert" for u in consumers.get(node.name, []))
  types = {t for v in _type_attrs(node).values() for t in v}
  sources = [by_name.get(i.split(":")[0]) for i in node.input if not i.startswith("^")]
  return (types == {types_pb2.DT_INT32} and sources
          and all(src is not None and src.op in SHAPE_OPS for src in sources))


def _type_attrs(node):
  out = {}
  for attr in op_def_registry.get(node.op).attr:
    value = _attr(node, attr.name)
    if attr.type == "type" and value is not None:
      out[attr.name] = [value.type]
    elif attr.type == "list(type)" and value is not None:
      out[attr.name] = list(value.list.type)
  return out


def ops_without_gpu_kernel(bodies, functions):
  """{describe(node)} of the nodes with no GPU kernel, except host-side ones (``_host_side``)."""
  missing = set()
  for nodes, _ in bodies:
    by_name = {n.name: n for n in nodes}
    consumers = {}
    for n in nodes:
      for source in n.input:
        consumers.setdefault(source.lstrip("^").split(":")[0], []).append(n)
    for n in nodes:
      if n.op in functions or has_gpu_kernel(n) or _host_side(n, by_name, consumers):
        continue
      missing.add(describe(n))
  return missing


TRACED = [("fit", "cnn"), ("fit", "mlp"), ("fit", "embedding"), ("minimize", "mlp"),
          ("private_gradients", "mlp")]


@pytest.mark.parametrize("path,name", TRACED)
def test_every_op_of_the_traced_step_has_a_gpu_kernel(path, name, monkeypatch):
  # Trace as on a machine with a GPU: there noise and Embedding clipping are TensorFlow ops, not
  # the CPU-only compiled kernels (tf_dpkit.native) that a CPU-only trace picks.
  monkeypatch.setattr(native, "_accelerators_visible", lambda: True)
  model = _dp_model(name)
  x, y = (tf.constant(t) for t in _batch(name))
  step = tf.function(_step_fn(path, model), autograph=False)  # as Keras traces train_step
  bodies, functions = _graph_nodes(step.get_concrete_function(
      tf.TensorSpec((None,) + x.shape[1:], x.dtype), tf.TensorSpec([None], y.dtype)))
  all_ops = {n.op for nodes, _ in bodies for n in nodes}
  # The trace reached the DP step's parts: noise, clipping and the update.
  assert {"StatelessRandomUniformV2", "Sqrt", "AssignSubVariableOp"} <= all_ops, all_ops
  assert not all_ops & PY_CALLBACK_OPS, "a Python callback runs on the host every step"
  pinned = {(n.name, n.device) for nodes, _ in bodies for n in nodes if n.device}
  assert not pinned, f"ops with a device set inside the step: {sorted(pinned)[:10]}"
  missing = ops_without_gpu_kernel(bodies, functions)
  known = KNOWN_GPU_GAPS.get(name, set())
  assert missing >= known, (f"known GPU gap(s) {sorted(known - missing)} are fixed: remove them "
                            "from KNOWN_GPU_GAPS")
  assert missing == known, (f"ops of the {path} step of the {name} model without a GPU kernel "
                            f"for their dtypes: {sorted(missing - known)}")


def test_kernel_check_detects_missing_gpu_kernels():
  """The checker itself: a PyFunc, a bool GatherNd, a Split of int32 data and a string Const
  feeding an Identity are reported; a float GatherNd, a Split of a Shape and a string Const
  feeding only an Assert are not."""
  @tf.function
  def f(x):
    bad = tf.numpy_function(lambda a: a, [x], tf.float32)
    gathered = tf.gather_nd(x > 0, [[0, 0]])
    tf.debugging.Assert(tf.reduce_all(gathered), ["message"])
    shape_parts = tf.split(tf.shape(x), 2)  # host-side int32 shape arithmetic: allowed
    data_parts = tf.split(tf.cast(x, tf.int32) + 1, 2)  # int32 data: no GPU Split kernel
    return (bad, tf.gather_nd(x, [[0, 0]]), tf.identity(tf.constant("text")), shape_parts,
            data_parts)
  bodies, functions = _graph_nodes(f.get_concrete_function(tf.TensorSpec([2, None], tf.float32)))
  assert ops_without_gpu_kernel(bodies, functions) == {
      "PyFunc(Tin=['DT_FLOAT'], Tout=['DT_FLOAT'])", "Split(T=DT_INT32)",
      "GatherNd(Tindices=DT_INT32, Tparams=DT_BOOL)", "Const(dtype=DT_STRING)"}


@contextlib.contextmanager
def hard_placement():
  """Soft device placement off for the block, restored after it."""
  previous = tf.config.get_soft_device_placement()
  tf.config.set_soft_device_placement(False)
  try:
    yield
  finally:
    tf.config.set_soft_device_placement(previous)


def _on(device_string, dev):
  return tf.DeviceSpec.from_string(device_string).device_type == dev


@pytest.mark.parametrize("dev", DEVICES)
@pytest.mark.parametrize("name", ["cnn", "mlp"])
def test_step_runs_hard_placed_on_device(dev, name):
  device = f"/{dev}:0"
  with tf.device(device):
    model = _dp_model(name)
    x, y = (tf.constant(t) for t in _batch(name))
    model.optimizer.build(model.trainable_variables)
  per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

  @tf.function(autograph=False)
  def fit_step(x, y):
    with tf.device(device):  # inside: the ops carry the device, so a missing kernel fails
      return model.train_step((x, y))

  @tf.function(autograph=False)
  def private_step(x, y):
    with tf.device(device):
      clipped, _ = tf_dpkit.clipping.clipped_sum_fast(
          model, per_example, (x, y, None), model.optimizer.l2_norm_clip_for_step())
      grads = model.optimizer.privatize(clipped)
      model.optimizer.apply(grads, model.trainable_variables)
      return list(clipped.grads), grads

  before = [v.numpy() for v in model.trainable_variables]
  expect_failure = dev == "GPU"  # string Consts of the assertions (see the module docstring)
  with hard_placement():
    try:
      logs = fit_step(x, y)
      sums, noised = private_step(x, y)
    except tf.errors.InvalidArgumentError as error:
      if expect_failure and "DT_STRING" in str(error):
        pytest.xfail("hard GPU placement fails on the assertions' string Consts: "
                     + str(error).splitlines()[0])
      raise
  # No op of the traced steps is pinned to another device (e.g. the CPU when dev is the GPU);
  # the ops without a device are the function's argument and output plumbing.
  placed = {tf.DeviceSpec.from_string(n.device).device_type
            for f in (fit_step, private_step)
            for n in f.get_concrete_function(x, y).graph.as_graph_def().node if n.device}
  assert placed == {dev}, placed
  assert all(_on(t.device, dev) for t in tf.nest.flatten(logs))
  assert all(_on(t.device, dev) for t in sums + noised)
  assert all(_on(v.value.device, dev) for v in model.trainable_variables)
  # The update ran (two steps), and the noise made the private gradient differ from the sum.
  assert all(np.any(b != v.numpy()) for b, v in zip(before, model.trainable_variables))
  assert any(np.any(s.numpy() / BATCH != g.numpy()) for s, g in zip(sums, noised))


TF_DIR = os.path.dirname(os.path.abspath(tf_ops.__file__)).rsplit(os.sep + "python", 1)[0] + os.sep


class _HostReads:
  """Counts tensor reads on the host (``EagerTensor._numpy``: ``.numpy()``, ``int()``, ``bool()``,
  ``np.asarray``) whose innermost caller outside TensorFlow's own files is a file under ``root``
  (so Keras's reads inside a ``fit`` that tf_dpkit's ``fit`` called are Keras's, not tf_dpkit's)."""

  def __init__(self, root):
    self.root, self.count = root, 0

  def __enter__(self):
    self._original = tf_ops._EagerTensorBase._numpy  # pylint: disable=protected-access
    counter = self

    def counted(tensor):
      frame = sys._getframe(1)  # pylint: disable=protected-access
      while frame is not None and frame.f_code.co_filename.startswith(TF_DIR):
        frame = frame.f_back
      if frame is not None and frame.f_code.co_filename.startswith(counter.root):
        counter.count += 1
      return counter._original(tensor)  # pylint: disable=protected-access
    tf_ops._EagerTensorBase._numpy = counted  # pylint: disable=protected-access
    return self

  def __exit__(self, *exc):
    tf_ops._EagerTensorBase._numpy = self._original  # pylint: disable=protected-access


def test_host_read_counter_counts_reads_from_its_root():
  here = os.path.dirname(os.path.abspath(__file__))
  with _HostReads(here) as reads:
    tf.constant(1.0).numpy()
    int(tf.constant(2))
  with _HostReads(TF_DPKIT_DIR) as other:
    tf.constant(1.0).numpy()
  assert (reads.count, other.count) == (2, 0)


def test_no_host_reads_per_step():
  model = _dp_model("mlp")
  x, y = _batch("mlp")
  traces = []
  train_step = model.train_step
  model.train_step = lambda data: traces.append(1) or train_step(data)
  model.fit(x, y, batch_size=BATCH, epochs=1, verbose=0)  # builds and traces
  calls = []
  train_function = model.train_function
  model.train_function = lambda iterator: calls.append(1) or train_function(iterator)
  counts = {}
  for batches in (2, 5):
    traces.clear(), calls.clear()
    xs, ys = np.concatenate([x] * batches), np.concatenate([y] * batches)
    with _HostReads(TF_DPKIT_DIR) as reads:
      model.fit(xs, ys, batch_size=BATCH, epochs=1, verbose=0, shuffle=False)
    assert (len(traces), len(calls)) == (0, batches)  # one tf.function call per step
    counts[batches] = reads.count
  assert counts[5] == counts[2], f"tf_dpkit host reads grow with the steps: {counts}"

  # Custom loop: optimizer.minimize on a vector loss inside one tf.function.
  step = tf.function(_step_fn("minimize", model), autograph=False)
  xt, yt = tf.constant(x), tf.constant(y)
  step(xt, yt)
  with _HostReads(TF_DPKIT_DIR) as reads:
    for _ in range(3):
      step(xt, yt)
  assert (reads.count, step.experimental_get_tracing_count()) == (0, 1)
