"""The agent: one turn's loop of provider calls and tool rounds, every call recorded first.

The loop (``loop``), the provider call with its recording step (``call``, ``recorder``), the
conversation a turn runs in and the window of it a call sees, compaction, the prompt and the
tool set a call offers.
"""
