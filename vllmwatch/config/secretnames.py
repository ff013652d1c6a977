"""Which names say that their value is a secret, and the rules that hide such a value.

The names: a variable, a flag, a JSON or TOML key, judged by its words, so counts and paths
stay readable (`prompt_tokens`, `prompt_token_ids`, `--ssl-keyfile`, `KEY_PATH`) while `HF_TOKEN`,
`--api-key`, `dbPassword`, `hf_tokens` are hidden. The redactor (config/redact.py) and every
writer that drops a value by its name (init, migrate, records' environment) ask here.

The rules (below; config/redact.py runs them): `--api-key X`, `HF_TOKEN=X`,
`'api_key': ['X']`, `('authorization', 'Bearer X')`, `api%5Fkey=X`. Every forwarded vLLM line
passes them in the reader of vLLM's stdout, and a client's prompt is in those lines, so each
rule is linear in the line's length for any input (a stall there blocks vLLM writing its
log). Hence: a rule's regex finds only a name and its separator (bounded), is_secret_name
judges it, and only then is the value matched, once, at that place, by patterns where each
character is consumed in one way and a value never fails once begun (config/secretvalues.py:
where a value ends, in each quoting; config/secretlists.py: where a list of them ends;
tests/core/test_redact_linear.py). A value found is skipped whole; a name that is not secret
skips only itself (`failed: API_KEY=x`). Pure: stdlib only."""

from __future__ import annotations

import re
import urllib.parse
from typing import NamedTuple

from vllmwatch.config.secretvalues import AUTH as AUTH
from vllmwatch.config.secretvalues import (
    CONTINUED,
    CONTROL,
    ENV_VALUE_I,
    ESCAPED,
    IN_LIST,
    JOINED,
    MORE_ITEMS,
    QUOTED_ONLY,
    SPACED_VALUE,
    VALUE,
    VALUE_I,
)
from vllmwatch.config.secretvalues import DONE as DONE
from vllmwatch.config.secretvalues import REDACTED as REDACTED
from vllmwatch.config.secretvalues import SPACE as SPACE

# A name is secret when one of its words is one of these ...
_WORDS = frozenset({"key", "token", "secret", "secrets", "password", "passwords",
                    "passwd", "pass", "pwd", "pw", "passphrase", "credential", "credentials",
                    "cred", "creds", "auth", "authorization", "apikey", "cookie", "privatekey",
                    "sig", "signature"})  # a signed URL's proof: Azure SAS `sig=`, S3's
# ... or ends in one of these (`hftoken`, `accesskey`, `dbpassword`, `pgpass`, MinIO's
# `secretkey`) ... A `...key` ending only with a word that says which credential (`hotkey`).
_ENDINGS = ("token", "apikey", "secret", "password", "passwd", "pass", "webhook",
            *(q + "key" for q in ("access", "private", "secret", "signing", "master",
                                  "encryption", "session", "account", "auth", "license")))
# A webhook's URL carries its secret in the path (Slack's /services/T../B../XXXX): the URL
# is the credential, not a place to find it (`SLACK_WEBHOOK_URL` showed in clear).
_WEBHOOK_URLS = frozenset({"url", "uri", "urls", "endpoint"})
# ... unless its last word says the value is about the secret, not the secret itself: an
# `_id`/`_ids` is an identifier (`prompt_token_ids`, `stop_token_ids`, `key_id`), never the
# credential (an AWS key id's AKIA... shape is hidden as a token anyway); a number or a place
# (`thinking_token_budget`); an exception class names what failed (`KeyError: 'model.l..'`).
_ABOUT = frozenset({"file", "path", "dir", "size", "len", "length", "count", "type", "mode",
                    "name", "format", "url", "env", "var", "ttl", "timeout", "expiry", "prefix",
                    "id", "ids", "suffix", "budget", "delta", "bits", "factor", "logprobs",
                    "lens", "indices", "offsets", "error", "exception", "warning", "config"})
# A tokenizer's special tokens are text, not credentials (`eos_token: '</s>'`); a key that a
# word says is a lookup's, a cache's or a quantisation's is a name (`weight_key=QuantKey(..`).
_SPECIAL = frozenset({"eos", "bos", "pad", "unk", "sep", "cls", "mask", "special", "stop",
                      "additional", "image", "audio", "video", "chat"})
_KINDS = {"token": _SPECIAL, "tokens": _SPECIAL, "key": frozenset({"quant", "weight", "cache",
          "activation", "compile", "config", "lookup", "sort", "dict"})}  # not routing: PagerDuty's
