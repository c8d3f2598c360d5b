"""Per-layer rules for fast per-example gradient norms (ghost clipping / book-keeping).

A rule tells the fast path how to run one layer so that its per-microbatch weight-gradient
norms come from quantities the ordinary backward pass already has:

    rule(layer, inputs) -> LayerTrace(outputs, watched, squared_norms)

* ``outputs``: the layer's output (what the next layer consumes), computed with the layer's own
  variables inside the caller's ``GradientTape``;
* ``watched``: the tensor ``z`` (usually the pre-activation) that depends on the layer's
  trainable variables directly; the caller obtains ``g = dL_i/dz`` for every example from one
  backward pass of the summed loss;
* ``squared_norms(g, num_groups) -> [M]``: the squared L2 norms of the per-microbatch gradients
  of the layer's trainable variables, where microbatch ``j`` holds examples ``j*k..(j+1)*k-1``
  (``k = B / M``) and ``g`` already carries each example's weight (``1/k`` for a mean).

The clipped sum itself is one vector-Jacobian product per layer, ``dz/dW^T (c * g)`` with the
clip factors ``c`` (see ``fast_path``), so rules only provide norms.

Linear maps ``z_s = a_s W`` summed over positions ``s`` (Dense on sequences, convolutions
after unfolding) have per-microbatch gradient ``A^T G``; its squared norm is computed either
explicitly (cost ``M S d p``) or with the Gram form ``sum((A A^T) * (G G^T))`` (cost
``M S^2 (d + p)``), whichever is cheaper for the static shapes.

Register your own layer with :func:`register_layer_rule`, and check it with
``tf_dpkit.clipping.testing.check_layer_rule``.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import keras
import numpy as np
import tensorflow as tf


class LayerTrace(NamedTuple):
  """What a rule returns for one layer call (see the module docstring).

  ``clipped_sum(factors)`` is optional: called after ``squared_norms`` with the [M] clip factors,
  it may return the clipped sums for ``layer.trainable_variables`` from per-microbatch gradients
  that ``squared_norms`` already formed (book-keeping), or None to let the caller use the VJP.
  """
  outputs: tf.Tensor
  watched: tf.Tensor
  squared_norms: Callable[[tf.Tensor, int], tf.Tensor]
  clipped_sum: Callable[[tf.Tensor], list | None] | None = None


_RULES: dict[type, Callable] = {}


def register_layer_rule(layer_class: type, rule: Callable) -> None:
  """Registers ``rule(layer, inputs) -> LayerTrace`` for instances of ``layer_class``.

  The most specific registered class in the layer's MRO wins, so a subclass can override a
  rule of its base.  A rule may return ``None`` to decline a particular configuration (the fast
  path then falls back to a layer-local ``tf.vectorized_map``).
  """
  if not (isinstance(layer_class, type) and issubclass(layer_class, keras.layers.Layer)):
    raise TypeError(f"layer_class must be a keras.layers.Layer subclass, got {layer_class!r}.")
  if not callable(rule):
    raise TypeError(f"rule must be callable, got {rule!r}.")
  _RULES[layer_class] = rule


def lookup_rule(layer) -> Callable | None:
  """Returns the rule registered for ``type(layer)`` or its nearest base class, else None."""
  for cls in type(layer).__mro__:
    if cls in _RULES:
      return _RULES[cls]
  return None


def group_examples(tensor, num_groups):
  """[B, S, ...] -> [M, (B/M) S, ...]: a microbatch becomes one long "example"."""
  shape = tf.shape(tensor)
  return tf.reshape(tensor, tf.concat([[num_groups, -1], shape[2:]], 0))


def _static(dim):
  return tf.compat.dimension_value(dim)


class LinearNorms:
  """Per-microbatch gradient norms of ``z_s = a_s W (+ b)`` summed over positions s.

  ``squared_norms(a, g, M)`` with A [B,S,d], G [B,S,p] returns ``||A_j^T G_j||^2 (+ ||sum_s
  G_j||^2)`` for the M microbatches.  When the explicit form is the cheaper one, the
  per-microbatch gradients are kept, and ``clipped_sum(factors, kernel_shape)`` returns
  ``sum_j c_j grad_j`` from them with one small contraction (no VJP needed).
  """

  def __init__(self, with_bias):
    self.with_bias = with_bias
    self.kernel_grads = None
    self.bias_grads = None

  def squared_norms(self, a, g, num_groups):
    a = group_examples(a, num_groups)
    g = group_examples(g, num_groups)
    s, d, p = _static(a.shape[1]), _static(a.shape[2]), _static(g.shape[2])
    use_gram = s is not None and d is not None and p is not None and s * s * (d + p) < s * d * p
    if use_gram:
      norms = tf.reduce_sum(
          tf.matmul(a, a, transpose_b=True) * tf.matmul(g, g, transpose_b=True), axis=[1, 2])
      return norms + self._bias_squared_norms(g)
    return self._explicit_squared_norms(tf.matmul(a, g, transpose_a=True), g)  # [M, d, p]

  def squared_norms_from_kernel_grads(self, kernel_grads, g, num_groups):
    """As :meth:`squared_norms`, given the per-microbatch kernel gradients [M, d, p] (formed by
    the caller some cheaper way) and G [B, S, p]."""
    return self._explicit_squared_norms(kernel_grads, group_examples(g, num_groups))

  def _explicit_squared_norms(self, kernel_grads, grouped_g):
    self.kernel_grads = kernel_grads
    norms = tf.reduce_sum(tf.square(kernel_grads), axis=[1, 2])
    return norms + self._bias_squared_norms(grouped_g)

  def _bias_squared_norms(self, grouped_g):
    if not self.with_bias:
      return 0.0
    self.bias_grads = tf.reduce_sum(grouped_g, axis=1)  # [M, p]
    return tf.reduce_sum(tf.square(self.bias_grads), axis=1)

  def clipped_sum(self, factors, kernel_shape):
    if self.kernel_grads is None:
      return None
    factors = tf.cast(factors, self.kernel_grads.dtype)
    grads = [tf.reshape(tf.tensordot(factors, self.kernel_grads, axes=1), kernel_shape)]
    if self.with_bias:
      grads.append(tf.tensordot(factors, self.bias_grads, axes=1))
    return grads


def _as_sequence(t):
  """[B, ..., d] -> [B, S, d] (S = product of the middle dims, 1 for 2-D)."""
  shape = tf.shape(t)
  return tf.reshape(t, tf.stack([shape[0], -1, shape[-1]]))


def _propagate_mask(inputs, outputs):
  mask = getattr(inputs, "_keras_mask", None)
  if mask is not None:
    try:
      outputs._keras_mask = mask  # pylint: disable=protected-access
    except AttributeError:
      pass
  return outputs


def dense_rule(layer, inputs):
  """``keras.layers.Dense`` on inputs of any rank (last axis contracted)."""
  if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
    return None
  kernel = layer.kernel
  z = tf.tensordot(inputs, kernel, axes=[[inputs.shape.rank - 1], [0]])
  if layer.use_bias:
    z = z + layer.bias
  outputs = _propagate_mask(inputs, layer.activation(z) if layer.activation else z)

  linear = LinearNorms(layer.use_bias)

  def squared_norms(g, num_groups):
    return linear.squared_norms(_as_sequence(inputs), _as_sequence(g), num_groups)
  return LayerTrace(outputs, z, squared_norms,
                    lambda factors: linear.clipped_sum(factors, tf.shape(kernel)))


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

  Two ways, chosen by channels (measured on the 2-core CPU for the MNIST CNN): with few channels
  a convolution by an identity kernel (one dense conv, B*S*(kh kw C)^2 multiply-adds) beat a
  gather of single floats (2.9 ms vs 11.5 ms at C=1); with C >= 4 gathering whole channel
  vectors wins (0.9 ms vs 5.7 ms at C=16).
  """
  channels = _static(x.shape[-1])
  kh, kw = int(kernel_hw[0]), int(kernel_hw[1])
  if channels is None or channels < 4 or x.shape[1] is None or x.shape[2] is None:
    patches = tf.nn.convolution(x, _identity_kernel((kh, kw), channels, x.dtype),
                                strides=strides, padding=padding, dilations=dilations)
    return _as_sequence(patches)
  rows, (top, bottom), height = _gather_indices(int(x.shape[1]), kh, strides[0], dilations[0],
                                                padding)
  cols, (left, right), width = _gather_indices(int(x.shape[2]), kw, strides[1], dilations[1],
                                               padding)
  index = (rows[:, None, :, None] * width + cols[None, :, None, :]).reshape(-1, kh * kw)
  padded = tf.pad(x, [[0, 0], [top, bottom], [left, right], [0, 0]])
  flat = tf.reshape(padded, [tf.shape(x)[0], height * width, channels])
  patches = tf.gather(flat, tf.constant(index, tf.int32), axis=1)  # [B, S, kh*kw, C]
  return tf.reshape(patches, [tf.shape(x)[0], index.shape[0], kh * kw * channels])


