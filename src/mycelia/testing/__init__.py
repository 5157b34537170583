"""``mycelia.testing``: hypothesis strategies, a simulator and invariant checkers.

Needs hypothesis (``pip install mycelia[testing]``).
"""
