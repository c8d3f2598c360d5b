"""DP-SGD on MNIST with Keras ``model.fit`` (tf_dpkit.DPSequential).

    python tutorials/mnist_dpsgd_tutorial.py --epochs=15 --noise_multiplier=1.3 \
        --l2_norm_clip=1.5 --learning_rate=0.25

Batches are Poisson-sampled by default, so the epsilon printed after each epoch (from the
``PrivacyBudget`` callback) is the one the accountant's assumption really supports.

``--adaptive_clipping`` lets the clip norm follow the ``--target_quantile`` of the per-example
gradient norms, starting from ``--l2_norm_clip`` (``tf_dpkit.AdaptiveClipping``); the noise
multiplier is split between the clipped sum and the noisy count of unclipped examples, so the
epsilon is the same as with a fixed clip.  The clip norm is printed after each epoch.

``--gradient_accumulation_steps=k`` trains virtual batches: ``--batch_size`` is the logical
batch, fed as k physical chunks and noised once (``tf_dpkit.optimizers.accumulation``); the
epsilon is the same as without k.

``--dtype_policy=mixed_float16`` (or ``mixed_bfloat16``) trains under that Keras mixed-precision
policy, with float32 logits; per-example norms and clipping stay in float32, and float16 uses
the DP optimizer's static loss scale (``tf_dpkit.dp_models``), never Keras's dynamic one.

``--recipe=best`` trains the tuned configuration that reaches about 98% test accuracy at
epsilon 3 (``recipes.py`` lists its values; explicit flags override them): tanh activations
(``--activation``), clip 0.1, expected batch 2048 for 40 epochs with the noise calibrated to
``--target_epsilon`` (default 3.0), SGD with ``--momentum=0.8``, a constant-then-linear
learning-rate tail (``--lr_schedule=linear_decay_tail``) and an exponential moving average of
the weights (``--ema_momentum=0.99``), with which every per-epoch test accuracy and the final
model are evaluated (``tf_dpkit.recipe``).  None of these changes the epsilon.

    python tutorials/mnist_dpsgd_tutorial.py --recipe=best                      # epsilon 3
    python tutorials/mnist_dpsgd_tutorial.py --recipe=best --target_epsilon=1   # 1024 x 15 epochs

``--features=scattering`` trains Tramer & Boneh's (2021) small CNN on the 81 x 7 x 7 scattering
transform of each image (``tf_dpkit.features.scattering_2d``: fixed filters, each image on its
own, no privacy cost), standardised per channel with statistics released by the Gaussian
mechanism (``tf_dpkit.features.private_channel_normalization``, ``--normalization_*`` flags);
their cost is recorded in the run's ledger and composed into the noise calibration, so the
epsilon printed covers both.  ``--recipe=scatternet`` sets the tuned values (``recipes.py``).
``--validation`` trains on the first 50,000 training images and reports accuracy on the last
10,000 instead of the test set (how the recipes were tuned).  ``--accountant=pld`` calibrates
the noise to ``--target_epsilon`` and stops training at it by PLD accounting (a tighter upper
bound than RDP, so less noise); the final line prints both epsilons either way.

    python tutorials/mnist_dpsgd_tutorial.py --recipe=scatternet                      # epsilon 3
    python tutorials/mnist_dpsgd_tutorial.py --recipe=scatternet --target_epsilon=1
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

import common  # noqa: E402
import recipes  # noqa: E402
import tf_dpkit  # noqa: E402
from mnist_cnn import ACTIVATIONS, scatternet_cnn_layers  # noqa: E402
from tf_dpkit import recipe as recipe_lib  # noqa: E402
from tf_dpkit import features as features_lib  # noqa: E402
from tf_dpkit.budget import PrivacyBudget  # noqa: E402

FLAGS = common.FLAGS
common.define_flags()
flags.DEFINE_enum("per_example_method", "auto", ["auto", "fast", "vectorized"],
                  "How DPSequential gets per-example gradients (for speed comparisons only; "
                  "the result is the same).")
flags.DEFINE_bool("adaptive_clipping", False,
                  "Adaptive clipping: the clip norm starts at --l2_norm_clip and tracks the "
                  "--target_quantile of per-example gradient norms (same epsilon).")
flags.DEFINE_float("target_quantile", 0.5, "Adaptive clipping: fraction of examples left "
                   "unclipped, in (0, 1).")
flags.DEFINE_float("clip_learning_rate", 0.2, "Adaptive clipping: the clip norm changes by a "
                   "factor of at most exp(this) per step.")
flags.DEFINE_float("count_noise_stddev", None, "Adaptive clipping: std of the noise on the "
                   "count of unclipped examples (default: (expected) batch size, or "
                   "microbatches, / 20).")
flags.DEFINE_integer("gradient_accumulation_steps", 1,
                     "k >= 1: split each (logical) batch of --batch_size into k physical chunks, "
                     "accumulate their clipped sums and add noise once per logical batch.",
                     lower_bound=1)
flags.DEFINE_enum("dtype_policy", "float32", ["float32", "mixed_float16", "mixed_bfloat16"],
                  "Keras dtype policy of the model (mixed precision: float32 variables, "
                  "half-precision compute, float32 logits).")
flags.DEFINE_enum("recipe", "none", list(recipes.RECIPES),
                  "best: the tuned configuration of recipes.py (tanh, clip 0.1, batch 2048, 40 "
                  "epochs, target epsilon 3, momentum, EMA, learning-rate tail); scatternet: the "
                  "same ingredients on --features=scattering; flags given explicitly override "
                  "their values.")
flags.DEFINE_enum("activation", "relu", list(ACTIVATIONS), "Activation of the CNN's hidden "
                  "layers (tanh: the tempered sigmoid of Papernot et al. 2020).")
flags.DEFINE_float("momentum", 0.0, "SGD momentum in [0, 1) (Keras's rule; post-processing).",
                   lower_bound=0.0, upper_bound=0.999999)
flags.DEFINE_float("ema_momentum", None, "Exponential moving average of the weights with this "
                   "momentum in [0, 1] (Keras use_ema); test accuracy is evaluated with the "
                   "averaged weights every epoch and the final model is the average. Default: "
                   "off.", lower_bound=0.0, upper_bound=1.0)
flags.DEFINE_enum("features", "pixels", ["pixels", "scattering"],
                  "pixels: the CNN on the images. scattering: Tramer & Boneh's CNN on the "
                  "81 x 7 x 7 scattering transform (J=2, L=8; tf_dpkit.features, no privacy cost), "
                  "standardised per channel with private statistics whose cost is composed "
                  "into epsilon.")
flags.DEFINE_float("normalization_noise_multiplier", 8.0,
                   "--features=scattering: noise multiplier of each of the two noisy sums of the "
                   "per-channel statistics (tf_dpkit.features.private_channel_normalization).")
flags.DEFINE_float("normalization_mean_clip", 0.2,
                   "--features=scattering: L2 clip of a record's 81 channel means.")
flags.DEFINE_float("normalization_second_moment_clip", 0.06,
                   "--features=scattering: L2 clip of a record's 81 channel mean squares.")
flags.DEFINE_enum("lr_schedule", "constant", ["constant", "linear_decay_tail"],
                  "linear_decay_tail: --learning_rate, then linear over the last quarter of the "
                  "steps towards 0, floored at a tenth (tf_dpkit.recipe.LinearDecayTail).")

#: The flags a recipe may set (recipes.py).
_RECIPE_FLAGS = ("target_epsilon", "noise_multiplier", "activation", "l2_norm_clip", "momentum",
                 "ema_momentum", "batch_size", "epochs", "learning_rate", "lr_schedule",
                 "features", "normalization_noise_multiplier", "normalization_mean_clip",
                 "normalization_second_moment_clip")


class EpochReport(keras.callbacks.Callback):
  """Prints test accuracy and epsilon after each epoch."""

  def __init__(self):
    super().__init__()
    self.start = time.time()

  def on_epoch_end(self, epoch, logs=None):
    eps = logs.get("epsilon")
    eps_text = f" epsilon={eps:.4f}" if eps is not None else ""
    clip = logs.get("l2_norm_clip")
    eps_text += f" l2_norm_clip={clip:.4f}" if clip is not None else ""
    print(f"epoch {epoch + 1}: loss={logs['loss']:.4f} "
          f"{common.accuracy_name()}={logs['val_accuracy']:.4f}"
          f"{eps_text} elapsed={time.time() - self.start:.1f}s", flush=True)


def _cnn_layers(channels=None):
  """The tutorial CNN (``channels``: the ScatterNet CNN on that many feature channels); under a
  mixed-precision policy its logits are cast to float32."""
  if channels is None:
    layers = common.cnn_layers(keras, FLAGS.activation)
  else:
    layers = scatternet_cnn_layers(keras, FLAGS.activation, channels)
  if FLAGS.dtype_policy != "float32":
    layers.append(keras.layers.Activation("linear", dtype="float32"))
  return layers


def _adaptive_clipping():
  """The --adaptive_clipping settings, or None."""
  if not FLAGS.adaptive_clipping:
    return None
  count_noise = FLAGS.count_noise_stddev
  if count_noise is None:  # the paper's (expected) examples, or microbatches, per step / 20
    count_noise = (FLAGS.microbatches or FLAGS.batch_size) / 20
  return tf_dpkit.AdaptiveClipping(FLAGS.target_quantile, FLAGS.clip_learning_rate,
                                   count_noise)


def _apply_recipe():
  """Sets the flags of ``--recipe`` that were not given explicitly (recipes.resolve)."""
  if FLAGS.recipe == "none":
    return
  given = {name: FLAGS[name].value for name in _RECIPE_FLAGS if FLAGS[name].present}
  values = recipes.resolve(FLAGS.recipe, given)
  for name, value in values.items():
    if name not in given:
      FLAGS[name].value = value
  shown = " ".join(f"{name}={getattr(FLAGS, name)}" for name in _RECIPE_FLAGS
                   if name != "noise_multiplier" or FLAGS.target_epsilon is None)
  print(f"Recipe {FLAGS.recipe}: {shown} (explicit flags: {sorted(given) or 'none'})",
        flush=True)


def _optimizer_options(steps):
  """Keras optimizer keyword arguments of --momentum, --ema_momentum and --lr_schedule (all
  post-processing or data-independent: the epsilon does not change; tf_dpkit.recipe);
  ``steps``: optimizer iterations per epoch."""
  options = {"learning_rate": FLAGS.learning_rate}
  if FLAGS.lr_schedule == "linear_decay_tail":
    options["learning_rate"] = recipe_lib.LinearDecayTail(FLAGS.learning_rate,
                                                          total_steps=steps * FLAGS.epochs)
  if FLAGS.momentum:
    options["momentum"] = FLAGS.momentum
  if FLAGS.ema_momentum is not None:
    options.update(use_ema=True, ema_momentum=FLAGS.ema_momentum)
  return options


def main(argv):
  del argv
  _apply_recipe()
  _check_feature_flags()
  keras.mixed_precision.set_global_policy(FLAGS.dtype_policy)
  (x_train, y_train), (x_test, y_test), n, steps = common.setup()
  ledger = common.ledger()
  channels, also = None, ()
  if FLAGS.features == "scattering":
    x_train, x_test, statistics = _scattering_features(x_train, x_test, ledger)
    channels = x_train.shape[-1]
    also = () if statistics is None else (statistics.event,)
  loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
  callbacks = [EpochReport()]
  if FLAGS.ema_momentum is not None:  # validation (the per-epoch test accuracy) on the average
    callbacks.insert(0, recipe_lib.EMAEvaluation())
    print(f"Test accuracy is evaluated with the exponential moving average of the weights "
          f"(momentum {FLAGS.ema_momentum}).", flush=True)
  budget = None
  if FLAGS.dpsgd:
    sigma = common.noise_multiplier(n, also)
    model = tf_dpkit.DPSequential(_cnn_layers(channels))
    model.per_example_method = FLAGS.per_example_method
    poisson = FLAGS.sampling == "poisson"
    optimizer = tf_dpkit.DPGradientDescentGaussianOptimizer(
        l2_norm_clip=FLAGS.l2_norm_clip, noise_multiplier=sigma,
        num_microbatches=FLAGS.microbatches, adaptive_clipping=_adaptive_clipping(),
        expected_batch_size=FLAGS.batch_size if poisson else None,
        gradient_accumulation_steps=FLAGS.gradient_accumulation_steps,
        **_optimizer_options(steps))
    budget = PrivacyBudget(FLAGS.batch_size / n, target_epsilon=FLAGS.target_epsilon,
                           sampling=FLAGS.sampling, steps_per_epoch=steps,
                           batch_size=FLAGS.batch_size, accountant=ledger)
    callbacks.insert(0, budget)
  else:
    model = keras.Sequential(_cnn_layers(channels))
    optimizer = keras.optimizers.SGD(  # Keras's own accumulation: no noise to keep apart
        gradient_accumulation_steps=FLAGS.gradient_accumulation_steps
        if FLAGS.gradient_accumulation_steps > 1 else None,
        # Keras's iterations count micro-steps here (the DP optimizer's count logical steps).
        **_optimizer_options(steps * FLAGS.gradient_accumulation_steps))
  model.compile(optimizer=optimizer, loss=loss, metrics=["accuracy"])
  k = FLAGS.gradient_accumulation_steps
  if k == 1:
    train = common.train_batches((x_train, y_train), steps * FLAGS.epochs).prefetch(2)
  else:  # passed as made, so PrivacyBudget can check it is one logical batch split k ways
    train = _split_batches((x_train, y_train), steps * FLAGS.epochs, k)
  test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(1024)
  history = model.fit(train, epochs=FLAGS.epochs, steps_per_epoch=steps * k,
                      validation_data=test, callbacks=callbacks, shuffle=False, verbose=0)
  accuracy = history.history["val_accuracy"][-1]
  if budget is not None:
    # The ledger also holds the feature statistics (two steps of q = 1) when --features=scattering.
    common.print_final_report(budget.accountant, accuracy,
                              steps=int(optimizer.iterations.numpy()))
  else:
    print(f"final: steps={int(optimizer.iterations.numpy())} "
          f"{common.accuracy_name()}={accuracy:.4f} "
          "(non-private: no privacy guarantee)")


def _check_feature_flags():
  """Refuses normalisation settings out of range before anything is computed."""
  for name in ("normalization_noise_multiplier", "normalization_mean_clip",
               "normalization_second_moment_clip"):
    value = getattr(FLAGS, name)
    if not (np.isfinite(value) and value > 0):
      raise app.UsageError(f"--{name} must be finite and > 0, got {value}.")
  if FLAGS.features == "scattering" and FLAGS.dtype_policy != "float32":
    raise app.UsageError("--features=scattering trains in float32 only (--dtype_policy=float32).")


def _scattering_features(x_train, x_test, ledger):
  """The scattering features of both splits, standardised per channel, channels last, and the
  released statistics (recorded in ``ledger``; None without DP, where exact ones are used)."""
  start = time.time()
  f_train = features_lib.scattering_2d(x_train)
  f_test = features_lib.scattering_2d(x_test)
  print(f"Scattering transform (J=2, L=8): {f_train.shape[1]} x {f_train.shape[2]} x "
        f"{f_train.shape[3]} features per image in {time.time() - start:.1f}s (no privacy cost: "
        "fixed filters, each image on its own).", flush=True)
  if FLAGS.dpsgd:
    statistics = features_lib.private_channel_normalization(
        f_train, mean_clip=FLAGS.normalization_mean_clip,
        second_moment_clip=FLAGS.normalization_second_moment_clip,
        noise_multiplier=FLAGS.normalization_noise_multiplier, ledger=ledger)
    print(f"Private per-channel statistics: noise multiplier "
          f"{FLAGS.normalization_noise_multiplier} on each of two sums (alone epsilon "
          f"{ledger.epsilon():.4f} at delta={FLAGS.delta}; composed into the budget); "
          f"{int(np.sum(statistics.variance == 0))} of {len(statistics.variance)} channels have "
          "a released variance of 0 and are set to 0.", flush=True)
    standardise = statistics.apply
  else:  # no privacy: the exact statistics
    statistics = None
    mean = f_train.mean(axis=(0, 2, 3), keepdims=True)
    std = np.sqrt(f_train.var(axis=(0, 2, 3), keepdims=True) + 1e-5)
    standardise = lambda f: (f - mean) / std
  to_keras = lambda f: np.moveaxis(standardise(f), 1, -1).astype(np.float32)
  return to_keras(f_train), to_keras(f_test), statistics


def _split_batches(train, steps, k):
  """``common.train_batches`` with every logical batch emitted as k chunks."""
  if FLAGS.microbatches is not None:
    raise flags.ValidationError("--gradient_accumulation_steps > 1 needs per-example clipping "
                                "(leave --microbatches unset).")
  if FLAGS.sampling == "poisson":
    return tf_dpkit.data.poisson_batches(train, expected_batch_size=FLAGS.batch_size,
                                         steps=steps, seed=FLAGS.sampling_seed,
                                         gradient_accumulation_steps=k)
  return tf_dpkit.data.shuffled_batches(train, FLAGS.batch_size, FLAGS.epochs,
                                        FLAGS.sampling_seed, gradient_accumulation_steps=k)


if __name__ == "__main__":
  app.run(main)
