"""Deprecated alias of :mod:`analysis.accountant_base`, removed in the next release.

The accountant base class moved to ``analysis.accountant_base`` so that its name no longer
reads like the registry beside it (:mod:`analysis.accountants`).  Import from
``analysis.accountant_base`` instead; the names below are the same objects.
"""
from analysis.accountant_base import Accountant, group_privacy_epsilon, pure_gaussian_noise

__all__ = ["Accountant", "group_privacy_epsilon", "pure_gaussian_noise"]
