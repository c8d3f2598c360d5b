"""Seconds per ``fit`` epoch: DP (``tf_dpkit.DPModel``) against non-private Keras.

    python benchmarks/fit_epoch.py                         # text_cnn and cifar_groupnorm, B 256, 1024
    TF_ENABLE_ONEDNN_OPTS=1 python benchmarks/fit_epoch.py
    TF_DPKIT_NATIVE=0 python benchmarks/fit_epoch.py       # tf_dpkit's compiled kernels off
    python benchmarks/fit_epoch.py --rss                   # + peak RSS, one subprocess per fit
    python benchmarks/fit_epoch.py --rss --rss_runs=5      # median peak RSS of 5 processes
    TF_ENABLE_ONEDNN_OPTS=0 TF_CPU_ALLOCATOR_USE_BFC=true python benchmarks/fit_epoch.py
                                                           # allocator peaks with oneDNN off

For each model (``benchmarks/models.py``) and batch size, two models with the same weights train
on the same ``--examples`` random examples (in-memory arrays, fixed batches, no shuffling):

* ``non_private``: the Keras model + ``keras.optimizers.Adam``, the batch-mean loss;
* ``dp``: ``tf_dpkit.DPModel(model.inputs[0], model.outputs[0])`` (its own copy, same weights) +
  ``tf_dpkit.DPAdamGaussianOptimizer`` (clip 1, noise 1.1, one microbatch per example: the
  per-layer fast path).

An epoch's time runs from its first step's start to its last step's end (a callback): what
``fit`` does after the last step is left out, because returning from ``fit`` after its last
step sometimes took about 10 s (observed for the DP fits of the CIFAR CNN, TensorFlow 2.21,
arrays; cause not found), which made whole-``fit`` timings bimodal (10.3 or 20.6 s).
Each (model, batch) runs in a fresh process (``--one_process``: all in this one); both methods
are compiled and fitted once (tracing), then the epochs are timed interleaved (non-private,
DP, non-private, ...), ``--reps`` of each; the table gives the best and median seconds per epoch
and the ratio of the bests (the least disturbed epochs; other processes share the cores).
Memory: the TensorFlow CPU allocator's peak per epoch, median over the timed epochs (it
varies from epoch to epoch with the order two threads run the operations in), where the build
keeps allocator statistics (oneDNN on; with oneDNN off, only under
``TF_CPU_ALLOCATOR_USE_BFC=true``, TensorFlow's allocator of the oneDNN build: a run for memory,
whose times are not those of the default allocator), and with ``--rss`` the peak RSS of a fresh process
that runs only that fit (``--rss_epochs`` epochs; the median over ``--rss_runs`` such
processes: one process's peak RSS varies by tens of MB from run to run).
The header states the build (``build_info``).
"""
from __future__ import annotations

import json
import os
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

flags.DEFINE_list("models", ["text_cnn", "cifar_groupnorm"], "Models (benchmarks/models.py).")
flags.DEFINE_list("batch_sizes", ["256", "1024"], "Batch sizes.")
flags.DEFINE_integer("examples", 4096, "Examples per epoch.")
flags.DEFINE_integer("reps", 3, "Timed epochs per configuration (interleaved).")
flags.DEFINE_boolean("rss", False, "Also measure each fit's peak RSS in a fresh process.")
flags.DEFINE_integer("rss_runs", 1, "With --rss: fresh processes per fit (alternating "
                     "non-private and DP); the table gives the median.", lower_bound=1)
flags.DEFINE_integer("rss_epochs", 3, "With --rss: epochs each fresh process runs.",
                     lower_bound=1)
flags.DEFINE_string("single", None, "Internal: model:batch:method to run alone for RSS.")
flags.DEFINE_boolean("one_process", False,
                     "Time every model in this process (default: one fresh process per model).")
flags.DEFINE_string("out", None, "Markdown file to write the table to (default: print only).")
FLAGS = flags.FLAGS

LOSS = keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_fit(name, batch_size, method):
  """``fit()`` running one epoch of ``method`` on ``name``'s data (compiled, not yet traced)."""
  x, y = bench_models.batch_for(name, FLAGS.examples)
  keras.utils.set_random_seed(0)  # the same initial weights for both methods
  model = bench_models.build(name)
  if method == "non_private":
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss=LOSS)
  else:
    model = tf_dpkit.DPModel(model.inputs[0], model.outputs[0])
    model.compile(optimizer=tf_dpkit.DPAdamGaussianOptimizer(
        l2_norm_clip=1.0, noise_multiplier=1.1, learning_rate=1e-3), loss=LOSS)

  timer = _StepsTimer()

  def fit():
    """One epoch; returns the seconds from its first step's start to its last step's end."""
    model.fit(x, y, batch_size=batch_size, epochs=1, shuffle=False, verbose=0,
              callbacks=[timer])
    return timer.end - timer.start
  return fit


