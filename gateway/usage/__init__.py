"""Usage: what calls cost, the budgets and rate limits on it, and ``/usage``.
"""
