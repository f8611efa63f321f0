"""The console channel: ``gateway chat``, a terminal REPL over the gateway's router."""
