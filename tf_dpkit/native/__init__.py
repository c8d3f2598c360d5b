"""Compiled CPU kernels for the noise draw and the Embedding and convolution rules, built from
source on first use.

Contract:

* :func:`kernels_for` decides, in one place, whether work of a dtype on a device may use the
  kernels: float32 work, on a CPU (or unplaced while TensorFlow sees no GPU/TPU), outside
  XLA-compiled functions, and the library built and self-checked.  Otherwise the callers
  (``tf_dpkit.noise``, ``tf_dpkit.clipping.rules.embedding``, ``tf_dpkit.clipping.rules.conv``)
  use their TensorFlow-op code,
  which computes the same quantities.
* Ops (float32, CPU): ``dpkit_stateless_normal(shape, key, counter)`` and
  ``dpkit_add_stateless_normal(x, stddev, key, counter)`` (``noise_kernels.cc``: the same
  Philox-4x32-10 uniforms as TensorFlow's stateless ops for ``(key, counter)`` from
  ``StatelessRandomGetKeyCounter``, bit for bit, and the Box-Muller pairing of
  ``tf_dpkit.noise``; only log/sin/cos are computed differently, a few float32 ulps);
  ``dpkit_token_squared_norms(ids, rows, vocab)`` and ``dpkit_scatter_scaled_rows(ids, rows,
  factors, vocab)`` (``embedding_kernels.cc``: the Embedding rule's per-microbatch norms and
  clipped sum); ``dpkit_conv_kernel_grad_squared_norms(x, g, num_groups, kernel_size, strides,
  dilations, pads, with_bias, keep_grads)`` (``conv_kernels.cc``: a convolution's per-microbatch
  kernel-gradient squared norms (with the bias part), bias gradients and, optionally, kernel
  gradients, without unfolding patches).
* A library is used only after a self-check at load time against float64 numpy references
  (Box-Muller of TensorFlow's own uniforms; brute-force token sums; brute-force convolution
  kernel gradients).  Any failure (no compiler,
  a compile error, a failed check) logs one warning on the ``tf_dpkit`` logger and leaves the
  TensorFlow-op code in use: never a different noise distribution or clipping, only slower.
* Built once per source text, TensorFlow build, compiler and CPU (``-march=native``) into a
  cache folder: ``$TF_DPKIT_CACHE_DIR``, else ``$XDG_CACHE_HOME/tf_dpkit``, else
  ``~/.cache/tf_dpkit``; builds are serialised by a file lock, so parallel processes build once.
  ``$CXX`` names the compiler (default ``g++``, else ``c++``).  ``TF_DPKIT_NATIVE=0`` turns the
  kernels off.
* The library holds no secret: the noise key reaches the kernels only as a run-time input.
"""
from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import threading

import numpy as np
import tensorflow as tf

SOURCES = tuple(pathlib.Path(__file__).with_name(name)
                for name in ("noise_kernels.cc", "embedding_kernels.cc", "conv_kernels.cc"))
#: Included by every source (part of what the cached library's name hashes).
HEADERS = (pathlib.Path(__file__).with_name("kernels.h"),)
#: Set to "0" to run noise, Embedding and convolution clipping as TensorFlow ops only.
SWITCH_VARIABLE = "TF_DPKIT_NATIVE"
CACHE_VARIABLE = "TF_DPKIT_CACHE_DIR"
#: The self-check's bound on the largest difference from its float64 references (normals are at
#: most 5.65; the embedding checks are scaled to the same size).
SELF_CHECK_TOLERANCE = 1e-5
_BUILD_TIMEOUT_S = 600

_lock = threading.Lock()
_state = {"tried": False, "ops": None, "reason": "not tried yet"}


class NativeUnavailable(RuntimeError):
  """The compiled kernels cannot be built, loaded or trusted here (the message says why)."""


