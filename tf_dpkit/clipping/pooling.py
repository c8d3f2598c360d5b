"""Max pooling whose input gradient is a compiled kernel, for the fast path's forward phase.

A weightless layer changes no clipping rule, but its backward pass is part of every DP step:
without oneDNN (TensorFlow's default on x86 CPUs other than those with AVX512_VNNI,
AVX512_BF16, AVX_VNNI or AMX) TensorFlow's CPU ``MaxPoolGrad`` took longer than any other op of
a small CNN's DP step.  The fast path therefore runs an exact ``keras.layers.MaxPooling2D``
(channels_last, float32 in and out, on a CPU with oneDNN off, compiled ``pool`` kernels loaded;
with oneDNN, its own pooling gradient is faster) through :func:`max_pool_2d`: forward
``tf.nn.max_pool2d`` (Keras's own op), input gradient ``tf_dpkit.native``'s
``DpkitMaxPoolGrad``, which routes each window's output gradient to the same input entry as
TensorFlow's CPU kernel (the first maximum in row-major order), so the per-example gradients,
norms and clipped sums are unchanged bit for bit.  Any other layer, dtype or device runs the
layer's own call.  The gradient op has no gradient of its own: no second derivatives through
the fast path's backward pass.  Design: ``docs/design/native.md``.
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tf_dpkit import native
from tf_dpkit.clipping.rules.conv import onednn_enabled, same_or_valid_pads


def max_pool_2d(x, pool_size, strides, padding, ops):
  """``tf.nn.max_pool2d(x, pool_size, strides, padding)`` (NHWC) whose gradient is ``ops``'s
  ``dpkit_max_pool_grad``: ``dx[b, i, j, c]`` is the sum of the output gradients of the windows
  whose first row-major maximum of channel ``c`` is at ``(i, j)``.

  Args:
    x: float32 [B, H, W, C] with static H and W.
    pool_size, strides: (height, width) pairs of positive ints.
    padding: ``"SAME"`` or ``"VALID"`` (TensorFlow's padding; padded entries never win).
    ops: the loaded ``pool`` kernels (``tf_dpkit.native.kernels_for("pool", ...)``).
  """
  pool_size, strides = [int(k) for k in pool_size], [int(s) for s in strides]
  pads = same_or_valid_pads(x.shape[1:3], pool_size, strides, [1, 1], padding)
  if pads is None:
    raise ValueError(f"max_pool_2d needs a static image size, got x of shape {x.shape}.")

  @tf.custom_gradient
  def pool(inputs):
    def grad(dy):
      return ops.dpkit_max_pool_grad(inputs, dy, ksize=pool_size, strides=strides,
                                     pads=list(pads))
    return tf.nn.max_pool2d(inputs, pool_size, strides, padding), grad
  return pool(x)


def fast_call(layer, inputs):
  """``layer(inputs)`` through :func:`max_pool_2d` when ``layer`` is exactly a channels_last
  ``keras.layers.MaxPooling2D`` computing in float32 on ``inputs`` (float32, static image size)
  on a CPU, with oneDNN off and the compiled ``pool`` kernels loaded; None otherwise (the
  caller then runs the layer's own call)."""
  if (type(layer) is not keras.layers.MaxPooling2D or layer.data_format != "channels_last" or
      layer.compute_dtype != "float32" or not isinstance(inputs, tf.Tensor) or
      inputs.dtype != tf.float32 or inputs.shape.rank != 4 or None in inputs.shape[1:3] or
      onednn_enabled()):
    return None
  ops = native.kernels_for("pool", inputs.device, inputs.dtype)
  if ops is None:
    return None
  return max_pool_2d(inputs, layer.pool_size, layer.strides, layer.padding.upper(), ops)
