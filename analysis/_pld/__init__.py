"""The pieces of :mod:`analysis.pld_accountant` (its public facade), split along their seams.

Private: import the public names from ``analysis.pld_accountant``.  The method and its error
bounds are in docs/design/pld_accountant.md.
"""
