"""Keyed Gaussian noise for the private gradient sum.

Noise for optimizer step ``t`` is drawn from a *stateless* generator seeded by
``(key, t)``, and variable ``i`` gets the stream ``fold_in((key, t), i)``.  Hence

* with an explicit ``seed`` the noise is a pure function of ``(seed, step)``: reproducible runs
  and tests, no hidden generator state to checkpoint;
* without one, ``key`` comes from the operating system's entropy source (``secrets``), lives
  only in process memory and is never written into a config or a checkpoint.  Two processes
  never share noise, also when one resumes the other's checkpoint.

Noise is created inside ``tf.device(variable.device)`` so it is drawn on the device that holds
the model (GPU when the model is there), next to the gradient it is added to.

Floating-point caveat: DP proofs assume real-valued Gaussian noise.  Floating-point samplers
have gaps in their support that can, in principle, leak information (Mironov 2012, "On
significance of the least significant bits for differential privacy"; Jin et al. 2022 for
Gaussian samplers).  Like every mainstream DP-SGD library we use TensorFlow's Philox-based
float sampler and do not claim protection against this attack.
"""
from __future__ import annotations

import secrets

import tensorflow as tf

_MAX_KEY = 2**62


def fresh_key(seed: int | None = None) -> int:
  """Returns the noise key: ``seed`` when given, else 62 bits from the OS entropy source.

  Args:
    seed: optional integer in [0, 2**62); ``None`` draws a secret key with ``secrets``.
  """
  if seed is None:
    return secrets.randbelow(_MAX_KEY)
  if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < _MAX_KEY:
    raise ValueError(f"seed must be None or an integer in [0, 2**62), got {seed!r}.")
  return seed


def add_gaussian_noise(tensors, stddev, key: int, step):
  """Returns ``[t + N(0, stddev^2 I) for t in tensors]`` with noise keyed by ``(key, step)``.

  Args:
    tensors: list of float tensors (the clipped gradient sums); ``None`` entries stay ``None``.
    stddev: scalar noise standard deviation, ``noise_multiplier * l2_norm_clip`` (same units as
      the gradients).  ``0`` returns the inputs unchanged (no random op is traced).
    key: integer noise key from :func:`fresh_key`.
    step: integer scalar (Python int or tensor), e.g. the optimizer's ``iterations``.
  """
  if isinstance(stddev, (int, float)) and stddev == 0:
    return list(tensors)
  base_seed = tf.stack([tf.constant(key, tf.int64), tf.cast(step, tf.int64)])
  noised = []
  for index, tensor in enumerate(tensors):
    if tensor is None:
      noised.append(None)
      continue
    with tf.device(tensor.device if tensor.device else None):
      seed = tf.random.experimental.stateless_fold_in(base_seed, index)
      # A static shape lets the generator run without waiting for the gradient to exist.
      shape = tensor.shape if tensor.shape.is_fully_defined() else tf.shape(tensor)
      noise = tf.random.stateless_normal(shape, seed=seed, dtype=tensor.dtype)
      noised.append(tensor + tf.constant(stddev, dtype=tensor.dtype) * noise)
  return noised
