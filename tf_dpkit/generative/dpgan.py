"""DP-GAN: a GAN whose discriminator is trained with DP-SGD on the private data.

Only the discriminator reads private examples: each discriminator step clips every real
example's gradient of the real loss term to ``l2_norm_clip``, adds Gaussian noise of std
``noise_multiplier * l2_norm_clip`` and normalises by the expected Poisson batch size (one step
of the subsampled Gaussian mechanism of DP-SGD, add-or-remove-one adjacency).  The fake term
(generated examples, uniform public fake labels) and the generator step are post-processing,
so the accountant (:class:`tf_dpkit.budget.PrivacyLedger`) counts discriminator steps
only.  BatchNormalization in the discriminator and the WGAN-GP gradient penalty are refused
(they mix examples).

Conditional models: generator ``[noise [B, latent_dim], one_hot_label [B, K]] -> image``,
discriminator ``[image, one_hot_label] -> logit [B, 1]``; unconditional: ``noise -> image``,
``image -> logit``.

Design and the privacy argument step by step: docs/design/generative.md.
"""
from __future__ import annotations

import math
import time

import keras
import numpy as np
import tensorflow as tf

from analysis import _checks, calibration
from tf_dpkit import _autograph
from tf_dpkit.budget import Phase, PrivacyLedger, ledger_array
from tf_dpkit.clipping import fast_path
from tf_dpkit.data.poisson import poisson_batches
from tf_dpkit.dp_gradients import METHODS, clipped_sum_for_model
from tf_dpkit.optimizers import (DPAdamGaussianOptimizer, DPGradientDescentGaussianOptimizer,
                                 DPRMSPropGaussianOptimizer)

LOSSES = ("standard", "wasserstein")
OPTIMIZERS = ("adam", "rmsprop", "sgd")

GRADIENT_PENALTY_REFUSED = (
    "gradient_penalty is not supported: the WGAN-GP penalty is evaluated on interpolates that "
    "mix real and fake examples and is averaged over the batch, so it is not a per-example "
    "term of the clipped real loss and the released gradient would depend on real examples "
    "without clipping (not differentially private). Use loss='wasserstein' with weight_clip "
    "(weight clipping, as in DPGAN, Xie et al. 2018) or loss='standard'.")


def _real_term(loss):
  """Per-example real-data loss on logits ``[b, 1] -> [b]`` (what is clipped per example)."""
  if loss == "standard":
    return lambda y_true, logits: tf.math.softplus(-logits[..., 0])  # -log sigmoid(D)
  return lambda y_true, logits: -logits[..., 0]


def _fake_term(loss):
  if loss == "standard":
    return lambda y_true, logits: tf.math.softplus(logits[..., 0])  # -log(1 - sigmoid(D))
  return lambda y_true, logits: logits[..., 0]


def _generator_term(loss, logits):
  if loss == "standard":
    return tf.math.softplus(-logits[..., 0])  # non-saturating: -log sigmoid(D(G(z)))
  return -logits[..., 0]


def check_discriminator_examples_independent(discriminator):
  """Raises ``ValueError`` if the discriminator holds a layer that mixes the examples of a batch."""
  mixing = fast_path.example_mixing_layers(discriminator)
  if mixing:
    raise ValueError(
        f"discriminator layer {mixing[0].name!r} is BatchNormalization, which mixes the examples "
        "of a batch (batch mean and variance), so one real example's gradient depends on the "
        "others and per-example clipping cannot bound its influence: DP-GAN refuses it. Use "
        "keras.layers.LayerNormalization or GroupNormalization in the discriminator (the "
        "generator may keep BatchNormalization: it never sees real data).")


def _static_shape(tensor):
  return tuple(tensor.shape)[1:]


def check_built_models(**models):
  """Raises ``ValueError`` naming the argument unless each is a built functional or Sequential
  ``keras.Model`` with ``keras.Input`` layers (its input shapes must be known)."""
  for name, model in models.items():
    if not isinstance(model, keras.Model):
      raise ValueError(f"{name} must be a keras.Model, got {type(model).__name__}.")
    if not model.built or not getattr(model, "inputs", None):
      raise ValueError(f"{name} must be a built functional or Sequential model with "
                       "keras.Input layers (so its input shapes are known).")


def public_latent(rng, batch, latent_dim, num_classes):
  """Public randomness of a GAN step: noise ``N(0, I)`` ``[batch, latent_dim]`` from ``rng`` (a
  ``tf.random.Generator``) and, with ``num_classes``, uniform one-hot fake labels ``[batch,
  num_classes]`` (never the data's label frequencies); ``(noise, None)`` otherwise."""
  z = rng.normal([batch, latent_dim])
  if num_classes is None:
    return z, None
  labels = rng.uniform([batch], 0, num_classes, dtype=tf.int32)
  return z, tf.one_hot(labels, num_classes)


