"""TF Privacy's ``privacy.analysis.compute_dp_sgd_privacy_lib``."""
from tf_dpkit.compat.tf_privacy import (AccountantType, compute_dp_sgd_privacy,
                                        compute_dp_sgd_privacy_statement)

__all__ = ["AccountantType", "compute_dp_sgd_privacy", "compute_dp_sgd_privacy_statement"]
