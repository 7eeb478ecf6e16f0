"""Straggler scoring (pure): which rank is slow, from per-rank step and phase times.

``detector``: the windowed test that names a slow rank; ``student_t``: its t distribution; ``skew``: the
per-step spread across ranks.
"""
