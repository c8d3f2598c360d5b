"""Median milliseconds per training step: non-private vs each per-example method.

    python benchmarks/step_time.py                 # full table (about 10 minutes on 2 cores)
    python benchmarks/step_time.py --models=mlp --batch_sizes=256 --reps=10
    python benchmarks/step_time.py --device=cpu    # CPU only: the table without the GPU columns

One process builds every configuration, warms each up, then times them interleaved (rep by
rep), so machine noise hits all of them alike.  A step is the whole update: gradients (clipped
and noised for DP) and the SGD apply, inside one ``tf.function``.  Memory: the TensorFlow CPU
allocator's peak during one step (``tf.config.experimental.get_memory_info``), and the process
RSS high-water mark of a fresh subprocess that runs only that configuration (``--rss``).

Methods: ``non_private`` (Keras SGD on the mean loss), ``fast`` (per-layer ghost norms,
``tf_dpkit.private_gradients(..., method="fast")``), ``vectorized`` (whole-model
``tf.vectorized_map``), ``jacobian`` (the vector-loss optimizer interface,
``optimizer.minimize(vector_loss, tape=...)``; batch 256 only: its cost grows with B^2),
``fast_no_noise`` (the fast path with noise_multiplier=0: clipping cost without the Gaussian
draw, whose cost grows with the parameter count, not the batch), and ``noise_only`` (a
non-private step plus tf_dpkit's keyed Gaussian draw for every parameter,
``tf_dpkit.noise.add_gaussian_noise`` on the mean gradient: what the noise alone adds, the
floor below which no DP-SGD step that draws one normal per parameter can go on this CPU; not in
the default list: time it beside ``non_private`` alone, ``--methods=non_private,noise_only``,
because interleaved with all the DP configurations the text model's non-private step measured
7.8 instead of 2.8 ms, a cross-configuration effect no other method showed).

Devices (``--device``): ``cpu`` times every configuration on ``/CPU:0``; ``gpu`` on ``/GPU:0``;
``all`` (the default) on the CPU and, where ``tf.config.list_physical_devices("GPU")`` is not
empty, also on the first GPU, which adds two columns (GPU median ms/step and its ratio to the
non-private GPU step).  Without a GPU those columns say "no GPU" (not an error).  Each device
gets its own model, optimizer and ``tf.function`` built under ``tf.device``, so variables, noise
and the update live on that device; the RSS subprocess always runs on the CPU, with
``CUDA_VISIBLE_DEVICES=""`` (no CUDA context in its RSS).  The result
files record the device names (``tf.config.experimental.get_device_details``).
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
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

flags.DEFINE_list("models", list(bench_models.MODELS), "Models to run.")
flags.DEFINE_list("batch_sizes", ["256", "1024"], "Batch sizes.")
flags.DEFINE_list("methods", ["non_private", "fast", "fast_no_noise", "vectorized", "jacobian"],
                  "Methods.")
flags.DEFINE_enum("device", "all", ["cpu", "gpu", "all"],
                  "Devices to time on: cpu, gpu, or all (the CPU and, where present, /GPU:0).")
flags.DEFINE_integer("reps", 20, "Timed steps per configuration (interleaved).")
flags.DEFINE_integer("warmup", 3, "Untimed steps per configuration.")
flags.DEFINE_boolean("rss", True, "Measure peak RSS per configuration in a subprocess.")
flags.DEFINE_string("single", None, "Internal: model:batch:method to run alone for RSS.")
flags.DEFINE_string("out", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"),
                    "Directory for step_time.md / step_time.json.")
FLAGS = flags.FLAGS

# Known TensorFlow 2.21 CPU problem: whole-model vectorized_map of MultiHeadAttention followed by
# LayerNormalization aborts inside oneDNN, so that combination is not run.
SKIP = {("transformer", "vectorized"): "aborts in TF 2.21 oneDNN (pfor of MHA+LayerNorm)"}


def make_step(name, batch_size, method, device="/CPU:0"):
  """Returns the ``tf.function`` step of one configuration, built on ``device``.

  Model, optimizer and batch are created under ``tf.device(device)`` and every call of the
  returned step runs under it, so the step's ops default to that device.  On a GPU each call
  also waits for the device to finish (``tf.test.experimental.sync_devices``).
  """
  with tf.device(device):
    step = _make_step(name, batch_size, method)

  if not device.upper().startswith("/GPU"):
    def on_device():
      with tf.device(device):
        step()
  else:
    def on_device():
      with tf.device(device):
        step()
      # GPU kernels run asynchronously: wait for this step's work, so that the time measured
      # is the step's (not its launch's) and no step's work spills into the next timed one.
      tf.test.experimental.sync_devices()
  return on_device


def _make_step(name, batch_size, method):
  keras.utils.set_random_seed(0)
  model = bench_models.MODELS[name]()
  x, y = bench_models.batch_for(name, batch_size)
  x, y = tf.constant(x), tf.constant(y)
  per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
  if method == "non_private":
    optimizer = keras.optimizers.SGD(0.01)

    def step():
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(per_example(y, model(x, training=True)))
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply(grads, model.trainable_variables)
  elif method == "noise_only":
    optimizer = keras.optimizers.SGD(0.01)
    key = tf_dpkit.noise.fresh_key(0)

    def step():
      with tf.GradientTape() as tape:
        loss = tf.reduce_mean(per_example(y, model(x, training=True)))
      grads = tape.gradient(loss, model.trainable_variables)
      grads = [tf.convert_to_tensor(g) for g in grads]  # an Embedding's sparse gradient: dense
      grads = tf_dpkit.noise.add_gaussian_noise(grads, 1.1 / batch_size, key,
                                                optimizer.iterations)
      optimizer.apply(grads, model.trainable_variables)
  elif method in ("fast", "vectorized", "fast_no_noise"):
    sigma = 0.0 if method == "fast_no_noise" else 1.1
    optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, sigma, learning_rate=0.01, seed=0)
    path = "fast" if method == "fast_no_noise" else method

    def step():
      grads = tf_dpkit.private_gradients(optimizer, model, per_example, x, y, method=path)
      optimizer.apply(grads, model.trainable_variables)
  elif method == "jacobian":
    optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(1.0, 1.1, learning_rate=0.01, seed=0)

    def step():
      with tf.GradientTape() as tape:
        loss = per_example(y, model(x, training=True))
      optimizer.minimize(loss, model.trainable_variables, tape=tape)
  else:
    raise ValueError(method)
  return tf.function(step)


def gpu_present() -> bool:
  return bool(tf.config.list_physical_devices("GPU"))


def devices_to_time():
  """The (column, device) pairs ``--device`` asks for that exist: ("CPU", "/CPU:0") and/or
  ("GPU", "/GPU:0")."""
  wanted = {"cpu": ["CPU"], "gpu": ["GPU"], "all": ["CPU", "GPU"]}[FLAGS.device]
  return [(kind, f"/{kind}:0") for kind in wanted if kind == "CPU" or gpu_present()]


def device_description(kind):
  """``name (compute capability x.y)`` of the first device of ``kind`` from
  ``tf.config.experimental.get_device_details``; "no GPU" when there is none."""
  physical = tf.config.list_physical_devices(kind)
  if not physical:
    return f"no {kind}"
  details = tf.config.experimental.get_device_details(physical[0])
  name = details.get("device_name", physical[0].name)
  capability = details.get("compute_capability")
  return name if capability is None else f"{name} (compute capability {capability[0]}.{capability[1]})"


def configurations():
  for name in FLAGS.models:
    for batch in map(int, FLAGS.batch_sizes):
      for method in FLAGS.methods:
        if method == "jacobian" and batch > 256:
          continue
        if (name, method) in SKIP:
          continue
        yield name, batch, method


def rss_kb():
  with open("/proc/self/status") as status:
    fields = dict(line.split(":", 1) for line in status)
  return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def run_single(spec):
  name, batch, method = spec.split(":")
  step = make_step(name, int(batch), method, "/CPU:0")
  before, _ = rss_kb()
  for _ in range(3):
    step()
  _, peak = rss_kb()
  print(json.dumps({"rss_before_mb": before / 1024, "rss_peak_mb": peak / 1024}))


def cpu_description():
  """CPU model name from /proc/cpuinfo and whether oneDNN kernels are on."""
  model = platform.processor() or "unknown CPU"
  try:
    with open("/proc/cpuinfo") as f:
      model = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  except (OSError, StopIteration):
    pass
  onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default")
  return f"{model}, TF_ENABLE_ONEDNN_OPTS={onednn}"


def table_lines(rows, cpu_timed, gpu_wanted):
  """The markdown table: today's CPU columns (when the CPU was timed), then the GPU columns
  (when ``--device`` asks for the GPU): "no GPU" where there is none."""
  header = ["model", "batch", "method"]
  if cpu_timed:
    header += ["median ms/step", "x non-private", "TF alloc peak MB", "x", "RSS peak MB", "x"]
  if gpu_wanted:
    header += ["GPU median ms/step", "GPU x non-private"]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  fmt = lambda v, spec: "n/a" if v is None else format(v, spec)
  for r in rows:
    cells = [str(r["model"]), str(r["batch"]), r["method"]]
    if cpu_timed:
      cells += [f"{r['median_ms']:.1f}", fmt(r["time_ratio"], ".2f"),
                fmt(r["allocator_peak_mb"], ".1f"), fmt(r["allocator_ratio"], ".2f"),
                fmt(r.get("rss_peak_mb"), ".0f"), fmt(r.get("rss_ratio"), ".2f")]
    if gpu_wanted:
      if r["gpu_median_ms"] is None:
        cells += ["no GPU", ""]
      else:
        cells += [f"{r['gpu_median_ms']:.1f}", fmt(r["gpu_time_ratio"], ".2f")]
    lines.append("| " + " | ".join(cells) + " |")
  for (name, method), why in SKIP.items():
    if name in FLAGS.models and method in FLAGS.methods:
      lines.append(f"| {name} | all | {method} | skipped: {why} |" + " |" * (len(header) - 4))
  return lines


def gpu_note(meta):
  return f"GPU: {meta['gpu']}, " if "gpu" in meta else ""


def main(argv):
  del argv
  if FLAGS.single:
    run_single(FLAGS.single)
    return
  configs = list(configurations())
  devices = devices_to_time()
  # Timing keys: (model, batch, method, column); every (configuration, device) pair is timed
  # interleaved with all others.
  keys = [config + (kind,) for kind, _ in devices for config in configs]
  steps = {}
  for key in keys:
    steps[key] = make_step(*key[:3], dict(devices)[key[3]])
    for _ in range(FLAGS.warmup):
      steps[key]()
  times = {key: [] for key in keys}
  for _ in range(FLAGS.reps):
    for key in keys:
      start = time.perf_counter()
      steps[key]()
      times[key].append(time.perf_counter() - start)
  cpu_timed = any(kind == "CPU" for kind, _ in devices)
  gpu_wanted = FLAGS.device in ("gpu", "all")
  rows = []
  for config in configs:
    name, batch, method = config
    row = {"model": name, "batch": batch, "method": method}
    if cpu_timed:
      key = config + ("CPU",)
      row.update({"median_ms": 1000 * float(np.median(times[key])),
                  "allocator_peak_mb": build_info.with_allocator_peak(steps[key])[1]})
      if FLAGS.rss:
        # No GPU in the RSS subprocess: a CUDA context would add its own host memory.
        out = subprocess.run([sys.executable, __file__, f"--single={name}:{batch}:{method}"],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}).stdout
        row.update(json.loads(out.strip().splitlines()[-1]))
    if gpu_wanted:
      key = config + ("GPU",)
      row["gpu_median_ms"] = 1000 * float(np.median(times[key])) if key in times else None
    rows.append(row)
  base = {(r["model"], r["batch"]): r for r in rows if r["method"] == "non_private"}
  for r in rows:
    b = base.get((r["model"], r["batch"]))
    if cpu_timed:
      r["time_ratio"] = r["median_ms"] / b["median_ms"] if b else None
      r["allocator_ratio"] = (r["allocator_peak_mb"] / b["allocator_peak_mb"]
                              if b and b["allocator_peak_mb"] and r["allocator_peak_mb"] is not None
                              else None)
      if FLAGS.rss and b:
        r["rss_ratio"] = r["rss_peak_mb"] / b["rss_peak_mb"]
    if gpu_wanted:
      r["gpu_time_ratio"] = (r["gpu_median_ms"] / b["gpu_median_ms"]
                             if b and r["gpu_median_ms"] is not None else None)
  lines = table_lines(rows, cpu_timed, gpu_wanted)
  table = "\n".join(lines)
  print(table)
  meta = {"command": "python " + " ".join(sys.argv), "python": platform.python_version(),
          "tensorflow": tf.__version__, "keras": keras.__version__, "cpu_count": os.cpu_count(),
          "cpu": cpu_description(),
          **({"gpu": device_description("GPU")} if gpu_wanted else {}),
          "build": build_info.build(),
          "reps": FLAGS.reps, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
  os.makedirs(FLAGS.out, exist_ok=True)
  with open(os.path.join(FLAGS.out, "step_time.json"), "w") as f:
    json.dump({"meta": meta, "rows": rows}, f, indent=1)
  with open(os.path.join(FLAGS.out, "step_time.md"), "w") as f:
    f.write(f"{build_info.header()}\n{gpu_note(meta)}{meta['reps']} interleaved reps.\n\n"
            f"{table}\n")


if __name__ == "__main__":
  app.run(main)
