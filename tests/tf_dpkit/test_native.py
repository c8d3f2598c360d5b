"""The compiled kernels (tf_dpkit.native) against independent references.

References: TensorFlow's own Philox uniforms (``StatelessRandomUniformV2`` for the same key and
counter) put through the Box-Muller transform in float64 numpy, and tf_dpkit's TensorFlow-op
sampler (noise); brute-force token sums (Embedding); TensorFlow's own float64 convolution
gradient of each example (convolution); the max-pooling kernel's own tests are in
test_pooling.py.  Plus the fallbacks: switched off, no compiler, a
library that fails its self-check, XLA, accelerators and dtypes the kernels do not take; and the
kernel cache's refusals (a folder of another user or writable by others, a library that does
not match its recorded digest, symbolic links), checked on copies of this session's build.
"""
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import types

import numpy as np
import pytest
import tensorflow as tf

from tf_dpkit import native, noise

LOADED = {family: native.kernels(family) for family in native.FAMILIES}
# Every family's ops in one namespace (None unless all of them loaded).
KERNELS = (None if None in LOADED.values() else types.SimpleNamespace(**{
    name: getattr(ops, name) for ops in LOADED.values() for name in dir(ops)
    if name.startswith("dpkit_")}))
needs_kernels = pytest.mark.skipif(
    KERNELS is None, reason=f"compiled kernels unavailable here: {native.status()}")

# Output sizes around Philox blocks (4 uniforms), the kernel's chunks (1,024 pairs) and the
# point where the work is split between threads.
SIZES = [1, 2, 3, 4, 5, 8, 9, 2047, 2048, 2049, 2050, 4097, 100_001, 1_000_000]


def numpy_box_muller(key, counter, size):
  """float64 normals from TensorFlow's own uniforms for (key, counter): the reference."""
  half = (size + 1) // 2
  u = tf.raw_ops.StatelessRandomUniformV2(
      shape=tf.constant([2 * half], tf.int64), key=key, counter=counter,
      alg=tf.constant(1, tf.int32), dtype=tf.float32).numpy().astype(np.float64)
  radius = np.sqrt(-2.0 * np.log1p(-u[:half]))
  angle = 2.0 * np.pi * u[half:]
  return np.concatenate([radius * np.cos(angle), radius * np.sin(angle)])[:size]


def key_counter(seed):
  return tf.raw_ops.StatelessRandomGetKeyCounter(seed=tf.constant(seed, tf.int64))


@needs_kernels
@pytest.mark.parametrize("size", SIZES)
def test_normals_are_box_muller_of_tensorflows_philox_uniforms(size):
  key, counter = key_counter([size, 17])
  got = KERNELS.dpkit_stateless_normal(tf.constant([size], tf.int64), key, counter).numpy()
  # float32 uniforms are exact in float64; the rest is a few float32 ulps of values <= 5.65.
  np.testing.assert_allclose(got, numpy_box_muller(key, counter, size), rtol=0, atol=3e-6)


@needs_kernels
def test_the_128_bit_counter_carries_like_tensorflows():
  # Low word 3 blocks below 2**64: blocks 3.. of the draw carry into the high word.
  key = tf.constant([0x0123456789ABCDEF], tf.uint64)
  counter = tf.constant([2**64 - 3, 2**64 - 1], tf.uint64)  # the high word wraps too
  got = KERNELS.dpkit_stateless_normal(tf.constant([64], tf.int64), key, counter).numpy()
  np.testing.assert_allclose(got, numpy_box_muller(key, counter, 64), rtol=0, atol=3e-6)


@needs_kernels
@pytest.mark.parametrize("shape", [[0], [3, 0], [5, 3], [2, 3, 4], [7, 1, 9]])
def test_samplers_agree_on_shapes_and_seeds(shape):
  for seed in ([0, 0], [-1, 2**62], [2**40, -3]):
    seed = tf.constant(seed, tf.int64)
    compiled = noise.stateless_standard_normal(tf.TensorShape(shape), seed)
    reference = noise.tf_ops_standard_normal(tf.TensorShape(shape), seed)
    assert compiled.shape == shape
    np.testing.assert_allclose(compiled.numpy(), reference.numpy(), rtol=0, atol=1e-5)


@needs_kernels
def test_fused_add_is_x_plus_stddev_times_the_normals_and_leaves_x_alone():
  x = tf.random.stateless_normal([3, 1001], seed=[1, 2])
  keep = x.numpy().copy()
  key, counter = key_counter([5, 6])
  got = KERNELS.dpkit_add_stateless_normal(x, tf.constant(2.5), key, counter).numpy()
  z = numpy_box_muller(key, counter, x.shape.num_elements()).reshape(x.shape)
  np.testing.assert_allclose(got, keep + 2.5 * z, rtol=0, atol=2e-5)
  np.testing.assert_array_equal(x.numpy(), keep)  # x was still in use: not overwritten
  zero = KERNELS.dpkit_add_stateless_normal(x, tf.constant(0.0), key, counter)
  np.testing.assert_array_equal(zero.numpy(), keep)


