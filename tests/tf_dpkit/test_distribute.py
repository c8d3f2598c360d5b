"""DP-SGD under tf.distribute is one DP-SGD step over the global batch (tf_dpkit.distribute).

Each experiment runs in fresh processes (tests/tf_dpkit/distributed_worker.py): logical CPU
devices must be configured before TensorFlow starts, and MultiWorkerMirroredStrategy needs one
process per worker (TF_CONFIG on localhost ports).

Statistical tolerances: the update's noise std is estimated from 2,000 steps x 8 parameters
(16,000 draws; the slow runs, `pytest -m slow`), whose relative standard error is
1/sqrt(2 * 16,000) = 0.56%, so the 5% tolerance is 9 standard errors; the default runs use fewer
steps with tolerances of the same number of standard errors (stated at each test).  The default
run keeps one case of each kind (Mirrored and multi-worker noise, noise-free equality, every
refusal); `pytest -m slow` runs them all.
"""
import json
import os
import resource
import subprocess
import sys

import numpy as np
import pytest

from tf_dpkit.distribute import local_worker_addresses

WORKER = os.path.join(os.path.dirname(__file__), "distributed_worker.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
B, SIGMA = 8, 1.0


def _env():
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
             TF_CPP_MIN_LOG_LEVEL="3")
  env.pop("TF_CONFIG", None)
  return env


def _parse(output):
  for line in output.splitlines():
    if line.startswith("RESULT "):
      return json.loads(line[len("RESULT "):])
    if line.startswith("ERROR "):
      return line[len("ERROR "):]
  raise AssertionError(f"no result in the worker's output:\n{output[-3000:]}")


def _run(**args):
  base = dict(strategy="default", replicas=1, mode="loop", sigma=SIGMA, seed=5, batch=B,
              steps=2000, loss="zero")
  base.update(args)
  proc = subprocess.run([sys.executable, WORKER, json.dumps(base)], capture_output=True,
                        text=True, timeout=600, env=_env(), cwd=ROOT)
  return _parse(proc.stdout + proc.stderr)


def _run_workers(workers=2, **args):
  ports = [int(a.split(':')[1]) for a in local_worker_addresses(workers)]
  base = dict(strategy="multiworker", ports=ports, mode="loop", sigma=SIGMA, seed=5, batch=B,
              steps=2000, loss="zero")
  base.update(args)
  procs = [subprocess.Popen([sys.executable, WORKER, json.dumps(dict(base, index=i))],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(), cwd=ROOT) for i in range(workers)]
  outputs = [p.communicate(timeout=600)[0] for p in procs]
  return [_parse(out) for out in outputs]


def _run_under(strategy, **args):
  """The results of every process: 2 workers, or one process with 2 Mirrored replicas."""
  if strategy == "multiworker":
    return _run_workers(2, **args)
  return [_run(strategy="mirrored", replicas=2, **args)]


def _noise_ratio(updates):
  """Std of the updates over the intended sigma C / B (lr 1, clip 1)."""
  return float(np.std(np.array(updates))) / (SIGMA / B)


_SLOW = pytest.mark.slow


@pytest.mark.parametrize("replicas, mode, steps, tolerance", [
    # 1,000 steps: 8,000 draws, standard error 0.79%, tolerance 7% = 9 of them.
    (2, "fit", 1000, 0.07), pytest.param(4, "loop", 1000, 0.07, marks=_SLOW),
    pytest.param(2, "fit", 2000, 0.05, marks=_SLOW),
    pytest.param(4, "loop", 2000, 0.05, marks=_SLOW),
    pytest.param(2, "loop", 2000, 0.05, marks=_SLOW),
    pytest.param(4, "fit", 2000, 0.05, marks=_SLOW),
    pytest.param(2, "private_gradients", 2000, 0.05, marks=_SLOW)])