# A plural `keys`/`tokens` is a list of names or a count (`restart_keys`, `prompt_tokens`)
# unless a word before it says which credential (`api_keys`, `hf_tokens`, `accessTokens`).
_PLURALS = frozenset({"keys", "tokens"})
_QUALIFIERS = frozenset({"api", "access", "auth", "secret", "private", "hf", "bearer",
                         "refresh", "session", "client", "ssh", "signing", "encryption"})
_PLURAL_ENDINGS = tuple(q + p for q in _QUALIFIERS for p in _PLURALS)
# A header's value is what the server checks, so `AUTHORIZATION_HEADER`, `API_KEY_HEADER` are
# judged by their other words (a `*_HEADER_NAME` stays readable); a list of headers (`OTEL_
# EXPORTER_OTLP_HEADERS="x-honeycomb-team=..."`) carries credentials under names no rule knows,
# so it is hidden whole, unless a word says it lists names or switches (`--allowed-headers`).
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
    if len(words) > 1 and words[-2] in _KINDS.get(words[-1], ()):
        return False
    if words[-1] == "headers" and len(words) > 1:
        return not _HEADER_LISTS.intersection(words)
    if words == ["pwd"]:  # the shell's working directory (PWD), in every child's environment
        return False
    return any(w in _WORDS or w.endswith(_ENDINGS) or w.endswith(_PLURAL_ENDINGS)
               or (w in _PLURALS and _QUALIFIERS.intersection(words[:i]))
               for i, w in enumerate(words))


# A secret name's value that is a file's path (GOOGLE_APPLICATION_CREDENTIALS=/etc/gcp/sa.json,
# SSH_AUTH_SOCK=/run/user/0/ssh) is no credential, and the reader needs it (google-auth's `File
# /etc/gcp/sa.json was not found`): two parts at least, path characters only, the first a
# lower-case directory's name (/etc, /run, ~/.config), which a password's first part rarely is.
_PATH_VALUE = re.compile(r"~?/\.?[a-z][a-z0-9_-]*(?:/[\w.@+-]+)+/?")


def path_value(value: str) -> bool:
    return _PATH_VALUE.fullmatch(value.strip()) is not None


# --- the rules that hide the value after a secret-looking name ----------------------------

# A name holding one of the words every secret name holds (is_secret_name judges it whole):
# the search stops only at candidates, not at every `word:` of a vLLM line.
HINT_WORDS = r"key|token|secret|pass|pw|cred|auth|cookie|sig|webhook"
# Bounded: a name is short, and an unbounded lazy scan is quadratic in a long word's length
_NAME = r"(?=[A-Za-z_])[\w.-]{0,80}?(?i:" + HINT_WORDS + r")[\w.-]{0,80}"
# An identifier joins words by `_` (`hf_token`) or case (`apiKey`); a word of prose is
# hyphenated (`one-token`), capitalised (`TokenSpeed MLA`) or one word (`the key vLLM`).
_IDENTIFIER = re.compile(r"[A-Za-z0-9]_+[A-Za-z0-9]|^[a-z][a-z0-9]*[A-Z]")
# `_SPACED_WORDS`: a switch's or an unset value's words; an operator is code (`x_key = %s`).
_OPERATOR = re.compile(r"[-=+*/%<>!|&:^~]{1,3}")
_SPACED_WORDS = frozenset({"true", "false", "none", "null", "yes", "no", "on", "off", "unset"})
# A flag as vLLM spells one (FLAG_SHAPE): `--` and lowercase words, or a short one (`-tp`, `-O3`).
# After a key, a word of dashes in any other shape (`--Zq7..`, `-_x9`) is the next key.
_END = r"""(?:[.=\s'",;)}\]>]|$)"""
FLAG_SHAPE = r"--[a-z][a-z0-9_-]*" + _END + r"|-[A-Za-z]{1,4}\d*" + _END + "|-+" + _END
FLAG_WORD = re.compile(FLAG_SHAPE)  # (launch.redact_argv's, for an argv's words)
# Between a name and its value: a space, an escaped one (`--api-key\\nK` JSON-encoded, as \s
# reads `--api-key\nK`), a shell's continuation, each a backslash run read once; between keys,
# only a continuation ends no line
_GAP = r"(?:" + CONTROL + r"|\\+\r?\n|" + ESCAPED + ")"
# ... and after `NAME ` (no sign), any but a line break: a name ending a line is no value's
_SPACED_GAP = r"(?:(?!\n|\\+(?:n|x0a|u000a))" + _GAP + ")+"
_GAP_END = re.compile("(?:" + _GAP + ")$")
_MORE_WORDS = re.compile(  # (not a word of prose: `--api-key value to VLLM_API_KEY`)
    r"(?:(?:[ \t]|" + CONTINUED + r""")+(?:'[^'\n]*'|"[^"\n]*"|(?!""" + FLAG_SHAPE
    + r"""|[a-z]+(?:[\s'",;)}\]>]|$)|""" + CONTINUED + r""")(?:[^\s'",;)}\]>]|""" + JOINED
    + ")+))*")
