"""TF Privacy's ``privacy.optimizers.dp_optimizer_keras``: its Keras DP optimizers."""
from tf_dpkit.compat.tf_privacy import (DPKerasAdagradOptimizer, DPKerasAdamOptimizer,
                                        DPKerasSGDOptimizer, make_keras_optimizer_class)

__all__ = ["DPKerasAdagradOptimizer", "DPKerasAdamOptimizer", "DPKerasSGDOptimizer",
           "make_keras_optimizer_class"]
