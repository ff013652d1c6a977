"""The optional [gate] front door for a single box (off by default).

vllmwatch listens on the public port and forwards to vLLM on a private loopback port. While
vLLM starts, restarts or drains, new requests wait at the door (up to gate.hold_timeout, then
503 with Retry-After) instead of failing, and pass in arrival order once it is ready; answers
stream back chunk by chunk. It runs on its own thread and event loop (aiohttp) and reads only
the daemon's published snapshot.

May import: config, core (types), status (the snapshot), logfn; and aiohttp.
"""
