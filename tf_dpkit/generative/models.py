"""Small generator and discriminator builders for MNIST-sized DP-GANs (functional Keras models).

Shapes (``K`` classes, ``d`` latent dimensions, image shape ``(H, W, C)``, default MNIST's
``(28, 28, 1)``):

* :func:`mlp_generator`: inputs ``[noise [B, d], one_hot_label [B, K]]`` in this order (only
  ``noise`` when ``num_classes`` is None) -> concatenation -> Dense + LeakyReLU(0.2) layers ->
  (optionally BatchNormalization) ->
  ``Dense(H*W*C)`` with a sigmoid -> reshape: images in [0, 1], shape ``[B, H, W, C]``.
* :func:`mlp_discriminator`: inputs ``[image [B, H, W, C], one_hot_label [B, K]]`` -> flatten,
  concatenate -> Dense + LeakyReLU(0.2) layers -> ``Dense(1)``: one logit per example.  Only
  Dense layers (the fast per-layer clipping path handles them cheaply) and no normalisation
  that mixes examples.
"""
from __future__ import annotations

import math

import keras

from analysis import _checks


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


def mlp_generator(latent_dim=64, num_classes=10, image_shape=(28, 28, 1), hidden=(256, 512),
                  batch_norm=True, name="generator"):
  """Conditional (or, with ``num_classes=None``, unconditional) MLP generator; see module doc.

  ``batch_norm``: put ``BatchNormalization(momentum=0.8)`` after each hidden Dense layer
  (allowed in the generator, which never sees real data; without it these MLPs tend to
  collapse to one image).
  """
  shape, hidden = _check_common(latent_dim, num_classes, image_shape, hidden)
  noise = keras.Input((latent_dim,), name="noise")
  inputs = [noise]
  h = noise
  if num_classes is not None:
    label = keras.Input((num_classes,), name="one_hot_label")
    inputs.append(label)
    h = keras.layers.Concatenate()([noise, label])
  for width in hidden:
    h = keras.layers.Dense(width)(h)
    if batch_norm:
      h = keras.layers.BatchNormalization(momentum=0.8)(h)
    h = keras.layers.LeakyReLU(0.2)(h)
  h = keras.layers.Dense(math.prod(shape), activation="sigmoid")(h)
  out = keras.layers.Reshape(shape, name="image")(h)
  return keras.Model(inputs if len(inputs) > 1 else noise, out, name=name)


def mlp_discriminator(num_classes=10, image_shape=(28, 28, 1), hidden=(256, 128),
                      name="discriminator"):
  """Conditional (or unconditional) MLP discriminator returning one logit; see module doc."""
  shape, hidden = _check_common(None, num_classes, image_shape, hidden)
  image = keras.Input(shape, name="image")
  inputs = [image]
  h = keras.layers.Flatten()(image)
  if num_classes is not None:
    label = keras.Input((num_classes,), name="one_hot_label")
    inputs.append(label)
    h = keras.layers.Concatenate()([h, label])
  for width in hidden:
    h = keras.layers.LeakyReLU(0.2)(keras.layers.Dense(width)(h))
  out = keras.layers.Dense(1, name="logit")(h)
  return keras.Model(inputs if len(inputs) > 1 else image, out, name=name)