def test_mirrored_noise_is_one_gaussian_over_the_global_batch(replicas, mode, steps, tolerance):
  updates = _run(strategy="mirrored", replicas=replicas, mode=mode, steps=steps)
  assert not isinstance(updates, str), updates
  assert len(updates) == steps
  assert _noise_ratio(updates) == pytest.approx(1.0, abs=tolerance)
  assert abs(float(np.mean(updates))) < 5 * SIGMA / B / np.sqrt(8 * steps)


@pytest.mark.parametrize("mode, steps, tolerance", [
    ("fit", 400, 0.1),  # 3,200 draws: standard error 1.25%, tolerance 8 of them
    pytest.param("loop", 2000, 0.05, marks=_SLOW),
    pytest.param("fit", 2000, 0.05, marks=_SLOW)])
def test_multiworker_noise_is_one_gaussian_over_the_global_batch(mode, steps, tolerance):
  # Keras 3.15's own fit fails under several workers for any model; DP models work around it
  # (tf_dpkit.clipping._keras_internals), so fit is tested here as well as a custom loop.
  results = _run_workers(2, mode=mode, steps=steps)
  for updates in results:
    assert not isinstance(updates, str), updates
    assert len(updates) == steps
    assert _noise_ratio(updates) == pytest.approx(1.0, abs=tolerance)
  np.testing.assert_allclose(results[0], results[1], atol=1e-7)  # every worker, same update


@_SLOW
def test_mirrored_replicas_noise_disjoint_slices_that_sum_to_the_step_noise():
  # Under MirroredStrategy replica r draws N(0, sigma^2 C^2) on slice r of each variable and
  # nothing elsewhere (tf_dpkit.distribute): kernel [3, 2] -> elements 0-2 | 3-5, bias [2] ->
  # element 6 | 7 of the flattened parameters.  Loss 0, so a term is its noise / B.
  # 1,000 steps: each replica's slice holds 4,000 draws (std's standard error 1.1%, tolerance 7%);
  # correlations across replicas have standard error 0.032 (|r| < 0.15 is 4.7 of them).
  shares = np.array(_run(strategy="mirrored", replicas=2, mode="shares", steps=1000))
  assert shares.shape == (1000, 2, 8)  # [steps, replicas, parameters]
  slices = {0: [0, 1, 2, 6], 1: [3, 4, 5, 7]}
  for r, own in slices.items():
    other = [p for p in range(8) if p not in own]
    assert np.all(shares[:, r, other] == 0)
    assert np.all(shares[:, r, own] != 0)
    assert float(np.std(shares[:, r, own])) * B == pytest.approx(1.0, abs=0.07)
  for p, q in zip(slices[0], slices[1]):
    assert abs(np.corrcoef(shares[:, 0, p], shares[:, 1, q])[0, 1]) < 0.15
  assert float(np.std(shares.sum(axis=1))) * B == pytest.approx(1.0, abs=0.07)


@pytest.mark.parametrize("replicas, mode, microbatches", [
    (2, "fit", None), pytest.param(4, "loop", 4, marks=_SLOW),
    pytest.param(2, "loop", None, marks=_SLOW),
    pytest.param(2, "fit", 8, marks=_SLOW)])
def test_without_noise_the_update_is_the_single_device_update(replicas, mode, microbatches):
  args = dict(sigma=0.0, loss="mse", steps=20, mode=mode, num_microbatches=microbatches)
  single = np.array(_run(**args))
  distributed = np.array(_run(strategy="mirrored", replicas=replicas, **args))
  assert np.abs(single).max() > 1e-3  # a real update
  np.testing.assert_allclose(distributed, single, atol=1e-5)


@pytest.mark.parametrize("replicas, steps, tolerance", [
    pytest.param(2, 1000, 0.07, marks=_SLOW)])  # 8,000 draws: standard error 0.79%
def test_augmentation_noise_is_one_gaussian_over_the_global_examples(replicas, steps, tolerance):
  # K = 4 copies of each example: the noise is still sigma C / B with B the global EXAMPLES.
  updates = _run(strategy="mirrored", replicas=replicas, mode="fit", steps=steps,
                 augmentation=4)
  assert not isinstance(updates, str), updates
  assert _noise_ratio(updates) == pytest.approx(1.0, abs=tolerance)


