"""A secret name whose value is a YAML block on the lines after it (config/secretlists.py's
hide_block): `api_key:` then `  - K1`, `  - K2` (vLLM's --api-key takes several keys, and a
config file lists them so) read as one value, the first `-`, and showed every key; `api_key: |`
then `  K1` showed the scalar's lines the same way. Every item and every line of the block is
hidden, in the text as written and JSON-encoded (a config quoted in a log event), and the
next key stays."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.secrets import NAMES, values
from vllmwatch.config.redact import REDACT, REDACTED, Redactor

R = Redactor(known=False)
_KEYED = (*(n for n in NAMES if n.isidentifier()), "'api_key'", '"hf_token"')


def _shown(text: str, secrets: list[str], encoded: bool = True) -> list[str]:
    forms = (text, json.dumps(text)) if encoded else (text,)
    outs = [red.text(t) for red in (R, REDACT) for t in forms]
    return [s for s in secrets for out in outs if s in out]


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(_KEYED), keys=st.lists(values, min_size=1, max_size=4),
       indent=st.sampled_from(("", "  ", "    ", "\t")), outer=st.sampled_from(("", "  ")),
       quote=st.sampled_from(("", "'", '"')), nl=st.sampled_from(("\n", "\r\n")),
       blank=st.booleans(), scalar=st.sampled_from(("", "|", "|-", ">", ">+ # keys")))
def test_every_line_of_a_block_value_after_a_secret_name_is_hidden(
        name: str, keys: list[str], indent: str, outer: str, quote: str, nl: str,
        blank: bool, scalar: str) -> None:
    body = outer + indent + ("  " if scalar else "")
    lines = [f"{body}{'' if scalar else '- '}{quote}{k}{quote}" for k in keys]
    text = (f"{outer}{name}:{' ' + scalar if scalar else ''}{nl}"
            + (nl + nl if blank else nl).join(lines) + f"{nl}{outer}port: 8000{nl}")
    assert not _shown(text, keys, name.isidentifier()), (text, R.text(text))
    assert f"{outer}port: 8000" in R.text(text)


def test_a_block_list_keeps_its_shape_and_other_lists_stay() -> None:
    text = "api_key:\n  - K1xyz9\n  - K2xyz9\nserved_model_name:\n  - llama\n"
    assert R.text(text) == (f"api_key:\n  - {REDACTED}\n  - {REDACTED}\n"
                            "served_model_name:\n  - llama\n")
    assert R.text("api_keys:\n- name: a\n  key: K1xyz9\n- K2xyz9\nport: 1") == (
        f"api_keys:\n- {REDACTED}\n  {REDACTED}\n- {REDACTED}\nport: 1")
    assert R.text("env:\n  HF_TOKEN: |-\n    K1xyz9\n  OTHER: 1") == (
        f"env:\n  HF_TOKEN: |-\n    {REDACTED}\n  OTHER: 1")
    for form in ("api_key: [K1xyz9, K2xyz9]", '"api_keys": ["K1xyz9", "K2xyz9"]',
                 "api_key: - K1xyz9", "password: -\n  K1xyz9"):  # (flow lists: already)
        assert "K1xyz9" not in R.text(form) and "K2xyz9" not in R.text(form), form
    assert R.text("password: -5x") == f"password: {REDACTED}"  # a value, not an item
