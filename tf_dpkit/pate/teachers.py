"""Many PATE teachers trained at once, as one batched Keras model.

Training 250 separate Keras models on 240 images each is dominated by per-model overhead.
:class:`TeacherEnsemble` instead holds all teachers in ONE model with a teacher axis on the
weights:

* images of the teachers are stacked on the channel axis, teacher-major: an input
  ``[B, H, W, T * C]`` holds at channels ``t*C .. t*C + C - 1`` an image for teacher ``t``;
* a convolution (:class:`TeacherConv2D`) is a grouped convolution with ``groups = T``: output
  channels of teacher ``t`` are computed from teacher ``t``'s input channels only, by one
  ordinary ``tf.nn.conv2d`` per teacher on its own channel slice;
* :class:`TeacherDense` holds a kernel ``[T, d_in, d_out]`` and computes
  ``y[b, t] = x[b, t] @ W[t] + bias[t]`` (one batched ``einsum``);
* for rows that are sequences, ``TeacherConv1D`` (:func:`teacher_conv1d_layer`) convolves
  ``[B, T, L, C]`` with a kernel ``[T, k, C, F]``: patches, then one batched matmul.

Teacher ``t``'s parameters therefore depend on teacher ``t``'s inputs only, and the training
loss is a sum of per-teacher losses, so each teacher's gradient is that of its own loss; Adam
updates each parameter element from its own gradient history.  Training the ensemble is thus
exactly ``T`` independent trainings, each on one shard (:func:`tf_dpkit.pate.partition_indices`),
run as one set of big tensor operations.

Each training step gives every teacher a minibatch of ``batch_size`` images from its own shard
(an epoch is one pass over each shard; shorter shards are padded with zero-weight entries).
"""
from __future__ import annotations

import math
import time

import numpy as np

from analysis import _checks, _secrecy
from tf_dpkit.pate.votes import TeacherVotes


def _keras():
  import keras  # pylint: disable=g-import-not-at-top
  return keras


def _tf():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  return tf


