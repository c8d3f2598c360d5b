"""TensorFlow Privacy's Keras names and signatures, implemented by tf_dpkit.

Changing the imports of code written for TF Privacy 0.9.0 is enough
(``from tf_dpkit.compat import tf_privacy as tensorflow_privacy``).  Every name has TF Privacy's
parameters, order and defaults; what would mean something else raises ``ValueError`` /
``TypeError`` naming the argument and the change, before any noise is drawn.  Nothing here
clips, noises or accounts by a rule of its own (tf_dpkit's optimizers, models and ``analysis``
do).  The contract and the differences on purpose: docs/design/compat_tf_privacy.md; the
migration guide: docs/migration_from_tf_privacy.md.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
import math
import textwrap
import types

import keras
import tensorflow as tf

from analysis import _checks
from analysis import calibration
from analysis import compute_dp_sgd_privacy as _privacy_lib
from tf_dpkit import _autograph
from tf_dpkit import dp_models as _models
from tf_dpkit.optimizers import accumulation as _accumulation
from tf_dpkit.optimizers import is_dp_optimizer, make_gaussian_optimizer_class
from tf_dpkit.optimizers.certificate import NOT_PRIVATE_MESSAGE

__all__ = [
    "DPKerasSGDOptimizer", "DPKerasAdamOptimizer", "DPKerasAdagradOptimizer",
    "make_keras_optimizer_class", "VectorizedDPKerasSGDOptimizer",
    "VectorizedDPKerasAdamOptimizer", "VectorizedDPKerasAdagradOptimizer",
    "make_vectorized_keras_optimizer_class", "DPModel", "DPSequential", "make_dp_model_class",
    "AccountantType", "compute_dp_sgd_privacy_statement", "compute_dp_sgd_privacy",
    "compute_noise", "compute_noise_from_budget", "compute_dp_sgd_privacy_lib",
    "compute_noise_from_budget_lib",
]

_PACKAGE = "tf_dpkit.compat.tf_privacy"

#: The error a plain Keras model gets from ``fit`` with one of these optimizers (Keras 3).
KERAS3_FIT_MESSAGE = (
    "{cls} received gradients that did not come from its differentially private path, so "
    "applying them would train WITHOUT privacy. Under Keras 3, Model.fit hands the optimizer "
    "gradients already averaged over the batch, so a DP optimizer alone cannot make a plain "
    "tf.keras.Sequential / tf.keras.Model private (TF Privacy's Keras 2 optimizers recomputed "
    "per-microbatch gradients from the unreduced loss). One-line change: build the model with "
    "`model = tf_dpkit.DPSequential([...same layers...])` instead of "
    "`tf.keras.Sequential([...])` (or `tf_dpkit.DPModel(inputs, outputs)` instead of "
    "`tf.keras.Model(inputs, outputs)`) and keep this optimizer and loss in compile(); or, as "
    "in TF Privacy's DPSequential tutorial, "
    "`tf_dpkit.compat.tf_privacy.DPSequential(l2_norm_clip=..., noise_multiplier=..., "
    "layers=[...])` compiled with a plain Keras optimizer. In a custom training loop call "
    "`optimizer.minimize(vector_loss, var_list, tape=tape)`.")


# ------------------------------------------------------------------------------------------
# Optimizers.

def _check_no_grad_loss(grad_loss):
  if grad_loss is not None:
    raise ValueError("grad_loss is not supported: the DP optimizer differentiates the vector "
                     "loss itself (one entry per example); pass grad_loss=None.")


class _TFPrivacyOptimizer:
  """Mixin placed before a tf_dpkit Keras DP class: TF Privacy's argument order and methods."""

  def _tfp_init(self, l2_norm_clip, noise_multiplier, num_microbatches, accumulation, args,
                kwargs):
    steps = _accumulation.check_accumulation_steps(accumulation)  # None (Keras configs): 1
    sigma = noise_multiplier
    if steps > 1:
      # TF Privacy noised each of the k micro-steps (std sigma C, divided by the micro-step's
      # microbatches) and applied the mean of the k results: the logical batch's clipped sum
      # carries N(0, k sigma^2 C^2 I) over k M microbatches.  tf_dpkit's accumulation releases
      # the same sum once, so noise multiplier sigma sqrt(k) gives the same distribution (and
      # is the one TF Privacy said to account with).
      sigma = _checks.check_finite_nonnegative("noise_multiplier", noise_multiplier)
      sigma *= math.sqrt(steps)
      kwargs["gradient_accumulation_steps"] = steps
    type(self)._tfp_dp_class.__init__(self, l2_norm_clip, sigma, num_microbatches, *args,
                                      **kwargs)
    # TF Privacy's argument, for get_config (the optimizer's noise_multiplier is tf_dpkit's).
    self._tfp_noise_multiplier = (self.noise_multiplier if steps == 1 else
                                  float(noise_multiplier))

  def get_config(self):
    config = super().get_config()
    config["noise_multiplier"] = self._tfp_noise_multiplier
    return config

  @_autograph.graph_code
  def compute_gradients(self, loss, var_list, tape=None):
    """Private gradients ``[(grad, var), ...]`` of a vector loss (see tf_dpkit's class).

    As in TF Privacy, ``var_list`` may be a zero-argument callable returning the variables; it
    is called after a callable ``loss`` (so variables the loss creates exist by then).
    """
    if callable(var_list):
      if callable(loss):
        with tf.GradientTape() as tape:
          loss = _autograph.user_function(loss)()
      var_list = _autograph.user_function(var_list)()
    return super().compute_gradients(loss, var_list, tape=tape)

  @_autograph.graph_code
  def _compute_gradients(self, loss, var_list, grad_loss=None, tape=None):
    """TF Privacy's (Keras 2) name: ``compute_gradients``; ``grad_loss`` must be None."""
    _check_no_grad_loss(grad_loss)
    return self.compute_gradients(loss, var_list, tape=tape)

  @_autograph.graph_code
  def minimize(self, loss, var_list, grad_loss=None, name=None, tape=None):
    """``compute_gradients`` then ``apply_gradients`` (Keras 2's signature; ``name`` unused)."""
    del name
    _check_no_grad_loss(grad_loss)
    return super().minimize(loss, var_list, tape=tape)

  @_autograph.graph_code
  def apply(self, grads, trainable_variables=None):
    try:
      return super().apply(grads, trainable_variables)
    except ValueError as error:
      if str(error) == NOT_PRIVATE_MESSAGE.format(cls=type(self).__name__):
        raise ValueError(KERAS3_FIT_MESSAGE.format(cls=type(self).__name__)) from None
      raise


