"""The one set of redaction rules for everything vllmwatch writes (issue 37 §1-2): records, log
events, /status, STATUS=, `incidents show` pass through `Redactor`. What is hidden: every secret
value the daemon knows (`learn`: the API key, secret variables, the flags of vllm.env_file),
wherever it appears, with the rest of a token it is part of; the value after a secret-looking
name in every form vLLM, Python and shells print (`--api-key X`, `HF_TOKEN=X`, `HF_TOKEN X`,
`'api_key': ['X']`, `('authorization', 'Bearer X')`, `{'name': 'HF_TOKEN', 'value': 'X'}`), an
`Authorization:` header's credentials (`Token token="X"` too); each key of `--api-key K1 K2`;
- a client's password (`curl -u user:X`, `mysql -pX`, `htpasswd -b f u X`); a URL's session id
  (`;sid=X`) or one-time code (`?code=X`); URL userinfo, any scheme (`https://user:X@host`
  keeps the user; `scheme://X@host`, `https://X:x-oauth-basic@host` hide X, unless X is a login
  name: `ssh://git@h`); `Bearer X`, `Bearer: X`; PEM private keys; tokens of known shapes
  (`sk-...`, `hf_...`, `ghp_...`, `AKIA...`, `AIza...`, `ya29.`, `nvapi-...`, `xox?-...`, JWTs).
Names are judged by their words, so counts and paths stay readable (`prompt_tokens=5`,
`--ssl-keyfile /etc/k.pem`, `KEY_PATH=/x`). Pure: stdlib and config only."""

from __future__ import annotations

import re
import threading
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from vllmwatch.config import secretnames as names
from vllmwatch.config.launch import CLIENTS, ENCODED, TOKENS, client_hidden
from vllmwatch.config.launch import redact_argv as redact_argv
from vllmwatch.config.secretnames import DONE as _DONE
from vllmwatch.config.secretnames import HINT_WORDS, RULES, SPACE, path_value, sub_named
from vllmwatch.config.secretnames import REDACTED as REDACTED
from vllmwatch.config.secretnames import _spaced_name as _names_the_credential
from vllmwatch.config.secretnames import is_secret_name as is_secret_name
from vllmwatch.config.secretvalues import COLOURS, JOINED, VALUE_I, tail_window

MIN_SECRET = 4  # a shorter known "secret" would redact ordinary words
# An excerpt (head, tail) is redacted over this much more than it keeps: a secret that starts
# inside the excerpt and is shorter than this is matched whole before the cut.
EXCERPT_MARGIN = 4096
# Values of secret-named variables that are switches, not secrets (VLLM_USE_AUTH=true).
_NOT_VALUES = frozenset({"true", "false", "none", "null", "yes", "no", "auto", "on", "off",
                         "enabled", "disabled", "required", "optional", "default"})
