"""A secret written as its name, a space and its value (config/secretnames.py, the `NAME
value` rule): `hf_token abcd12345`, `HF_TOKEN abcd`, `apiKey x` in a line a wrapper, a
script or a library prints into vLLM's output (print(name, value), an env listing, a
Dockerfile's `ENV NAME value`) reached the incident record, `incidents show` and the journal
in clear: only `--flag value`, `NAME=value` and `name: value` had a rule. The name must read
as an identifier (`_` or camelCase) that ends with the credential's word, so prose stays."""

from __future__ import annotations

import re
import string

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from vllmwatch.config import secretnames
from vllmwatch.config.redact import REDACTED, Redactor
from vllmwatch.config.secretnames import is_secret_name

R = Redactor(known=False)  # the rules alone: no learnt value helps
NAMES = ("hf_token", "HF_TOKEN", "api_key", "API_KEY", "VLLM_API_KEY", "apiKey", "hfToken",
         "db_password", "DB_PASSWORD", "client_secret", "AWS_SECRET_ACCESS_KEY", "access_token",
         "privateKey", "s3_secret_key", "HUGGING_FACE_HUB_TOKEN", "api_keys")
# Any shape a bare value may take: letters, digits, a leading dash, `=`, `:`, `@`, `/`, `%`.
_ALPHABET = string.ascii_letters + string.digits + "-_./+=~!$%*:@?#^|"
# Words that say there is no value, or prose/code after a name (not secrets, by design).
_NOT_VALUES = {"true", "false", "none", "null", "nil", "yes", "no", "on", "off", "unset", "not",
               "is", "was", "are", "were", "empty", "missing", "given", "gives", "has", "have",
               "had", "required", "set", "provided", "needed", "must", "should", "and", "or",
               "of", "for", "from", "with", "the", "a", "an", "to", "in", "at", "by"}
# ... and every word the redactor reads as a sentence after a name (secretnames._ENGLISH: it
# grew "expected" and "invalid", and `hf_token INVALID` was generated and rightly kept)
_NOT_VALUES |= secretnames._ENGLISH | secretnames._UNSET
values = st.text(_ALPHABET, min_size=1, max_size=30).filter(
    lambda v: v.lower() not in _NOT_VALUES and not all(c in "-=+*/%<>!|&:^~" for c in v)
    and not v.lower().startswith(("bearer", "basic", "token", "digest", "apikey"))
    and not secretnames.path_value(v))  # a file's path (`/etc/gcp/sa.json`) is no secret
PREFIXES = ("", "DEBUG ", "(APIServer pid=7) INFO 12-06 05:00:00 [x.py:1] loaded ", "\t",
            "export ", "ENV ", "+ ")
SUFFIXES = ("", "\n", " --port 8000", ", retry 2", "; next", " HF_TOKEN_FILE=/x", ")")


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(NAMES), value=values, gap=st.sampled_from((" ", "  ", "\t")),
       pre=st.sampled_from(PREFIXES), post=st.sampled_from(SUFFIXES))
def test_a_value_after_an_identifier_name_and_a_space_is_hidden_whole(
        name: str, value: str, gap: str, pre: str, post: str) -> None:
    line = f"{pre}{name}{gap}{value}{post}"
    assert R.text(line) == f"{pre}{name}{gap}{REDACTED}{post}", line


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(NAMES), value=values, quote=st.sampled_from("'\""),
       inner=st.text(_ALPHABET + " ,;&)]}>", max_size=20))
def test_a_quoted_value_after_a_name_and_a_space_is_hidden_whole(
        name: str, value: str, quote: str, inner: str) -> None:
    # The quoted value is value + inner: together they may be a file's path (`'/a' + '/0'`),
    # which stays by design (test_redact_paths), as `value` alone is filtered above.
    assume(not secretnames.path_value(value + inner))
    line = f"{name} {quote}{value}{inner}{quote} ok"
    assert R.text(line) == f"{name} {quote}{REDACTED}{quote} ok", line


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(NAMES), words=st.lists(  # prose: no scheme word (`bearer a` is
    st.text(string.ascii_lowercase, min_size=1, max_size=9).filter(  # a credential, hidden)
        lambda w: re.fullmatch(secretnames.AUTH, w + " ") is None), min_size=2, max_size=6))
def test_a_sentence_after_a_name_stays(name: str, words: list[str]) -> None:
    """A lower-case word another one follows is prose (`VLLM_API_KEY stays the key`)."""
    line = f"the {name} {' '.join(words)}."
    assert R.text(line) == line


