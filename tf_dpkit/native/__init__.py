"""Compiled CPU kernels for the noise draw, the Embedding and convolution rules and the max-pooling
gradient of the fast path.

Built from source once per machine (``python -m tf_dpkit.native build``, else on first use)
into a cache folder of this user, and loaded only after their bytes are verified and a
self-check against numpy references passes; :func:`kernels_for` decides in one place where a
family may be used.  Any failure logs one warning and leaves the TensorFlow-op code (same
quantities, slower) in use; ``TF_DPKIT_NATIVE=0`` turns them off.  The ops, the cache and the
load checks: docs/design/native.md.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import pathlib
import platform
import shutil
import stat
import subprocess
import tempfile
import threading

import numpy as np
import tensorflow as tf

_HERE = pathlib.Path(__file__).parent
#: Each kernel family's source (one library per family).
SOURCES = {"noise": _HERE / "noise_kernels.cc", "embedding": _HERE / "embedding_kernels.cc",
           "conv": _HERE / "conv_kernels.cc", "pool": _HERE / "pool_kernels.cc"}
FAMILIES = tuple(SOURCES)
#: Included by every source (part of what each cached library's name hashes).
HEADERS = (_HERE / "kernels.h",)
#: Set to "0" to run the noise draw, Embedding and convolution clipping and max pooling as
#: TensorFlow ops only.
SWITCH_VARIABLE = "TF_DPKIT_NATIVE"
CACHE_VARIABLE = "TF_DPKIT_CACHE_DIR"
#: The self-check's bound on the largest difference from its float64 references (normals are at
#: most 5.65; the embedding and convolution checks are scaled to the same size).
SELF_CHECK_TOLERANCE = 1e-5
_BUILD_TIMEOUT_S = 600
_REBUILD_HINT = "python -m tf_dpkit.native build --force"

_lock = threading.Lock()
_state = {family: {"tried": False, "ops": None, "reason": "not tried yet"}
          for family in FAMILIES}
# Digests of the libraries this process built, by (cache folder device, inode, file name).
_built_digests: dict = {}
# Anonymous files holding loaded libraries: kept open for the life of the process, because
# TensorFlow and the dynamic loader know a loaded library by its path (/proc/self/fd/N), and a
# reused descriptor number would name the earlier library.
_loaded_files: list = []
_announced_build = False


class NativeUnavailable(RuntimeError):
  """The compiled kernels cannot be built, loaded or trusted here (the message says why)."""


def enabled() -> bool:
  """False when ``TF_DPKIT_NATIVE=0`` (or ``false``/``no``/``off``) is set."""
  return os.environ.get(SWITCH_VARIABLE, "1").strip().lower() not in ("0", "false", "no", "off")


def _check_family(family: str) -> None:
  if family not in SOURCES:
    raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")


@tf.autograph.experimental.do_not_convert  # plain Python, also when called while tracing
def kernels(family: str):
  """The loaded op module of ``family`` (one of :data:`FAMILIES`), or ``None`` (then
  :func:`status` says why).  Builds on first call if no verified library is cached."""
  _check_family(family)
  if not enabled():
    return None
  with _lock:
    state = _state[family]
    if not state["tried"]:
      state["tried"] = True
      try:
        state["ops"], state["reason"] = _load(family, lazy=True)
      except Exception as error:  # noqa: BLE001 - optional speed-up: never fail training
        state["reason"] = (str(error) if isinstance(error, NativeUnavailable)
                           else f"{type(error).__name__}: {error}")
        logging.getLogger("tf_dpkit").warning(
            "tf_dpkit: compiled CPU kernels for %s unavailable (%s); it runs as TensorFlow ops "
            "(the same quantities, slower on CPU). Set %s=0 to silence this.",
            family, state["reason"], SWITCH_VARIABLE)
    return state["ops"]


@tf.autograph.experimental.do_not_convert
def kernels_for(family: str, device, dtype):
  """:func:`kernels` of ``family`` when work of ``dtype`` for ``device`` (a device string;
  ``""`` or None for "wherever TensorFlow places it") may use them, else None: float32 work
  (float16 and bfloat16 are computed in float32), on a CPU, outside XLA-compiled functions."""
  _check_family(family)
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
  return kernels(family)


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


def status(family: str | None = None) -> str:
  """Why :func:`kernels` returns what it does for ``family`` (a path with the digest and the
  build log, a reason, or "turned off"); for all families (``"noise: ...; embedding: ...;
  conv: ...; pool: ..."``) without one."""
  if not enabled():
    return f"turned off by {SWITCH_VARIABLE}={os.environ[SWITCH_VARIABLE]}"
  if family is None:
    return "; ".join(f"{name}: {_state[name]['reason']}" for name in FAMILIES)
  _check_family(family)
  return _state[family]["reason"]


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


def _command(cxx: str, family: str, output: str) -> list[str]:
  # TensorFlow's headers as system headers: the log shows the warnings of tf_dpkit's sources.
  flags = [("-isystem" + flag[2:]) if flag.startswith("-I") else flag
           for flag in tf.sysconfig.get_compile_flags()]
  return ([cxx, "-shared", "-fPIC", "-O3", "-march=native", "-fopenmp-simd", "-Wall",
           *flags, str(SOURCES[family]), "-o", output, *tf.sysconfig.get_link_flags()])


def _cpu_identity() -> str:
  try:
    with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
      lines = cpuinfo.read().splitlines()
    keep = [l for l in lines if l.startswith(("model name", "flags"))][:2]
    return "\n".join(keep) or platform.processor()
  except OSError:
    return platform.machine() + platform.processor()


def library_name(family: str, cxx: str | None = None) -> str:
  """The cached library's file name for ``family``: a hash of what its build depends on (its
  source, the shared header, TensorFlow, the command, the compiler's version and the CPU).
  The name only finds the file; what may be loaded is decided by its digest (module doc)."""
  _check_family(family)
  cxx = cxx or _compiler()
  try:
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True,
                             timeout=60).stdout
  except (OSError, subprocess.SubprocessError) as error:
    raise NativeUnavailable(f"the compiler {cxx!r} does not run: {error}") from error
  digest = hashlib.sha256()
  for part in (SOURCES[family].read_bytes(), *(header.read_bytes() for header in HEADERS),
               tf.__version__.encode(), tf.sysconfig.get_lib().encode(),
               " ".join(_command(cxx, family, "out")).encode(), version.encode(),
               _cpu_identity().encode()):
    digest.update(part)
    digest.update(b"\0")
  return f"tf_dpkit_{family}_{digest.hexdigest()[:20]}.so"