def enabled() -> bool:
  """False when ``TF_DPKIT_NATIVE=0`` (or ``false``/``no``/``off``) is set."""
  return os.environ.get(SWITCH_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")


@tf.autograph.experimental.do_not_convert  # plain Python, also when called while tracing
def kernels():
  """The loaded op module, or ``None`` (then :func:`status` says why).  Builds on first call."""
  if not enabled():
    return None
  with _lock:
    if not _state["tried"]:
      _state["tried"] = True
      try:
        path = build()
        _state["ops"] = _load_and_check(path)
        _state["reason"] = f"loaded from {path}"
      except Exception as error:  # noqa: BLE001 - optional speed-up: never fail training
        _state["reason"] = (str(error) if isinstance(error, NativeUnavailable)
                            else f"{type(error).__name__}: {error}")
        logging.getLogger("tf_dpkit").warning(
            "tf_dpkit: compiled CPU kernels unavailable (%s); noise, Embedding and convolution "
            "clipping run as TensorFlow ops (the same quantities, slower on CPU). Set %s=0 to "
            "silence this.",
            _state["reason"], SWITCH_VARIABLE)
    return _state["ops"]


@tf.autograph.experimental.do_not_convert
def kernels_for(device, dtype):
  """:func:`kernels` when work of ``dtype`` for ``device`` (a device string; ``""`` or None for
  "wherever TensorFlow places it") may use them, else None: float32 work (float16 and bfloat16
  are computed in float32), on a CPU, outside XLA-compiled functions."""
  if tf.as_dtype(dtype) not in (tf.float32, tf.float16, tf.bfloat16):
    return None
  if _in_xla_function():
    return None
  kind = tf.DeviceSpec.from_string(device).device_type if device else None
  if kind is None:  # unplaced: only when no accelerator could take the op
    if _accelerators_visible():
      return None
  elif kind != "CPU":
    return None
  return kernels()


def _accelerators_visible():
  """True when TensorFlow sees a GPU or TPU (an unplaced op may then run there)."""
  return any(tf.config.list_logical_devices(name) for name in ("GPU", "TPU"))


def _in_xla_function():
  """True while tracing a function compiled with XLA (``jit_compile=True``), which only takes
  ops that XLA knows."""
  if tf.executing_eagerly():
    return False
  try:
    from tensorflow.python.ops import control_flow_util  # noqa: PLC0415
  except ImportError:  # pragma: no cover - another TensorFlow layout
    return True  # cannot tell: TensorFlow ops work everywhere
  return control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph())


def status() -> str:
  """Why :func:`kernels` returns what it does (a path, a reason, or "turned off")."""
  if not enabled():
    return f"turned off by {SWITCH_VARIABLE}={os.environ[SWITCH_VARIABLE]}"
  return _state["reason"]


def cache_dir() -> pathlib.Path:
  """The folder compiled libraries are kept in (see the module docstring)."""
  if os.environ.get(CACHE_VARIABLE):
    return pathlib.Path(os.environ[CACHE_VARIABLE])
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return pathlib.Path(base) / "tf_dpkit"


def _compiler() -> str:
  cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
  if not cxx:
    raise NativeUnavailable("no C++ compiler found (g++ or c++ on PATH, or $CXX)")
  return cxx


def _command(cxx: str, output: str) -> list[str]:
  return ([cxx, "-shared", "-fPIC", "-O3", "-march=native", "-fopenmp-simd", "-w",
           *tf.sysconfig.get_compile_flags(), *map(str, SOURCES), "-o", output,
           *tf.sysconfig.get_link_flags()])


def _cpu_identity() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
      lines = cpuinfo.read().splitlines()
    keep = [l for l in lines if l.startswith(("model name", "flags"))][:2]
    return "\n".join(keep) or platform.processor()
  except OSError:
    return platform.machine() + platform.processor()


def library_name(cxx: str | None = None) -> str:
  """The cached library's file name: a hash of what the build depends on."""
  cxx = cxx or _compiler()
  try:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
  except (OSError, subprocess.SubprocessError) as error:
    raise NativeUnavailable(f"the compiler {cxx!r} does not run: {error}") from error
  digest = hashlib.sha256()
  for part in (*(source.read_bytes() for source in SOURCES + HEADERS), tf.__version__.encode(),
               tf.sysconfig.get_lib().encode(),
               " ".join(_command(cxx, "out")).encode(), version.encode(),
               _cpu_identity().encode()):
    digest.update(part)
    digest.update(b"\0")
  return f"tf_dpkit_kernels_{digest.hexdigest()[:20]}.so"


