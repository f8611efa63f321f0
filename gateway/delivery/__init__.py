"""Delivery: from a received message to exactly one answer, across workers and crashes.

The router (owed, recorded, acknowledged, queued), serving an item's turn, takeover of another
worker's items, the registry of open sessions, the sink that marks an item answered, and who
said what in a shared conversation.
"""