_MAX_FILTER_BACKPROP_BATCH = 768


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
  batch, channels, filters = tf.shape(x)[0], _static(x.shape[-1]), _static(g.shape[-1])
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


def _identity_kernel(kernel_size, channels, dtype):
  """Conv kernel whose output channel (i, j, c) copies input (i, j, c): unfolds patches."""
  size = 1
  for k in kernel_size:
    size *= k
  eye = tf.eye(size * channels, dtype=dtype)
  return tf.reshape(eye, list(kernel_size) + [channels, size * channels])


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
  # tf.nn.convolution, not tf.nn.conv2d: without oneDNN (e.g. on AMD CPUs) Conv2DBackpropInput
  # rejects dilation > 1, while convolution handles dilation by space-to-batch.
  z = tf.nn.convolution(x, kernel, strides=strides, padding=padding, dilations=dilations)
  if layer.use_bias:
    z = z + layer.bias
  outputs = layer.activation(z) if layer.activation else z
  if rank == 1:
    outputs = tf.squeeze(outputs, 1)

  linear = LinearNorms(layer.use_bias)

  channels = _static(x.shape[-1])
  # Few input channels would be unfolded by an identity convolution of cost B S (kh kw C)^2;
  # with oneDNN the depthwise filter-gradient op gives the per-example gradients faster up to
  # a batch of _MAX_FILTER_BACKPROP_BATCH (MNIST CNN first layer, 2-core AMD EPYC, oneDNN:
  # 6.7 vs 11.3 ms at 256, 10.9 vs 18.9 ms at 768, but 38 vs 25 ms at 1024); without oneDNN
  # it is always slower (78 vs 26 ms at 256).
  filter_backprop = (channels is not None and channels < 4 and dilations == [1, 1] and
                     strides[0] == strides[1] and onednn_enabled())

  def squared_norms(g, num_groups):
    g_seq = _as_sequence(g)
    batch = _static(x.shape[0])
    if not filter_backprop or (batch is not None and batch > _MAX_FILTER_BACKPROP_BATCH):
      patches = unfold_patches(x, kernel.shape[:2], strides, dilations, padding)
      return linear.squared_norms(patches, g_seq, num_groups)

    def via_filter_backprop():
      grads = per_example_conv_kernel_grads(x, g, kernel.shape[:2], strides, padding)
      return tf.reduce_sum(group_examples(grads[:, None], num_groups), axis=1)

    def via_patches():
      patches = unfold_patches(x, kernel.shape[:2], strides, dilations, padding)
      return tf.matmul(group_examples(patches, num_groups), group_examples(g_seq, num_groups),
                       transpose_a=True)

    if batch is not None:
      grads = via_filter_backprop()
    else:  # Poisson batches: the size is known only when the step runs
      grads = tf.cond(tf.shape(x)[0] <= _MAX_FILTER_BACKPROP_BATCH, via_filter_backprop,
                      via_patches)
    return linear.squared_norms_from_kernel_grads(grads, g_seq, num_groups)
  return LayerTrace(outputs, z, squared_norms,
                    lambda factors: linear.clipped_sum(factors, tf.shape(layer.kernel)))