class _TFPrivacyVectorizedOptimizer(_TFPrivacyOptimizer):
  """TF Privacy's vectorized variant: the same step (tf_dpkit clips microbatches by one
  Jacobian or its fast per-layer path either way), with ``unconnected_gradients_to_zero``."""

  def get_config(self):
    config = super().get_config()
    config["unconnected_gradients_to_zero"] = self._tfp_unconnected_to_zero
    return config


def _optimizer_doc(name, base, vectorized):
  fourth = ("unconnected_gradients_to_zero: bool, default False. Accepted either way: tf_dpkit "
            "always gives a variable the loss does not reach a zero clipped gradient plus "
            "noise (DP-SGD noises every coordinate), where TF Privacy with False left such "
            "variables without a gradient." if vectorized else
            "gradient_accumulation_steps: k, an integer >= 1, default 1. With k > 1 the "
            "weights change every k-th call (the mean of k micro-batches' updates), as in TF "
            "Privacy, whose noise (sigma C added at each micro-step) is reproduced exactly: "
            "tf_dpkit accumulates the clipped sums and adds noise once with noise multiplier "
            "sigma * sqrt(k), which the optimizer's ``noise_multiplier`` reports and the "
            "accountant uses (TF Privacy's own advice); ``iterations`` counts logical steps.")
  return f"""TF Privacy's ``{name}``: tf_dpkit's DP ``keras.optimizers.{base.__name__}``.

    ``{name}(l2_norm_clip, noise_multiplier, num_microbatches=None, {fourth.split(':')[0]}=...,
    *args, **kwargs)``, the rest going to ``keras.optimizers.{base.__name__}`` (e.g.
    ``learning_rate``; tf_dpkit's ``seed=`` and ``expected_batch_size=`` are accepted too).

    Args:
      l2_norm_clip: C, finite > 0: each microbatch gradient is clipped to L2 norm C.
      noise_multiplier: sigma, finite >= 0: noise N(0, (sigma C)^2 I) is added to the clipped
        sum, which is then divided by the number of microbatches.
      num_microbatches: None (one microbatch per example, default) or M >= 1 dividing the
        batch; microbatch j holds examples [j B/M, (j+1) B/M), its loss is their mean.
      {fourth}

    Give it a vector loss (``reduction=None`` / ``tf.losses.Reduction.NONE``).  With
    ``model.fit`` use ``tf_dpkit.DPSequential`` / ``DPModel`` (Keras 3: see the module
    docstring).
    """