_UNSET = frozenset({"none", "null", "nil", "true", "false"})  # no value, or a switch, after any
_LOWER_WORD = re.compile(r"[a-z]+")
# After `--flag ` (no `=`), an error's words, not a key: a remark, a word then a remark or two
# more words, a quoted sentence (`--api-key abbreviated (vLLM's ..`, `--api-key 'the key ..'`)
_FLAG_PROSE = re.compile(r"""\(|[a-z]+[ \t]+(?:\(|[a-z]+[ \t]+[a-z]+\b(?![_.-]?\w))"""
                         r"""|(['"])[a-z]+(?:[ \t]+-{0,2}[a-z][\w-]*){2,}[.!?]?\1""")
_NEXT_WORD = re.compile(r"[ \t]+[a-z]+\b(?![_.-]?\w)")
# After `-flag ` (one dash), the value's type in a Go program's help (`-token string`, then
# its usage on the next line or after a column's spaces), not a value: no credential is a type
_GO_TYPE = re.compile(r"(?:strings?|u?int(?:8|16|32|64)?|float(?:32|64)|bool|duration|value|"
                      r"file|path|dir|name)(?=[ \t]*(?:\r?\n|\\+n|$)|[ \t]{2}|\t|\\+t)")


def _spaced_name(name: str) -> bool:
    """`NAME value` for a name ending in the credential (`hf_token`; `token_indices width` is
    prose); a word of prose, not an identifier, only with a credential's shape (_credential)."""
    words = [w.lower() for w in _SPLIT.split(name.rstrip(".").rsplit(".", 1)[-1]) if w]
    return bool(words) and (
        words[-1] in _WORDS or words[-1].endswith(_ENDINGS) or words[-1] in _PLURALS
        or words[-1].endswith(_PLURAL_ENDINGS))


# A word name (`password X9`, `x-api-key X9`, `PGPASSWORD X9`; not `pass`, a verb): a value with
# a letter, a digit or sign, no `.` (but a full stop) `(` `=` (`model.layers.0`, `a=1`), `/` first.
_WORD_NAMES = frozenset({"key", "passphrase", "credential", "credentials"})  # and ending in:
_WORD_ENDS = tuple(e for e in _ENDINGS if e not in ("pass", "webhook"))  # `bypass`, a URL
_CREDENTIAL = re.compile(r"(?=[^.(]*[A-Za-z])(?=[^.(]*[\d!@#$%^&])[^\s./(~`*=][^\s.(`*=]{5,}=*\.?")


def _credential(name: str, value: str) -> bool:
    words = [w.lower() for w in _SPLIT.split(name.rstrip(".").rsplit(".", 1)[-1]) if w]
    shaped = _CREDENTIAL.fullmatch(value) is not None and "://" not in value  # (a URL)
    return (words[-1] in _WORD_NAMES or words[-1].endswith(_WORD_ENDS)) and (
        shaped or REDACTED in value) and (_QUALIFIERS | {"x"}).issuperset(words[:-1]) and \
        words != ["htpasswd"]  # the client, its flags next (`-bBC12`): launch.CLIENTS reads it


def _spaced_prose(value: str, text: str, end: int) -> bool:
    """A word of a sentence after `NAME `: a switch (`None`), or a lower-case word that
    another lower-case word follows (`VLLM_API_KEY stays the key`, `start_token onwards
    for`); a value at the line's end, or before the next name, is hidden."""
    return value.lower() in _SPACED_WORDS or _OPERATOR.fullmatch(value) is not None or (
        _LOWER_WORD.fullmatch(value) is not None and _NEXT_WORD.match(text, end) is not None)


# Words of a sentence, not a value, after `name: ` or `--flag ` (`password: not set`,
# `--api-key is given twice`); never after `=`, where a value is what follows.
_ENGLISH = frozenset({"not", "is", "was", "are", "were", "none", "empty", "missing", "given",
                      "gives", "has", "have", "had", "required", "set", "unset", "provided",
                      "needed", "must", "should", "and", "or", "of", "for", "from", "with",
                      "the", "a", "an", "to", "in", "on", "at", "by", "expected", "invalid"})