def depthwise_conv_rule(layer, inputs):
  """``DepthwiseConv1D`` / ``DepthwiseConv2D`` (channels_last, padding same/valid).

  Output channel ``c*m + k`` (``m`` = depth multiplier) is input channel ``c``'s patch times
  ``kernel[..., c, k]``, so the per-microbatch kernel gradient is, per channel, the small
  product ``patches_c^T g_c`` ([taps, m]); it is formed explicitly (cost ``M S taps C m``,
  the same order as the forward convolution) and reused for the clipped sum.
  """
  rank = layer.rank
  if (layer.data_format != "channels_last" or layer.padding not in ("same", "valid") or
      rank not in (1, 2)):
    return None
  z = keras.ops.depthwise_conv(inputs, layer.kernel, strides=layer.strides,
                               padding=layer.padding, dilation_rate=layer.dilation_rate,
                               data_format=layer.data_format)
  if layer.use_bias:
    z = z + layer.bias
  outputs = layer.activation(z) if layer.activation else z
  x = inputs if rank == 2 else tf.expand_dims(inputs, 1)
  kernel_hw = tuple(layer.kernel_size) if rank == 2 else (1,) + tuple(layer.kernel_size)
  strides = list(layer.strides) if rank == 2 else [1] + list(layer.strides)
  dilations = list(layer.dilation_rate) if rank == 2 else [1] + list(layer.dilation_rate)
  channels, multiplier = int(layer.kernel.shape[-2]), int(layer.kernel.shape[-1])
  taps = kernel_hw[0] * kernel_hw[1]
  cache = {}

  def squared_norms(g, num_groups):
    patches = unfold_patches(x, kernel_hw, strides, dilations, layer.padding.upper())
    patches = group_examples(tf.reshape(patches, tf.concat([tf.shape(patches)[:2],
                                                            [taps, channels]], 0)), num_groups)
    g_seq = _as_sequence(g)
    g_grouped = group_examples(
        tf.reshape(g_seq, tf.concat([tf.shape(g_seq)[:2], [channels, multiplier]], 0)),
        num_groups)
    cache["kernel"] = tf.einsum("nstc,nsck->ntck", patches, g_grouped)  # [M, taps, C, m]
    norms = tf.reduce_sum(tf.square(cache["kernel"]), axis=[1, 2, 3])
    if layer.use_bias:
      cache["bias"] = tf.reduce_sum(group_examples(g_seq, num_groups), axis=1)  # [M, C*m]
      norms += tf.reduce_sum(tf.square(cache["bias"]), axis=1)
    return norms

  def clipped_sum(factors):
    factors = tf.cast(factors, cache["kernel"].dtype)
    grads = [tf.reshape(tf.tensordot(factors, cache["kernel"], axes=1), tf.shape(layer.kernel))]
    if layer.use_bias:
      grads.append(tf.tensordot(factors, cache["bias"], axes=1))
    return grads
  return LayerTrace(outputs, z, squared_norms, clipped_sum)


