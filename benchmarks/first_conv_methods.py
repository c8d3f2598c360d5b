"""DP step time of the MNIST CNN with each convolution per-example method, with and without a
``tf.distribute`` strategy, against the non-private step (interleaved, same process).

    python benchmarks/first_conv_methods.py                 # none and one_device, 30 reps
    python benchmarks/first_conv_methods.py --batch=1024 --chunk=128   # op calls of 128 examples
    TF_DPKIT_KEEP_FREED_MEMORY=0 python benchmarks/first_conv_methods.py  # without glibc's pad

The conv rule forms per-example kernel-gradient norms with the compiled kernel
(``tf_dpkit.native``, both convolutions) where it is available; otherwise, for a convolution with
fewer than 4 input channels, either by unfolding patches (identity convolution + batched matmul)
or, under oneDNN, in calls of ``conv._FILTER_BACKPROP_CHUNK`` examples (``--chunk``), by the
depthwise filter-gradient op (under a strategy only where the process keeps freed memory,
``tf_dpkit.distribute.host_keeps_freed_memory``).  Here each DP column forces its method, under
a strategy too (the TensorFlow-op columns with the compiled conv kernel off, the noise compiled
in every column).  Each strategy runs in a fresh process that imports tf_dpkit before TensorFlow
starts (so the import sets glibc's top pad unless ``TF_DPKIT_KEEP_FREED_MEMORY=0`` or a
``MALLOC_*`` variable is set) and holds a live ``experimental_distribute_dataset`` iterator, as
``fit`` and ``benchmarks/distributed.py`` do; one DP model is traced per method.  Besides the
median step time, the median number of minor page faults per step (``getrusage``: pages the
process touched for the first time since they were mapped) is printed: memory returned to the
system and taken again every step shows there.  The children inherit the environment.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _measure(kind, reps, batch, chunk):
  import resource  # pylint: disable=g-import-not-at-top

  import keras  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, HERE)
  import models as bench_models  # pylint: disable=g-import-not-at-top
  import tf_dpkit  # pylint: disable=g-import-not-at-top
  from tf_dpkit import distribute  # pylint: disable=g-import-not-at-top
  from tf_dpkit.clipping.rules import conv  # pylint: disable=g-import-not-at-top
  kept = distribute.host_keeps_freed_memory
  strategy = (tf.distribute.OneDeviceStrategy("/cpu:0") if kind == "one_device"
              else tf.distribute.get_strategy())
  x, y = bench_models.batch_for("mnist_cnn", batch)
  batches = iter(strategy.experimental_distribute_dataset(
      tf.data.Dataset.from_tensors((x, y)).repeat()))
  per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
  steps = {}
  advantage = conv._NATIVE_ADVANTAGE  # pylint: disable=protected-access
  for method in ("non_private", "dp_compiled", "dp_unfold", "dp_filter_backprop"):
    conv._FILTER_BACKPROP_CHUNK = chunk if method == "dp_filter_backprop" else 0  # pylint: disable=protected-access
    conv._NATIVE_ADVANTAGE = advantage if method == "dp_compiled" else 0  # 0: never compiled  # pylint: disable=protected-access
    # Force the op under a strategy too (the rule asks this at trace time).
    distribute.host_keeps_freed_memory = (lambda: True) if method == "dp_filter_backprop" else kept
    keras.utils.set_random_seed(0)
    with strategy.scope():
      model = bench_models.mnist_cnn()
      if method == "non_private":
        optimizer = keras.optimizers.SGD(0.01)
      else:
        optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.1, learning_rate=0.01)
      model.build((None,) + tuple(x.shape[1:]))
      optimizer.build(model.trainable_variables)

    def replica(xb, yb, model=model, optimizer=optimizer, method=method):
      if method == "non_private":
        with tf.GradientTape() as tape:
          loss = tf.nn.compute_average_loss(per_example(yb, model(xb, training=True)),
                                            global_batch_size=batch)
        grads = tape.gradient(loss, model.trainable_variables)
      else:
        grads = tf_dpkit.private_gradients(optimizer, model, per_example, xb, yb,
                                           method="fast")
      optimizer.apply(grads, model.trainable_variables)

    @tf.function
    def step(data, replica=replica):
      strategy.run(replica, args=data)

    step(next(batches))  # traced now, under this method's setting
    steps[method] = step
  for _ in range(3):
    for step in steps.values():
      step(next(batches))
  times = {method: [] for method in steps}
  faults = {method: [] for method in steps}
  for _ in range(reps):
    for method, step in steps.items():
      data = next(batches)
      before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
      start = time.perf_counter()
      step(data)
      times[method].append((time.perf_counter() - start) * 1e3)
      faults[method].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
  return {method: (float(np.median(times[method])), float(np.median(faults[method])))
          for method in steps}


def main():
  if len(sys.argv) > 1 and sys.argv[1] == "--child":
    print("RESULT " + json.dumps(_measure(sys.argv[2], *map(int, sys.argv[3:6]))),
          flush=True)
    return
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--strategies", default="none,one_device")
  parser.add_argument("--reps", type=int, default=30)
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--chunk", type=int, default=128, help="examples per op call")
  args = parser.parse_args()
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  print("| strategy | non-private ms (faults) | DP, compiled ms (ratio, faults) | "
        "DP, unfolding ms (ratio, faults) | DP, filter-gradient op ms (ratio, faults) |")
  print("|---|---:|---:|---:|---:|")
  for kind in args.strategies.split(","):
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", kind,
                          str(args.reps), str(args.batch), str(args.chunk)], capture_output=True, text=True, env=env, cwd=ROOT,
                         check=False)
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    if not lines:
      raise RuntimeError(f"child failed:\n{out.stderr[-3000:]}")
    r = json.loads(lines[0][len("RESULT "):])
    base, base_faults = r["non_private"]
    cells = [f"{ms:.2f} ({ms / base:.2f}, {faults:.0f})"
             for ms, faults in (r["dp_compiled"], r["dp_unfold"], r["dp_filter_backprop"])]
    print(f"| {kind} | {base:.2f} ({base_faults:.0f}) | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
  main()
