"""TF Privacy's ``privacy.optimizers.dp_optimizer``: DP ``tf.compat.v1.train`` optimizers
(``tf_dpkit.v1``: vector loss, microbatches, secret-keyed noise)."""
from tf_dpkit.v1 import (DPAdagradGaussianOptimizer, DPAdamGaussianOptimizer,
                         DPGradientDescentGaussianOptimizer, DPMomentumGaussianOptimizer,
                         DPRMSPropGaussianOptimizer)

__all__ = ["DPAdagradGaussianOptimizer", "DPAdamGaussianOptimizer",
           "DPGradientDescentGaussianOptimizer", "DPMomentumGaussianOptimizer",
           "DPRMSPropGaussianOptimizer"]