def embedding_rule(layer, inputs):
  """``keras.layers.Embedding``: rows gathered by token; norms from token-equality x Gram."""
  if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
    return None
  ids = tf.cast(inputs, tf.int32)
  z = tf.gather(layer.embeddings, ids)
  outputs = z
  if layer.mask_zero:
    outputs._keras_mask = tf.not_equal(ids, 0)  # pylint: disable=protected-access

  def squared_norms(g, num_groups):
    tokens = group_examples(tf.reshape(ids, [tf.shape(ids)[0], -1, 1]), num_groups)[..., 0]
    grads = group_examples(_as_sequence(g), num_groups)
    same = tf.cast(tf.equal(tokens[:, :, None], tokens[:, None, :]), g.dtype)
    return tf.reduce_sum(same * tf.matmul(grads, grads, transpose_b=True), axis=[1, 2])
  return LayerTrace(outputs, z, squared_norms)


def layer_normalization_rule(layer, inputs):
  """``keras.layers.LayerNormalization`` over the last axis (gamma and beta are diagonal)."""
  axis = layer.axis if isinstance(layer.axis, (list, tuple)) else [layer.axis]
  rank = inputs.shape.rank
  if [a % rank for a in axis] != [rank - 1] or getattr(layer, "rms_scaling", False):
    return None
  mean, variance = tf.nn.moments(inputs, axes=[rank - 1], keepdims=True)
  normalized = (inputs - mean) * tf.math.rsqrt(variance + layer.epsilon)
  z = normalized
  if layer.scale:
    z = z * layer.gamma
  if layer.center:
    z = z + layer.beta
  outputs = _propagate_mask(inputs, z)

  def squared_norms(g, num_groups):
    total = 0.0
    g_seq = group_examples(_as_sequence(g), num_groups)
    if layer.scale:
      xhat = group_examples(_as_sequence(normalized), num_groups)
      total += tf.reduce_sum(tf.square(tf.reduce_sum(g_seq * xhat, axis=1)), axis=1)
    if layer.center:
      total += tf.reduce_sum(tf.square(tf.reduce_sum(g_seq, axis=1)), axis=1)
    return total
  return LayerTrace(outputs, z, squared_norms)