@pytest.mark.parametrize("replicas", [2, pytest.param(4, marks=_SLOW)])
def test_augmentation_without_noise_under_replicas_is_the_single_device_update(replicas):
  # K identical copies: each example's mean gradient is its gradient, so K = 4 under R replicas
  # must give the single-device update without augmentation (clipped once, summed over the
  # replicas, divided by the global batch of examples, not of rows).
  args = dict(sigma=0.0, loss="mse", steps=20, mode="fit")
  single = np.array(_run(**args))
  distributed = np.array(_run(strategy="mirrored", replicas=replicas, augmentation=4, **args))
  assert np.abs(single).max() > 1e-3  # a real update
  np.testing.assert_allclose(distributed, single, atol=1e-5)


def test_num_microbatches_counts_the_global_batch_and_must_split_over_replicas():
  error = _run(strategy="mirrored", replicas=4, steps=2, num_microbatches=2)
  assert isinstance(error, str) and error.startswith("ValueError")
  assert ("num_microbatches=2 counts the microbatches of the global batch and must be a "
          "multiple of the 4 replicas") in error


def test_unsupported_strategies_are_refused_by_name():
  error = _run(strategy="central_storage", replicas=2, steps=2)
  assert isinstance(error, str) and error.startswith("NotImplementedError")
  assert ("DPGradientDescentGaussianOptimizer runs under CentralStorageStrategy, which DP-SGD "
          "does not support" in error
          and "Supported: no strategy, OneDeviceStrategy, MirroredStrategy and "
              "MultiWorkerMirroredStrategy." in error)


@pytest.mark.parametrize("mode", [pytest.param("loop", marks=_SLOW),
                                  pytest.param("fit", marks=_SLOW)])
def test_one_device_strategy_gives_the_same_noisy_updates_as_no_strategy(mode):
  # One replica: the noise seed is unchanged by tf_dpkit.distribute, so a fixed seed gives the
  # very same run.
  single = np.array(_run(mode=mode, loss="mse", steps=10))
  one_device = np.array(_run(strategy="one_device", mode=mode, loss="mse", steps=10))
  assert np.abs(single).max() > 1e-2
  np.testing.assert_array_equal(one_device, single)


@pytest.mark.parametrize("mode", [pytest.param("fit", marks=_SLOW),
                                  pytest.param("loop", marks=_SLOW)])
def test_multiworker_without_noise_is_the_single_device_update(mode):
  args = dict(sigma=0.0, loss="mse", steps=10, mode=mode)
  single = np.array(_run(**args))
  for distributed in _run_workers(2, **args):
    assert not isinstance(distributed, str), distributed
    np.testing.assert_allclose(np.array(distributed), single, atol=1e-5)


def test_plain_poisson_batches_under_several_replicas_are_refused_clearly():
  # tf.distribute cannot split batches of varying size across replicas (it crashed deep in
  # TensorFlow with an AddN shape error): refused before any step, pointing to the sampler
  # that gives each replica its part.
  error = _run(strategy="mirrored", replicas=2, mode="poisson_fit", steps=4)
  assert isinstance(error, str) and error.startswith(
      "ValueError: x: Poisson batches made for 1 replica(s), but the model trains under "
      "MirroredStrategy with 2 replicas. Under a strategy pass "
      "tf_dpkit.data.distributed_poisson_batches(strategy, ...)")


def _single_device_poisson_indices(n, steps, seed):
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_dpkit.data import poisson_batches  # pylint: disable=g-import-not-at-top
  batches = poisson_batches((np.arange(n),), expected_batch_size=B, steps=steps, seed=seed)
  return [sorted(int(i) for i, w in zip(idx.numpy(), weight.numpy()) if w > 0)
          for idx, weight in batches if isinstance(idx, tf.Tensor)]