@needs_kernels
def test_add_gaussian_noise_uses_the_fused_kernel_with_the_samplers_noise():
  grads = [tf.zeros([300, 7]), tf.ones([11])]
  noised = noise.add_gaussian_noise(grads, 1.5, key=99, step=4, draw=1)
  with tf.device("/CPU:0"):
    # The same seeds through the unfused TensorFlow-op path (noise.py's keying, written out).
    base = tf.random.experimental.stateless_fold_in(
        tf.constant([99, 4], tf.int64), tf.constant(1, tf.int64))
    for index, (grad, got) in enumerate(zip(grads, noised)):
      seed = tf.random.experimental.stateless_fold_in(base, tf.constant(index, tf.int64))
      expected = grad + 1.5 * noise.tf_ops_standard_normal(grad.shape, seed)
      np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0, atol=2e-5)


@needs_kernels
@pytest.mark.parametrize("call, message", [
    (lambda: KERNELS.dpkit_stateless_normal(tf.constant([[2]], tf.int64), *key_counter([1, 1])),
     "shape must be a 1-D"),
    (lambda: KERNELS.dpkit_stateless_normal(tf.constant([2], tf.int64),
                                            tf.constant([1, 2], tf.uint64),
                                            tf.constant([1, 2], tf.uint64)),
     "key must hold 1"),
    (lambda: KERNELS.dpkit_stateless_normal(tf.constant([2], tf.int64),
                                            tf.constant([1], tf.uint64),
                                            tf.constant([1], tf.uint64)),
     "counter must hold 2"),
    (lambda: KERNELS.dpkit_add_stateless_normal(tf.zeros([3]), tf.constant(-1.0),
                                                *key_counter([1, 1])),
     "stddev must be finite and >= 0"),
    (lambda: KERNELS.dpkit_add_stateless_normal(tf.zeros([3]), tf.constant(np.nan, tf.float32),
                                                *key_counter([1, 1])),
     "stddev must be finite and >= 0"),
    (lambda: KERNELS.dpkit_add_stateless_normal(tf.zeros([3]), tf.constant([1.0]),
                                                *key_counter([1, 1])),
     "stddev must be a scalar"),
])
def test_bad_inputs_are_clear_errors(call, message):
  with pytest.raises(tf.errors.InvalidArgumentError, match=message):
    call()


@needs_kernels
def test_inside_xla_and_on_accelerators_and_for_float64_the_tensorflow_ops_draw(monkeypatch):
  seed = tf.constant([3, 9], tf.int64)
  shape = tf.TensorShape([1001])

  @tf.function(jit_compile=True)
  def compiled_by_xla():
    assert native._in_xla_function()
    return noise.stateless_standard_normal(shape, seed)

  @tf.function(jit_compile=True)
  def tf_ops_by_xla():  # XLA picks its own stateless generator, so compare XLA with XLA
    return noise.tf_ops_standard_normal(shape, seed)

  @tf.function
  def plain():
    assert not native._in_xla_function()
    return noise.stateless_standard_normal(shape, seed)

  reference = noise.tf_ops_standard_normal(shape, seed).numpy()
  np.testing.assert_array_equal(compiled_by_xla().numpy(), tf_ops_by_xla().numpy())
  np.testing.assert_allclose(plain().numpy(), reference, rtol=0, atol=1e-5)
  noise_ops = LOADED["noise"]
  assert native.kernels_for("noise", "/job:localhost/replica:0/task:0/device:GPU:0",
                            tf.float32) is None
  assert native.kernels_for("noise", "/device:CPU:0", tf.float64) is None
  assert native.kernels_for("noise", "", tf.float32) is noise_ops  # here: no accelerator
  assert native.kernels_for("conv", "", tf.float32) is LOADED["conv"]
  monkeypatch.setattr(native, "_accelerators_visible", lambda: True)
  assert native.kernels_for("noise", "", tf.float32) is None  # unplaced may land on the GPU
  assert native.kernels_for("noise", "/device:CPU:0", tf.float32) is noise_ops
  assert native.kernels_for("noise", "/device:CPU:0", tf.bfloat16) is noise_ops
  with pytest.raises(ValueError, match="family must be one of"):
    native.kernels_for("dense", "/device:CPU:0", tf.float32)
  # float64 keeps float64 uniforms (reach beyond the float32 bound 5.65).
  wide = noise.stateless_standard_normal(tf.TensorShape([10]), seed, tf.float64, "/CPU:0")
  np.testing.assert_array_equal(
      wide.numpy(), noise.tf_ops_standard_normal(tf.TensorShape([10]), seed, tf.float64).numpy())


