"""TF Privacy's ``privacy.optimizers`` package path (see ``tf_dpkit.compat.tf_privacy.privacy``)."""