class Rule(NamedTuple):
    """A name and its separator (`pre`); which values may follow; how the name is read."""
    pre: re.Pattern[str]
    value: re.Pattern[str]
    lists: bool = True  # ['v1'], ('u', 'p'), {'k': 'v'}: each quoted string inside hidden
    keyed: bool = False  # the name in quotes, escaped as often on both sides (rule 0)
    encoded: bool = False  # percent-encoded: judged decoded, only with a % before the value
    env: bool = False  # NAME=value at a word's start, `--name value`: ENV_VALUE_I
    spaced: bool = False  # NAME value: only a name written as an identifier (_SPACED)


RULES = (
    # 'name': 'value' / "name": "value" / 'name': ['v1', 'v2'] / "name": 123 / \"name\": ..
    # 'name' => 'value' (Perl, PHP, Ruby); x['name'] = 'v' (a traceback's source line). A start
    # only at a backslash run's first character (tried at each, `\\*['"]` rescanned the run:
    # quadratic); the closing run says how many of them open the name.
    Rule(re.compile(r"""(?<!\\)(?P<obs>\\*)(?P<oq>['"])(?P<name>""" + _NAME
                    + r""")(?P<cbs>\\*)(?P=oq)\]?""" + _GAP + "*(?P<sep>=>|[:=])" + _GAP
                    + "*"), VALUE, keyed=True),
    # ('authorization', 'Bearer x'): a header as a tuple; ['--api-key', 'x']: an argv list
    Rule(re.compile(r"""(?:\(\s*b?(?P<kq>['"])|(?P<fq>['"])--)(?P<name>""" + _NAME
                    + r""")(?:(?P=kq)|(?P=fq))\s*,\s*"""), QUOTED_ONLY, lists=False),
    # --name value / --name=value / NAME=value / name: value / name => value /
    # Authorization: Bearer x / name=['v1', 'v2']; `=>` before a space, a quote or a bracket
    # only: `api_key=>;K` is a value that begins with `>` (it was `;K`, no value, in clear)
    # (a flag also after an escaped line break or tab: a multi-line text JSON-encoded, `a\\n--x`)
    Rule(re.compile(r"(?i)(?:(?<![\w.-])|(?<=\\[nrt])(?=-))(?P<dash>--?)?(?P<name>" + _NAME + r")"
                    r"(?:" + _GAP + r"*(?P<sep>=>(?=[\s'\"\\\[{(])|[=:])" + _GAP + "*"
                    r"|(?(dash)" + _GAP + r"+(?:--[ \t]+)?(?!--(?:\s|$))|(?!)))"
                    r"(?P<scheme>" + AUTH + ")?"), VALUE_I, env=True),
    # NAME value, no separator: `HF_TOKEN abcd` (print(name, value), a Dockerfile's `ENV`,
    # an env listing), `hf_token abcd`, `apiKey abcd`: a name spelt as an identifier only, as
    # a lone English word (`the key vLLM ...`, `token budget`) begins prose, not a value
    Rule(re.compile(r"(?<![\w.-])(?P<name>" + _NAME + r")(?P<sp>" + _SPACED_GAP + ")"
                    r"(?P<scheme>" + AUTH + ")?"), SPACED_VALUE, lists=False, spaced=True),
)


def sub_named(rule: Rule, text: str) -> str:
    """Each secret name's value in `text` hidden by `rule`."""
    out: list[str] = []
    pos = copied = 0
    while (m := rule.pre.search(text, pos)) is not None:
        start = m.start()
        if rule.keyed:  # `\\"name\"`: the match opens with as many backslashes as close it
            extra = len(m["obs"]) - len(m["cbs"])
            if extra < 0:
                pos = m.end("name")
                continue
            start += extra
        name = m["name"]
        if rule.encoded and "%" not in text[start:m.end()]:
            secret = False  # a plain rule's
        else:
            secret = is_secret_name(urllib.parse.unquote(name) if rule.encoded else name)
        if secret and rule.spaced:
            secret = _spaced_name(name)
        if not secret and (m.groupdict().get("dash") or m.groupdict().get("fq")):  # a flag by
            secret = is_secret_name(name.partition(".")[0])  # its name before a dot: vLLM's
            # `--api-key.k X` sets the key to {"k": X}
        if not secret:
            pos = m.end("name")
            continue
        hidden = _hide(rule, m, start, text)
        if hidden is None:
            pos = start + 1
            continue
        end, shown = hidden
        out.append(text[copied:start] + shown)
        copied = pos = end
    out.append(text[copied:])
    return "".join(out)