def _refuse_foreign(info: os.stat_result, what: str) -> None:
  """Raises :class:`NativeUnavailable` unless ``info`` belongs to this user and no one else
  may write to it."""
  user = os.geteuid()
  if info.st_uid != user:
    raise NativeUnavailable(
        f"{what} is owned by uid {info.st_uid}, not by this user (uid {user}); not used. "
        f"Point {CACHE_VARIABLE} at a folder of your own")
  if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
    raise NativeUnavailable(
        f"{what} is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o}); not "
        f"used. Make it private (chmod go-w) or point {CACHE_VARIABLE} at a folder of your own")


def _open_cache_folder() -> tuple[int, pathlib.Path]:
  """Creates :func:`cache_dir` (mode 0700) if needed and opens it; returns ``(descriptor,
  path)`` after checking the opened folder's owner and mode (:func:`_refuse_foreign`)."""
  folder = cache_dir()
  try:
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
      os.mkdir(folder, 0o700)
    except FileExistsError:
      pass
    descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
  except OSError as error:
    raise NativeUnavailable(f"cannot create or open the cache folder {folder}: {error}") \
        from error
  try:
    _refuse_foreign(os.fstat(descriptor), f"the cache folder {folder}")
  except BaseException:
    os.close(descriptor)
    raise
  return descriptor, folder


