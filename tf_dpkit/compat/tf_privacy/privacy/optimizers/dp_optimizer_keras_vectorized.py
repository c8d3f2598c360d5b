"""TF Privacy's ``privacy.optimizers.dp_optimizer_keras_vectorized``."""
from tf_dpkit.compat.tf_privacy import (VectorizedDPKerasAdagradOptimizer,
                                        VectorizedDPKerasAdamOptimizer,
                                        VectorizedDPKerasSGDOptimizer,
                                        make_vectorized_keras_optimizer_class)

__all__ = ["VectorizedDPKerasAdagradOptimizer", "VectorizedDPKerasAdamOptimizer",
           "VectorizedDPKerasSGDOptimizer", "make_vectorized_keras_optimizer_class"]