@pytest.mark.parametrize("replicas", [2, pytest.param(4, marks=_SLOW)])
def test_distributed_poisson_parts_make_up_the_single_device_batch(replicas):
  # Replica r gets the examples i = r mod R of the Poisson batch; with one seed the union is
  # exactly poisson_batches' batch (so the sampling, and its accounting, is unchanged).
  n, steps = 40, 30
  parts = _run(strategy="mirrored", replicas=replicas, mode="poisson_parts", n=n, steps=steps,
               seed=3)
  assert not isinstance(parts, str), parts
  expected = _single_device_poisson_indices(n, steps, 3)
  assert sum(map(len, expected)) > 100  # real batches
  for step_parts, batch in zip(parts, expected):
    assert len(step_parts) == replicas
    for r, part in enumerate(step_parts):
      assert all(i % replicas == r for i in part)
    assert sorted(i for part in step_parts for i in part) == batch


def test_distributed_poisson_fit_without_noise_is_the_single_device_update():
  args = dict(mode="poisson_fit", sigma=0.0, loss="mse", steps=10)
  single = _run(**args)
  distributed = _run(strategy="mirrored", replicas=2, distributed=True, **args)
  assert not isinstance(distributed, str), distributed
  assert np.abs(np.array(single["updates"])).max() > 1e-3
  np.testing.assert_allclose(distributed["updates"], single["updates"], atol=1e-5)
  assert distributed["ledger_steps"] == single["ledger_steps"] == 10
  # Both fits trained the pipeline's first pass: Keras's build under a strategy draws no batch.
  assert distributed["passes"] == single["passes"] == 1


@pytest.mark.parametrize("strategy, steps, tolerance", [
    pytest.param("mirrored", 2000, 0.05, marks=_SLOW),
    pytest.param("multiworker", 1000, 0.07, marks=_SLOW)])
def test_distributed_poisson_noise_is_one_gaussian_over_the_expected_batch(strategy, steps,
                                                                         tolerance):
  # Loss identically zero: the update is the noise, std sigma C / (qN) = sigma / B.
  from analysis import rdp_accountant  # pylint: disable=g-import-not-at-top
  args = dict(mode="poisson_fit", distributed=True, steps=steps)
  results = _run_under(strategy, **args)
  for result in results:
    assert not isinstance(result, str), result
    assert _noise_ratio(result["updates"]) == pytest.approx(1.0, abs=tolerance)
    assert result["ledger_steps"] == steps
    # The epsilon of `steps` Poisson steps at q = B / N, as on one device.
    q = B / (B * steps)
    rdp = rdp_accountant.compute_rdp(q, SIGMA, steps, rdp_accountant.DEFAULT_ORDERS)
    assert result["epsilon"] <= rdp_accountant.get_privacy_spent(
        rdp_accountant.DEFAULT_ORDERS, rdp, target_delta=1e-5)[0] + 1e-9


@_SLOW
def test_sharded_poisson_on_two_workers_samples_each_shard_independently_at_rate_q():
  # Worker w holds examples w, w + 2, ... and samples them with its own stream: every part
  # lies in its worker's shard, every example's inclusion rate is q, and the two workers'
  # batch sizes are uncorrelated.  400 steps, q = 0.2: an example's count has mean 80, sd 8;
  # 6 sd per example (40 examples), the pooled rate 0.2 +- 0.0032 (5 sd); |r| < 0.2 is 4 sd.
  n, steps = 40, 400
  results = _run_workers(2, mode="poisson_parts", n=n, steps=steps, sharded=True)
  counts = np.zeros(n)
  sizes = []
  for worker, parts in enumerate(results):
    assert not isinstance(parts, str), parts
    assert len(parts) == steps
    sizes.append([len(step[0]) for step in parts])
    for step in parts:
      assert all(i % 2 == worker for i in step[0])
      counts[step[0]] += 1
  q = B / n
  assert np.all(np.abs(counts - steps * q) < 6 * np.sqrt(steps * q * (1 - q)))
  assert counts.sum() / (n * steps) == pytest.approx(q, abs=5 * np.sqrt(q * (1 - q) / (n * steps)))
  assert abs(np.corrcoef(sizes[0], sizes[1])[0, 1]) < 0.2


