"""PATE-GAN: a GAN whose generator learns from a student trained on noisy teacher votes.

Jordon, Yoon & van der Schaar, ICLR 2019, Algorithm 1, with the aggregators of
:mod:`tf_dpkit.pate` and the accountant of :mod:`analysis.pate`.  One iteration: teacher
discriminators, each trained only on its own disjoint shard of the private data (all in one
batched Keras model); a student discriminator trained only on GENERATED examples labelled
real/fake by a GNMax vote of the teachers (secret noise key, each answer recorded in
:attr:`PATEGAN.accountant`); one generator step against the student.  Replace-one adjacency:
one changed record changes one teacher, i.e. moves one vote per query.

:meth:`PATEGAN.epsilon` is the data-independent epsilon (publishable; it drives the
``target_epsilon`` stop); :meth:`PATEGAN.data_dependent_epsilon` is itself private;
:meth:`PATEGAN.sanitized_epsilon` is the smooth-sensitivity release.  Teachers, raw votes and
the noise key are never released or logged.  Custom teacher models must keep teachers apart
(:func:`check_teachers_isolated`).  Fake labels of a conditional model are uniform (public).

Design, the privacy argument and the known limitation on images: docs/design/generative.md.
"""
from __future__ import annotations

import math
import time
import types

import keras
import numpy as np
import tensorflow as tf

from analysis import _checks, calibration
from analysis import events as _events
from analysis import pate as pate_analysis
from tf_dpkit import _autograph
from tf_dpkit.clipping import fast_path
from tf_dpkit.generative import dpgan as _dpgan
from tf_dpkit.generative import networks as _networks
from tf_dpkit.generative import release as _release
from tf_dpkit.pate import aggregators as _aggregators
from tf_dpkit.pate import teachers as _teachers
from tf_dpkit.pate.partition import partition_indices
from tf_dpkit.pate.votes import as_votes

PATE_AGGREGATORS = ("gnmax",)
VOTES = ("threshold", "rank")
_GENERATOR_TERM = _dpgan._generator_term  # pylint: disable=protected-access
#: Column of the vote histogram per teacher decision: 0 = "fake", 1 = "real".
FAKE, REAL = 0, 1


def teacher_ensemble_discriminator(num_teachers, num_classes=None, image_shape=(28, 28, 1),
                                   hidden=(64,), conv_filters=(), kernel_size=5,
                                   row_statistics=False, name="teacher_discriminators"):
  """``num_teachers`` discriminators in one batched Keras model (no weight sharing).

  Inputs: ``image [B, T, *image_shape]`` (teacher ``t`` reads slice ``[:, t]``) and, when
  ``num_classes`` is set, ``one_hot_label [B, T, K]``.  Each teacher: (for rows that are
  sequences, ``conv_filters`` non-empty: the row as ``[L, 1]`` -> (TeacherConv1D(F,
  kernel_size, stride 2) -> LeakyReLU(0.2)) per ``F`` of ``conv_filters``; or, with
  ``row_statistics``, the row's four :class:`~tf_dpkit.generative.networks.RowStatistics`,
  computed per teacher slice from that slice alone) -> flatten ->
  concatenate the label -> (TeacherDense(width) -> LeakyReLU(0.2)) per ``hidden`` width ->
  TeacherDense(1); output: logits ``[B, T]``.  ``TeacherDense`` computes ``x[b, t] @ W[t] +
  bias[t]`` and ``TeacherConv1D`` convolves slice ``t`` with teacher ``t``'s kernel, so teacher
  ``t``'s output depends on slice ``t`` and on its own weights only.

  Args:
    num_teachers: T, an integer >= 2.
    num_classes: None or K >= 2.
    image_shape: tuple of integers >= 1; ``(L,)`` when ``conv_filters`` is non-empty.
    hidden: tuple of layer widths, each an integer >= 1 (may be empty: a linear teacher).
    conv_filters: tuple of integers >= 1 (default empty: an MLP teacher).
    kernel_size: integer >= 1, the convolutions' width.
    row_statistics: bool; True: each teacher reads only the row's level, spread and roughness
      (rows of length >= 3; not with ``conv_filters``).  A teacher with a few records on a
      four-number summary generalises where an MLP on the raw row memorises its shard
      (docs/design/generative.md, "Tables").
  """
  num_teachers = _checks.check_integer("num_teachers", num_teachers, minimum=2)
  if num_classes is not None:
    num_classes = _checks.check_integer("num_classes", num_classes, minimum=2)
  shape = tuple(image_shape)
  if not shape or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape):
    raise ValueError(f"image_shape must be a tuple of integers >= 1, got {image_shape!r}.")
  hidden = tuple(hidden)
  for i, width in enumerate(hidden):
    _checks.check_integer(f"hidden[{i}]", width, minimum=1)
  conv_filters = tuple(conv_filters)
  for i, width in enumerate(conv_filters):
    _checks.check_integer(f"conv_filters[{i}]", width, minimum=1)
  kernel_size = _checks.check_integer("kernel_size", kernel_size, minimum=1)
  if conv_filters and len(shape) != 1:
    raise ValueError(f"conv_filters needs rows, image_shape=(L,), got {image_shape!r}.")
  if not isinstance(row_statistics, bool):
    raise ValueError(f"row_statistics must be True or False, got {row_statistics!r}.")
  if row_statistics and (conv_filters or len(shape) != 1 or shape[0] < 3):
    raise ValueError("row_statistics needs rows of length >= 3, image_shape=(L,), and no "
                     f"conv_filters; got image_shape={image_shape!r}, "
                     f"conv_filters={conv_filters!r}.")
  teacher_dense, _, _ = _teachers._layers()  # pylint: disable=protected-access
  image = keras.Input((num_teachers, *shape), name="image")
  inputs = [image]
  h = image
  if conv_filters:
    h = keras.layers.Reshape((num_teachers, shape[0], 1))(h)
    for width in conv_filters:
      h = keras.layers.LeakyReLU(0.2)(
          _teachers.teacher_conv1d_layer()(num_teachers, width, kernel_size, 2)(h))
  if row_statistics:
    h = _networks.RowStatistics(name="row_statistics")(h)  # [B, T, L] -> [B, T, 4]
  h = keras.layers.Reshape((num_teachers, -1))(h)
  if num_classes is not None:
    label = keras.Input((num_teachers, num_classes), name="one_hot_label")
    inputs.append(label)
    h = keras.layers.Concatenate()([h, label])
  for width in hidden:
    h = keras.layers.LeakyReLU(0.2)(teacher_dense(num_teachers, width)(h))
  h = teacher_dense(num_teachers, 1)(h)
  out = keras.layers.Reshape((num_teachers,), name="logits")(h)
  return keras.Model(inputs if len(inputs) > 1 else image, out, name=name)