def _read_private(folder_fd: int, name: str, folder: pathlib.Path) -> bytes | None:
  """The bytes of the regular file ``name`` in the open folder, or None if it does not exist;
  refuses a symbolic link, another kind of file, or a file of another owner or writable by
  group or others."""
  try:
    descriptor = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC,
                         dir_fd=folder_fd)
  except FileNotFoundError:
    return None
  except OSError as error:
    if error.errno == errno.ELOOP:
      raise NativeUnavailable(
          f"{folder / name} is a symbolic link; not used. Remove it or run "
          f"`{_REBUILD_HINT}`") from error
    raise NativeUnavailable(f"cannot open {folder / name}: {error}") from error
  with os.fdopen(descriptor, "rb") as file:
    info = os.fstat(file.fileno())
    if not stat.S_ISREG(info.st_mode):
      raise NativeUnavailable(f"{folder / name} is not a regular file; not used")
    _refuse_foreign(info, str(folder / name))
    return file.read()


def _write_private(folder_fd: int, name: str, data: bytes) -> None:
  """Writes ``data`` to ``name`` in the open folder atomically: a new file (mode 0600, created
  exclusively), flushed to disk, then renamed over ``name`` (replacing a link, not its
  target)."""
  partial = f".{name}.{os.getpid()}.{threading.get_ident()}.partial"
  descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                       os.O_CLOEXEC, 0o600, dir_fd=folder_fd)
  try:
    with os.fdopen(descriptor, "wb") as file:
      file.write(data)
      file.flush()
      os.fsync(file.fileno())
    os.replace(partial, name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
  except BaseException:
    try:
      os.unlink(partial, dir_fd=folder_fd)
    except OSError:
      pass
    raise


class _BuildLock:
  """An exclusive ``flock`` on ``<library>.lock`` in the open folder, opened without following
  symbolic links (mode 0600)."""

  def __init__(self, folder_fd: int, name: str, folder: pathlib.Path):
    path = folder / (name + ".lock")
    try:
      self._fd = os.open(name + ".lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o600, dir_fd=folder_fd)
    except OSError as error:
      if error.errno == errno.ELOOP:
        raise NativeUnavailable(f"the lock file {path} is a symbolic link; not used. Remove "
                                "it") from error
      raise NativeUnavailable(f"cannot open the lock file {path}: {error}") from error
    if not stat.S_ISREG(os.fstat(self._fd).st_mode):
      os.close(self._fd)
      raise NativeUnavailable(f"the lock file {path} is not a regular file; not used")

  def __enter__(self):
    fcntl.flock(self._fd, fcntl.LOCK_EX)  # one build per library; waiting processes reuse it
    return self

  def __exit__(self, *exc):
    os.close(self._fd)  # releases the lock


def _compile(family: str, cxx: str) -> tuple[bytes, str, int]:
  """Compiles ``family`` in a private temporary folder: ``(library bytes, compiler messages,
  exit status)``; the bytes are empty when the compiler failed."""
  with tempfile.TemporaryDirectory(prefix="tf_dpkit_build_") as work:  # mode 0700
    output = os.path.join(work, "library.so")
    try:
      done = subprocess.run(_command(cxx, family, output), capture_output=True, text=True,
                            timeout=_BUILD_TIMEOUT_S)
    except (OSError, subprocess.SubprocessError) as error:
      raise NativeUnavailable(f"building with {cxx} failed: {error}") from error
    log = (done.stdout + done.stderr).strip()
    if done.returncode != 0:
      return b"", log, done.returncode
    with open(output, "rb") as file:
      return file.read(), log, 0


def _digest_record(digest: str, name: str) -> bytes:
  return f"{digest}  {name}\n".encode()


def _parse_digest_record(record: bytes, path: pathlib.Path) -> str:
  fields = record.decode("ascii", "replace").split()
  if not fields or len(fields[0]) != 64 or any(c not in "0123456789abcdef" for c in fields[0]):
    raise NativeUnavailable(f"{path} does not hold a SHA-256 digest; not used. Run "
                            f"`{_REBUILD_HINT}`")
  return fields[0]


def _build_locked(family: str, cxx: str, folder_fd: int, folder: pathlib.Path,
                  name: str) -> tuple[bytes, str, int]:
  """Builds ``family`` (the caller holds the lock) and stores library, digest and log in the
  folder; returns ``(library bytes, digest, number of compiler warnings)``."""
  data, log, code = _compile(family, cxx)
  log_name = name[:-len(".so")] + ".log"
  _write_private(folder_fd, log_name, (log + "\n").encode() if log else b"")
  if code != 0:
    tail = log.splitlines()[-5:]
    raise NativeUnavailable(f"{cxx} failed (exit {code}): " + " | ".join(tail) +
                            f" (all messages in {folder / log_name})")
  digest = hashlib.sha256(data).hexdigest()
  try:  # no digest file while the library changes: a crash leaves "rebuild", not "mismatch"
    os.unlink(name + ".sha256", dir_fd=folder_fd)
  except FileNotFoundError:
    pass
  _write_private(folder_fd, name, data)
  _write_private(folder_fd, name + ".sha256", _digest_record(digest, name))
  info = os.fstat(folder_fd)
  _built_digests[(info.st_dev, info.st_ino, name)] = digest
  return data, digest, log.count("warning:")


def _verified_library(family: str, *, force: bool = False, lazy: bool = False,
                      build_missing: bool = True) -> tuple[bytes, str, str]:
  """The library of ``family`` as verified bytes: ``(bytes, digest, how)`` where ``how`` says
  where the bytes and their digest came from.  Builds (under the lock) when forced or when no
  library with a digest file is cached (unless not ``build_missing``: then raises)."""
  global _announced_build
  cxx = _compiler()
  name = library_name(family, cxx)
  folder_fd, folder = _open_cache_folder()
  try:
    with _BuildLock(folder_fd, name, folder):
      data = None if force else _read_private(folder_fd, name, folder)
      record = None if force else _read_private(folder_fd, name + ".sha256", folder)
      log_path = folder / (name[:-len(".so")] + ".log")
      if data is None or record is None:
        if not build_missing:
          raise NativeUnavailable(f"not built yet (no {folder / name} with its digest file)")
        if lazy:
          logging.getLogger("tf_dpkit").log(
              logging.INFO if _announced_build else logging.WARNING,
              "tf_dpkit: building the compiled CPU kernels for %s into %s (once per machine "
              "and TensorFlow version; `python -m tf_dpkit.native build` after installing "
              "does this ahead of time)", family, folder)
          _announced_build = True
        data, digest, warnings = _build_locked(family, cxx, folder_fd, folder, name)
        return data, digest, (f"built by this process; {warnings} compiler warnings, all "
                              f"messages in {log_path}")
      info = os.fstat(folder_fd)
      known = _built_digests.get((info.st_dev, info.st_ino, name))
      expected = known or _parse_digest_record(record, folder / (name + ".sha256"))
      digest = hashlib.sha256(data).hexdigest()
      if digest != expected:
        raise NativeUnavailable(
            f"{folder / name} does not match the SHA-256 recorded when it was built "
            f"({digest[:16]}... against {expected[:16]}...); not loaded. Run `{_REBUILD_HINT}`")
      source = "this process's build" if known else f"{name}.sha256"
      return data, digest, f"digest checked against {source}; compiler messages in {log_path}"
  finally:
    os.close(folder_fd)


def build(family: str, force: bool = False) -> pathlib.Path:
  """Makes sure :func:`cache_dir` holds a verified library of ``family``: compiles it when
  ``force`` or when none with a digest file is cached; returns the library's path.  Raises
  :class:`NativeUnavailable` with the reason (the compiler's message, a refused folder or
  file, a digest mismatch) on failure."""
  _check_family(family)
  _verified_library(family, force=force)
  return cache_dir() / library_name(family)


def cached_status() -> dict:
  """``{family: "cached at <path> (sha256 ...)" or why not}`` for every family: what a process
  would load, checked as before a load (module doc) but without building or loading."""
  results = {}
  for family in FAMILIES:
    try:
      _, digest, how = _verified_library(family, build_missing=False)
      results[family] = (f"cached at {cache_dir() / library_name(family)} "
                         f"(sha256 {digest[:16]}...; {how})")
    except NativeUnavailable as error:
      results[family] = str(error)
  return results


def _load(family: str, *, force: bool = False, lazy: bool = False):
  """``(ops, reason)`` for ``family``: verified bytes (:func:`_verified_library`), loaded and
  self-checked."""
  data, digest, how = _verified_library(family, force=force, lazy=lazy)
  path = cache_dir() / library_name(family)
  ops = _load_and_check(family, data, str(path))
  return ops, f"loaded from {path} (sha256 {digest[:16]}...; {how})"


def _load_bytes(data: bytes, label: str):
  """``tf.load_op_library`` of exactly ``data``: from a sealed anonymous in-memory file where
  the system has them, else from a new private temporary file."""
  if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
    sealing = getattr(os, "MFD_ALLOW_SEALING", 0)
    descriptor = os.memfd_create(os.path.basename(label), os.MFD_CLOEXEC | sealing)
    view = memoryview(data)
    while view:
      view = view[os.write(descriptor, view):]
    if sealing and hasattr(fcntl, "F_ADD_SEALS"):
      fcntl.fcntl(descriptor, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW |
                  fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_SEAL)
    _loaded_files.append(descriptor)
    return tf.load_op_library(f"/proc/self/fd/{descriptor}")
  work = tempfile.mkdtemp(prefix="tf_dpkit_load_")  # mode 0700, a new name every time
  path = os.path.join(work, os.path.basename(label))
  try:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o500)
    with os.fdopen(descriptor, "wb") as file:
      file.write(data)
    return tf.load_op_library(path)
  finally:
    shutil.rmtree(work, ignore_errors=True)  # the loader keeps its mapping


def _load_and_check(family: str, data: bytes, label: str):
  """Loads ``data`` (:func:`_load_bytes`) and returns the op module after ``family``'s
  self-check; raises :class:`NativeUnavailable` naming ``label`` otherwise."""
  try:
    ops = _load_bytes(data, label)
  except (tf.errors.OpError, OSError) as error:
    raise NativeUnavailable(f"loading {label} failed: {error}") from error
  try:
    difference = _SELF_CHECKS[family](ops)
  except Exception as error:  # noqa: BLE001 - any failure means: do not use this library
    raise NativeUnavailable(f"{label} failed its self-check: {type(error).__name__}: "
                            f"{error}") from error
  if not difference <= SELF_CHECK_TOLERANCE:
    raise NativeUnavailable(f"{label} failed its self-check: largest difference from the "
                            f"references {difference} > {SELF_CHECK_TOLERANCE}")
  return ops


def build_all(force: bool = False) -> dict:
  """Builds (or verifies the cached build of), loads and self-checks every family in this
  process (``force``: compiles again even where a verified library is cached); returns
  ``{family: status}``.  What ``python -m tf_dpkit.native build`` runs.  A family already
  loaded in this process is left as it is."""
  for family in FAMILIES:
    with _lock:
      state = _state[family]
      if state["ops"] is not None:
        continue
      state["tried"] = True
      try:
        state["ops"], state["reason"] = _load(family, force=force)
      except Exception as error:  # noqa: BLE001 - reported per family
        state["reason"] = (str(error) if isinstance(error, NativeUnavailable)
                           else f"{type(error).__name__}: {error}")
  return {family: _state[family]["reason"] for family in FAMILIES}
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


def reference_max_pool_grad(x, g, ksize, strides, pads):
  """Brute force: the input gradient of a 2-D max pooling, ``dx[b, i, j, c]`` = the sum of
  ``g[b, oy, ox, c]`` over the windows whose maximum of channel ``c`` is at ``(i, j)``, the
  maximum being the first entry in row-major order that no later entry strictly exceeds (window
  ``(oy, ox)``: rows ``oy sh - pad_top`` to ``+ kh - 1`` and columns ``ox sw - pad_left`` to
  ``+ kw - 1`` inside the image).  What the pooling kernel (and TensorFlow's MaxPoolGrad on a CPU)
  must return; ``x`` [B, H, W, C], ``g`` [B, OH, OW, C], the others (height, width) pairs."""
  x, g = np.asarray(x), np.asarray(g)
  (kh, kw), (sh, sw), (top, left) = ksize, strides, pads
  dx = np.zeros(x.shape, np.float64)
  for b, oy, ox, c in np.ndindex(g.shape):
    best = None
    for iy in range(max(oy * sh - top, 0), min(oy * sh - top + kh, x.shape[1])):
      for ix in range(max(ox * sw - left, 0), min(ox * sw - left + kw, x.shape[2])):
        if best is None or x[b, best[0], best[1], c] < x[b, iy, ix, c]:
          best = (iy, ix)
    dx[b, best[0], best[1], c] += g[b, oy, ox, c]
  return dx


def _eager_check(check):
  """``check(ops)`` run eagerly on the CPU, lifted out of any function being traced (also from
  a ``tf.compat.v1`` graph program)."""
  def run(ops) -> float:
    with tf.init_scope(), tf.device("/CPU:0"):
      if not tf.executing_eagerly():
        from tensorflow.python.eager import context  # noqa: PLC0415
        with context.eager_mode():
          return float(check(ops))
      return float(check(ops))
  run.__name__, run.__doc__ = check.__name__, check.__doc__
  return run


@_eager_check
def _self_check_noise(ops) -> float:
  """Largest difference of the noise kernels from Box-Muller of TensorFlow's own uniforms, over
  sizes with odd and even halves, several chunks and threads, and the fused add."""
  worst = 0.0
  for size, seed in ((1, (0, 0)), (2, (1, 2)), (7, (5, 3)), (4097, (2**40, -3)),
                     (70001, (9, 2**62))):
    key, counter = tf.raw_ops.StatelessRandomGetKeyCounter(seed=tf.constant(seed, tf.int64))
    expected = reference_normals(key, counter, size)
    drawn = ops.dpkit_stateless_normal(tf.constant([size], tf.int64), key, counter)
    x = np.linspace(-1.0, 1.0, size, dtype=np.float32)
    added = ops.dpkit_add_stateless_normal(x, tf.constant(0.5), key, counter)
    worst = max(worst, np.max(np.abs(drawn.numpy() - expected)),
                np.max(np.abs(added.numpy() - (x + 0.5 * expected))))
  return worst


@_eager_check
def _self_check_embedding(ops) -> float:
  """Largest difference of the embedding kernels from brute-force token sums with repeats and
  uncounted ids (relative to the size of the norms)."""
  worst = 0.0
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
  return worst


@_eager_check
def _self_check_conv(ops) -> float:
  """Largest difference of the convolution kernel from brute force over its code paths
  (blocks of 32, 16, 8 and fewer filters; dilation; microbatches), relative to the norms."""
  worst = 0.0
  generator = np.random.default_rng(1)
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
  return worst


@_eager_check
def _self_check_pool(ops) -> float:
  """Largest difference of the max-pooling gradient from brute force, over overlapping and
  strided windows, same-padding offsets, ties (repeated values) and several examples."""
  worst = 0.0
  generator = np.random.default_rng(2)
  # (VALID; SAME with top padding; SAME with left padding, as TensorFlow pads them.)
  for batch, image, channels, ksize, strides, pads, out in (
      (3, (6, 7), 5, (2, 2), (1, 1), (0, 0), (5, 6)),
      (2, (7, 5), 3, (3, 2), (2, 1), (1, 0), (4, 5)),
      (2, (5, 5), 17, (2, 3), (2, 2), (0, 1), (3, 3))):
    # Values from a few levels, so that windows hold ties.
    x = generator.integers(0, 4, size=(batch, *image, channels)).astype(np.float32)
    g = generator.normal(size=(batch, *out, channels)).astype(np.float32)
    got = ops.dpkit_max_pool_grad(x, g, ksize=ksize, strides=strides, pads=pads).numpy()
    worst = max(worst, np.max(np.abs(got - reference_max_pool_grad(x, g, ksize, strides, pads))))
  return worst


_SELF_CHECKS = {"noise": _self_check_noise, "embedding": _self_check_embedding,
                "conv": _self_check_conv, "pool": _self_check_pool}
