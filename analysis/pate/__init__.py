"""Privacy analysis of PATE (Private Aggregation of Teacher Ensembles), without TensorFlow.

The contract, in short: ``votes`` are per-class teacher counts (non-negative integers, or any
finite reals for Interactive GNMax's shifted histogram with ``shifted=True``); neighbouring
histograms differ by one moved vote (one teacher's data changed: replacing one record under
``tf_dpkit.pate``'s position-based partition); orders are Renyi orders in (1, inf]; RDP and
epsilon are in nats; every function checks its arguments and raises ``ValueError`` naming the
argument and its allowed range.  Data-dependent quantities (computed from the votes) are
private; :class:`PateAccountant` says which of its numbers may be published.

The mathematics (GNMax, the threshold check, LNMax, the smooth-sensitivity bounds and the
conditions they rely on), with references to PATE 2017 / 2018: ``docs/design/pate.md``.
Sub-modules (private): ``_mechanisms`` (per-query RDP), ``_smooth`` (smooth sensitivity),
``_events`` (each aggregator's query as a :class:`PateEvent`), ``_accountant``
(:class:`PateAccountant`, which composes events), ``_settings`` (suggested Confident GNMax
settings).  No TensorFlow import; numpy and scipy only.
"""
from analysis.pate._accountant import PateAccountant, SanitizedEpsilon
from analysis.pate._events import (ConfidentGNMaxEvent, GNMaxEvent, InteractiveGNMaxEvent,
                                   LNMaxEvent, PateEvent, ThresholdCheckEvent)
from analysis.pate._settings import ConfidentGNMaxSettings, suggest_confident_gnmax
from analysis.pate._mechanisms import (log_pr_answered, log_q_gnmax, log_q_lnmax, rdp_gnmax,
                                       rdp_gnmax_data_independent, rdp_lnmax,
                                       rdp_lnmax_data_independent, rdp_threshold,
                                       rdp_threshold_data_independent)
from analysis.pate._smooth import (_gnmax_table, _threshold_c5, local_sensitivity_gnmax,
                                   local_sensitivity_threshold, rdp_smooth_sensitivity_release,
                                   smooth_sensitivity_gnmax, smooth_sensitivity_threshold)

__all__ = [
    "ConfidentGNMaxEvent",
    "ConfidentGNMaxSettings",
    "GNMaxEvent",
    "InteractiveGNMaxEvent",
    "LNMaxEvent",
    "PateAccountant",
    "PateEvent",
    "SanitizedEpsilon",
    "ThresholdCheckEvent",
    "local_sensitivity_gnmax",
    "local_sensitivity_threshold",
    "log_pr_answered",
    "log_q_gnmax",
    "log_q_lnmax",
    "rdp_gnmax",
    "rdp_gnmax_data_independent",
    "rdp_lnmax",
    "rdp_lnmax_data_independent",
    "rdp_smooth_sensitivity_release",
    "rdp_threshold",
    "rdp_threshold_data_independent",
    "smooth_sensitivity_gnmax",
    "smooth_sensitivity_threshold",
    "suggest_confident_gnmax",
]
