"""DP-SGD under ``tf.distribute``: one step over the global batch, whatever the replicas.

Supported: no strategy, ``OneDeviceStrategy``, ``MirroredStrategy`` and
``MultiWorkerMirroredStrategy``; any other strategy is refused at the first private gradient.
Each replica clips its examples, adds its noise term (:func:`noise_part`) and divides by the
global normaliser; the all-reduced sum is one Gaussian release of std ``sigma C`` on the
global clipped sum, as on one device.  ``num_microbatches`` counts the global batch's
microbatches (a multiple of the replicas).  The noise split, keys, budget and host-memory
setting: docs/design/distribute.md.
"""
from __future__ import annotations

import logging
import math
import os
import platform

import tensorflow as tf

_SUPPORTED = (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy,
              tf.distribute.OneDeviceStrategy)


def check_supported_strategy(owner: str, *, replicas_supported: bool = True) -> None:
  """Raises ``NotImplementedError`` under a strategy DP-SGD does not support (module doc).

  ``replicas_supported=False`` (the ``tf.compat.v1`` optimizers) also refuses several replicas.
  """
  if not tf.distribute.has_strategy():
    return
  strategy = tf.distribute.get_strategy()
  check_strategy(strategy, owner)
  if not replicas_supported and strategy.num_replicas_in_sync > 1:
    raise NotImplementedError(
        f"{owner} runs under {type(strategy).__name__} with {strategy.num_replicas_in_sync} "
        "replicas; the tf.compat.v1 optimizers train on one replica. Use the Keras DP "
        "optimizers (tf_dpkit.DP...GaussianOptimizer) for several replicas.")


def check_strategy(strategy, owner: str) -> None:
  """Raises ``NotImplementedError`` naming ``strategy`` if DP-SGD does not support it (module
  doc); ``owner`` names the caller in the message."""
  # The default strategy (what get_strategy() returns outside every scope) is "no strategy".
  default = type(strategy).__name__ == "_DefaultDistributionStrategy"
  supported = default or (isinstance(strategy, _SUPPORTED) and not isinstance(
      strategy, tf.distribute.experimental.CentralStorageStrategy))
  if not supported:
    raise NotImplementedError(
        f"{owner} runs under {type(strategy).__name__}, which DP-SGD does not support: its "
        "updates are not one Gaussian release of the global clipped sum per step. Supported: "
        "no strategy, OneDeviceStrategy, MirroredStrategy and MultiWorkerMirroredStrategy.")


def is_chief(strategy=None) -> bool:
  """True on the process that logs for the cluster: the ``"chief"`` task if the cluster has
  one, else worker 0; always True without a multi-worker strategy.  ``strategy`` defaults to
  the current one."""
  strategy = tf.distribute.get_strategy() if strategy is None else strategy
  resolver = getattr(strategy, "cluster_resolver", None)
  if resolver is None or not resolver.task_type:
    return True
  if "chief" in resolver.cluster_spec().as_dict():
    return resolver.task_type == "chief"
  return resolver.task_type == "worker" and int(resolver.task_id or 0) == 0


def num_replicas() -> int:
  """Replicas in sync in the current replica context (1 without a strategy)."""
  context = tf.distribute.get_replica_context()
  return 1 if context is None else int(context.num_replicas_in_sync)


def replica_id():
  """The current replica's id in its sync group (a scalar tensor), or None for one replica."""
  context = tf.distribute.get_replica_context()
  if context is None or context.num_replicas_in_sync == 1:
    return None
  return context.replica_id_in_sync_group


def noise_part():
  """How this replica's noise covers the variables (module doc): ``(replica_id, R)`` under a
  ``MirroredStrategy`` with ``R > 1`` replicas (all in this process: replica ``replica_id``
  draws full-variance noise on its slice, ``tf_dpkit.noise.add_gaussian_noise``'s ``part``);
  None with one replica or under ``MultiWorkerMirroredStrategy`` (every replica draws a share
  of variance ``1/R`` on every element)."""
  context = tf.distribute.get_replica_context()
  if context is None or context.num_replicas_in_sync == 1:
    return None
  strategy = tf.distribute.get_strategy()
  if (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) or
      not isinstance(strategy, tf.distribute.MirroredStrategy)):
    return None
  return context.replica_id_in_sync_group, int(context.num_replicas_in_sync)