@needs_kernels
def test_a_library_that_fails_the_self_check_is_not_used(monkeypatch):
  class Broken:  # right shapes, wrong values: e.g. a miscompiled transcendental
    @staticmethod
    def dpkit_stateless_normal(shape, key, counter):
      return 1.001 * KERNELS.dpkit_stateless_normal(shape, key, counter)

    dpkit_add_stateless_normal = staticmethod(KERNELS.dpkit_add_stateless_normal)
    dpkit_token_squared_norms = staticmethod(KERNELS.dpkit_token_squared_norms)
    dpkit_scatter_scaled_rows = staticmethod(KERNELS.dpkit_scatter_scaled_rows)
    dpkit_conv_kernel_grad_squared_norms = staticmethod(
        KERNELS.dpkit_conv_kernel_grad_squared_norms)

  class DropsConvBias(Broken):  # convolution norms without the bias gradient's part
    dpkit_stateless_normal = staticmethod(KERNELS.dpkit_stateless_normal)

    @staticmethod
    def dpkit_conv_kernel_grad_squared_norms(*args, with_bias=False, **kwargs):
      return KERNELS.dpkit_conv_kernel_grad_squared_norms(*args, with_bias=False, **kwargs)

  class DropsRepeats(Broken):  # norms that square each position instead of each token's sum
    @staticmethod
    def dpkit_stateless_normal(shape, key, counter):
      return KERNELS.dpkit_stateless_normal(shape, key, counter)

    @staticmethod
    def dpkit_token_squared_norms(ids, rows, vocab):
      counted = tf.cast(tf.logical_and(ids >= 0, ids < tf.cast(vocab, tf.int32)), tf.float32)
      return tf.reduce_sum(tf.reduce_sum(tf.square(rows), axis=2) * counted, axis=1)

  class LastMaximum:  # ties to the last maximum of a window (the pooling reference: the first)
    @staticmethod
    def dpkit_max_pool_grad(x, g, ksize, strides, pads):
      flipped = KERNELS.dpkit_max_pool_grad(x[:, ::-1, ::-1], g[:, ::-1, ::-1], ksize=ksize,
                                            strides=strides, pads=pads)
      return flipped[:, ::-1, ::-1]

  class Missing:  # a library without the ops
    pass

  for family, fake, reason in (
      ("noise", Broken, "largest difference"), ("embedding", DropsRepeats, "largest difference"),
      ("conv", DropsConvBias, "largest difference"), ("pool", LastMaximum, "largest difference"),
      ("noise", Missing, "AttributeError"), ("embedding", Missing, "AttributeError"),
      ("conv", Missing, "AttributeError"), ("pool", Missing, "AttributeError")):
    monkeypatch.setattr(tf, "load_op_library", lambda path, fake=fake: fake)
    with pytest.raises(native.NativeUnavailable, match=f"fake failed its self-check.*{reason}"):
      native._load_and_check(family, b"not loaded", "fake")
  for family in native.FAMILIES:
    assert native._SELF_CHECKS[family](LOADED[family]) <= native.SELF_CHECK_TOLERANCE


def test_with_a_compiler_every_family_builds_loads_and_passes_its_self_check():
  # Without this, a kernel that fails its self-check would only make the kernel tests skip.
  if not native.enabled():
    pytest.skip(f"compiled kernels switched off: {native.status()}")
  try:
    native._compiler()
  except native.NativeUnavailable as error:
    pytest.skip(str(error))
  assert None not in LOADED.values(), native.status()


@needs_kernels
def test_the_build_is_cached_per_source_and_machine():
  for family in native.FAMILIES:
    first = native.build(family)
    stamp = first.stat().st_mtime_ns
    assert native.build(family) == first and first.stat().st_mtime_ns == stamp  # no rebuild
    assert first.parent == native.cache_dir()
    assert first.name == native.library_name(family) and family in first.name
    recorded = (first.parent / (first.name + ".sha256")).read_text().split()[0]
    assert recorded == hashlib.sha256(first.read_bytes()).hexdigest()


@needs_kernels
def test_the_library_name_hashes_the_shared_header(tmp_path, monkeypatch):
  # kernels.h is included by every source: another header text is another library.
  header = tmp_path / "kernels.h"
  header.write_bytes(native.HEADERS[0].read_bytes() + b"\n// changed\n")
  before = {family: native.library_name(family) for family in native.FAMILIES}
  monkeypatch.setattr(native, "HEADERS", (header,))
  for family in native.FAMILIES:
    assert native.library_name(family) != before[family]


