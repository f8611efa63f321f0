"""Coordination between gateway workers: one process, or several sharing Redis and PostgreSQL.

The seam is :class:`gateway.coordination.base.Coordinator`; the composition root picks
:class:`~gateway.coordination.local.InProcessCoordinator` (the default) or, with
``GATEWAY_REDIS_URL``, :class:`~gateway.coordination.redis_coordinator.RedisCoordinator`.
Nothing outside the composition root imports a concrete coordinator (or ``redis``).

Several workers, in short:

* **Receiving.** A message is pushed onto its conversation's Redis queue, in one script with
  the platform-id dedup and an attempt to take the conversation's lease (:mod:`.scripts`).
  The worker that gets the lease serves the conversation; otherwise the holder reaches the
  message in arrival order. Nothing is written to the session by the receiver.
* **Serving.** The holder takes the queue head, records it in the session (under the lease's
  fencing token, see :mod:`gateway.registry`) as its turn starts, runs the turn, and only then
  removes it. It releases the lease in the script that finds the queue empty, so a message
  pushed meanwhile is either seen by the holder or finds no holder and is served by its
  receiver. Leases are renewed every ``ttl/3`` while held (:mod:`.redis_queue`).
* **Replies.** Web requests wait on the worker that received them; the holder relays reply
  events to it through a Redis list (:mod:`.relay`). Telegram and Slack replies are sent by
  the holder itself.
* **Failures.** A dead worker's lease lapses after the ttl; a sweep on every worker adopts
  conversations with items and no holder, with a higher token, so the dead worker's writes
  are refused by the store if it comes back. The head item comes back marked *resumed*: the
  session log says whether it was recorded (its ``meta.item``) and how far its turn got, and
  it is finished without being recorded or answered twice (:mod:`.resume`). A worker that
  cannot confirm its lease stops its turn before the lease can lapse.
* **Singletons.** Telegram long polling and Slack Socket Mode run on the worker elected
  through a leader lease (:mod:`.leader`). Keys: :mod:`.keys`.
"""