_CRED = r"(?:<redacted>|(?!\\[nrt])[^\s'\",;)}\]>]|" + JOINED + ")+"
# name=value, a quoted value closed within a bound (unclosed, it would rescan the line's end)
_PARAM = r"[\w-]+=(?:\"[^\"\\\n]{0,256}\"|\\\"[^\"\\\n]{0,256}\\\"|" + _CRED + ")"
_SHAPES = (
    # a token as the user: https://TOKEN@host, https://TOKEN:x-oauth-basic@host (GitHub)
    re.compile(r"(?i)(?P<pre>\b[a-z][a-z0-9+.-]{0,31}://)(?P<secret>[^\s/?#@:'\"]+)"
               r"(?=(?::x-oauth-basic)?@)"),
    # URL userinfo, any scheme: keep the user when there is a password (quoted: `u:"X"@h`)
    re.compile(r"(?i)(?P<pre>\b[a-z][a-z0-9+.-]{0,31}://[^\s/?#@:'\"]*:)"
               r"(?P<secret>\"[^\s\"]*\"(?=@)|\"?[^\s/?#@\"]+)(?=@)"),  # (`'` is a password's)
    # Authorization: SCHEME CREDENTIALS, any scheme (Negotiate, SharedKey a:b, Splunk x, a
    # `Bearer:`), or its auth-params (Rails' `Token token="X"`, Digest's `username="u", ..`)
    re.compile(r"(?i)(?P<pre>\b(?:proxy-)?authorization\s*:\s*[A-Za-z][\w-]*:?" + SPACE
               + r")(?P<secret>(?!" + _DONE + ")(?:" + _PARAM + r"(?:[ \t]*,[ \t]*" + _PARAM
               + ")*|" + _CRED + "))"),
    re.compile(r"(?i)(?P<pre>\bbearer(?:[ \t]*[:=][ \t]*|" + SPACE + r"))(?P<secret>(?!"
               + _DONE + ")" + _CRED + ")"),  # `Bearer: X`, `bearer=X` as SDKs print it
    # Cookie: a=1; session=X (also after an escaped `\r\n`, and CGI's HTTP_COOKIE=): every
    # cookie is a credential (the named rule stopped at the first `;`); to the line's end, a
    # quote or a `,` (none is in a cookie: RFC 6265's cookie-octet); only with a `name=` first,
    # as every cookie header starts (`cookie: not set` is a sentence)
    re.compile(r"(?i)(?P<pre>(?:\b|(?<=\\[nr])|(?<=_))(?:set-)?cookie2?[ \t]*[:=][ \t]*)"
               r"(?P<secret>(?!" + _DONE + r"|[ \t])(?=[^\s;,'\"\\=]*=)"
               r"(?:<redacted>|(?!\\[nrt])[^\r\n'\",\\])+)"),
)
# A URL's session id (`/app;jsessionid=X`, PHP's, ASP's, `?sid=X`): whoever holds it is its user;
# a query's one-time code (OAuth's `?code=X`, CAS' `ticket=`) buys a token; `?code=404` is none.
_SESSION = re.compile(r"(?i)(?P<pre>[;?&](?:jsessionid|phpsessid|aspsessionid[a-z]{0,16}|"
                      r"sessionid|sessid|sid)=|[?&#](?:code|ticket)=(?!\d{1,3}(?:[\s&#'\"]|$)))"
                      r"(?P<secret>[^\s;?&#/'\"`]+)")
_USERINFO = re.compile(r"(?i)\b[a-z][a-z0-9+.-]{0,31}://[^\s/?#@:'\"]*:")
_WORD_END = re.compile(r"[\s'\"]")
_HOST_PORT = re.compile(r"\d+(?:[/?#]|$)")


def _shape_hidden(m: re.Match[str]) -> str:
    return m["pre"] + (REDACTED if m["secret"] else "")


# A login name, not a token: lower-case letters and `._-` (`alice`, `git`, `__token__`,
# `deploy-bot`); a token has a digit or a capital (one with a digit is hidden, whatever else).
_LOGIN = re.compile(r"[a-z_][a-z._-]{0,23}")


def _user_hidden(m: re.Match[str]) -> str:
    """`scheme://X@host`: X is the credential when it reads as a token (GitHub's `https://
    TOKEN@github.com`); a login name is what a person reads to know which account a pip index,
    a git remote or an SSH URL used (`https://alice@pypi.corp/simple`, `ssh://git@host`)."""
    if _LOGIN.fullmatch(m["secret"]) and not m.string.startswith(":x-oauth-basic", m.end()):
        return m.group(0)
    return _shape_hidden(m)


# A server's challenge (`WWW-Authenticate: Bearer realm="..", error="invalid_token"`, RFC 6750
# 3): its params say where to get a token and why one was refused, and hold none
_CHALLENGE = re.compile(r"(?i)(?:realm|scope|error|error_description|error_uri|service)=")


