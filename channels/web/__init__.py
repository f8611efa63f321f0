"""The web channel: a chat page and a JSON/SSE API served on the gateway's HTTP server."""
