"""Session logs: format v3, the store seam and its JSONL backend, prompt persistence, replay.

This package depends on nothing else in the project; the gateway builds on it.
"""
