"""TensorFlow Privacy 0.9.0 on the same models and batches, for a side-by-side with step_time.py.

TensorFlow Privacy 0.9.0 caps TensorFlow at 2.15 (Keras 2), so it cannot share an environment
with tf_dpkit. In a separate environment (kept out of the default install and CI):

    python3.11 -m venv /tmp/peer
    /tmp/peer/bin/pip install "tensorflow-cpu==2.15.*" "tensorflow-privacy==0.9.0"
    /tmp/peer/bin/python benchmarks/peers/tf_privacy_step_time.py

Methods, each a ``train_on_batch`` of a compiled model, timed interleaved in one process after
warm-up, and divided by the non-private ``train_on_batch`` of the same model in the same process:
``non_private`` (SGD), ``dp_keras_optimizer`` (``DPKerasSGDOptimizer`` with a vector loss:
per-example gradients by Jacobian), ``dp_sequential`` (``DPSequential``: per-example gradients
by ``vectorized_map``) and ``dp_sequential_fast`` (``DPSequential`` with the default fast
gradient-clipping layer registry).  Noise multiplier 1.1, clip 1.0, per-example clipping.
"""
from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow import keras  # noqa: E402  (Keras 2 inside TensorFlow 2.15)

import models as bench_models  # noqa: E402
import tensorflow_privacy  # noqa: E402
from tensorflow_privacy.privacy.keras_models.dp_keras_model import DPSequential  # noqa: E402

MODELS = os.environ.get("PEER_MODELS", "mnist_cnn,mlp,text").split(",")
BATCHES = [int(b) for b in os.environ.get("PEER_BATCHES", "256").split(",")]
REPS = int(os.environ.get("PEER_REPS", "10"))


def build(name):
  """The benchmark model; ``models.py`` imports ``keras``, which is Keras 2 in this environment."""
  return bench_models.MODELS[name]()


def make(name, batch, method):
  tf.keras.utils.set_random_seed(0)
  x, y = bench_models.batch_for(name, batch)
  vector_loss = keras.losses.SparseCategoricalCrossentropy(
      from_logits=True, reduction=tf.keras.losses.Reduction.NONE)
  mean_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  if method == "non_private":
    model = build(name)
    model.compile(keras.optimizers.SGD(0.01), loss=mean_loss)
  elif method == "dp_keras_optimizer":
    model = build(name)
    model.compile(tensorflow_privacy.DPKerasSGDOptimizer(
        l2_norm_clip=1.0, noise_multiplier=1.1, num_microbatches=batch, learning_rate=0.01),
        loss=vector_loss)
  else:
    kwargs = {}
    if method == "dp_sequential_fast":
      from tensorflow_privacy.privacy.fast_gradient_clipping import layer_registry  # pylint: disable=g-import-not-at-top
      kwargs["layer_registry"] = layer_registry.make_default_layer_registry()
    base = build(name)
    model = DPSequential(l2_norm_clip=1.0, noise_multiplier=1.1, layers=base.layers, **kwargs)
    model.compile(keras.optimizers.SGD(0.01), loss=mean_loss)
  return lambda: model.train_on_batch(x, y)


def main():
  methods = ["non_private", "dp_keras_optimizer", "dp_sequential", "dp_sequential_fast"]
  configs, steps = [], {}
  for name in MODELS:
    for batch in BATCHES:
      for method in methods:
        try:
          step = make(name, batch, method)
          for _ in range(2):
            step()
        except Exception as error:  # pylint: disable=broad-except
          print(f"skip {name} {batch} {method}: {type(error).__name__}: {error}"[:300])
          continue
        configs.append((name, batch, method))
        steps[(name, batch, method)] = step
  times = {c: [] for c in configs}
  for _ in range(REPS):
    for c in configs:
      start = time.perf_counter()
      steps[c]()
      times[c].append(time.perf_counter() - start)
  rows = []
  for name, batch, method in configs:
    ms = 1000 * float(np.median(times[(name, batch, method)]))
    base = 1000 * float(np.median(times.get((name, batch, "non_private"), [np.nan])))
    rows.append({"model": name, "batch": batch, "method": method, "median_ms": ms,
                 "time_ratio": ms / base})
  print("| model | batch | method | median ms/step | x non-private |\n|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['model']} | {r['batch']} | {r['method']} | {r['median_ms']:.1f} | "
          f"{r['time_ratio']:.2f} |")
  print(json.dumps({"tensorflow": tf.__version__, "tensorflow_privacy": "0.9.0", "rows": rows}))


if __name__ == "__main__":
  main()
