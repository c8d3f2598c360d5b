"""TF Privacy's ``privacy.analysis`` package path (see ``tf_dpkit.compat.tf_privacy.privacy``)."""
