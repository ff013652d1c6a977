"""Which names say that their value is a secret: a variable, a flag, a JSON or TOML key,
judged by its words, so counts and paths stay readable (`prompt_tokens`, `prompt_token_ids`,
`--ssl-keyfile`, `KEY_PATH`) while `HF_TOKEN`, `--api-key`, `dbPassword`, `hf_tokens` are
hidden. The redactor (config/redact.py) and every writer that drops a value by its name
(init, migrate, the environment shown in records) ask here. Pure: stdlib only."""

from __future__ import annotations

import re
from collections.abc import Mapping

# A name is secret when one of its words is one of these ...
_WORDS = frozenset({"key", "token", "secret", "secrets", "password", "passwords",
                    "passwd", "pass", "pwd", "pw", "passphrase", "credential", "credentials",
                    "cred", "creds",
                    "auth", "authorization", "apikey", "cookie", "privatekey",
                    "sig", "signature"})  # a signed URL's proof: Azure SAS `sig=`, S3's
# ... or ends in one of these (`hftoken`, `accesskey`, `dbpassword`, `pgpass`, MinIO's
# `secretkey`) ... A `...key` ending only with a word that says which credential: a bare one
# reads `hotkey`, `monkey`, `turkey` as secrets.
_ENDINGS = ("token", "apikey", "secret", "password", "passwd", "pass", "webhook",
            *(q + "key" for q in ("access", "private", "secret", "signing", "master",
                                  "encryption", "session", "account", "auth", "license")))
# A webhook's URL carries its secret in the path (Slack's /services/T../B../XXXX): the URL
# is the credential, not a place to find it (`SLACK_WEBHOOK_URL` showed in clear).
_WEBHOOK_URLS = frozenset({"url", "uri", "urls", "endpoint"})
# ... unless its last word says the value is about the secret, not the secret itself: an
# `_id`/`_ids` is an identifier (`prompt_token_ids`, `stop_token_ids`, `key_id`), never the
# credential (an AWS key id's AKIA... shape is hidden as a token anyway).
_ABOUT = frozenset({"file", "path", "dir", "size", "len", "length", "count", "type", "mode",
                    "name", "format", "url", "env", "var", "ttl", "timeout",
                    "expiry", "prefix", "id", "ids",
                    # an exception class names what failed: `KeyError: 'model.layers.0...'`
                    # hid the missing weight's name, the cause of the crash
                    "error", "exception", "warning", "config"})
# A tokenizer's special tokens are text, not credentials (`eos_token: '</s>'`).
_SPECIAL = frozenset({"eos", "bos", "pad", "unk", "sep", "cls", "mask", "special", "stop",
                      "additional", "image", "audio", "video", "chat"})
# A plural `keys`/`tokens` is a list of names or a count (`restart_keys`, `prompt_tokens`)
# unless a word before it says which credential (`api_keys`, `hf_tokens`, `accessTokens`).
_PLURALS = frozenset({"keys", "tokens"})
_QUALIFIERS = frozenset({"api", "access", "auth", "secret", "private", "hf", "bearer",
                         "refresh", "session", "client", "ssh", "signing", "encryption"})
_PLURAL_ENDINGS = tuple(q + p for q in _QUALIFIERS for p in _PLURALS)
# A header's value is what the server checks, so `AUTHORIZATION_HEADER`, `API_KEY_HEADER` are
# judged by their other words (a `*_HEADER_NAME` stays readable); a list of headers
# (`OTEL_EXPORTER_OTLP_HEADERS="x-honeycomb-team=..."`) carries credentials under names no rule
# knows, so it is hidden whole, unless a word before says it lists header names or switches
# them (`--allowed-headers`, `--enable-request-id-headers`).
_HEADER_LISTS = frozenset({"allowed", "allow", "expose", "exposed", "enable", "disable"})
# A name with one of these words is a number about tokens or keys (`max_token`, `num_keys`).
_COUNTS = frozenset({"num", "max", "min", "total", "count", "counts"})
_SPLIT = re.compile(r"[^A-Za-z0-9]+|(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")


def is_secret_name(name: str) -> bool:
    """Whether a variable, flag or key name says its value is a secret. A dotted name (vLLM's
    `--compilation-config.pass_config.enable_fusion`, `db.password`) by its last key: the
    value is that key's, and the ones before name where it lives."""
    words = [w.lower() for w in _SPLIT.split(name.rstrip(".").rsplit(".", 1)[-1]) if w]
    if len(words) > 1 and words[-1] in _WEBHOOK_URLS and words[-2].endswith("webhook"):
        return True
    if not words or words[-1] in _ABOUT or _COUNTS.intersection(words):
        return False
    if words[-1] in ("token", "tokens") and len(words) > 1 and words[-2] in _SPECIAL:
        return False
    if words[-1] == "headers" and len(words) > 1:
        return not _HEADER_LISTS.intersection(words)
    if words == ["pwd"]:  # the shell's working directory (PWD), in every child's environment
        return False
    return any(w in _WORDS or w.endswith(_ENDINGS) or w.endswith(_PLURAL_ENDINGS)
               or (w in _PLURALS and _QUALIFIERS.intersection(words[:i]))
               for i, w in enumerate(words))


def secrets_of(env: Mapping[str, str], api_key: str | None) -> list[str]:
    """The secret values of a child's environment (by name), and its API key."""
    found = [v for k, v in env.items() if is_secret_name(k)]
    return [*found, api_key] if api_key else found