def check_teachers_isolated(teachers, num_teachers, image_shape, num_classes=None, seed=0):
  """Raises ``ValueError`` unless teacher ``t``'s output reads only input slice ``t`` and
  weights that no other teacher's output reads (a probe on random inputs).

  On two random inputs (``N(0, 1)`` images, random one-hot labels, from ``seed``) the gradient
  of output ``t`` (summed over the batch) is taken with respect to the inputs and to every
  trainable weight: it must vanish on every input slice ``s != t``, and the weight entries
  with a non-zero gradient must be disjoint between teachers.  A layer that mixes the teacher
  axis, or a weight shared by two teachers (e.g. a plain ``Dense`` on ``[B, k, d]``), fails.
  The probe can miss sharing that a gradient happens not to reveal at these two points (e.g.
  dead ReLU units), never report sharing that is not there.
  """
  rng = np.random.default_rng(seed)
  x = tf.constant(rng.normal(size=(2, num_teachers, *image_shape)), tf.float32)
  inputs = [x]
  if num_classes is not None:
    labels = rng.integers(0, num_classes, (2, num_teachers))
    inputs.append(tf.constant(np.eye(num_classes, dtype=np.float32)[labels]))
  variables = teachers.trainable_variables
  with tf.GradientTape(persistent=True) as tape:
    tape.watch(inputs)
    out = teachers(inputs if len(inputs) > 1 else x, training=False)  # [2, k]
    per_teacher = [tf.reduce_sum(out[:, t]) for t in range(num_teachers)]
  owner = [np.full(v.shape, -1) for v in variables]
  for t in range(num_teachers):
    grads = tape.gradient(per_teacher[t], inputs + list(variables),
                          unconnected_gradients=tf.UnconnectedGradients.ZERO)
    for g in grads[:len(inputs)]:
      g = np.abs(g.numpy())
      others = np.delete(g, t, axis=1)
      if others.any():
        raise ValueError(
            f"teachers: output {t} depends on the input slices of other teachers (found by "
            "differentiating each output with respect to the inputs). One record could then "
            "move many votes; every teacher must read its own slice [:, t] only.")
    for i, g in enumerate(grads[len(inputs):]):
      touched = np.abs(g.numpy()) > 0
      clash = touched & (owner[i] >= 0) & (owner[i] != t)
      if clash.any():
        raise ValueError(
            f"teachers: weight {variables[i].name!r} is read by teacher {t} and by teacher "
            f"{int(owner[i][clash][0])}: a weight shared between teachers is trained on "
            "several shards, so one record could move many votes. Give every teacher its own "
            "weights (teacher_ensemble_discriminator, TeacherDense).")
      owner[i][touched] = t
  del tape


def _unit_event(aggregator, noise_scale):
  """The ledger event ``analysis.pate.PateAccountant`` records for ONE answer (data-independent)."""
  del aggregator  # "gnmax" only
  scratch = pate_analysis.PateAccountant()
  scratch.compose_gnmax([1, 0], noise_scale)
  (event,) = scratch.ledger.events
  return event


