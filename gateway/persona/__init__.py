"""The persona: the system prompt, built from layers with explicit owners, and memory scopes.
"""
