"""Step time of the card's loop: the optimizer swap against private_gradients and Adam.

    python benchmarks/swap_path.py                       # every benchmark model, batch 256, 1024
    python benchmarks/swap_path.py --models=mnist_cnn --batch_sizes=256 --reps=12
    TF_ENABLE_ONEDNN_OPTS=1 python benchmarks/swap_path.py
    TF_DPKIT_NATIVE=0 python benchmarks/swap_path.py     # tf_dpkit's compiled kernels off

For each model of ``benchmarks/models.py`` and batch size, three ``tf.function`` steps with the
same initial weights (the plain Keras model for the non-private step, the same graph as
``tf_dpkit.DPModel(model.inputs[0], model.outputs[0])`` for the DP ones) on the same batch, timed
interleaved rep by rep in one process:

* ``non_private``: ``keras.optimizers.Adam``; ``tape.gradient`` of the mean loss and ``apply``;
* ``swap``: the card's loop, ``tf_dpkit.DPAdamGaussianOptimizer`` and
  ``optimizer.minimize(vector_loss, model.trainable_variables, tape=tape)``
  (``tf_dpkit.clipping.swap``);
* ``private_gradients``: ``tf_dpkit.private_gradients(optimizer, model, loss_fn, x, y)`` then
  ``optimizer.apply(grads, model.trainable_variables)``.

Prints the median and best milliseconds per step and each one's ratio to ``non_private``
(medians), after a header stating the build (``build_info``: CPU, oneDNN, compiled kernels).

``--first_step`` measures what a user waits for before the loop runs instead: the first call of
each step (tracing it, building the optimizer, one step), each method in a new Python process
(autograph and TensorFlow cache per process), processes interleaved rep by rep::

    python benchmarks/swap_path.py --first_step --models=mlp,mnist_cnn --batch_sizes=256 --reps=3

``--op_profile`` shows where a step's time goes instead: TensorFlow's profiler over ``--reps``
steps of ``non_private`` and ``swap`` (after the warm-up), operation time per step summed over
the executor's threads and grouped by operation type, the types ranked by what the swap adds::

    python benchmarks/swap_path.py --op_profile --models=transformer --batch_sizes=256 --reps=6
"""
from __future__ import annotations

import collections
import glob
import json
import os
import subprocess
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import build_info  # noqa: E402
import models as bench_models  # noqa: E402
import tf_dpkit  # noqa: E402

flags.DEFINE_list("models", list(bench_models.MODELS), "Models (benchmarks/models.py).")
flags.DEFINE_list("batch_sizes", ["256", "1024"], "Batch sizes.")
flags.DEFINE_integer("reps", 8, "Timed steps per method (interleaved).")
flags.DEFINE_string("out", None, "Markdown file to write the table to (default: print only).")
flags.DEFINE_integer("warmup", 3, "Untimed steps per method after tracing.")
flags.DEFINE_bool("first_step", False, "Time each method's first call (a new process each).")
flags.DEFINE_bool("op_profile", False, "Profile operation time by type (non_private, swap).")
flags.DEFINE_integer("top", 25, "--op_profile: operation types listed.")
flags.DEFINE_string("child", None, "Internal (--first_step): the method this process times.")
FLAGS = flags.FLAGS

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)


def _model(name, private=True):
  keras.utils.set_random_seed(0)  # the same initial weights for every method
  model = bench_models.build(name)
  return tf_dpkit.DPModel(model.inputs[0], model.outputs[0]) if private else model


def _steps(name):
  steps = {}

  model = _model(name, private=False)  # a plain Keras model: nothing traced
  adam = keras.optimizers.Adam(1e-3)

  @tf.function
  def non_private(x, y):
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(LOSS(y, model(x, training=True)))
    adam.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
  steps["non_private"] = non_private

  swap_model = _model(name)
  swap_opt = tf_dpkit.DPAdamGaussianOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1,
                                              learning_rate=1e-3)

  @tf.function
  def swap(x, y):
    with tf.GradientTape() as tape:
      loss = LOSS(y, swap_model(x, training=True))
    swap_opt.minimize(loss, swap_model.trainable_variables, tape=tape)
  steps["swap"] = swap

  pg_model = _model(name)
  pg_opt = tf_dpkit.DPAdamGaussianOptimizer(l2_norm_clip=1.0, noise_multiplier=1.1,
                                            learning_rate=1e-3)

  @tf.function
  def private_gradients(x, y):
    grads = tf_dpkit.private_gradients(pg_opt, pg_model, LOSS, x, y)
    pg_opt.apply(grads, pg_model.trainable_variables)
  steps["private_gradients"] = private_gradients
  return steps


def _child(method):
  """Prints JSON: seconds of the first call of ``method``'s step, and of the second."""
  name, batch = FLAGS.models[0], int(FLAGS.batch_sizes[0])
  x, y = bench_models.batch_for(name, batch)
  x, y = tf.constant(x), tf.constant(y)
  step = _steps(name)[method]
  start = time.perf_counter()
  step(x, y)
  first = time.perf_counter() - start
  start = time.perf_counter()
  step(x, y)
  print(json.dumps({"first": first, "second": time.perf_counter() - start}), flush=True)