def replica_noise(total_stddev):
  """This replica's noise for ``tf_dpkit.noise.add_gaussian_noise``: ``(stddev, replica, part)``
  such that the replicas' terms sum to one ``N(0, total_stddev^2)`` draw per element (module
  doc).  One replica: ``(total_stddev, None, None)``; ``MirroredStrategy``: the full
  ``total_stddev`` on this replica's slice (:func:`noise_part`); several workers: a share,
  ``total_stddev / sqrt(R)`` on every element.  ``total_stddev``: a number or scalar tensor."""
  replicas, part = num_replicas(), noise_part()
  if replicas > 1 and part is None:
    total_stddev = total_stddev / math.sqrt(replicas)
  return total_stddev, replica_id(), part


def global_sum(value):
  """Sum of ``value`` (a scalar tensor) over the replicas; ``value`` itself for one replica."""
  context = tf.distribute.get_replica_context()
  if context is None or context.num_replicas_in_sync == 1:
    return value
  return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


def local_num_microbatches(num_microbatches):
  """This replica's share of the global ``num_microbatches`` (None stays None).

  Raises:
    ValueError: ``num_microbatches`` is not a multiple of the number of replicas.
  """
  replicas = num_replicas()
  if num_microbatches is None or replicas == 1:
    return num_microbatches
  if num_microbatches % replicas:
    raise ValueError(
        f"num_microbatches={num_microbatches} counts the microbatches of the global batch and "
        f"must be a multiple of the {replicas} replicas (each replica splits its local batch "
        f"into num_microbatches / {replicas}); use e.g. "
        f"{replicas * max(1, num_microbatches // replicas)}.")
  return num_microbatches // replicas


def local_worker_addresses(count: int) -> list:
  """``count`` ``"localhost:PORT"`` addresses on ports free right now, for a cluster of worker
  processes on one host (``TF_CONFIG``'s ``cluster.worker``; tests and single-host runs).

  A port is free when this returns; another process could take it before the workers start.
  """
  import socket  # pylint: disable=g-import-not-at-top
  sockets = [socket.socket() for _ in range(count)]
  try:
    for s in sockets:
      s.bind(("localhost", 0))
    return [f"localhost:{s.getsockname()[1]}" for s in sockets]
  finally:
    for s in sockets:
      s.close()


# The smallest glibc top pad (bytes) with which the conv rule's first-layer op is as fast under a
# strategy as without one: its scratch is about 64 KiB per example for the MNIST CNN, for
# conv._FILTER_BACKPROP_CHUNK (128) examples per call, i.e. 8 MiB; the pad leaves room for
# larger kernels and more filters.
MIN_TOP_PAD_BYTES = 32 << 20
# The pad keep_freed_host_memory sets (what MALLOC_TOP_PAD_=67108864 sets at start-up).
TOP_PAD_BYTES = 64 << 20
OPT_OUT_VARIABLE = "TF_DPKIT_KEEP_FREED_MEMORY"
# glibc's own malloc settings: where the user set any, keep_freed_host_memory leaves malloc
# alone.
USER_MALLOC_VARIABLES = ("MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_",
                         "GLIBC_TUNABLES")
_M_TOP_PAD = -2  # glibc's mallopt parameter number (malloc.h)
_pad_set = False


def _on_glibc() -> bool:
  return platform.libc_ver()[0] == "glibc"


def _tensorflow_started() -> bool:
  """Whether TensorFlow's eager context (and with it its thread pools) exists; True when
  TensorFlow cannot say, the conservative answer."""
  try:
    from tensorflow.python.eager import context  # pylint: disable=g-import-not-at-top
    ctx = context.context_safe()
    return ctx is not None and ctx._context_handle is not None  # pylint: disable=protected-access
  except (ImportError, AttributeError):
    return True


