"""Privacy of a DP-SGD training run: library function and command-line tool.

    compute_dp_sgd_privacy --N=60000 --batch_size=256 --noise_multiplier=1.1 --epochs=60
    python -m analysis.compute_dp_sgd_privacy --N=60000 --batch_size=256 \\
        --noise_multiplier=1.1 --epochs=60 --delta=1e-5 --accountant=pld
    compute_dp_sgd_privacy ... --tuning_runs_mean=10 --tuning_shape=inf

The run is modelled as ``steps = ceil(epochs * N / batch_size)`` steps of the Gaussian mechanism
on Poisson-sampled batches (each example independently with probability q = batch_size / N),
add-or-remove-one adjacency, noise std = noise_multiplier * clipping norm.  Epsilon is in nats.
With ``--accountant=pld`` the epsilon printed is the smaller of the PLD and the RDP bound (both
are valid; PLD is the tighter one unless its grid had to be coarsened, e.g. from ~40,000 epochs
of MNIST with batch 256 and noise 1.1: see ``analysis.pld_accountant``).

With ``--tuning_runs_mean`` and ``--tuning_shape`` it also prints the epsilon of
hyper-parameter tuning on the same data: the run repeated K times (K random with that mean;
shape inf Poisson, 1 geometric, 0 logarithmic) and only the best run released
(``analysis.tuning``, Papernot & Steinke 2022, by RDP whatever the accountant).  No TensorFlow
import.
"""
from __future__ import annotations

import dataclasses
import math
import sys

from analysis import accountant_base as _accountant
from analysis import accountants as _accountants
from analysis import calibration, dp_sgd, events, rdp_accountant, tuning
from analysis._checks import (check_choice, check_count, check_delta, check_integer,
                              check_nonnegative, check_real, delta_warning)

__all__ = ["DpSgdPrivacy", "compute_dp_sgd_privacy", "run"]