def _bearer_hidden(m: re.Match[str]) -> str:
    """After `Bearer`, a secret's name is no credential: `bearer token: X`, `using bearer
    token X` hid `token` and showed X (left, the named rules find X after its name)."""
    if is_secret_name(re.split(r"[:=]", m["secret"], maxsplit=1)[0]) or \
            m["secret"].lower() in _NOT_VALUES | names._ENGLISH or \
            _CHALLENGE.match(m["secret"]):  # `bearer: none`, `bearer: a ..`, a challenge
        return m.group(0)
    return _shape_hidden(m)


_HIDDEN = {0: _user_hidden, 3: _bearer_hidden}  # a shape's own judgement of what it found


def _to_last_at(text: str) -> str:
    """user:password@ with / ? # @ in the password (not percent-encoded): hidden to the last @
    of the word, unless it reads as host:port/path. A scan, not `[^\\s'"]+(?=@)`: that regex,
    tried at each `scheme://x:` of a long word, is quadratic (0.3 s for 16 KiB of `x://:`)."""
    out, pos, word_end, last_at = [], 0, -1, -1
    for m in _USERINFO.finditer(text):
        start = m.end()
        if m.start() < pos:  # inside a password already hidden
            continue
        if start > word_end:  # the word's end and its last @, once per word
            end = _WORD_END.search(text, start)
            word_end = end.start() if end else len(text)
            last_at = text.rfind("@", start, word_end)
        if last_at > start and not _HOST_PORT.match(text, start):
            out.append(text[pos:start] + REDACTED)
            pos = last_at
    return "".join(out) + text[pos:]


# A variable as Kubernetes lists it: {'name': 'HF_TOKEN', 'value': 'X'} (a client's dict, JSON),
# YAML's `- name: HF_TOKEN` and `value: X` on the next line (in one text, or Redactor.after)
_ENV_ENTRY = names.Rule(re.compile(
    r"""(?<![\w.-])(?P<nq>['"]?)name(?P=nq)[ \t]*[:=][ \t]*(?P<q>['"]?)(?P<name>""" + names._NAME
    + r""")(?P=q)[ \t]*(?:,[ \t]*|\r?\n[ \t]*)(?P<vq>['"]?)value(?P=vq)[ \t]*[:=][ \t]*"""),
    VALUE_I, lists=False)
# Cheap tests first (every forwarded vLLM line passes here): a rule runs only on a text
# that holds what it needs. Every secret name holds one of these words (see _WORDS).
_HINTS = tuple(HINT_WORDS.split("|"))
_PERCENT = re.compile(r"%[0-9A-Fa-f]{2}")
_SHAPE_HINTS = ("://", "earer", "EARER", "uthorization", "UTHORIZATION", "PRIVATE KEY", "sk-",
                "hf_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-", "AKIA",
                "ASIA", "AIza", "ya29.", "nvapi-",
                "xox", "eyJ", "ookie", "OOKIE")
_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def _has_secret_name(text: str) -> bool:
    """Whether a word around a hint is a secret name (`tokens/s` is not): the named rules,
    the costly part, run only then."""
    low = text.lower()
    for hint in _HINTS:
        at = low.find(hint)
        while at != -1:
            start, end = at, at + len(hint)
            while start > 0 and text[start - 1] in _WORD_CHARS:
                start -= 1
            while end < len(text) and text[end] in _WORD_CHARS:
                end += 1
            word = text[start:end]  # (a flag before its dot too: `--api-key.k X`)
            if is_secret_name(word) or is_secret_name(word.partition(".")[0]):
                return True
            at = low.find(hint, end)
    return False


