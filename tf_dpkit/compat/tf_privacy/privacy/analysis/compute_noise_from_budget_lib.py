"""TF Privacy's ``privacy.analysis.compute_noise_from_budget_lib``."""
from tf_dpkit.compat.tf_privacy import compute_noise

__all__ = ["compute_noise"]