@dataclasses.dataclass(frozen=True)
class DpSgdPrivacy:
  """Result of :func:`compute_dp_sgd_privacy`.

  Attributes:
    epsilon: eps (nats) at ``delta`` assuming Poisson sampling with rate q.  For the PLD
      accountant, the smaller of the PLD and the RDP bound
      (``pld_accountant.compute_epsilon_with_rdp_cap``).
    delta: the delta the epsilons refer to.
    optimal_order: the RDP order attaining ``epsilon``; None if epsilon is inf, and None for the
      PLD accountant unless the RDP bound (order optimised over the reals) was the smaller.
    sampling_probability: q = batch_size / n.
    steps: ceil(epochs * n / batch_size).
    noise_multiplier: as given (noise std / clipping norm).
    effective_noise_multiplier: the one accounted for: noise_multiplier, or half of it when
      microbatch_size > 1 (see compute_dp_sgd_privacy).
    epsilon_no_amplification: eps with no amplification by sampling: ceil(epochs)
      compositions of the unsampled Gaussian (q = 1), valid for any batching in which every
      example is used at most once per epoch (e.g. shuffle-and-iterate).  Exact, whatever the
      accountant: the composition is one Gaussian mechanism with noise multiplier
      sigma / sqrt(ceil(epochs)) (``analysis.gaussian``, Balle & Wang 2018).
    order_no_amplification: always None (no Renyi order is involved); kept for callers.
    n, batch_size, epochs, microbatch_size, accountant: the inputs.
    order_at_boundary: True if an optimal RDP order was the first or last of the orders used.
    used_microbatching: the input (microbatches of unknown size > 1).
    max_examples_per_user: the input (None: example-level only).
    user_epsilon: user-level eps under Poisson sampling by group privacy (None without
      max_examples_per_user).
    user_epsilon_no_amplification: user-level eps once per epoch, exact (None without
      max_examples_per_user).
    tuning_runs_mean, tuning_shape: the inputs (None: no tuning).
    tuned_epsilon: eps (nats) at ``delta`` of releasing the best of K Poisson-sampled runs,
      E[K] = tuning_runs_mean (``analysis.tuning.tuned_epsilon``, RDP over ``orders``); None
      without tuning.
  """
  epsilon: float
  delta: float
  optimal_order: float | None
  sampling_probability: float
  steps: int
  noise_multiplier: float
  effective_noise_multiplier: float
  epsilon_no_amplification: float
  order_no_amplification: float | None
  n: int
  batch_size: int
  epochs: float
  microbatch_size: int
  accountant: str
  order_at_boundary: bool = False
  used_microbatching: bool = False
  max_examples_per_user: int | None = None
  user_epsilon: float | None = None
  user_epsilon_no_amplification: float | None = None
  tuning_runs_mean: float | None = None
  tuning_shape: float | None = None
  tuned_epsilon: float | None = None

  def statement(self) -> str:
    """A short plain-English paragraph describing the guarantee, ready to paste into a paper."""
    order = (f" (optimal Renyi order {self.optimal_order:g})"
             if self.optimal_order is not None else "")
    own = getattr(_accountants.accountant_class(self.accountant), "method",
                  f"the {self.accountant} accountant")
    if _accountants.takes_orders(self.accountant):
      method = f"{own}{order}"
    elif self.optimal_order is None:
      method = own
    else:  # the RDP bound (RdpAccountant's) was the smaller one
      method = f"{rdp_accountant.RdpAccountant.method}{order}, which is tighter here than {own}"
    noise = f"noise multiplier {self.noise_multiplier:g}"
    micro = ""
    if self.microbatch_size > 1 or self.used_microbatching:
      size = (f" of {self.microbatch_size} examples" if self.microbatch_size > 1 else
              " of more than one example")
      micro = (f" Gradients were clipped and summed per microbatch{size}; under add-or-remove-one adjacency adding or removing an example can "
               "change a microbatch sum by up to twice the clipping norm, so the accounting "
               f"uses the effective noise multiplier {self.effective_noise_multiplier:g} "
               f"(= {self.noise_multiplier:g} / 2).")
    parts = [
        f"DP-SGD was run for {self.steps} steps ({_fmt_epochs(self.epochs)} epochs over "
        f"n = {self.n} examples with expected batch size {self.batch_size}, i.e. sampling "
        f"rate q = {self.sampling_probability:.6g}) with Gaussian noise of {noise} "
        "relative to the clipping norm." + micro,
        f"Assuming Poisson sampling (each example included in each batch independently with "
        f"probability q), the training is ({_fmt_eps(self.epsilon)}, {self.delta:g})-"
        f"differentially private with respect to adding or removing one example, by "
        f"{method}.",
        f"This bound is not valid for shuffle-and-iterate batching (fixed batches from a "
        f"random permutation each epoch); for that, the exact epsilon without amplification "
        f"by sampling (the analytic Gaussian mechanism of Balle and Wang 2018, composed over "
        f"the epochs) is epsilon = {_fmt_eps(self.epsilon_no_amplification)} at the same "
        "delta, with respect to replacing one example by a null example that contributes "
        "nothing (zero-out adjacency; adding an example would shift the batches of the "
        "others).",
    ]
    if self.max_examples_per_user is not None:
      k = self.max_examples_per_user
      parts.append(
          f"User-level privacy, for neighbouring data sets that differ in all the examples of "
          f"one user, each user contributing at most {k} example{'s' if k > 1 else ''}: "
          f"epsilon = {_fmt_eps(self.user_epsilon)} at delta = {self.delta:g} assuming Poisson "
          f"sampling (group privacy: an (eps, d)-DP mechanism is (k eps, k e^((k-1) eps) d)-DP "
          f"for groups of k, with the best per-example d), and epsilon = "
          f"{_fmt_eps(self.user_epsilon_no_amplification)} with each example used once per "
          f"epoch (exact: the user's examples change each epoch's clipped sums by at most {k} "
          "times one example's sensitivity in total).")
    if self.tuned_epsilon is not None:
      theorem = "6" if math.isinf(self.tuning_shape) else "2"
      parts.append(
          f"Hyper-parameter tuning on the same data: if this training is run K times, each run "
          f"with independently drawn hyper-parameters, K drawn independently of the data from "
          f"the {tuning.distribution_name(self.tuning_shape)} distribution with mean "
          f"{self.tuning_runs_mean:g}, and only the best run's output is released, the release "
          f"is ({_fmt_eps(self.tuned_epsilon)}, {self.delta:g})-differentially private "
          f"assuming Poisson sampling (Papernot and Steinke 2022, Theorem {theorem}, by "
          "Renyi-DP accounting). A fixed number of runs costs their composition instead.")
    if self.order_at_boundary:
      parts.append("(An optimal order lay at the end of the orders searched; a wider range of "
                   "orders may give a smaller epsilon.)")
    return " ".join(parts)

  def __str__(self) -> str:
    return self.statement()


