"""Access: allowlists and DM pairing, decided before anything reaches the router.
"""
