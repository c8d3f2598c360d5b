"""TF Privacy's ``privacy.analysis.rdp_accountant``: ``compute_rdp`` and ``get_privacy_spent``
of ``analysis.rdp_accountant`` (the same functions)."""
from analysis.rdp_accountant import compute_rdp, get_privacy_spent

__all__ = ["compute_rdp", "get_privacy_spent"]