def _fmt_eps(eps: float) -> str:
  return "inf" if eps == math.inf else f"{eps:.4g}"


def _fmt_epochs(epochs: float) -> str:
  return f"{epochs:g}"


def compute_dp_sgd_privacy(n: int, batch_size: int, noise_multiplier: float, epochs: float,
                           delta: float, *, microbatch_size: int = 1, orders=None,
                           accountant: str = "rdp",
                           max_examples_per_user: int | None = None,
                           used_microbatching: bool = False,
                           tuning_runs_mean: float | None = None,
                           tuning_shape: float | None = None) -> DpSgdPrivacy:
  """Epsilon of a DP-SGD run, with and without amplification by sampling.

  Poisson sampling with q = batch_size / n for steps = ceil(epochs * n / batch_size) steps of
  the Gaussian mechanism (noise std = noise_multiplier * clipping norm), add-or-remove-one
  adjacency.  The no-amplification epsilon composes the unsampled Gaussian (q = 1) ceil(epochs)
  times: when every example is in exactly one batch per epoch, each epoch touches it once; that
  composition is one Gaussian mechanism, whose epsilon is computed exactly.

  With ``microbatch_size`` m > 1, clipping applies to each microbatch's summed gradient, whose
  change when one example is added or removed can be up to 2C (one clipped sum is replaced
  by another); the noise (std sigma * C) is unchanged, so the run is accounted with the
  effective noise multiplier sigma / 2.

  Args:
    n: dataset size, integer >= 1.
    batch_size: (expected) batch size, integer in [1, n], divisible by microbatch_size.
    noise_multiplier: sigma >= 0 (0 gives eps = inf).
    epochs: real >= 0.
    delta: in (0, 1).
    microbatch_size: integer >= 1 (default 1: per-example clipping).
    orders: RDP orders (non-empty, each in (1, 1e6] or inf) for accountant "rdp"; default
      DEFAULT_ORDERS.  Must be None with accountant "pld", which has no Renyi orders.
    accountant: "rdp" (default) or "pld" (analysis.pld_accountant, imported lazily): the
      smaller of the PLD and the RDP epsilon, each valid, for both epsilons reported.  The
      number of steps must be at most 2**53 for "rdp" and 1e10 for "pld".
    used_microbatching: True if gradients were clipped per microbatch of more than one
      example, size unknown (TF Privacy's flag): accounted like ``microbatch_size > 1``.
    max_examples_per_user: k, integer in [1, n], or None.  When given, user-level epsilons are
      reported too (neighbouring data sets differ in all examples of one user, who has at most
      k): once per epoch exactly (a Gaussian with noise multiplier divided by k, see
      ``analysis.dp_sgd``), and under Poisson sampling by group privacy
      (``analysis.accountant_base.group_privacy_epsilon``).
    tuning_runs_mean: both None (default), or E[K] (finite, >= 1) and the shape
      (in (-1, inf) or inf) of the number K of tuning runs: then ``tuned_epsilon`` is the
      epsilon of the best of K Poisson-sampled runs (``analysis.tuning.tuned_epsilon`` on this
      run's event, RDP over ``orders`` whatever ``accountant``: no PLD bound is known here).
    tuning_shape: see ``tuning_runs_mean`` (described together).

  Returns:
    A :class:`DpSgdPrivacy`; ``str()`` of it is the plain-English statement.

  Raises:
    ValueError: any argument out of range; the message names it.
  """
  n = check_count("n", n, minimum=1)
  batch_size = check_count("batch_size", batch_size, minimum=1)
  if batch_size > n:
    raise ValueError(f"batch_size must be in [1, n={n}], got {batch_size}.")
  sigma = check_nonnegative("noise_multiplier", noise_multiplier)
  epochs = check_real("epochs", epochs)
  if not 0.0 <= epochs < math.inf:
    raise ValueError(f"epochs must be finite and >= 0, got {epochs!r}.")
  delta = check_delta("delta", delta)
  microbatch_size = check_count("microbatch_size", microbatch_size, minimum=1)
  if not isinstance(used_microbatching, bool):
    raise ValueError(f"used_microbatching must be True or False, got {used_microbatching!r}.")
  if max_examples_per_user is not None:
    max_examples_per_user = check_integer("max_examples_per_user", max_examples_per_user,
                                          minimum=1, maximum=n)
  if batch_size % microbatch_size:
    raise ValueError(f"microbatch_size must divide batch_size={batch_size}, "
                     f"got {microbatch_size}.")
  check_choice("accountant", accountant, _accountants.accountant_names())
  if (tuning_runs_mean is None) != (tuning_shape is None):
    raise ValueError(
        "tuning_runs_mean and tuning_shape go together (the shape is the distribution K must "
        "be drawn from: inf Poisson, 1 geometric, 0 logarithmic, or any > -1), got "
        f"tuning_runs_mean={tuning_runs_mean!r}, tuning_shape={tuning_shape!r}.")
  if tuning_runs_mean is not None:
    tuning_runs_mean = events.check_repeat_mean("tuning_runs_mean", tuning_runs_mean)
    tuning_shape = events.check_repeat_shape("tuning_shape", tuning_shape)
  orders = _accountants.check_orders_for(accountant, orders)
  if orders is None and _accountants.takes_orders(accountant):
    orders = list(rdp_accountant.DEFAULT_ORDERS)
  # tuned_epsilon is RDP over these orders whatever the accountant (module docstring).
  tuning_orders = list(rdp_accountant.DEFAULT_ORDERS) if orders is None else orders

  q = batch_size / n
  steps = calibration.steps_for_training(n, batch_size, epochs)
  most = _accountants.max_steps(accountant)
  if steps > most:
    raise ValueError(
        f"epochs={epochs!r} gives {steps} steps, above the {accountant.upper()} accountant's "
        f"supported maximum of {most} steps; use fewer epochs (at most "
        f"{most * batch_size / n:.6g}) or accountant='rdp'.")
  epochs_touched = math.ceil(epochs)
  # The two runs, described once (analysis.dp_sgd): Poisson-sampled, and once per epoch.
  # Only whether microbatches hold more than one example matters to the accounting.
  clipped_per = max(microbatch_size, 2) if used_microbatching else microbatch_size
  run_event = dp_sgd.dp_sgd_event(sigma, steps, dataset_size=n, batch_size=batch_size,
                                  microbatch_size=clipped_per)
  effective = dp_sgd.effective_noise_multiplier(sigma, microbatch_size=clipped_per)

  def once_per_epoch(examples_per_user=1):
    return dp_sgd.dp_sgd_event(sigma, epochs_touched, sampling="shuffle", steps_per_epoch=1,
                               microbatch_size=clipped_per,
                               examples_per_user=examples_per_user)

  poisson = _accountants.make_accountant(accountant, orders=orders).compose(run_event)
  if hasattr(poisson, "epsilon_and_order"):  # a Renyi accountant: the optimal order on its grid
    eps, order, boundary = poisson.epsilon_and_order(delta)
  else:
    eps = poisson.get_epsilon(delta)
    # The PLD accountant reports the RDP order when its RDP cap was the smaller bound; that
    # order is optimised over the reals, not taken from a grid.
    order = poisson.last_rdp_order if getattr(poisson, "last_from_rdp", False) else None
    boundary = False
  eps0 = _accountants.make_accountant(accountant).compose(once_per_epoch()).get_epsilon(delta)
  user_eps = user_eps0 = None
  if max_examples_per_user is not None:
    user_eps = _accountant.group_privacy_epsilon(poisson, max_examples_per_user, delta)
    user_eps0 = _accountants.make_accountant(accountant).compose(
        once_per_epoch(max_examples_per_user)).get_epsilon(delta)
  tuned = None
  if tuning_runs_mean is not None:
    tuned = tuning.tuned_epsilon(run_event, tuning_runs_mean, tuning_shape, delta,
                                 orders=tuning_orders)
  return DpSgdPrivacy(
      epsilon=eps, delta=delta, optimal_order=order, sampling_probability=q, steps=steps,
      noise_multiplier=sigma, effective_noise_multiplier=effective,
      epsilon_no_amplification=eps0, order_no_amplification=None, n=n,
      batch_size=batch_size, epochs=epochs, microbatch_size=microbatch_size,
      accountant=accountant, order_at_boundary=boundary, used_microbatching=used_microbatching,
      max_examples_per_user=max_examples_per_user, user_epsilon=user_eps,
      user_epsilon_no_amplification=user_eps0, tuning_runs_mean=tuning_runs_mean,
      tuning_shape=tuning_shape, tuned_epsilon=tuned)