def model_inputs(first, labels):
  """A generator's or discriminator's inputs: ``first`` alone, or ``[first, one_hot_labels]``
  for conditional models."""
  return first if labels is None else [first, labels]


class DPGAN:
  """Trains a Keras generator and discriminator as a differentially private GAN.

  See the module docstring for exactly what is clipped and noised and why the accountant
  counts discriminator steps only.

  Args:
    generator: a built Keras model (functional or Sequential): ``noise -> image``, or
      ``[noise, one_hot_label] -> image`` when ``num_classes`` is set.  Its output shape must be
      the discriminator's image input shape.
    discriminator: a built Keras functional or Sequential model ``image -> logit [B, 1]``
      (``[image, one_hot_label] -> logit`` when conditional), without BatchNormalization.
    latent_dim: size of the noise vector, an integer >= 1 (must match the generator input);
      noise is ``N(0, I)``.
    num_classes: ``None`` (unconditional) or the number of classes K >= 2 (conditional GAN;
      labels are one-hot vectors of length K).
    loss: ``"standard"`` (non-saturating binary cross-entropy GAN) or ``"wasserstein"``
      (WGAN critic with weight clipping).
    l2_norm_clip: C, a finite number > 0: each real example's discriminator gradient is
      clipped to L2 norm C.
    noise_multiplier: sigma, a finite number >= 0: Gaussian noise of std ``sigma * C`` is
      added to the clipped sum of each discriminator step (0 gives epsilon = inf).
    expected_batch_size: qN, the expected size of a Poisson batch of real examples, a finite
      number > 0 (and <= N, checked by :meth:`fit`); also (rounded, >= 1) the number of fake
      examples per discriminator step and per generator step.
    discriminator_steps: k, an integer >= 1: discriminator steps per generator step.
    discriminator_learning_rate: finite numbers > 0.
    generator_learning_rate: see ``discriminator_learning_rate`` (described together).
    optimizer: ``"adam"`` (``beta_1`` below; the usual GAN choice), ``"rmsprop"`` (WGAN's)
      or ``"sgd"``, for both networks (the discriminator's is the tf_dpkit DP version).
    beta_1: Adam's first-moment decay, in [0, 1); default 0.5.
    weight_clip: ``None`` or c, a finite number > 0: after every discriminator step each
      discriminator weight is clipped to ``[-c, c]``.  Default: 0.01 for ``"wasserstein"``,
      None for ``"standard"``.
    gradient_penalty: must be ``None`` or 0: the WGAN-GP penalty is refused (module doc).
    clip_fake_examples: clip each fake example's gradient to C too (default True; balance
      only, privacy does not depend on it).
    seed: integer in [0, 2**62): public seed of the latent noise and fake labels (not a
      privacy secret).  Weight initialisation is the caller's (``keras.utils.set_random_seed``).
    noise_seed: ``None`` (default: a secret key from the OS entropy source, never written
      anywhere) or an integer in [0, 2**62) for reproducible DP noise (tests only).
    method: how per-example discriminator gradients are obtained: ``"auto"``, ``"fast"``
      (per-layer path; functional/Sequential models) or ``"vectorized"``
      (``tf_dpkit.private_gradients``).
    accountant: ``"rdp"`` or ``"pld"`` (``tf_dpkit.budget.PrivacyLedger``).
    delta: delta in (0, 1) at which epsilon is reported and the budget enforced; default 1e-5.
    generator_ema: ``None`` (default) or the decay d in [0, 1) of an exponential moving average
      of the generator's weights (all of them, BatchNormalization statistics included), kept
      in :attr:`averaged_generator`: after generator step t every averaged weight becomes
      ``a <- d_t a + (1 - d_t) w`` with ``d_t = min(d, (1 + t) / (10 + t))`` (the short
      warm-up of ``tf.train.ExponentialMovingAverage``'s ``num_updates``), starting from the
      initial weights (non-floating weights are copied).  BatchNormalization's moving
      statistics are averaged like the rest, so they are not exactly the statistics of the
      averaged weights.  A function of the generator's iterates only: post-processing, no
      privacy cost.
    mode_seeking: lambda, a finite number >= 0 (default 0: off), the weight of the
      mode-seeking term of MSGAN (Mao et al., CVPR 2019) in the generator loss.  Each generator
      step then draws a second public noise batch ``z2`` for the same fake labels ``y`` and
      minimises ``L_G + lambda / (mean|G(z1, y) - G(z2, y)| / mean|z1 - z2| + 1e-5)`` (means of
      absolute differences over all elements; :func:`mode_seeking_penalty`), which penalises a
      generator whose images do not move with its noise input (within-class collapse).  The
      term reads the generator and public noise only: post-processing, no privacy cost; each
      generator step costs about twice as much.  With 0 no second batch is drawn, so the run
      is exactly that of a DPGAN without the option.

  Attributes:
    accountant: the :class:`~tf_dpkit.budget.PrivacyLedger`; one recorded step per
      discriminator step.
    discriminator_optimizer: the tf_dpkit DP optimizer; generator_optimizer: a plain Keras one.
    averaged_generator: with ``generator_ema``, a clone of the generator holding the moving
      average of its weights (sample or save it like the generator); else None.
  """

  def __init__(self, generator, discriminator, *, latent_dim, num_classes=None,
               loss="standard", l2_norm_clip=1.0, noise_multiplier, expected_batch_size,
               discriminator_steps=1, discriminator_learning_rate=2e-4,
               generator_learning_rate=2e-4, optimizer="adam", beta_1=0.5, weight_clip="auto",
               gradient_penalty=None, clip_fake_examples=True, seed=0, noise_seed=None,
               method="auto", accountant="rdp", delta=1e-5, generator_ema=None,
               mode_seeking=0.0):
    if gradient_penalty is not None and gradient_penalty != 0:
      raise ValueError(GRADIENT_PENALTY_REFUSED + f" Got gradient_penalty={gradient_penalty!r}.")
    check_built_models(generator=generator, discriminator=discriminator)
    check_discriminator_examples_independent(discriminator)
    self.latent_dim = _checks.check_integer("latent_dim", latent_dim, minimum=1)
    self.num_classes = (None if num_classes is None else
                        _checks.check_integer("num_classes", num_classes, minimum=2,
                                              none_allowed=True))
    self.loss = _checks.check_choice("loss", loss, LOSSES)
    self.l2_norm_clip = _checks.check_finite_positive("l2_norm_clip", l2_norm_clip)
    self.noise_multiplier = _checks.check_finite_nonnegative("noise_multiplier",
                                                             noise_multiplier)
    self.expected_batch_size = _checks.check_finite_positive("expected_batch_size",
                                                             expected_batch_size)
    self.discriminator_steps = _checks.check_integer("discriminator_steps",
                                                     discriminator_steps, minimum=1)
    self.discriminator_learning_rate = _checks.check_finite_positive(
        "discriminator_learning_rate", discriminator_learning_rate)
    self.generator_learning_rate = _checks.check_finite_positive("generator_learning_rate",
                                                                 generator_learning_rate)
    self.optimizer = _checks.check_choice("optimizer", optimizer, OPTIMIZERS)
    self.beta_1 = _checks.check_real("beta_1", beta_1)
    if not 0.0 <= self.beta_1 < 1.0:
      raise ValueError(f"beta_1 must be in [0, 1), got {beta_1!r}.")
    if isinstance(weight_clip, str) and weight_clip == "auto":
      weight_clip = 0.01 if self.loss == "wasserstein" else None
    self.weight_clip = (None if weight_clip is None else
                        _checks.check_finite_positive("weight_clip", weight_clip))
    if not isinstance(clip_fake_examples, bool):
      raise ValueError(f"clip_fake_examples must be True or False, got {clip_fake_examples!r}.")
    self.clip_fake_examples = clip_fake_examples
    self.seed = _checks.check_integer("seed", seed, minimum=0, maximum=2**62 - 1)
    self.method = _checks.check_choice("method", method, METHODS)
    self.accountant = PrivacyLedger(delta, accountant)
    self.generator, self.discriminator = generator, discriminator
    self._check_shapes()
    self.fake_batch_size = max(1, int(round(self.expected_batch_size)))

    dp_class, plain_class, kwargs = {
        "adam": (DPAdamGaussianOptimizer, keras.optimizers.Adam, {"beta_1": self.beta_1}),
        "rmsprop": (DPRMSPropGaussianOptimizer, keras.optimizers.RMSprop, {}),
        "sgd": (DPGradientDescentGaussianOptimizer, keras.optimizers.SGD, {}),
    }[self.optimizer]
    self.discriminator_optimizer = dp_class(
        l2_norm_clip=self.l2_norm_clip, noise_multiplier=self.noise_multiplier,
        learning_rate=self.discriminator_learning_rate,
        expected_batch_size=self.expected_batch_size, seed=noise_seed, **kwargs)
    self.generator_optimizer = plain_class(learning_rate=self.generator_learning_rate, **kwargs)
    self.discriminator_optimizer.build(discriminator.trainable_variables)
    self.generator_optimizer.build(generator.trainable_variables)
    self._rng = tf.random.Generator.from_seed(self.seed)
    # One trace per padded batch size (see _padded): static batch shapes keep the fast
    # path's cheap Gram-form norms for Dense layers.  Traced without autograph
    # (tf_dpkit._autograph).
    self._d_step = _autograph.function(self._discriminator_step)
    # About 3 standard deviations of the Poisson batch size, a power of two >= 8.
    self._pad_multiple = 2 ** int(round(math.log2(max(8.0, 3.0 * math.sqrt(
        self.expected_batch_size)))))
    self.generator_ema = None
    self.averaged_generator = None
    if generator_ema is not None:
      decay = _checks.check_real("generator_ema", generator_ema)
      if not 0.0 <= decay < 1.0:
        raise ValueError(f"generator_ema must be None or a decay in [0, 1), got "
                         f"{generator_ema!r}.")
      self.generator_ema = decay
      self.averaged_generator = keras.models.clone_model(generator)
      self.averaged_generator.set_weights(generator.get_weights())
      self._ema_updates = tf.Variable(0.0, trainable=False, dtype=tf.float32)
    self.mode_seeking = _checks.check_finite_nonnegative("mode_seeking", mode_seeking)
    self._g_step = _autograph.function(self._generator_step)
    self.history: list[dict] = []

  # -- shapes ----------------------------------------------------------------------------------

  def _check_shapes(self):
    g_inputs, d_inputs = self.generator.inputs, self.discriminator.inputs
    wanted = 1 if self.num_classes is None else 2
    what = ("noise" if wanted == 1 else "[noise, one_hot_label]",
            "image" if wanted == 1 else "[image, one_hot_label]")
    if len(g_inputs) != wanted:
      raise ValueError(f"generator must take {what[0]} ({wanted} input(s) for num_classes="
                       f"{self.num_classes}), it has {len(g_inputs)} inputs.")
    if len(d_inputs) != wanted:
      raise ValueError(f"discriminator must take {what[1]} ({wanted} input(s) for num_classes="
                       f"{self.num_classes}), it has {len(d_inputs)} inputs.")
    if _static_shape(g_inputs[0]) != (self.latent_dim,):
      raise ValueError(f"latent_dim={self.latent_dim} does not match the generator's noise "
                       f"input shape {_static_shape(g_inputs[0])}.")
    if wanted == 2:
      for name, inp in (("generator", g_inputs[1]), ("discriminator", d_inputs[1])):
        if _static_shape(inp) != (self.num_classes,):
          raise ValueError(f"num_classes={self.num_classes} does not match the {name}'s label "
                           f"input shape {_static_shape(inp)} (one-hot labels of length K).")
    self.image_shape = _static_shape(d_inputs[0])
    out = _static_shape(self.generator.outputs[0])
    if out != self.image_shape:
      raise ValueError(f"The generator outputs images of shape {out}, the discriminator takes "
                       f"{self.image_shape}.")
    d_out = _static_shape(self.discriminator.outputs[0])
    if d_out != (1,):
      raise ValueError(f"discriminator must output one logit per example, shape [B, 1]; its "
                       f"output has shape [B, {', '.join(map(str, d_out))}].")

  # -- public randomness ---------------------------------------------------------------------

  def _latent(self, batch):
    return public_latent(self._rng, batch, self.latent_dim, self.num_classes)

  def _inputs(self, first, labels):
    return model_inputs(first, labels)

  # -- the two steps ---------------------------------------------------------------------------

  def _discriminator_step(self, x_real, y_real, weight):
    """One DP discriminator step; the only function that reads real data."""
    z, y_fake = self._latent(self.fake_batch_size)
    x_fake = self.generator(self._inputs(z, y_fake), training=True)  # as in the G step
    dummy = tf.zeros_like(weight)
    clipped, _ = clipped_sum_for_model(
        self.discriminator, _real_term(self.loss), self._inputs(x_real, y_real), dummy, weight,
        self.l2_norm_clip, None, self.method)
    fake_inputs = self._inputs(tf.stop_gradient(x_fake), y_fake)
    variables = self.discriminator.trainable_variables
    if self.clip_fake_examples:
      fake_sum, _ = clipped_sum_for_model(
          self.discriminator, _fake_term(self.loss), fake_inputs, tf.zeros([self.fake_batch_size]),
          None, self.l2_norm_clip, None, self.method)
      fake_grads = [g / float(self.fake_batch_size) for g in fake_sum.grads]
    else:
      with tf.GradientTape() as tape:
        logits = self.discriminator(fake_inputs, training=True)
        fake_loss = tf.reduce_mean(_fake_term(self.loss)(None, logits))
      fake_grads = tape.gradient(fake_loss, variables,
                                 unconnected_gradients=tf.UnconnectedGradients.ZERO)
    grads = self.discriminator_optimizer.privatize(clipped, data_independent_grads=fake_grads)
    self.discriminator_optimizer.apply(grads, variables)
    if self.weight_clip is not None:
      for v in variables:
        v.assign(tf.clip_by_value(v, -self.weight_clip, self.weight_clip))
    real_loss = tf.reduce_sum(clipped.losses) / self.expected_batch_size
    return {"discriminator_real_loss": real_loss,
            "median_real_grad_norm": _median(tf.boolean_mask(clipped.norms, weight > 0))}

  def _generator_step(self):
    """One generator step: reads ``D``'s weights and public randomness, never real data."""
    z, y_fake = self._latent(self.fake_batch_size)
    if self.mode_seeking:
      # Public noise, drawn only when the term is on (lambda 0 keeps the stream unchanged).
      z2 = self._rng.normal([self.fake_batch_size, self.latent_dim])
    with tf.GradientTape() as tape:
      x_fake = self.generator(self._inputs(z, y_fake), training=True)
      logits = self.discriminator(self._inputs(x_fake, y_fake), training=False)
      loss = tf.reduce_mean(_generator_term(self.loss, logits))
      total = loss
      if self.mode_seeking:
        x_fake2 = self.generator(self._inputs(z2, y_fake), training=True)
        total = loss + self.mode_seeking * mode_seeking_penalty(x_fake, x_fake2, z, z2)
    variables = self.generator.trainable_variables
    grads = tape.gradient(total, variables)
    self.generator_optimizer.apply(grads, variables)
    if self.averaged_generator is not None:
      self._update_average()
    return {"generator_loss": loss}

  def _update_average(self):
    """``a <- d_t a + (1 - d_t) w`` for every generator weight (class docstring)."""
    self._ema_updates.assign_add(1.0)
    t = self._ema_updates
    decay = tf.minimum(tf.constant(self.generator_ema, tf.float32), (1.0 + t) / (10.0 + t))
    for averaged, current in zip(self.averaged_generator.weights, self.generator.weights,
                                 strict=True):
      if not tf.as_dtype(averaged.dtype).is_floating:  # e.g. a counter: copied, not averaged
        averaged.assign(current)
        continue
      d = tf.cast(decay, averaged.dtype)
      averaged.assign(d * averaged + (1.0 - d) * tf.cast(current, averaged.dtype))

  def discriminator_step(self, x_real, y_real=None, weight=None, *, dataset_size=None):
    """Runs one private discriminator step on a real batch and records it in the accountant.

    Every step that reads real data is accounted: as one Poisson-sampled Gaussian step of
    sampling probability ``q = expected_batch_size / N`` and noise multiplier
    ``noise_multiplier``.  The batch must be a Poisson sample of the N training examples with
    that q (e.g. ``poisson_batches(data, expected_batch_size=...)``); a batch chosen any other
    way is not covered by the recorded epsilon.  Use :meth:`fit` for training.

    Args:
      x_real: ``[b, *image_shape]`` float images (a Poisson batch, b >= 1).
      y_real: ``[b, K]`` one-hot labels (conditional) or None.
      weight: ``[b]`` example weights from ``poisson_batches`` (default ones).
      dataset_size: N, an integer >= ``expected_batch_size``; may be omitted after :meth:`fit`
        (which sets it from its data).  Given, it sets N for this and later direct steps.

    Raises:
      ValueError: N is unknown (no ``dataset_size`` and no earlier :meth:`fit`) or out of
        range; nothing is trained then.
    """
    if dataset_size is not None:
      n = _checks.check_integer("dataset_size", dataset_size, minimum=1)
      if n < self.expected_batch_size:
        raise ValueError(f"dataset_size must be an integer >= expected_batch_size="
                         f"{self.expected_batch_size:g}, got {dataset_size!r}.")
      q = self.expected_batch_size / n
    else:
      q = getattr(self, "_sampling_probability", None)
      if q is None:
        raise ValueError(
            "discriminator_step reads real data, so its privacy cost must be recorded: pass "
            "dataset_size=N (the number of training examples the Poisson batch was drawn "
            "from, sampling probability expected_batch_size / N) or call fit first.")
    x_real = tf.convert_to_tensor(x_real, tf.float32)
    if weight is None:
      weight = tf.ones([tf.shape(x_real)[0]], tf.float32)
    if (y_real is None) != (self.num_classes is None):
      raise ValueError("y_real must be given exactly when num_classes is set.")
    y_real = None if y_real is None else tf.convert_to_tensor(y_real, tf.float32)
    self._sampling_probability = q
    logs = self._d_step(*self._padded(x_real, y_real, tf.convert_to_tensor(weight, tf.float32)))
    self.accountant.record(q, self.noise_multiplier, 1)
    self._write_ledger()
    return logs

  def generator_step(self):
    """Runs one generator step (post-processing: no data argument, no privacy cost)."""
    return self._g_step()

  def _padded(self, x, y, weight):
    """Pads a real batch with all-zero examples of weight 0 up to a multiple of a power of two.

    Weight-0 rows contribute a zero loss, hence a zero gradient, which clipping keeps at zero
    (the same device as ``poisson_batches``' empty-draw placeholder): the clipped sum, the noise
    and the normaliser ``qN`` are unchanged, so the mechanism is the same.  The pad content is
    a constant, independent of the data.  Padding makes batch shapes static per bucket (a few
    traces per run), so the fast path's rules see a known batch size when they choose their
    form (e.g. the Gram form of Dense-layer norms); ``benchmarks/dynamic_batch.py`` compares a
    known and an unknown batch size.
    """
    b = int(x.shape[0])
    extra = -b % self._pad_multiple
    if not extra:
      return x, y, weight
    pad = lambda t: tf.concat([t, tf.zeros([extra] + list(t.shape[1:]), t.dtype)], 0)
    return pad(x), None if y is None else pad(y), pad(weight)

  # -- training ------------------------------------------------------------------------------

  def epsilon(self) -> float:
    """Epsilon (nats) at the accountant's delta for the discriminator steps taken so far."""
    if not self.accountant.steps:
      return 0.0
    return self.accountant.epsilon()

  def _affordable_discriminator_steps(self, target_epsilon, q):
    """Largest number of further discriminator steps whose total epsilon is <= target."""
    def fits(extra):
      phase = Phase(q, self.noise_multiplier, extra)
      return self.accountant.epsilon(extra=phase) <= target_epsilon
    if self.noise_multiplier == 0.0:
      return 0
    affordable = calibration.largest_count_that_fits(fits, start=1)
    return None if affordable is None else max(affordable, 0)

  def fit(self, x, y=None, *, generator_steps, target_epsilon=None, sampling_seed=None,
          log_every=100, callback=None, verbose=True, log_private_diagnostics=False):
    """Trains until ``generator_steps`` generator steps are done or the budget is spent.

    One iteration = ``discriminator_steps`` private discriminator steps (each on a fresh
    Poisson batch) then one generator step.  With ``target_epsilon`` training stops before the
    iteration whose discriminator steps would take epsilon (at ``delta``) above it.

    Args:
      x: ``[N, *image_shape]`` float array of the private images (N >= 1).
      y: ``[N]`` integer labels in ``[0, num_classes)`` (required iff conditional).
      generator_steps: maximal number of iterations, an integer >= 1.
      target_epsilon: ``None`` (no budget) or a number > 0 (nats; ``inf`` = no budget).
      sampling_seed: ``None`` (a secret seed, as the analysis needs) or an integer (tests).
      log_every: log (and call ``callback``) every this many iterations, integer >= 1.
      callback: optional ``f(logs: dict)``, called with each log entry.
      verbose: print each log entry.
      log_private_diagnostics: also log ``discriminator_real_loss`` and
        ``median_real_grad_norm`` of the last discriminator step.  They are computed from the
        real batch (the median from *unclipped* norms) and are NOT covered by the privacy
        guarantee: keep such logs private.  Default ``False``: the logs (printed, ``history``,
        ``callback``) hold only public quantities (step counts, epsilon, time, and the
        generator loss, a function of the released discriminator and public noise).

    Returns:
      A dict: ``epsilon`` (at ``delta``, all discriminator steps ever recorded), ``delta``,
      ``discriminator_steps`` and ``generator_steps`` (this call), ``stopped_by_budget``,
      ``noise_multiplier``, ``sampling_probability``, ``seconds``.

    Raises:
      ValueError: an argument out of range (named), data that do not match the models, or a
        budget that does not allow one iteration.
    """
    generator_steps = _checks.check_integer("generator_steps", generator_steps, minimum=1)
    log_every = _checks.check_integer("log_every", log_every, minimum=1)
    if not isinstance(log_private_diagnostics, bool):
      raise TypeError(f"log_private_diagnostics must be True or False, got "
                      f"{log_private_diagnostics!r}.")
    if target_epsilon is not None:
      target_epsilon = _checks.check_positive("target_epsilon", target_epsilon)  # inf allowed
    if callback is not None and not callable(callback):
      raise ValueError(f"callback must be None or callable, got {callback!r}.")
    x = np.asarray(x, np.float32)
    if x.ndim < 1 or x.shape[0] < 1 or tuple(x.shape[1:]) != self.image_shape:
      raise ValueError(f"x must have shape [N >= 1, {', '.join(map(str, self.image_shape))}], "
                       f"got {x.shape}.")
    n = x.shape[0]
    if self.expected_batch_size > n:
      raise ValueError(f"expected_batch_size must be in (0, N={n}], got "
                       f"{self.expected_batch_size!r}.")
    if self.num_classes is None:
      if y is not None:
        raise ValueError("y must be None for an unconditional DP-GAN (num_classes=None).")
      data = (x,)
    else:
      if y is None:
        raise ValueError(f"y (labels in [0, {self.num_classes})) is required when "
                         f"num_classes={self.num_classes}.")
      y = np.asarray(y)
      if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"y must be an integer array of shape [N={n}], got {y.dtype} "
                         f"{y.shape}.")
      if y.min() < 0 or y.max() >= self.num_classes:
        raise ValueError(f"y must hold labels in [0, {self.num_classes}), got values in "
                         f"[{y.min()}, {y.max()}].")
      data = (x, np.eye(self.num_classes, dtype=np.float32)[y])
    q = self.expected_batch_size / n
    self._sampling_probability = q
    k = self.discriminator_steps
    iterations = generator_steps
    if target_epsilon is not None and target_epsilon != math.inf:
      if self.noise_multiplier == 0.0:
        raise ValueError(f"target_epsilon={target_epsilon} cannot be met with "
                         "noise_multiplier=0 (epsilon = inf); use noise_multiplier > 0 or "
                         "target_epsilon=None/inf.")
      affordable = self._affordable_discriminator_steps(target_epsilon, q)
      if affordable is not None:
        iterations = min(iterations, affordable // k)
      if iterations == 0:
        raise ValueError(
            f"target_epsilon={target_epsilon} does not allow one more iteration of "
            f"discriminator_steps={k} discriminator steps at delta={self.accountant.delta} "
            f"(epsilon so far {self.epsilon():.4f}); raise target_epsilon or noise_multiplier.")
    stopped_by_budget = iterations < generator_steps
    batches = iter(poisson_batches(data, expected_batch_size=self.expected_batch_size,
                                   steps=iterations * k, seed=sampling_seed).prefetch(2))
    start = time.time()
    logs = {}
    for it in range(1, iterations + 1):
      for _ in range(k):
        element = next(batches)
        if self.num_classes is None:
          x_b, w_b = element
          y_b = None
        else:
          x_b, y_b, w_b = element
        d_logs = self._d_step(*self._padded(x_b, y_b, w_b))
        self.accountant.record(q, self.noise_multiplier, 1)
      g_logs = self._g_step()
      if it % log_every == 0 or it == iterations:
        logs = {"generator_step": it, "discriminator_steps": self.accountant.steps,
                "epsilon": self.epsilon(), "seconds": round(time.time() - start, 1)}
        if log_private_diagnostics:
          logs.update({key: float(v) for key, v in d_logs.items()})
        logs.update({key: float(v) for key, v in g_logs.items()})
        self.history.append(logs)
        if verbose:
          print(" ".join(f"{key}={v:.4g}" if isinstance(v, float) else f"{key}={v}"
                         for key, v in logs.items()), flush=True)
        if callback is not None:
          callback(dict(logs))
    self._write_ledger()
    if stopped_by_budget and verbose:
      print(f"DPGAN: stopped after {iterations} generator steps: one more iteration of {k} "
            f"discriminator steps would exceed target_epsilon={target_epsilon} at "
            f"delta={self.accountant.delta} (epsilon now {self.epsilon():.4f}).", flush=True)
    return {"epsilon": self.epsilon(), "delta": self.accountant.delta,
            "discriminator_steps": iterations * k, "generator_steps": iterations,
            "stopped_by_budget": stopped_by_budget, "noise_multiplier": self.noise_multiplier,
            "sampling_probability": q, "seconds": round(time.time() - start, 1)}

  def _write_ledger(self):
    ledger = getattr(self.discriminator_optimizer, "privacy_ledger", None)
    if ledger is not None:
      ledger.assign(ledger_array(self.accountant.phases, tuple(ledger.shape)))

  def get_config(self) -> dict:
    """The public settings (JSON-serialisable); never the noise key or the sampling seed."""
    return {
        "latent_dim": self.latent_dim, "num_classes": self.num_classes, "loss": self.loss,
        "l2_norm_clip": self.l2_norm_clip, "noise_multiplier": self.noise_multiplier,
        "expected_batch_size": self.expected_batch_size,
        "discriminator_steps": self.discriminator_steps,
        "discriminator_learning_rate": self.discriminator_learning_rate,
        "generator_learning_rate": self.generator_learning_rate, "optimizer": self.optimizer,
        "beta_1": self.beta_1, "weight_clip": self.weight_clip,
        "clip_fake_examples": self.clip_fake_examples, "seed": self.seed,
        "method": self.method, "accountant": self.accountant.accountant,
        "delta": self.accountant.delta, "generator_ema": self.generator_ema,
        "mode_seeking": self.mode_seeking,
    }


def mode_seeking_penalty(images_1, images_2, noise_1, noise_2, eps=1e-5):
  """MSGAN's mode-seeking penalty ``1 / (mean|x1 - x2| / mean|z1 - z2| + eps)``.

  ``x_i = G(z_i, y)`` are two generator outputs for the same labels and noise batches ``z1``,
  ``z2`` (each mean is over every element of its tensor, so the ratio is unitless: output
  change per unit of noise change).  It is 1/eps for a generator that ignores its noise and
  falls as the outputs spread; Mao et al. (CVPR 2019) add ``lambda`` times it to ``L_G``.
  ``eps`` > 0 bounds it; ``z1`` and ``z2`` must differ (independent draws do almost surely).
  Returns a scalar tensor.
  """
  ratio = (tf.reduce_mean(tf.abs(images_1 - images_2)) /
           tf.reduce_mean(tf.abs(noise_1 - noise_2)))
  return 1.0 / (ratio + eps)


def _median(values):
  """Median (upper) of a 1-D tensor; 0 when it is empty (logging only)."""
  values = tf.sort(tf.reshape(values, [-1]))
  n = tf.shape(values)[0]
  return tf.cond(n > 0, lambda: values[n // 2], lambda: tf.constant(0.0, values.dtype))


def sample(generator, num_samples, *, labels=None, seed=0):
  """Images from a (saved and reloaded) generator, without any private data.

  Args:
    generator: a generator Keras model (``noise`` or ``[noise, one_hot_label]`` inputs).
    num_samples: integer >= 1.
    labels: for a conditional generator: ``None`` (cycle through the classes ``0, 1, ...``)
      or ``[num_samples]`` integer labels in ``[0, K)``; must be None for an unconditional one.
    seed: integer in [0, 2**62): the noise ``N(0, I)`` is drawn from it (deterministic).

  Returns:
    ``(images, labels)``: float32 numpy ``[num_samples, *image_shape]`` (in [0, 1] for a
    sigmoid output) and int32 ``[num_samples]`` labels (None when unconditional).
  """
  num_samples = _checks.check_integer("num_samples", num_samples, minimum=1)
  seed = _checks.check_integer("seed", seed, minimum=0, maximum=2**62 - 1)
  inputs = generator.inputs
  latent_dim = int(inputs[0].shape[-1])
  rng = tf.random.Generator.from_seed(seed)
  z = rng.normal([num_samples, latent_dim])
  if len(inputs) == 1:
    if labels is not None:
      raise ValueError("labels must be None for an unconditional generator.")
    out = generator.predict(z, batch_size=1000, verbose=0)
    return np.asarray(out, np.float32), None
  num_classes = int(inputs[1].shape[-1])
  if labels is None:
    labels = np.arange(num_samples) % num_classes
  labels = np.asarray(labels)
  if labels.shape != (num_samples,) or not np.issubdtype(labels.dtype, np.integer) or (
      labels.min() < 0 or labels.max() >= num_classes):
    raise ValueError(f"labels must be {num_samples} integers in [0, {num_classes}), got "
                     f"{labels.dtype} {labels.shape}.")
  onehot = np.eye(num_classes, dtype=np.float32)[labels]
  out = generator.predict([z, onehot], batch_size=1000, verbose=0)
  return np.asarray(out, np.float32), labels.astype(np.int32)
