"""The accountants by public name: the one registry where names like ``"rdp"`` become objects.

The command line, calibration, ``tf_dpkit.budget`` and ``tf_dpkit.make_private`` take these
names; below them only :class:`analysis.accountant_base.Accountant` objects are passed around.
A new accountant is one subclass and one :func:`register_accountant` call: its name is then
accepted everywhere a name is (``analysis.calibration.calibrate``, the command line's
``--accountant``), and :data:`ACCOUNTANTS` lists it.  No TensorFlow import.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any, Callable

import numpy as np

from analysis import _checks
from analysis.accountant_base import Accountant

__all__ = ["ACCOUNTANTS", "accountant_class", "accountant_names", "check_orders_for",
           "check_steps_for", "make_accountant", "max_steps", "register_accountant",
           "takes_orders", "unregister_accountant"]


@dataclasses.dataclass(frozen=True)
class _Entry:
  load: Callable[[], type]  # the Accountant subclass (imported on first use)
  options: dict[str, Any]   # keyword arguments every instance is made with


_REGISTRY: dict[str, _Entry] = {}


def _lazy(module: str, name: str) -> Callable[[], type]:
  return lambda: getattr(importlib.import_module(module), name)


def register_accountant(name: str, cls, **options) -> None:
  """Makes ``cls`` (an :class:`analysis.accountant_base.Accountant` subclass, or a no-argument
  function returning one, for a lazy import) available as ``name``.

  ``options`` are keyword arguments every instance is created with.  If the class's
  constructor takes ``orders`` the accountant is a Renyi one: callers may pass Renyi orders
  (:func:`takes_orders`).  Its ``max_steps`` class attribute, if any, bounds the steps callers
  accept for it (:func:`max_steps`; default ``analysis._checks.MAX_STEPS`` = 2**53).

  Raises:
    ValueError: ``name`` not a non-empty string or already registered.
  """
  if not isinstance(name, str) or not name:
    raise ValueError(f"name must be a non-empty string, got {name!r}.")
  if name in _REGISTRY:
    raise ValueError(f"accountant {name!r} is already registered; unregister_accountant it "
                     "first.")
  load = cls if not isinstance(cls, type) else (lambda: cls)
  _REGISTRY[name] = _Entry(load, dict(options))


def unregister_accountant(name: str) -> None:
  """Removes ``name`` from the registry (ValueError naming it if it is not registered)."""
  _checks.check_choice("accountant", name, accountant_names())
  del _REGISTRY[name]


def accountant_names() -> tuple[str, ...]:
  """The registered names, in registration order (``"rdp"`` first: the default)."""
  return tuple(_REGISTRY)


def accountant_class(name: str) -> type:
  """The :class:`analysis.accountant_base.Accountant` subclass registered as ``name``.

  Raises:
    ValueError: ``name`` not registered (the message lists the names).
  """
  _checks.check_choice("accountant", name, accountant_names())
  cls = _REGISTRY[name].load()
  if not (isinstance(cls, type) and issubclass(cls, Accountant)):
    raise TypeError(f"accountant {name!r} is registered as {cls!r}, not an "
                    "analysis.accountant_base.Accountant subclass.")
  return cls


def takes_orders(name: str) -> bool:
  """Whether the accountant ``name`` is built from Renyi orders (its constructor takes
  ``orders``)."""
  return "orders" in inspect.signature(accountant_class(name)).parameters


def max_steps(name: str) -> int:
  """The most steps the accountant ``name`` supports (its ``max_steps``, default 2**53)."""
  return int(getattr(accountant_class(name), "max_steps", _checks.MAX_STEPS))


def check_orders_for(name: str, orders):
  """``orders`` for the accountant ``name``: None stays None (the accountant's default);
  otherwise they must be allowed (:func:`takes_orders`) and valid (a non-empty list of orders,
  each in (1, 1e6] or inf), and are returned as a list of floats.

  Raises:
    ValueError: orders given to an accountant without Renyi orders, or invalid orders.
  """
  if orders is None:
    return None
  if not takes_orders(name):
    raise ValueError(f"orders must be None with accountant={name!r} (the "
                     f"{name.upper()} accountant has no Renyi orders), got {orders!r}.")
  from analysis import rdp_accountant  # pylint: disable=g-import-not-at-top
  alphas, _ = _checks.check_orders(
      "orders", list(orders) if isinstance(orders, (tuple, np.ndarray)) else orders,
      max_finite=rdp_accountant.MAX_ORDER)
  return [float(a) for a in alphas]


def check_steps_for(name: str, steps) -> int:
  """``steps`` as an int in [0, :func:`max_steps` (``name``)]; the ValueError names ``steps``
  and, below 2**53, the accountant's supported range."""
  maximum = max_steps(name)
  why = "" if maximum >= _checks.MAX_STEPS else f"the {name.upper()} accountant's supported range"
  return _checks.check_steps("steps", steps, maximum=maximum, why=why)


def make_accountant(name: str = "rdp", *, orders=None) -> Accountant:
  """A fresh accountant by registered name.

  ``"rdp"``: :class:`analysis.rdp_accountant.RdpAccountant` over ``orders`` (default
  ``rdp_accountant.DEFAULT_ORDERS``).  ``"pld"``:
  :class:`analysis.pld_accountant.PLDAccountant` with ``rdp_cap=True`` (the smaller of the PLD
  and the RDP bound; see ``analysis.pld_accountant``).

  Raises:
    ValueError: ``name`` not one of :data:`ACCOUNTANTS`, or ``orders`` given for an
      accountant without Renyi orders.
  """
  cls = accountant_class(name)
  options = dict(_REGISTRY[name].options)
  orders = check_orders_for(name, orders)
  if orders is not None:
    options["orders"] = orders
  return cls(**options)


def __getattr__(name: str):
  if name == "ACCOUNTANTS":  # derived from the registry at every access
    return accountant_names()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


register_accountant("rdp", _lazy("analysis.rdp_accountant", "RdpAccountant"))
register_accountant("pld", _lazy("analysis.pld_accountant", "PLDAccountant"), rdp_cap=True)
