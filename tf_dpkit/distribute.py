"""DP-SGD under ``tf.distribute``: one step over the global batch, whatever the replicas.

Supported: the default strategy, ``OneDeviceStrategy``, ``MirroredStrategy`` (several devices
of one host) and ``MultiWorkerMirroredStrategy`` (several hosts).  Every other strategy
(``ParameterServerStrategy``, ``CentralStorageStrategy``, ``TPUStrategy``, ...) is refused when
the first private gradient is computed, with an error naming it.

Semantics, identical in distribution to single-device DP-SGD over the global batch:

* each replica clips every example (microbatch) of its local batch once and sums: ``S_r``;
* each replica adds a noise term ``Z_r`` (the replicas' noise seeds differ by their replica id
  folded into the key) and divides by the *global* normaliser ``n``: the expected global batch
  size ``qN`` (``expected_batch_size``), else the number of microbatches of the global batch
  (summed across replicas).  ``Z_r`` is, by :func:`noise_part`:
  - replicas of one process (``MirroredStrategy``): ``N(0, sigma^2 C^2)`` on replica r's slice
    of every variable (slice r of R consecutive slices of the flattened variable) and 0
    elsewhere, so each replica draws 1/R of the normals;
  - several workers (``MultiWorkerMirroredStrategy``): ``N(0, sigma^2 C^2 / R I)`` on every
    element (a share);
* the optimizer's update then sums the replicas' gradients (Keras all-reduces with SUM), giving
  ``(sum_r S_r + sum_r Z_r) / n`` with ``sum_r Z_r ~ N(0, sigma^2 C^2 I)`` either way (slices:
  every element gets exactly one full draw; shares: R independent draws of variance 1/R each):
  exactly one Gaussian release of the global clipped sum per step, and every replica applies
  that same update.

Why per-replica terms instead of one draw: a single draw would have to be made on one replica
and broadcast (an extra collective per step, or equal keys on every replica, which would make
replica r's term known to all); the terms need no communication beyond the gradient all-reduce
Keras does anyway, and their sum has exactly the accounted distribution.  Why slices within a
process and shares across workers: a slice leaves the replica's partial sum ``S_r`` without
noise outside its slice, which is harmless where all partial sums live in one process's memory
(as the clipped per-example gradients do), while the all-reduce across workers sends partial
sums over the network, where a share keeps each worker's contribution noised (variance
``sigma^2 C^2 / R``) against the other workers.  Only the total is released.

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
every step.  Started with ``MALLOC_TOP_PAD_`` (e.g. ``MALLOC_TOP_PAD_=67108864``), every arena
keeps a pad of freed memory instead; :func:`host_keeps_freed_memory` says so, and the conv rule
then uses its faster first-layer op under a strategy too.
"""
from __future__ import annotations

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


def host_keeps_freed_memory() -> bool:
  """True if this process runs on glibc and was started with ``MALLOC_TOP_PAD_`` of at least
  ``MIN_TOP_PAD_BYTES`` (32 MiB): every ``malloc`` arena then keeps that many bytes of freed
  memory at its top instead of returning them to the operating system.  Only decimal digits are
  read; any other spelling reads as False, the conservative answer (only speed depends on it).

  Why it matters: under a ``tf.distribute`` strategy on a CPU, the first convolution's
  per-example op (oneDNN's depthwise filter gradient, used for inputs of 1-3 channels) runs on
  TensorFlow's worker threads and takes a scratch buffer of about 64 KiB per example each step;
  glibc maps and unmaps it every step, so each step faults in 16 fresh pages per example
  (measured at batch 256: 4,097 minor faults and about twice the op's time; none with
  ``MALLOC_TOP_PAD_=67108864``; ``benchmarks/results/distributed.md``).  So under a strategy the
  conv rule uses that op only when this returns True, else it unfolds patches (about 0.3x of a
  non-private CNN step slower); both give the same per-example gradients.

  Only the environment at start-up counts: the same setting made later with ``mallopt`` (after
  TensorFlow has started its threads) was measured not to stop the faults, so tf_dpkit offers no
  run-time switch.  The cost of the setting: up to the pad of freed memory per arena stays with
  the process (glibc makes at most 8 arenas per core); nothing is allocated in advance.
  """
  value = os.environ.get("MALLOC_TOP_PAD_", "")
  if not (value.isdigit() and int(value) >= MIN_TOP_PAD_BYTES):
    return False
  return platform.libc_ver()[0] == "glibc"