def run_python(code, **env):
  environment = dict(os.environ, **env)
  done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                        text=True, env=environment, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  return done


FALLBACK_PROBE = """
    import logging, numpy as np, tensorflow as tf
    logging.basicConfig(level=logging.WARNING)
    from tf_dpkit import native, noise
    seed = tf.constant([1, 2], tf.int64)
    got = noise.stateless_standard_normal(tf.TensorShape([9]), seed).numpy()
    ref = noise.tf_ops_standard_normal(tf.TensorShape([9]), seed).numpy()
    print("EQUAL", np.array_equal(got, ref), "OPS", native.kernels("noise") is not None)
    print("STATUS", native.status("noise"))
"""


def test_switched_off_the_tensorflow_ops_draw_the_same_noise():
  out = run_python(FALLBACK_PROBE, TF_DPKIT_NATIVE="0").stdout
  assert "EQUAL True OPS False" in out
  assert "STATUS turned off by TF_DPKIT_NATIVE=0" in out


def test_without_a_compiler_one_warning_and_the_tensorflow_ops(tmp_path):
  done = run_python(FALLBACK_PROBE, CXX=str(tmp_path / "no-such-compiler"),
                    TF_DPKIT_CACHE_DIR=str(tmp_path / "cache"))
  assert "EQUAL True OPS False" in done.stdout
  assert "does not run" in done.stdout  # the status names the reason
  warnings = [line for line in done.stderr.splitlines()
              if "compiled CPU kernels for noise unavailable" in line]
  assert len(warnings) == 1 and "TF_DPKIT_NATIVE=0" in warnings[0]
  assert not any(p.suffix == ".so" for p in (tmp_path / "cache").glob("*"))


def test_a_compile_error_is_reported_with_the_compilers_message(tmp_path, monkeypatch):
  fake = tmp_path / "fake-cxx"
  fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo fake 1.0; exit 0; fi\n"
                  "echo 'noise_kernels.cc:1: error: no luck' >&2; exit 3\n")
  fake.chmod(0o755)
  monkeypatch.setenv("CXX", str(fake))
  monkeypatch.setenv("TF_DPKIT_CACHE_DIR", str(tmp_path / "cache"))
  with pytest.raises(native.NativeUnavailable, match="exit 3.*no luck.*all messages in"):
    native.build("noise")
  left = sorted(p.name for p in (tmp_path / "cache").iterdir())
  name = native.library_name("noise")[:-len(".so")]
  assert left == [name + ".log", name + ".so.lock"]  # no partial library left behind
  assert "no luck" in (tmp_path / "cache" / (name + ".log")).read_text()  # the full log


def brute_force_token_sums(ids, rows, factors, vocab):
  """Microbatch j's gradient G_j[v] = sum of rows[j, k] with ids[j, k] = v, in float64."""
  grads = np.zeros((ids.shape[0], vocab, rows.shape[2]))
  for j in range(ids.shape[0]):
    for k in range(ids.shape[1]):
      if 0 <= ids[j, k] < vocab:
        grads[j, ids[j, k]] += rows[j, k]
  return (grads**2).sum(axis=(1, 2)), np.tensordot(factors, grads, axes=1)


@needs_kernels
@pytest.mark.parametrize("microbatches, positions, vocab, width", [
    (0, 5, 7, 3), (4, 0, 7, 3), (3, 5, 0, 2), (2, 6, 7, 0), (1, 1, 1, 1),
    (5, 64, 3, 4),        # every token repeated many times
    (16, 200, 10_000, 8),  # mostly distinct; more positions than the hash table's first guess
    (300, 9, 40, 17),     # many microbatches: split between threads
])
def test_embedding_kernels_equal_brute_force_token_sums(microbatches, positions, vocab, width):
  rng = np.random.default_rng(microbatches * 1000 + positions)
  ids = rng.integers(-2, vocab + 2, size=(microbatches, positions)).astype(np.int32)
  ids[:, ::3] = np.minimum(ids[:, ::3], 0) if vocab else ids[:, ::3]  # repeats of id 0 and -ve
  rows = rng.normal(size=(microbatches, positions, width)).astype(np.float32)
  factors = rng.uniform(size=microbatches).astype(np.float32)
  norms, clipped = brute_force_token_sums(ids, rows, factors, vocab)
  vocab_t = tf.constant(vocab, tf.int64)
  got_norms = KERNELS.dpkit_token_squared_norms(ids, rows, vocab_t).numpy()
  got_sum = KERNELS.dpkit_scatter_scaled_rows(ids, rows, factors, vocab_t).numpy()
  assert got_norms.shape == (microbatches,) and got_sum.shape == (vocab, width)
  # float32 sums of up to ~1,000 terms of size ~1 (id 0 repeated): relative error ~1e-5.
  np.testing.assert_allclose(got_norms, norms, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(got_sum, clipped, rtol=1e-5, atol=5e-5)


@needs_kernels
@pytest.mark.parametrize("call, message", [
    (lambda: KERNELS.dpkit_token_squared_norms(np.zeros([2, 3, 1], np.int32),
                                               np.zeros([2, 3, 4], np.float32), 5),
     "ids must be \\[microbatches, positions\\]"),
    (lambda: KERNELS.dpkit_token_squared_norms(np.zeros([2, 3], np.int32),
                                               np.zeros([2, 4, 4], np.float32), 5),
     "rows must be \\[microbatches, positions, width\\] matching ids"),
    (lambda: KERNELS.dpkit_token_squared_norms(np.zeros([2, 3], np.int32),
                                               np.zeros([2, 3, 4], np.float32), -1),
     "vocab must be a scalar >= 0"),
    (lambda: KERNELS.dpkit_scatter_scaled_rows(np.zeros([2, 3], np.int32),
                                               np.zeros([2, 3, 4], np.float32),
                                               np.ones([3], np.float32), 5),
     "factors must be \\[microbatches\\] = \\[2\\]"),
])
def test_embedding_kernels_refuse_bad_shapes(call, message):
  with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message):
    call()