def test_vllm_and_vllmwatch_prose_about_secret_names_stays() -> None:
    for line in (
            "; the environment's VLLM_API_KEY stays the key, as in vLLM",
            "where the API key goes (default: api-key next to the config)",
            "a one-token request; proves the engine answers",
            "Histogram of time_per_output_token_seconds per request.",
            "token_indices width must be at least topk_tokens",
            "INT4_PER_TOKEN_HEAD only supports causal attention",
            "Minimum KV splits for TokenSpeed MLA decode.",
            "Packed bytes for a single KEY vector.",
            "timestamp_tokens + vision_start_token + x",
            "hf_token None", "api_key True", "if api_key is None:", "return api_key or x",
            "the key vLLM is started with", "token budget 8192", "password reset link"):
        assert R.text(line) == line


def test_the_forms_of_the_review() -> None:
    for line, want in (("hf_token abcd12345", f"hf_token {REDACTED}"),
                       ("HF_TOKEN abcd", f"HF_TOKEN {REDACTED}"),
                       ("api_key abcd hf_token xyz", f"api_key {REDACTED} hf_token {REDACTED}"),
                       ("apiKey --abc, retry", f"apiKey {REDACTED}, retry"),
                       ("ENV HF_TOKEN hf-abc", f"ENV HF_TOKEN {REDACTED}")):
        assert R.text(line) == want
    assert all(is_secret_name(n) for n in NAMES)


# A name written as a word, not an identifier: `password hunter22` as a script, a shell
# or a library says it. Only a value shaped as a credential is taken (secretnames._credential).
WORD_NAMES = ("password", "PASSWORD", "token", "Token", "secret", "key", "passphrase",
              "api-key", "X-Api-Key", "client-secret", "hf-token", "credentials", "PGPASSWORD")
_WORD_VALUE = string.ascii_letters + string.digits + "-_+/!@#$%^"


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from(WORD_NAMES), pre=st.sampled_from(PREFIXES),
       post=st.sampled_from(SUFFIXES), quote=st.sampled_from(("", "'", '"')),
       value=st.text(_WORD_VALUE, min_size=6, max_size=30).filter(
           lambda v: v[0] != "/" and any(c.isalpha() for c in v)
           and any(c.isdigit() or c in "!@#$%^" for c in v)))
def test_a_credential_after_a_word_name_and_a_space_is_hidden(
        name: str, pre: str, post: str, quote: str, value: str) -> None:
    line = f"{pre}{name} {quote}{value}{quote}{post}"
    assert R.text(line) == f"{pre}{name} {quote}{REDACTED}{quote}{post}", line


# An authorization scheme's word begins a credential (`BEARER B` is one: hidden), no prose
AUTH_WORDS = frozenset(re.findall(r"[a-z0-9-]+", secretnames.AUTH.split(")")[0]))


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(WORD_NAMES), words=st.lists(  # prose: no word a secret's name
    st.text(string.ascii_letters, min_size=1, max_size=12).filter(  # (`aPW AA` is one: hidden)
        lambda w: not secretnames.is_secret_name(w) and w.lower() not in AUTH_WORDS),
    min_size=1, max_size=4),
       end=st.sampled_from(("", ".", " 8192", " 128011 has id 5", " model.layers.0.w")))
def test_words_and_numbers_after_a_word_name_stay(name: str, words: list[str],
                                                   end: str) -> None:
    """Prose after a word name: letters alone, a number, a dotted name (`token budget`)."""
    line = f"the {name} {' '.join(words)}{end}"
    assert R.text(line) == line


def test_the_word_forms_of_the_review() -> None:
    for line, want in (("password hunter22", f"password {REDACTED}"),
                       ("PASSWORD hunter22", f"PASSWORD {REDACTED}"),
                       ("api-key X9sdkfj", f"api-key {REDACTED}"),
                       ("token abcdef123456", f"token {REDACTED}"),
                       ("x-api-key abc123456 rejected", f"x-api-key {REDACTED} rejected"),
                       ("wrong api key abc12345, retry", f"wrong api key {REDACTED}, retry"),
                       # a sentence's full stop is not part of a name (`v0.32`)
                       ("machine h login u password p4ssw0rd.", f"machine h login u password "
                                                                f"{REDACTED}")):
        assert R.text(line) == want


def test_prose_and_names_after_a_word_name_stay() -> None:
    """A word, a number, a dotted name, a path, code: what vLLM says after `key`/`token`."""
    for line in ("the token budget 8192", "Image sentinel token 128011 has id 5",
                 "password reset link", "Failed to convert token Ġx86 to id",
                 "missing weight key model.layers.0.mlp.w13_weight",
                 "QuantizedActivation key QuantKey(fp8e4m3,scale(fp32,static,per_tensor))",
                 "pass backend=FLASH_ATTN to upgrade", "per-token SplitMix64 noise",
                 "The attention key ``k_fp8`` and", "token /models/qwen3-8b", "token v0.32.0",
                 "pass nccl_unique_id_b64 OR master_address", "key https://h/x1"):
        assert R.text(line) == line
