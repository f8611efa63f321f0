"""Scheduled and proactive turns: reminders people set in chat, operators' schedules and the
heartbeat, fired exactly once through the same owed-item path as a platform message.

``triggers`` (when: one instant, an interval, a cron expression, read in a time zone),
``store`` (the seam; backends in ``sessions/``), ``service`` (create, list and cancel in one
owner's scope, with limits), ``fire`` (the inbound a firing hands the router), ``scheduler``
(the task that claims and delivers due occurrences), ``tools`` (``schedule_create``,
``schedule_list``, ``schedule_cancel``), ``command`` (``/reminders``), ``erasure`` (the
eraser's step).
"""