def autodiff_conv_norms(x, g, kernel_hw, strides, dilations, padding, groups):
  """float64 reference by another route: each example's kernel and bias gradients from
  TensorFlow's own convolution gradient (<conv(x_b, W) + bias, g_b> differentiated), summed
  per microbatch, then squared."""
  x, g = tf.constant(x, tf.float64), tf.constant(g, tf.float64)
  kernel = tf.zeros([*kernel_hw, x.shape[-1], g.shape[-1]], tf.float64)
  bias = tf.zeros([g.shape[-1]], tf.float64)
  kernels, biases = [], []
  for b in range(x.shape[0]):
    with tf.GradientTape() as tape:
      tape.watch([kernel, bias])
      z = tf.nn.convolution(x[b:b + 1], kernel, strides=strides, padding=padding,
                            dilations=dilations) + bias
      inner = tf.reduce_sum(z * g[b:b + 1])
    k_grad, b_grad = tape.gradient(inner, [kernel, bias])
    kernels.append(k_grad.numpy().ravel())
    biases.append(b_grad.numpy())
  kernels = np.reshape(kernels, (groups, -1, len(kernels[0]))).sum(axis=1)
  biases = np.reshape(biases, (groups, -1, len(biases[0]))).sum(axis=1)
  return (kernels**2).sum(axis=1), biases, kernels.reshape(groups, -1, g.shape[-1])


@needs_kernels
@pytest.mark.parametrize("shape, filters, kernel_hw, strides, dilations, padding, groups", [
    ((3, 28, 28, 1), 16, (8, 8), (2, 2), (1, 1), "SAME", 3),     # the MNIST CNN's first layer
    ((4, 13, 13, 16), 32, (4, 4), (2, 2), (1, 1), "VALID", 4),   # its second
    ((4, 13, 13, 16), 32, (4, 4), (2, 2), (1, 1), "VALID", 1),   # 4 examples in one microbatch
    ((2, 9, 11, 3), 70, (3, 2), (1, 1), (2, 3), "SAME", 2),      # dilated; 32+32+6 filters
    ((2, 6, 7, 3), 70, (3, 2), (1, 1), (2, 3), "VALID", 1),      # dilated, 2 examples
    ((5, 8, 10, 5), 7, (3, 3), (1, 2), (1, 1), "SAME", 5),       # fewer than 8 filters
    ((2, 1, 30, 4), 24, (1, 5), (1, 3), (1, 1), "SAME", 2),      # a Conv1D (height 1)
    ((2, 6, 6, 2), 3, (7, 7), (1, 1), (1, 1), "SAME", 1),        # kernel larger than the image
    ((1, 4, 4, 1), 1, (1, 1), (1, 1), (1, 1), "VALID", 1),
])
def test_conv_kernel_equals_autodiff_per_example_gradients(shape, filters, kernel_hw, strides,
                                                          dilations, padding, groups):
  from tf_dpkit.clipping.rules.conv import same_or_valid_pads
  rng = np.random.default_rng(sum(shape) + filters)
  x = rng.normal(size=shape).astype(np.float32)
  out = tf.nn.convolution(tf.zeros(shape), tf.zeros([*kernel_hw, shape[-1], filters]),
                          strides=strides, padding=padding, dilations=dilations).shape
  g = rng.normal(size=out).astype(np.float32)
  pads = same_or_valid_pads(shape[1:3], kernel_hw, strides, dilations, padding)
  expected_norms, expected_bias, expected_grads = autodiff_conv_norms(
      x, g, kernel_hw, strides, dilations, padding, groups)
  for with_bias, keep_grads in ((False, True), (True, False)):
    norms, bias, grads = KERNELS.dpkit_conv_kernel_grad_squared_norms(
        x, g, tf.constant(groups, tf.int64), kernel_size=kernel_hw, strides=strides,
        dilations=dilations, pads=pads, with_bias=with_bias, keep_grads=keep_grads)
    if keep_grads:
      np.testing.assert_allclose(grads.numpy(), expected_grads, rtol=1e-5, atol=1e-4)
    else:
      assert grads.shape == (0, expected_grads.shape[1], filters)
    want = expected_norms + (np.sum(expected_bias**2, axis=1) if with_bias else 0.0)
    # float32 sums of up to ~800 products of size ~1 per entry, squares totalled in double.
    np.testing.assert_allclose(norms.numpy(), want, rtol=2e-5)
    np.testing.assert_allclose(bias.numpy(), expected_bias, rtol=1e-5, atol=1e-4)


