"""The Telegram channel.

``adapter`` (lifecycle, wiring, the per-update pipeline), ``convert`` (pure Update -> Inbound),
``polling`` (the getUpdates loop), ``webhook`` (the HTTP endpoint), ``sink`` (replies and
Bot API call policy) and ``render`` (Markdown -> Telegram HTML chunks).
"""
