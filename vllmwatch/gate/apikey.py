"""The API key at the gate: asked for on the paths vLLM leaves open (key_refused), and of
requests held at the door at once, against the key of the engine they wait for (HeldKey)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac

from aiohttp import web

from vllmwatch.gate.door import Door, Fence, Readiness

# ---- the API key on the paths vLLM leaves open ---------------------------------------
# vLLM 0.32's key middleware (entrypoints/serve/middleware/authenticate.py, added for
# `--api-key` or VLLM_API_KEY by register.py:33-36) guards only paths starting with these
# prefixes (:11, :59); /pooling, /score, /rerank, /classify, /tokenize and /detokenize run
# the model (or its tokenizer) for anyone who reaches the port. Clients see one address, the
# gate's, and an operator who set a key expects every inference path there to need it, so the
# gate asks for it where vLLM does not, the way vLLM does (key_refused). Under the prefixes
# vLLM's own check answers, against the key of the engine that got the request: the gate does
# not repeat it (a second check could only disagree with vLLM's while a rotation relaunches).
VLLM_GUARDED = ("/v1", "/v2", "/inference", "/cohere")
# Open in vLLM, and kept open here: liveness and monitoring (load balancers, Prometheus) read
# them without a key in vLLM, and they run nothing of the model.
KEYLESS = frozenset({"/health", "/metrics", "/version"})


def key_refused(method: str, path: str, authorization: str | None, key: str | None,
                held: bool = False) -> bool:
    """Whether the gate answers this allow-listed request 401 itself: a key is set, the path
    is one vLLM leaves open (any but KEYLESS when `held`: HeldKey) and not KEYLESS, and the
    request is not OPTIONS (vLLM lets CORS preflights through: :50) nor carries
    `Authorization: Bearer <key>` (:30-45: the scheme in any case, everything after the first
    space the token). Compared as vLLM does, SHA-256 digests in constant time: how long a
    refusal takes says nothing of the key."""
    if not key or method == "OPTIONS" or path in KEYLESS or (
            path.startswith(VLLM_GUARDED) and not held):
        return False
    scheme, _, token = (authorization or "").partition(" ")
    given = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
    same = hmac.compare_digest(given, hashlib.sha256(key.encode("utf-8")).digest())
    return not (same and scheme.lower() == "bearer")


class HeldKey:
    """The key of the engine vllmwatch launched last (Forwarder.new_engine) for requests held
    at the door: they wait for that engine, so one it would refuse (no key, a wrong one; on
    vLLM's prefixes too) gets its 401 at once, not when it is READY (a whole restart later, a
    503 "retry" at gate.hold_timeout). Once it is told to stop (the fence) the next launch
    reads the key file again (a rotation): unknown until that launch, then checked."""

    def __init__(self, fence: Fence) -> None:
        self.fence = fence
        self.key: str | None = None
        self.gen: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed = asyncio.Event()  # set (and replaced) at each launch

    def launched(self, gen: int, key: str | None) -> HeldKey:
        """Engine `gen` was launched, enforcing `key`; any thread. Itself."""
        self.key, self.gen = key, gen
        with contextlib.suppress(RuntimeError, AttributeError):  # no loop, or it closed
            self._loop.call_soon_threadsafe(self._wake)  # type: ignore[union-attr]
        return self

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def refuses(self, method: str, path: str, authorization: str | None) -> bool:
        """Whether the engine a held request waits for is known and would refuse it."""
        return not self.fence.stopped(self.gen) and key_refused(
            method, path, authorization, self.key, held=True)

    def refuses_now(self, door: Door, method: str, path: str, authorization: str | None
                    ) -> bool:
        """Whether enter() would answer "unauthorized" at once to a request arriving now: told
        from its head alone, before its 100 Continue or body (gate/head.py). A door that lets
        it pass: the key_refused paths; one that holds it: the engine it waits for (refuses)."""
        door.refresh()
        if not door.waiting and door.state != Readiness.HOLD:
            return door.state == Readiness.OPEN and key_refused(
                method, path, authorization, self.key)
        return self.refuses(method, path, authorization)

    async def enter(self, door: Door, timeout: float, request: web.Request
                    ) -> bool | str | None:
        """door.enter(timeout), or "unauthorized": at once while it is held and its engine's
        key refuses it, or once the door opens on a path vLLM leaves open (key_refused)."""
        method, path, auth = request.method, request.path, request.headers.get("Authorization")
        self._loop = asyncio.get_running_loop()
        door.refresh()
        if not door.waiting and door.state != Readiness.HOLD:
            passed = await door.enter(timeout)  # not held: the engine (or the gate) checks now
        else:
            entering = asyncio.ensure_future(door.enter(timeout))
            try:
                while not entering.done() and not self.refuses(method, path, auth):
                    changed = asyncio.ensure_future(self._changed.wait())
                    try:  # (a client that leaves cancels this: its waiter task goes too)
                        await asyncio.wait({entering, changed},
                                           return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        changed.cancel()
                if not entering.done():
                    return "unauthorized"
                passed = entering.result()
            finally:
                entering.cancel()  # (its waiter leaves the queue: door.enter's finally)
        return "unauthorized" if passed and key_refused(method, path, auth, self.key) else passed