def data_independent_epsilon(num_queries, noise_scale, delta, aggregator="gnmax", *, also=()):
  """Publishable epsilon (nats) at ``delta`` of ``num_queries`` PATE answers.

  Exactly what :meth:`analysis.pate.PateAccountant.data_independent_epsilon` reports after
  ``num_queries`` GNMax answers of noise std ``noise_scale`` votes (RDP ``lambda / s^2`` per
  answer): the accountant's own ledger event for one answer, self-composed, then composed
  with the events ``also``.

  Args:
    num_queries: integer >= 0.
    noise_scale: finite, > 0 (votes).
    delta: in (0, 1).
    aggregator: ``"gnmax"`` (the only one offered; module docstring).
    also: :mod:`analysis.events` events of further data-independent mechanisms on the same
      records under the same (replace-one) adjacency, composed with the answers, e.g. the
      ``GaussianEvent`` of a private checkpoint choice (:mod:`tf_dpkit.selection`).
  """
  num_queries = _checks.check_integer("num_queries", num_queries, minimum=0)
  noise_scale = _checks.check_finite_positive("noise_scale", noise_scale)
  delta = _checks.check_delta("delta", delta)
  aggregator = _checks.check_choice("aggregator", aggregator, PATE_AGGREGATORS)
  also = tuple(also)
  for event in also:
    if not isinstance(event, _events.DpEvent):
      raise ValueError(f"also must hold analysis.events events, got {event!r}.")
  if num_queries == 0 and not also:
    return 0.0
  total = pate_analysis.PateAccountant()
  if num_queries:
    total.compose(_events.SelfComposedEvent(_unit_event(aggregator, noise_scale), num_queries))
  for event in also:
    total.compose(event)
  return total.data_independent_epsilon(delta)


def affordable_queries(target_epsilon, noise_scale, delta, aggregator="gnmax", *, also=()):
  """Largest number of answers whose :func:`data_independent_epsilon` (with ``also``) is <=
  target (None if more than 2**40 fit)."""
  target_epsilon = _checks.check_finite_positive("target_epsilon", target_epsilon)
  also = tuple(also)  # read many times below
  fits = lambda n: (data_independent_epsilon(n, noise_scale, delta, aggregator, also=also)
                    <= target_epsilon)
  affordable = calibration.largest_count_that_fits(fits, start=1)
  return None if affordable is None else max(affordable, 0)


def noise_scale_for_budget(target_epsilon, num_queries, delta, aggregator="gnmax", *, also=()):
  """Smallest noise scale (votes, to 0.1% relative) at which ``num_queries`` answers have
  :func:`data_independent_epsilon` (composed with ``also``) <= ``target_epsilon`` (finite,
  > 0)."""
  target_epsilon = _checks.check_finite_positive("target_epsilon", target_epsilon)
  num_queries = _checks.check_integer("num_queries", num_queries, minimum=1)
  also = tuple(also)
  if also and data_independent_epsilon(0, 1.0, delta, aggregator, also=also) >= target_epsilon:
    raise ValueError(f"target_epsilon={target_epsilon} is out of reach: the events in also "
                     f"alone spend it at delta={delta}.")
  eps = lambda s: data_independent_epsilon(num_queries, s, delta, aggregator, also=also)
  low, high = 1e-3, 1.0
  while eps(high) > target_epsilon:
    low, high = high, high * 2.0
    if high > 1e12:
      raise ValueError(f"target_epsilon={target_epsilon} is out of reach for "
                       f"{num_queries} queries.")
  while high / low > 1.001:
    mid = math.sqrt(low * high)
    low, high = (low, mid) if eps(mid) <= target_epsilon else (mid, high)
  return high


def _streaming_aggregator(name, noise_scale, seed, accountant):
  """An aggregator of tf_dpkit.pate whose votes are replaced per batch of queries.

  The aggregator's secret key, its draw counter (fresh noise per call) and its recording into
  ``accountant`` are those of :class:`tf_dpkit.pate.GNMax`;
  only the sealed histograms change between calls.
  """
  base = {"gnmax": _aggregators.GNMax}[name]

  class Streaming(base):  # pylint: disable=missing-class-docstring
    def answer(self, counts):
      self._votes = as_votes(counts)  # pylint: disable=attribute-defined-outside-init
      return self.query(np.arange(self._votes.num_queries))

  return Streaming(np.zeros((0, 2), np.int64), noise_scale, seed=seed, accountant=accountant)