@_SLOW
def test_distributed_poisson_on_two_workers_without_noise_is_the_single_device_update():
  args = dict(mode="poisson_fit", sigma=0.0, loss="mse", steps=10)
  single = _run(**args)
  for result in _run_workers(2, distributed=True, **args):
    assert not isinstance(result, str), result
    np.testing.assert_allclose(result["updates"], single["updates"], atol=1e-5)


def test_distributed_poisson_batches_checks_its_arguments():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_dpkit.data import distributed_poisson_batches  # pylint: disable=g-import-not-at-top
  strategy = tf.distribute.get_strategy()
  x = np.zeros((10, 2), np.float32)
  with pytest.raises(ValueError, match=r"num_examples must be an integer in \[10, inf\]"):
    distributed_poisson_batches(strategy, (x,), expected_batch_size=2, steps=3, num_examples=9)
  with pytest.raises(ValueError, match=r"Give exactly one of sampling_probability"):
    distributed_poisson_batches(strategy, (x,), steps=3)
  with pytest.raises(ValueError, match=r"expected_batch_size must be in \(0, num_examples\]"):
    distributed_poisson_batches(strategy, (x,), expected_batch_size=11, steps=3)
  central = tf.distribute.experimental.CentralStorageStrategy()
  with pytest.raises(NotImplementedError, match="distributed_poisson_batches runs under "
                     "CentralStorageStrategy, which DP-SGD does not support"):
    distributed_poisson_batches(central, (x,), expected_batch_size=2, steps=3)
  # One replica, no strategy: the same batches as poisson_batches.
  ours = [e[0].numpy().tolist() for e in distributed_poisson_batches(
      strategy, (np.arange(10),), expected_batch_size=3, steps=4, seed=7)]
  from tf_dpkit.data import poisson_batches  # pylint: disable=g-import-not-at-top
  plain = [e[0].numpy().tolist() for e in poisson_batches(
      (np.arange(10),), expected_batch_size=3, steps=4, seed=7)]
  assert ours == plain


@pytest.mark.parametrize("strategy", ["mirrored", pytest.param("multiworker", marks=_SLOW)])
def test_privacy_budget_counts_global_steps_once(strategy):
  from dp_references import exact_gaussian_epsilon  # pylint: disable=g-import-not-at-top
  args = dict(mode="budget_fit", steps=10, loss="mse")
  for result in _run_under(strategy, **args):  # every worker logs the same epsilon, of the global steps
    assert not isinstance(result, str), result
    assert result["iterations"] == result["ledger_steps"] == 10
    assert result["epsilon"] == pytest.approx(
        [exact_gaussian_epsilon(SIGMA, e, 1e-5) for e in (1, 2)], rel=1e-9)


def test_budget_stops_every_worker_at_the_same_step_and_only_the_chief_prints():
  # Target: just above epsilon after 7 Poisson steps (q = 1/20, sigma 1), from the accountant
  # of analysis directly; both workers must stop after exactly 7 global steps.
  from analysis import rdp_accountant  # pylint: disable=g-import-not-at-top
  steps = 20
  orders = rdp_accountant.DEFAULT_ORDERS

  def epsilon(k):
    rdp = rdp_accountant.compute_rdp(1 / steps, SIGMA, k, orders)
    return rdp_accountant.get_privacy_spent(orders, rdp, target_delta=1e-5)[0]
  target = 0.5 * (epsilon(7) + epsilon(8))
  results = _run_workers(2, mode="budget_stop", steps=steps, target_epsilon=target, loss="mse")
  for worker, result in enumerate(results):
    assert not isinstance(result, str), result
    assert result["iterations"] == result["stopped_at"] == 7
    assert ("PrivacyBudget: stopping early, after 7 steps" in result["printed"]) == (worker == 0)