def _teacher_dense_class():
  """Defines (and registers with Keras) the per-teacher layers; see :func:`_layers`."""
  keras = _keras()

  @keras.saving.register_keras_serializable(package="tf_dpkit.pate")
  class TeacherDense(keras.layers.Layer):
    """Per-teacher dense layer: input ``[B, T, d_in]`` -> output ``[B, T, units]``,
    ``y[b, t] = activation(x[b, t] @ kernel[t] + bias[t])`` with ``kernel [T, d_in, units]``."""

    def __init__(self, num_teachers, units, activation=None, **kwargs):
      super().__init__(**kwargs)
      self.num_teachers = int(num_teachers)
      self.units = int(units)
      self.activation = keras.activations.get(activation)

    def build(self, input_shape):
      d_in = int(input_shape[-1])
      self.kernel = self.add_weight(
          shape=(self.num_teachers, d_in, self.units), name="kernel",
          initializer=_uniform(keras, d_in, self.units))
      self.bias = self.add_weight(shape=(self.num_teachers, self.units), name="bias",
                                  initializer="zeros")

    def call(self, x):
      return self.activation(keras.ops.einsum("bti,tio->bto", x, self.kernel) + self.bias)

    def get_config(self):
      return {**super().get_config(), "num_teachers": self.num_teachers, "units": self.units,
              "activation": keras.activations.serialize(self.activation)}

  class _TeacherConv(keras.layers.Layer):
    """The settings every per-teacher convolution holds (``filters`` per teacher)."""

    def __init__(self, num_teachers, filters, kernel_size=5, strides=2, activation=None,
                 **kwargs):
      super().__init__(**kwargs)
      self.num_teachers = int(num_teachers)
      self.filters = int(filters)
      self.kernel_size = int(kernel_size)
      self.strides = int(strides)
      self.activation = keras.activations.get(activation)

    def get_config(self):
      return {**super().get_config(), "num_teachers": self.num_teachers,
              "filters": self.filters, "kernel_size": self.kernel_size,
              "strides": self.strides,
              "activation": keras.activations.serialize(self.activation)}

  @keras.saving.register_keras_serializable(package="tf_dpkit.pate")
  class TeacherConv2D(_TeacherConv):
    """Per-teacher 2-D convolution ('same' padding): input ``[B, H, W, T * C_in]`` ->
    ``[B, H', W', T * filters]``, output channels ``t*filters ..`` computed from input
    channels ``t*C_in ..`` only (a grouped convolution with ``groups = T``).

    Computed as ``T`` ordinary ``tf.nn.conv2d`` calls, one per teacher on its channel slice,
    whose outputs are concatenated: the gradient of TensorFlow's grouped convolution exists on
    CPU only under oneDNN (TensorFlow raises "Gradients for grouped convolutions are not
    supported on CPU" where oneDNN is off, the default on CPUs without AVX-512), and Keras 3
    runs grouped convolutions on CPU through XLA, whose gradient is far slower.  The ordinary
    convolution and its gradients exist on every device, so this one form serves every build
    (each teacher equals a plain Keras CNN holding its weights:
    tests/tf_dpkit/pate/test_teachers.py)."""

    def build(self, input_shape):
      c_in = int(input_shape[-1]) // self.num_teachers
      k = self.kernel_size
      self.kernel = self.add_weight(
          shape=(k, k, c_in, self.num_teachers * self.filters), name="kernel",
          initializer=_uniform(keras, k * k * c_in, k * k * self.filters))
      self.bias = self.add_weight(shape=(self.num_teachers * self.filters,), name="bias",
                                  initializer="zeros")

    def call(self, x):
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      t = self.num_teachers
      inputs = tf.split(x, t, axis=-1)
      kernels = tf.split(self.kernel, t, axis=-1)
      y = tf.concat([tf.nn.conv2d(x_t, kernel_t, self.strides, "SAME")
                     for x_t, kernel_t in zip(inputs, kernels)], axis=-1)
      return self.activation(y + self.bias)


  @keras.saving.register_keras_serializable(package="tf_dpkit.pate")
  class SplitTeachers(keras.layers.Layer):
    """``[B, H, W, T * C]`` (teacher-major channels) -> ``[B, T, H * W * C]``."""

    def __init__(self, num_teachers, **kwargs):
      super().__init__(**kwargs)
      self.num_teachers = int(num_teachers)

    def call(self, x):
      ops = keras.ops
      b, h, w, tc = ops.shape(x)
      t = self.num_teachers
      x = ops.reshape(x, (-1, h, w, t, tc // t))
      x = ops.transpose(x, (0, 3, 1, 2, 4))
      return ops.reshape(x, (-1, t, h * w * (tc // t)))

    def get_config(self):
      return {**super().get_config(), "num_teachers": self.num_teachers}

  @keras.saving.register_keras_serializable(package="tf_dpkit.pate")
  class TeacherConv1D(_TeacherConv):
    """Per-teacher 1-D convolution ('same' padding, as ``keras.layers.Conv1D``): input
    ``[B, T, L, C_in]`` -> ``[B, T, ceil(L / strides), filters]`` with ``kernel [T, k, C_in,
    filters]``: ``y[b, t, n] = sum_j x_pad[b, t, n * strides + j] @ kernel[t, j] + bias[t]``.

    Patches from strided slices of the padded input, then one matmul per teacher (batched over
    the teacher axis), so teacher ``t``'s outputs read its own slice and its own weights only,
    and the gradients are those of slices, transposes and matmuls (no grouped convolution, no
    gather), available on every device and build.
    Each teacher equals a ``keras.layers.Conv1D`` holding its weights
    (tests/tf_dpkit/pate/test_teachers.py)."""

    def build(self, input_shape):
      c_in, k = int(input_shape[-1]), self.kernel_size
      self.kernel = self.add_weight(
          shape=(self.num_teachers, k, c_in, self.filters), name="kernel",
          initializer=_uniform(keras, k * c_in, k * self.filters))
      self.bias = self.add_weight(shape=(self.num_teachers, self.filters), name="bias",
                                  initializer="zeros")

    def _padding(self, length):
      out = -(-length // self.strides)
      total = max((out - 1) * self.strides + self.kernel_size - length, 0)
      return out, total // 2, total - total // 2

    def compute_output_shape(self, input_shape):
      out = None if input_shape[2] is None else self._padding(int(input_shape[2]))[0]
      return (input_shape[0], input_shape[1], out, self.filters)

    def call(self, x):
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
      out, left, right = self._padding(int(x.shape[2]))
      c_in, t, k = int(x.shape[3]), self.num_teachers, self.kernel_size
      x = tf.pad(x, [[0, 0], [0, 0], [left, right], [0, 0]])
      span = (out - 1) * self.strides + 1
      # Patches [B, T, n, k * C] (tap-major, as the kernel [T, k, C, F] flattens), then one
      # batched matmul over the teacher axis.
      patches = tf.concat([x[:, :, j:j + span:self.strides] for j in range(k)], axis=-1)
      batch = tf.shape(patches)[0]
      patches = tf.reshape(tf.transpose(patches, [1, 0, 2, 3]), [t, -1, k * c_in])
      y = tf.matmul(patches, tf.reshape(self.kernel, [t, k * c_in, self.filters]))
      y = tf.transpose(tf.reshape(y, [t, batch, out, self.filters]), [1, 0, 2, 3])
      return self.activation(y + self.bias[None, :, None, :])

  return TeacherDense, TeacherConv2D, SplitTeachers, TeacherConv1D


def teacher_conv1d_layer():
  """The ``TeacherConv1D`` layer class (built on first use: importing this module loads no
  Keras)."""
  _layers()
  return _CONV1D


def _uniform(keras, fan_in, fan_out):
  """Glorot-uniform initialiser for ONE teacher's fans (Keras would count the teacher axis
  into the fans and start every teacher with weights ~sqrt(T) times too small)."""
  limit = math.sqrt(6.0 / (fan_in + fan_out))
  return keras.initializers.RandomUniform(-limit, limit)


_LAYERS = None
_CONV1D = None


def _layers():
  """``(TeacherDense, TeacherConv2D, SplitTeachers)``, built on first use."""
  global _LAYERS, _CONV1D
  if _LAYERS is None:
    *_LAYERS, _CONV1D = _teacher_dense_class()
    _LAYERS = tuple(_LAYERS)
  return _LAYERS


def build_teacher_model(num_teachers: int, input_shape=(28, 28, 1), num_classes: int = 10,
                        conv_filters=(16, 32), hidden_units: int = 64, dropout: float = 0.3):
  """Returns the batched teacher model: input ``[B, H, W, T * C]`` -> logits ``[B, T, K]``.

  Each teacher is the CNN ``Conv(f1, 5x5, stride 2, relu) -> Conv(f2, 5x5, stride 2, relu) ->
  Dropout -> Dense(hidden_units, relu) -> Dense(num_classes)`` (``hidden_units = 0`` drops
  the hidden dense layer), with its own weights.

  Args:
    num_teachers: T, an integer >= 1.
    input_shape: ``(H, W, C)`` of one image.
    num_classes: K, an integer >= 2.
    conv_filters: filters per teacher of each convolution (a possibly empty tuple of ints >= 1).
    hidden_units: width of the hidden dense layer, an integer >= 0.
    dropout: dropout rate in [0, 1).
  """
  keras = _keras()
  teacher_dense, teacher_conv, split_teachers = _layers()
  num_teachers = _checks.check_integer("num_teachers", num_teachers, minimum=1)
  num_classes = _checks.check_integer("num_classes", num_classes, minimum=2)
  hidden_units = _checks.check_integer("hidden_units", hidden_units, minimum=0)
  for i, f in enumerate(conv_filters):
    _checks.check_integer(f"conv_filters[{i}]", f, minimum=1)
  dropout = _checks.check_real("dropout", dropout)
  if not 0.0 <= dropout < 1.0:
    raise ValueError(f"dropout must be in [0, 1), got {dropout!r}.")
  h, w, c = (int(v) for v in input_shape)
  inputs = keras.Input((h, w, num_teachers * c))
  x = inputs
  for filters in conv_filters:
    x = teacher_conv(num_teachers, int(filters), 5, 2, activation="relu")(x)
  x = split_teachers(num_teachers)(x)
  if dropout:
    x = keras.layers.Dropout(dropout)(x)
  if hidden_units:
    x = teacher_dense(num_teachers, hidden_units, activation="relu")(x)
  outputs = teacher_dense(num_teachers, num_classes)(x)
  return keras.Model(inputs, outputs, name=f"teacher_ensemble_{num_teachers}")


@_secrecy.refuse_pickling(
    "teachers trained without privacy on the private shards", copies=True,
    instead="Release their knowledge only through an aggregator's noisy answers.")
class TeacherEnsemble:
  """``num_teachers`` teachers in one batched Keras model (see the module docstring).

  The teachers are not private, so the ensemble cannot be pickled (:mod:`analysis._secrecy`).

  Typical use::

      shards = partition_indices(len(x_private), 250, seed=0)
      ensemble = TeacherEnsemble(250, input_shape=(28, 28, 1), num_classes=10, seed=0)
      ensemble.fit(x_private, y_private, shards, epochs=40)
      votes = ensemble.votes(x_public)          # a sealed TeacherVotes
      accuracies = ensemble.accuracy(x_test, y_test)   # per teacher, in [0, 1]
  """

  def __init__(self, num_teachers: int, input_shape=(28, 28, 1), num_classes: int = 10,
               conv_filters=(16, 32), hidden_units: int = 64, dropout: float = 0.3,
               seed: int | None = 0):
    """Args: see :func:`build_teacher_model`; ``seed`` (None or an integer >= 0) seeds the
    weight initialisation, dropout, minibatch order and augmentation (all public randomness;
    an integer seed calls ``keras.utils.set_random_seed``, which also seeds Python's, NumPy's
    and TensorFlow's global generators)."""
    keras = _keras()
    if seed is not None:
      seed = _checks.check_integer("seed", seed, minimum=0, none_allowed=True)
      keras.utils.set_random_seed(seed)
    self.seed = seed
    self.num_teachers = int(num_teachers)
    self.num_classes = int(num_classes)
    self.input_shape = tuple(int(v) for v in input_shape)
    self.model = build_teacher_model(num_teachers, input_shape, num_classes, conv_filters,
                                     hidden_units, dropout)
    self.history = []

  # ---------------------------------------------------------------- training
  def fit(self, x, y, shards, epochs: int = 40, batch_size: int = 32,
          learning_rate: float = 2e-3, max_shift: int = 2, verbose: bool = False):
    """Trains teacher ``t`` on ``(x[shards[t]], y[shards[t]])`` for every ``t``, all at once.

    Args:
      x: private images ``[N, H, W, C]`` (or ``[N, H, W]`` when C = 1), float in [0, 1] or
        uint8 in 0..255 (divided by 255).
      y: integer labels ``[N]`` in [0, num_classes).
      shards: ``num_teachers`` index arrays into ``x`` (e.g. from :func:`partition_indices`);
        each non-empty.  Disjointness is what the privacy analysis needs; it is checked.
      epochs: passes over each shard, an integer >= 1.
      batch_size: images per teacher per step, an integer >= 1.
      learning_rate: Adam learning rate, > 0; decays by a cosine schedule to 0.
      max_shift: augmentation: each training image is translated by a uniform integer number
        of pixels in [-max_shift, max_shift] along each axis (zero fill); 0 disables it.
      verbose: print the mean training loss after each epoch.
    Returns:
      the list of per-epoch mean training losses (also kept in ``self.history``).
    """
    keras, tf = _keras(), _tf()
    from tf_dpkit import _autograph  # pylint: disable=g-import-not-at-top
    epochs = _checks.check_integer("epochs", epochs, minimum=1)
    batch_size = _checks.check_integer("batch_size", batch_size, minimum=1)
    learning_rate = _checks.check_finite_positive("learning_rate", learning_rate)
    max_shift = _checks.check_integer("max_shift", max_shift, minimum=0)
    x = self._images(x, "x")
    y = np.asarray(y)
    if y.shape != (len(x),):
      raise ValueError(f"y must be a 1-D array of {len(x)} labels, got shape {y.shape}.")
    if y.size and (y.min() < 0 or y.max() >= self.num_classes):
      raise ValueError(f"y must hold classes in [0, {self.num_classes}).")
    index = self._shard_matrix(shards, len(x))
    steps_per_epoch = math.ceil(index.shape[1] / batch_size)
    total_steps = steps_per_epoch * epochs
    schedule = keras.optimizers.schedules.CosineDecay(learning_rate, total_steps)
    optimizer = keras.optimizers.Adam(schedule)
    t, (h, w, c) = self.num_teachers, self.input_shape
    x_all = tf.constant(x)
    y_all = tf.constant(y.astype(np.int32))
    model = self.model
    aug_seed = tf.constant([self.seed or 0, 1], tf.int64)

    @_autograph.function(reduce_retracing=True)
    def train_step(batch_index, step):  # batch_index [B, T]; -1 = padding
      valid = batch_index >= 0
      safe = tf.where(valid, batch_index, 0)
      images = tf.gather(x_all, safe)  # [B, T, H, W, C]
      if max_shift:
        images = _translate(tf, tf.reshape(images, (-1, h, w, c)), max_shift,
                            tf.random.experimental.stateless_fold_in(aug_seed, step))
        images = tf.reshape(images, (-1, t, h, w, c))
      images = tf.reshape(tf.transpose(images, (0, 2, 3, 1, 4)), (-1, h, w, t * c))
      labels = tf.gather(y_all, safe)
      weight = tf.cast(valid, tf.float32)
      with tf.GradientTape() as tape:
        logits = model(images, training=True)
        losses = tf.nn.sparse_softmax_cross_entropy_with_logits(labels, logits)  # [B, T]
        # Sum over teachers of each teacher's mean loss: gradients stay per teacher.
        per_teacher = (tf.reduce_sum(losses * weight, axis=0) /
                       tf.maximum(tf.reduce_sum(weight, axis=0), 1.0))
        loss = tf.reduce_sum(per_teacher)
      grads = tape.gradient(loss, model.trainable_variables)
      optimizer.apply_gradients(zip(grads, model.trainable_variables))
      return loss / t

    rng = np.random.default_rng(self.seed)
    losses = []
    step = 0
    start = time.time()
    for epoch in range(epochs):
      order = _shuffle_rows(index, rng)
      total = 0.0
      for s in range(steps_per_epoch):
        batch = order[:, s * batch_size:(s + 1) * batch_size].T  # [B, T]
        total += float(train_step(tf.constant(batch), tf.constant(step, tf.int64)))
        step += 1
      losses.append(total / steps_per_epoch)
      if verbose:
        print(f"teachers epoch {epoch + 1}/{epochs}: loss={losses[-1]:.4f} "
              f"elapsed={time.time() - start:.1f}s", flush=True)
    self.history.extend(losses)
    return losses

  # ---------------------------------------------------------------- inference
  def predict_logits(self, x, batch_size: int = 256) -> np.ndarray:
    """Each teacher's logits on the same images: ``[N, T, K]`` float32.

    The result is private (noiseless teacher outputs): do not publish it."""
    tf = _tf()
    from tf_dpkit import _autograph  # pylint: disable=g-import-not-at-top
    batch_size = _checks.check_integer("batch_size", batch_size, minimum=1)
    x = self._images(x, "x")
    model, predict = getattr(self, "_predict", (None, None))
    if model is not self.model:  # traced once per model, not once per call
      model, t = self.model, self.num_teachers

      @_autograph.function(reduce_retracing=True)
      def predict(images):
        return model(tf.tile(images, (1, 1, 1, t)), training=False)
      self._predict = (model, predict)

    out = [predict(tf.constant(x[i:i + batch_size])).numpy()
           for i in range(0, len(x), batch_size)]
    return (np.concatenate(out) if out
            else np.zeros((0, self.num_teachers, self.num_classes), np.float32))

  def predictions(self, x, batch_size: int = 256) -> np.ndarray:
    """Each teacher's predicted class ``[N, T]`` (private; do not publish)."""
    return np.argmax(self.predict_logits(x, batch_size), axis=-1)

  def votes(self, x, batch_size: int = 256) -> TeacherVotes:
    """The vote histograms of the teachers on public images ``x``, sealed in a
    :class:`TeacherVotes` (``[N, K]`` counts that sum to T per row)."""
    return TeacherVotes.from_predictions(self.predictions(x, batch_size), self.num_classes)

  def accuracy(self, x, y, batch_size: int = 256) -> np.ndarray:
    """Per-teacher accuracy on ``(x, y)``: float array ``[T]`` with values in [0, 1]."""
    y = np.asarray(y)
    return np.mean(self.predictions(x, batch_size) == y[:, None], axis=0)

  # ---------------------------------------------------------------- helpers
  def _images(self, x, name):
    x = np.asarray(x)
    if x.ndim == 3 and self.input_shape[2] == 1:
      x = x[..., None]
    if x.shape[1:] != self.input_shape:
      raise ValueError(f"{name} must have shape [N, {', '.join(map(str, self.input_shape))}], "
                       f"got {x.shape}.")
    if x.dtype == np.uint8:
      return x.astype(np.float32) / 255.0
    return x.astype(np.float32)

  def _shard_matrix(self, shards, n):
    shards = [np.asarray(s, dtype=np.int64).reshape(-1) for s in shards]
    if len(shards) != self.num_teachers:
      raise ValueError(f"shards must hold num_teachers={self.num_teachers} index arrays, got "
                       f"{len(shards)}.")
    sizes = [len(s) for s in shards]
    if min(sizes) < 1:
      raise ValueError("shards must all be non-empty; some shard has no example.")
    joined = np.concatenate(shards)
    if joined.min() < 0 or joined.max() >= n:
      raise ValueError(f"shards must hold indices in [0, {n}).")
    if len(np.unique(joined)) != len(joined):
      raise ValueError("shards must be disjoint (PATE's privacy analysis needs every record in "
                       "at most one teacher's shard); some index appears twice.")
    index = np.full((len(shards), max(sizes)), -1, np.int64)
    for i, s in enumerate(shards):
      index[i, :len(s)] = s
    return index


def _shuffle_rows(index, rng):
  """Permutes each row's valid entries (>= 0) independently; padding (-1) stays at the end...
  spread over steps: a random permutation of every full row, with padding sorted last."""
  keys = rng.random(index.shape)
  keys[index < 0] = 2.0  # padding last
  return np.take_along_axis(index, np.argsort(keys, axis=1), axis=1)


def _translate(tf, images, max_shift, seed):
  """Translates each image of ``[M, H, W, C]`` by integer offsets in [-max_shift, max_shift]."""
  m = tf.shape(images)[0]
  shifts = tf.cast(tf.random.stateless_uniform((m, 2), seed, -max_shift, max_shift + 1,
                                               dtype=tf.int32), tf.float32)
  ones, zeros = tf.ones((m,)), tf.zeros((m,))
  transforms = tf.stack([ones, zeros, shifts[:, 0], zeros, ones, shifts[:, 1], zeros, zeros],
                        axis=1)
  return tf.raw_ops.ImageProjectiveTransformV3(
      images=images, transforms=transforms, output_shape=tf.shape(images)[1:3],
      fill_value=0.0, interpolation="NEAREST", fill_mode="CONSTANT")
