"""The 2-D scattering transform (Mallat 2012; Bruna & Mallat 2013) of image batches, in NumPy.

Contract: :func:`scattering_2d` maps each image on its own, with fixed filters and no trainable
weights or data-dependent constants, so features computed once before DP training cost no
privacy: one example's features depend on that example only (docs/design/features.md).  The
filters, padding, subsampling and channel order follow the Kymatio convention (Andreux et al.,
JMLR 2020), which Tramer & Boneh (2021) used, except that the Gabor filters are divided by
``2 pi sigma^2`` where Kymatio uses ``2 * 3.1415 * sigma^2`` (outputs differ by about 3e-5
relative); the tests compare against Kymatio's own output with that constant rescaled.
"""
from __future__ import annotations

import math

import numpy as np
import scipy.fft

from analysis import _checks

__all__ = ["scattering_2d", "scattering_channels", "scattering_output_shape"]


def scattering_channels(J: int, L: int = 8, max_order: int = 2) -> int:
  """Channels K of :func:`scattering_2d`: ``1 + J L`` (order 1) ``+ L^2 J (J - 1) / 2`` (order 2).

  Args:
    J: scales, integer >= 1; L: orientations, integer >= 1; max_order: 1 or 2.
  """
  J, L, max_order = _check_settings(J, L, max_order)
  return 1 + J * L + (L * L * J * (J - 1) // 2 if max_order == 2 else 0)


def scattering_output_shape(height: int, width: int, J: int) -> tuple[int, int]:
  """Spatial size of the output: ``(floor(height / 2^J), floor(width / 2^J))``."""
  return _padded(height, J)[1], _padded(width, J)[1]


def scattering_2d(images, J: int = 2, L: int = 8, max_order: int = 2, *,
                  batch_size: int = 512, dtype=np.float32) -> np.ndarray:
  """Scattering coefficients of a batch of single-channel images.

  With Morlet wavelets ``psi_{j,theta}`` (scale ``2^j``, ``j < J``; ``L`` orientations) and the
  Gaussian low-pass ``phi_J`` (width ``0.8 * 2^(J - 1)`` pixels), the channels are

  * order 0: ``x * phi_J``;
  * order 1: ``|x * psi_{j1,t1}| * phi_J`` for each ``(j1, t1)``;
  * order 2: ``||x * psi_{j1,t1}| * psi_{j2,t2}| * phi_J`` for ``j1 < j2``,

  each subsampled by ``2^J``.  Images are reflect-padded to a multiple of ``2^J`` with at least
  ``2^(J - 1)`` pixels on each side, convolved circularly through the FFT, subsampled as soon
  as the scale allows (order-2 filters applied at resolution ``2^j1``), and the border coefficient
  on each side is cut off again.  Units: those of the input (linear filters and moduli:
  ``S(c x) = c S(x)`` for order 0, ``|c| S(x)`` for orders 1 and 2).

  Args:
    images: ``[n, height, width]`` (or ``[n, height, width, 1]``) real array, n >= 0, finite.
    J: scales, integer >= 1 with ``2^J <= min(height, width)``.
    L: orientations per scale, integer >= 1.
    max_order: 1 or 2.
    batch_size: images transformed at once (memory), integer >= 1.
    dtype: dtype of the result, float32 (default) or float64; the FFTs run in the matching
      complex precision (for MNIST-like inputs in [0, 1], float32 agrees with float64 to about
      3e-7 absolute).

  Returns:
    ``[n, K, floor(height / 2^J), floor(width / 2^J)]`` with K from :func:`scattering_channels`;
    channel order: order 0, then order 1 by ``(j1, t1)``, then order 2 by ``(j1, t1, j2, t2)``.

  Raises:
    ValueError: an argument out of range (the message names it).
  """
  J, L, max_order = _check_settings(J, L, max_order)
  batch_size = _checks.check_integer("batch_size", batch_size, minimum=1)
  x = np.asarray(images)
  if x.ndim == 4 and x.shape[-1] == 1:
    x = x[..., 0]
  if x.ndim != 3:
    raise ValueError(f"images must have shape [n, height, width] (or [n, height, width, 1]), "
                     f"got {np.shape(images)}.")
  height, width = x.shape[1:]
  if min(height, width) < 2**J:
    raise ValueError(f"J must satisfy 2**J <= min(height, width) = {min(height, width)}, "
                     f"got J={J}.")
  if not np.issubdtype(x.dtype, np.number) or np.iscomplexobj(x) or not np.all(np.isfinite(x)):
    raise ValueError("images must hold finite real values.")
  try:
    dtype = np.dtype(dtype)
  except TypeError:
    dtype = None
  if dtype not in (np.float32, np.float64):
    raise ValueError(f"dtype must be float32 or float64, got {dtype!r}.")
  bank = _filter_bank(height, width, J, L, dtype)
  out = np.empty((len(x), scattering_channels(J, L, max_order),
                  *scattering_output_shape(height, width, J)), dtype)
  for start in range(0, len(x), batch_size):
    out[start:start + batch_size] = _transform(x[start:start + batch_size], bank, J, max_order)
  return out


def _check_settings(J, L, max_order):
  J = _checks.check_integer("J", J, minimum=1)
  L = _checks.check_integer("L", L, minimum=1)
  max_order = _checks.check_integer("max_order", max_order, minimum=1, maximum=2)
  return J, L, max_order


def _padded(size: int, J: int) -> tuple[int, int]:
  """``(padded size, output size)`` along one axis: padded to the multiple of ``2^J`` above
  ``size + 2^J``; one coarse coefficient is cut on each side, leaving ``floor(size / 2^J)``."""
  step = 2**J
  padded = ((size + step) // step + 1) * step
  return padded, padded // step - 2


class _Bank:
  """Fourier-domain filters at resolution ``2^-r``: ``psi[(j, r)]``, the L orientations of scale
  j stacked ``[L, h, w]`` (orientation t at index t), and ``phi[r]``."""

  def __init__(self, height, width, J, L, dtype):
    self.J, self.L = J, L
    self.shape = (_padded(height, J)[0], _padded(width, J)[0])
    self.pads = tuple(((p - s) // 2, (p - s + 1) // 2)
                      for p, s in zip(self.shape, (height, width)))
    self.psi = {}
    for j in range(J):
      fourier = [np.real(_fft2(_morlet(self.shape, 0.8 * 2**j,
                                       (int(L - L / 2 - 1) - t) * math.pi / L,
                                       0.75 * math.pi / 2**j, 4.0 / L)))
                 for t in range(L)]
      for r in range(min(j + 1, max(J - 1, 1))):
        self.psi[(j, r)] = np.stack([_periodize(f, r) for f in fourier]).astype(dtype)
    fourier = np.real(_fft2(_gabor(self.shape, 0.8 * 2**(J - 1), 0.0, 0.0, 1.0)))
    self.phi = [_periodize(fourier, r).astype(dtype) for r in range(J)]
    self.dtype = dtype


_BANKS: dict = {}


def _filter_bank(height, width, J, L, dtype) -> _Bank:
  key = (height, width, J, L, dtype.str)
  if key not in _BANKS:
    _BANKS[key] = _Bank(height, width, J, L, dtype)
  return _BANKS[key]


def _gabor(shape, sigma, theta, xi, slant):
  """Gabor filter ``exp(-x'Ax/(2 sigma^2) + i xi <x, e_theta>) / (2 pi sigma^2 / slant)`` with
  ``A = R(theta) diag(1, slant^2) R(theta)^T``, periodized over 5 x 5 copies of the grid."""
  m, n = shape
  c, s = math.cos(theta), math.sin(theta)
  rot = np.array([[c, -s], [s, c]])
  curv = rot @ np.diag([1.0, slant * slant]) @ rot.T / (2 * sigma * sigma)
  out = np.zeros(shape, np.complex128)
  for ex in range(-2, 3):
    for ey in range(-2, 3):
      xx, yy = np.mgrid[ex * m:(ex + 1) * m, ey * n:(ey + 1) * n].astype(np.float64)
      arg = -(curv[0, 0] * xx * xx + (curv[0, 1] + curv[1, 0]) * xx * yy + curv[1, 1] * yy * yy)
      out += np.exp(arg + 1j * xi * (xx * c + yy * s))
  return out / (2 * math.pi * sigma * sigma / slant)


def _morlet(shape, sigma, theta, xi, slant):
  """Morlet wavelet: the Gabor filter minus its envelope times the constant that zeroes its mean."""
  wave = _gabor(shape, sigma, theta, xi, slant)
  envelope = _gabor(shape, sigma, theta, 0.0, slant)
  return wave - (wave.sum() / envelope.sum()) * envelope


def _periodize(fourier, r):
  """The filter to apply at resolution ``2^-r`` (after subsampling by ``2^r``): the frequencies
  that remain representable, ``|f| < m / 2`` on the ``m = size / 2^r`` grid, the others dropped
  (a crop, not a fold, so the coarse filter does not alias)."""
  k = 2**r
  m, n = fourier.shape
  rows = np.r_[0:(m // k) // 2, m - (m // k - (m // k) // 2):m]
  cols = np.r_[0:(n // k) // 2, n - (n // k - (n // k) // 2):n]
  return fourier[np.ix_(rows, cols)]


def _fft2(a):
  return scipy.fft.fft2(a, workers=-1)


def _ifft2(a):
  return scipy.fft.ifft2(a, workers=-1)


def _subsample(spectrum, k):
  """Spectrum of the signal subsampled by ``k`` in space: the mean of its ``k x k`` blocks."""
  if k == 1:
    return spectrum
  *lead, m, n = spectrum.shape
  return spectrum.reshape(*lead, k, m // k, k, n // k).mean(axis=(-4, -2))


def _low_pass(u_hat, bank, r, J, cut):
  """Real part of the inverse FFT of ``u_hat * phi`` subsampled to scale ``2^J``, border cut."""
  s = np.real(_ifft2(_subsample(u_hat * bank.phi[r], 2**(J - r))))
  return s[..., cut[0], cut[1]]


def _transform(x, bank, J, max_order):
  """Vectorised over the L orientations of each scale (channel order as documented)."""
  padded = np.pad(x.astype(bank.dtype), ((0, 0), *bank.pads), mode="reflect")
  cut = (slice(1, -1), slice(1, -1))
  n = len(x)
  x_hat = _fft2(padded)[:, None]  # [n, 1, H, W]
  first, second = [_low_pass(x_hat, bank, 0, J, cut)], []
  for j1 in range(J):
    u1_hat = _fft2(np.abs(_ifft2(_subsample(x_hat * bank.psi[(j1, 0)], 2**j1))))  # [n, L, h, w]
    first.append(_low_pass(u1_hat, bank, j1, J, cut))
    if max_order < 2 or j1 == J - 1:
      continue
    # Order 2 from this j1, by (t1, j2, t2): [n, L1, L2] blocks joined along j2, then flattened.
    blocks = [_low_pass(_fft2(np.abs(_ifft2(_subsample(u1_hat[:, :, None] * bank.psi[(j2, j1)],
                                                        2**(j2 - j1))))), bank, j2, J, cut)
              for j2 in range(j1 + 1, J)]
    joined = np.concatenate(blocks, axis=2)
    second.append(joined.reshape(n, -1, *joined.shape[3:]))
  return np.concatenate(first + second, axis=1)
