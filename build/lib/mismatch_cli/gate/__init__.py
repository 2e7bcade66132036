"""Comparing runs and checking limits: compare, compare_many, check, their rules and noise.

May import: api, correction, errors, metrics, report, system.
"""
