"""Small generator and discriminator builders for DP-GANs (functional Keras models).

:func:`mlp_generator` and :func:`conv_generator` take ``[noise [B, d], one_hot_label [B, K]]``
(``noise`` alone when ``num_classes`` is None) and output images (or rows: any
``image_shape``) in [0, 1] (sigmoid); :func:`mlp_discriminator` (label concatenated or
projected) and :func:`conv_discriminator` take ``[image, one_hot_label]`` and output one logit
``[B, 1]``.  Discriminators hold only layers with fast per-example clipping rules (Dense,
Conv2D) and no normalisation that mixes examples; generators may use BatchNormalization.
:func:`sequence_generator` / :func:`sequence_discriminator` are their 1-D convolutional
counterparts for rows that are sequences (``[B, length]``); :class:`RowStatistics` is a fixed,
weightless summary of such a row (level, spread, roughness) and :func:`statistics_discriminator`
a discriminator that reads only that summary (a PATE-GAN student; the teachers' counterpart is
``teacher_ensemble_discriminator(..., row_statistics=True)``).

Layer-by-layer shapes: docs/design/generative.md.
"""
from __future__ import annotations

import math

import keras
from keras import ops

from analysis import _checks

__all__ = ["CONDITIONINGS", "ROW_STATISTICS", "RowStatistics", "conv_discriminator",
           "conv_generator", "mlp_discriminator", "mlp_generator", "sequence_discriminator",
           "sequence_generator", "statistics_discriminator"]

#: The entries of :class:`RowStatistics`' output, in order.
ROW_STATISTICS = ("level", "log_spread", "log_spread_diff1", "log_spread_diff2")
_VARIANCE_FLOOR = 1e-6


@keras.saving.register_keras_serializable(package="tf_dpkit.generative")
class RowStatistics(keras.layers.Layer):
  """A fixed, weightless summary of rows that are sequences: ``[..., L] -> [..., 4]``.

  For a row ``r`` of ``L >= 3`` values in [0, 1] (a row of a table mapped to the unit scale by
  a public function), with ``s(v) = 0.5 log(Var(v) + 1e-6)`` (``Var``: the population
  variance over the row; ``s`` is the log of the standard deviation for spreads well above
  1e-3, and tends to ``0.5 log 1e-6`` below):

  * ``level = 10 (mean(r) - 1/2)``;
  * ``log_spread = s(r) + 3``;
  * ``log_spread_diff1 = s(r[1:] - r[:-1]) + 4``;
  * ``log_spread_diff2 = s(second differences of r) + 4``.

  The spread is the signal's amplitude, the spreads of its differences its roughness (the
  high-frequency share of its power).  The affine constants are fixed (they put rows with a
  standard deviation of 0.002 to 0.3 in the unit scale at about -3 to +2), not estimated from
  data.  The statistics of a row read that row only (every leading axis is a batch axis), so
  the layer never mixes examples, nor the teachers of a batched ensemble.  The row length
  must be known when the layer is built (``L >= 3``).
  """

  def compute_output_shape(self, input_shape):
    return (*input_shape[:-1], len(ROW_STATISTICS))

  def build(self, input_shape):
    if input_shape[-1] is None or input_shape[-1] < 3:
      raise ValueError(f"RowStatistics needs rows of length >= 3 (second differences), got "
                       f"input shape {tuple(input_shape)}.")
    super().build(input_shape)

  def call(self, rows):
    def log_spread(v):
      centred = v - ops.mean(v, axis=-1, keepdims=True)
      return 0.5 * ops.log(ops.mean(ops.square(centred), axis=-1) + _VARIANCE_FLOOR)

    diff1 = rows[..., 1:] - rows[..., :-1]
    diff2 = diff1[..., 1:] - diff1[..., :-1]
    return ops.stack([10.0 * (ops.mean(rows, axis=-1) - 0.5), log_spread(rows) + 3.0,
                      log_spread(diff1) + 4.0, log_spread(diff2) + 4.0], axis=-1)


def _check_common(latent_dim, num_classes, image_shape, hidden):
  if num_classes is not None:
    _checks.check_integer("num_classes", num_classes, minimum=2, none_allowed=True)
  if latent_dim is not None:
    _checks.check_integer("latent_dim", latent_dim, minimum=1)
  shape = tuple(image_shape)
  if not shape or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
    raise ValueError(f"image_shape must be a tuple of integers >= 1, got {image_shape!r}.")
  hidden = tuple(hidden)
  if not hidden:
    raise ValueError("hidden must hold at least one layer width (integers >= 1).")
  for i, h in enumerate(hidden):
    _checks.check_integer(f"hidden[{i}]", h, minimum=1)
  return shape, hidden


