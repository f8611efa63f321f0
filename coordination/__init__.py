"""Coordination between gateway workers: one process, or several sharing Redis and PostgreSQL.

The seam is :class:`gateway.edge.coordination.Coordinator`; the composition root picks
:class:`~coordination.local.InProcessCoordinator` (the default) or, with
``GATEWAY_REDIS_URL``, :class:`~coordination.redis_coordinator.RedisCoordinator`.
Nothing outside the composition root imports a concrete coordinator (or ``redis``).

Several workers, in short:

* **Receiving.** A message is written to the ``inbox`` table in PostgreSQL (the durable
  record of what is owed; its platform id refused there as a duplicate in the same
  statement), and only then acknowledged; then the receiver tries to take the conversation's
  lease in Redis (``SET NX PX``). The worker that gets it serves the conversation; otherwise
  the holder reaches the message in arrival order. Nothing is written to the session by the
  receiver.
* **Serving.** The holder takes the oldest unanswered row, records it in the session (under a
  fencing token from PostgreSQL's ``fences`` sequence, see :mod:`gateway.delivery.registry`) as its
  turn starts, runs the turn, and marks the row answered the moment the reply is out. With
  the queue empty it gives the lease up and looks once more, so a message entered meanwhile
  is either seen or finds the lease free. Leases are renewed every ``ttl/3`` while held; a
  :mod:`.lease_guard` stops the turn as soon as the lease may have lapsed
  (:mod:`.redis_queue`).
* **Replies.** Web requests wait on the worker that received them; the holder relays reply
  events to it through a Redis list (:mod:`.relay`). Telegram and Slack replies are sent by
  the holder itself. A retried web request (same message id) gets the recorded answer.
* **Failures.** A dead worker's lease lapses after the ttl; a sweep on every worker adopts
  conversations with unanswered rows and no holder, with a newer token, so the dead worker's
  writes are refused by the store if it comes back. The head row comes back marked *resumed*:
  the session log says whether it was recorded (its ``meta.item``) and how far its turn got,
  and it is finished without being recorded or answered twice (:mod:`gateway.delivery.takeover`).
  Redis losing its state (a restart without persistence, FLUSHDB, a failover) loses leases
  and relayed reply events, never a message, and tokens never go back.
* **Singletons.** Telegram long polling and Slack Socket Mode run on the worker elected
  through a leader lease (:mod:`.leader`). Keys: :mod:`.keys`.
"""