@pytest.mark.parametrize("strategy", ["mirrored", pytest.param("multiworker", marks=_SLOW)])
def test_backup_and_restore_resumes_the_ledger_under_a_strategy(strategy):
  # Preempted after 2 of 4 epochs, a fresh model resumes from BackupAndRestore at epoch 3 and
  # logs the epsilon of 3 and 4 epochs (shuffled batches: the Gaussian once per epoch).
  from dp_references import exact_gaussian_epsilon  # pylint: disable=g-import-not-at-top
  args = dict(mode="backup", steps=16, loss="mse")
  results = _run_under(strategy, **args)
  for result in results:
    assert not isinstance(result, str), result
    assert result["epochs"] == [2, 3]
    assert result["iterations"] == 16
    assert result["epsilon"] == pytest.approx(
        [exact_gaussian_epsilon(SIGMA, e, 1e-5) for e in (3, 4)], rel=1e-9)


@pytest.mark.parametrize("strategy", ["mirrored", pytest.param("multiworker", marks=_SLOW)])
def test_noise_key_reaches_no_file_under_a_strategy(strategy):
  # A fixed (so searchable) key under MirroredStrategy x2 or 2 workers: no .keras, weights or
  # checkpoint byte holds it; the control file written with it is found, so the search works.
  seed = 3141592653589793
  args = dict(mode="secrets", seed=seed, steps=2, loss="mse")
  results = _run_under(strategy, **args)
  for found in results:
    assert found == ["control.bin"], found


@pytest.mark.parametrize("strategy", ["mirrored", pytest.param("multiworker", marks=_SLOW)])
def test_ledger_resumes_through_a_keras_file_under_a_strategy(strategy):
  from dp_references import exact_gaussian_epsilon  # pylint: disable=g-import-not-at-top
  args = dict(mode="resume", steps=10, loss="mse")
  results = _run_under(strategy, **args)
  for result in results:
    assert not isinstance(result, str), result
    assert result["iterations"] == 10
    # The fresh callback continues: 2 epochs in all, not 1.
    assert result["epsilon"] == pytest.approx([exact_gaussian_epsilon(SIGMA, 2, 1e-5)],
                                              rel=1e-9)