class _StepsTimer(keras.callbacks.Callback):
  """First step's start and last step's end of the latest epoch (``time.perf_counter``)."""

  def on_train_batch_begin(self, batch, logs=None):
    if batch == 0:
      self.start = time.perf_counter()

  def on_train_batch_end(self, batch, logs=None):
    self.end = time.perf_counter()


def run_single(spec):
  name, batch, method = spec.split(":")
  fit = make_fit(name, int(batch), method)
  for _ in range(FLAGS.rss_epochs):
    fit()
  print(json.dumps({"rss_peak_mb": build_info.peak_rss_mb()}))


def main(_):
  if FLAGS.single:
    run_single(FLAGS.single)
    return
  lines = ["| model | batch | non-private s/epoch (best / median) | DP s/epoch (best / median) "
           "| DP / non-private (best) | alloc peak MB (non-private / DP) | x | RSS peak MB "
           "(non-private / DP) | x |", "|" + "---|" * 9]
  if not FLAGS.one_process:
    # Each (model, batch) in a fresh process: a configuration timed after another in the same
    # process can run far slower (the CIFAR CNN's DP epochs 2x after the text CNN's).
    for name in FLAGS.models:
      for batch in FLAGS.batch_sizes:
        out = subprocess.run(
            [sys.executable, __file__, f"--models={name}", "--one_process",
             f"--batch_sizes={batch}", f"--examples={FLAGS.examples}",
             f"--reps={FLAGS.reps}"] + (["--rss", f"--rss_runs={FLAGS.rss_runs}",
                                         f"--rss_epochs={FLAGS.rss_epochs}"] if FLAGS.rss else []),
            capture_output=True, text=True, check=True).stdout
        row = next(l for l in out.splitlines() if l.startswith(f"| {name} | {batch} |"))
        lines.append(row)
        print(row, flush=True)
    build_info.report(f"{FLAGS.examples} examples per epoch, {FLAGS.reps} timed epochs per "
                      "configuration, interleaved; each (model, batch) in its own process. "
                      "Allocator peak: median over the timed epochs."
                      + _rss_text(), lines, FLAGS.out)
    return
  for name in FLAGS.models:
    for batch in (int(b) for b in FLAGS.batch_sizes):
      fits = {m: make_fit(name, batch, m) for m in ("non_private", "dp")}
      for fit in fits.values():
        fit()  # trace
      times = {m: [] for m in fits}
      peak_runs = {m: [] for m in fits}
      for _ in range(FLAGS.reps):
        for m, fit in fits.items():
          seconds, peak = build_info.with_allocator_peak(fit)
          times[m].append(seconds)
          if peak is not None:
            peak_runs[m].append(peak)
      peaks = {m: float(np.median(v)) if v else None for m, v in peak_runs.items()}
      rss = {m: None for m in fits}
      spread = {m: "" for m in fits}
      if FLAGS.rss:
        runs = {m: [] for m in fits}
        for _ in range(FLAGS.rss_runs):
          for m in fits:
            out = subprocess.run([sys.executable, __file__, f"--single={name}:{batch}:{m}",
                                  f"--examples={FLAGS.examples}",
                                  f"--rss_epochs={FLAGS.rss_epochs}"],
                                 capture_output=True, text=True, check=True).stdout
            runs[m].append(json.loads(out.strip().splitlines()[-1])["rss_peak_mb"])
        rss = {m: float(np.median(v)) for m, v in runs.items()}
        spread = {m: f" [{min(v):.0f}-{max(v):.0f}]" if len(v) > 1 else "" for m, v in runs.items()}
      fmt = lambda v: "n/a" if v is None else f"{v:.0f}"
      ratio = lambda a, b: "n/a" if a is None or b is None else f"{a / b:.2f}"
      best = {m: min(t) for m, t in times.items()}
      line = (f"| {name} | {batch} | {best['non_private']:.2f} / "
              f"{np.median(times['non_private']):.2f} | {best['dp']:.2f} / "
              f"{np.median(times['dp']):.2f} | {best['dp'] / best['non_private']:.2f}x | "
              f"{fmt(peaks['non_private'])} / {fmt(peaks['dp'])} | "
              f"{ratio(peaks['dp'], peaks['non_private'])} | {fmt(rss['non_private'])}"
              f"{spread['non_private']} / {fmt(rss['dp'])}{spread['dp']} | "
              f"{ratio(rss['dp'], rss['non_private'])} |")
      lines.append(line)
      print(line, flush=True)
  build_info.report(f"{FLAGS.examples} examples per epoch, {FLAGS.reps} timed epochs per "
                    "configuration, interleaved. Allocator peak: median over the timed epochs."
                    + _rss_text(), lines, FLAGS.out)


def _rss_text():
  if not FLAGS.rss:
    return ""
  runs = ("one such process" if FLAGS.rss_runs == 1 else
          f"median of {FLAGS.rss_runs} such processes [least-most]")
  return f" RSS: peak of a fresh process running {FLAGS.rss_epochs} epochs of that fit, {runs}."


if __name__ == "__main__":
  app.run(main)
