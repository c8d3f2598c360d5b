"""DP-SGD under ``tf.distribute``: one step over the global batch, whatever the replicas.

Supported: the default strategy, ``OneDeviceStrategy``, ``MirroredStrategy`` (several devices
of one host) and ``MultiWorkerMirroredStrategy`` (several hosts).  Every other strategy
(``ParameterServerStrategy``, ``CentralStorageStrategy``, ``TPUStrategy``, ...) is refused when
the first private gradient is computed, with an error naming it.

Semantics, identical in distribution to single-device DP-SGD over the global batch:

* each replica clips every example (microbatch) of its local batch once and sums: ``S_r``;
* each replica adds independent noise ``N(0, sigma^2 C^2 / R I)`` (the replicas' noise seeds
  differ by their replica id folded into the key) and divides by the *global* normaliser
  ``n``: the expected global batch size ``qN`` (``expected_batch_size``), else the number of
  microbatches of the global batch (summed across replicas);
* the optimizer's update then sums the replicas' gradients (Keras all-reduces with SUM), giving
  ``(sum_r S_r + sum_r Z_r) / n`` with ``sum_r Z_r ~ N(0, sigma^2 C^2 I)``: exactly one Gaussian
  release of the global clipped sum per step, and every replica applies that same update.

Why independent per-replica shares instead of one draw: a single draw would have to be made on
one replica and broadcast (an extra collective per step, or equal keys on every replica, which
would make replica r's share ``Z`` known to all); the shares need no communication beyond the
gradient all-reduce Keras does anyway, and their sum has exactly the accounted distribution.
The per-replica partial sums are never released, only their total.

Noise keys: the optimizer's key (secret unless ``seed`` is given) may be the same on every
replica and worker (a variable made in the strategy's scope is mirrored, on several workers from
worker 0); that is the design: each replica folds its id in the sync group (global across
workers) into the seed, so no two replicas draw the same stream, and the key itself stays out
of every config, checkpoint and graph as without a strategy (``tf_dpkit.noise``).

``num_microbatches`` counts the microbatches of the *global* batch: each of the R replicas
splits its local batch into ``num_microbatches / R`` microbatches, so it must be a multiple of
R and ``num_microbatches / R`` must divide every local batch.  The privacy accountant counts
global steps (the optimizer's ``iterations``), once.  Every worker runs the same
``PrivacyBudget`` on the same step count, so all compute the same epsilon and stop at the same
step (a budget stop stops every worker); only the chief (:func:`is_chief`) prints.

Poisson sampling under several replicas: ``tf_dpkit.data.distributed_poisson_batches`` gives
each replica its own disjoint part of every Poisson batch (their union is a Poisson sample of
the whole data set, so the accounting is that of one device); a plain ``poisson_batches``
dataset is refused by DP models' ``fit`` under several replicas.

Host memory on CPUs (speed only, never the result): under a strategy TensorFlow runs a step's
kernels on its worker threads, whose glibc ``malloc`` arenas give large freed blocks back to the
operating system, so a kernel that takes a large scratch buffer every step touches fresh pages
every step.  :func:`keep_freed_host_memory` (opt-in, process-wide) lets every arena keep a pad of
freed memory instead; :func:`host_keeps_freed_memory` says whether it or ``MALLOC_TOP_PAD_``
has done so, and the conv rule then uses its faster first-layer op under a strategy too.
"""
from __future__ import annotations

import os

import tensorflow as tf

from analysis import _checks

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
# strategy as without one: its scratch is about 64 KiB per example, at most
# conv._MAX_FILTER_BACKPROP_BATCH (384) examples, i.e. 24 MiB.
MIN_TOP_PAD_BYTES = 32 << 20
_MAX_C_INT = 2**31 - 1
_MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest on 64-bit hosts
_top_pad_set_here = 0


