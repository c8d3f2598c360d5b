"""The pieces of :mod:`analysis.rdp_accountant` (its public facade), split along their seams.

Private: import the public names from ``analysis.rdp_accountant``.  The mathematics of every
piece is in docs/design/rdp_accountant.md.
"""
