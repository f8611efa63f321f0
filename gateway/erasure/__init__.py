"""Erasure: a person's data removed on request (``gateway forget``, ``/forget``).
"""
