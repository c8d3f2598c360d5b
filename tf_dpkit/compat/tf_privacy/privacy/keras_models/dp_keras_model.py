"""TF Privacy's ``privacy.keras_models.dp_keras_model``: DP-SGD in ``fit``."""
from tf_dpkit.compat.tf_privacy import DPModel, DPSequential, make_dp_model_class

__all__ = ["DPModel", "DPSequential", "make_dp_model_class"]
