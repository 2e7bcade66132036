"""The program's edges with the system: configuration and numbers parsed from text, outputs written whole, signals.

May import: errors.
"""
