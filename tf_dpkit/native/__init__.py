"""Compiled CPU kernels for the Gaussian noise draw, built from source on first use.

Contract:

* :func:`noise_ops` returns a module with the ops ``dpkit_stateless_normal(shape, key,
  counter)`` and ``dpkit_add_stateless_normal(x, stddev, key, counter)`` (``noise_kernels.cc``;
  float32, CPU), or ``None`` when they cannot be used here.  ``tf_dpkit.noise`` is the only
  caller: it draws with TensorFlow ops when this returns ``None``, on accelerators, for float64
  and inside XLA-compiled functions.
* The kernels draw the same standard normals as ``tf_dpkit.noise``'s TensorFlow-op sampler:
  the same Philox-4x32-10 uniforms bit for bit (``(key, counter)`` from TensorFlow's
  ``StatelessRandomGetKeyCounter`` of the same seed) and the same Box-Muller pairing; only
  log/sin/cos are computed differently (a few float32 ulps, ``|difference| < 1e-5``).  A
  library is used only after it reproduced the TensorFlow-op sampler on a self-check at load
  time; any failure (no compiler, a compile error, a failed check) logs one warning on the
  ``tf_dpkit`` logger and leaves the TensorFlow-op sampler in use: never a weaker or different
  noise distribution, only a slower draw.
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

SOURCE = pathlib.Path(__file__).with_name("noise_kernels.cc")
#: Set to "0" to draw noise with TensorFlow ops only.
SWITCH_VARIABLE = "TF_DPKIT_NATIVE"
CACHE_VARIABLE = "TF_DPKIT_CACHE_DIR"
#: The self-check's bound on |native - TensorFlow-op sampler| (normals are at most 5.65).
SELF_CHECK_TOLERANCE = 1e-5
_BUILD_TIMEOUT_S = 600

_lock = threading.Lock()
_state = {"tried": False, "ops": None, "reason": "not tried yet", "path": None}


class NativeUnavailable(RuntimeError):
  """The compiled kernels cannot be built, loaded or trusted here (the message says why)."""


def enabled() -> bool:
  """False when ``TF_DPKIT_NATIVE=0`` (or ``false``/``no``/``off``) is set."""
  return os.environ.get(SWITCH_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")


def noise_ops():
  """The loaded op module, or ``None`` (then :func:`status` says why).  Builds on first call."""
  if not enabled():
    return None
  with _lock:
    if not _state["tried"]:
      _state["tried"] = True
      try:
        path = build()
        _state["ops"] = _load_and_check(path)
        _state["path"] = str(path)
        _state["reason"] = f"loaded from {path}"
      except NativeUnavailable as error:
        _state["reason"] = str(error)
        logging.getLogger("tf_dpkit").warning(
            "tf_dpkit: compiled noise kernels unavailable (%s); noise is drawn with TensorFlow "
            "ops (same distribution, about 2-3x slower on CPU). Set %s=0 to silence this.",
            error, SWITCH_VARIABLE)
    return _state["ops"]


def status() -> str:
  """Why :func:`noise_ops` returns what it does (a path, a reason, or "turned off")."""
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
           *tf.sysconfig.get_compile_flags(), str(SOURCE), "-o", output,
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
  for part in (SOURCE.read_bytes(), tf.__version__.encode(), tf.sysconfig.get_lib().encode(),
               " ".join(_command(cxx, "out")).encode(), version.encode(),
               _cpu_identity().encode()):
    digest.update(part)
    digest.update(b"\0")
  return f"noise_kernels_{digest.hexdigest()[:20]}.so"


def build(force: bool = False) -> pathlib.Path:
  """Compiles ``noise_kernels.cc`` into :func:`cache_dir` unless already there; returns the
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
  difference = _self_check(ops)
  if not difference <= SELF_CHECK_TOLERANCE:
    raise NativeUnavailable(f"{path} failed its self-check: max |native - TensorFlow ops| = "
                            f"{difference} > {SELF_CHECK_TOLERANCE}")
  return ops


def _self_check(ops) -> float:
  """max |native - TensorFlow-op sampler| over sizes with odd/even halves, several chunks and
  threads, and the fused add; in its own graph, so it runs from any context."""
  from tf_dpkit import noise  # noqa: PLC0415 (noise imports this module)
  graph = tf.Graph()
  with graph.as_default():
    checks = []
    for size, seed in ((1, (0, 0)), (2, (1, 2)), (7, (5, 3)), (4097, (2**40, -3)),
                       (70001, (9, 2**62))):
      seed = tf.constant(seed, tf.int64)
      reference = noise.tf_ops_standard_normal(tf.TensorShape([size]), seed)
      key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=seed)
      native = ops.dpkit_stateless_normal(tf.constant([size], tf.int64), key, counter)
      x = tf.linspace(-1.0, 1.0, size)
      added = ops.dpkit_add_stateless_normal(x, tf.constant(0.5), key, counter)
      checks.append(tf.reduce_max(tf.abs(native - reference)))
      checks.append(tf.reduce_max(tf.abs(added - (x + 0.5 * reference))))
    worst = tf.reduce_max(tf.stack(checks))
  with tf.compat.v1.Session(graph=graph) as session:
    return float(np.asarray(session.run(worst)))