def build(force: bool = False) -> pathlib.Path:
  """Compiles :data:`SOURCES` into :func:`cache_dir` unless already there; returns the
  library's path.  Raises :class:`NativeUnavailable` with the compiler's message on failure."""
  cxx = _compiler()
  folder = cache_dir()
  try:
    folder.mkdir(parents=True, exist_ok=True)
  except OSError as error:
    raise NativeUnavailable(f"cannot create the cache folder {folder}: {error}") from error
  target = folder / library_name(cxx)
  with open(folder / (target.name + ".lock"), "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # one build per library; waiting processes reuse it
    if target.exists() and not force:
      return target
    handle, partial = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(handle)
    try:
      done = subprocess.run(_command(cxx, partial), capture_output=True, text=True,
                            timeout=_BUILD_TIMEOUT_S)
      if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise NativeUnavailable(f"{cxx} failed (exit {done.returncode}): " + " | ".join(tail))
      os.replace(partial, target)
    except (OSError, subprocess.SubprocessError) as error:
      raise NativeUnavailable(f"building with {cxx} failed: {error}") from error
    finally:
      if os.path.exists(partial):
        os.remove(partial)
  return target


def _load_and_check(path: pathlib.Path):
  try:
    ops = tf.load_op_library(str(path))
  except (tf.errors.OpError, OSError) as error:
    raise NativeUnavailable(f"loading {path} failed: {error}") from error
  try:
    difference = _self_check(ops)
  except Exception as error:  # noqa: BLE001 - any failure means: do not use this library
    raise NativeUnavailable(f"{path} failed its self-check: {type(error).__name__}: "
                            f"{error}") from error
  if not difference <= SELF_CHECK_TOLERANCE:
    raise NativeUnavailable(f"{path} failed its self-check: largest difference from the "
                            f"references {difference} > {SELF_CHECK_TOLERANCE}")
  return ops


def reference_normals(key, counter, size):
  """float64 Box-Muller (``tf_dpkit.noise``'s pairing) of TensorFlow's own Philox uniforms for
  ``(key, counter)``: the reference the noise kernels must reproduce."""
  half = (size + 1) // 2
  u = np.asarray(tf.raw_ops.StatelessRandomUniformV2(
      shape=tf.constant([2 * half], tf.int64), key=key, counter=counter,
      alg=tf.constant(1, tf.int32), dtype=tf.float32), np.float64)
  radius = np.sqrt(-2.0 * np.log1p(-u[:half]))
  angle = 2.0 * np.pi * u[half:]
  return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:size]


def reference_token_sums(ids, rows, factors, vocab):
  """Brute force in float64: ``(||G_j||^2 for each microbatch j, sum_j factors[j] G_j)`` with
  ``G_j[v] = sum of rows[j, k] over positions k with ids[j, k] = v`` (ids outside [0, vocab)
  count for nothing): what the embedding kernels must return."""
  ids, rows = np.asarray(ids), np.asarray(rows, np.float64)
  grads = np.zeros((ids.shape[0], vocab, rows.shape[2]))
  for j, k in np.ndindex(*ids.shape):
    if 0 <= ids[j, k] < vocab:
      grads[j, ids[j, k]] += rows[j, k]
  return (np.sum(grads**2, axis=(1, 2)),
          np.einsum("j,jvd->vd", np.asarray(factors, np.float64), grads))


