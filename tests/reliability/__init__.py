"""Reliability, security and performance proofs: fuzzing, bad input, faults, load."""
