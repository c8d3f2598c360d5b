"""``DepthwiseConv1D`` / ``DepthwiseConv2D``: per-channel kernel gradients formed explicitly."""
from __future__ import annotations

import keras
import tensorflow as tf

from tf_dpkit.clipping.clipped_sum import scaled_row_sum
from tf_dpkit.clipping.rules._linear import as_sequence, group_examples
from tf_dpkit.clipping.rules.conv import unfold_patches
from tf_dpkit.clipping.rules.registry import LayerTrace, register_layer_rule


@register_layer_rule(keras.layers.DepthwiseConv1D)
@register_layer_rule(keras.layers.DepthwiseConv2D)
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
    g_seq = as_sequence(g)
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
    grads = [tf.reshape(scaled_row_sum(factors, cache["kernel"]), tf.shape(layer.kernel))]
    if layer.use_bias:
      grads.append(scaled_row_sum(factors, cache["bias"]))
    return grads
  return LayerTrace(outputs, z, squared_norms, clipped_sum)