def _generator_inputs(latent_dim, num_classes):
  """The inputs of a (conditional) generator, ``[noise]`` or ``[noise, one_hot_label]``, and
  the tensor its first layer reads (the noise, or noise and label concatenated)."""
  noise = keras.Input((latent_dim,), name="noise")
  if num_classes is None:
    return [noise], noise
  label = keras.Input((num_classes,), name="one_hot_label")
  return [noise, label], keras.layers.Concatenate()([noise, label])


def mlp_generator(latent_dim=64, num_classes=10, image_shape=(28, 28, 1), hidden=(256, 512),
                  batch_norm=True, name="generator"):
  """Conditional (or, with ``num_classes=None``, unconditional) MLP generator; see module doc.

  ``batch_norm``: put ``BatchNormalization(momentum=0.8)`` after each hidden Dense layer
  (allowed in the generator, which never sees real data; without it these MLPs tend to
  collapse to one image).
  """
  shape, hidden = _check_common(latent_dim, num_classes, image_shape, hidden)
  inputs, h = _generator_inputs(latent_dim, num_classes)
  for width in hidden:
    h = keras.layers.Dense(width)(h)
    if batch_norm:
      h = keras.layers.BatchNormalization(momentum=0.8)(h)
    h = keras.layers.LeakyReLU(0.2)(h)
  h = keras.layers.Dense(math.prod(shape), activation="sigmoid")(h)
  out = keras.layers.Reshape(shape, name="image")(h)
  return keras.Model(inputs if len(inputs) > 1 else inputs[0], out, name=name)


CONDITIONINGS = ("concat", "projection")


def mlp_discriminator(num_classes=10, image_shape=(28, 28, 1), hidden=(256, 128),
                      conditioning="concat", name="discriminator"):
  """Conditional (or unconditional) MLP discriminator returning one logit; see module doc.

  ``conditioning``: how the one-hot label enters (ignored when ``num_classes`` is None):
  ``"concat"`` (appended to the flattened image) or ``"projection"`` (inner product of the
  label with a learned linear map of the last hidden features, added to the logit).
  """
  shape, hidden = _check_common(None, num_classes, image_shape, hidden)
  conditioning = _checks.check_choice("conditioning", conditioning, CONDITIONINGS)
  image = keras.Input(shape, name="image")
  inputs = [image]
  h = keras.layers.Flatten()(image)
  label = None
  if num_classes is not None:
    label = keras.Input((num_classes,), name="one_hot_label")
    inputs.append(label)
    if conditioning == "concat":
      h = keras.layers.Concatenate()([h, label])
  for width in hidden:
    h = keras.layers.LeakyReLU(0.2)(keras.layers.Dense(width)(h))
  if label is not None and conditioning == "projection":
    unconditional = keras.layers.Dense(1, name="unconditional_logit")(h)
    class_maps = keras.layers.Dense(num_classes, use_bias=False, name="class_projection")(h)
    projected = keras.layers.Dot(axes=1, name="label_projection")([class_maps, label])
    out = keras.layers.Add(name="logit")([unconditional, projected])
  else:
    out = keras.layers.Dense(1, name="logit")(h)
  return keras.Model(inputs if len(inputs) > 1 else image, out, name=name)


def _check_filters(name, filters, count=None):
  """``filters`` as a tuple of integers >= 1: exactly ``count`` of them, or (None) at least one."""
  filters = tuple(filters) if not isinstance(filters, int) else (filters,)
  if (len(filters) != count) if count is not None else not filters:
    raise ValueError(f"{name} must hold {count or 'at least one'} integer(s) >= 1, got "
                     f"{filters!r}.")
  for i, f in enumerate(filters):
    _checks.check_integer(f"{name}[{i}]", f, minimum=1)
  return filters


