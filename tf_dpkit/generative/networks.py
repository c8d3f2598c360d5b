"""Small generator and discriminator builders for DP-GANs (functional Keras models).

:func:`mlp_generator` and :func:`conv_generator` take ``[noise [B, d], one_hot_label [B, K]]``
(``noise`` alone when ``num_classes`` is None) and output images (or rows: any
``image_shape``) in [0, 1] (sigmoid); :func:`mlp_discriminator` (label concatenated or
projected) and :func:`conv_discriminator` take ``[image, one_hot_label]`` and output one logit
``[B, 1]``.  Discriminators hold only layers with fast per-example clipping rules (Dense,
Conv2D) and no normalisation that mixes examples; generators may use BatchNormalization.

Layer-by-layer shapes: docs/design/generative.md.
"""
from __future__ import annotations

import math

import keras

from analysis import _checks

__all__ = ["CONDITIONINGS", "conv_discriminator", "conv_generator", "mlp_discriminator",
           "mlp_generator"]


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


def _check_filters(name, filters, count):
  filters = tuple(filters) if not isinstance(filters, int) else (filters,)
  if len(filters) != count:
    raise ValueError(f"{name} must hold {count} integer(s) >= 1, got {filters!r}.")
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
