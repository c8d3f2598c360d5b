"""The PATE student: a CNN trained on the aggregators' released labels, optionally
semi-supervised on the rest of the public, unlabelled data.

Everything here is post-processing of released labels and public data, so it costs no
privacy.  Two training modes:

* ``"supervised"``: cross-entropy on the labelled queries only, with light augmentation
  (random shifts); the floor.
* ``"fixmatch"`` (Sohn et al. 2020, "FixMatch"): each step also takes a batch of unlabelled
  public images; a weakly augmented copy (shifts of up to 2 px) gives the pseudo-label
  ``argmax p_weak`` where ``max p_weak >= confidence``, and the loss adds
  ``unlabeled_weight * mean(1[max p_weak >= confidence] * CE(pseudo-label, p_strong))`` on a
  strongly augmented copy (random rotation, scaling, shear and shifts of up to 4 px, then a
  zeroed square: cutout).  PATE 2018's students were semi-supervised too (a GAN-based method);
  this is a cheaper one that fits a 2-core CPU.

Released labels can be wrong.  ``label_drop`` applies the small-loss rule of learning with noisy
labels (Han et al. 2018, "Co-teaching"): networks fit clean labels before they memorise wrong
ones, so after a warm-up each labelled batch leaves out its highest-loss examples.

:func:`least_confident` picks the public images a student is least sure about, for querying
them next (active selection; also post-processing).
"""
from __future__ import annotations

import math
import time

import numpy as np

from analysis import _checks

METHODS = ("supervised", "fixmatch")


ARCHITECTURES = ("cnn", "cnn_bn")
MIN_BN_STEPS = 1000  # fewest steps train_student accepts for architecture="cnn_bn"


def build_student_model(input_shape=(28, 28, 1), num_classes: int = 10,
                        architecture: str = "cnn"):
  """A small CNN with logits output.

  * ``"cnn"``: Conv(32, 5x5, same, relu) -> MaxPool 2 -> Conv(64, 3x3, same, relu) -> MaxPool 2
    -> Flatten -> Dense(128, relu) -> Dropout(0.3) -> Dense(num_classes).
  * ``"cnn_bn"``: the same layers with batch normalisation after each convolution and the
    Dense(128) layer (before the relu; those layers then have no bias).  About 1.5x the
    training time of ``"cnn"``; it fits few noisy labels better (docs/guides/pate.md).  Its
    moving statistics (Keras's momentum 0.99) lag the training: after 400 steps of
    :func:`train_student` its evaluation-mode predictions were at chance, after 700 they were
    not, so :func:`train_student` builds it only for ``steps >= MIN_BN_STEPS`` (1000).

  Only standard Keras layers, so ``model.save("student.keras")`` needs no custom objects.
  Batch statistics are over public images only, so they cost no privacy.
  """
  import keras  # pylint: disable=g-import-not-at-top
  num_classes = _checks.check_integer("num_classes", num_classes, minimum=2)
  architecture = _checks.check_choice("architecture", architecture, ARCHITECTURES)
  layers = keras.layers
  if architecture == "cnn":
    body = [layers.Conv2D(32, 5, padding="same", activation="relu"), layers.MaxPooling2D(2),
            layers.Conv2D(64, 3, padding="same", activation="relu"), layers.MaxPooling2D(2),
            layers.Flatten(), layers.Dense(128, activation="relu")]
  else:
    body = [layers.Conv2D(32, 5, padding="same", use_bias=False), layers.BatchNormalization(),
            layers.ReLU(), layers.MaxPooling2D(2),
            layers.Conv2D(64, 3, padding="same", use_bias=False), layers.BatchNormalization(),
            layers.ReLU(), layers.MaxPooling2D(2),
            layers.Flatten(), layers.Dense(128, use_bias=False), layers.BatchNormalization(),
            layers.ReLU()]
  return keras.Sequential([keras.Input(tuple(int(v) for v in input_shape)), *body,
                           layers.Dropout(0.3), layers.Dense(num_classes)], name="pate_student")


def _as_images(x, name):
  x = np.asarray(x)
  if x.ndim == 3:
    x = x[..., None]
  if x.ndim != 4:
    raise ValueError(f"{name} must be images [N, H, W] or [N, H, W, C], got shape {x.shape}.")
  return x.astype(np.float32) / 255.0 if x.dtype == np.uint8 else x.astype(np.float32)