def conv_generator(latent_dim=64, num_classes=10, image_shape=(28, 28, 1), filters=64,
                   batch_norm=True, name="generator"):
  """Conditional (or unconditional) DCGAN-style generator; see the module doc.

  ``filters``: F, an integer >= 1 (the last hidden layer has F channels, the first 2F).
  ``image_shape``: ``(H, W, C)`` with H and W multiples of 4.
  """
  shape, _ = _check_common(latent_dim, num_classes, image_shape, (1,))
  (f,) = _check_filters("filters", filters, 1)
  if len(shape) != 3 or shape[0] % 4 or shape[1] % 4:
    raise ValueError(f"image_shape must be (H, W, C) with H and W multiples of 4, got "
                     f"{image_shape!r}.")
  h0, w0 = shape[0] // 4, shape[1] // 4
  inputs, h = _generator_inputs(latent_dim, num_classes)
  h = keras.layers.Dense(h0 * w0 * 2 * f)(h)
  if batch_norm:
    h = keras.layers.BatchNormalization(momentum=0.8)(h)
  h = keras.layers.LeakyReLU(0.2)(h)
  h = keras.layers.Reshape((h0, w0, 2 * f))(h)
  h = keras.layers.Conv2DTranspose(f, 4, strides=2, padding="same")(h)
  if batch_norm:
    h = keras.layers.BatchNormalization(momentum=0.8)(h)
  h = keras.layers.LeakyReLU(0.2)(h)
  out = keras.layers.Conv2DTranspose(shape[2], 4, strides=2, padding="same",
                                     activation="sigmoid", name="image")(h)
  return keras.Model(inputs if len(inputs) > 1 else inputs[0], out, name=name)


def conv_discriminator(num_classes=10, image_shape=(28, 28, 1), filters=(32, 64),
                       name="discriminator"):
  """Conditional (or unconditional) convolutional discriminator returning one logit.

  ``filters``: ``(F1, F2)``, integers >= 1.  ``image_shape``: ``(H, W, C)``.  See the module doc.
  """
  shape, _ = _check_common(None, num_classes, image_shape, (1,))
  f1, f2 = _check_filters("filters", filters, 2)
  if len(shape) != 3:
    raise ValueError(f"image_shape must be (H, W, C), got {image_shape!r}.")
  image = keras.Input(shape, name="image")
  inputs = [image]
  h = image
  if num_classes is not None:
    label = keras.Input((num_classes,), name="one_hot_label")
    inputs.append(label)
    tiled = keras.layers.UpSampling2D(size=shape[:2])(
        keras.layers.Reshape((1, 1, num_classes))(label))
    h = keras.layers.Concatenate()([image, tiled])
  for f in (f1, f2):
    h = keras.layers.LeakyReLU(0.2)(keras.layers.Conv2D(f, 4, strides=2, padding="same")(h))
  out = keras.layers.Dense(1, name="logit")(keras.layers.Flatten()(h))
  return keras.Model(inputs if len(inputs) > 1 else image, out, name=name)


def _check_sequence(latent_dim, num_classes, length, filters, kernel_size):
  """The arguments the two sequence builders share: ``(length, filters, kernel_size)``."""
  length = _checks.check_integer("length", length, minimum=1)
  filters = _check_filters("filters", filters)
  _check_common(latent_dim, num_classes, (length,), (1,))
  return length, filters, _checks.check_integer("kernel_size", kernel_size, minimum=1)


