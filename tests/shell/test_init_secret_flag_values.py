"""init never writes a secret flag's value into the TOML or its output.

The review of 2026-12-07: `--ssl-keyfile-password X` (a flag of older vLLMs, and of any vLLM
whose flag list init cannot learn) was written as `ssl-keyfile-password = "X"` under
[vllm.args], in clear, and printed. A flag whose value the one redactor hides in every log is
now moved to vllm.env_file (VLLMWATCH_ARG_<FLAG>), as a password in a URL already was; a
number is none (vLLM 0.32's --long-prefill-token-threshold 512 stays in the TOML).
"""

from __future__ import annotations

import pytest

from tests.shell.test_init_refused_flags import migrate
from vllmwatch.config import flags

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

SECRET = "Zq7Kx9Lm2Pw4Rt6Y"


@pytest.mark.parametrize("flag", ["ssl-keyfile-password", "db-password", "client-secret",
                                  "oauth-credentials", "auth-token", "private-key-password"])
@pytest.mark.parametrize("form", ["--{flag} {value}", "--{flag}={value}"])
def test_a_secret_flags_value_goes_to_the_env_file(flag: str, form: str) -> None:
    words = form.format(flag=flag, value=SECRET)
    rc, toml, err = migrate(f"vllm serve /m {words} --max-num-seqs 4", False)
    assert SECRET not in toml + err, toml + err
    assert rc == 0, err
    data = tomllib.loads(toml)
    assert flag not in data["vllm"].get("args", {}) and data["vllm"]["args"]["max-num-seqs"] == 4
    env_name = flags.ARG_PREFIX + flag.upper().replace("-", "_")
    assert data["vllm"]["env_file"] and env_name in err + toml, err


@pytest.mark.parametrize("listed", [False, True])
@pytest.mark.parametrize("flag", ["long-prefill-token-threshold", "max-num-batched-tokens",
                                  "dbo-decode-token-threshold"])
def test_a_number_stays_in_the_toml_whatever_the_flags_name(flag: str, listed: bool) -> None:
    rc, toml, err = migrate(f"vllm serve /m --{flag} 512", listed)
    assert rc == 0, err
    assert tomllib.loads(toml)["vllm"]["args"][flag] == 512, toml


@pytest.mark.parametrize("words", [f"--db-password {SECRET}",
                                   f"--bogus-endpoint https://user:{SECRET}@collector:4317"])
def test_a_flag_this_vllm_lacks_is_dropped_not_sent_from_the_env_file(words: str) -> None:
    """With vLLM's flag list: sent from vllm.env_file, vLLM refused it at every start."""
    rc, toml, err = migrate(f"vllm serve /m {words} --max-num-seqs 4", True)
    assert rc == 0 and SECRET not in toml + err, toml + err
    assert flags.ARG_PREFIX not in toml + err and "(dropped)" in toml, toml