class PATEGAN:
  """PATE-GAN training of a Keras generator and student discriminator (module docstring).

  Args:
    generator: a built functional or Sequential Keras model, ``noise -> image`` or
      ``[noise, one_hot_label] -> image`` (``num_classes`` set).
    student: a built Keras model ``image -> logit [B, 1]`` (``[image, one_hot_label]`` when
      conditional).  It is trained on generated examples only, so any layer is allowed.
    latent_dim: integer >= 1, the generator's noise size; noise is ``N(0, I)``.
    num_teachers: k, an integer >= 2 (and <= the number of records, checked by :meth:`fit`).
    num_classes: None or K >= 2 (labels one-hot, private).
    noise_scale: the GNMax noise std in votes, finite and > 0, or None for NO noise
      (noiseless majority votes: epsilon = inf, a non-private baseline; nothing is recorded in
      the accountant).
    aggregator: ``"gnmax"`` (the only one offered; module docstring).
    teacher_hidden: widths of the teachers' hidden layers (:func:`teacher_ensemble_discriminator`).
    teachers: None (build the MLP ensemble) or a batched Keras model with the interface of
      :func:`teacher_ensemble_discriminator` (output ``[B, k]``) in which output ``t`` depends
      only on input slice ``t`` and teacher ``t``'s own weights: refused when
      :func:`check_teachers_isolated`'s probe finds otherwise, or when a layer mixes examples
      (BatchNormalization; module docstring).
    teacher_batch_size: real (and fake) examples per teacher per teacher step, integer >= 1.
    teacher_steps: integers >= 1 per iteration.
    student_steps: see ``teacher_steps`` (described together).
    student_batch_size: generated examples labelled by the teachers per student step (PATE
      queries), integer >= 1.
    generator_batch_size: examples per generator step, integer >= 1.
    teacher_learning_rate: finite, > 0 (Adam).
    student_learning_rate: see ``teacher_learning_rate`` (described together).
    generator_learning_rate: see ``teacher_learning_rate`` (described together).
    beta_1: Adam's first-moment decay in [0, 1).
    seed: integer in [0, 2**62): public seed of the latent noise, fake labels and teacher
      minibatch positions.  Weight initialisation is the caller's (``keras.utils.set_random_seed``).
    noise_seed: None (a secret key from the OS entropy source, never written anywhere) or an
      integer in [0, 2**62) for reproducible aggregator noise (tests only).
    partition_seed: None (drawn from OS entropy) or an integer: the public permutation of
      record positions into shards.
    vote: how a teacher votes on a batch of ``n`` queries: ``"threshold"`` (the paper's: real
      iff its logit is > 0) or ``"rank"`` (real on the ``ceil(vote_fraction * n)`` queries it
      finds most real; a relative signal that does not vanish when the teachers reject every
      generated example).  Both are functions of one teacher and the public queries, so the
      sensitivity (one moved vote per query) is the same.
    vote_fraction: in (0, 1], for ``vote="rank"``.
    teacher_class_balance: conditional models: draw each teacher's real rows class-balanced
      from its OWN shard (:meth:`teacher_batch`), so that real and fake rows have the same
      (uniform) label frequencies and the teachers do not learn the label prior instead of
      the rows.  Uses each shard's own labels only: the privacy argument is unchanged.
    query_noise: std (finite, >= 0; default 0, the paper's) of public Gaussian noise added
      to each generated example before the teachers label it for the student: the student
      then learns the teachers' preference AROUND the generator's samples, not only at them
      (a generator that ascends a student fitted on its own samples alone runs into the
      student's extrapolation).  Public randomness: no privacy cost.
    query_scale_noise: std ``s`` (finite, >= 0; default 0) of a public log-normal rescaling of
      each query about its own mean: ``x <- m + (x - m) exp(s e)``, ``e ~ N(0, 1)`` per query,
      ``m`` the mean of that query's entries (applied before ``query_noise``; not clipped, so
      a rescaled query may leave the generator's [0, 1] range).  The student
      then also learns which AMPLITUDE the teachers accept, on both sides of the generator's
      own, so a threshold vote is not "fake" on every query while the generator's amplitude is
      wrong (docs/design/generative.md, "Tables").  Public randomness: no privacy cost.
    delta: in (0, 1), at which epsilon is reported and the budget enforced.

  Attributes:
    accountant: the :class:`analysis.pate.PateAccountant`; one query per labelled student
      example.
    teachers: the batched teacher model (private: never save or publish it).
  """

  def __init__(self, generator, student, *, latent_dim, num_teachers, num_classes=None,
               noise_scale, aggregator="gnmax", teacher_hidden=(64,), teachers=None,
               teacher_batch_size=16, teacher_steps=1, student_steps=1, student_batch_size=64,
               generator_batch_size=64, teacher_learning_rate=2e-4, student_learning_rate=2e-4,
               generator_learning_rate=2e-4, beta_1=0.5, seed=0, noise_seed=None,
               partition_seed=None, vote="threshold", vote_fraction=0.5,
               teacher_class_balance=False, query_noise=0.0, query_scale_noise=0.0,
               delta=1e-5):
    _dpgan.check_built_models(generator=generator, student=student)
    self.latent_dim = _checks.check_integer("latent_dim", latent_dim, minimum=1)
    self.num_teachers = _checks.check_integer("num_teachers", num_teachers, minimum=2)
    self.num_classes = (None if num_classes is None else
                        _checks.check_integer("num_classes", num_classes, minimum=2))
    self.aggregator = _checks.check_choice("aggregator", aggregator, PATE_AGGREGATORS)
    if noise_scale is None:
      self.noise_scale = None
    else:
      self.noise_scale = _checks.check_finite_positive("noise_scale", noise_scale)
    self.teacher_batch_size = _checks.check_integer("teacher_batch_size", teacher_batch_size,
                                                    minimum=1)
    self.teacher_steps = _checks.check_integer("teacher_steps", teacher_steps, minimum=1)
    self.student_steps = _checks.check_integer("student_steps", student_steps, minimum=1)
    self.student_batch_size = _checks.check_integer("student_batch_size", student_batch_size,
                                                    minimum=1)
    self.generator_batch_size = _checks.check_integer("generator_batch_size",
                                                      generator_batch_size, minimum=1)
    lrs = {}
    for name, value in (("teacher_learning_rate", teacher_learning_rate),
                        ("student_learning_rate", student_learning_rate),
                        ("generator_learning_rate", generator_learning_rate)):
      lrs[name] = _checks.check_finite_positive(name, value)
    self.beta_1 = _checks.check_real("beta_1", beta_1)
    if not 0.0 <= self.beta_1 < 1.0:
      raise ValueError(f"beta_1 must be in [0, 1), got {beta_1!r}.")
    self.seed = _checks.check_integer("seed", seed, minimum=0, maximum=2**62 - 1)
    if noise_seed is not None:
      _checks.check_integer("noise_seed", noise_seed, minimum=0, maximum=2**62 - 1)
    if partition_seed is not None:
      partition_seed = _checks.check_integer("partition_seed", partition_seed, minimum=0,
                                             maximum=2**63 - 1)
    self.partition_seed = partition_seed
    self.delta = _checks.check_delta("delta", delta)
    self.vote = _checks.check_choice("vote", vote, VOTES)
    if not isinstance(teacher_class_balance, bool):
      raise ValueError(f"teacher_class_balance must be True or False, got "
                       f"{teacher_class_balance!r}.")
    self.teacher_class_balance = teacher_class_balance
    self.query_noise = _checks.check_finite_nonnegative("query_noise", query_noise)
    self.query_scale_noise = _checks.check_finite_nonnegative("query_scale_noise",
                                                              query_scale_noise)
    self.vote_fraction = _checks.check_probability("vote_fraction", vote_fraction,
                                                   allow_zero=False)
    self.generator, self.student = generator, student
    # The DP-GAN shape checks, with the student in the discriminator's place.
    view = types.SimpleNamespace(generator=generator, discriminator=student,
                                 num_classes=self.num_classes, latent_dim=self.latent_dim)
    try:
      _dpgan.DPGAN._check_shapes(view)  # pylint: disable=protected-access
    except ValueError as error:
      raise ValueError(f"{error} (PATE-GAN: 'discriminator' here is the student.)") from None
    self.image_shape = view.image_shape
    custom_teachers = teachers is not None
    if teachers is None:
      teachers = teacher_ensemble_discriminator(self.num_teachers, self.num_classes,
                                                self.image_shape, teacher_hidden)
    else:
      self._check_teachers(teachers)
    self.teacher_hidden = None if custom_teachers else tuple(teacher_hidden)
    self.teachers = teachers
    self.teacher_learning_rate = lrs["teacher_learning_rate"]
    self.student_learning_rate = lrs["student_learning_rate"]
    self.generator_learning_rate = lrs["generator_learning_rate"]
    self.accountant = pate_analysis.PateAccountant(num_teachers=self.num_teachers)
    self._aggregator = (None if self.noise_scale is None else _streaming_aggregator(
        self.aggregator, self.noise_scale, noise_seed, self.accountant))
    adam = lambda lr: keras.optimizers.Adam(learning_rate=lr, beta_1=self.beta_1)
    self.teacher_optimizer = adam(self.teacher_learning_rate)
    self.student_optimizer = adam(self.student_learning_rate)
    self.generator_optimizer = adam(self.generator_learning_rate)
    self.teacher_optimizer.build(self.teachers.trainable_variables)
    self.student_optimizer.build(student.trainable_variables)
    self.generator_optimizer.build(generator.trainable_variables)
    self._rng = tf.random.Generator.from_seed(self.seed)
    self._positions = np.random.default_rng(self.seed)  # teacher minibatch positions (public)
    self._t_step = _autograph.function(self._teacher_step)
    self._votes_fn = _autograph.function(self._teacher_votes)
    self._s_step = _autograph.function(self._student_step)
    self._g_step = _autograph.function(self._generator_step)
    self.history: list[dict] = []
    self.shards = None

  # -- checks ----------------------------------------------------------------------------------

  def _check_teachers(self, teachers):
    if not isinstance(teachers, keras.Model) or not getattr(teachers, "inputs", None):
      raise ValueError("teachers must be a built functional or Sequential keras.Model (see "
                       "teacher_ensemble_discriminator), got "
                       f"{type(teachers).__name__}.")
    mixing = fast_path.example_mixing_layers(teachers)
    if mixing:
      raise ValueError(
          f"teachers layer {mixing[0].name!r} is BatchNormalization. In a batched teacher "
          "ensemble its statistics are taken over the batch AND the teacher axis, so every "
          "teacher's output would depend on every shard and one record could move many votes: "
          "PATE-GAN refuses it (normalisation within one teacher would be fine, but this layer "
          "does not do that). Use teacher_ensemble_discriminator or layers that act on each "
          "teacher's slice alone.")
    wanted = 1 if self.num_classes is None else 2
    if len(teachers.inputs) != wanted:
      raise ValueError(f"teachers must take {wanted} input(s) (image [B, k, ...]"
                       f"{', one_hot_label [B, k, K]' if wanted == 2 else ''}), it has "
                       f"{len(teachers.inputs)}.")
    shape_of = _dpgan._static_shape  # pylint: disable=protected-access
    if shape_of(teachers.inputs[0]) != (self.num_teachers, *self.image_shape):
      raise ValueError(f"teachers' image input must have shape [B, {self.num_teachers}, "
                       f"{', '.join(map(str, self.image_shape))}], got "
                       f"{teachers.inputs[0].shape}.")
    if shape_of(teachers.outputs[0]) != (self.num_teachers,):
      raise ValueError(f"teachers must output one logit per teacher, shape [B, "
                       f"{self.num_teachers}], got {teachers.outputs[0].shape}.")
    check_teachers_isolated(teachers, self.num_teachers, self.image_shape, self.num_classes)

  # -- public randomness -----------------------------------------------------------------------

  def _latent(self, batch):
    return _dpgan.public_latent(self._rng, batch, self.latent_dim, self.num_classes)

  def _inputs(self, first, labels):
    return _dpgan.model_inputs(first, labels)

  def _per_teacher(self, x, y):
    """Tiles ``[B, ...]`` public examples to every teacher: ``[B, k, ...]``."""
    tile = lambda t: tf.repeat(tf.expand_dims(t, 1), self.num_teachers, axis=1)
    return tile(x), None if y is None else tile(y)

  # -- the three steps ---------------------------------------------------------------------------

  def _teacher_step(self, x_real, y_real):
    """One step of every teacher; ``x_real [b, k, ...]``: slice ``t`` from shard ``t`` only."""
    z, y_fake = self._latent(self.teacher_batch_size)
    x_fake = tf.stop_gradient(self.generator(self._inputs(z, y_fake), training=True))
    x_fake, y_fake = self._per_teacher(x_fake, y_fake)
    variables = self.teachers.trainable_variables
    with tf.GradientTape() as tape:
      # Sum over teachers of each teacher's own mean loss: gradients stay per teacher.
      loss = tf.reduce_sum(self.teacher_losses(x_real, y_real, x_fake, y_fake))
    grads = tape.gradient(loss, variables)
    self.teacher_optimizer.apply(grads, variables)
    return loss / self.num_teachers  # PRIVATE (computed from real data): never logged

  def teacher_losses(self, x_real, y_real, x_fake, y_fake):
    """Each teacher's own loss, ``[k]``: ``mean_b softplus(-T_t(x_real[b, t], y_real[b, t]))
    + mean_b softplus(T_t(x_fake[b, t], y_fake[b, t]))``.  Teacher ``t``'s entry (and hence its
    gradient) reads slice ``t`` of the real batch only (tests/tf_dpkit/
    test_generative_privacy.py checks this by differentiating the gradient).  PRIVATE."""
    real = self.teachers(self._inputs(x_real, y_real), training=True)  # [b, k]
    fake = self.teachers(self._inputs(x_fake, y_fake), training=True)
    return (tf.reduce_mean(tf.math.softplus(-real), 0) +
            tf.reduce_mean(tf.math.softplus(fake), 0))

  def _teacher_votes(self, x, y):
    """PRIVATE noiseless vote counts ``[n, 2]`` (fake, real) on public examples.

    ``vote="threshold"``: teacher ``t`` votes real on query ``j`` iff its logit is > 0.
    ``vote="rank"``: teacher ``t`` votes real on the ``ceil(vote_fraction * n)`` queries of the
    batch with its highest logits (ties by position).  Either way teacher ``t``'s votes are a
    function of its own weights and the public queries only.
    """
    xt, yt = self._per_teacher(x, y)
    logits = self.teachers(self._inputs(xt, yt), training=False)  # [n, k]
    if self.vote == "threshold":
      real_votes = tf.cast(logits > 0.0, tf.int64)
    else:
      n = tf.shape(logits)[0]
      top = tf.cast(tf.math.ceil(self.vote_fraction * tf.cast(n, tf.float32)), tf.int32)
      order = tf.argsort(tf.transpose(logits), axis=1, direction="DESCENDING", stable=True)
      ranks = tf.argsort(order, axis=1, stable=True)  # rank of each query per teacher
      real_votes = tf.transpose(tf.cast(ranks < top, tf.int64))
    real = tf.reduce_sum(real_votes, axis=1)
    return tf.stack([self.num_teachers - real, real], axis=1)

  def _queries(self):
    """Public generated examples for the student (one PATE query each)."""
    z, y = self._latent(self.student_batch_size)
    x = self.generator(self._inputs(z, y), training=True)
    if self.query_scale_noise:
      factor = tf.exp(self.query_scale_noise * self._rng.normal(tf.shape(x)[:1]))
      x = _release._rescaled(x, factor)  # pylint: disable=protected-access
    if self.query_noise:
      x = x + self.query_noise * self._rng.normal(tf.shape(x))
    return x, y

  def _student_step(self, x, y, labels):
    """One student step on GENERATED examples and their released labels (1 = real)."""
    with tf.GradientTape() as tape:
      logits = self.student(self._inputs(x, y), training=True)[..., 0]
      loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(
          tf.cast(labels, tf.float32), logits))
    variables = self.student.trainable_variables
    self.student_optimizer.apply(tape.gradient(loss, variables), variables)
    return {"student_loss": loss}

  def _generator_step(self):
    """One generator step against the student (never the teachers, never real data)."""
    z, y = self._latent(self.generator_batch_size)
    with tf.GradientTape() as tape:
      x = self.generator(self._inputs(z, y), training=True)
      logits = self.student(self._inputs(x, y), training=False)
      loss = tf.reduce_mean(_GENERATOR_TERM("standard", logits))
    variables = self.generator.trainable_variables
    self.generator_optimizer.apply(tape.gradient(loss, variables), variables)
    return {"generator_loss": loss}

  def label_queries(self, x, y=None):
    """Releases one noisy teacher label (1 = real, 0 = fake) per public example and records
    each answer in :attr:`accountant`.

    Args:
      x: ``[n, *image_shape]`` PUBLIC examples (generated ones in training; never real data:
        the labels are released).
      y: ``[n, K]`` one-hot labels (conditional) or None.

    Returns:
      int64 ``[n]`` labels.  Without noise (``noise_scale=None``): the noiseless majority
      (ties: fake, as the aggregators' argmax), nothing recorded.
    """
    counts = self._votes_fn(tf.convert_to_tensor(x, tf.float32),
                            None if y is None else tf.convert_to_tensor(y, tf.float32)).numpy()
    if self._aggregator is None:
      return np.argmax(counts, axis=1).astype(np.int64)
    return self._aggregator.answer(counts).labels

  # -- training --------------------------------------------------------------------------------

  @property
  def queries_per_iteration(self) -> int:
    return self.student_steps * self.student_batch_size

  def epsilon(self) -> float:
    """PUBLISHABLE data-independent epsilon (nats) at :attr:`delta` of the answers so far
    (inf without noise; 0 before any answer)."""
    if self.noise_scale is None:
      return math.inf
    return data_independent_epsilon(self.accountant.queries, self.noise_scale, self.delta,
                                     self.aggregator)

  def data_dependent_epsilon(self) -> float:
    """PRIVATE data-dependent epsilon at :attr:`delta` (PATE 2018 bound at the actual votes):
    computed from the private data; never publish it (module docstring)."""
    if self.noise_scale is None:
      return math.inf
    return self.accountant.private_data_dependent_epsilon(self.delta)

  def sanitized_epsilon(self, *, beta, sigma_ss, order, rng=None):
    """PUBLISHABLE smooth-sensitivity release of the data-dependent epsilon
    (:meth:`analysis.pate.PateAccountant.smooth_sensitivity_epsilon` at :attr:`delta`; fix
    ``beta``, ``sigma_ss``, ``order`` without looking at the data; each call is a new release).
    """
    if self.noise_scale is None:
      raise ValueError("sanitized_epsilon needs noise_scale > 0 (without noise epsilon = inf).")
    return self.accountant.smooth_sensitivity_epsilon(self.delta, beta, sigma_ss, order,
                                                      rng=rng)

  def _prepare(self, x, y):
    x = np.asarray(x, np.float32)
    if x.ndim < 1 or x.shape[0] < 1 or tuple(x.shape[1:]) != self.image_shape:
      raise ValueError(f"x must have shape [N >= 1, {', '.join(map(str, self.image_shape))}], "
                       f"got {x.shape}.")
    n = x.shape[0]
    if n < self.num_teachers:
      raise ValueError(f"num_teachers={self.num_teachers} is more than the N={n} records: "
                       "every teacher needs a non-empty shard; use num_teachers <= N.")
    if self.num_classes is None:
      if y is not None:
        raise ValueError("y must be None for an unconditional PATE-GAN (num_classes=None).")
      return x, None
    if y is None:
      raise ValueError(f"y (labels in [0, {self.num_classes})) is required when "
                       f"num_classes={self.num_classes}.")
    y = np.asarray(y)
    if y.shape != (n,) or not np.issubdtype(y.dtype, np.integer):
      raise ValueError(f"y must be an integer array of shape [N={n}], got {y.dtype} {y.shape}.")
    if y.min() < 0 or y.max() >= self.num_classes:
      raise ValueError(f"y must hold labels in [0, {self.num_classes}), got values in "
                       f"[{y.min()}, {y.max()}].")
    return x, np.eye(self.num_classes, dtype=np.float32)[y]

  def teacher_batch(self, x, y_onehot, rng):
    """Each teacher's real minibatch: ``[b, k, ...]``, slice ``t`` drawn (with replacement,
    positions from the public ``rng``) from shard ``t`` only: uniformly over the shard, or,
    with ``teacher_class_balance``, each row's class first drawn uniformly (as the fake
    labels are), then a row of that class of shard ``t`` (any row of the shard if it holds
    none).  Either way slice ``t`` is a function of shard ``t`` and public randomness."""
    b = self.teacher_batch_size
    if self.teacher_class_balance and y_onehot is not None:
      labels = np.argmax(y_onehot, axis=1)
      columns = []
      for shard in self.shards:
        wanted = rng.integers(0, self.num_classes, b)
        draws = rng.random(b)
        column = np.empty(b, np.int64)
        for c in range(self.num_classes):
          slots = wanted == c
          pool = shard[labels[shard] == c]
          pool = pool if len(pool) else shard
          column[slots] = pool[(draws[slots] * len(pool)).astype(np.int64)]
        columns.append(column)
      picks = np.stack(columns, axis=1)
    else:
      picks = np.stack([shard[rng.integers(0, len(shard), b)] for shard in self.shards], axis=1)
    xb = tf.convert_to_tensor(x[picks])  # [b, k, ...]
    yb = None if y_onehot is None else tf.convert_to_tensor(y_onehot[picks])
    return xb, yb

  def fit(self, x, y=None, *, iterations, target_epsilon=None, log_every=100, callback=None,
          verbose=True):
    """Trains until ``iterations`` iterations are done or the budget is spent.

    With ``target_epsilon`` (nats, at :attr:`delta`; ``None`` or ``inf``: no budget) training
    stops before the iteration whose ``queries_per_iteration`` answers would take the
    DATA-INDEPENDENT epsilon above it; the number of iterations is therefore fixed in advance
    by public settings (module docstring).

    Args:
      x: ``[N, *image_shape]`` private images (N >= num_teachers).
      y: ``[N]`` integer labels in ``[0, num_classes)`` (required iff conditional).
      iterations: integer >= 1.
      target_epsilon: None or a number > 0 (inf allowed).
      log_every: integer >= 1; callback: None or ``f(logs)``; verbose: print the logs.

    Returns:
      A dict: ``epsilon`` (publishable, data-independent), ``delta``, ``queries`` (answers so
      far), ``iterations`` (this call), ``stopped_by_budget``, ``noise_scale``, ``seconds``.
    """
    iterations = _checks.check_integer("iterations", iterations, minimum=1)
    log_every = _checks.check_integer("log_every", log_every, minimum=1)
    if target_epsilon is not None:
      target_epsilon = _checks.check_positive("target_epsilon", target_epsilon)
    if callback is not None and not callable(callback):
      raise ValueError(f"callback must be None or callable, got {callback!r}.")
    x, y_onehot = self._prepare(x, y)
    planned = iterations
    if target_epsilon is not None and target_epsilon != math.inf:
      if self.noise_scale is None:
        raise ValueError(f"target_epsilon={target_epsilon} cannot be met with "
                         "noise_scale=None (no noise: epsilon = inf); set noise_scale > 0 or "
                         "target_epsilon=None/inf.")
      affordable = affordable_queries(target_epsilon, self.noise_scale, self.delta,
                                      self.aggregator)
      if affordable is not None:
        iterations = min(iterations, (affordable - self.accountant.queries)
                         // self.queries_per_iteration)
      if iterations <= 0:
        raise ValueError(
            f"target_epsilon={target_epsilon} does not allow one more iteration of "
            f"{self.queries_per_iteration} PATE answers at noise_scale={self.noise_scale} and "
            f"delta={self.delta} (epsilon so far {self.epsilon():.4f}); raise target_epsilon "
            "or noise_scale, or lower student_steps * student_batch_size.")
    if self.shards is None:
      self.shards = partition_indices(len(x), self.num_teachers, seed=self.partition_seed)
    rng = self._positions
    start = time.time()
    logs = {}
    for it in range(1, iterations + 1):
      for _ in range(self.teacher_steps):
        self._t_step(*self.teacher_batch(x, y_onehot, rng))
      real_fraction = 0.0
      for _ in range(self.student_steps):
        xq, yq = self._queries()
        labels = self.label_queries(xq, yq)
        real_fraction += float(labels.mean()) / self.student_steps
        s_logs = self._s_step(xq, yq, tf.convert_to_tensor(labels))
      g_logs = self._g_step()
      if it % log_every == 0 or it == iterations:
        logs = {"iteration": it, "queries": self.accountant.queries, "epsilon": self.epsilon(),
                "seconds": round(time.time() - start, 1),
                "released_real_fraction": real_fraction}
        # Only public quantities: the teachers' loss is computed from real data and is not
        # logged (nor returned).
        logs.update({k: float(v) for k, v in {**s_logs, **g_logs}.items()})
        self.history.append(logs)
        if verbose:
          print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                         for k, v in logs.items()), flush=True)
        if callback is not None:
          callback(dict(logs))
    stopped = iterations < planned
    if stopped and verbose:
      print(f"PATEGAN: stopped after {iterations} iterations: one more iteration of "
            f"{self.queries_per_iteration} answers would exceed target_epsilon={target_epsilon}"
            f" (data-independent) at delta={self.delta}; epsilon now {self.epsilon():.4f}.",
            flush=True)
    return {"epsilon": self.epsilon(), "delta": self.delta, "queries": self.accountant.queries,
            "iterations": iterations, "stopped_by_budget": stopped,
            "noise_scale": self.noise_scale, "seconds": round(time.time() - start, 1)}

  def get_config(self) -> dict:
    """Public settings (JSON-serialisable); never the noise key, votes or teachers."""
    return {
        "latent_dim": self.latent_dim, "num_teachers": self.num_teachers,
        "num_classes": self.num_classes, "noise_scale": self.noise_scale,
        "aggregator": self.aggregator,
        "teacher_hidden": None if self.teacher_hidden is None else list(self.teacher_hidden),
        "teacher_batch_size": self.teacher_batch_size, "teacher_steps": self.teacher_steps,
        "student_steps": self.student_steps, "student_batch_size": self.student_batch_size,
        "generator_batch_size": self.generator_batch_size,
        "teacher_learning_rate": self.teacher_learning_rate,
        "student_learning_rate": self.student_learning_rate,
        "generator_learning_rate": self.generator_learning_rate, "beta_1": self.beta_1,
        "seed": self.seed, "partition_seed": self.partition_seed, "vote": self.vote,
        "vote_fraction": self.vote_fraction,
        "teacher_class_balance": self.teacher_class_balance, "query_noise": self.query_noise,
        "query_scale_noise": self.query_scale_noise, "delta": self.delta,
    }
