"""The one set of redaction rules (config/redact.py): every form of a secret is hidden, and
what is useful and not secret (a model path, a port, counts of tokens) stays."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.secrets import KNOWN_KEY, leaks
from vllmwatch.config import flags
from vllmwatch.config.redact import (
    REDACTED,
    Redactor,
    _to_last_at,
    is_secret_name,
    learn,
    redact_argv,
)
from vllmwatch.incident import metrics

R = Redactor(known=False)


@settings(max_examples=400, deadline=None)
@given(leaks())
def test_no_form_of_a_secret_passes_the_rules(leak: tuple[str, str]) -> None:
    text, secret = leak
    out = R.text(text)
    assert secret not in out and REDACTED in out


@settings(max_examples=400, deadline=None)
@given(leaks(), st.data())
def test_a_known_part_of_a_secret_hides_all_of_it(leak: tuple[str, str],
                                                  data: st.DataObject) -> None:
    """A known value that is only part of a secret in the text (the key file holds
    `Tr0ub4dor`, a line prints `PASSWORD=Tr0ub4dor2024`) hides the whole secret, not the
    known part with the rest left beside `<redacted>` where no rule sees it any more."""
    text, secret = leak
    start = data.draw(st.integers(0, len(secret) - 4), label="start")
    end = data.draw(st.integers(start + 4, len(secret)), label="end")
    known = secret[start:end]
    out = Redactor([known], known=False).text(text)
    assert known not in out and REDACTED in out
    for rest in (secret[:start], secret[end:]):
        if len(rest) >= 4 and rest not in text.replace(secret, " "):
            assert rest not in out, (known, rest, out)


@pytest.mark.parametrize("text,want", [
    ("DATABASE_URL=postgres://bob:hunter2x@db:5432/x",
     "DATABASE_URL=postgres://bob:<redacted>@db:5432/x"),
    ("--otlp-traces-endpoint https://user:sk-abc123456789@collector",
     "--otlp-traces-endpoint https://user:<redacted>@collector"),
    ("https://ghp_tok3n@github.com/x.git", "https://<redacted>@github.com/x.git"),
    ("https://0a1B2c3D4e5F6a7B8c9D@git.corp/x.git", "https://<redacted>@git.corp/x.git"),
    ("https://abc123def456abc789@h/x", "https://<redacted>@h/x"),
    ("https://alice2@h/x", "https://<redacted>@h/x"),
    ("https://alice:x-oauth-basic@github.com/o", "https://<redacted>:<redacted>@github.com/o"),
    ("{'authorization': 'Bearer abc.def'}", "{'authorization': '<redacted>'}"),
    ('{"api_key": "zz9", "n": 1}', '{"api_key": "<redacted>", "n": 1}'),
    ('{"token": 12345}', '{"token": <redacted>}'),
    ("thread poller token=abc123", "thread poller token=<redacted>"),
    ("DB_PASS=pa55 HOME=/root", "DB_PASS=<redacted> HOME=/root"),
    ("X-Api-Key: k3y", "X-Api-Key: <redacted>"),
    ("GET /c/b.gguf?sv=2024-08-04&se=2026-12-05&sp=r&sig=AbC%2Bd3f%3D HTTP/1.1",
     "GET /c/b.gguf?sv=2024-08-04&se=2026-12-05&sp=r&sig=<redacted> HTTP/1.1"),
    ("https://b.s3.amazonaws.com/m?X-Amz-Expires=60&X-Amz-Signature=9f86d081&x=1",
     "https://b.s3.amazonaws.com/m?X-Amz-Expires=60&X-Amz-Signature=<redacted>&x=1"),
    ("postgres://app:it'sS3cret@db/x", "postgres://app:<redacted>@db/x"),
    ("https://0a1b2c3d4e:x-oauth-basic@github.com/o/r.git",
     "https://<redacted>:<redacted>@github.com/o/r.git"),
    ("Authorization: Negotiate YIIabc123", "Authorization: Negotiate <redacted>"),
    ("proxy-authorization: SharedKey acct:c2ln", "proxy-authorization: SharedKey <redacted>"),
    ("Authorization: Splunk 0a1b-2c3d, next", "Authorization: Splunk <redacted>, next"),
    # JSON inside a string: a request body quoted in an error message or a log record
    ('body=\'{\\"token\\":\\"Zq9XkLmP\\", \\"n\\": 1}\'',
     'body=\'{\\"token\\":\\"<redacted>\\", \\"n\\": 1}\''),
    ('{"msg": "{\\n  \\"api_key\\": \\"Zq9XkLmP\\"\\n}"}',
     '{"msg": "{\\n  \\"api_key\\": \\"<redacted>\\"\\n}"}'),
    # percent-encoded: a query or a form body as an access log prints it
    ("GET /v1/models?api%5Fkey=Zq9XkLmP&x=1 HTTP/1.1",
     "GET /v1/models?api%5Fkey=<redacted>&x=1 HTTP/1.1"),
    ("a%26api_key%3DZq9X%2BkLmP%26b%3D2", "a%26api_key%3D<redacted>%26b%3D2"),
    ("%7B%22api_key%22%3A%22Zq9XkLmP%22%7D", "%7B%22api_key%22%3A%22<redacted>%22%7D"),
    ("x%20password%3A%20hunter22%20y", "x%20password%3A%20<redacted>%20y"),
    ("API%2DKEY=Zq9XkLmP", "API%2DKEY=<redacted>"),
    # a request quoted as a repr (aiohttp's "Error handling request"): a value ends at an
    # escaped line break, so the next header is judged by its own name
    (r"b'GET / HTTP/1.1\nAuthorization: Basic dXNlcjpw\nX-Api-Key: Zq9XkLmP\n'",
     r"b'GET / HTTP/1.1\nAuthorization: Basic <redacted>\nX-Api-Key: <redacted>\n'"),
    (r"token=Zq9XkLmP\r\nHost: h", r"token=<redacted>\r\nHost: h"),
    # a subscript assigned: a traceback quotes the source line of a wrapper that set it
    ("    os.environ['DB_PASSWORD'] = 'Zq9XkLmP'", "    os.environ['DB_PASSWORD'] = '<redacted>'"),
    ('cfg["api_key"]="Zq9XkLmP"; n = 1', 'cfg["api_key"]="<redacted>"; n = 1'),
    # a Cookie header hides all its cookies (the second one showed), a sentence stays
    ("Cookie: lang=en; session=Zq9XkLmP", "Cookie: <redacted>"),
    (r"b'GET / HTTP/1.1\r\nCookie: a=1; sid=Zq9XkLmP\r\nHost: h\r\n'",
     r"b'GET / HTTP/1.1\r\nCookie: <redacted>\r\nHost: h\r\n'"),
    ("Set-Cookie: sid=Zq9XkLmP; Path=/; HttpOnly", "Set-Cookie: <redacted>"),
    ("the cookie: not set", "the cookie: not set"),
    ("HTTP_COOKIE=a=1; sid=Zq9XkLmP", "HTTP_COOKIE=<redacted>"),
    # tokens of known shapes with no name before them (an error's text, a prompt logged)
    ("provided token has expired: ASIAY34FZKBOKMUTVV7A", "provided token has expired: <redacted>"),
    ("creds AIzaSyA1234567890abcdefghijklmnopqrstuv ok", "creds <redacted> ok"),
    ("oauth ya29.a0AfH6SMBx1234567890abcdefgh end", "oauth <redacted> end"),
    ("NIM nvapi-Ab12Cd34Ef56Gh78Ij90KlMn-op end", "NIM <redacted> end"),
    # `Bearer` before a secret's name: the name was taken for the credential, the value shown
    ("bearer token: Zq9XkLmP", "bearer token: <redacted>"),
    ("Using bearer token Zq9XkLmP", "Using bearer token <redacted>"),
    ('Bearer Token "Zq9XkLmP"', 'Bearer Token "<redacted>"'),
    ("bearer api_key=Zq9XkLmP", "bearer api_key=<redacted>"),
    ("Invalid bearer token", "Invalid bearer token"),
])
def test_each_form(text: str, want: str) -> None:
    assert R.text(text) == want


@pytest.mark.parametrize("text", [
    "--model /models/key-llama --port 8000 --host 0.0.0.0",
    "--tokenizer /models/tok --ssl-keyfile /etc/vllm/key.pem --max-num-batched-tokens 2048",
    "prompt_tokens=5 generation_tokens=7 max_tokens=16",
    'vllm:prompt_tokens_total{model_name="m"} 12',
    "http://127.0.0.1:8000/v1/completions",
    "KEY_PATH=/etc/k.pem TOKEN_URL=https://auth.example.com/token",
    "write to bob@example.com",
    "max_tokens%3D16%26prompt_tokens%3D5", "a=100%25 tokens%2Fs=3", "?foo%5Fbar=1",
    'body={\\"max_tokens\\": 16, \\"prompt\\": \\"key\\"}',
    # identifiers of tokens and keys, as vLLM logs a request (were hidden whole)
    "prompt_token_ids: [1, 2, 3], params: SamplingParams(stop_token_ids=[2], n=1)",
    "{'prompt_token_ids': [101, 7592], 'token_type_ids': [0, 0]}", "key_id=k-17",
    # the cause of a crash, as vLLM logs it (the weight's name was hidden)
    "(EngineCore_DP0 pid=812) KeyError: 'model.layers.0.mlp.gate_proj.weight'",
    "huggingface_hub.errors.LocalTokenNotFoundError: Token is required",
    "tokenizer: eos_token: '</s>', pad_token: '<pad>'",
    "'pass_config': {'enable_fusion': True}",
    # a secret flag without its value: the next flag is not its key (init's comment of a
    # line showed `--api-key <redacted> 9000`, the port's flag gone)
    "vllm serve /m --hf-token --port 9000", "--hf-token --max-model-len 8192",
    # a request's sampling parameters (every --enable-log-requests line) and the quantisation
    # keys a startup error names as its cause (were `<redacted>`)
    "Received request cmpl-1: params: SamplingParams(n=1, thinking_token_budget=2048, "
    "max_tokens=16)",
    "ValueError: No Int8 MoE backend supports the deployment configuration (weight_key="
    "QuantKey(int8,scale(f32,static,per_channel),symmetric), activation_key=None).",
    "ValueError: Unsupported quant_key: QuantKey(fp8e4m3,scale(f32,static,per_tensor))",
    "RequestOutput(request_id=1, prompt_token_ids=[1], prompt_token_id_logprobs=None)",
    "Got max_num_batched_tokens=8 and scheduled_token_delta=3.", "compile_key=(16, 2)",
    # no value (`<redacted>` said a key was set), a switch; a tuple under `key` is a lookup's
    # (a Triton autotune failure's shape, the cause of an engine crash)
    "Namespace(api_key=None, hf_token=None)", '{"api_key": null}', "use_auth_token=True",
    "context_attention_fwd with cached K/V (key=None) is not supported with ALiBi slopes.",
    "RuntimeError: No valid config for kernel fused_moe_kernel key=(128, 64, 'torch.bfloat16')"
    " (tried 4 configs)",
    # a login name with no password: which account a pip index, a git remote, an SSH URL used
    "Looking in indexes: https://__token__@pypi.corp.example/simple",
    "pip install --index-url https://alice@pypi.corp.example/simple vllm",
    "git clone ssh://git@github.com/org/repo.git", "https://deploy-bot@git.corp/x.git",
    # an error's words after a secret flag: argparse's, vllmwatch's own, a quoted sentence
    "vllm serve: error: argument --api-key: expected at least one argument",
    "argument --api-key: invalid choice", "ValueError: --api-key 'the key given here' is empty",
    "vllm.args.a: --a is --api-key abbreviated (vLLM's parser takes prefixes); use api-key",
    'error: --hf-token "must be set when --download-dir is" given',
])
def test_useful_non_secrets_stay(text: str) -> None:
    assert R.text(text) == text


@pytest.mark.parametrize("name,secret", [
    ("HF_TOKEN", True), ("apiKey", True), ("--x-api-key", True), ("SECRET_KEY_BASE", True),
    ("DB_PASS", True), ("Authorization", True), ("max_num_batched_tokens", False),
    ("tokenizer", False), ("ssl-keyfile", False), ("api_key_file", False),
    ("api_server_alive", False), ("prompt_tokens", False),
    # plural keys/tokens are lists of names or counts, unless a word says which credential
    ("keys", False), ("restart_keys", False), ("keys_changed", False), ("num_tokens", False),
    ("max_tokens", False), ("tokens_total", False), ("num_keys", False), ("max_token", False),
    ("tokens", False), ("api_key", True), ("apikey", True), ("key", True),
    ("access_token", True), ("hf_token", True), ("secret_key", True), ("api_keys", True),
    ("hfTokens", True), ("ACCESS_TOKENS", True), ("secret_keys", True),
    # PWD is the shell's working directory; a password only with a word before it
    ("PWD", False), ("OLDPWD", False), ("DB_PWD", True), ("MYSQL_PWD", True),
    # an id names a token or key, it is not one; a token named by id is still a token
    ("prompt_token_ids", False), ("token_id", False), ("access_key_id", False),
    ("id_token", True), ("token_identity", True),
    # an exception names what failed; a tokenizer's special tokens are text
    ("KeyError", False), ("LocalTokenNotFoundError", False), ("eos_token", False),
    ("pad_token", False), ("additional_special_tokens", False), ("pass_config", False),
    ("access_token", True), ("HF_TOKEN", True),
    # a header's value is the credential the server checks; a list of headers carries
    # credentials under any name; a header's name, a CORS list or a switch are not secrets
    ("AUTHORIZATION_HEADER", True), ("AUTH_HEADER", True), ("API_KEY_HEADER", True),
    ("COOKIE_HEADER", True), ("X_TOKEN_HEADER", True), ("OTEL_EXPORTER_OTLP_HEADERS", True),
    ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", True), ("extraHeaders", True),
    ("CONTENT_TYPE_HEADER", False), ("HEADER", False), ("headers", False),
    ("API_KEY_HEADER_NAME", False), ("allowed-headers", False),
    ("enable-request-id-headers", False), ("h11-max-header-count", False),
    # a number or a place about tokens; a key a word says is a quantisation's, a cache's or a
    # lookup's: names, not credentials; a key of a service's own kind stays one
    ("thinking_token_budget", False), ("scheduled_token_delta", False),
    ("key_quant_bits", False), ("token_suffix", False), ("prompt_token_id_logprobs", False),
    ("weight_key", False), ("activation_quant_key", False), ("cache_key", False),
    ("config_key", False), ("routing_key", True), ("hash_key", True), ("query_key", True),
    ("QUERY_KEY", True), ("API_KEY", True), ("session_key", True),
])
def test_secret_names_by_their_words(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_lists_of_key_names_stay_and_secret_keys_do_not() -> None:
    event = {"keys": ["gate.listen", "engine.port"], "restart_keys": ["engine.model"],
             "keys_changed": 2, "max_tokens": 16, "api_key": "zz9-x", "hf_token": "hf-v4l",
             "headers": {"key": "k3y-v"}}
    assert R.deep(event) == {**event, "api_key": REDACTED, "hf_token": REDACTED,
                             "headers": {"key": REDACTED}}
    text = "config.restart_required keys=['gate.listen'] api_keys=['k3y-v4l']"
    assert R.text(text) == "config.restart_required keys=['gate.listen'] api_keys=['<redacted>']"


def test_learnt_values_are_hidden_by_every_redactor_but_switches_are_not() -> None:
    learn(["learnt-V4lue-xyz", "true"])
    assert Redactor().text("a learnt-V4lue-xyz b true") == "a <redacted> b true"


@pytest.mark.parametrize("cut", range(1, len(KNOWN_KEY)))
def test_an_excerpt_never_keeps_part_of_a_secret_across_its_cut(cut: int) -> None:
    """head()/tail() redact before they cut: a secret across the cut is hidden whole, not
    left as a first (or last) part that no rule and no known value matches."""
    red = Redactor([KNOWN_KEY], known=False)
    shaped = "sk-proj-Abc123def456ghi789"
    for secret in (KNOWN_KEY, shaped):
        text = "x" * (39 - cut) + " " + secret + " and more " * 20
        for excerpt in (red.head(text, 40), red.head(text.encode(), 40)):
            assert len(excerpt) == 40 and secret[:4] not in excerpt, excerpt
        ending = " and more " * 20 + secret + " " + "y" * (39 - cut)
        tail = red.tail(ending, 40)
        assert len(tail) == 40 and secret[-4:] not in tail, tail
    assert red.head("short", 40) == "short" and red.tail("short", 0) == ""


# The old rule for a password with / ? # @ in it, kept as the reference: a regex tried at
# every `scheme://x:` of a word, quadratic in the word's length (0.3 s for a 16 KiB line).
_LAST_AT = re.compile(r"(?i)(?P<pre>\b[a-z][a-z0-9+.-]*://[^\s/?#@:'\"]*:)"
                      r"(?P<secret>(?!\d+(?:[/?#]|$))[^\s'\"]+)(?=@)")
_PIECES = st.sampled_from(["x://", "ht.tp://", "u", ":", "@", "/", "?", "#", "'", '"', " ",
                           "\n", "12", "p", "-", "a.b"])


@settings(max_examples=600, deadline=None)
@given(st.lists(_PIECES, max_size=24).map("".join))
def test_the_password_scan_hides_what_the_quadratic_regex_hid(text: str) -> None:
    """_to_last_at (a scan, once per word) hides exactly what the regex did."""
    want = _LAST_AT.sub(lambda m: m["pre"] + REDACTED, text)
    assert _to_last_at(text) == want


@pytest.mark.parametrize(("argv", "want"), [
    (["--api-ke", "Zq9XkLmP", "--port", "8000"], ["--api-ke", REDACTED, "--port", "8000"]),
    (["--api-k=Zq9XkLmP"], [f"--api-k={REDACTED}"]),
    (["--hf-tok", "Zq9XkLmP"], ["--hf-tok", REDACTED]),
    (["--hf", "Zq9XkLmP"], ["--hf", REDACTED]),  # not unique in vLLM: refused, hidden anyway
    (["--", "--api-ke"], ["--", "--api-ke"]),  # `--` alone ends the flags: nothing follows
    (["--host", "h", "--api-server-count", "2"], ["--host", "h", "--api-server-count", "2"]),
    # vLLM reads `--NAME.k V` as --NAME '{"k": V}': the key is V's JSON object, on its argv
    (["--api-key.k", "Zq9XkLmP", "--port", "8000"], ["--api-key.k", REDACTED, "--port", "8000"]),
    (["--api_k.k=Zq9XkLmP"], [f"--api_k.k={REDACTED}"]),
    (["--hf-tok.k", "Zq9XkLmP"], ["--hf-tok.k", REDACTED]),
    (["--api_ke", "Zq9XkLmP"], ["--api_ke", REDACTED]),  # `_` is `-` to vLLM's parser
    (["--hf-overrides.rope_theta", "1e6"], ["--hf-overrides.rope_theta", "1e6"]),
])
def test_an_abbreviated_secret_flag_hides_its_value(argv: list[str], want: list[str]) -> None:
    """vLLM's parser takes a flag's prefix (`--api-ke X` is `--api-key X`)."""
    assert redact_argv(argv) == want


@pytest.mark.parametrize("name", ["S3_CREDS", "aws_cred", "DB_CREDENTIALS"])
def test_credentials_by_any_spelling_are_secret(name: str) -> None:
    """`S3_CREDS` in [vllm.env] was printed in clear by print-command."""
    assert is_secret_name(name)
    assert R.text(f"{name}=Zq9XkLmP42") == f"{name}={REDACTED}"


@pytest.mark.parametrize(("text", "want"), [
    # a tuple or a dict as the value: the rest was left beside <redacted>
    ("x auth=('user','S3cretpw') y", "x auth=('<redacted>','<redacted>') y"),
    ("api_key={'primary':'S3cretpw'} z", "api_key={'<redacted>':'<redacted>'} z"),
    ("auth=(S3cretpw) z", "auth=(<redacted>) z"),
    # the header percent-encoded: only the scheme was hidden
    ("GET /?h=Authorization%3A%20Bearer%20S3cretpw HTTP",
     "GET /?h=Authorization%3A%20Bearer%20<redacted> HTTP"),
    # JSON escaped twice (a record of a log line quoting a request body)
    ('{\\\\\\"token\\\\\\": \\\\\\"S3cretpw\\\\\\"}',
     '{\\\\\\"token\\\\\\": \\\\\\"<redacted>\\\\\\"}'),
    # a quote never closed (a prompt cut by --max-log-len): to the line's end, not past it
    ("token='S3cretpw and more", "token='<redacted>'"),
    ("api_key='" + "\\" * 32, "api_key='<redacted>'"),
    ("token='S3cretpw\nINFO next line", "token='<redacted>'\nINFO next line"),
])
def test_more_forms(text: str, want: str) -> None:
    assert R.text(text) == want


@pytest.mark.parametrize("text", [
    # an unclosed quote, escaped quotes after it: the old rule backtracked exponentially (60 s
    # at 218 characters; bench/redact.py times these shapes, not this test)
    "prompt: 'cfg, token='{" + ", ".join(f'\\"k{i}\\": \\"v\\"' for i in range(40)),
    "api_key='" + "\\" * 4000,
])
def test_a_line_made_to_backtrack_is_redacted_whole(text: str) -> None:
    out = R.text(text)
    assert out.endswith("'<redacted>'") and "k39" not in out and "\\\\" not in out


@pytest.mark.parametrize("value", [
    {"token": 918273645501}, {"api_key": 8.5e10}, {"password": b"Zq9XkLmP"},
    [("password", "Zq9XkLmP")], (b"authorization", b"Bearer Zq9XkLmP"),
    {"headers": [("Cookie", "a=1; sid=Zq9XkLmP")]}, ["vllm", "--api-key", "Zq9XkLmP", 8000],
    ["--api-key", 918273645501, "--port", "8000"], {"secrets": {"primary": "Zq9XkLmP"}},
    {"password": [{"v": "Zq9XkLmP"}]}, {"raw": b"GET /?token=Zq9XkLmP HTTP/1.1"},
])
def test_a_structure_hides_what_its_text_hides(value: object) -> None:
    """Redactor.deep (the log's fields, records, /status) hides what text() hides in the
    value's repr: a number under a secret key, a (name, value) pair, an argv holding a number,
    a mapping under a secret key, bytes passed in clear through deep."""
    secret = next(s for s in ("918273645501", "8.5e10", "85000000000.0", "Zq9XkLmP")
                  if s in repr(value))
    out = json.dumps(R.deep(value), default=str)
    assert secret not in out and REDACTED in out, out


def test_a_structure_keeps_what_says_nothing_secret() -> None:
    kept = {"restart_required": ("vllm.env.HF_TOKEN", "gate.listen"), "max_tokens": 16,
            "api_key_set": True, "hf_token": None, "argv": ["vllm", "--port", 8000]}
    assert R.deep(kept) == {**kept, "restart_required": ["vllm.env.HF_TOKEN", "gate.listen"]}
    # a record's metrics: figures about tokens, named by what they measure, stay
    scrape = ('vllm:time_to_first_token_seconds_sum{model_name="m"} 1.5\n'
              'vllm:inter_token_latency_seconds_count{model_name="m"} 7\n')
    section = metrics.section([(0.0, scrape), (60.0, scrape.replace("1.5", "2.5"))], 61.0)
    assert R.deep(section) == section


@pytest.mark.parametrize(("argv", "want"), [
    # vLLM's --api-key takes several keys (nargs "+"): a hand-started vLLM that `check`'s
    # fights item and a port's holder name showed `--api-key <redacted> K2`
    (["vllm", "serve", "/m", "--api-key", "Zq9K1", "Zq9K2", "--port", "8000"],
     ["vllm", "serve", "/m", "--api-key", REDACTED, REDACTED, "--port", "8000"]),
    (["--api_key", "Zq9K1", "Zq9K2"], ["--api_key", REDACTED, REDACTED]),
    (["--api-key=Zq9K1", "/m"], [f"--api-key={REDACTED}", "/m"]),  # `=`: one word only
    (["--hf-token", "Zq9K1", "/m"], ["--hf-token", REDACTED, "/m"]),  # one value
])
def test_every_key_of_api_key_is_hidden(argv: list[str], want: list[str]) -> None:
    assert R.argv(argv) == want
    line = R.text(" ".join(argv))  # the same line as text (a holder's command line)
    assert "Zq9K" not in line and line.split(REDACTED)[-1] == " ".join(want).split(REDACTED)[-1]


@pytest.mark.parametrize("name", ["a", "api", "api-k", "hf-tok", "a.b", "api-key.k",
                                  "hf-token.k", "api-k.k"])
def test_a_config_problem_about_a_secret_flag_reads_whole(name: str) -> None:
    """vllmwatch's own advice about a secret flag passes the redactor on its way to the
    terminal and the journal: it must come out as written (`--api-key abbreviated (vLLM's`
    was `--api-key <redacted>'s parser`, the advice unreadable)."""
    problem = flags.flag_problem(name, 1, f"vllm.args.{name}")
    assert problem is not None
    shown = problem.render("/etc/vllmwatch/vllmwatch.toml")
    assert R.text(shown) == shown


_KEYS = st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(["api-key", "api_key", "hf-token", "hf_token"]), _KEYS,
       st.sampled_from(["=", " "]), st.sampled_from(["{} {}", "{!r}, {!r}", "{}={}"]))
def test_a_secret_flag_with_a_dotted_key_hides_its_value(flag: str, key: str, sep: str,
                                                          form: str) -> None:
    """vLLM's parser reads `--api-key.k X` as --api-key '{"k": X}': X is in the key, judged
    by the flag before the dot (the last key, `k`, names nothing secret)."""
    value = "Zq9XkLmP42"
    word = f"--{flag}.{key}"
    joined = form.replace("{!r}, {!r}", repr(word)[:-1] + "', " + repr(value)) if "!r" in form \
        else form.format(word, value)
    text = f"vllm serve /m {joined} --port 8000"
    shown = R.text(text)
    assert value not in shown and "--port 8000" in shown, (text, shown)
    words = [f"{word}{sep}{value}"] if sep == "=" else [word, value]
    assert value not in " ".join(redact_argv(["vllm", "serve", *words, "--port", "8000"]))
