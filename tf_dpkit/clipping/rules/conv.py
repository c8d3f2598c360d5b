"""``Conv1D`` / ``Conv2D``: per-microbatch kernel-gradient norms of a linear map on patches.

Microbatch ``j``'s kernel gradient is ``A_j^T G_j`` with ``A_j`` its examples' patches [S, kh kw
C] and ``G_j`` the output gradients [S, p] (``_linear.LinearNorms``).  Three ways, one chosen
per layer while tracing:

* compiled (``tf_dpkit.native``: float32 or 16-bit work on a CPU outside XLA, static image
  size, and the explicit form costing at most ``_NATIVE_ADVANTAGE`` times the Gram form):
  ``||A_j^T G_j||^2`` and the bias part formed block by block from the padded images, no patch
  in memory;
* with 1-3 input channels under oneDNN: per-example kernel gradients from the depthwise
  filter-gradient op run on chunks of examples;
* otherwise patches unfolded, then the explicit or Gram form.

Either way the clipped sum ``sum_j c_j A_j^T G_j`` is a contraction of kept per-microbatch
gradients where keeping them costs no more memory than the fast path's vector-Jacobian
product, which keeps the layer's input and output gradient instead
(``_linear.keeping_costs_no_memory``), else that product.
"""
from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tf_dpkit import distribute, native
from tf_dpkit.clipping.clipped_sum import scaled_row_sum
from tf_dpkit.clipping.rules._linear import (as_sequence, group_examples, keeping_costs_no_memory,
                                            LinearNorms, static)
from tf_dpkit.clipping.rules.registry import LayerTrace, register_layer_rule