def reference_conv_norms(x, g, kernel_size, strides, dilations, pads, num_groups,
                         with_bias=False):
  """Brute force in float64, for the ``num_groups`` microbatches of consecutive examples:
  ``(squared norms, bias gradients, kernel gradients)``: ``kernel_j = sum over examples b of
  microbatch j, positions (oy, ox) of patch(x_b)[oy, ox] (x) g_b[oy, ox]`` ([kh kw C, P]),
  ``bias_j = sum over b, (oy, ox) of g_b[oy, ox]``, and ``||kernel_j||^2`` (plus
  ``||bias_j||^2`` with ``with_bias``), where
  ``patch[oy, ox][ky, kx, c] = x[oy sh + ky dh - pad_top, ox sw + kx dw - pad_left, c]`` (zero
  outside the image): what the convolution kernel must return.  ``x`` [B, H, W, C], ``g``
  [B, OH, OW, P]; the other arguments are (height, width) pairs."""
  x, g = np.asarray(x, np.float64), np.asarray(g, np.float64)
  (kh, kw), (sh, sw), (dh, dw), (top, left) = kernel_size, strides, dilations, pads
  batch, height, width, channels = x.shape
  grads = np.zeros((batch, kh, kw, channels, g.shape[3]))
  for oy, ox, ky, kx in np.ndindex(g.shape[1], g.shape[2], kh, kw):
    iy, ix = oy * sh + ky * dh - top, ox * sw + kx * dw - left
    if 0 <= iy < height and 0 <= ix < width:
      grads[:, ky, kx] += np.einsum("bc,bp->bcp", x[:, iy, ix], g[:, oy, ox])
  grads = grads.reshape(num_groups, batch // num_groups, -1).sum(axis=1)
  bias = g.sum(axis=(1, 2)).reshape(num_groups, batch // num_groups, -1).sum(axis=1)
  norms = np.sum(grads**2, axis=1) + (np.sum(bias**2, axis=1) if with_bias else 0.0)
  return norms, bias, grads.reshape(num_groups, kh * kw * channels, g.shape[3])


def _self_check(ops) -> float:
  """Largest difference of the kernels from the float64 references, over sizes with odd and
  even halves, several chunks and threads, the fused add, and token sums with repeats and
  uncounted ids, and convolution norms over the kernel's code paths (blocks of 32, 16, 8 and
  fewer filters; dilation; microbatches).  Eager (lifted out of any function being traced)."""
  worst = 0.0
  with tf.init_scope(), tf.device("/CPU:0"):
    if not tf.executing_eagerly():  # a tf.compat.v1 graph program: check in eager mode
      return _run_eagerly(_self_check, ops)
    for size, seed in ((1, (0, 0)), (2, (1, 2)), (7, (5, 3)), (4097, (2**40, -3)),
                       (70001, (9, 2**62))):
      key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=tf.constant(seed, tf.int64))
      expected = reference_normals(key, counter, size)
      drawn = ops.dpkit_stateless_normal(tf.constant([size], tf.int64), key, counter)
      x = np.linspace(-1.0, 1.0, size, dtype=np.float32)
      added = ops.dpkit_add_stateless_normal(x, tf.constant(0.5), key, counter)
      worst = max(worst, np.max(np.abs(drawn.numpy() - expected)),
                  np.max(np.abs(added.numpy() - (x + 0.5 * expected))))
    generator = np.random.default_rng(0)
    for microbatches, positions, vocab, width in ((3, 6, 4, 5), (17, 40, 9, 3)):
      ids = generator.integers(-1, vocab + 1, size=(microbatches, positions)).astype(np.int32)
      rows = generator.normal(size=(microbatches, positions, width)).astype(np.float32)
      factors = generator.uniform(size=microbatches).astype(np.float32)
      norms, clipped = reference_token_sums(ids, rows, factors, vocab)
      vocab_t = tf.constant(vocab, tf.int64)
      got_norms = ops.dpkit_token_squared_norms(ids, rows, vocab_t).numpy()
      got_sum = ops.dpkit_scatter_scaled_rows(ids, rows, factors, vocab_t).numpy()
      scale = max(1.0, float(np.max(norms)))  # relative to the size of the norms
      worst = max(worst, np.max(np.abs(got_norms - norms)) / scale,
                  np.max(np.abs(got_sum - clipped)) / np.sqrt(scale))
    # Blocks of 12 taps for 16 filters, of 6, 12, 16 taps for 32, 16, 8 filters and narrow
    # filters; dilated columns; microbatches of 2.
    for batch, image, channels, filters, kernel, strides, dilations, pads, groups, bias in (
        (2, (12, 16), 1, 16, (2, 13), (1, 1), (1, 1), (1, 6), 2, True),
        (2, (9, 9), 8, 59, (2, 2), (1, 1), (1, 1), (0, 0), 1, False),
        (1, (12, 12), 2, 5, (2, 2), (1, 1), (1, 1), (1, 1), 1, True),
        (4, (6, 7), 6, 37, (3, 2), (1, 1), (2, 3), (0, 0), 2, True),
        (2, (7, 7), 16, 40, (2, 2), (2, 2), (1, 1), (0, 0), 2, False)):
      x = generator.normal(size=(batch, *image, channels)).astype(np.float32)
      out = [(size + 2 * pad - (k - 1) * d - 1) // s + 1
             for size, pad, k, d, s in zip(image, pads, kernel, dilations, strides)]
      g = generator.normal(size=(batch, *out, filters)).astype(np.float32)
      norms, bias_grads, grads = reference_conv_norms(x, g, kernel, strides, dilations, pads,
                                                      groups, bias)
      got_norms, got_bias, got_grads = ops.dpkit_conv_kernel_grad_squared_norms(
          x, g, tf.constant(groups, tf.int64), kernel_size=kernel, strides=strides,
          dilations=dilations, pads=pads, with_bias=bias, keep_grads=True)
      scale = max(1.0, float(np.max(norms)))
      worst = max(worst, np.max(np.abs(got_norms.numpy() - norms)) / scale,
                  np.max(np.abs(got_bias.numpy() - bias_grads)) / np.sqrt(scale),
                  np.max(np.abs(got_grads.numpy() - grads)) / np.sqrt(scale))
  return float(worst)


def _run_eagerly(function, *args):
  """``function(*args)`` with eager execution, from a program that turned it off."""
  from tensorflow.python.eager import context  # noqa: PLC0415
  with context.eager_mode():
    return function(*args)
