"""Secrets by more spellings (config/secretnames.py, config/secretnames.py), and vllmwatch's
own messages left whole: a secret's name with a word after it read as a secret and its value
(`password: not set` showed `password: <redacted> set`)."""

from __future__ import annotations

import io
import json
import os
import re

import pytest

from vllmwatch.config import flags
from vllmwatch.config.redact import REDACT, REDACTED, Redactor, is_secret_name
from vllmwatch.migrate import runner

R = Redactor(known=False)


@pytest.mark.parametrize(("name", "secret"), [
    # MinIO's and others' one-word keys; a key whose first word says which credential
    ("SECRETKEY", True), ("MINIO_SECRETKEY", True), ("AWS_SECRETKEY", True),
    ("minioSecretKey", True), ("SIGNINGKEY", True), ("JWT_SIGNINGKEY", True),
    ("MASTERKEY", True), ("ENCRYPTIONKEY", True), ("STORAGE_ACCOUNTKEY", True),
    # a password's short spelling; PWD and OLDPWD are the shell's directories
    ("DB_PW", True), ("ROOT_PW", True), ("pw", True), ("PWD", False), ("OLDPWD", False),
    ("PW_FILE", False),
    # a webhook's URL is its credential (the secret is in the path)
    ("SLACK_WEBHOOK_URL", True), ("DISCORD_WEBHOOK", True), ("WEBHOOK_URL", True),
    ("WEBHOOK_TIMEOUT", False), ("WEBHOOK_URL_FILE", False), ("webhooks_enabled", False),
    # a key of a keyboard, a hot key, an animal
    ("KEYBOARD_LAYOUT", False), ("HOTKEY", False), ("MONKEY", False), ("KEY_PATH", False),
    ("POWER_LIMIT", False),
])
def test_secret_names_by_more_spellings(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret
    line = f"{name}=Zq9XkLmP42"
    assert (R.text(line) == f"{name}={REDACTED}") is secret, R.text(line)


@pytest.mark.parametrize(("text", "want"), [
    # NAME=value as a shell or an env file writes it: to the next space
    ("DB_PASSWORD=abc;def", "DB_PASSWORD=<redacted>"),
    ("export TOKEN=abc&def x", "export TOKEN=<redacted> x"),
    ("x token=;abcd12345", "x token=<redacted>"),
    ("TOKEN=abc,def x", "TOKEN=<redacted> x"),
    ("--api-key=abc;def --port 1", "--api-key=<redacted> --port 1"),
    # but a query's `;`/`&` still ends it, and a closing bracket stays
    ("GET /?token=abc;def HTTP", "GET /?token=<redacted>;def HTTP"),
    ("GET /?a=1&token=abc&b=2 HTTP", "GET /?a=1&token=<redacted>&b=2 HTTP"),
    ("Namespace(x=1, api_key=abc, y=2)", "Namespace(x=1, api_key=<redacted>, y=2)"),
    ("f(a, token=abc)", "f(a, token=<redacted>)"),
    # Perl's, PHP's, Ruby's `=>`
    ("password => abcd12345", "password => <redacted>"),
    ("'password' => 'abcd12345'", "'password' => '<redacted>'"),
    ('{"api_key" => "abcd12345"}', '{"api_key" => "<redacted>"}'),
])
def test_a_value_by_more_spellings_is_hidden_whole(text: str, want: str) -> None:
    assert R.text(text) == want


@pytest.mark.parametrize("text", [
    "password: not set", "api_key: none given", "--api-key is given twice",
    "--api-key gives 2 keys", "token: missing", "--hf-token has no value",
])
def test_a_sentence_after_a_secret_name_stays(text: str) -> None:
    assert R.text(text) == text


@pytest.mark.parametrize(("text", "want"), [
    ("password=not", "password=<redacted>"),  # after `=`, a value whatever it reads
    ("password: notset", "password: <redacted>"),
])
def test_a_word_after_equals_is_still_a_value(text: str, want: str) -> None:
    assert R.text(text) == want


def test_inits_message_on_two_keys_reads_whole(tmp_path: os.PathLike[str]) -> None:
    """`vllmwatch init -- vllm serve m --api-key K1 K2` said `--api-key <redacted> 2 keys`."""
    err = io.StringIO()
    req = runner.Request(["--", "vllm", "serve", "m", "--api-key", "SEKRETaaa", "jjj"], None,
                         os.path.join(tmp_path, "x.toml"), stdout=True, fast=True)
    runner.main(req, os.environ, out=io.StringIO(), err=err)
    said = err.getvalue()
    assert "`--api-key` gives 2 keys" in said and "SEKRETaaa" not in said, said
    assert REDACT.text(said) == said


def test_the_configs_message_on_two_keys_reads_whole() -> None:
    """flags' problem said `--api-key with more than one key: vllmwatch`: both `with` and
    `vllmwatch` read as values."""
    problems = flags.args_problems({}, ["--api-key", "sk-one-word", "sk-two"])
    text = " ".join(p.problem for p in problems)
    assert "more than one key" in text and REDACT.text(text) == text, text


@pytest.mark.parametrize(("argv", "want"), [
    # `--` between a secret flag and its word (getopt's way to pass a key that starts with
    # `-`): vLLM's argparse ends its options there and refuses the line, but K is the key
    # the person typed, and the refusal, the unit's line and `check` print it
    (["serve", "m", "--api-key", "--", "Zq9XkLmP42"], ["serve", "m", "--api-key", "--", REDACTED]),
    (["--hf-token", "--", "Zq9XkLmP42", "--port", "8000"],
     ["--hf-token", "--", REDACTED, "--port", "8000"]),
    (["--api-key", "--", "K1zq9XkLmP", "K2zq9XkLmP"], ["--api-key", "--", REDACTED, REDACTED]),
    # one dash (Go's flag package, many CLIs), any case or `_` (`--API-KEY`, `--Api_Key`)
    (["-api-key", "Zq9XkLmP42", "-port", "8000"], ["-api-key", REDACTED, "-port", "8000"]),
    (["-hf_token=Zq9XkLmP42"], [f"-hf_token={REDACTED}"]),
    (["--API-KEY", "Zq9XkLmP42"], ["--API-KEY", REDACTED]),
    (["--Api_Key", "Zq9XkLmP42"], ["--Api_Key", REDACTED]),
    # a short flag is no prefix of a secret one (`-a` is not `--api-key`)
    (["-a", "8000", "-tp", "2", "-p", "80"], ["-a", "8000", "-tp", "2", "-p", "80"]),
])
def test_a_secret_flag_with_a_dash_run_or_one_dash_hides_its_word(argv: list[str],
                                                                    want: list[str]) -> None:
    """`--api-key -- K` and `-api-key K` showed K, in an argv and in a line of text."""
    assert R.argv(argv) == want
    line = " ".join(argv)  # (a text hides `K1 K2` as one)
    assert "q9XkLmP" not in R.text(line) and (REDACTED in " ".join(want) or R.text(line) == line)


@pytest.mark.parametrize("text", [
    "INFO 12-07 10:00:00 [api_server.py:123] Started server process [1234]",
    "vllm serve m --port 8000 -tp 2 --max-model-len 8192 -- extra",
    "see https://example.com/docs?x=1#token and ssh://git@github.com/a/b",
    "- token budget 8192 per step; a-key value; pre-token count 5",
    "INFO 12-07 [loader.py:9] Loading weights took 3.1 s\r\n",
])
def test_ordinary_lines_are_left_whole(text: str) -> None:
    assert R.text(text) == text


_CONTINUED = [
    # a pasted `vllm serve` or a unit's ExecStart= over lines: the shell (and systemd) join
    # `\` and the line break, so the key is the next line's word; the redactor hid the `\`
    # and showed the key, and showed a second key of `--api-key K1 \` too
    ("vllm serve m --api-key \\\n    Zq9XkLmP42 --port 1", "vllm serve m --api-key \\\n    "
     f"{REDACTED} --port 1"),
    ("--api-key \\\r\n Zq9XkLmP42", f"--api-key \\\r\n {REDACTED}"),
    ("--api-key K1zq9XkLmP \\\n  K2zq9XkLmP \\\n  --port 1",
     f"--api-key {REDACTED} \\\n  --port 1"),
    ("--hf-token \\\n --api-key \\\n Zq9XkLmP42", f"--hf-token \\\n --api-key \\\n {REDACTED}"),
    ("export HF_TOKEN=\\\nZq9XkLmP42", f"export HF_TOKEN=\\\n{REDACTED}"),
    ("api_key: \\\n  Zq9XkLmP42", f"api_key: \\\n  {REDACTED}"),
    # the continuation after the last key stays, and so does the next line's flag
    ("--api-key Zq9XkLmP42 \\\n  --port 1", f"--api-key {REDACTED} \\\n  --port 1"),
]


@pytest.mark.parametrize(("text", "want"), _CONTINUED)
def test_a_value_after_a_shell_line_continuation_is_hidden(text: str, want: str) -> None:
    assert R.text(text) == want


@pytest.mark.parametrize(("text", "want"), _CONTINUED)
def test_a_value_after_an_escaped_continuation_is_hidden(text: str, want: str) -> None:
    """The same lines JSON-encoded (a record, an error quoting the pasted line), or repr'd."""
    for encode in (json.dumps, repr, lambda t: json.dumps(json.dumps(t))):
        out = R.text(encode(text))
        assert "q9XkLmP" not in out and REDACTED in out, (encode(text), out)


_JOINERS = ["\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029", "\xa0"]


@pytest.mark.parametrize("sep", _JOINERS)
@pytest.mark.parametrize("line", [
    "vllm serve m --api-key Zq9X{}kLmP42 --port 1", "api_key=Zq9X{}kLmP42 n=1",
    "HF_TOKEN=Zq9X{}kLmP42 x", "export HF_TOKEN=Zq9X{}kLmP42", "Authorization: Bearer Zq9X{}kLmP42",
    "{{'api_key': Zq9X{}kLmP42}}", "--api-key K1zq9XkLmP K2zq9X{}kLmP --port 1",
])
def test_a_space_no_shell_splits_at_is_part_of_the_value(line: str, sep: str) -> None:
    """`\\r`, `\\x0b`, `\\u2028`, NBSP inside a word are the word's to a shell and to argv (a
    key read from a CRLF file): the value ended there and the rest showed, which a terminal
    even moves to the line's start (`\\r`)."""
    out = R.text(line.format(sep))
    assert "kLmP42" not in out and "Zq9X" not in out and REDACTED in out, out
    assert out.endswith((" --port 1", " n=1", " x", REDACTED, "}")), out


@pytest.mark.parametrize("text", [
    "token=Zq9XkLmP42\r\nHost: h", "api_key=Zq9XkLmP42\r", "token=Zq9XkLmP42\x85 next",
    "--api-key Zq9XkLmP42\u2028 --port 1",
])
def test_a_space_no_shell_splits_at_still_ends_a_value_before_a_space(text: str) -> None:
    """Before a space or at a line's end (CRLF), such a character ends the value as before."""
    out = R.text(text)
    assert out == re.sub("Zq9XkLmP42", REDACTED, text), out


@pytest.mark.parametrize("sep", ["\n", "\r", "\t", "\r\n", " \n  "])
@pytest.mark.parametrize("line", ["--api-key{}Zq9XkLmP42", "x api_key={}Zq9XkLmP42",
                                  "password:{}Zq9XkLmP42", "--hf-token{}Zq9XkLmP42 --port 1"])
def test_an_escaped_space_after_a_name_hides_what_the_raw_one_hides(line: str, sep: str) -> None:
    """`--api-key\\rK` hid K, JSON-encoded (a record, a request body in an error) it showed
    K: the escape was no separator, and a value may not begin with one."""
    raw = line.format(sep)
    for text in (raw, json.dumps(raw), repr(raw), json.dumps(json.dumps(raw))):
        out = R.text(text)
        assert "kLmP42" not in out and REDACTED in out, (text, out)
    assert R.text(json.dumps("password:\nnot set")) == json.dumps("password:\nnot set")


@pytest.mark.parametrize("flag", ["--api-key", "--API-KEY", "--Api_Key", "-api-key", "--api_k",
                                  "--api-ke"])
def test_every_key_of_a_spelling_of_api_key_is_hidden_in_an_argv_as_in_a_line(flag: str) -> None:
    """`--API-KEY K1 K2`: a line hid both keys (the text rule reads the name in any case), an
    argv showed K2 (redact_argv compared the name as spelt with `api-key`); `--api-ke K1 K2`,
    vLLM's parser's prefix, showed K2 in a line (the abbreviation's rule took one word)."""
    argv = [flag, "K1zq9XkLmP", "K2zq9XkLmP", "--port", "1"]
    assert R.argv(argv) == [flag, REDACTED, REDACTED, "--port", "1"]
    assert R.text(" ".join(argv)) == f"{flag} {REDACTED} --port 1"
