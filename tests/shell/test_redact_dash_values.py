"""A secret that begins with dashes: `--00000A`, `-9aB3kx`, `--_x9Y..` (secrets.token_urlsafe()
makes such keys) is a value, not a flag, after a secret's name in every form. So is one of
dashes then a letter (`--abc123`, `--Zq7..`) right after a secret flag given bare: vLLM's parser
refuses `--api-key --abc123`, and the refusal, the unit's line and `check` showed the key. Only
`--`, another secret flag, and any flag after `--hf-token` (it may stand bare; an HF token
begins `hf_`) stay: `--api-key --port 8000` hides `--port`. Hypothesis found `--00000A`
leaking through the log's `args` (child.started's argv, config/launch.redact_argv): a word that
began with `--` was taken for the next flag, whatever followed the dashes, and stayed in clear."""

from __future__ import annotations

import io
import json

import pytest

from vllmwatch.config.redact import REDACT, Redactor, redact_argv
from vllmwatch.shell import logs

R = Redactor(known=False)
DASHED = ("--00000A", "-9aB3kx", "--_x9Yab3", "---9abcD", "-_9abcdE", "--9", "-1234567a")
FLAGS = ("api-key", "hf-token", "x-api-key", "password", "client-secret")
NAMES = ("api_key", "API_KEY", "apiKey", "hf_token", "password", "DB_PASSWORD", "client_secret",
         "access_token", "x-api-key", "AWS_SECRET_ACCESS_KEY", "credentials", "privateKey")
WORD_NAMES = ("password", "PASSWORD", "token", "secret", "key", "api-key", "X-Api-Key",
              "client-secret", "hf-token", "passphrase", "PGPASSWORD")


def _argvs(v: str) -> list[list[str]]:
    return [["vllm", "serve", "/m", f"--{flag}", v, "--port", "8000"] for flag in FLAGS] + [
        ["vllm", "serve", "--api-key", "K1x9abcd", v, "--port", "8000"],  # nargs "+": K2
        ["vllm", "serve", "--api-key", v, v + "2", "--port", "8000"]]


@pytest.mark.parametrize("v", DASHED)
def test_a_dashed_value_after_a_secret_flag_in_an_argv_is_hidden(v: str) -> None:
    for argv in _argvs(v):
        for shown in (redact_argv(argv), R.argv(argv), REDACT.deep(argv)):
            assert v not in shown and shown[-2:] == ["--port", "8000"], (argv, shown)


@pytest.mark.parametrize("v", DASHED)
def test_a_dashed_value_never_leaves_through_the_log(v: str) -> None:
    for fmt in ("json", "console"):
        stream = io.StringIO()
        logs.setup(fmt, "info", stream=stream, environ={})(
            "info", "child.started", pid=7, args=["vllm", "serve", "--api-key", v, "--port", "1"],
            argv=["vllm", "serve", "--api-key", "K1x9abcd", v], command=f"vllm --api-key {v}")
        assert v not in stream.getvalue() and "--port" in stream.getvalue(), stream.getvalue()


def _texts(v: str) -> list[str]:
    """Each form of tests/support/secrets.leaks() that a value of one word can take."""
    out = [f"wrong {w} {v}, retry" for w in WORD_NAMES] + \
        [f"{w} {v}" for w in WORD_NAMES] + [f"{w}\t'{v}'" for w in WORD_NAMES]
    for name in NAMES:
        flag, env = name.lower().replace("_", "-"), name.upper().replace("-", "_")
        out += [f"{env}={v}", f'{env}="{v}"', f"{name}: {v}", f"--{flag} {v}", f"--{flag}={v}",
                f"--{flag} {v} --port 8000", f"poller {name}={v}", f"GET /cb?code=1&{name}={v}&x=2",
                json.dumps({name: v, "model": "/m"}), f"args: {{'model': '/m', '{name}': '{v}'}}",
                f"args: {{'{name}': ['{v}']}}", f"    os.environ['{env}'] = '{v}'",
                f'cfg["{name}"]="{v}"', f"DEBUG {name} {v}"]
    for flag in FLAGS:
        out += [f"['vllm', 'serve', '/m', '--{flag}', '{v}', '--port', '8000']",
                json.dumps(["vllm", "serve", f"--{flag}", v])]
    return [*out, f"Authorization: Bearer {v}", f"[('authorization', 'Bearer {v}')]",
            f"Cookie: lang=en; session={v}", f"https://u:{v}@host", f"https://{v}@host",
            f"--api-key K1x9abcd {v} --port 8000", f"--api-key {v} {v}2 --port 8000"]


@pytest.mark.parametrize("v", [v for v in DASHED if len(v) >= 6])  # (a word name's value: 6)
def test_a_dashed_value_is_hidden_in_every_form_of_text(v: str) -> None:
    leaked = [(text, shown) for text in _texts(v) if v in (shown := R.text(text))]
    assert not leaked, leaked


