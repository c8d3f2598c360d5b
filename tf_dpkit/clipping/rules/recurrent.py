"""``SimpleRNN``, ``LSTM`` and ``GRU`` (``reset_after=True``): per-step linear maps summed over
time steps.

At step ``t`` the weights act only through linear maps of the step's input ``x_t`` and the
previous output ``h_{t-1}``: ``u_t = x_t W + h_{t-1} U + b`` (SimpleRNN: ``p = units``; LSTM:
the four gates, ``p = 4 units``), or for the GRU ``ux_t = x_t W + b_in`` and
``uh_t = h_{t-1} U + b_rec`` (``p = 3 units`` each, the reset gate applied after ``U``).  So an
example's weight gradient is ``sum_t [x_t, h_{t-1}]^T g_t`` (and ``sum_t g_t`` for the bias),
with ``g_t = dL/du_t``: the gradient of a linear map over ``T`` positions, whose norms
``_linear.LinearNorms`` forms (explicitly or in the Gram form).

To get every ``g_t`` from the one backward pass, the rule runs the layer's recurrence itself
(Keras's own loop, ``_keras_internals.rnn_loop``: same masks, reversal and outputs) with a zero
"probe" ``e`` [B, T, p] added to ``u_t`` at each step; ``dL/de`` is then ``g``.  The probe does
not depend on the weights, so the clipped sum is formed directly:
``sum_b c_b sum_t [x_t, h_{t-1}]^T g_t`` (one contraction, the cost of an ordinary gradient).
A masked step's ``u_t`` reaches nothing (its state and output are carried over), so its ``g_t``
is exactly 0.

Declined (the layer is then replayed per example): dropout or recurrent dropout,
``return_state``, ``stateful``, the GRU with ``reset_after=False``, inputs not [B, T, d].
"""
from __future__ import annotations

import keras
import tensorflow as tf

from tf_dpkit.clipping import _keras_internals as internals
from tf_dpkit.clipping.rules._linear import LinearNorms, static
from tf_dpkit.clipping.rules.registry import LayerTrace, register_layer_rule


def _zero_probe(shape, dtype, anchor):
  """Zeros of ``shape`` recorded by the caller's tape (through ``anchor``, a weight read, with
  a zero gradient to it), so that the tape gives ``dL/d probe``."""
  @tf.custom_gradient
  def probe(a):
    def grad(unused_dy):
      return tf.zeros_like(a)
    return tf.zeros(shape, dtype), grad
  return probe(anchor)


def _width(layer):
  """The width ``p`` of each probed pre-activation and the number of probes (GRU: 2)."""
  units = layer.cell.units
  if type(layer) is keras.layers.SimpleRNN:
    return units, 1
  if type(layer) is keras.layers.LSTM:
    return 4 * units, 1
  return 3 * units, 2


def _step(layer, d):
  """The cell's step on ``[x_t, e_t]`` with the probe added to its pre-activation(s); outputs
  ``[h_t, h_{t-1}]``."""
  cell = layer.cell
  units = cell.units
  kind = type(layer)

  def step(inputs, states):
    x, e = inputs[:, :d], inputs[:, d:]
    h_prev = states[0]
    if kind is keras.layers.SimpleRNN:
      u = tf.matmul(x, cell.kernel) + tf.matmul(h_prev, cell.recurrent_kernel) + e
      if cell.use_bias:
        u = u + cell.bias
      h = cell.activation(u) if cell.activation is not None else u
      new_states = [h]
    elif kind is keras.layers.LSTM:
      u = tf.matmul(x, cell.kernel) + tf.matmul(h_prev, cell.recurrent_kernel) + e
      if cell.use_bias:
        u = u + cell.bias
      u_i, u_f, u_c, u_o = tf.split(u, 4, axis=1)
      c = (cell.recurrent_activation(u_f) * states[1] +
           cell.recurrent_activation(u_i) * cell.activation(u_c))
      h = cell.recurrent_activation(u_o) * cell.activation(c)
      new_states = [h, c]
    else:  # GRU, reset_after=True
      ux = tf.matmul(x, cell.kernel) + e[:, :3 * units]
      uh = tf.matmul(h_prev, cell.recurrent_kernel) + e[:, 3 * units:]
      if cell.use_bias:
        ux = ux + cell.bias[0]
        uh = uh + cell.bias[1]
      x_z, x_r, x_h = tf.split(ux, 3, axis=1)
      h_z, h_r, h_h = tf.split(uh, 3, axis=1)
      z = cell.recurrent_activation(x_z + h_z)
      r = cell.recurrent_activation(x_r + h_r)
      hh = cell.activation(x_h + r * h_h)
      h = z * h_prev + (1 - z) * hh
      new_states = [h]
    return tf.concat([h, h_prev], axis=1), new_states
  return step