def _gather_indices(size, kernel, stride, dilation, padding):
  """Input positions read by each (output position, kernel tap) along one spatial axis."""
  if padding == "SAME":
    out = -(-size // stride)
    pad = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
  else:
    out = (size - (kernel - 1) * dilation - 1) // stride + 1
    pad = 0
  positions = (np.arange(out) * stride)[:, None] + (np.arange(kernel) * dilation)[None, :]
  return positions, (pad // 2, pad - pad // 2), size + pad


def unfold_patches(x, kernel_hw, strides, dilations, padding):
  """Conv patches of x [B,H,W,C] as [B, S, kh*kw*C] in the kernel's (kh, kw, C) order.

  Two ways, chosen by channels: with fewer than 4 channels a convolution by an identity kernel
  (one dense conv, ``B S (kh kw C)^2`` multiply-adds), otherwise a gather of whole channel
  vectors (``B S kh kw C`` copies), whichever the benchmarks found faster on CPU.
  """
  channels = static(x.shape[-1])
  kh, kw = int(kernel_hw[0]), int(kernel_hw[1])
  if channels is None or channels < 4 or x.shape[1] is None or x.shape[2] is None:
    patches = tf.nn.convolution(x, _identity_kernel((kh, kw), channels, x.dtype),
                                strides=strides, padding=padding, dilations=dilations)
    return as_sequence(patches)
  rows, (top, bottom), height = _gather_indices(int(x.shape[1]), kh, strides[0], dilations[0],
                                                padding)
  cols, (left, right), width = _gather_indices(int(x.shape[2]), kw, strides[1], dilations[1],
                                               padding)
  index = (rows[:, None, :, None] * width + cols[None, :, None, :]).reshape(-1, kh * kw)
  padded = tf.pad(x, [[0, 0], [top, bottom], [left, right], [0, 0]])
  flat = tf.reshape(padded, [tf.shape(x)[0], height * width, channels])
  patches = tf.gather(flat, tf.constant(index, tf.int32), axis=1)  # [B, S, kh*kw, C]
  return tf.reshape(patches, [tf.shape(x)[0], index.shape[0], kh * kw * channels])


# Examples per call of the depthwise filter-gradient op in the first-layer branch below (with
# oneDNN); 0 turns the branch off.  The op's scratch grows with its batch (about 64 KiB per
# example for the MNIST CNN's 8x8x16 kernel); glibc serves a block above its mmap threshold
# (never above 32 MiB) with a fresh mapping whose pages fault in again at every call, so calls
# over chunks of 128 examples are faster than one call over the whole batch.
# Under a tf.distribute strategy the op runs on TensorFlow's worker threads, where glibc returns
# even small scratch to the system each step; there it is used only when the process keeps freed
# memory (tf_dpkit.distribute.host_keeps_freed_memory: keep_freed_host_memory() called before
# TensorFlow starts, or MALLOC_TOP_PAD_), else the unfolding
# (benchmarks/first_conv_methods.py measures both, with page faults).
_FILTER_BACKPROP_CHUNK = 128


# The compiled kernel forms the explicit per-microbatch gradients (cost S d p multiply-adds)
# with its clipped sum; the TensorFlow-op Gram form (unfolding, batched matmuls) costs
# S^2 (d + p).  The kernel is chosen while its multiply-add count is at most this many times the
# Gram form's, the crossover benchmarks/conv_norms.py measures.
_NATIVE_ADVANTAGE = 2


def same_or_valid_pads(image_hw, kernel_hw, strides, dilations, padding):
  """(top, left) zero padding of a 2-D convolution as TensorFlow pads it ("SAME": the smaller
  half of the total on top/left; "VALID": none), or None when the image size is not static."""
  if image_hw[0] is None or image_hw[1] is None:
    return None
  return tuple(_gather_indices(int(size), int(k), int(s), int(d), padding)[1][0]
               for size, k, s, d in zip(image_hw, kernel_hw, strides, dilations))


def onednn_enabled() -> bool:
  """Whether TensorFlow runs its CPU kernels through oneDNN in this process (default on Intel
  CPUs, off on others unless ``TF_ENABLE_ONEDNN_OPTS=1``); False if TensorFlow cannot say."""
  try:
    from tensorflow.python.util import _pywrap_util_port  # pylint: disable=g-import-not-at-top
    return bool(_pywrap_util_port.IsMklEnabled())
  except (ImportError, AttributeError):
    return False


def per_example_conv_kernel_grads(x, g, kernel_hw, strides, padding):
  """Per-example kernel gradients of an undilated 2-D convolution, [B, kh*kw*C, p].

  Example ``b``'s gradient is the filter gradient of a depthwise convolution whose channels are
  the examples' input channels ``(b, c)``, each with ``p`` filters: ``x`` as [1, H, W, B*C] and
  ``g`` (each example's output gradient [B, oh, ow, p], repeated over its C channels) as the
  output gradient [1, oh, ow, B*C*p].  One op, the cost of the forward convolution, and no
  unfolded patches.

  Args:
    x: the layer input [B, H, W, C]; g: the gradient at the pre-activation [B, oh, ow, p].
    kernel_hw: (kh, kw); strides: [s, s] (TensorFlow's depthwise kernels need equal strides);
      padding: "SAME" or "VALID".
  """
  if int(strides[0]) != int(strides[1]):
    raise ValueError(f"per_example_conv_kernel_grads needs equal strides, got {strides}.")
  batch, channels, filters = tf.shape(x)[0], static(x.shape[-1]), static(g.shape[-1])
  height, width = tf.shape(x)[1], tf.shape(x)[2]
  out_h, out_w = tf.shape(g)[1], tf.shape(g)[2]
  x_channels = tf.reshape(tf.transpose(x, [1, 2, 0, 3]), [1, height, width, batch * channels])
  g_t = tf.transpose(g, [1, 2, 0, 3])[:, :, :, None, :]  # [oh, ow, B, 1, p]
  g_t = tf.broadcast_to(g_t, tf.stack([out_h, out_w, batch, channels, filters]))
  g_channels = tf.reshape(g_t, [1, out_h, out_w, batch * channels * filters])
  kh, kw = int(kernel_hw[0]), int(kernel_hw[1])
  grads = tf.raw_ops.DepthwiseConv2dNativeBackpropFilter(
      input=x_channels, filter_sizes=tf.stack([kh, kw, batch * channels, filters]),
      out_backprop=g_channels, strides=[1, int(strides[0]), int(strides[1]), 1], padding=padding)
  grads = tf.transpose(tf.reshape(grads, [kh, kw, batch, channels, filters]), [2, 0, 1, 3, 4])
  return tf.reshape(grads, tf.stack([batch, kh * kw * channels, filters]))


def per_example_conv_kernel_grads_in_chunks(x, g, kernel_hw, strides, padding, chunk):
  """:func:`per_example_conv_kernel_grads` over consecutive chunks of at most ``chunk`` examples.

  Example ``b``'s gradient depends on ``x[b]`` and ``g[b]`` only, so cutting the batch changes
  no value; it bounds the op's scratch (see ``_FILTER_BACKPROP_CHUNK``).  With a batch size known
  while tracing the chunks are separate ops; otherwise (Poisson batches) the batch is padded with
  zero examples (zero gradients) to a multiple of ``chunk``, run chunk by chunk in a loop, and the
  padding is cut off.

  Args:
    as :func:`per_example_conv_kernel_grads`, and ``chunk``: a positive int.
  """
  if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
    raise ValueError(f"chunk must be a positive int, got {chunk!r}.")
  grads = lambda a, b: per_example_conv_kernel_grads(a, b, kernel_hw, strides, padding)
  batch = static(x.shape[0])
  if batch is not None:
    if batch <= chunk:
      return grads(x, g)
    sizes = [chunk] * (batch // chunk) + ([batch % chunk] if batch % chunk else [])
    return tf.concat([grads(a, b) for a, b in zip(tf.split(x, sizes), tf.split(g, sizes))], 0)
  batch = tf.shape(x)[0]
  count = (batch + chunk - 1) // chunk

  def in_chunks(t):
    rest = tf.shape(t)[1:]
    padded = tf.pad(t, tf.concat([[[0, count * chunk - batch]],
                                  tf.zeros([tf.rank(t) - 1, 2], tf.int32)], 0))
    return tf.reshape(padded, tf.concat([[count, chunk], rest], 0))

  rows = int(kernel_hw[0]) * int(kernel_hw[1]) * static(x.shape[-1])
  out = tf.map_fn(lambda pair: grads(pair[0], pair[1]), (in_chunks(x), in_chunks(g)),
                  fn_output_signature=tf.TensorSpec([chunk, rows, static(g.shape[-1])], x.dtype))
  return tf.reshape(out, [-1, rows, static(g.shape[-1])])[:batch]


def _identity_kernel(kernel_size, channels, dtype):
  """Conv kernel whose output channel (i, j, c) copies input (i, j, c): unfolds patches."""
  size = 1
  for k in kernel_size:
    size *= k
  eye = tf.eye(size * channels, dtype=dtype)
  return tf.reshape(eye, list(kernel_size) + [channels, size * channels])


@register_layer_rule(keras.layers.Conv1D)
@register_layer_rule(keras.layers.Conv2D)
def conv_rule(layer, inputs):
  """``Conv1D`` / ``Conv2D`` (channels_last, groups=1, padding same/valid)."""
  rank = layer.rank
  if (layer.data_format != "channels_last" or layer.groups != 1 or
      layer.padding not in ("same", "valid") or rank not in (1, 2)):
    return None
  x = inputs if rank == 2 else tf.expand_dims(inputs, 1)
  kernel = layer.kernel if rank == 2 else tf.expand_dims(layer.kernel, 0)
  strides = list(layer.strides) if rank == 2 else [1] + list(layer.strides)
  dilations = list(layer.dilation_rate) if rank == 2 else [1] + list(layer.dilation_rate)
  padding = layer.padding.upper()
  # tf.nn.convolution, not tf.nn.conv2d: without oneDNN (the default on CPUs without AVX-512)
  # Conv2DBackpropInput rejects dilation > 1, while convolution handles dilation by
  # space-to-batch.
  z = tf.nn.convolution(x, kernel, strides=strides, padding=padding, dilations=dilations)
  if layer.use_bias:
    z = z + layer.bias
  outputs = layer.activation(z) if layer.activation else z
  if rank == 1:
    outputs = tf.squeeze(outputs, 1)

  linear = LinearNorms(layer.use_bias)

  channels = static(x.shape[-1])
  kernel_hw = [int(k) for k in kernel.shape[:2]]
  pads = same_or_valid_pads(x.shape[1:3], kernel_hw, strides, dilations, padding)
  out_h, out_w, filters = (static(size) for size in z.shape[1:])
  compiled = None
  if pads is not None and None not in (out_h, out_w, channels, filters):
    taps = kernel_hw[0] * kernel_hw[1] * channels
    if linear.explicit_is_cheaper(_NATIVE_ADVANTAGE * out_h * out_w, taps, filters):
      compiled = native.kernels_for("conv", x.device, x.dtype)
  # The per-microbatch kernel gradients are kept (the clipped sum is then one contraction
  # instead of the fast path's VJP, a second filter gradient of the norms' cost) only where that
  # needs no more memory than the VJP, which keeps the layer's input and output gradient until
  # the clip factors are known (``_linear.keeping_costs_no_memory``).
  gradient_size = (None if channels is None or filters is None else
                   kernel_hw[0] * kernel_hw[1] * channels * filters)
  keep = keeping_costs_no_memory(gradient_size, x.shape[1:].num_elements(),
                                 z.shape[1:].num_elements())
  keep_grads = compiled is not None and keep
  # Few input channels are unfolded by an identity convolution of cost B S (kh kw C)^2; with
  # oneDNN the depthwise filter-gradient op gives the per-example gradients instead, in chunks
  # of _FILTER_BACKPROP_CHUNK examples; under a strategy only where freed memory is kept (see
  # there).
  eligible = (compiled is None and channels is not None and channels < 4 and
              dilations == [1, 1] and strides[0] == strides[1] and _FILTER_BACKPROP_CHUNK > 0
              and onednn_enabled())
  filter_backprop = eligible and (not tf.distribute.has_strategy() or
                                  distribute.host_keeps_freed_memory())
  if eligible and not filter_backprop:
    distribute.report_freed_memory_fallback(f"the per-example gradients of {layer.name!r}")

  def squared_norms(g, num_groups):
    g_seq = as_sequence(g)
    if compiled is not None:
      wide = lambda t: tf.cast(t, tf.float32)
      norms, bias_grads, kernel_grads = compiled.dpkit_conv_kernel_grad_squared_norms(
          wide(x), wide(g), tf.cast(num_groups, tf.int64), kernel_size=kernel_hw,
          strides=strides, dilations=dilations, pads=list(pads), with_bias=layer.use_bias,
          keep_grads=keep_grads)
      if keep_grads:
        scaled_sum.kept = (kernel_grads, bias_grads)
      return norms
    if not filter_backprop:
      patches = unfold_patches(x, kernel_hw, strides, dilations, padding)
      return linear.squared_norms(patches, g_seq, num_groups)
    grads = per_example_conv_kernel_grads_in_chunks(x, g, kernel_hw, strides, padding,
                                                    _FILTER_BACKPROP_CHUNK)
    grads = tf.reduce_sum(group_examples(grads[:, None], num_groups), axis=1)
    return linear.squared_norms_from_kernel_grads(grads, g_seq, num_groups)

  def scaled_sum(factors):
    """``sum_j c_j grad_j`` from kept per-microbatch gradients, else None (the fast path's VJP)."""
    if scaled_sum.kept is None:
      return linear.clipped_sum(factors, tf.shape(layer.kernel)) if keep else None
    kernel_grads, bias_grads = scaled_sum.kept
    sums = [tf.reshape(scaled_row_sum(factors, kernel_grads), tf.shape(layer.kernel))]
    if layer.use_bias:
      sums.append(scaled_row_sum(factors, bias_grads))
    return sums
  scaled_sum.kept = None
  return LayerTrace(outputs, z, squared_norms, scaled_sum)