def _first_steps():
  methods = ("non_private", "swap", "private_gradients")
  lines = ["| model | batch | non_private first call s (median / best) | swap s | "
           "private_gradients s | swap / non_private | swap second call ms |", "|" + "---|" * 7]
  for name in FLAGS.models:
    for batch in FLAGS.batch_sizes:
      times = {m: [] for m in methods}
      seconds = []
      for _ in range(FLAGS.reps):
        for method in methods:
          out = subprocess.run(
              [sys.executable, os.path.abspath(__file__), f"--child={method}",
               f"--models={name}", f"--batch_sizes={batch}"],
              check=True, capture_output=True, text=True).stdout
          result = json.loads(out.strip().splitlines()[-1])
          times[method].append(result["first"])
          if method == "swap":
            seconds.append(result["second"])
      s = {m: (np.median(t), np.min(t)) for m, t in times.items()}
      line = (f"| {name} | {batch} | " + " | ".join(f"{a:.2f} / {b:.2f}" for a, b in s.values())
              + f" | {s['swap'][0] / s['non_private'][0]:.2f}x | "
              f"{1e3 * np.median(seconds):.1f} |")
      lines.append(line)
      print(line, flush=True)
  build_info.report(f"{FLAGS.reps} new processes per method, interleaved; first call = trace + "
                    "optimizer build + one step; ratios of medians.", lines, FLAGS.out)


def _op_times(step, x, y, reps):
  """{operation type: ms per step} from TensorFlow's profiler over ``reps`` calls of ``step``
  (the executor threads' operation events; an event named ``name:Type`` counts for ``Type``)."""
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=g-import-not-at-top
  logdir = tempfile.mkdtemp(prefix="swap_path_profile_")
  try:
    tf.profiler.experimental.start(logdir)
    for _ in range(reps):
      step(x, y)
    tf.profiler.experimental.stop()
    space = xplane_pb2.XSpace()
    with open(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)[0], "rb") as f:
      space.ParseFromString(f.read())
  finally:
    shutil.rmtree(logdir, ignore_errors=True)
  totals = collections.Counter()
  for plane in space.planes:
    names = {key: meta.name for key, meta in plane.event_metadata.items()}
    for line in plane.lines:
      if not line.name.startswith("tf_Compute"):
        continue
      for event in line.events:
        name = names.get(event.metadata_id, "")
        if ":" in name and "::" not in name:  # an operation, not an executor event
          totals[name.rsplit(":", 1)[-1]] += event.duration_ps / 1e9 / reps
  return totals


def _op_profile():
  lines = ["| model | batch | operation type | non_private ms/step | swap ms/step | added ms |",
           "|" + "---|" * 6]
  for name in FLAGS.models:
    for batch in (int(b) for b in FLAGS.batch_sizes):
      x, y = bench_models.batch_for(name, batch)
      x, y = tf.constant(x), tf.constant(y)
      steps = _steps(name)
      steps = {m: steps[m] for m in ("non_private", "swap")}
      for step in steps.values():
        for _ in range(1 + FLAGS.warmup):
          step(x, y)
      ops = {m: _op_times(step, x, y, FLAGS.reps) for m, step in steps.items()}
      a, b = ops["non_private"], ops["swap"]
      lines.append(f"| {name} | {batch} | all | {sum(a.values()):.2f} | {sum(b.values()):.2f} | "
                   f"{sum(b.values()) - sum(a.values()):.2f} |")
      ranked = sorted(set(a) | set(b), key=lambda k: -abs(b[k] - a[k]))
      for kind in ranked[:FLAGS.top]:
        lines.append(f"| {name} | {batch} | {kind} | {a[kind]:.2f} | {b[kind]:.2f} | "
                     f"{b[kind] - a[kind]:.2f} |")
      print("\n".join(lines[-FLAGS.top - 1:]), flush=True)
  build_info.report(f"TensorFlow profiler over {FLAGS.reps} steps per method after "
                    f"{FLAGS.warmup} warm-up steps; operation time per step summed over the "
                    "executor's threads (so more than wall time on several cores), by type, "
                    "ranked by the swap's difference.", lines, FLAGS.out)


def main(_):
  if FLAGS.child:
    return _child(FLAGS.child)
  if FLAGS.first_step:
    return _first_steps()
  if FLAGS.op_profile:
    return _op_profile()
  lines = ["| model | batch | non_private ms (median / best) | swap ms | private_gradients ms "
           "| swap / non_private | private_gradients / non_private |", "|" + "---|" * 7]
  for name in FLAGS.models:
    for batch in (int(b) for b in FLAGS.batch_sizes):
      x, y = bench_models.batch_for(name, batch)
      x, y = tf.constant(x), tf.constant(y)
      steps = _steps(name)
      for step in steps.values():
        for _ in range(1 + FLAGS.warmup):
          step(x, y)
      times = {method: [] for method in steps}
      for _ in range(FLAGS.reps):
        for method, step in steps.items():
          start = time.perf_counter()
          step(x, y)
          times[method].append(time.perf_counter() - start)
      ms = {m: (1e3 * np.median(t), 1e3 * np.min(t)) for m, t in times.items()}
      base = ms["non_private"][0]
      line = (f"| {name} | {batch} | " + " | ".join(f"{a:.1f} / {b:.1f}" for a, b in ms.values())
              + f" | {ms['swap'][0] / base:.2f}x | {ms['private_gradients'][0] / base:.2f}x |")
      lines.append(line)
      print(line, flush=True)
  build_info.report(f"{FLAGS.reps} timed steps per method after {FLAGS.warmup} warm-up steps, "
                    "interleaved; ratios of medians.", lines, FLAGS.out)


if __name__ == "__main__":
  app.run(main)