def _make_compat_optimizer_class(cls, vectorized):
  if not isinstance(cls, type):
    raise TypeError(f"Expected an optimizer class (e.g. tf.keras.optimizers.SGD), got {cls!r}.")
  if cls.__name__ == "LegacyOptimizerWarning":
    raise TypeError(
        "Keras 3 has no legacy optimizers (tf.keras.optimizers.legacy.*): pass the Keras 3 "
        "class, e.g. tf.keras.optimizers.SGD (the DP arguments do not change).")
  if not issubclass(cls, keras.optimizers.Optimizer):
    raise TypeError(
        "TF Privacy's Keras optimizer factories take a Keras optimizer class (a subclass of "
        f"tf.keras.optimizers.Optimizer), got {cls.__module__}.{cls.__name__}. For "
        "tf.compat.v1.train optimizers use tf_dpkit.make_gaussian_optimizer_class(cls).")
  dp_cls = make_gaussian_optimizer_class(cls)
  prefix = "VectorizedDPKeras" if vectorized else "DPKeras"
  name = f"{prefix}{cls.__name__}Optimizer"
  if vectorized:
    def __init__(self, l2_norm_clip, noise_multiplier, num_microbatches=None,
                 unconnected_gradients_to_zero=False, *args, **kwargs):
      if not isinstance(unconnected_gradients_to_zero, bool):
        raise TypeError("unconnected_gradients_to_zero must be True or False, got "
                        f"{unconnected_gradients_to_zero!r}.")
      self._tfp_init(l2_norm_clip, noise_multiplier, num_microbatches, 1, args, kwargs)
      self._tfp_unconnected_to_zero = unconnected_gradients_to_zero
    mixin = _TFPrivacyVectorizedOptimizer
  else:
    def __init__(self, l2_norm_clip, noise_multiplier, num_microbatches=None,
                 gradient_accumulation_steps=1, *args, **kwargs):
      self._tfp_init(l2_norm_clip, noise_multiplier, num_microbatches,
                     gradient_accumulation_steps, args, kwargs)
    mixin = _TFPrivacyOptimizer
  compat = type(name, (mixin, dp_cls), {
      "__init__": __init__, "__doc__": _optimizer_doc(name, cls, vectorized),
      "__module__": __name__, "_tfp_dp_class": dp_cls})
  compat.__qualname__ = name
  return keras.saving.register_keras_serializable(package=_PACKAGE, name=name)(compat)


@functools.lru_cache(maxsize=None)
def make_keras_optimizer_class(cls):
  """TF Privacy's factory: the DP-SGD version of a Keras optimizer class.

  Returns ``DPKeras<Name>Optimizer`` with TF Privacy's constructor ``(l2_norm_clip,
  noise_multiplier, num_microbatches=None, gradient_accumulation_steps=1, *args, **kwargs)``,
  a subclass of ``tf_dpkit.make_gaussian_optimizer_class(cls)``, which does every DP step
  (k = ``gradient_accumulation_steps`` > 1 becomes tf_dpkit's accumulation with noise
  multiplier ``noise_multiplier * sqrt(k)``: TF Privacy's update distribution).  Cached per
  ``cls``.  TF Privacy's DPQuery-based factories (``make_keras_generic_optimizer_class``,
  ``make_gaussian_query_optimizer_class``) are not provided.

  Raises:
    TypeError: ``cls`` is not a Keras 3 optimizer class (legacy optimizers included).
  """
  return _make_compat_optimizer_class(cls, vectorized=False)


@functools.lru_cache(maxsize=None)
def make_vectorized_keras_optimizer_class(cls):
  """TF Privacy's vectorized factory: ``VectorizedDPKeras<Name>Optimizer`` with the constructor
  ``(l2_norm_clip, noise_multiplier, num_microbatches=None, unconnected_gradients_to_zero=False,
  *args, **kwargs)``; same step as :func:`make_keras_optimizer_class`'s classes."""
  return _make_compat_optimizer_class(cls, vectorized=True)


