"""Secrets in forms the rules missed (config/redact.py, config/secretnames.py): each form
through the rules alone (`Redactor(known=False)`) and through REDACT, which every writer
uses (records, the journal, `check`, `status`)."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.support.secrets import values
from vllmwatch.config.redact import REDACT, REDACTED, Redactor
from vllmwatch.config.secretnames import _ENGLISH as ENGLISH

R = Redactor(known=False)


def _hidden(text: str, *secrets: str) -> str:
    for red in (R, REDACT):
        out = red.text(text)
        assert REDACTED in out and not [s for s in secrets if s in out], (text, out)
    return R.text(text)


@pytest.mark.parametrize("argv", [
    ["vllm", "serve", "/m", "--api-key", "Zq9K1a", "Zq9K2b", "--port", "8000"],
    ["vllm", "serve", "--api-key", "Zq9K1a", "Zq9K2b", "Zq9K3c"],
    ["vllm", "serve", "--api_key", "Zq9K1a", "Zq9K2b", "-p", "8000"],
])
def test_every_key_of_an_argv_list_is_hidden(argv: list[str]) -> None:
    """vLLM 0.32's --api-key takes several keys (nargs "+"); its argv as a Python list's
    repr or a JSON list (a holder's command line, a record's launch) showed the second."""
    keys = [a for a in argv if a.startswith("Zq9")]
    for text in (repr(argv), json.dumps(argv), repr(tuple(argv))):
        assert _hidden(text, *keys).count(REDACTED) == len(keys)
    assert R.text("['--hf-token', 'Zq9K1a', '/m']") == f"['--hf-token', '{REDACTED}', '/m']"


@settings(max_examples=300, deadline=None)
@given(values)
def test_any_second_key_of_an_argv_list_is_hidden(key: str) -> None:
    assume(not key.startswith("-"))  # a word that starts with `-` is a flag to argparse
    for text in (repr(["vllm", "--api-key", "Zq9K1a", key, "--port", "8000"]),
                 json.dumps(["vllm", "--api-key", "Zq9K1a", key])):
        _hidden(text, key)


@pytest.mark.parametrize(("text", "want"), [
    # a colon or `=` after Bearer, as scripts and SDKs print it
    ("Bearer: Zq7Xy9Wv4Lm", f"Bearer: {REDACTED}"), ("bearer:Zq7Xy9Wv4Lm", f"bearer:{REDACTED}"),
    ("BEARER=Zq7Xy9Wv4Lm x", f"BEARER={REDACTED} x"),
    ("Authorization: Bearer: Zq7Xy9Wv4Lm", f"Authorization: Bearer: {REDACTED}"),
    # auth-params: Rails' `Token token="X"`, Digest's quoted fields (the quote ended the value)
    ('Authorization: Token token="Zq7Xy9Wv4Lm"', f"Authorization: Token {REDACTED}"),
    ('Authorization: Token token="Zq7Xy9Wv4Lm", nonce="n1" next',
     f"Authorization: Token {REDACTED} next"),
    ('Authorization: Digest username="bob", realm="r", response="Zq7Xy9Wv4Lm"',
     f"Authorization: Digest {REDACTED}"),
    ('"Authorization": "Token token=\\"Zq7Xy9Wv4Lm\\""', f'"Authorization": "{REDACTED}"'),
    # odd spacing, every scheme
    ("Authorization :  Basic   Zq7Xy9Wv4Lm", f"Authorization :  Basic   {REDACTED}"),
    ("authorization:\tToken Zq7Xy9Wv4Lm", f"authorization:\tToken {REDACTED}"),
    ("Authorization: Basic dXNlcjpw==, next", f"Authorization: Basic {REDACTED}, next"),
    # the space after the scheme JSON-escaped (two characters: `\t`, `\n`; `\\n` twice)
    (r'{"h": "Authorization: Bearer\tZq7Xy9Wv4Lm"}',
     r'{"h": "Authorization: Bearer\t' + REDACTED + '"}'),
    (r'{"msg": "Bearer\nZq7Xy9Wv4Lm"}', r'{"msg": "Bearer\n' + REDACTED + '"}'),
    (r'"x-token: Basic\\r\\nZq7Xy9Wv4Lm"', r'"x-token: Basic\\r\\n' + REDACTED + '"'),
    (r"curl -H 'Authorization: Token\tZq7Xy9Wv4Lm'",
     r"curl -H 'Authorization: Token\t" + REDACTED + "'"),
])
def test_every_spelling_of_an_authorization_is_hidden(text: str, want: str) -> None:
    assert _hidden(text, "Zq7Xy9Wv4Lm", "dXNlcjpw") == want


@pytest.mark.parametrize("text", [
    "bearer: none", "The bearer: a person", "Invalid bearer token", "Bearer: not set",
    "bearer token: <redacted>",
    # a server's challenge: where to get a token and why one was refused (a 401's headers)
    'WWW-Authenticate: Bearer realm="https://auth.docker.io/token",service="registry.docker.io"',
    'www-authenticate: Bearer error="invalid_token", error_description="The token expired"',
    "{'www-authenticate': 'Bearer realm=hf, scope=\"repo:read\"'}"])
def test_a_sentence_about_a_bearer_stays(text: str) -> None:
    assert R.text(text) == text


@pytest.mark.parametrize(("text", "want"), [
    ("curl -u admin:S3cretPw9 http://h/", f"curl -u admin:{REDACTED} http://h/"),
    ("+ curl -sSf -u admin:S3cretPw9 http://h/", f"+ curl -sSf -u admin:{REDACTED} http://h/"),
    ("curl --user admin:S3cretPw9 -o /tmp/x", f"curl --user admin:{REDACTED} -o /tmp/x"),
    ("curl --user=admin:S3cretPw9 http://h", f"curl --user=admin:{REDACTED} http://h"),
    ("curl -uadmin:S3cretPw9 http://h", f"curl -uadmin:{REDACTED} http://h"),
    ("curl -sSfu admin:S3cretPw9 http://h", f"curl -sSfu admin:{REDACTED} http://h"),
    ("+ curl -u 'admin:S3cret Pw9' http://h", f"+ curl -u 'admin:{REDACTED}' http://h"),
    ("curl --proxy-user bob:S3cretPw9 -U eve:S3cretPw9 http://h",
     f"curl --proxy-user bob:{REDACTED} -U eve:{REDACTED} http://h"),
    # a key as the user, no password (an API's way): the key hidden
    ("curl -u S3cretPw9: https://api/v1", f"curl -u {REDACTED}: https://api/v1"),
    # wget's own flags (hidden by their names already: kept so)
    ("wget --password S3cretPw9 --http-password=S3cretPw9 --proxy-password S3cretPw9 x",
     f"wget --password {REDACTED} --http-password={REDACTED} --proxy-password {REDACTED} x"),
    ("line 1\n+ curl -u admin:S3cretPw9 http://h\nline 3",
     f"line 1\n+ curl -u admin:{REDACTED} http://h\nline 3"),
])
def test_a_password_on_a_curl_line_is_hidden(text: str, want: str) -> None:
    assert _hidden(text, "S3cretPw9", "S3cret Pw9") == want


@pytest.mark.parametrize("text", [
    "docker run -u 1000:1000 vllm/vllm-openai", "sudo -u vllmwatch vllmwatch status",
    "curl --user-agent a:b http://h", "curl -u admin http://h",
    "podman run --user 1000:1000 image", "ps -u root -o pid:8,cmd"])
def test_a_user_flag_that_is_no_curl_password_stays(text: str) -> None:
    assert R.text(text) == text


# A variable as Kubernetes lists it, in each form a text carries it
_ENTRIES = ("{{'name': '{n}', 'value': '{v}'}}", '{{"name":"{n}","value":"{v}"}}',
            '[{{"name": "{n}", "value": "{v}"}}, {{"name": "X", "value": "1"}}]',
            "env:\n- name: {n}\n  value: {v}\n- name: PORT\n  value: '8000'",
            '  - name: "{n}"\n    value: "{v}"', "name={n}, value={v}")


@pytest.mark.parametrize("form", _ENTRIES)
@pytest.mark.parametrize("name", ["HF_TOKEN", "VLLM_API_KEY", "DB_PASSWORD"])
def test_a_secret_variable_listed_as_name_and_value_is_hidden(form: str, name: str) -> None:
    """A pod's env (a Python client's dict, kubectl's JSON, a manifest's YAML) in a record's
    output tail or an error showed the secret's value: the name is a `name` field's value."""
    text = form.format(n=name, v="Zq7Xy9Wv4Lm")
    out = _hidden(text, "Zq7Xy9Wv4Lm")
    assert name in out and ("8000" in out or "PORT" not in text)


@settings(max_examples=200, deadline=None)
@given(values)
def test_any_value_of_a_listed_secret_variable_is_hidden(value: str) -> None:
    for form in _ENTRIES:
        text = form.format(n="HF_TOKEN", v=value)
        _hidden(text, value)


def test_a_listed_variable_in_a_structure_is_hidden_as_in_its_text() -> None:
    env = [{"name": "HF_TOKEN", "value": "Zq7Xy9Wv4Lm"}, {"name": "PORT", "value": "8000"},
           {"name": b"API_KEY", "value": 918273645501}]
    for red in (R, REDACT):
        out = json.dumps(red.deep(env), default=str)
        assert "Zq7Xy9Wv4Lm" not in out and "918273645501" not in out and "8000" in out, out


@pytest.mark.parametrize("text", [
    "{'name': 'model', 'value': 'llama'}", "- name: HF_TOKEN\n  valueFrom:\n    secretKeyRef:",
    "- name: HF_TOKEN\n  value: none", "name: HF_TOKEN_PATH\n  value: /run/secrets/hf/token"])
def test_a_listed_variable_that_holds_no_secret_stays(text: str) -> None:
    assert R.text(text) == text


@pytest.mark.parametrize(("text", "want"), [
    ("GET /v1/models;jsessionid=ABC123DEF456 HTTP/1.1",
     f"GET /v1/models;jsessionid={REDACTED} HTTP/1.1"),
    ("GET /v1/models;sid=ABC123DEF456 HTTP/1.1", f"GET /v1/models;sid={REDACTED} HTTP/1.1"),
    ("GET /a;JSESSIONID=ABC123DEF456?x=1 HTTP/1.1", f"GET /a;JSESSIONID={REDACTED}?x=1 HTTP/1.1"),
    ("https://h/app;jsessionid=ABC123DEF456/x", f"https://h/app;jsessionid={REDACTED}/x"),
    ("GET /x?PHPSESSID=ABC123DEF456&y=1", f"GET /x?PHPSESSID={REDACTED}&y=1"),
    ("GET /a;ASPSESSIONIDQQGGQGPG=ABC123DEF456 HTTP/1.1",
     f"GET /a;ASPSESSIONIDQQGGQGPG={REDACTED} HTTP/1.1"),
    ("GET /socket.io/?EIO=4&transport=polling&sid=ABC123DEF456 HTTP/1.1",
     f"GET /socket.io/?EIO=4&transport=polling&sid={REDACTED} HTTP/1.1"),
    # a one-time code a redirect carries (OAuth's authorization code, CAS' service ticket)
    ("GET /oauth/callback?code=ABC123DEF456&state=xyz HTTP/1.1",
     f"GET /oauth/callback?code={REDACTED}&state=xyz HTTP/1.1"),
    ("302 to https://app/cb?state=xyz&code=ABC123DEF456",
     f"302 to https://app/cb?state=xyz&code={REDACTED}"),
    ("https://app/cb#code=ABC123DEF456", f"https://app/cb#code={REDACTED}"),
    ("GET /app?ticket=ABC123DEF456 HTTP/1.1", f"GET /app?ticket={REDACTED} HTTP/1.1"),
    ("`--x https://o/cb?code=ABC123DEF456` moves", f"`--x https://o/cb?code={REDACTED}` moves"),
])
def test_a_session_id_in_a_url_is_hidden(text: str, want: str) -> None:
    """A session id in a request line's path parameters (`;jsessionid=`) or query: whoever
    holds it is logged in as its user."""
    assert _hidden(text, "ABC123DEF456") == want


@pytest.mark.parametrize("text", ["x?AccountSid=AC123&y=1", "ps -o pid,sid=", "sid=5 pgid=5",
                                  "session_id=7 sessions=2", "GET /v1/models;v=2 HTTP/1.1",
                                  "GET /status?code=404 HTTP/1.1", "exit code=1 signal=9",
                                  "GET /errors?code=503&x=1", "zip_code=12345 ticket_count=2"])
def test_what_names_no_session_id_stays(text: str) -> None:
    assert R.text(text) == text


@pytest.mark.parametrize(("text", "want"), [
    ("+ mysql -u root -pS3cretPw9 vllm", f"+ mysql -u root -p{REDACTED} vllm"),
    ("mysqldump -uroot -pS3cretPw9 --all", f"mysqldump -uroot -p{REDACTED} --all"),
    ("mariadb -pS3cretPw9 -e 'select 1'", f"mariadb -p{REDACTED} -e 'select 1'"),
    ("sshpass -p S3cretPw9 ssh -p 22 gpu1", f"sshpass -p {REDACTED} ssh -p 22 gpu1"),
    ("sshpass -v -pS3cretPw9 scp a b", f"sshpass -v -p{REDACTED} scp a b"),
    ("+ docker login -u bob -p S3cretPw9 nvcr.io", f"+ docker login -u bob -p {REDACTED} nvcr.io"),
    ("redis-cli -h r -p 6379 -a S3cretPw9 ping", f"redis-cli -h r -p 6379 -a {REDACTED} ping"),
    # htpasswd's batch mode: the password is the word after FILE USER, or USER with -n
    ("+ htpasswd -b /etc/nginx/.htpasswd admin S3cretPw9",
     f"+ htpasswd -b /etc/nginx/.htpasswd admin {REDACTED}"),
    ("htpasswd -cbB -C 12 /etc/h admin 'S3cretPw9'",
     f"htpasswd -cbB -C 12 /etc/h admin {REDACTED}"),
    ("htpasswd -nb admin S3cretPw9 > /etc/h", f"htpasswd -nb admin {REDACTED} > /etc/h"),
    # bcrypt's cost glued to -b (`-bBC 12`, `-C12`): the cost was read as FILE, the user hidden
    ("htpasswd -bBC 12 /etc/h admin S3cretPw9", f"htpasswd -bBC 12 /etc/h admin {REDACTED}"),
    ("htpasswd -b -C12 /etc/h admin S3cretPw9", f"htpasswd -b -C12 /etc/h admin {REDACTED}"),
    ("htpasswd -b -- /etc/h admin S3cretPw9", f"htpasswd -b -- /etc/h admin {REDACTED}"),
    # a shell's quotes around the password, or in it (set -x quotes a word that needs it)
    ("+ mysql -u root '-pS3cretPw9' -h 'db'", f"+ mysql -u root '-p{REDACTED}' -h 'db'"),
    ("mysql -p'S3cretPw9' vllm", f"mysql -p{REDACTED} vllm"),
    ('mysql -p"S3cretPw9 x" vllm', f"mysql -p{REDACTED} vllm"),
    ("mysql -pS3cret'Pw9 x'", f"mysql -p{REDACTED}"),
    ("sshpass -p 'S3cretPw9' ssh gpu1", f"sshpass -p {REDACTED} ssh gpu1"),
    ("+ docker login -p 'S3cretPw9' nvcr.io", f"+ docker login -p {REDACTED} nvcr.io"),
    ('redis-cli -a "S3cretPw9" ping', f"redis-cli -a {REDACTED} ping"),
    ("redis-cli -a 'S3cretPw9", f"redis-cli -a {REDACTED}"),
])
def test_a_password_by_a_client_s_short_flag_is_hidden(text: str, want: str) -> None:
    """The class of curl's -u: a client that takes its password by a flag with no secret name,
    in a wrapper's shell trace (`set -x`) that reaches a record's output tail or the journal."""
    assert _hidden(text, "S3cretPw9") == want


@pytest.mark.parametrize("text", [
    "mysql -u root -p vllm", "mysql -P 3306 -h db", "docker run -p 8000:8000 vllm/vllm-openai",
    "ssh -p 22 gpu1", "sshpass -f /etc/pw ssh -p 22 gpu1", "podman run -p 8000:8000 -a stdout x",
    "vllm serve /m -a x", "htpasswd -c /etc/nginx/.htpasswd admin", "htpasswd -D /etc/h admin",
    "htpasswd -bi /etc/h admin", "htpasswd -Bbi -C 12 /etc/h admin"])
def test_a_short_flag_that_is_no_password_stays(text: str) -> None:
    assert R.text(text) == text


_HT_FLAGS = st.lists(st.sampled_from(["c", "m", "B", "d", "p", "s", "D", "v", "C 12", "C7"]),
                     max_size=4)


@settings(max_examples=300, deadline=None)
@given(_HT_FLAGS, _HT_FLAGS, st.booleans(), st.booleans(), values)
def test_htpasswd_s_password_is_hidden_and_its_user_shown(
        before: list[str], after: list[str], no_file: bool, glued: bool, password: str) -> None:
    """htpasswd's words as its getopt reads them ("cnmspdBbDiC:v"): -b takes the password as
    the word after FILE USER (USER with -n), whatever flags and bcrypt cost come with it."""
    assume(not password.startswith("-"))
    letters = "".join(f.split()[0] for f in before) + "b" + ("n" if no_file else "")
    cost = [f for f in (*before, *after) if f.startswith("C")][-1:]
    if glued:  # one group of letters, its -C cost last (`-bBC 12`)
        flags_ = f"-{letters.replace('C', '')}{cost[0] if cost else ''}"
    else:
        flags_ = " ".join([f"-{f}" for f in before] + ["-b"] + (["-n"] if no_file else [])
                          + [f"-{f}" for f in after])
    head = f"+ htpasswd {flags_} {'' if no_file else '/etc/nginx/.htpasswd '}admin"
    text = f"{head} {password}"
    assert R.text(text) == f"{head} {REDACTED}", text
    assert REDACT.text(text) == f"{head} {REDACTED}", text


@pytest.mark.parametrize("text", [
    "+ vllm serve /m --api-key 'Zq9K1a+/=' 'Zq9K2b+/=' --port 8000",
    'vllm serve /m --api-key "Zq9K1a" "Zq9K2b" --port 8000',
    "vllm serve /m --api-key Zq9K1a 'Zq9K2b x' --port 8000"])
def test_every_shell_quoted_key_of_api_key_is_hidden(text: str) -> None:
    """A shell's trace quotes a word with a sign in it (`set -x`, shlex.join): the second key
    of `--api-key 'K1' 'K2'` showed, as the rule for more keys read bare words only."""
    assert _hidden(text, "Zq9K1a", "Zq9K2b").endswith(f"--api-key {REDACTED} --port 8000")


@settings(max_examples=300, deadline=None)
@given(values, values)
def test_any_shell_quoted_second_key_is_hidden(first: str, second: str) -> None:
    assume(not second.startswith("-") and second not in first)
    _hidden(f"+ vllm serve --api-key '{first}' '{second}' --port 8000", first, second)


def test_a_listed_variable_across_two_lines_of_a_stream_is_hidden() -> None:
    """The YAML form across two lines of a stream (a record's output, vLLM's stdout): each
    line was redacted alone, and `  value: X` alone names nothing."""
    lines = ["env:", "- name: HF_TOKEN", "  value: Zq7Xy9Wv4Lm", "- name: PORT", "  value: 8000"]
    for red in (R, REDACT):
        out = red.lines(lines)
        assert out == [*lines[:2], f"  value: {REDACTED}", *lines[3:]], out
        assert red.after(lines[1], lines[2]) == f"  value: {REDACTED}"
        assert red.after("- name: PORT", "  value: 8000") == "  value: 8000"


@settings(max_examples=300, deadline=None)
@given(values, values, st.sampled_from(['"', '\\"', '\\', "'"]), st.integers(2, 3),
       st.sampled_from(["api_key", "password", "hf_token"]))
def test_a_quote_in_a_secret_of_json_in_a_string_is_hidden(
        head: str, tail: str, sign: str, levels: int, name: str) -> None:
    """JSON inside a JSON string (a request body in an error message, once or twice): a `"` in
    the value is escaped once more than the quotes around it (`\\"K1\\\\\\"K2\\"`); the value
    ended at that quote, the rest of the secret in clear."""
    secret = f"{head}{sign}{tail}"
    text = json.dumps({name: secret, "model": "/m"})
    for _ in range(levels - 1):
        text = json.dumps(text)
    for red in (R, REDACT):
        out = red.text(text)
        assert head not in out and tail not in out and "/m" in out, (text, out)


# vLLM's parser takes a unique prefix of a flag, `_` for `-`, and `--NAME.k V`: a wrapper's
# shell trace of `vllm serve ... --api-k X` showed X in clear (no secret word in `api-k`)
ABBREVIATED = ["--api-k", "--api-ke", "--api_ke", "--api-k.x", "--hf-t", "--hf-tok", "--hf_toke"]


@pytest.mark.parametrize("flag", ABBREVIATED)
@pytest.mark.parametrize("sep", [" ", "=", "\t"])
@given(secret=st.from_regex(r"[A-Za-z0-9_./+]{6,40}", fullmatch=True))
def test_a_secret_flag_abbreviated_hides_its_value(flag: str, sep: str, secret: str) -> None:
    # a sentence's word after a space is prose, not a value (`--api-k is ...`)
    assume(sep == "=" or re.split(r"\W", secret.lower())[0] not in ENGLISH)
    text = f"+ exec vllm serve /m {flag}{sep}{secret} --port 8000"
    assert REDACT.text(text) == f"+ exec vllm serve /m {flag}{sep}{REDACTED} --port 8000"


@pytest.mark.parametrize("text", [
    "--api-server-count 2", "--hf-config-path /models/cfg", "--hf-t --port 8000",
    "argparse: --api-k expected one argument", "--api-k is --api-key abbreviated (vLLM's "
    "parser takes prefixes); use api-key written in full"])
def test_what_no_abbreviated_secret_flag_holds_stays(text: str) -> None:
    assert REDACT.text(text) == text


_SGR = ["\x1b[31m", "\x1b[0m", "\x1b[1;32m", "\\x1b[31m", "\\u001b[0m", "\\\\u001b[36m", "\\033[2m"]


@pytest.mark.parametrize("code", _SGR)
@pytest.mark.parametrize("form", ["{c}--api-key S3cretPw9", "{c}HF_TOKEN=S3cretPw9{c}",
                                  "{c}api_key:{c} S3cretPw9", "API key:{c} S3cretPw9",
                                  "{c}https://u:S3cretPw9@h{c}", "{c}X-Api-Key{c}: S3cretPw9",
                                  "api_key={c}S3cretPw9{c}", "{c}password{c}={c}S3cretPw9"])
def test_a_terminal_colour_code_glued_to_a_name_or_value_hides_nothing(form: str,
                                                                      code: str) -> None:
    """`\\x1b[31m--api-key X`: the code's `m` was a word character before the name, so no rule
    saw a name there; after `key:`, the code was taken for the value and X shown."""
    assert "S3cretPw9" not in (shown := R.text(form.format(c=code))), shown


def test_colours_stay_where_they_hid_nothing() -> None:
    for text in ("\x1b[32mINFO\x1b[0m plain line",
                 "\x1b[32mINFO\x1b[0m args: {'api_key': ['S3cretPw9']}"):
        assert "\x1b[32mINFO\x1b[0m" in R.text(text) and "S3cretPw9" not in R.text(text)


@pytest.mark.parametrize("escape", ["\\n", "\\t", "\\r", "\\\\n", "\\\\\\n"])
@pytest.mark.parametrize("flag", ["--api-key", "--hf-token", "--api-k", "--password",
                                  "--x-api-key"])
def test_a_flag_after_an_escaped_line_break_hides_its_value(escape: str, flag: str) -> None:
    """A multi-line text JSON-encoded or repr'd (`"out\\n--api-key X"`): the escape's letter
    was a word character before the flag, so no rule saw a flag begin there."""
    text = f'"vllm serve /m{escape}{flag} S3cretPw9{escape}--port 8000"'
    assert "S3cretPw9" not in (shown := R.text(text)) and "--port 8000" in shown, shown


@pytest.mark.parametrize(("text", "want"), [
    # a password quoted inside the URL, as a shell or a config writer leaves it: the quote
    # ended the password's class, so nothing was hidden and the whole password showed
    ('--otlp-traces-endpoint https://u:"Zq9XkLmP"@h/x',
     "--otlp-traces-endpoint https://u:<redacted>@h/x"),
    ('https://u:"Zq9@kLmP"@h', "https://u:<redacted>@h"),
    ('curl "https://u:"Zq9XkLmP@h/x', 'curl "https://u:<redacted>@h/x'),
    ("https://u:'Zq9XkLmP'@h", "https://u:<redacted>@h"),
    ("https://u:p%40ssZq9@h/x", "https://u:<redacted>@h/x"),  # percent-encoded `@`
    # a quote that closes the URL before a later `@` is no password's
    ('["https://h:8000","user@host"]', '["https://h:8000","user@host"]'),
    ('see "https://h:8000" or "a@b"', 'see "https://h:8000" or "a@b"'),
])
def test_a_quoted_url_password_is_hidden(text: str, want: str) -> None:
    assert R.text(text) == want
