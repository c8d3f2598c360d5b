"""Cost of drawing n standard normals on this CPU: tf_dpkit's sampler, its parts, alternatives.

    python benchmarks/noise_draw.py                       # n = the MLP's and text model's sizes
    python benchmarks/noise_draw.py --sizes=1000000 --reps=50

DP-SGD draws one normal per parameter per step whatever the batch, so this cost is a floor
under the ratio of a DP step to a non-private one.  Each candidate runs as its own
``tf.function`` on a seed read from a variable (so nothing is constant-folded), interleaved rep
by rep; the table gives median milliseconds per draw.

* ``tf_dpkit``: ``tf_dpkit.noise.stateless_standard_normal`` on the CPU: the compiled kernels
  of ``tf_dpkit.native`` where they built (Philox uniforms + Box-Muller);
* ``tf_dpkit_fused_add``: ``x + stddev * z`` in one pass, as ``add_gaussian_noise`` draws it;
* ``tf_dpkit_tf_ops``: the same sampler written with TensorFlow ops (``tf_ops_standard_normal``,
  what runs without the compiled kernels);
* ``philox_uniforms_only``: the ``n`` float32 uniforms it starts from (TensorFlow's Philox
  kernel), i.e. the part no rewrite with TensorFlow ops can avoid;
* ``box_muller_only``: the transform of ready uniforms;
* ``tf_stateless_normal``: TensorFlow's own ``tf.random.stateless_normal`` kernel;
* ``tf_dpkit_xla``: the tf_dpkit sampler under ``jit_compile=True`` (XLA's CPU backend).
"""
from __future__ import annotations

import time

import numpy as np
import tensorflow as tf
from absl import app, flags

from tf_dpkit import noise

flags.DEFINE_list("sizes", ["535818", "644290"],
                  "Numbers of normals (defaults: the benchmark MLP's and text model's parameter "
                  "counts).")
flags.DEFINE_integer("reps", 30, "Timed draws per candidate (interleaved).")
FLAGS = flags.FLAGS


def candidates(size, seed):
  half = (size + 1) // 2
  ready = tf.random.uniform([2, half])

  def ours():
    return noise.stateless_standard_normal(tf.TensorShape([size]), seed.read_value(),
                                           device="/CPU:0")

  def tf_ops():
    return noise.tf_ops_standard_normal(tf.TensorShape([size]), seed.read_value())

  gradient = tf.zeros([size])
  key = noise.fresh_key(1)

  def fused_add():
    return noise.add_gaussian_noise([tf.identity(gradient)], 1.0, key, seed.read_value()[0])[0]

  def uniforms():
    return tf.random.stateless_uniform([2, half], seed=seed.read_value())

  def transform():
    radius = tf.sqrt(-2.0 * tf.math.log1p(-ready[0]))
    angle = (2.0 * np.pi) * ready[1]
    return tf.concat([radius * tf.cos(angle), radius * tf.sin(angle)], axis=0)[:size]

  def tf_kernel():
    return tf.random.stateless_normal([size], seed=seed.read_value())

  return {"tf_dpkit": tf.function(ours), "tf_dpkit_fused_add": tf.function(fused_add),
          "tf_dpkit_tf_ops": tf.function(tf_ops), "philox_uniforms_only": tf.function(uniforms),
          "box_muller_only": tf.function(transform), "tf_stateless_normal": tf.function(tf_kernel),
          "tf_dpkit_xla": tf.function(tf_ops, jit_compile=True)}


def main(argv):
  del argv
  seed = tf.Variable([3, 4], dtype=tf.int64)
  names = list(candidates(2, seed))
  print("| normals | " + " | ".join(names) + " |")
  print("|---" * (len(names) + 1) + "|")
  for size in map(int, FLAGS.sizes):
    fns = candidates(size, seed)
    for fn in fns.values():
      fn().numpy()
      fn().numpy()
    times = {name: [] for name in fns}
    for _ in range(FLAGS.reps):
      for name, fn in fns.items():
        start = time.perf_counter()
        fn().numpy()
        times[name].append(time.perf_counter() - start)
    print(f"| {size:,} | " + " | ".join(f"{1000 * np.median(t):.2f} ms" for t in times.values())
          + " |")


if __name__ == "__main__":
  app.run(main)