def keep_freed_host_memory(top_pad_bytes: int = 64 << 20) -> bool:
  """Lets glibc's ``malloc`` keep up to ``top_pad_bytes`` of freed memory in every arena.

  Calls, for the whole process, ``mallopt(M_MMAP_THRESHOLD, 32 MiB)`` (blocks below 32 MiB come
  from the arenas, not from ``mmap``; 32 MiB is the largest value glibc accepts on 64-bit
  hosts and the value its dynamic threshold would rise to) and then ``mallopt(M_TOP_PAD,
  top_pad_bytes)`` (when an arena's top is trimmed, up to ``top_pad_bytes`` stay mapped, and an
  arena grows by that much more than it needs).  Both are needed when arenas already exist:
  setting ``M_TOP_PAD`` alone freezes glibc's dynamic mmap threshold at its current value, so an
  existing thread's large blocks are then ``mmap``-ed and unmapped on every call.  Starting the
  process with ``MALLOC_TOP_PAD_=top_pad_bytes`` in the environment works as well (every arena
  is made with the pad).

  Why: under a ``tf.distribute`` strategy on a CPU, the first convolution's per-example op
  (oneDNN's depthwise filter gradient, used for inputs of 1-3 channels) runs on TensorFlow's
  worker threads and takes a scratch buffer of about 64 KiB per example each step; glibc
  returns it each time, so the next step faults in 16 fresh pages per example (measured: 4,097
  minor faults and about twice the op's time at batch 256, none with this setting;
  ``benchmarks/results/distributed.md``).  With it the conv rule uses that op under a strategy
  as well (:func:`host_keeps_freed_memory`); without it, it unfolds patches, which costs about
  0.3x of a non-private CNN step more.  Speed only: both paths give the same per-example
  gradients.

  The cost: up to ``top_pad_bytes`` of freed memory per ``malloc`` arena stays with the process
  (glibc makes at most 8 arenas per core); nothing is allocated in advance.

  Args:
    top_pad_bytes: the pad in bytes, an integer in [32 MiB, 2**31 - 1] (``MIN_TOP_PAD_BYTES``
      to the largest C ``int``); default 64 MiB.

  Returns:
    True where the C library is glibc and took both settings; False elsewhere (the conv rule
    then keeps unfolding under a strategy).

  Raises:
    ValueError: ``top_pad_bytes`` is not an integer in that range.
  """
  global _top_pad_set_here
  top_pad_bytes = _checks.check_integer("top_pad_bytes", top_pad_bytes,
                                        minimum=MIN_TOP_PAD_BYTES, maximum=_MAX_C_INT)
  mallopt = _glibc_mallopt()
  # -3 and -2 are M_MMAP_THRESHOLD and M_TOP_PAD in <malloc.h>; mallopt returns 1 on success.
  if mallopt is None or mallopt(-3, _MMAP_THRESHOLD_BYTES) != 1:
    return False
  if mallopt(-2, top_pad_bytes) != 1:
    return False
  _top_pad_set_here = top_pad_bytes
  return True


def host_keeps_freed_memory() -> bool:
  """True if this process's glibc ``malloc`` keeps a top pad of at least ``MIN_TOP_PAD_BYTES``:
  set by :func:`keep_freed_host_memory`, or by ``MALLOC_TOP_PAD_`` (decimal bytes) in the
  environment the process started with."""
  if _top_pad_set_here >= MIN_TOP_PAD_BYTES:
    return True
  value = os.environ.get("MALLOC_TOP_PAD_", "").strip()
  return value.isdigit() and int(value) >= MIN_TOP_PAD_BYTES and _glibc_mallopt() is not None


def _glibc_mallopt():
  """glibc's ``mallopt`` (ctypes), or None where the C library is not glibc."""
  import ctypes  # pylint: disable=g-import-not-at-top
  import platform  # pylint: disable=g-import-not-at-top
  if platform.libc_ver()[0] != "glibc":
    return None
  try:
    mallopt = ctypes.CDLL("libc.so.6").mallopt
  except (OSError, AttributeError):
    return None
  mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
  return mallopt