class _Known:
    """The secret values this process knows (API key, secret variables): a set for all."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values: tuple[str, ...] = ()

    def add(self, values: Iterable[str]) -> None:
        with self._lock:
            merged = set(self.values) | {v for v in values if _worth(v)}
            self.values = tuple(sorted(merged, key=len, reverse=True))


def _worth(value: object) -> bool:
    return isinstance(value, str) and len(value.strip()) >= MIN_SECRET and \
        value.strip().lower() not in _NOT_VALUES and value != REDACTED


KNOWN = _Known()


def learn(values: Iterable[str]) -> None:
    """Secret values to hide from now on, in every writer of this process."""
    KNOWN.add(values)


class Redactor:
    """Hides known secret values and anything that looks like a credential."""

    def __init__(self, secrets: Iterable[str] = (), *, known: bool = True) -> None:
        own = {v for v in secrets if _worth(v)}
        self._own = tuple(sorted(own, key=len, reverse=True))
        self._known = known
        self._merged: tuple[tuple[str, ...], tuple[str, ...]] = ((), self._own)

    def _values(self) -> tuple[str, ...]:
        if not self._known or not KNOWN.values:
            return self._own
        if self._merged[0] is not KNOWN.values:  # learnt more since: merge once
            both = sorted(set(self._own) | set(KNOWN.values), key=len, reverse=True)
            self._merged = (KNOWN.values, tuple(both))
        return self._merged[1]

    def text(self, text: str) -> str:
        """One string, redacted. A terminal's colour code glued to a name or a value hid it
        (`\x1b[31mHF_TOKEN=X`, `key:\x1b[0m X`): a text where they hid one is shown without."""
        out = self._text(text)
        if ("\x1b" in text or "\\" in text) and (plain := COLOURS.sub("", text)) != text and \
                (hidden := self._text(plain)) != COLOURS.sub("", out):
            return hidden
        return out

    def _text(self, text: str) -> str:
        shaped = any(hint in text for hint in _SHAPE_HINTS)
        text = self._known_and_tokens(text, shaped)
        if shaped or "bearer" in text.lower() or "cookie" in text.lower():
            url = "://" in text  # (the URL rules only then: "sk-" in "task-" shapes a text)
            for i, shape in enumerate(_SHAPES):
                if url or i >= 2:
                    text = shape.sub(_HIDDEN.get(i, _shape_hidden), text)
                text = _to_last_at(text) if i == 1 and url else text  # after plain userinfo
        if any(w in text.lower() for w in ("sid=", "sessionid", "code=", "ticket=")):
            text = _SESSION.sub(_shape_hidden, text)
        for word, flag in CLIENTS:
            if word in text:
                text = "\n".join(flag.sub(client_hidden, line) if word in line else line
                                  for line in text.split("\n"))
        if _has_secret_name(text):
            for rule in (_ENV_ENTRY, *RULES):
                text = sub_named(rule, text)
        if "%" in text and _PERCENT.search(text) and _has_secret_name(urllib.parse.unquote(text)):
            text = sub_named(ENCODED, text)
        return text

    def _known_and_tokens(self, text: str, shaped: bool) -> str:
        """Known values and shaped tokens, found in the text as it came and hidden as one span
        where they overlap: one after the other, a known value that is part of a token (or of
        a longer known value) would leave the rest beside `<redacted>`, where nothing matches."""
        spans = [m.span() for v in self._values() if v in text
                 for m in re.finditer(re.escape(v), text)]
        if shaped:
            spans.extend(m.span("secret") for token in TOKENS for m in token.finditer(text))
        merged: list[list[int]] = []
        for start, end in sorted(spans):
            if merged and start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], end)
            else:
                merged.append([start, end])
        for start, end in reversed(merged):
            text = text[:start] + REDACTED + text[end:]
        return text

    def head(self, text: str | bytes, limit: int) -> str:
        """The first `limit` characters of the redacted text: an excerpt (an answer's first
        bytes, an error's start). Cut first, a secret across the cut would keep its first
        part (too short to match a rule, not equal to a known value): so redact a window of
        EXCERPT_MARGIN more, then cut."""
        if isinstance(text, bytes):
            text = text[:limit + EXCERPT_MARGIN].decode("utf-8", "replace")
        return self.text(text[:limit + EXCERPT_MARGIN])[:limit]

    def tail(self, text: str, limit: int) -> str:
        """The last `limit` characters of the redacted text (a process's last output); the
        same window as head(), from the end, back to its line's start (tail_window)."""
        cleaned = self.text(tail_window(text, limit + EXCERPT_MARGIN))
        return cleaned[-limit:] if limit else ""

    def lines(self, lines: Iterable[str]) -> list[str]:
        """Many lines, redacted, each with the one before it (after())."""
        listed = list(lines)
        return [self.after(listed[i - 1] if i else "", line) for i, line in enumerate(listed)]

    def after(self, before: str, line: str) -> str:
        """A line redacted with the line before (YAML's `- name: HF_TOKEN` / `  value: X`)."""
        if "name" in before and "value" in line:
            return self.text(f"{before}\n{line}").partition("\n")[2]
        return self.text(line)

    def argv(self, argv: Iterable[str]) -> list[str]:
        """A command line: secret flags' values, then every other rule."""
        return [self.text(a) for a in redact_argv(list(argv))]

    def env(self, env: Mapping[str, str]) -> dict[str, str]:
        """Variables: secret-looking names hide their value; the rest is redacted text."""
        return {k: REDACTED if is_secret_name(k) and not path_value(v) else self.text(v)
                for k, v in env.items()}

    def deep(self, value: Any) -> Any:
        """Any JSON-ready value: strings redacted, the values of secret-named keys hidden. It
        hides what text() hides in the value's repr or JSON: a number or a mapping under a
        secret key, a (name, value) pair, a flag's value beside other types, bytes."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, (bytes, bytearray)):  # (a writer's default=str would print it)
            return self.text(bytes(value).decode("utf-8", "replace"))
        if isinstance(value, Mapping):
            # A key is a name; one that could carry a credential (a URL, `a=b`) is redacted.
            # {'name': 'HF_TOKEN', 'value': X}: the value is the named secret's (Kubernetes)
            entry = str(value["name"]) if _pair_name(value.get("name")) else ""
            return {self.text(k) if isinstance(k, str) and ("@" in k or "=" in k) else k:
                    self._hidden(v, k) if isinstance(k, str) and is_secret_name(k)
                    else self._hidden(v, entry) if entry and k == "value"
                    else self.deep(v) for k, v in value.items()}
        if isinstance(value, tuple) and len(value) == 2 and _pair_name(value[0]):
            name = value[0] if isinstance(value[0], str) else ""  # ('authorization', 'x')
            return [self.deep(value[0]), self._hidden(value[1], name)]
        if isinstance(value, (list, tuple)):
            # an argv (--api-key X), its value a string or not: each item as redact_argv
            # reads it (a number as its text, a structure as no flag nor value)
            shown = [v if isinstance(v, str) else str(v) if _number(v) else "" for v in value]
            argv = redact_argv(shown)
            return [self.deep(v) if a == s else self.text(a) if isinstance(v, str) else REDACTED
                    for v, s, a in zip(value, shown, argv, strict=True)]
        return value

    def _hidden(self, value: Any, name: str) -> Any:
        # A secret key's value is hidden whole; a number only under a name that ends in the
        # credential (`{'token': 918273645501}`, a numeric PIN): a figure about tokens is
        # named by what it measures (`vllm:time_to_first_token_seconds`, a record's metric).
        # True/None say nothing.
        if isinstance(value, (str, bytes, bytearray)):  # (a file's path is no secret)
            return self.deep(value) if not value or path_value(str(value)) else REDACTED
        if _number(value):
            return REDACTED if _names_the_credential(name) else value
        if isinstance(value, (list, tuple)):
            return [self._hidden(v, name) for v in value]
        if isinstance(value, Mapping):  # {'primary': 'X'}: text() hides `key={...}` whole
            return {k: self._hidden(v, str(k)) for k, v in value.items()}
        return value


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _pair_name(name: Any) -> bool:
    """A (name, value) pair's name, as headers and environments are listed: a secret name,
    not a dotted config key (`('vllm.env.HF_TOKEN', 'gate.listen')` lists two keys)."""
    if isinstance(name, (bytes, bytearray)):
        name = bytes(name).decode("utf-8", "replace")
    return isinstance(name, str) and "." not in name and is_secret_name(name)


REDACT = Redactor()  # the rules and every learnt value: for writers with no secrets of their own
