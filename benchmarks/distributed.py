"""DP step time over non-private step time under each tf.distribute strategy.

    python benchmarks/distributed.py                      # all strategies, results/distributed.md
    python benchmarks/distributed.py --strategies=mirrored --reps=10
    python benchmarks/distributed.py --inputs=constant --out=benchmarks/results/distributed_constant_inputs.md

For each strategy a fresh process (logical devices and TF_CONFIG must be set before TensorFlow
starts; two processes for the multi-worker case) builds the same model twice, once with a
non-private step (Keras SGD on the loss averaged over the global batch) and once with a DP step
(``tf_dpkit.private_gradients`` on the fast path + ``apply``), both as ``strategy.run`` of a
replica function inside one ``tf.function`` on the same global batch.  It warms both up, then
times them interleaved, step by step, so machine noise hits both alike, and reports the median
milliseconds and their ratio.  The logical CPU devices of ``mirrored`` share the host's cores:
the ratio is what this measures, not a speed-up.  ``--inputs=constant`` feeds the same
per-replica batches as constants made once (``experimental_distribute_values_from_function``)
instead of a distributed ``tf.data`` iterator, to separate the cost of the input pipeline.
Each child calls ``tf_dpkit.distribute.keep_freed_host_memory()`` before TensorFlow starts (as
a training script under a strategy does at its top), which sets glibc's top pad, so the CNN's
first-layer op is used under a strategy too
(``tf_dpkit.distribute.host_keeps_freed_memory``); the children inherit the environment, so
``TF_DPKIT_KEEP_FREED_MEMORY=0`` measures without the pad, and ``MALLOC_TOP_PAD_`` sets it from
outside.  The command line written to the results names these variables.  The faults columns
are the median minor page faults per step (``getrusage``).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
STRATEGIES = ("none", "one_device", "mirrored2", "multiworker2")


def _measure(config):
  """Runs in the child process: {'non_private': [ms, faults], 'dp': [ms, faults]}."""
  if config["strategy"] == "multiworker2":
    os.environ["TF_CONFIG"] = json.dumps({
        "cluster": {"worker": [f"localhost:{p}" for p in config["ports"]]},
        "task": {"type": "worker", "index": config["index"]}})
  import resource  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top

  import numpy as np  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  # Before TensorFlow starts, as at the top of a training script: glibc's top pad.
  import tf_dpkit  # pylint: disable=g-import-not-at-top
  tf_dpkit.distribute.keep_freed_host_memory()
  kind = config["strategy"]
  if kind == "mirrored2":
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
  elif kind == "multiworker2":
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
  elif kind == "one_device":
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
  else:
    strategy = tf.distribute.get_strategy()
  import keras  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, HERE)
  import models as bench_models  # pylint: disable=g-import-not-at-top

  batch = config["batch"]
  x, y = bench_models.batch_for(config["model"], batch)
  if config.get("inputs", "distributed") == "distributed":
    dataset = tf.data.Dataset.from_tensors((x, y)).repeat()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    batches = iter(strategy.experimental_distribute_dataset(dataset.with_options(options)))
  else:  # the same per-replica slices as constants, made once: no input pipeline at all
    def slices(context):
      per = batch // context.num_replicas_in_sync
      start = context.replica_id_in_sync_group * per
      return tf.constant(x[start:start + per]), tf.constant(y[start:start + per])
    constant = strategy.experimental_distribute_values_from_function(slices)
    batches = iter(lambda: constant, None)
  per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
  steps = {}
  for method in ("non_private", "dp"):
    keras.utils.set_random_seed(0)
    with strategy.scope():
      model = bench_models.MODELS[config["model"]]()
      if method == "dp":
        optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.1, learning_rate=0.01)
      else:
        optimizer = keras.optimizers.SGD(0.01)
      model.build((None,) + tuple(x.shape[1:]))
      optimizer.build(model.trainable_variables)

    def replica(xb, yb, model=model, optimizer=optimizer, method=method):
      if method == "dp":
        grads = tf_dpkit.private_gradients(optimizer, model, per_example, xb, yb,
                                           method="fast")
      else:
        with tf.GradientTape() as tape:
          loss = tf.nn.compute_average_loss(per_example(yb, model(xb, training=True)),
                                            global_batch_size=batch)
        grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply(grads, model.trainable_variables)

    @tf.function
    def step(data, replica=replica):
      strategy.run(replica, args=data)

    steps[method] = step
  for _ in range(config["warmup"]):
    for step in steps.values():
      step(next(batches))
  times = {method: [] for method in steps}
  faults = {method: [] for method in steps}
  for _ in range(config["reps"]):
    for method, step in steps.items():
      data = next(batches)
      before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
      start = time.perf_counter()
      step(data)  # eager call of a tf.function: returns when the step has run
      times[method].append((time.perf_counter() - start) * 1e3)
      faults[method].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
  return {method: [float(np.median(times[method])), float(np.median(faults[method]))]
          for method in steps}


def _child(config):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
             PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env.pop("TF_CONFIG", None)
  return subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", json.dumps(config)],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          cwd=ROOT)


def _result(proc):
  out, err = proc.communicate(timeout=1800)
  for line in out.splitlines():
    if line.startswith("RESULT "):
      return json.loads(line[len("RESULT "):])
  raise RuntimeError(f"benchmark child failed:\n{err[-3000:]}")


def run(strategies, models, batch, reps, warmup, inputs="distributed"):
  rows = []
  for model in models:
    for kind in strategies:
      config = {"strategy": kind, "model": model, "batch": batch, "reps": reps,
                "warmup": warmup, "inputs": inputs}
      if kind == "multiworker2":
        from tf_dpkit.distribute import local_worker_addresses  # pylint: disable=g-import-not-at-top
        ports = [int(a.split(':')[1]) for a in local_worker_addresses(2)]
        procs = [_child({**config, "ports": ports, "index": i}) for i in range(2)]
        result = [_result(p) for p in procs][0]
      else:
        result = _result(_child(config))
      (base, base_faults), (dp, dp_faults) = result["non_private"], result["dp"]
      rows.append((model, kind, base, dp, dp / base, base_faults, dp_faults))
      print(f"{model:10s} {kind:13s} non-private {base:8.2f} ms  DP {dp:8.2f} ms  "
            f"ratio {dp / base:.2f}  faults/step {base_faults:.0f} / {dp_faults:.0f}", flush=True)
  return rows


def main():
  import argparse  # pylint: disable=g-import-not-at-top
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--child", help=argparse.SUPPRESS)
  parser.add_argument("--strategies", default=",".join(STRATEGIES))
  parser.add_argument("--models", default="mnist_cnn,mlp")
  parser.add_argument("--batch", type=int, default=256, help="Global batch size.")
  parser.add_argument("--reps", type=int, default=30)
  parser.add_argument("--warmup", type=int, default=3)
  parser.add_argument("--inputs", default="distributed", choices=["distributed", "constant"],
                      help="distributed: batches from strategy.experimental_distribute_dataset "
                           "(what fit does); constant: the same per-replica batches made once "
                           "as constants (no input pipeline).")
  parser.add_argument("--out", default=os.path.join(HERE, "results", "distributed.md"))
  args = parser.parse_args()
  if args.child:
    print("RESULT " + json.dumps(_measure(json.loads(args.child))), flush=True)
    return
  strategies = [s for s in args.strategies.split(",") if s]
  unknown = sorted(set(strategies) - set(STRATEGIES))
  if unknown:
    parser.error(f"--strategies: unknown {unknown}; choose from {list(STRATEGIES)}")
  rows = run(strategies, args.models.split(","), args.batch, args.reps, args.warmup,
             args.inputs)
  lines = [
      "# DP step time / non-private step time under each tf.distribute strategy", "",
      "Command: `" + "".join(f"{name}={os.environ[name]} " for name in (
          "MALLOC_TOP_PAD_", "TF_DPKIT_KEEP_FREED_MEMORY") if name in os.environ) +
      f"python benchmarks/distributed.py --strategies={','.join(strategies)} "
      f"--models={args.models} --batch={args.batch} --reps={args.reps} "
      f"--inputs={args.inputs}`", "",
      f"Host: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; global "
      "batch as given; median ms of interleaved steps; mirrored2 = 2 logical CPU devices "
      "sharing the cores, multiworker2 = 2 local worker processes (worker 0's timing).", "",
      "| model | strategy | non-private ms | DP ms | DP / non-private | faults/step "
      "non-private | faults/step DP |",
      "|---|---|---:|---:|---:|---:|---:|"]
  lines += [f"| {m} | {k} | {a:.2f} | {b:.2f} | {r:.2f} | {fa:.0f} | {fb:.0f} |"
            for m, k, a, b, r, fa, fb in rows]
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as handle:
    handle.write("\n".join(lines) + "\n")
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