@needs_kernels
@pytest.mark.parametrize("call, message", [
    (lambda: conv_op(np.zeros([2, 5, 5], np.float32), np.zeros([2, 3, 3, 4], np.float32), 2),
     "x must be \\[B, H, W, C\\] and g \\[B, OH, OW, P\\] with the same B"),
    (lambda: conv_op(np.zeros([2, 5, 5, 1], np.float32), np.zeros([3, 3, 3, 4], np.float32), 1),
     "with the same B"),
    (lambda: conv_op(np.zeros([4, 5, 5, 1], np.float32), np.zeros([4, 3, 3, 4], np.float32), 3),
     "num_groups must be >= 1 and divide the batch size 4, got 3"),
    (lambda: conv_op(np.zeros([4, 5, 5, 1], np.float32), np.zeros([4, 3, 3, 4], np.float32), 0),
     "num_groups must be >= 1"),
    (lambda: conv_op(np.zeros([2, 5, 5, 1], np.float32), np.zeros([2, 3, 3, 4], np.float32), 2,
                     kernel_size=[3]), "kernel_size must have 2 entries"),
    (lambda: conv_op(np.zeros([2, 5, 5, 1], np.float32), np.zeros([2, 3, 3, 4], np.float32), 2,
                     strides=[0, 1]), "strides must be >= 1"),
    (lambda: conv_op(np.zeros([2, 5, 5, 1], np.float32), np.zeros([2, 3, 3, 4], np.float32), 2,
                     pads=[-1, 0]), "pads must be >= 0"),
])
def test_conv_kernel_refuses_bad_arguments(call, message):
  with pytest.raises((tf.errors.InvalidArgumentError, ValueError), match=message):
    call()


def conv_op(x, g, groups, **attrs):
  attrs = {"kernel_size": [3, 3], "strides": [1, 1], "dilations": [1, 1], "pads": [0, 0],
           **attrs}
  return KERNELS.dpkit_conv_kernel_grad_squared_norms(x, g, tf.constant(groups, tf.int64),
                                                      **attrs)


@needs_kernels
def test_a_tf_compat_v1_graph_program_loads_checks_and_uses_the_kernels():
  # Eager execution off from the start: the load-time self-check still runs (eagerly), and the
  # graph's noise comes from the fused kernel with the right scale.
  out = run_python("""
      import numpy as np, tensorflow as tf
      tf.compat.v1.disable_eager_execution()
      from tf_dpkit import native, noise
      noised = noise.add_gaussian_noise([tf.zeros([100_001])], 2.0, 5, 3)[0]
      with tf.compat.v1.Session() as session:
        values = session.run(noised)
      kinds = {op.type for op in tf.compat.v1.get_default_graph().get_operations()}
      print("STD", round(float(values.std()), 2), "FUSED", "DpkitAddStatelessNormal" in kinds)
      print("STATUS", native.status("noise"))
  """).stdout
  assert "STD 2.0 FUSED True" in out  # se of the std: 2 / sqrt(2 n) = 0.0045
  assert "STATUS loaded from" in out


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16, tf.float64])
def test_add_gaussian_noise_on_other_dtypes_keeps_their_dtype_and_scale(dtype):
  # The fused kernel takes float32 only; 16-bit gradients get float32 normals cast down, float64
  # the TensorFlow-op sampler's float64 normals.
  noised = noise.add_gaussian_noise([tf.zeros([50_001], dtype)], 0.5, key=3, step=1)[0]
  assert noised.dtype == dtype
  values = tf.cast(noised, tf.float64).numpy()
  assert abs(values.std() - 0.5) < 0.5 * 5 / np.sqrt(2 * values.size)


