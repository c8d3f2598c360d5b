"""Privacy accounting for DP-SGD, in pure Python/NumPy/SciPy (no TensorFlow import).

Modules:
  events                  Immutable descriptions of private mechanisms (Gaussian, Poisson-sampled,
                          sampled without replacement, shuffled, composed), the accountants' input.
  accountant_base         The accountant interface (compose / get_epsilon / get_delta); pure
                          Gaussian compositions are exact.  (``accountant`` is its deprecated
                          alias, removed in the next release.)
  accountants             The registry of accountants by public name ("rdp", "pld";
                          register_accountant, make_accountant).
  dp_sgd                  The one rule from a DP-SGD configuration to its event.
  rdp_accountant          Renyi-DP of the (sub)sampled Gaussian mechanism and conversion to (eps, delta).
  pld_accountant          Privacy-loss-distribution (FFT) accounting; tighter than RDP unless
                          its grid is coarsened (very many steps): the "pld" accountant
                          reports min(PLD, RDP).
  gaussian                Exact (eps, delta) of the Gaussian mechanism and of its compositions
                          without sampling (analytic Gaussian mechanism, Balle & Wang 2018).
  calibration             calibrate(): the parameter (noise multiplier, or a count) that just meets
                          a target (eps, delta).
  compute_dp_sgd_privacy  Library function and command-line tool for a DP-SGD run.
  tuning                  The privacy cost of hyper-parameter tuning (best of a random number
                          of runs, Papernot & Steinke 2022).
"""

import importlib

#: Marks this package as tf_dpkit's accounting package, so that tf_dpkit can tell it apart from
#: an unrelated module or folder named ``analysis`` found earlier on sys.path
#: (see tf_dpkit/_analysis_guard.py).
__tf_dpkit_analysis__ = True


def __getattr__(name):
  """Loads a renamed module's deprecated alias (accountant) on first attribute access."""
  if name in ("accountant",):
    return importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
