"""Keyed Gaussian noise for the private gradient sum.

Draw ``d`` at optimizer step ``t`` is stateless, seeded by ``fold_in((key, t), d)``: with a
``seed`` the noise is a pure function of ``(seed, step)``; without one the key is secret (OS
entropy), lives only in process memory and never reaches a config, checkpoint or graph
(:class:`SecretInt`).  Float32 CPU draws use ``tf_dpkit.native`` when available.  Floating-
point samplers are not claimed safe against least-significant-bit attacks.  Details:
docs/design/noise.md.
"""
from __future__ import annotations

import numbers
import secrets

import numpy as np
import tensorflow as tf

from analysis import _secrecy
from tf_dpkit import native

_MAX_KEY = 2**62


def fresh_key(seed: int | None = None) -> SecretInt:
  """Returns the noise key: ``seed`` when given, else 62 bits from the OS entropy source.

  Args:
    seed: optional integer in [0, 2**62); ``None`` draws a secret key with ``secrets``.
  """
  if seed is None:
    return SecretInt(secrets.randbelow(_MAX_KEY)).prepare()
  if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < _MAX_KEY:
    raise ValueError(f"seed must be None or an integer in [0, 2**62), got {seed!r}.")
  return SecretInt(seed).prepare()


@_secrecy.refuse_pickling(
    "a secret (a noise key, sampling seed or augmentation key)", copies=False,
    instead="Save the model, not the object: a process that resumes draws a fresh key.")
class SecretInt:
  """An int64 secret (noise key, sampling seed) that graphs read without embedding it.

  ``tensor()`` returns a scalar int64 tensor equal to the secret:

  * in eager code, ``tf.function`` and ``tf.data`` functions: the value of a variable created
    eagerly on first use and held only by this object, which no ``tf.train.Checkpoint``, Keras
    file or SavedModel tracks (a traced function captures its handle, not its value; exporting
    such a function raises TensorFlow's "untracked resource" error instead of writing the key);
  * in a ``tf.compat.v1`` graph: a ``py_func`` that returns the value when the graph runs (the
    graph holds only a reference to a Python callable of this process).

  Never ``repr`` the value; ``int(secret)`` gives it back for host-side code.  It cannot be
  pickled or copied (:mod:`analysis._secrecy`), nor can any object that holds it (optimizers,
  pipelines, augmentations, aggregators).
  """

  __slots__ = ("_value", "_variable")

  def __init__(self, value: int):
    self._value = int(value)
    self._variable = None

  def __int__(self):
    return self._value

  def __eq__(self, other):
    return isinstance(other, SecretInt) and other._value == self._value

  def __hash__(self):
    return hash(self._value)

  def __repr__(self):
    return "SecretInt(<hidden>)"

  def prepare(self) -> SecretInt:
    """Creates the variable now when the outermost context is eager (a variable first made
    while ``tf.function`` traces would make it trace twice); returns ``self``."""
    with tf.init_scope():
      if tf.executing_eagerly() and self._variable is None:
        self._variable = tf.Variable(self._value, dtype=tf.int64, trainable=False,
                                     name="dp_secret")
    return self

  def tensor(self) -> tf.Tensor:
    """The secret as a scalar int64 tensor that embeds no constant (see the class docstring)."""
    with tf.init_scope():
      eager = tf.executing_eagerly()
    if eager:
      self.prepare()
      return self._variable.read_value()
    value = np.int64(self._value)
    fetched = tf.compat.v1.py_func(lambda: value, [], tf.int64, stateful=True, name="dp_secret")
    fetched.set_shape([])
    return fetched


def as_secret(key) -> SecretInt:
  """``key`` (an int or :class:`SecretInt`) as a :class:`SecretInt`."""
  return key if isinstance(key, SecretInt) else SecretInt(key)


#: The ``stream`` of :func:`add_gaussian_noise` for the noisy count of unclipped examples
#: (adaptive clipping, ``tf_dpkit.optimizers.adaptive_clipping``).
STREAM_UNCLIPPED_COUNT = 1


