"""The edge: the one face adapters (channels, providers, coordination, toolsets) may import.

The seams (Protocols) between the core and what plugs into it, and the value types that cross
them: messages, the channel and reply sink, the provider, tools, queues and leases, pairing, the
usage ledger, the tracer, errors and metrics. Nothing here imports another wing.
"""
