"""Renyi-DP accounting for DP-SGD: the (sub)sampled Gaussian mechanism and RDP -> (eps, delta).

The public facade: every name below is importable from here (``compute_rdp`` and
``get_privacy_spent`` as in TF Privacy).  Contract: ``noise_multiplier`` is noise std / L2
sensitivity in [0, inf]; ``q`` in [0, 1]; ``steps`` an integer in [0, 2**53]; orders in
(1, 1e6] or inf; RDP and epsilon in nats.  Every value returned is an upper bound on the true
RDP (exact at integer orders up to round-off), so every epsilon is a valid guarantee.  The
mathematics (series, truncation and round-off bounds, conversions, the tuning theorems) is in
docs/design/rdp_accountant.md; the code in the private pieces of ``analysis._rdp``.  No
TensorFlow import; numpy and scipy only.
"""
from __future__ import annotations

import warnings

import numpy as np

from analysis import accountant_base as _accountant
from analysis import events as _events
from analysis._checks import MAX_STEPS, check_delta, check_orders
from analysis._rdp.common import DEFAULT_ORDERS, MAX_ORDER, OrderAtBoundaryWarning
from analysis._rdp.conversion import get_privacy_spent, get_privacy_spent_optimal_order
from analysis._rdp.forward_differences import _log_gauss_forward_differences
from analysis._rdp.repeat_select import (_tnb_gamma, compute_rdp_repeat_and_select,
                                         truncated_negative_binomial_gamma,
                                         truncated_negative_binomial_log_mean)
from analysis._rdp.sampled_gaussian import _log_a_int, compute_heterogeneous_rdp, compute_rdp
from analysis._rdp.without_replacement import (_wor_log_moment_int,
                                               compute_rdp_sample_without_replacement)

__all__ = [
    "DEFAULT_ORDERS",
    "MAX_ORDER",
    "MAX_STEPS",
    "OrderAtBoundaryWarning",
    "RdpAccountant",
    "compute_rdp",
    "compute_rdp_sample_without_replacement",
    "compute_heterogeneous_rdp",
    "compute_rdp_repeat_and_select",
    "get_privacy_spent",
    "get_privacy_spent_optimal_order",
    "truncated_negative_binomial_gamma",
    "truncated_negative_binomial_log_mean",
]

#: The memoised kernels (functools caches) of the pieces, named here so that tools which clear
#: every cache found on this module (benchmarks/accounting.py) still find them.
_CACHED = (_log_a_int, _log_gauss_forward_differences, _wor_log_moment_int, _tnb_gamma)


class RdpAccountant(_accountant.Accountant):
  """Renyi-DP accountant implementing :class:`analysis.accountant_base.Accountant`.

  Supports every atom of :func:`analysis.events.flatten`: plain Gaussian releases (RDP
  ``alpha / (2 sigma^2)``), the Poisson-subsampled Gaussian (:func:`compute_rdp`), the
  Gaussian sampled without replacement (:func:`compute_rdp_sample_without_replacement`) and
  tuned releases (:class:`analysis.events.RepeatAndSelectAtom`: the repeated event's RDP at
  ``orders``, by this accountant, then :func:`compute_rdp_repeat_and_select`, whose Poisson
  delta_hat is this accountant's ``get_delta`` of the repeated event, exact for pure
  Gaussian compositions).  RDP adds over the composition and is converted by
  :func:`get_privacy_spent` over ``orders``.

  Args:
    orders: RDP orders, a non-empty sequence each in (1, 1e6] or inf; default
      :data:`DEFAULT_ORDERS`.
  """

  #: How this accountant's bound is described in a privacy statement.
  method = ("Renyi-DP accounting (Mironov et al. 2019) with the conversion of Balle et al. "
            "(2020)")

  def __init__(self, orders=None):
    super().__init__()
    alphas, _ = check_orders("orders", list(DEFAULT_ORDERS if orders is None else orders),
                             max_finite=MAX_ORDER)
    self._orders = tuple(float(a) for a in alphas)
    self._rdp_cache = None

  @property
  def orders(self) -> tuple:
    """The orders searched."""
    return self._orders

  supports_repeat_and_select = True

  def _check_atoms(self, atoms) -> None:
    pass  # every atom kind has an RDP bound here

  def _changed(self) -> None:
    self._rdp_cache = None

  def rdp(self) -> np.ndarray:
    """The composed RDP at each of :attr:`orders` (nats)."""
    if self._rdp_cache is None:
      total = np.zeros(len(self._orders))
      for atom in self.atoms:
        if isinstance(atom, _events.RepeatAndSelectAtom):
          inner = RdpAccountant(self._orders).compose(atom.event)
          total += atom.count * compute_rdp_repeat_and_select(
              self._orders, inner.rdp(), atom.mean, atom.shape,
              delta_of_epsilon=inner.get_delta)
        elif atom.sampling is None:
          total += compute_rdp(1.0, atom.noise_multiplier, atom.count, self._orders)
        elif isinstance(atom.sampling, tuple):
          n, b = atom.sampling
          total += compute_rdp_sample_without_replacement(b / n, atom.noise_multiplier,
                                                          atom.count, self._orders)
        else:
          total += compute_rdp(atom.sampling, atom.noise_multiplier, atom.count, self._orders)
      self._rdp_cache = total
    return self._rdp_cache

  def epsilon_and_order(self, delta: float):
    """``(epsilon, optimal order, at_boundary)`` by RDP at ``delta`` in (0, 1).

    ``optimal order`` is None when epsilon is inf, nothing was composed, or nothing is
    subsampled (then epsilon is the exact one of ``get_epsilon``);
    ``at_boundary`` is True when it is the first or last of :attr:`orders`.
    """
    delta = check_delta("delta", delta)
    if not self.atoms or self._pure_gaussian_noise() is not None:
      return self.get_epsilon(delta), None, False  # exact, no order involved
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always", OrderAtBoundaryWarning)
      eps, _, order = get_privacy_spent(self._orders, self.rdp(), target_delta=delta)
    boundary = any(issubclass(w.category, OrderAtBoundaryWarning) for w in caught)
    return float(eps), order, boundary

  def _epsilon(self, delta: float) -> float:
    return self.epsilon_and_order(delta)[0]

  def _delta(self, epsilon: float) -> float:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", OrderAtBoundaryWarning)
      _, delta, _ = get_privacy_spent(self._orders, self.rdp(), target_eps=epsilon)
    return float(delta)
