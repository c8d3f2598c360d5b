"""The conv rule's norms + clipped sum for one layer: compiled kernel against TensorFlow ops.

    python benchmarks/conv_norms.py                  # batch 256, 40 interleaved reps
    python benchmarks/conv_norms.py --batch=1024 --reps=30

For each layer shape, the rule (``tf_dpkit.clipping.rules.conv``) is traced twice inside a
``tf.function`` that forms the per-example squared norms and the clipped sum from a random
output gradient (the clipped sum as the fast path forms it: the rule's own, else the layer's
vector-Jacobian product with scaled output gradients): once forced onto the compiled kernel
(``tf_dpkit.native``), once onto the TensorFlow ops it would use otherwise (unfolded patches
with the explicit or Gram form, or, with 1-3 input channels under oneDNN, the depthwise
filter-gradient op in chunks).  The two run interleaved in one process; the table gives median
ms, their ratio, and the ratio of the explicit form's multiply-adds (``S d p``) to the Gram
form's (``S^2 (d + p)``), by which the rule chooses (``conv._NATIVE_ADVANTAGE``: compiled while
that ratio is at most 2).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tf_dpkit import native  # noqa: E402
from tf_dpkit.clipping.rules import conv, lookup_rule  # noqa: E402

# (name, input [H, W, C], Conv2D arguments)
LAYERS = [
    ("MNIST CNN conv 1", (28, 28, 1), dict(filters=16, kernel_size=8, strides=2, padding="same")),
    ("MNIST CNN conv 2", (13, 13, 16), dict(filters=32, kernel_size=4, strides=2,
                                            padding="valid")),
    ("16x16x32 -> 3x3x64", (16, 16, 32), dict(filters=64, kernel_size=3, padding="same")),
    ("6x6x64 -> 3x3x128", (6, 6, 64), dict(filters=128, kernel_size=3, padding="same")),
    ("4x4x128 -> 3x3x128", (4, 4, 128), dict(filters=128, kernel_size=3, padding="same")),
]


def make_step(layer, batch, advantage):
  """The rule's norms + clipped sum, traced with ``conv._NATIVE_ADVANTAGE = advantage``."""
  rng = np.random.default_rng(0)
  x = tf.constant(rng.normal(size=(batch, *layer.input.shape[1:])).astype(np.float32))
  g = tf.constant(rng.normal(size=(batch, *layer.output.shape[1:])).astype(np.float32))
  factors = tf.constant(rng.uniform(size=batch).astype(np.float32))

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      trace = lookup_rule(layer)(layer, x)
    norms = trace.squared_norms(g, batch)
    sums = trace.clipped_sum(factors)
    if sums is None:  # as the fast path does: the layer's VJP with scaled output gradients
      sums = tape.gradient(trace.watched, layer.trainable_variables,
                           output_gradients=g * factors[:, None, None, None])
    return norms, sums

  saved = conv._NATIVE_ADVANTAGE  # pylint: disable=protected-access
  conv._NATIVE_ADVANTAGE = advantage  # pylint: disable=protected-access
  try:
    step.get_concrete_function()
  finally:
    conv._NATIVE_ADVANTAGE = saved  # pylint: disable=protected-access
  used = {op.type for op in step.get_concrete_function().graph.get_operations()}
  return step, "DpkitConvKernelGradSquaredNorms" in used


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--batch", type=int, default=256)
  parser.add_argument("--reps", type=int, default=40)
  args = parser.parse_args()
  if native.kernels("conv") is None:
    sys.exit(f"compiled kernels unavailable: {native.status('conv')}")
  print(f"batch {args.batch}, {args.reps} interleaved reps, oneDNN "
        f"{'on' if conv.onednn_enabled() else 'off'}\n")
  print("| layer | S d p / S^2 (d + p) | rule picks | compiled ms | TF ops ms | TF ops / compiled |")
  print("|---|---:|---|---:|---:|---:|")
  for name, image, kwargs in LAYERS:
    layer = keras.layers.Conv2D(**kwargs)
    layer(keras.Input(image))
    out_h, out_w, filters = layer.output.shape[1:]
    positions, taps = out_h * out_w, kwargs["kernel_size"] ** 2 * image[2]
    flops = positions * taps * filters / (positions**2 * (taps + filters))
    compiled, is_compiled = make_step(layer, args.batch, 10**9)
    tf_ops, is_tf = make_step(layer, args.batch, 0)
    assert is_compiled and not is_tf
    picks = ("compiled" if flops <= conv._NATIVE_ADVANTAGE  # pylint: disable=protected-access
             else "TF ops")
    norms_c, sums_c = compiled()
    norms_t, sums_t = tf_ops()
    np.testing.assert_allclose(norms_c.numpy(), norms_t.numpy(), rtol=1e-3)
    for a, b in zip(sums_c, sums_t):
      np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-3, atol=1e-3)
    times = {"compiled": [], "tf_ops": []}
    for _ in range(3):
      compiled(), tf_ops()
    for _ in range(args.reps):
      for key, step in (("compiled", compiled), ("tf_ops", tf_ops)):
        start = time.perf_counter()
        step()
        times[key].append((time.perf_counter() - start) * 1e3)
    c, t = np.median(times["compiled"]), np.median(times["tf_ops"])
    print(f"| {name} | {flops:.2f} | {picks} | {c:.2f} | {t:.2f} | {t / c:.2f} |", flush=True)


if __name__ == "__main__":
  main()