# ------------------------------------------------------------------------------------------
# Command line.

_PROG = "compute_dp_sgd_privacy"


def _define_flags():
  from absl import flags  # pylint: disable=g-import-not-at-top
  values = flags.FlagValues()
  flags.DEFINE_integer("N", None, "Dataset size (number of examples).", flag_values=values)
  flags.DEFINE_integer("batch_size", None, "Expected batch size (q = batch_size / N).",
                       flag_values=values)
  flags.DEFINE_float("noise_multiplier", None, "Noise std divided by the clipping norm.",
                     flag_values=values)
  flags.DEFINE_float("epochs", None, "Number of epochs (may be fractional).",
                     flag_values=values)
  flags.DEFINE_float("delta", 1e-6, "Target delta, in (0, 1); well below 1/N (default 1e-6, "
                     "TF Privacy's).", flag_values=values)
  flags.DEFINE_integer("microbatch_size", 1, "Examples per clipped microbatch.",
                       flag_values=values)
  flags.DEFINE_list("orders", None, "Comma-separated RDP orders (each > 1), only with "
                    "--accountant=rdp; default: analysis.rdp_accountant.DEFAULT_ORDERS.",
                    flag_values=values)
  names = _accountants.accountant_names()
  flags.DEFINE_enum("accountant", None, list(names),
                    "Accountant: " + " or ".join(
                        f"{name} (default)" if name == "rdp" else name for name in names) + ".",
                    flag_values=values)
  flags.DEFINE_enum("accountant_type", None, [name.upper() for name in names],
                    "TF Privacy's spelling of --accountant (RDP or PLD).", flag_values=values)
  flags.DEFINE_boolean(
      "used_microbatching", None,
      "TF Privacy's flag: true if gradients were clipped per microbatch of more than one "
      "example (doubles the sensitivity, like --microbatch_size > 1). Default false here "
      "(per-example clipping); TF Privacy's default is true.", flag_values=values)
  flags.DEFINE_integer(
      "max_examples_per_user", None,
      "If set, also state user-level privacy for users with at most this many examples "
      "(an integer in [1, N]).", flag_values=values)
  flags.DEFINE_float(
      "tuning_runs_mean", None,
      "If set, also print the epsilon of hyper-parameter tuning on the same data: the best of "
      "K runs released, K random with this mean (>= 1). Needs --tuning_shape.",
      flag_values=values)
  flags.DEFINE_float(
      "tuning_shape", None,
      "Distribution of the number of tuning runs K: inf (Poisson), 1 (geometric), 0 "
      "(logarithmic), or any value > -1 (truncated negative binomial).", flag_values=values)
  for name in ("N", "batch_size", "noise_multiplier", "epochs"):
    flags.mark_flag_as_required(name, flag_values=values)
  return values