def sequence_generator(latent_dim=32, num_classes=2, length=178, filters=(64, 32, 16),
                       kernel_size=5, batch_norm=True, name="generator"):
  """Conditional (or unconditional) 1-D convolutional generator for rows that are sequences.

  For tables whose columns are consecutive samples of one signal (e.g. the 178 EEG samples of
  UCI Epileptic Seizure).  ``[noise, one_hot_label] -> Dense(L0 * F1) -> reshape [L0, F1] ->``
  for each ``F`` of ``filters``: ``UpSampling1D(2) -> Conv1D(F, kernel_size) ->
  [BatchNormalization] -> LeakyReLU(0.2)``, then ``Conv1D(1, kernel_size)``, a centred crop
  to ``length`` and a sigmoid: output ``[B, length]`` in [0, 1].  ``L0 = ceil(length /
  2**len(filters))``.  Neighbouring columns share filters, so the output is smooth where the
  data are: an MLP generator of the same size learns neither the smoothness nor (on that data)
  the class-dependent amplitude (docs/design/generative.md, "Tables").

  Args:
    latent_dim: integer >= 1.
    num_classes: None or an integer >= 2.
    length: the row length, an integer >= 1.
    filters: channels of the upsampling blocks, a non-empty tuple of integers >= 1.
    kernel_size: odd integer >= 1.
    batch_norm: BatchNormalization in the blocks (allowed in a generator: it never reads real
      data).
  """
  length, filters, kernel_size = _check_sequence(latent_dim, num_classes, length, filters,
                                                 kernel_size)
  if kernel_size % 2 == 0:
    raise ValueError(f"kernel_size must be an odd integer >= 1, got {kernel_size}.")
  start = -(-length // 2 ** len(filters))
  inputs, h = _generator_inputs(latent_dim, num_classes)
  h = keras.layers.LeakyReLU(0.2)(keras.layers.Dense(start * filters[0])(h))
  h = keras.layers.Reshape((start, filters[0]))(h)
  for f in filters:
    h = keras.layers.UpSampling1D(2)(h)
    h = keras.layers.Conv1D(f, kernel_size, padding="same")(h)
    if batch_norm:
      h = keras.layers.BatchNormalization(momentum=0.8)(h)
    h = keras.layers.LeakyReLU(0.2)(h)
  h = keras.layers.Conv1D(1, kernel_size, padding="same")(h)
  extra = start * 2 ** len(filters) - length
  h = keras.layers.Cropping1D((extra // 2, extra - extra // 2))(h)
  h = keras.layers.Flatten()(h)
  out = keras.layers.Activation("sigmoid", name="row")(h)
  return keras.Model(inputs if len(inputs) > 1 else inputs[0], out, name=name)


def sequence_discriminator(num_classes=2, length=178, filters=(16, 32), kernel_size=5,
                           hidden=64, name="discriminator"):
  """Conditional (or unconditional) 1-D convolutional discriminator returning one logit.

  ``row [B, length] -> [B, length, 1] ->`` for each ``F`` of ``filters``: ``Conv1D(F,
  kernel_size, strides=2) -> LeakyReLU(0.2)``, then flatten, concatenate the one-hot label,
  ``Dense(hidden) -> LeakyReLU(0.2) -> Dense(1)``.  Only layers with fast per-example clipping
  rules (Conv1D, Dense) and none that mixes examples, so it also serves as a DP-GAN
  discriminator.

  Args:
    num_classes: None or an integer >= 2.
    length: integer >= 1.
    filters: non-empty tuple of integers >= 1.
    kernel_size: integer >= 1.
    hidden: integer >= 1.
  """
  length, filters, kernel_size = _check_sequence(None, num_classes, length, filters,
                                                 kernel_size)
  hidden = _checks.check_integer("hidden", hidden, minimum=1)
  row = keras.Input((length,), name="image")
  inputs = [row]
  h = keras.layers.Reshape((length, 1))(row)
  for f in filters:
    h = keras.layers.Conv1D(f, kernel_size, strides=2, padding="same")(h)
    h = keras.layers.LeakyReLU(0.2)(h)
  h = keras.layers.Flatten()(h)
  if num_classes is not None:
    label = keras.Input((num_classes,), name="one_hot_label")
    inputs.append(label)
    h = keras.layers.Concatenate()([h, label])
  h = keras.layers.LeakyReLU(0.2)(keras.layers.Dense(hidden)(h))
  out = keras.layers.Dense(1, name="logit")(h)
  return keras.Model(inputs if len(inputs) > 1 else row, out, name=name)


def statistics_discriminator(num_classes=2, length=178, hidden=(64, 64), name="discriminator"):
  """Conditional (or unconditional) discriminator that reads a row only through
  :class:`RowStatistics`: ``row [B, length] -> RowStatistics -> [4]``, concatenate the one-hot
  label, ``(Dense(width) -> LeakyReLU(0.2))`` per ``hidden`` width, ``Dense(1)``: one logit.

  A PATE-GAN student for rows that are sequences: it learns from few noisy labels because it
  sees four numbers, and the generator it trains is pulled towards the amplitude and roughness
  the teachers accept per class (docs/design/generative.md, "Tables").  It is also a valid
  DP-GAN discriminator: its one weightless layer acts per row, and removing one real example
  moves the clipped real-term sum by at most C on both per-example paths (tested).

  Args:
    num_classes: None or an integer >= 2.
    length: the row length, an integer >= 3.
    hidden: non-empty tuple of integers >= 1.
  """
  length = _checks.check_integer("length", length, minimum=3)
  _, hidden = _check_common(None, num_classes, (length,), hidden)
  row = keras.Input((length,), name="image")
  inputs = [row]
  h = RowStatistics(name="row_statistics")(row)
  if num_classes is not None:
    label = keras.Input((num_classes,), name="one_hot_label")
    inputs.append(label)
    h = keras.layers.Concatenate()([h, label])
  for width in hidden:
    h = keras.layers.LeakyReLU(0.2)(keras.layers.Dense(width)(h))
  out = keras.layers.Dense(1, name="logit")(h)
  return keras.Model(inputs if len(inputs) > 1 else row, out, name=name)