DPKerasSGDOptimizer = make_keras_optimizer_class(keras.optimizers.SGD)
DPKerasAdamOptimizer = make_keras_optimizer_class(keras.optimizers.Adam)
DPKerasAdagradOptimizer = make_keras_optimizer_class(keras.optimizers.Adagrad)
VectorizedDPKerasSGDOptimizer = make_vectorized_keras_optimizer_class(keras.optimizers.SGD)
VectorizedDPKerasAdamOptimizer = make_vectorized_keras_optimizer_class(keras.optimizers.Adam)
VectorizedDPKerasAdagradOptimizer = make_vectorized_keras_optimizer_class(
    keras.optimizers.Adagrad)


# ------------------------------------------------------------------------------------------
# Models.

@dataclasses.dataclass(frozen=True)
class _ModelSettings:
  l2_norm_clip: float
  noise_multiplier: float
  num_microbatches: int | None


def _model_settings(l2_norm_clip, noise_multiplier, num_microbatches, layer_registry):
  if isinstance(num_microbatches, bool):
    raise ValueError(f"Boolean value supplied for num_microbatches ({num_microbatches}): "
                     "did you intend it for use_xla? num_microbatches must be None or an "
                     "integer in [1, inf).")
  if layer_registry is not None:
    raise ValueError(
        "layer_registry is not supported: tf_dpkit picks its fast per-layer clipping for every "
        "layer it has a rule for, and falls back to exact per-example gradients for the others "
        "(DPModel.per_example_method = 'auto'); drop layer_registry. Rules for custom layers "
        "are registered with tf_dpkit.clipping.register_layer_rule.")
  return _ModelSettings(
      _checks.check_finite_positive("l2_norm_clip", l2_norm_clip),
      _checks.check_finite_nonnegative("noise_multiplier", noise_multiplier),
      None if num_microbatches is None else _checks.check_integer(
          "num_microbatches", num_microbatches, minimum=1, none_allowed=True))


class _TFPrivacyModel:
  """Mixin placed before a tf_dpkit DP model class: the DP settings live on the model."""

  l2_norm_clip = property(lambda self: self._tfp_settings.l2_norm_clip)
  noise_multiplier = property(lambda self: self._tfp_settings.noise_multiplier)

  def _tfp_private_optimizer(self, optimizer):
    """The DP version of ``optimizer`` with this model's settings (see ``compile``)."""
    s = self._tfp_settings
    if is_dp_optimizer(optimizer):
      theirs = (optimizer.l2_norm_clip, optimizer.noise_multiplier, optimizer.num_microbatches)
      if theirs != (s.l2_norm_clip, s.noise_multiplier, s.num_microbatches):
        raise ValueError(
            f"{type(self).__name__} holds l2_norm_clip={s.l2_norm_clip}, noise_multiplier="
            f"{s.noise_multiplier}, num_microbatches={s.num_microbatches}, but the DP optimizer "
            f"passed to compile() has {theirs[0]}, {theirs[1]}, {theirs[2]}. Compile this model "
            "with a plain Keras optimizer (as in TF Privacy), or use tf_dpkit.DPSequential / "
            "tf_dpkit.DPModel, whose DP settings live on the optimizer.")
      return optimizer
    optimizer = keras.optimizers.get(optimizer)
    if not isinstance(optimizer, keras.optimizers.Optimizer) or isinstance(
        optimizer, keras.optimizers.LossScaleOptimizer):
      raise TypeError(f"{type(self).__name__}.compile needs a Keras optimizer (instance, class "
                      f"name or config), got {optimizer!r}.")
    if optimizer.built:
      raise ValueError(
          f"The optimizer passed to {type(self).__name__}.compile() was already used (it holds "
          "state); compile with a fresh optimizer, which is replaced by its DP version.")
    config = optimizer.get_config()
    config.update(l2_norm_clip=s.l2_norm_clip, noise_multiplier=s.noise_multiplier,
                  num_microbatches=s.num_microbatches)
    return make_gaussian_optimizer_class(type(optimizer)).from_config(config)

  def compile(self, optimizer="rmsprop", loss=None, loss_weights=None, **kwargs):
    """Keras ``compile``; ``optimizer`` (a plain Keras optimizer, as in TF Privacy) is replaced
    by its tf_dpkit DP version with this model's ``l2_norm_clip``, ``noise_multiplier`` and
    ``num_microbatches`` (noise key: secret).  A tf_dpkit DP optimizer is accepted only with the
    same three settings.  The loss may have any reduction (per-example values are used)."""
    return super().compile(optimizer=self._tfp_private_optimizer(optimizer), loss=loss,
                           loss_weights=loss_weights, **kwargs)


