"""Pieces shared by the MNIST tutorials: flags, data, the CNN, and the privacy report."""
from __future__ import annotations

import numpy as np
from absl import flags

from analysis import pld_accountant  # noqa: F401  (imported so a missing extra fails early)
from tf_dpkit.budget import PrivacyLedger
from tf_dpkit.data import mnist, poisson_batches, shuffled_batches
from mnist_cnn import cnn_layers  # noqa: F401  (re-exported for the tutorials)

FLAGS = flags.FLAGS


def define_flags(default_learning_rate=0.15):
  """Flags of the seed tutorial plus sampling, budget and slicing flags."""
  flags.DEFINE_boolean("dpsgd", True, "Train with DP-SGD; --nodpsgd trains without privacy.")
  flags.DEFINE_float("learning_rate", default_learning_rate, "Learning rate.")
  flags.DEFINE_float("noise_multiplier", 1.1, "Noise std / clip norm.")
  flags.DEFINE_float("l2_norm_clip", 1.0, "Per-microbatch clip norm.")
  flags.DEFINE_integer("batch_size", 256, "(Expected) batch size.")
  flags.DEFINE_integer("epochs", 60, "Number of epochs (N / batch_size steps each).")
  flags.DEFINE_integer("microbatches", None,
                       "Microbatches per batch; default: one per example. Needs --sampling=shuffle.")
  flags.DEFINE_enum("sampling", "poisson", ["poisson", "shuffle"],
                    "poisson: each example joins each batch with probability batch_size/N (the "
                    "accountant's assumption). shuffle: shuffle-and-batch, accounted without "
                    "amplification.")
  flags.DEFINE_float("delta", 1e-5, "Delta at which epsilon is reported.")
  flags.DEFINE_float("target_epsilon", None,
                     "Train to a budget: pick the noise multiplier for this epsilon and stop "
                     "before exceeding it.")
  flags.DEFINE_enum("accountant", "rdp", ["rdp", "pld"],
                    "The accountant that calibrates the noise to --target_epsilon, stops "
                    "training at it and gives the per-epoch epsilon: rdp (Renyi DP) or pld "
                    "(privacy loss distributions: a tighter upper bound, so less noise for the "
                    "same epsilon). The final line prints both epsilons.")
  flags.DEFINE_bool("validation", False,
                    "Tuning split: train on the first 50,000 training images and report "
                    "validation_accuracy on the last 10,000 (the test set is not used; "
                    "--train_size / --test_size then slice these two parts).")
  flags.DEFINE_integer("train_size", None, "Use only the first N training examples (tests).")
  flags.DEFINE_integer("test_size", None, "Use only the first N test examples (tests).")
  flags.DEFINE_integer("seed", 0, "Seed for weight initialisation (public; not for sampling).")
  flags.DEFINE_integer("sampling_seed", None,
                       "Seed of the batch sampler. Default: a secret seed from the OS entropy "
                       "source, as the privacy analysis needs; set it only for reproducible "
                       "experiments (a known sampling seed reveals batch membership).")


#: Training images kept for training under --validation; the rest are the validation split.
VALIDATION_TRAIN_SIZE = 50_000


def load_mnist():
  """Returns float32 images in [0, 1] with a channel axis and int32 labels, sliced by flags
  (``--validation``: the last 10,000 training images take the test set's place)."""
  (x_train, y_train), (x_test, y_test) = mnist.load()
  if FLAGS.validation:
    x_test, y_test = x_train[VALIDATION_TRAIN_SIZE:], y_train[VALIDATION_TRAIN_SIZE:]
    x_train, y_train = x_train[:VALIDATION_TRAIN_SIZE], y_train[:VALIDATION_TRAIN_SIZE]
  x_train, y_train = x_train[:FLAGS.train_size], y_train[:FLAGS.train_size]
  x_test, y_test = x_test[:FLAGS.test_size], y_test[:FLAGS.test_size]
  prep = lambda x: (x.astype(np.float32) / 255.0)[..., None]
  return (prep(x_train), y_train.astype(np.int32)), (prep(x_test), y_test.astype(np.int32))


def setup():
  """Validates flags, seeds Keras, loads MNIST: returns ``(train, test, n, steps_per_epoch)``."""
  import keras  # pylint: disable=g-import-not-at-top
  validate_flags()
  keras.utils.set_random_seed(FLAGS.seed)
  train, test = load_mnist()
  n = len(train[0])
  return train, test, n, steps_per_epoch(n)