def add_gaussian_noise(tensors, stddev, key, step, draw=0, replica=None, stream=None,
                       part=None):
  """Returns ``[t + N(0, stddev^2 I) for t in tensors]`` with noise keyed by ``(key, step, draw)``.

  Args:
    tensors: list of float tensors (the clipped gradient sums); ``None`` entries stay ``None``.
    stddev: scalar noise standard deviation, ``noise_multiplier * l2_norm_clip`` (same units as
      the gradients): a Python number (``0`` returns the inputs unchanged, no random op is
      traced) or a scalar tensor (e.g. proportional to an adaptive clip norm).
    key: the noise key from :func:`fresh_key`, an int or a :class:`SecretInt`; it enters the
      graph only through :meth:`SecretInt.tensor`.
    step: integer scalar (Python int or tensor), e.g. the optimizer's ``iterations``.
    draw: integer scalar (Python int or tensor) telling apart several draws at one ``step``;
      equal ``(key, step, draw)`` give equal noise, any difference gives independent noise.
    replica: None, or the replica's id in its sync group (integer scalar) under a
      ``tf.distribute`` strategy with several replicas: folded into the seed, so replicas draw
      independent noise from one key.  None leaves the seed as without a strategy.
    stream: None (the gradient sum), or a positive integer naming another quantity released
      at the same ``(key, step, draw)`` (e.g. ``STREAM_UNCLIPPED_COUNT``): folded into the seed
      last, so its noise is independent of the gradient sum's.
    part: None (noise on every element), or ``(index, count)``: ``index`` an integer scalar in
      ``[0, count)`` (Python int or tensor), ``count`` a Python int >= 1.  Each tensor's
      flattened elements are cut into ``count`` consecutive slices of ``ceil(n / count)`` (the
      last may be shorter or empty) and noise goes on slice ``index`` only, the rest unchanged.
      With ``count`` callers that use ``index = 0 .. count-1`` (and different ``replica``), the
      sum of their outputs carries exactly one ``N(0, stddev^2)`` draw per element: how
      replicas of one process split the noise work (``tf_dpkit.distribute``).
  """
  if isinstance(stddev, (int, float)) and stddev == 0:
    return list(tensors)
  base_seed = tf.random.experimental.stateless_fold_in(
      tf.stack([as_secret(key).tensor(), tf.cast(step, tf.int64)]), tf.cast(draw, tf.int64))
  if replica is not None:
    base_seed = tf.random.experimental.stateless_fold_in(base_seed, tf.cast(replica, tf.int64))
  if stream is not None:
    base_seed = tf.random.experimental.stateless_fold_in(base_seed, tf.constant(-stream, tf.int64))
  noised = []
  for index, tensor in enumerate(tensors):
    if tensor is None:
      noised.append(None)
      continue
    with tf.device(tensor.device if tensor.device else None):
      # int64 data: the folded seed keeps 64 random bits (a Python int would fold as int32).
      seed = tf.random.experimental.stateless_fold_in(base_seed, tf.constant(index, tf.int64))
      scale = (tf.constant(stddev, dtype=tensor.dtype) if isinstance(stddev, numbers.Real)
               else tf.cast(stddev, tensor.dtype))
      fused = part is None and tensor.dtype == tf.float32  # the fused kernel takes float32
      kernels = native.kernels_for("noise", tensor.device, tensor.dtype) if fused else None
      if kernels is not None:  # one pass: tensor + scale * z, z as stateless_standard_normal's
        key_, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=seed)
        noised.append(kernels.dpkit_add_stateless_normal(tensor, scale, key_, counter))
        continue
      # A static shape lets the generator run without waiting for the gradient to exist.
      shape = tensor.shape if tensor.shape.is_fully_defined() else tf.shape(tensor)
      if part is None:
        noise = stateless_standard_normal(shape, seed, tensor.dtype, tensor.device)
      else:
        noise = _noise_on_slice(shape, seed, tensor.dtype, *part, device=tensor.device)
      noised.append(tensor + scale * noise)
  return noised