@functools.lru_cache(maxsize=None)
def make_dp_model_class(cls):
  """TF Privacy's ``make_dp_model_class``: ``DP<Name>`` for a Keras model class.

  Constructor ``(l2_norm_clip, noise_multiplier, num_microbatches=None, use_xla=True,
  layer_registry=None, *args, **kwargs)``, the rest going to ``cls``.  A subclass of
  ``tf_dpkit.make_dp_model_class(cls)``, whose ``fit`` does the DP-SGD step (per-microbatch
  clipping by the fast per-layer path where it applies, noise, normalisation by the number of
  microbatches); compile it with a plain Keras optimizer.

  * ``l2_norm_clip`` (finite > 0), ``noise_multiplier`` (finite >= 0), ``num_microbatches``
    (None or an integer >= 1 dividing each batch; a bool raises, as in TF Privacy).
  * ``use_xla``: accepted and not used (a speed setting; pass ``jit_compile=True`` to
    ``compile`` for XLA).
  * ``layer_registry``: must be None (see the error for why).
  """
  dp_base = _models.make_dp_model_class(cls)
  if issubclass(dp_base, _TFPrivacyModel):
    return dp_base

  def __init__(self, l2_norm_clip=None, noise_multiplier=None, num_microbatches=None,
               use_xla=True, layer_registry=None, *args, **kwargs):
    if isinstance(l2_norm_clip, (list, tuple)) or noise_multiplier is None:
      given = ("a list of layers as its first argument" if isinstance(l2_norm_clip, (list, tuple))
               else "no noise_multiplier")
      raise TypeError(
          f"{name}(...) got {given}. TF Privacy's {name} takes the DP settings first: "
          f"tf_dpkit.compat.tf_privacy.{name}(l2_norm_clip=1.0, noise_multiplier=1.1, "
          f"{'layers=[...]' if issubclass(cls, keras.Sequential) else 'inputs=..., outputs=...'}"
          f") compiled with a plain Keras optimizer; tf_dpkit's own "
          f"tf_dpkit.{name}({'[...layers...]' if issubclass(cls, keras.Sequential) else 'inputs, outputs'}"
          ") takes the layers first and is compiled with a DP optimizer.")
    settings = _model_settings(l2_norm_clip, noise_multiplier, num_microbatches, layer_registry)
    del use_xla  # speed only (see the docstring)
    dp_base.__init__(self, *args, **kwargs)
    self._tfp_settings = settings

  # The signature TF Privacy declares (both settings required); the defaults of None above only
  # let a call in tf_dpkit's order (layers first) get the message that shows both right calls.
  def declared(self, l2_norm_clip, noise_multiplier, num_microbatches=None, use_xla=True,
               layer_registry=None, *args, **kwargs):  # pylint: disable=unused-argument
    pass
  __init__.__signature__ = inspect.signature(declared)

  name = "DP" + cls.__name__ if cls.__name__ != "Model" else "DPModel"
  compat = type(name, (_TFPrivacyModel, dp_base), {
      "__init__": __init__, "__module__": __name__,
      "__doc__": f"TF Privacy's ``{name}``: ``{cls.__name__}`` trained with DP-SGD in ``fit``, "
                 "DP settings given to the model (see ``make_dp_model_class``)."})
  compat.__qualname__ = name
  return keras.saving.register_keras_serializable(package=_PACKAGE, name=name)(compat)


DPModel = make_dp_model_class(keras.Model)
DPSequential = make_dp_model_class(keras.Sequential)


# ------------------------------------------------------------------------------------------
# Privacy statement and noise calibration.

class AccountantType(enum.Enum):
  """TF Privacy's accountant selector: ``RDP`` or ``PLD`` (``analysis`` accountants)."""
  RDP = "RDP"
  PLD = "PLD"