@pytest.mark.parametrize("argv,want", [
    (["vllm", "serve", "--hf-token", "--port", "8000"], ["vllm", "serve", "--hf-token", "--port",
                                                          "8000"]),
    (["vllm", "--api-key", "--hf-token", "--port"], ["vllm", "--api-key", "--hf-token", "--port"]),
    # (after `--` the word is the key's, as in a line's text: vLLM refuses `--api-key --`,
    # and a key passed so, `--api-key -- -K`, stays hidden; 4ad0ba6)
    (["vllm", "--api-key", "--", "/m"], ["vllm", "--api-key", "--", "<redacted>"]),
    (["vllm", "--api-key", "K1x9abcd", "-tp", "2"], ["vllm", "--api-key", "<redacted>", "-tp",
                                                      "2"]),
    (["vllm", "--api-key", "K1x9abcd", "--port", "8000"], ["vllm", "--api-key", "<redacted>",
                                                            "--port", "8000"]),
    (["vllm", "--hf-token", "--max-model-len", "8192"], ["vllm", "--hf-token",
                                                         "--max-model-len", "8192"]),
])
def test_a_flag_after_a_secret_flag_stays(argv: list[str], want: list[str]) -> None:
    assert redact_argv(argv) == want and R.argv(argv) == want


@pytest.mark.parametrize("text", [
    "password --ssl-keyfile-password", "api-key --port 8000",
    "vllm serve /m --hf-token --port 9000",
    "--hf-token --max-model-len 8192", "htpasswd -bBC12 /etc/h admin",
])
def test_a_flag_after_a_secret_name_in_text_stays(text: str) -> None:
    assert R.text(text) == text


# Dashes, then a letter: a flag's shape, but the value of the secret flag given bare before it
LETTERED = ("--abc123", "--Zq7xYb9kLm", "-abc123X", "--api-keyX9z")


@pytest.mark.parametrize("v", LETTERED)
@pytest.mark.parametrize("flag", ["--api-key", "--api-k", "--api-key.k", "--x-api-key",
                                  "--password"])
def test_a_lettered_value_right_after_a_secret_flag_is_hidden(flag: str, v: str) -> None:
    argv = ["vllm", "serve", "/m", flag, v]
    for shown in (redact_argv(argv), R.argv(argv), REDACT.deep(argv)):
        assert v not in shown and shown[:4] == argv[:4], (argv, shown)
    for text in (f"vllm serve /m {flag} {v}", f"vllm serve /m {flag}={v}",
                 f"vllm serve /m {flag} {v} --served-model-name m", f"$ {flag}\t{v}"):
        assert v not in (shown := R.text(text)) and flag in shown, (text, shown)


@pytest.mark.parametrize("text", [
    "mysql -u root -p--Zq7xYb9k db", "sshpass -p --Zq7xYb9k ssh host", "sshpass -p -Zq7xYb9k ssh h",
    "redis-cli -a --Zq7xYb9k ping", "docker login -u me -p --Zq7xYb9k reg.io",
    "--api-k=--Zq7xYb9k", "--hf-t=--Zq7xYb9k"])
def test_a_clients_password_that_begins_with_dashes_is_hidden(text: str) -> None:
    assert "Zq7xYb9k" not in (shown := R.text(text)), shown


def test_a_secret_flag_after_a_bare_one_keeps_its_own_value_hidden() -> None:
    # the word after `--api-key` is hidden whatever it is, but a secret flag there is a flag:
    # hidden in its place, the value after it was shown
    for text in ("--api-key --hf-token hf_secretXYZ9", "--hf-token --api-key K9secretXYZ",
                 "--api-k --hf-token hf_secretXYZ9", "--hf-token --api-key=K9secretXYZ"):
        assert "secretXYZ" not in (shown := R.text(text)), (text, shown)
        assert "secretXYZ" not in " ".join(R.argv(text.split())), text


@pytest.mark.parametrize("v", ["--Zq7xYb9kLm", "-Zq7xYb9kLm", "--api-keyX9z", "-abc123X"])
def test_a_later_key_of_api_key_in_no_flags_shape_is_hidden(v: str) -> None:
    # vLLM's `--api-key K1 K2`: a word of dashes that no vLLM flag is spelt as (a capital, a
    # digit inside a short one) is the next key, not the next flag: it was shown
    argv = ["vllm", "--api-key", "K1x9abcd", v, "-tp", "2", "-O3", "--port", "8000"]
    for shown in (redact_argv(argv), R.argv(argv), REDACT.deep(argv)):
        assert v not in shown and shown[-5:] == argv[-5:], shown
    text = " ".join(argv)
    assert v not in (said := R.text(text)) and said.endswith(" -tp 2 -O3 --port 8000"), said