# After `--flag ` the next word is the value whatever its shape (`--api-key --Zq7..`, a key
# from token_urlsafe(); launch.redact_argv reads an argv so), unless it is another secret flag
# spelt as one (lowercase): its own value is found after it (`--hf-token --api-key K`); or any
# flag after vLLM's one secret flag that may stand bare (flagnames.BARE_OK: an HF token is `hf_`)
_SPELT_FLAG = re.compile(r"--([a-z][a-z0-9_-]*)(?=[.=\s]|$)")


def _secret_flag_next(text: str, at: int, name: str = "") -> bool:
    flag = _SPELT_FLAG.match(text, at)
    bare = len(name) > 1 and "hf-token".startswith(name.lower().replace("_", "-"))
    return flag is not None and (bare or is_secret_name(flag[1]))


def _hide(rule: Rule, m: re.Match[str], start: int, text: str) -> tuple[int, str] | None:
    """Where the value after a secret name ends, and the name with it hidden; None when no
    value follows. With a scheme word (`token: Bearer x`), the value may be that word."""
    groups = m.groupdict()
    scheme_at = m.start("scheme") if groups.get("scheme") else -1
    value = rule.value
    env = rule.env and m["sep"] == "=" and m.start("sep") == m.end("name") and m.end("sep") == (
        scheme_at if scheme_at >= 0 else m.end()) and (
        start == 0 or text[start - 1] in " \t\n'\"`")
    if env or (groups.get("dash") and m["sep"] is None):  # an argv's word ends as NAME=value's
        value = ENV_VALUE_I  # (`--api-key K1,K2` showed `,K2`)
    if groups.get("dash") and m["sep"] is None and scheme_at < 0 and (
            _FLAG_PROSE.match(text, m.end()) or _secret_flag_next(text, m.end(), m["name"])
            or (m["dash"] == "-" and _GO_TYPE.match(text, m.end()))):
        return None
    for where in (m.end(), scheme_at):
        if where < 0:
            continue
        pre = text[start:where]
        if groups.get("sep") == ":" and text[where:where + 1] in ("-", "|", ">"):  # YAML's
            from vllmwatch.config.secretlists import hide_block  # `key:\n  - K1`, `key: |`
            if (block := hide_block(text, where, text[m.end("sep"):where])) is not None:
                return block[0], pre + block[1]
        if rule.lists and text[where:where + 1] in ("[", "(", "{"):  # (secretlists.OPENERS)
            if text[where] == "(" and m["name"].lower() == "key":
                return None  # a tuple, a lookup's key (Triton's `key=(128, 64, ..)`), no secret
            from vllmwatch.config.secretlists import hide_list  # (only when met: `run`'s count)
            end, shown = hide_list(text, where)  # each item whole, whatever it holds
            return end, pre + shown
        v = value.match(text, where)
        if v is None:
            continue
        found = v.groupdict()
        if (found.get("bare") or "").lower() in _UNSET:
            return None  # `api_key=None`: no key is set, as `<redacted>` would say one was
        if path_value(found.get("bare") or found.get("qv") or found.get("eqv") or ""):
            return None  # a file's path, not the secret (GOOGLE_APPLICATION_CREDENTIALS=/x/y)
        sep = text[m.end("name"):where]
        if found.get("bare") is not None and found["bare"].lower() in _ENGLISH and \
                "=" not in sep and _GAP_END.search(sep):
            return None  # a sentence (`password: not set`), not a value
        if rule.spaced and _IDENTIFIER.search(m["name"].strip("_.-")) is None:
            if not _credential(m["name"], found.get("bare") or found.get("qv") or ""):
                return None  # `the token budget 8192`, `a single KEY vector`: prose
        elif rule.spaced and found.get("bare") is not None and _spaced_prose(
                found["bare"], text, v.end()):
            return None  # `api_key None`, `VLLM_API_KEY stays the key`: not a value
        if found.get("eqv") is not None:
            return v.end(), f"{pre}{v['esc']}{v['evq']}{REDACTED}{v['esc']}{v['evq']}"
        many = "api-key".startswith(m["name"].lower().replace("_", "-"))  # nargs "+"
        words = _MORE_WORDS.match(text, v.end()) if many and groups.get("dash") and \
            "=" not in sep else None  # vLLM's `--api-key K1 'K2'`: each word to the next flag
        if found.get("qv") is not None and not (words and words[0]):  # ['--api-key', 'K1', ..]
            more = MORE_ITEMS.match(text, v.end()) if many and groups.get("fq") else None
            rest = IN_LIST.sub(lambda q: f"{q[1]}{REDACTED}{q[1]}", more[0]) if more else ""
            lead = "b" if v.group(0).startswith("b") else ""
            return (more or v).end(), f"{pre}{lead}{v['vq']}{REDACTED}{v['vq']}{rest}"
        return (words or v).end(), pre + REDACTED
    return None