# What the glibc top pad does, checked on glibc itself: a 16 MiB malloc/touch/free cycle
# repeated on a thread.  Without the pad glibc faults the block's 4,096 pages in again on the
# second pass (measured [4097, 4096, 0, 0]); with a 64 MiB pad, never after the first
# ([4096, 0, 0, 0]).  The pad comes from distribute.keep_freed_host_memory() called before
# TensorFlow starts, or from MALLOC_TOP_PAD_ at start-up; `import tf_dpkit` alone leaves malloc
# as it was; host_keeps_freed_memory() must say which processes have it.
_MALLOC_PROBE = r"""
import ctypes, json, os, resource, sys, threading
if os.environ.get("PROBE_START_TENSORFLOW_FIRST"):
  import tensorflow as tf
  tf.constant(1.0) + 1.0  # the eager context and its threads exist before tf_dpkit is imported
import tf_dpkit
from tf_dpkit import distribute
if os.environ.get("PROBE_KEEP_FREED_MEMORY"):
  distribute.keep_freed_host_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
faults = []
def cycle():
  for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    block = libc.malloc(16 << 20)
    ctypes.memset(block, 1, 16 << 20)
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
thread = threading.Thread(target=cycle)
thread.start()
thread.join()
print("RESULT " + json.dumps(dict(keeps=distribute.host_keeps_freed_memory(),
                                  set_here=distribute._pad_set, faults=faults)))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_the_pad_stops_glibc_returning_a_freed_block_and_importing_tf_dpkit_sets_none():
  from tf_dpkit import distribute  # pylint: disable=g-import-not-at-top
  env = _env()
  for name in distribute.USER_MALLOC_VARIABLES + (distribute.OPT_OUT_VARIABLE,):
    env.pop(name, None)
  called = dict(env, PROBE_KEEP_FREED_MEMORY="1")
  envs = {"called": called, "imported": env,
          "opted_out": dict(called, TF_DPKIT_KEEP_FREED_MEMORY="0"),
          "too_late": dict(called, PROBE_START_TENSORFLOW_FIRST="1"),
          "environment": dict(env, MALLOC_TOP_PAD_=str(64 << 20))}
  procs = {name: subprocess.Popen([sys.executable, "-c", _MALLOC_PROBE], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, env=run_env, cwd=ROOT)
           for name, run_env in envs.items()}
  results = {name: _parse(proc.communicate(timeout=300)[0]) for name, proc in procs.items()}
  pages = (16 << 20) // resource.getpagesize()
  for name, kept in [("called", True), ("imported", False), ("opted_out", False),
                     ("too_late", False), ("environment", True)]:
    assert results[name]["keeps"] is kept, name
    if kept:
      assert max(results[name]["faults"][1:]) <= 0.01 * pages, name  # never faulted in again
    else:
      assert results[name]["faults"][1] >= 0.9 * pages, name  # the block is faulted in again
  assert results["called"]["set_here"] is True
  assert results["imported"]["set_here"] is False  # the import changed nothing
  assert results["environment"]["set_here"] is False  # the user's setting stands


@pytest.mark.parametrize("setting", ["opt_out", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_",
                                     "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES", "started",
                                     "musl"])
def test_the_pad_is_not_set_where_it_should_not_be(setting, monkeypatch):
  from tf_dpkit import distribute
  monkeypatch.setattr(distribute, "_pad_set", False)
  for name in distribute.USER_MALLOC_VARIABLES + (distribute.OPT_OUT_VARIABLE,):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setattr(distribute, "_tensorflow_started", lambda: setting == "started")
  if setting == "opt_out":
    monkeypatch.setenv(distribute.OPT_OUT_VARIABLE, "0")
  elif setting == "musl":
    monkeypatch.setattr(distribute.platform, "libc_ver", lambda: ("", ""))
  elif setting.startswith(("MALLOC", "GLIBC")):
    monkeypatch.setenv(setting, "1")
  assert distribute.keep_freed_host_memory() is False
  assert distribute._pad_set is False  # pylint: disable=protected-access
  assert distribute.host_keeps_freed_memory() is False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_the_pad_is_set_once_and_then_recognised(monkeypatch):
  from tf_dpkit import distribute
  monkeypatch.setattr(distribute, "_pad_set", False)
  for name in distribute.USER_MALLOC_VARIABLES + (distribute.OPT_OUT_VARIABLE,):
    monkeypatch.delenv(name, raising=False)
  monkeypatch.setattr(distribute, "_tensorflow_started", lambda: False)
  assert distribute.host_keeps_freed_memory() is False
  assert distribute.keep_freed_host_memory() is True  # mallopt(M_TOP_PAD, 64 MiB)
  assert distribute.host_keeps_freed_memory() is True
  monkeypatch.setattr(distribute, "_tensorflow_started", lambda: True)
  assert distribute.keep_freed_host_memory() is True  # already set: stays set
  assert distribute.keep_freed_host_memory_at_import is distribute.keep_freed_host_memory


def test_tensorflow_started_is_true_in_a_process_that_ran_an_op():
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  from tf_dpkit import distribute
  tf.constant(1.0) + 1.0
  assert distribute._tensorflow_started() is True  # pylint: disable=protected-access


@pytest.mark.parametrize("value, keeps", [("", False), ("33554432", True), ("67108864", True),
                                          (" 67108864 ", False), ("33554431", False),
                                          ("64M", False), ("-1", False), ("0x4000000", False)])
def test_host_keeps_freed_memory_reads_malloc_top_pad_from_the_environment(value, keeps,
                                                                           monkeypatch):
  from tf_dpkit import distribute
  monkeypatch.setattr(distribute, "_pad_set", False)  # only the environment counts
  monkeypatch.setenv("MALLOC_TOP_PAD_", value)
  assert distribute.host_keeps_freed_memory() is (keeps and sys.platform.startswith("linux"))