def steps_per_epoch(n):
  """Steps per epoch: N // batch_size (full batches; Poisson batches have this many in expectation)."""
  return max(1, n // FLAGS.batch_size)


def validate_flags():
  if FLAGS.microbatches is not None and FLAGS.sampling == "poisson":
    raise flags.ValidationError(
        "--microbatches needs --sampling=shuffle: Poisson batches have variable size, so they "
        "are clipped per example.")


def ledger():
  """An empty privacy ledger at --delta that composes with --accountant (the accountant that
  also calibrated the noise and stops training at --target_epsilon)."""
  return PrivacyLedger(FLAGS.delta, FLAGS.accountant)


def noise_multiplier(n, also=()):
  """The flag's noise multiplier, or the calibrated one when --target_epsilon is given (by
  --accountant, with the events ``also`` of other mechanisms on the same records composed into
  the budget)."""
  if FLAGS.target_epsilon is None:
    return FLAGS.noise_multiplier
  from tf_dpkit.budget import noise_multiplier_for_budget  # pylint: disable=g-import-not-at-top
  sigma = noise_multiplier_for_budget(FLAGS.target_epsilon, FLAGS.delta, n, FLAGS.batch_size,
                                      FLAGS.epochs, accountant=FLAGS.accountant,
                                      sampling=FLAGS.sampling,
                                      microbatch_size=microbatch_size(), also=also)
  print(f"Train to a budget: noise_multiplier={sigma:.4f} meets epsilon={FLAGS.target_epsilon} "
        f"at delta={FLAGS.delta} by {FLAGS.accountant.upper()} accounting for {FLAGS.epochs} "
        "epochs" + (" composed with the feature statistics." if also else "."))
  return sigma


def train_batches(train, steps):
  """The training batches ``(x, y, weight)`` for ``steps`` steps: Poisson-sampled (default) or
  shuffled, as ``--sampling`` says, with the secret (or ``--sampling_seed``) sampling seed."""
  if FLAGS.sampling == "poisson":
    return poisson_batches(train, expected_batch_size=FLAGS.batch_size, steps=steps,
                           seed=FLAGS.sampling_seed)
  return shuffled_batches(train, FLAGS.batch_size, FLAGS.epochs, FLAGS.sampling_seed)


def microbatch_size():
  """Examples per microbatch: batch_size // microbatches, or 1 (per-example clipping)."""
  return FLAGS.batch_size // FLAGS.microbatches if FLAGS.microbatches else 1


def record_steps(accountant, n, sigma, steps):
  """Records ``steps`` steps of this run's sampling in ``accountant``."""
  accountant.record(FLAGS.batch_size / n, sigma, steps, sampling=FLAGS.sampling,
                    microbatch_size=microbatch_size(), steps_per_epoch=steps_per_epoch(n))


def sampling_note():
  if FLAGS.sampling == "poisson":
    return "Poisson sampling (the accountant's assumption holds)"
  return "shuffle-and-batch: no amplification by sampling claimed (q=1 per epoch)"


def accuracy_name():
  """What the evaluation split's accuracy is called in the printed lines."""
  return "validation_accuracy" if FLAGS.validation else "test_accuracy"


def print_final_report(accountant: PrivacyLedger, test_accuracy: float, steps=None):
  """Prints epsilon from RDP and PLD for what was recorded, in one parseable line (for
  shuffled batches both are the exact Gaussian-mechanism epsilon); ``steps``: the training
  steps to print when the ledger also holds other mechanisms (default: the ledger's steps)."""
  state = accountant.state_dict()
  rdp = PrivacyLedger.from_state_dict({**state, "accountant": "rdp"}).epsilon()
  pld = PrivacyLedger.from_state_dict({**state, "accountant": "pld"}).epsilon()
  steps = accountant.steps if steps is None else steps
  print(f"final: steps={steps} {accuracy_name()}={test_accuracy:.4f} "
        f"epsilon_rdp={rdp:.4f} epsilon_pld={pld:.4f} delta={accountant.delta:g} "
        f"sampling={FLAGS.sampling}")
  if FLAGS.sampling == "poisson":
    print(f"Trained with {sampling_note()}: ({rdp:.2f}, {accountant.delta:g})-DP by RDP "
          f"accounting, ({pld:.2f}, {accountant.delta:g})-DP by PLD accounting.")
  else:  # one Gaussian mechanism: both accountants report its exact epsilon
    print(f"Trained with {sampling_note()}: ({rdp:.2f}, {accountant.delta:g})-DP exactly (the "
          "epochs compose to one Gaussian mechanism; analytic Gaussian, Balle & Wang 2018).")