def train_student(x_labeled, y_labeled, x_unlabeled=None, *, method: str = "fixmatch",
                  model=None, steps: int = 1500, batch_size: int = 32, unlabeled_ratio: int = 3,
                  confidence: float = 0.95, unlabeled_weight: float = 1.0,
                  learning_rate: float = 1e-3, seed: int = 0, verbose: bool = False,
                  num_classes: int = 10, label_drop: float = 0.0,
                  label_drop_warmup: float = 0.2, architecture: str = "cnn"):
  """Trains and returns the student (a Keras model with logits output).

  Args:
    x_labeled: images ``[n, H, W(, C)]`` of the answered queries (uint8 0..255 or float [0, 1]).
    y_labeled: their released labels ``[n]`` in [0, num_classes).  n >= 1.
    x_unlabeled: public unlabelled images for ``"fixmatch"`` (may include the labelled ones).
    method: ``"supervised"`` or ``"fixmatch"`` (module docstring).
    model: a Keras model to (continue to) train; default :func:`build_student_model` with
      ``architecture``, initialised after seeding.
    steps: optimiser steps, an integer >= 1.
    batch_size: labelled images per step, an integer >= 1.
    unlabeled_ratio: mu, unlabelled images per labelled one in a step, an integer >= 1.
    confidence: tau in [0, 1], the pseudo-label threshold on the weak copy's max probability.
    unlabeled_weight: lambda_u >= 0, the unlabelled loss weight.
    learning_rate: Adam learning rate > 0, cosine-decayed to 0 over ``steps``.
    seed: integer >= 0 for initialisation, batches and augmentation (public randomness;
      calls ``keras.utils.set_random_seed``, which seeds the global generators too).
    verbose: print progress every ~10% of the steps.
    num_classes: K, integer >= 2.
    label_drop: fraction f in [0, 1) of each labelled batch left out of the loss after the
      warm-up: the ``round(f * batch_size)`` examples with the largest cross-entropy
      (:func:`small_loss_mask`); at least one example is always kept.  0 (default): none.
    label_drop_warmup: fraction in [0, 1] of ``steps`` trained on every labelled example before
      ``label_drop`` starts.
    architecture: one of :data:`ARCHITECTURES` (:func:`build_student_model`); only used when
      ``model`` is None, and an error otherwise unless it is the default.  ``"cnn_bn"`` needs
      ``steps >= MIN_BN_STEPS``.
  """
  import keras  # pylint: disable=g-import-not-at-top
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_dpkit import _autograph  # pylint: disable=g-import-not-at-top
  method = _checks.check_choice("method", method, METHODS)
  steps = _checks.check_integer("steps", steps, minimum=1)
  batch_size = _checks.check_integer("batch_size", batch_size, minimum=1)
  unlabeled_ratio = _checks.check_integer("unlabeled_ratio", unlabeled_ratio, minimum=1)
  confidence = _checks.check_probability("confidence", confidence)
  unlabeled_weight = _checks.check_finite_nonnegative("unlabeled_weight", unlabeled_weight)
  learning_rate = _checks.check_finite_positive("learning_rate", learning_rate)
  seed = _checks.check_integer("seed", seed, minimum=0)
  num_classes = _checks.check_integer("num_classes", num_classes, minimum=2)
  label_drop = _checks.check_finite_nonnegative("label_drop", label_drop)
  keep = batch_size - int(round(label_drop * batch_size))
  if keep < 1:  # also every label_drop >= 1
    raise ValueError(f"label_drop must be in [0, 1) and keep at least one of the batch_size="
                     f"{batch_size} labelled examples, got {label_drop!r}.")
  label_drop_warmup = _checks.check_probability("label_drop_warmup", label_drop_warmup)
  architecture = _checks.check_choice("architecture", architecture, ARCHITECTURES)
  if model is not None and architecture != "cnn":
    raise ValueError("architecture chooses the model built when model is None; pass one of "
                     "them, not both.")
  if model is None and architecture == "cnn_bn" and steps < MIN_BN_STEPS:
    raise ValueError(f"steps must be >= {MIN_BN_STEPS} with architecture='cnn_bn' (batch "
                     f"normalisation's moving statistics lag shorter runs), got {steps}.")
  drop_from = int(math.ceil(label_drop_warmup * steps))
  x_l = _as_images(x_labeled, "x_labeled")
  y_l = np.asarray(y_labeled)
  if len(x_l) < 1 or y_l.shape != (len(x_l),):
    raise ValueError(f"y_labeled must be a 1-D array with one label per labelled image "
                     f"(>= 1), got shape {y_l.shape} for {len(x_l)} images.")
  if y_l.min() < 0 or y_l.max() >= num_classes:
    raise ValueError(f"y_labeled must hold classes in [0, {num_classes}).")
  semi = method == "fixmatch"
  if semi:
    if x_unlabeled is None or len(x_unlabeled) == 0:
      raise ValueError('x_unlabeled must hold public images for method="fixmatch".')
    x_u = _as_images(x_unlabeled, "x_unlabeled")
    if x_u.shape[1:] != x_l.shape[1:]:
      raise ValueError(f"x_unlabeled images must have shape {x_l.shape[1:]}, got "
                       f"{x_u.shape[1:]}.")
  keras.utils.set_random_seed(seed)
  if model is None:
    model = build_student_model(x_l.shape[1:], num_classes, architecture)
  optimizer = keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(learning_rate, steps))
  xl_t, yl_t = tf.constant(x_l), tf.constant(y_l.astype(np.int32))
  xu_t = tf.constant(x_u) if semi else None
  base = tf.constant([seed, 7], tf.int64)
  n_l = len(x_l)
  n_u = len(x_u) if semi else 0
  bu = batch_size * unlabeled_ratio

  @_autograph.function
  def step(i):
    seed_i = tf.random.experimental.stateless_fold_in(base, i)
    pick = lambda s, n, b: tf.random.stateless_uniform(  # noqa: E731
        (b,), tf.random.experimental.stateless_fold_in(seed_i, s), 0, n, tf.int32)
    xl = weak_augment(tf.gather(xl_t, pick(1, n_l, batch_size)),
                      tf.random.experimental.stateless_fold_in(seed_i, 2))
    yl = tf.gather(yl_t, pick(1, n_l, batch_size))
    if semi:
      xu = tf.gather(xu_t, pick(3, n_u, bu))
      weak = weak_augment(xu, tf.random.experimental.stateless_fold_in(seed_i, 4))
      strong = strong_augment(xu, tf.random.experimental.stateless_fold_in(seed_i, 5))
      probs = tf.nn.softmax(model(weak, training=False))
      pseudo = tf.argmax(probs, axis=1, output_type=tf.int32)
      mask = tf.cast(tf.reduce_max(probs, axis=1) >= confidence, tf.float32)
    with tf.GradientTape() as tape:
      if semi:
        logits = model(tf.concat([xl, strong], 0), training=True)
        logits_l, logits_u = logits[:batch_size], logits[batch_size:]
      else:
        logits_l = model(xl, training=True)
      ce = tf.nn.sparse_softmax_cross_entropy_with_logits(yl, logits_l)
      if keep < batch_size:
        weight = tf.where(i >= drop_from, small_loss_mask(ce, keep), tf.ones_like(ce))
        loss = tf.reduce_sum(ce * weight) / tf.reduce_sum(weight)
      else:
        loss = tf.reduce_mean(ce)
      if semi:
        loss_u = tf.reduce_mean(
            mask * tf.nn.sparse_softmax_cross_entropy_with_logits(pseudo, logits_u))
        loss = loss + unlabeled_weight * loss_u
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables))
    return loss, (tf.reduce_mean(mask) if semi else tf.constant(0.0))

  start = time.time()
  every = max(1, steps // 10)
  for i in range(steps):
    loss, used = step(tf.constant(i, tf.int64))
    if verbose and ((i + 1) % every == 0 or i + 1 == steps):
      print(f"student step {i + 1}/{steps}: loss={float(loss):.4f} "
            f"pseudo_labeled_fraction={float(used):.3f} elapsed={time.time() - start:.1f}s",
            flush=True)
  return model


def small_loss_mask(losses, keep: int):
  """Float mask ``[n]``: 1 at the ``keep`` smallest of ``losses`` ``[n]``, 0 elsewhere (ties
  broken by position, as ``tf.math.top_k``); no gradient flows through it.  ``1 <= keep <= n``."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  losses = tf.stop_gradient(tf.convert_to_tensor(losses))
  kept = tf.math.top_k(-losses, k=keep).indices
  return tf.scatter_nd(kept[:, None], tf.ones([keep], losses.dtype), tf.shape(losses))


def predict_probabilities(model, x, batch_size: int = 512) -> np.ndarray:
  """Softmax class probabilities ``[N, K]`` of the student on images ``x``."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  x = _as_images(x, "x")
  out = [tf.nn.softmax(model(x[i:i + batch_size], training=False)).numpy()
         for i in range(0, len(x), batch_size)]
  return np.concatenate(out) if out else np.zeros((0, model.output_shape[-1]), np.float32)


def least_confident(model, x, k: int, exclude=None) -> np.ndarray:
  """Indices of the ``k`` images of ``x`` on which the student is least sure: smallest margin
  ``p_(1) - p_(2)`` between its two largest class probabilities (uncertainty sampling; ties by
  index), sorted ascending.

  Choosing which public images to query from a student trained on released labels is
  post-processing: it costs no privacy, and the accountant composes the chosen queries as any
  others (RDP composition holds for adaptively chosen queries).

  Args:
    model: a Keras model with logits output (e.g. from :func:`train_student`).
    x: public images ``[N, H, W(, C)]``.
    k: how many to choose, an integer in [0, number of images not excluded].
    exclude: indices into ``x`` never chosen (e.g. images already queried), or None.
  """
  x = _as_images(x, "x")
  n = len(x)
  excluded = np.zeros(n, bool)
  if exclude is not None:
    exclude = np.asarray(exclude, np.int64).reshape(-1)
    if exclude.size and (exclude.min() < 0 or exclude.max() >= n):
      raise ValueError(f"exclude must hold indices in [0, {n - 1}].")
    excluded[exclude] = True
  available = np.flatnonzero(~excluded)
  k = _checks.check_integer("k", k, minimum=0, maximum=available.size)
  probs = np.sort(predict_probabilities(model, x[available]), axis=1)
  margin = probs[:, -1] - probs[:, -2]
  return np.sort(available[np.argsort(margin, kind="stable")[:k]])


def accuracy(model, x, y) -> float:
  """Fraction in [0, 1] of images ``x`` whose argmax prediction equals ``y``."""
  return float(np.mean(np.argmax(predict_probabilities(model, x), axis=1) == np.asarray(y)))


# ------------------------------------------------------------------------------ augmentation
def _transform(tf, images, a, b, c, d, tx, ty):
  """Applies per-image affine maps (output pixel p -> input pixel A (p - center) + center - t)
  to ``[M, H, W, C]`` images; zero fill, bilinear."""
  h = tf.cast(tf.shape(images)[1], tf.float32)
  w = tf.cast(tf.shape(images)[2], tf.float32)
  cx, cy = (w - 1.0) / 2.0, (h - 1.0) / 2.0
  off_x = cx - a * (cx + tx) - b * (cy + ty)
  off_y = cy - c * (cx + tx) - d * (cy + ty)
  zeros = tf.zeros_like(a)
  transforms = tf.stack([a, b, off_x, c, d, off_y, zeros, zeros], axis=1)
  return tf.raw_ops.ImageProjectiveTransformV3(
      images=images, transforms=transforms, output_shape=tf.shape(images)[1:3],
      fill_value=0.0, interpolation="BILINEAR", fill_mode="CONSTANT")


def weak_augment(images, seed, max_shift: float = 2.0):
  """Random integer shifts in [-max_shift, max_shift] px along each axis (zero fill)."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  m = tf.shape(images)[0]
  shift = tf.round(tf.random.stateless_uniform((2, m), seed, -max_shift - 0.5, max_shift + 0.5))
  ones, zeros = tf.ones((m,)), tf.zeros((m,))
  return _transform(tf, images, ones, zeros, zeros, ones, shift[0], shift[1])


def strong_augment(images, seed, max_degrees: float = 20.0, max_scale: float = 0.15,
                   max_shear: float = 0.2, max_shift: float = 4.0, cutout: int = 10):
  """Random rotation (+-max_degrees), scaling (1 +- max_scale), shear (+-max_shear), shifts
  (+-max_shift px), then a ``cutout x cutout`` square at a random centre set to 0."""
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  m = tf.shape(images)[0]
  r = tf.random.stateless_uniform((6, m), seed, -1.0, 1.0)
  angle = r[0] * (max_degrees * math.pi / 180.0)
  scale = 1.0 + max_scale * r[1]
  shear = max_shear * r[2]
  cos, sin = tf.cos(angle) / scale, tf.sin(angle) / scale
  out = _transform(tf, images, cos, -sin + shear, sin, cos, max_shift * r[3], max_shift * r[4])
  if cutout:
    h, w = tf.shape(images)[1], tf.shape(images)[2]
    centre = tf.random.stateless_uniform((2, m), tf.random.experimental.stateless_fold_in(
        seed, 1), 0.0, 1.0)
    cy = centre[0] * tf.cast(h, tf.float32)
    cx = centre[1] * tf.cast(w, tf.float32)
    ys = tf.cast(tf.range(h), tf.float32)[None, :, None]
    xs = tf.cast(tf.range(w), tf.float32)[None, None, :]
    half = cutout / 2.0
    inside = ((tf.abs(ys - cy[:, None, None]) < half) & (tf.abs(xs - cx[:, None, None]) < half))
    out = out * tf.cast(~inside, out.dtype)[..., None]
  return out