def test_an_unexpected_build_failure_falls_back_with_its_reason(tmp_path):
  # The kernels' sources missing (a broken install): a warning and the TensorFlow ops, not a
  # crash inside the noise draw.
  done = run_python("""
      import logging, pathlib, numpy as np, tensorflow as tf
      logging.basicConfig(level=logging.WARNING)
      from tf_dpkit import native, noise
      native.SOURCES["noise"] = pathlib.Path("/nonexistent/noise_kernels.cc")
      seed = tf.constant([1, 2], tf.int64)
      got = noise.stateless_standard_normal(tf.TensorShape([9]), seed).numpy()
      ref = noise.tf_ops_standard_normal(tf.TensorShape([9]), seed).numpy()
      print("EQUAL", np.array_equal(got, ref), "STATUS", native.status("noise"))
  """, TF_DPKIT_CACHE_DIR=str(tmp_path))
  assert "EQUAL True STATUS FileNotFoundError" in done.stdout
  assert "compiled CPU kernels for noise unavailable (FileNotFoundError" in done.stderr


# The kernel cache's refusals, on private copies of this session's noise library and its digest
# file (no new compile: a "build" in these tests writes the session's library bytes, and a load
# records the bytes it was given instead of loading a second copy into this process).
def fresh_state():
  return {family: {"tried": False, "ops": None, "reason": "not tried yet"}
          for family in native.FAMILIES}


class CacheCopy:
  """A cache folder (mode 0700) for one test, holding a copy of the verified noise library."""

  def __init__(self, tmp_path, monkeypatch):
    self.name = native.library_name("noise")
    source = native.cache_dir()
    self.genuine = (source / self.name).read_bytes()
    self.folder = tmp_path / "cache"
    self.folder.mkdir(mode=0o700)
    for suffix in ("", ".sha256"):
      shutil.copyfile(source / (self.name + suffix), self.folder / (self.name + suffix))
    self.library = self.folder / self.name
    self.record = self.folder / (self.name + ".sha256")
    self.compiled, self.loaded = [], []
    monkeypatch.setenv(native.CACHE_VARIABLE, str(self.folder))
    monkeypatch.setattr(native, "_state", fresh_state())
    monkeypatch.setattr(native, "_announced_build", False)
    monkeypatch.setattr(native, "_compile", self._compile)
    monkeypatch.setattr(native, "_load_and_check", self._load_and_check)

  def _compile(self, family, cxx):
    self.compiled.append(family)
    return self.genuine, "kernels.cc:1: warning: a warning for the log", 0

  def _load_and_check(self, family, data, label):
    self.loaded.append(data)
    return f"ops of {family}"


@pytest.fixture
def cache_copy(tmp_path, monkeypatch):
  if LOADED["noise"] is None:
    pytest.skip(f"compiled kernels unavailable here: {native.status('noise')}")
  return CacheCopy(tmp_path, monkeypatch)


def assert_refused(cache, *patterns):
  assert native.kernels("noise") is None
  for pattern in patterns:
    assert pattern in native.status("noise"), native.status("noise")
  assert cache.loaded == []  # nothing was loaded


@needs_kernels
def test_a_verified_library_from_an_earlier_build_loads_exactly_its_bytes(cache_copy):
  assert native.kernels("noise") == "ops of noise"
  assert cache_copy.loaded == [cache_copy.genuine] and cache_copy.compiled == []
  assert "digest checked against " + cache_copy.name + ".sha256" in native.status("noise")


@needs_kernels
def test_a_cache_folder_owned_by_another_user_is_refused(cache_copy, monkeypatch):
  owner = os.stat(cache_copy.folder).st_uid
  monkeypatch.setattr(os, "geteuid", lambda: owner + 1000)  # this process as another user
  assert_refused(cache_copy, f"is owned by uid {owner}, not by this user (uid {owner + 1000})",
                 "TF_DPKIT_CACHE_DIR")
  assert cache_copy.compiled == []


@needs_kernels
@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_a_cache_folder_writable_by_group_or_others_is_refused(cache_copy, mode):
  cache_copy.folder.chmod(mode)
  assert_refused(cache_copy, f"is writable by group or others (mode {mode:04o})")
  assert cache_copy.compiled == []


@needs_kernels
@pytest.mark.parametrize("mode", [0o620, 0o602])
def test_a_library_writable_by_group_or_others_is_refused(cache_copy, mode):
  cache_copy.library.chmod(mode)
  assert_refused(cache_copy, f"{cache_copy.library} is writable by group or others")


@needs_kernels
def test_a_library_replaced_after_its_build_is_refused(cache_copy):
  cache_copy.library.write_bytes(cache_copy.genuine[:-64] + b"planted".ljust(64, b"\0"))
  assert_refused(cache_copy, "does not match the SHA-256 recorded when it was built",
                 "python -m tf_dpkit.native build --force")


