"""Coordination between gateway workers: one process, or several sharing Redis and PostgreSQL.

The seam is :class:`gateway.coordination.base.Coordinator`; the composition root picks
:class:`~gateway.coordination.local.InProcessCoordinator` (the default) or, with
``GATEWAY_REDIS_URL``, :class:`~gateway.coordination.redis_coordinator.RedisCoordinator`.
Nothing outside the composition root imports a concrete coordinator (or ``redis``).
"""