def _noise_on_slice(shape, seed, dtype, index, count, device=None):
  """Standard normals on slice ``index`` of ``count`` of the flattened ``shape`` (slices of
  ``ceil(n / count)`` consecutive elements), zeros elsewhere (``add_gaussian_noise``'s
  ``part``).  Draws one slice's worth of normals, not ``n``."""
  if isinstance(count, bool) or not isinstance(count, int) or count < 1:
    raise ValueError(f"part's count must be an int >= 1, got {count!r}.")
  if isinstance(shape, tf.TensorShape):
    size = shape.num_elements()
    chunk = -(-size // count)
    draws = stateless_standard_normal(tf.TensorShape([chunk]), seed, dtype, device)
  else:
    size = tf.reduce_prod(tf.cast(shape, tf.int64))
    chunk = (size + count - 1) // count
    draws = stateless_standard_normal(tf.reshape(chunk, [1]), seed, dtype, device)
  before = tf.cast(index, tf.int64) * chunk
  after = count * chunk - before - chunk
  padded = tf.pad(draws, tf.reshape(tf.stack([before, after]), [1, 2]))
  return tf.reshape(padded[:size], shape)


def stateless_standard_normal(shape, seed, dtype=tf.float32, device=None):
  """Standard normal samples of ``shape`` by the Box-Muller transform of stateless uniforms.

  For independent ``u1, u2 ~ U[0, 1)``, ``r = sqrt(-2 ln(1 - u1))`` and ``theta = 2 pi u2``
  give two independent N(0, 1) samples ``r cos(theta)`` and ``r sin(theta)``.  This is the
  algorithm of TensorFlow's own ``stateless_normal`` CPU kernel, with the same uniform
  resolution (float32 uniforms are multiples of 2^-23, so ``|z| <= sqrt(2 ln 2^23) = 5.65``).
  With ``h = ceil(n / 2)`` pairs for ``n`` samples, pair ``i`` takes uniforms ``i`` and
  ``h + i`` of TensorFlow's stateless Philox stream for ``seed`` and gives the flattened
  outputs ``i`` (cosine) and ``h + i`` (sine, dropped when ``h + i = n``).

  Drawn by ``tf_dpkit.native``'s compiled kernel where it applies (float32 work on a CPU, see
  the module docstring), else by :func:`tf_ops_standard_normal`; the two agree to a few float32
  ulps.

  Args:
    shape: the output shape, a fully defined ``tf.TensorShape`` or a 1-D integer tensor.
    seed: shape [2] integer tensor, a stateless seed (equal seeds give equal samples).
    dtype: float16, bfloat16, float32 or float64; uniforms are drawn in float64 for float64
      and in float32 otherwise, and the result is cast to ``dtype``.
    device: where the samples are used (a device string); None or ``""``: wherever
      TensorFlow places them.
  """
  dtype = tf.as_dtype(dtype)
  kernels = native.kernels_for("noise", device, dtype)
  if kernels is None:
    return tf_ops_standard_normal(shape, seed, dtype)
  key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=seed)
  dims = (tf.constant(shape.as_list(), tf.int64) if isinstance(shape, tf.TensorShape)
          else tf.cast(shape, tf.int64))
  return tf.cast(kernels.dpkit_stateless_normal(dims, key, counter), dtype)


def tf_ops_standard_normal(shape, seed, dtype=tf.float32):
  """:func:`stateless_standard_normal` written with TensorFlow ops (every device, float64, XLA):
  log/sqrt/sin/cos run vectorised, faster on CPU than TensorFlow's own kernel's scalar loop.
  Same arguments, without ``device``."""
  dtype = tf.as_dtype(dtype)
  work = tf.float64 if dtype == tf.float64 else tf.float32
  if isinstance(shape, tf.TensorShape):
    size = shape.num_elements()
    pairs = [2, (size + 1) // 2]
  else:
    size = tf.reduce_prod(tf.cast(shape, tf.int64))
    pairs = tf.stack([tf.constant(2, tf.int64), (size + 1) // 2])
  u = tf.random.stateless_uniform(pairs, seed=seed, dtype=work)
  radius = tf.sqrt(-2.0 * tf.math.log1p(-u[0]))  # 1 - u in (0, 1]: finite radius
  angle = (2.0 * np.pi) * u[1]
  z = tf.concat([radius * tf.cos(angle), radius * tf.sin(angle)], axis=0)[:size]
  return tf.cast(tf.reshape(z, shape), dtype)