def _fail(message: str) -> None:
  message = " ".join(str(message).split())  # one line
  sys.stderr.write(f"{_PROG}: error: {message}\n")
  sys.exit(2)


def run(argv=None) -> None:
  """Console entry point: parses absl flags, prints the statement; bad flags exit with 2.

  Errors (unknown or missing flags, values out of range) print one line to stderr, no
  traceback.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  argv = list(sys.argv if argv is None else argv)
  values = _define_flags()
  if any(a in ("--help", "-h", "--helpshort", "--helpfull") for a in argv[1:]):
    sys.stdout.write(__doc__ + "\nFlags:\n" + values.get_help(include_special_flags=False)
                     + "\n")
    return
  try:
    rest = values(argv)
  except flags.Error as error:
    _fail(error)
  if len(rest) > 1:
    _fail(f"unexpected positional arguments: {' '.join(rest[1:])}")
  accountant = values.accountant
  if values.accountant_type is not None:
    if accountant is not None and accountant != values.accountant_type.lower():
      _fail(f"--accountant={accountant} and --accountant_type={values.accountant_type} "
            "disagree; give one of them")
    accountant = values.accountant_type.lower()
  accountant = accountant or "rdp"
  microbatch_size = values.microbatch_size
  if values.used_microbatching is not None:
    if not values.used_microbatching and microbatch_size > 1:
      _fail(f"--noused_microbatching contradicts --microbatch_size={microbatch_size}; give one "
            "of them")
  orders = None
  if values.orders is not None and not _accountants.takes_orders(accountant):
    _fail(f"--orders applies only to --accountant=rdp (the {accountant.upper()} accountant has "
          "no Renyi orders); drop --orders or use --accountant=rdp")
  if values.orders is not None:
    try:
      orders = [float(x) for x in values.orders]
    except ValueError:
      _fail(f"--orders must be a comma-separated list of numbers, got {values.orders!r}")
  try:
    result = compute_dp_sgd_privacy(
        values.N, values.batch_size, values.noise_multiplier, values.epochs, values.delta,
        microbatch_size=microbatch_size, orders=orders, accountant=accountant,
        max_examples_per_user=values.max_examples_per_user,
        used_microbatching=bool(values.used_microbatching),
        tuning_runs_mean=values.tuning_runs_mean, tuning_shape=values.tuning_shape)
  except ValueError as error:
    _fail(error)
  warning = delta_warning(result.delta, values.N)
  if warning:
    sys.stderr.write(f"{_PROG}: warning: {warning}\n")
  how = f"{result.accountant} accountant"
  if result.optimal_order is not None:
    how += (f", optimal order {result.optimal_order:g}"
            if _accountants.takes_orders(result.accountant) else
            f": the RDP bound, optimal order {result.optimal_order:.4g}, is smaller here")
  print(f"epsilon = {_fmt_eps(result.epsilon)} at delta = {result.delta:g} "
        f"(Poisson sampling, {how})")
  print(f"epsilon without amplification by sampling = "
        f"{_fmt_eps(result.epsilon_no_amplification)}")
  if result.max_examples_per_user is not None:
    print(f"user-level epsilon (at most {result.max_examples_per_user} examples per user) = "
          f"{_fmt_eps(result.user_epsilon)} (Poisson sampling, group privacy), "
          f"{_fmt_eps(result.user_epsilon_no_amplification)} (each example once per epoch)")
  if result.tuned_epsilon is not None:
    print(f"tuned epsilon = {_fmt_eps(result.tuned_epsilon)} at delta = {result.delta:g} "
          f"(best of K runs, K {tuning.distribution_name(result.tuning_shape)} with mean "
          f"{result.tuning_runs_mean:g}; Poisson sampling, rdp accountant)")
  print(f"q = {result.sampling_probability:.6g}, steps = {result.steps}, "
        f"effective noise multiplier = {result.effective_noise_multiplier:g}")
  print()
  print(result.statement())


if __name__ == "__main__":
  run()
