"""TF Privacy's ``privacy.keras_models`` package path (see ``tf_dpkit.compat.tf_privacy.privacy``)."""
