"""DP versions of ``tf.compat.v1.train`` optimizers for graph-mode (Session) code."""
import tensorflow as tf

from tf_dpkit.optimizers.factory import make_gaussian_optimizer_class

DPGradientDescentGaussianOptimizer = make_gaussian_optimizer_class(
    tf.compat.v1.train.GradientDescentOptimizer)
DPMomentumGaussianOptimizer = make_gaussian_optimizer_class(tf.compat.v1.train.MomentumOptimizer)
DPAdamGaussianOptimizer = make_gaussian_optimizer_class(tf.compat.v1.train.AdamOptimizer)
DPAdagradGaussianOptimizer = make_gaussian_optimizer_class(tf.compat.v1.train.AdagradOptimizer)
DPRMSPropGaussianOptimizer = make_gaussian_optimizer_class(tf.compat.v1.train.RMSPropOptimizer)

__all__ = [
    "DPGradientDescentGaussianOptimizer", "DPMomentumGaussianOptimizer",
    "DPAdamGaussianOptimizer", "DPAdagradGaussianOptimizer", "DPRMSPropGaussianOptimizer",
]
