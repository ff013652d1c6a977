"""Whether a request carries vLLM's disaggregated-prefill KV handle (`kv_transfer_params`):
such a request is never replayed.

With a KV connector (`--kv-transfer-config`, e.g. NixlConnector), a router sends a request to
a prefill engine with `"kv_transfer_params": {"do_remote_decode": true}`; that engine answers
with a handle to the KV blocks it keeps for the request (`do_remote_prefill`,
`remote_block_ids`, `remote_engine_id`, `remote_host`, `remote_port`), and the router sends the
request on to a decode engine with that handle. The decode engine reads the blocks from the
prefill engine; the prefill engine frees them once they are read, or unread after
VLLM_NIXL_ABORT_REQUEST_TIMEOUT (480 s) (vLLM's nixl connector: `request_finished` keeps them
in `_reqs_need_send`). A decode engine that died after its read leaves a handle to blocks that
may hold another request's cache by now: sent again, the request could be answered from
another prompt's KV, and nothing would say so. The gate cannot tell whether they were read.
Sending the prefill half again would make a new handle, but what the params mean is each
connector's own (NIXL, Mooncake, LMCache, P2P NCCL name their own keys), and the router that
drives both halves retries them as a pair: so no request that carries kv_transfer_params
(null is none) is sent again; its client gets the 502 that says why, and its router decides.
Imported at a failure of such a request only (the import count of `vllmwatch run`).
May import: the stdlib only.
"""

from __future__ import annotations

import json

WHY = ("it carries kv_transfer_params (a disaggregated prefill's KV handle: its blocks are "
       "freed once read, so sent again it could be answered from another request's cache)")


def why_not(body: bytes) -> str | None:
    """WHY when the body's kv_transfer_params is set (a body that cannot be read: taken as
    set, it names them); None when it is null or absent."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return WHY
    if isinstance(data, dict) and data.get("kv_transfer_params") is None:
        return None
    return WHY