def _accountant_name(accountant_type) -> str:
  if isinstance(accountant_type, AccountantType):
    return accountant_type.value.lower()
  if isinstance(accountant_type, str) and accountant_type.upper() in ("RDP", "PLD"):
    return accountant_type.lower()
  raise ValueError(f"accountant_type must be AccountantType.RDP or AccountantType.PLD (or "
                   f"'RDP' / 'PLD'), got {accountant_type!r}.")


def _fill(text: str) -> str:
  return textwrap.fill(text, width=80)


def _eps_line(label: str, eps: float) -> str:
  value = "    inf (**)" if eps == math.inf else f"{eps:12.3f}"
  return f"    {label:<53}{value}"


_ONCE_PER_EPOCH = "Epsilon with each example occurring once per epoch:"
_POISSON = "Epsilon assuming Poisson sampling (*):"


def compute_dp_sgd_privacy_statement(number_of_examples, batch_size, num_epochs,
                                     noise_multiplier, delta, used_microbatching=True,
                                     max_examples_per_user=None,
                                     accountant_type=AccountantType.RDP) -> str:
  """TF Privacy's privacy report for a DP-SGD run, with ``analysis``' numbers.

  The numbers are those of ``analysis.compute_dp_sgd_privacy.compute_dp_sgd_privacy(n=
  number_of_examples, batch_size, noise_multiplier, epochs=num_epochs, delta, accountant=...,
  used_microbatching=..., max_examples_per_user=...)`` (epsilon in nats, add-or-remove-one
  adjacency, every checkpoint released):

  * "once per epoch": ceil(num_epochs) compositions of the Gaussian mechanism with noise
    multiplier sigma (sigma / 2 with microbatching: a microbatch sum moves by up to 2C), i.e. one
    Gaussian mechanism, whose epsilon is computed exactly (Balle & Wang 2018; TF Privacy's
    accountants gave an upper bound on it);
  * "Poisson sampling": ceil(num_epochs * n / batch_size) steps of the Poisson-subsampled
    Gaussian with q = batch_size / n, by the chosen accountant (PLD: the smaller of the PLD and
    RDP bounds);
  * user-level (``max_examples_per_user`` = k): once per epoch exactly (noise / k), and under
    Poisson sampling by group privacy; given for both accountants.

  Args:
    number_of_examples: n, integer >= 1.  batch_size: integer in [1, n].
    num_epochs: real >= 0 (fractional allowed).  noise_multiplier: sigma >= 0.
    delta: in (0, 1).
    used_microbatching: True (TF Privacy's default) when gradients were clipped per microbatch of
      more than one example; pass False for per-example clipping (``num_microbatches=None`` or
      equal to the batch size).
    max_examples_per_user: None or an integer in [1, n].
    accountant_type: ``AccountantType.RDP`` (default) or ``.PLD`` (or the strings).

  Returns:
    The report: paragraphs separated by blank lines, in TF Privacy's layout (the two epsilon
    lines carry TF Privacy's labels and ``%12.3f`` numbers), ending with a newline.

  Raises:
    ValueError: an argument out of range (named in the message).
  """
  accountant = _accountant_name(accountant_type)
  result = _privacy_lib.compute_dp_sgd_privacy(
      number_of_examples, batch_size, noise_multiplier, num_epochs, delta, accountant=accountant,
      max_examples_per_user=max_examples_per_user, used_microbatching=used_microbatching)
  k = max_examples_per_user
  users = ("no bound on number of examples per user" if k is None else
           f"at most {k} examples per user")
  name = accountant.upper()
  paragraphs = [
      _fill(f"DP-SGD performed over {number_of_examples} examples with {batch_size} examples "
            f"per iteration, noise multiplier {noise_multiplier} for {num_epochs} epochs "
            f"{'with' if used_microbatching else 'without'} microbatching, and {users}."),
      _fill("The guarantee covers every model checkpoint released during training, not only "
            "the final model."),
      _fill(f"Example-level DP with add-or-remove-one adjacency at delta = {delta} computed "
            f"with {name} accounting:") + "\n" +
      _eps_line(_ONCE_PER_EPOCH, result.epsilon_no_amplification) + "\n" +
      _eps_line(_POISSON, result.epsilon),
  ]
  if k is None:
    paragraphs.append(_fill("Without a bound on the number of examples per user there is no "
                            "user-level guarantee."))
  else:
    paragraphs.append(
        _fill(f"User-level DP with add-or-remove-one adjacency at delta = {delta} computed "
              f"using {name} accounting and group privacy:") + "\n" +
        _eps_line(_ONCE_PER_EPOCH, result.user_epsilon_no_amplification) + "\n" +
        _eps_line(_POISSON, result.user_epsilon))
  paragraphs.append(_fill(
      "(*) Holds only if every batch was a Poisson sample: each example included "
      f"independently with probability {batch_size}/{number_of_examples}, by a sampler whose "
      "seed is secret (tf_dpkit.data.poisson_batches). Shuffled fixed-size batches (Keras fit "
      "on arrays, or shuffle-and-batch pipelines) get no proven amplification: for them "
      "report the once-per-epoch epsilon, which treats each epoch as one Gaussian mechanism "
      "(exact), with respect to replacing one example by a null example."))
  if k is not None and math.inf in (result.user_epsilon, result.user_epsilon_no_amplification):
    paragraphs.append(_fill("(**) Group privacy gives no finite bound here."))
  return "\n\n".join(paragraphs) + "\n"