@needs_kernels
def test_a_library_built_here_is_checked_against_the_digest_kept_in_memory(cache_copy):
  # Built by this process (into an empty folder), then both the library and its digest file
  # replaced consistently: the digest this process recorded still refuses it.
  for path in (cache_copy.library, cache_copy.record):
    path.unlink()
  assert native.kernels("noise") == "ops of noise" and cache_copy.compiled == ["noise"]
  planted = b"planted library"
  cache_copy.library.write_bytes(planted)
  cache_copy.record.write_text(f"{hashlib.sha256(planted).hexdigest()}  {cache_copy.name}\n")
  native._state["noise"] = fresh_state()["noise"]
  cache_copy.loaded.clear()
  assert_refused(cache_copy, "does not match the SHA-256")


@needs_kernels
def test_a_digest_file_without_a_digest_is_refused(cache_copy):
  cache_copy.record.write_text("trust me\n")
  assert_refused(cache_copy, "does not hold a SHA-256 digest")


@needs_kernels
@pytest.mark.parametrize("which", ["library", "record"])
def test_a_symbolic_link_in_place_of_the_library_or_its_digest_is_refused(cache_copy, tmp_path,
                                                                          which):
  # Even a link to the genuine bytes: the cache holds only this user's own regular files.
  path = getattr(cache_copy, which)
  elsewhere = tmp_path / "elsewhere"
  shutil.copyfile(path, elsewhere)
  path.unlink()
  path.symlink_to(elsewhere)
  assert_refused(cache_copy, f"{path} is a symbolic link")


@needs_kernels
def test_a_symbolic_link_in_place_of_the_lock_file_is_refused_and_its_target_kept(cache_copy,
                                                                                tmp_path):
  target = tmp_path / "victim.txt"
  target.write_text("not to be truncated")
  (cache_copy.folder / (cache_copy.name + ".lock")).symlink_to(target)
  assert_refused(cache_copy, "the lock file", "is a symbolic link")
  assert target.read_text() == "not to be truncated"


@needs_kernels
def test_a_library_without_its_digest_file_is_rebuilt_not_loaded(cache_copy, caplog):
  cache_copy.record.unlink()
  cache_copy.library.write_bytes(b"planted library")
  with caplog.at_level(logging.INFO, logger="tf_dpkit"):
    assert native.kernels("noise") == "ops of noise"
  assert cache_copy.compiled == ["noise"] and cache_copy.loaded == [cache_copy.genuine]
  assert cache_copy.library.read_bytes() == cache_copy.genuine
  assert cache_copy.record.read_text().split()[0] == hashlib.sha256(
      cache_copy.genuine).hexdigest()
  log = cache_copy.folder / (cache_copy.name[:-len(".so")] + ".log")
  assert "a warning for the log" in log.read_text()  # the compiler's warnings are kept
  assert f"1 compiler warnings, all messages in {log}" in native.status("noise")
  building = [r for r in caplog.records if "building the compiled CPU kernels" in r.message]
  assert [r.levelno for r in building] == [logging.WARNING]  # one line, for the lazy build
  for path in (cache_copy.library, cache_copy.record, log):
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@needs_kernels
def test_a_new_cache_folder_is_created_private(cache_copy, tmp_path, monkeypatch):
  folder = tmp_path / "new" / "tf_dpkit"
  monkeypatch.setenv(native.CACHE_VARIABLE, str(folder))
  assert native.kernels("noise") == "ops of noise"
  assert stat.S_IMODE(folder.stat().st_mode) == 0o700


@needs_kernels
def test_one_family_that_cannot_be_built_leaves_the_others(cache_copy, monkeypatch):
  sources = dict(native.SOURCES, conv=native.SOURCES["conv"].with_name("missing.cc"))
  monkeypatch.setattr(native, "SOURCES", sources)
  assert native.kernels("conv") is None
  assert native.status("conv").startswith("FileNotFoundError")
  assert native.kernels("noise") == "ops of noise"
  assert native.status().startswith("noise: loaded from")


@needs_kernels
def test_the_build_command_builds_checks_and_reports_every_family():
  done = subprocess.run([sys.executable, "-m", "tf_dpkit.native", "build"], capture_output=True,
                        text=True, timeout=300)
  assert done.returncode == 0, done.stdout + done.stderr[-3000:]
  for family in native.FAMILIES:
    line = next(l for l in done.stdout.splitlines() if l.startswith(family + ":"))
    digest = hashlib.sha256(native.build(family).read_bytes()).hexdigest()
    assert line.startswith(f"{family}: loaded from {native.build(family)} (sha256 {digest[:16]}")
