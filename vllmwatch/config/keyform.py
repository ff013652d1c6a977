"""Pure: an API key vLLM would take but that cannot do its job, refused before a launch.

Whichever source gives it (vllm.api_key_file, [vllm.args] api-key, extra_args, [vllm.env],
vllm.env_file), vLLM enforces `args.api_key or VLLM_API_KEY` and drops an empty key
(vLLM 0.32 middleware/register.py: `[key for key in ... if key]`): `api-key = ""` (or an
unset `$KEY` a migrated line carried) served every client with no authentication at all,
while the config said a key, and the gate and our probes took "" for no key too. A key a
client can never send is the opposite failure: every client gets 401 while vllmwatch's own
probes (/health needs no key) call vLLM healthy. HTTP strips spaces around a header's value,
carries no control character, and vLLM's server (Starlette) reads headers as Latin-1, so a
key with spaces at either end, a control character or a non-ASCII letter never matches; the
OpenAI Python client (httpx) refuses to send a non-ASCII header at all.

The key itself is never said: only which of these it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from vllmwatch.config.crosschecks import secret_sources
from vllmwatch.config.errors import Problem
from vllmwatch.config.sections import Config

VARIABLE = "VLLM_API_KEY"


def why_unusable(key: str) -> str | None:
    """Why clients cannot use this key (said without the key), or None."""
    if not key:
        return ("is empty: vLLM takes an empty key for none and would serve every client "
                "without authentication; set the key (vllm.api_key_file), or remove the "
                "setting to run without one")
    if key != key.strip():
        return ("has spaces or line ends at its start or end, which HTTP strips from a "
                "client's Authorization header: vLLM would answer every client 401; remove them")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in key):
        return ("holds a control character (a tab, a line end, ...), which no HTTP header "
                "carries: vLLM would answer every client 401; remove it")
    if not key.isascii():
        return ("holds a non-ASCII character: vLLM's server reads the Authorization header as "
                "Latin-1 and the OpenAI Python client refuses to send it, so every client "
                "would get 401; use ASCII letters, digits and punctuation")
    return None


def source(config: Config, file_env: Mapping[str, str], file_args: Sequence[str]) -> str:
    """The config key that gave the launch its API key (crosschecks.secret_sources; two are
    refused by secret_twice), else vllmwatch's own environment."""
    given = secret_sources(config, "api-key", file_env, file_args)
    return given[0] if given else f"{VARIABLE} in vllmwatch's own environment"


def problems(child_env: Mapping[str, str], where: str) -> list[Problem]:
    """The launch's key judged. An empty VLLM_API_KEY inherited from vllmwatch's own
    environment is no key, to vLLM as to us (a unit's `Environment=VLLM_API_KEY=` clears
    one): not a refusal; given by the config, it is."""
    key = child_env.get(VARIABLE)
    if key is None or (key == "" and where.endswith("own environment")):
        return []
    why = why_unusable(key)
    return [Problem(where, f"the API key {why}")] if why else []