def compute_dp_sgd_privacy(n, batch_size, noise_multiplier, epochs, delta):
  """TF Privacy's deprecated ``compute_dp_sgd_privacy``: ``(epsilon, optimal_order)``.

  Epsilon (nats) at ``delta`` of ceil(epochs * n / batch_size) steps of the Poisson-subsampled
  Gaussian (q = batch_size / n, per-example clipping), by ``analysis``' RDP accountant over its
  default orders; the order is None when epsilon is infinite.  Prefer
  :func:`compute_dp_sgd_privacy_statement`, which also states the epsilon without sampling.
  """
  result = _privacy_lib.compute_dp_sgd_privacy(n, batch_size, noise_multiplier, epochs, delta)
  return result.epsilon, result.optimal_order


def compute_noise(n, batch_size, target_epsilon, epochs, delta, noise_lbd):
  """TF Privacy's ``compute_noise``: the smallest noise multiplier meeting (eps, delta).

  ``analysis.calibration.compute_noise_multiplier(target_epsilon, delta, q=batch_size / n,
  steps=ceil(epochs * n / batch_size))``: Poisson sampling, per-example clipping, RDP
  accountant; the result meets the budget and is at most 1e-4 (relative) above the smallest
  noise that does.  Prints a one-line summary, as TF Privacy did.

  Args:
    n: dataset size, integer >= 1.  batch_size: integer in [1, n].
    target_epsilon: > 0 (nats).  epochs: real >= 0.  delta: in (0, 1).
    noise_lbd: TF Privacy's lower end of its search, finite > 0.  Validated only: the search
      here is bracketed itself.  Where TF Privacy found ``noise_lbd`` already within the budget
      it returned 0 (no noise at all); this returns the calibrated noise instead.

  Returns:
    The noise multiplier (noise std / clipping norm).

  Raises:
    ValueError: an argument out of range, or a budget not met even at noise 1e4.
  """
  _checks.check_finite_positive("noise_lbd", noise_lbd)
  steps = calibration.steps_for_training(n, batch_size, epochs)
  sigma = calibration.compute_noise_multiplier(target_epsilon, delta, batch_size / n, steps)
  print(f"DP-SGD with sampling rate = {100 * batch_size / n:.3g}% and noise_multiplier = "
        f"{sigma:.6g} iterated over {steps} steps satisfies differential privacy with "
        f"eps = {target_epsilon:.3g} and delta = {delta}.")
  return sigma


#: TF Privacy's command-line module ``compute_noise_from_budget`` runs ``compute_noise``.
compute_noise_from_budget = compute_noise

#: Namespaces with TF Privacy's module names, for ``lib.function(...)`` call sites.
compute_dp_sgd_privacy_lib = types.SimpleNamespace(
    compute_dp_sgd_privacy_statement=compute_dp_sgd_privacy_statement,
    compute_dp_sgd_privacy=compute_dp_sgd_privacy, AccountantType=AccountantType)
compute_noise_from_budget_lib = types.SimpleNamespace(compute_noise=compute_noise)
