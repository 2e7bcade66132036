"""What a report answers: health verdict, diagnosis, findings, recommendation, drift.

May import: correction, metrics, errors.
"""
