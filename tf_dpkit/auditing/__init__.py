"""Privacy auditing: empirical lower bounds on epsilon, to catch a DP pipeline that does not do
what its accountant assumes.

    canaries = auditing.make_canaries(1000, num_classes=10, seed=0)
    (x_all, codes), y_all = auditing.training_data(x, y, canaries)
    model = auditing.canary_model(base_model, canaries.num_canaries)   # a DPModel
    model.compile(dp_optimizer, loss=per_example_loss)
    recorder = auditing.CanaryRecorder(canaries)
    model.fit(poisson_batches(((x_all, codes), y_all), ...), callbacks=[recorder], ...)
    audit = auditing.one_run_audit(auditing.canary_scores(recorder.trajectory),
                                   canaries.included, num_guesses=100, delta=1e-5)
    audit.epsilon_lower_bound   # must stay below the accountant's epsilon

* :mod:`tf_dpkit.auditing.canaries`: white-box gradient canaries on a canary head (a logit
  row per canary, or Dirac canaries: a fixed unit gradient in a coordinate of their own),
  their inclusion bits, the training data, the recorders and the scores (white-box from the
  recorded head, black-box from the canaries' losses).
* :mod:`tf_dpkit.auditing.audits`: the one-run audit (Steinke, Nasr & Jagielski 2023, and the
  f-DP bound of Mahloujifar, Melis & Chaudhuri 2024 on the same guesses), the
  many-run audit (Jagielski, Ullman & Oprea 2020) and a membership-inference report; the
  statistics are in :mod:`analysis.auditing`.
* :mod:`tf_dpkit.auditing.broken`: deliberately broken DP-SGD variants the audit must catch.
"""
from tf_dpkit.auditing import broken
from tf_dpkit.auditing.audits import (ManyRunAudit, MembershipInferenceReport, OneRunAudit,
                                      many_run_audit, membership_inference_report, one_run_audit)
from tf_dpkit.auditing.canaries import (CanaryRecorder, CanarySet, DiracRecorder,
                                        black_box_scores, canary_model, canary_scores,
                                        dirac_canary_model, dirac_loss, dirac_training_data,
                                        make_canaries, training_data)

__all__ = ["broken", "ManyRunAudit", "MembershipInferenceReport", "OneRunAudit",
           "many_run_audit", "membership_inference_report", "one_run_audit", "CanaryRecorder",
           "CanarySet", "DiracRecorder", "dirac_canary_model", "dirac_loss",
           "dirac_training_data", "black_box_scores", "canary_model", "canary_scores", "make_canaries", "training_data"]