def keep_freed_host_memory() -> bool:
  """Sets glibc's top pad to ``TOP_PAD_BYTES`` (64 MiB) with ``mallopt(M_TOP_PAD)`` if that can
  take effect; returns whether it did (or had).  An explicit, process-wide choice: call it at
  the top of a training script that runs under a ``tf.distribute`` strategy on CPUs, before
  TensorFlow runs an op or a strategy is created (module doc); ``import tf_dpkit`` does not.

  It does nothing (and returns False) unless all of these hold: the C library is glibc;
  ``TF_DPKIT_KEEP_FREED_MEMORY`` is not ``"0"``; the user set none of glibc's ``MALLOC_TOP_PAD_``,
  ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or the ``GLIBC_TUNABLES`` variable (their
  choice stands); and TensorFlow has not started its eager context.  The last condition is a
  requirement: a ``mallopt`` made once TensorFlow's worker threads exist does not remove the
  conv op's page faults, one made after ``import tensorflow`` but before the first op or
  strategy does (``benchmarks/first_conv_methods.py``; results and method in
  ``benchmarks/results/distributed.md``).

  Effect on the process: every ``malloc`` arena keeps up to 64 MiB of freed memory at its top
  instead of returning it to the operating system (glibc makes at most 8 arenas per core), and
  glibc's mmap threshold stays at its default (128 KiB) instead of adapting, exactly as with
  ``MALLOC_TOP_PAD_=67108864`` at start-up.  Nothing is allocated in advance.
  """
  global _pad_set
  if _pad_set:
    return True
  user_set = any(name in os.environ for name in USER_MALLOC_VARIABLES)
  if (os.environ.get(OPT_OUT_VARIABLE) == "0" or user_set or not _on_glibc() or
      _tensorflow_started()):
    return False
  try:
    import ctypes  # pylint: disable=g-import-not-at-top
    libc = ctypes.CDLL(None)
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _pad_set = libc.mallopt(_M_TOP_PAD, TOP_PAD_BYTES) == 1
  except (OSError, AttributeError):
    _pad_set = False
  return _pad_set


#: The name before the pad became an explicit call (kept for one release).
keep_freed_host_memory_at_import = keep_freed_host_memory


_fallback_reported = False


def report_freed_memory_fallback(what: str) -> None:
  """Logs once per process (``logging`` logger ``tf_dpkit``, level WARNING) that ``what`` takes
  a slower path under a strategy because :func:`host_keeps_freed_memory` is False, and how to
  avoid it.  Speed only: both paths give the same values."""
  global _fallback_reported
  if _fallback_reported:
    return
  _fallback_reported = True
  logging.getLogger("tf_dpkit").warning(
      "tf_dpkit: under this tf.distribute strategy %s take a slower path (same values): glibc "
      "returns freed host memory to the system each step (tf_dpkit.distribute."
      "keep_freed_host_memory() was not called before TensorFlow started, or %s=0, or a "
      "MALLOC_* setting of yours). Call tf_dpkit.distribute.keep_freed_host_memory() at the "
      "top of the script, before running TensorFlow ops or creating the strategy, or start "
      "the process with MALLOC_TOP_PAD_=67108864.", what, OPT_OUT_VARIABLE)


def host_keeps_freed_memory() -> bool:
  """True if every glibc ``malloc`` arena of this process keeps at least ``MIN_TOP_PAD_BYTES``
  (32 MiB) of freed memory at its top instead of returning it to the operating system: set by
  :func:`keep_freed_host_memory` in this process, or the process was started
  with ``MALLOC_TOP_PAD_`` of at least that many bytes (decimal digits only; any other spelling
  reads as False, the conservative answer: only speed depends on it).  False on other C
  libraries.

  Why it matters: under a ``tf.distribute`` strategy on a CPU, the first convolution's
  per-example op (oneDNN's depthwise filter gradient, used for inputs of 1-3 channels) runs on
  TensorFlow's worker threads and takes a scratch buffer of about 64 KiB per example each step;
  without the pad glibc maps and unmaps it every step, so each step faults in 16 fresh pages per
  example, and none with the pad (``benchmarks/distributed.py``; the numbers are in
  ``benchmarks/results/distributed.md``).  So under a strategy the conv rule uses that op only
  when this returns True, else it unfolds patches (slower, same benchmark); both give the same
  per-example gradients.
  """
  if not _on_glibc():
    return False
  if _pad_set:
    return True
  value = os.environ.get("MALLOC_TOP_PAD_", "")
  return value.isdigit() and int(value) >= MIN_TOP_PAD_BYTES
