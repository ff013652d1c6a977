"""Secrets in every form vLLM, Python, shells and HTTP print them (issue 37 §1-2).

`leaks()` is a hypothesis strategy of (text that carries a secret, the secret): the tests
feed the text through every writer and assert the secret never comes out.
"""

from __future__ import annotations

import json
import re
import string

import pytest
from hypothesis import strategies as st

from vllmwatch.config import redact

# Secret values: long enough, and with a digit, never a piece of the text around them. None
# has a flag's shape (dashes, then a letter: `--api-key --port` is a flag with no value, for
# vLLM's parser and the redactor), but one in four begins with dashes and then a digit or `_`,
# as a key from secrets.token_urlsafe() may (`--00000A` after `--api-key` was taken for a
# flag and shown): a value, hidden in every form.
_ALPHABET = string.ascii_letters + string.digits + "-_.~+=!$%*"
_plain = st.text(_ALPHABET, min_size=8, max_size=40).filter(
    lambda v: any(c.isdigit() for c in v) and any(c.isalpha() for c in v)
    and not re.match(r"-+[A-Za-z]", v))
_dashed = st.builds("{}{}{}".format, st.sampled_from(("-", "--", "---")),
                    st.sampled_from(string.digits + "_"), _plain)
values = st.one_of(_plain, _plain, _plain, _dashed)
NAMES = ("api_key", "API_KEY", "apiKey", "hf_token", "HF_TOKEN", "password", "DB_PASSWORD",
         "secret", "client_secret", "token", "access_token", "x-api-key", "auth",
         "AWS_SECRET_ACCESS_KEY", "PGPASS", "credentials", "privateKey", "authorization",
         "sig", "X-Amz-Signature")
# A URL's password as people write it: not percent-encoded.
url_values = st.text(_ALPHABET + "/:#?@", min_size=8, max_size=40).filter(
    lambda v: any(c.isdigit() for c in v) and any(c.isalpha() for c in v)
    and not v[0].isdigit())
SPACED_NAMES = ("api_key", "API_KEY", "apiKey", "hf_token", "HF_TOKEN", "DB_PASSWORD",
                "client_secret", "access_token", "AWS_SECRET_ACCESS_KEY", "privateKey")
# A name written as a word, and a value shaped as a credential after it (one word with a
# letter and a digit, no `.`, `=`, `*` or a leading `~`: what a name or code would have).
WORD_NAMES = ("password", "PASSWORD", "Password", "token", "Token", "secret", "key", "api-key",
              "X-Api-Key", "x-api-key", "client-secret", "hf-token", "passphrase", "PGPASSWORD")
names = st.sampled_from(NAMES)
schemes = st.sampled_from(("https", "http", "postgres", "postgresql+psycopg", "redis", "amqp",
                           "s3", "grpc", "mongodb+srv", "ftp"))
hosts = st.sampled_from(("collector:4317", "db.internal:5432", "proxy", "10.0.0.7",
                         "[::1]:8000", "example.com/path?q=1"))


@st.composite
def leaks(draw: st.DrawFn) -> tuple[str, str]:
    """One text that carries a secret, and the secret."""
    v, name = draw(values), draw(names)
    user = draw(st.sampled_from(("user", "bob", "svc-vllm", "")))
    flag = name.lower().replace("_", "-")
    flags = ("api-key", "hf-token", "x-api-key", "password", "client-secret")
    url_secret = draw(url_values)
    if draw(st.integers(0, 5)) == 0:
        return f"{draw(schemes)}://{user or 'u'}:{url_secret}@{draw(hosts)}", url_secret
    forms = [
        f"['vllm', 'serve', '/m', '--{draw(st.sampled_from(flags))}', '{v}', '--port', '8000']",
        json.dumps(["vllm", "serve", f"--{draw(st.sampled_from(flags))}", v]),
        f"{draw(schemes)}://{user}:{v}@{draw(hosts)}",
        f"{draw(schemes)}://{v}@{draw(hosts)}",
        f"DATABASE_URL={draw(schemes)}://{user}:{v}@{draw(hosts)}",
        f"HTTPS_PROXY=http://{user}:{v}@proxy:3128",
        f"--otlp-traces-endpoint https://{user}:{v}@collector:4317",
        f"non-default args: {{'model': '/m', '{name}': '{v}', 'port': 8000}}",
        f"non-default args: {{'{name}': ['{v}']}}",
        f"headers={{'authorization': 'Bearer {v}', 'accept': '*/*'}}",
        f"[('authorization', 'Bearer {v}')]",
        f"(b'authorization', b'Basic {v}')",
        json.dumps({name: v, "model": "/m"}),
        json.dumps({"headers": {"Authorization": f"Bearer {v}"}}),
        f"{name.upper().replace('-', '_')}={v}",
        f'{name.upper().replace("-", "_")}="{v}"',
        f"{name}: {v}",
        f"--{flag} {v}",
        f"--{flag}={v}",
        f"Authorization: Bearer {v}",
        # every cookie of a Cookie header, not only the first (`a=1; session=X` showed X)
        f"Cookie: lang=en; session={v}",
        f"b'GET / HTTP/1.1\\r\\nCookie: theme=dark; sid={v}; x=1\\r\\nHost: h\\r\\n'",
        f"curl -H 'Authorization: Bearer {v}' http://h/v1/models",
        f"poller {name}={v}",
        f"GET /cb?code=1&{name}={v}&x=2",
        # NAME value: a name spelt as an identifier ending with its credential's word
        f"DEBUG {draw(st.sampled_from(SPACED_NAMES))} {v}",
        # a subscript assigned, as a traceback quotes a wrapper's source line
        f"    os.environ['{name.upper().replace('-', '_')}'] = '{v}'",
        f'cfg["{name}"]="{v}"',
    ]
    word = v.replace(".", "").replace("=", "").replace("*", "").lstrip("~")
    if len(word) >= 6 and draw(st.integers(0, 3)) == 0:  # NAME value, the name a word
        said = draw(st.sampled_from(("{} {}", "wrong {} {}, retry", "{} '{}'", "{}\t{}")))
        return said.format(draw(st.sampled_from(WORD_NAMES)), word), word
    text = draw(st.sampled_from(forms))
    shaped = draw(st.sampled_from((f"sk-{v}", f"sk-proj-{v}")))
    if draw(st.booleans()) and v.replace("-", "").replace("_", "").isalnum():
        return f"key is {shaped} here", shaped
    return text, v


# An API key with no token shape: only the known value (what the daemon learns from its key
# file, config/redact.learn) hides it, so a part of it left by a cut is a leak no rule sees.
KNOWN_KEY = "Zq7KnownApiKey9Value3xx"


def known_key(monkeypatch: pytest.MonkeyPatch) -> str:
    """Make KNOWN_KEY the one learnt secret for this test (as the daemon learns its key at a
    launch) and return it; the process-wide set is restored afterwards."""
    monkeypatch.setattr(redact, "KNOWN", redact._Known())
    redact.learn([KNOWN_KEY])
    return KNOWN_KEY
