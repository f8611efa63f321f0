"""The Slack channel (Events API over HTTP or Socket Mode, via slack_bolt and slack_sdk).

``adapter`` (the channel: lifecycle, queue, health), ``events`` (the bolt app and the
aiohttp bridge), ``socket`` (Socket Mode), ``convert`` (pure: event -> Inbound), ``sink``
(replies: streamed edits in the thread), ``render`` (pure: Markdown -> mrkdwn chunks).
"""
