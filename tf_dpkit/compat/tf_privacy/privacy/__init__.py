"""TF Privacy's deep module paths (``tensorflow_privacy.privacy...``) under
``tf_dpkit.compat.tf_privacy.privacy...``, so that imports rewritten by a find-and-replace keep
working.  Each module re-exports the names of ``tf_dpkit.compat.tf_privacy`` that TF Privacy
kept there; nothing here has behaviour of its own.  Paths not listed in
``docs/migration_from_tf_privacy.md`` do not exist: import from ``tf_dpkit.compat.tf_privacy``.
"""