@register_layer_rule(keras.layers.SimpleRNN)
@register_layer_rule(keras.layers.LSTM)
@register_layer_rule(keras.layers.GRU)
def recurrent_rule(layer, inputs):
  """``SimpleRNN`` / ``LSTM`` / ``GRU`` on [B, T, d] inputs (module docstring)."""
  cell = layer.cell
  d = static(inputs.shape[-1]) if inputs.shape.rank == 3 else None
  if (d is None or layer.return_state or layer.stateful or cell.dropout or
      cell.recurrent_dropout or (type(layer) is keras.layers.GRU and not cell.reset_after)):
    return None
  units = cell.units
  width, probes = _width(layer)
  batch, steps = tf.shape(inputs)[0], tf.shape(inputs)[1]
  probe = _zero_probe(tf.stack([batch, steps, width * probes]), inputs.dtype, cell.kernel[0, 0])
  probe.set_shape([inputs.shape[0], inputs.shape[1], width * probes])
  mask = internals.keras_mask(inputs)
  initial = [tf.zeros(tf.stack([batch, units]), inputs.dtype)]
  if type(layer) is keras.layers.LSTM:
    initial.append(tf.zeros(tf.stack([batch, units]), inputs.dtype))
  last, outputs, _ = internals.rnn_loop()(
      _step(layer, d), tf.concat([inputs, probe], axis=-1), initial,
      go_backwards=layer.go_backwards, mask=mask, unroll=layer.unroll,
      input_length=inputs.shape[1], zero_output_for_mask=layer.zero_output_for_mask,
      return_all_outputs=True)
  h_prev = outputs[:, :, units:]  # in the loop's order: reversed when go_backwards
  if layer.go_backwards:
    h_prev = tf.reverse(h_prev, axis=[1])
  if layer.return_sequences:
    result = outputs[:, :, :units]
    if mask is not None:
      internals.set_keras_mask(result, mask)
  else:
    result = last[:, :units]

  # (A, probe slice, kernel, bias row) per linear map; A [B, T, in], aligned with the probe.
  if probes == 1:
    maps = [(tf.concat([inputs, h_prev], axis=-1), slice(0, width))]
  else:
    maps = [(inputs, slice(0, width)), (h_prev, slice(width, 2 * width))]
  cache = {}

  def squared_norms(g, num_groups):
    cache["g"] = g
    total = 0.0
    for a, part in maps:
      total += LinearNorms(cell.use_bias).squared_norms(a, g[:, :, part], num_groups)
    return total

  def clipped_sum(factors):
    g = cache["g"]
    per_example = tf.repeat(tf.cast(factors, g.dtype), tf.shape(g)[0] // tf.size(factors))
    g = g * per_example[:, None, None]
    grads = [tf.einsum("bti,btp->ip", a, g[:, :, part]) for a, part in maps]
    biases = [tf.reduce_sum(g[:, :, part], axis=[0, 1]) for _, part in maps]
    if probes == 1:
      sums = {id(cell.kernel): grads[0][:d], id(cell.recurrent_kernel): grads[0][d:]}
      if cell.use_bias:
        sums[id(cell.bias)] = biases[0]
    else:
      sums = {id(cell.kernel): grads[0], id(cell.recurrent_kernel): grads[1]}
      if cell.use_bias:
        sums[id(cell.bias)] = tf.stack(biases)
    return [sums[id(v)] for v in layer.trainable_variables]
  return LayerTrace(result, probe, squared_norms, clipped_sum)
