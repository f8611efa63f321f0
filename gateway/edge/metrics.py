"""Prometheus metrics of one gateway instance (own registry, so tests and workers don't share).

Every family of ours is named ``gateway_...``. The process metrics keep their standard names
(``process_cpu_seconds_total``, ``process_resident_memory_bytes``, ``process_open_fds``...,
the client library's process collector), so stock dashboards and alerts find them; Prometheus
tells two programs on one host apart by their ``job`` and ``instance`` labels.
Words: a *turn* answers one inbound message, a *call* is one provider request.

No label carries an id a platform chose: the ``tenant`` label is the tenant for the tenants
the gateway names itself (``default``, ``web``) and the channel's name for the others (every
Slack workspace counts under ``slack``, never under its team id: :func:`tenant_label`).
Per-workspace figures are in the usage ledger (``gateway usage --by tenant``), which only the
operator reads.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)

from gateway.edge.ids import DEFAULT_TENANT, WEB_TENANT

SERVER_TENANTS: Final = frozenset({DEFAULT_TENANT, WEB_TENANT})
"""Tenants the gateway names itself: the only ones shown by name in a label."""

LATENCY_BUCKETS = (0.005, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
NOTE_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1, 5)
"""A note of where an answer went is one log append: sub-millisecond on a quiet disk."""


class Metrics:
    """The gateway's counters and gauges; served as text on ``/metrics``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # reads /proc on each scrape
        self.turns = Counter("gateway_turns_total", "Turns finished", ["channel", "outcome"],
                             registry=r)
        self.turn_latency = Histogram(
            "gateway_turn_latency_seconds",
            "Time to answer one inbound message (every call and tool run of the turn)",
            ["channel", "outcome"], registry=r, buckets=LATENCY_BUCKETS,
        )
        self.provider_calls = Counter("gateway_provider_calls_total", "Provider calls",
                                      ["provider", "model", "outcome"], registry=r)
        self.provider_latency = Histogram(
            "gateway_provider_latency_seconds", "Latency of one provider call",
            ["provider", "model", "outcome"], registry=r, buckets=LATENCY_BUCKETS,
        )
        self.tokens = Counter(
            "gateway_tokens_total", "Tokens of answered provider calls, by kind: input "
            "(uncached), cache_write, cache_read, output", ["provider", "model", "tenant", "kind"],
            registry=r)
        self.cost = Counter(
            "gateway_cost_usd_total", "What answered provider calls cost, in US dollars, by the "
            "price table (models without a price are not counted)",
            ["provider", "model", "tenant"], registry=r)
        self.tool_calls = Counter("gateway_tool_calls_total", "Tool calls by outcome",
                                  ["server", "tool", "outcome"], registry=r)
        self.tool_latency = Histogram(
            "gateway_tool_latency_seconds", "Latency of one tool call", ["server", "tool"],
            registry=r, buckets=LATENCY_BUCKETS,
        )
        self.limited = Counter(
            "gateway_limited_total", "Turns refused by a budget or rate limit, before any "
            "provider call", ["tenant", "limit"], registry=r)
        self.persist_failures = Counter(
            "gateway_persist_failures_total", "Session writes that failed or timed out", ["kind"],
            registry=r,
        )
        self.reply_note_seconds = Histogram(
            "gateway_reply_note_seconds",
            "Time from a platform returning the id of a message that will carry an answer to "
            "that id being in the session log (the window in which a crash leaves a stray "
            "placeholder)", ["channel"], registry=r, buckets=NOTE_BUCKETS,
        )
        self.reply_notes_unwritten = Counter(
            "gateway_reply_notes_unwritten_total",
            "Platform messages of an answer whose id the session log could not take",
            ["channel"], registry=r)
        self.queue_depth = Gauge("gateway_queue_depth", "Inbound messages waiting for a turn",
                                 registry=r)
        self.active_turns = Gauge("gateway_active_turns", "Turns running now", registry=r)
        self.retained = Counter("gateway_retention_removed_total",
                                "Sessions and unreferenced blobs removed by retention",
                                ["kind"], registry=r)
        self.turn_limit = Gauge("gateway_turn_limit",
                                "Turns this worker runs at once at most (fixed or derived)",
                                registry=r)
        self.inbound = Counter("gateway_inbound_total", "Inbound messages accepted", ["channel"],
                               registry=r)
        self.duplicates = Counter("gateway_duplicates_dropped_total",
                                  "Inbound deliveries dropped as duplicates", ["channel"],
                                  registry=r)
        self.refused = Counter("gateway_refused_total",
                               "Inbound messages refused by access control",
                               ["channel", "reason"], registry=r)
        self.requests_refused = Counter(
            "gateway_requests_refused_total",
            "HTTP requests refused before reaching a handler's work (signature, secret, token, "
            "size, time)", ["endpoint", "reason"], registry=r)
        self.schedule_occurrences = Counter(
            "gateway_schedule_occurrences_total", "Scheduled occurrences by what became of "
            "them: fired (owed to their conversation) or skipped (late, or unreachable)",
            ["outcome"], registry=r)
        self.schedule_held = Counter(
            "gateway_schedule_held_total", "Deliveries of scheduled occurrences put off for "
            "later, by reason: rate_limit (the tenant's GATEWAY_SCHEDULE_PER_MINUTE) or "
            "unavailable (the router could not take it)", ["reason"], registry=r)
        self.channel_errors = Counter("gateway_channel_errors_total",
                                      "Errors talking to a platform", ["channel", "kind"],
                                      registry=r)

    def render(self) -> bytes:
        return generate_latest(self.registry)


def tenant_label(tenant: str, channel: str) -> str:
    """The ``tenant`` label of a conversation of ``channel`` in ``tenant`` (module docstring)."""
    return tenant if tenant in SERVER_TENANTS else channel