def einsum_dense_rule(layer, inputs):
  """``keras.layers.EinsumDense``: per-example kernel gradients by one einsum (first input
  letter = batch), bias gradients by summing ``g`` over the non-bias output axes."""
  if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
    return None
  equation = layer.equation.replace(" ", "")
  lhs, out_spec = equation.split("->")
  in_spec, kernel_spec = lhs.split(",")
  if "." in equation or not in_spec or in_spec[0] != out_spec[0] or in_spec[0] in kernel_spec:
    return None
  batch_letter = in_spec[0]
  z = tf.einsum(equation, inputs, layer.kernel)
  if layer.bias is not None:
    z = z + layer.bias
  outputs = _propagate_mask(inputs, layer.activation(z) if layer.activation else z)

  def squared_norms(g, num_groups):
    per_example = tf.einsum(f"{in_spec},{out_spec}->{batch_letter}{kernel_spec}", inputs, g)
    grouped = tf.reduce_sum(group_examples(per_example[:, None], num_groups), axis=1)
    total = tf.reduce_sum(tf.reshape(tf.square(grouped), [num_groups, -1]), axis=1)
    if layer.bias is not None:
      # The bias broadcasts against the output's trailing axes: sum g over the axes where the
      # (left-padded) bias shape is 1.
      bias_shape = list(layer.bias.shape)
      padded = [1] * (g.shape.rank - 1 - len(bias_shape)) + bias_shape
      reduce_axes = [i + 1 for i, d in enumerate(padded) if d == 1]
      bias_grad = tf.reduce_sum(g, axis=reduce_axes) if reduce_axes else g
      bias_grad = tf.reshape(bias_grad, [tf.shape(g)[0], -1])
      grouped_bias = tf.reduce_sum(group_examples(bias_grad[:, None], num_groups), axis=1)
      total += tf.reduce_sum(tf.reshape(tf.square(grouped_bias), [num_groups, -1]), axis=1)
    return total
  return LayerTrace(outputs, z, squared_norms)


register_layer_rule(keras.layers.Dense, dense_rule)
register_layer_rule(keras.layers.EinsumDense, einsum_dense_rule)
register_layer_rule(keras.layers.Conv1D, conv_rule)
register_layer_rule(keras.layers.Conv2D, conv_rule)
register_layer_rule(keras.layers.DepthwiseConv1D, depthwise_conv_rule)
register_layer_rule(keras.layers.DepthwiseConv2D, depthwise_conv_rule)
register_layer_rule(keras.layers.Embedding, embedding_rule)
register_layer_rule(keras.layers.LayerNormalization, layer_normalization_rule)
