"""Time of one fast-path clipped sum traced with a fixed batch size vs an unknown (None) one.

    python benchmarks/dynamic_batch.py [BATCH] [mlp|cnn]

Both should cost the same: the linear rules keep every static size except the batch."""
import time, sys
import numpy as np, tensorflow as tf, keras
from tf_dpkit.clipping import clipped_sum_fast
from tf_dpkit.clipping.contract import per_example_loss_function

B = int(sys.argv[1]) if len(sys.argv) > 1 else 256
kind = sys.argv[2] if len(sys.argv) > 2 else "mlp"
keras.utils.set_random_seed(0)
if kind == "mlp":
  model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(512, activation="relu"),
                            keras.layers.Dense(512, activation="relu"), keras.layers.Dense(10)])
  x = tf.random.normal([B, 784])
else:
  model = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(16, 8, strides=2, padding="same", activation="relu"),
                            keras.layers.MaxPooling2D(2, 1), keras.layers.Conv2D(32, 4, strides=2, activation="relu"),
                            keras.layers.MaxPooling2D(2, 1), keras.layers.Flatten(), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
  x = tf.random.normal([B, 28, 28, 1])
y = tf.random.uniform([B], 0, 10, tf.int32)
w = tf.ones([B])
loss = per_example_loss_function(keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None))

def step(x, y, w):
  cs, _ = clipped_sum_fast(model, loss, (x, y, w), 1.0)
  return cs.grads, cs.norms
static = tf.function(step)
dyn = tf.function(step, input_signature=[tf.TensorSpec([None] + list(x.shape[1:])), tf.TensorSpec([None], tf.int32), tf.TensorSpec([None])])
for name, f in [("static", static), ("dynamic", dyn)]:
  r = f(x, y, w)
  t = time.perf_counter(); n = 10
  for _ in range(n):
    r = f(x, y, w); r[1].numpy()
  print(name, f"{(time.perf_counter()-t)/n*1000:.1f} ms")
a, b = static(x, y, w), dyn(x, y, w)
print("max diff grads", max(float(tf.reduce_max(tf.abs(u - v))) for u, v in zip(a[0], b[0])), "norms", float(tf.reduce_max(tf.abs(a[1]-b[1]))))
