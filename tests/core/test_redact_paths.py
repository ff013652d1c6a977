"""A secret-named variable whose value is a file's path (GOOGLE_APPLICATION_CREDENTIALS, the
one google-auth and runai's GCS loader read): the path was learnt as a secret and hidden in
every line, so vLLM's `DefaultCredentialsError: File <redacted> was not found.` did not say
which file, nor did print-command or the named rules. A path is no credential; a value that
is the credential is hidden whatever its shape (the API key is learnt as itself)."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllmwatch.config import command, launch
from vllmwatch.config.launch import env_file_secrets
from vllmwatch.config.redact import REDACTED, Redactor
from vllmwatch.config.schema import load

GCP = "/etc/gcp/sa.json"
ERROR = f"google.auth.exceptions.DefaultCredentialsError: File {GCP} was not found."


def _config(tmp_path: Path, env_file: str) -> str:
    secret = tmp_path / "secrets.env"
    secret.write_text(env_file)
    secret.chmod(0o600)
    path = tmp_path / "v.toml"
    path.write_text(f'[vllm]\nmodel = "/m"\ncommand = ["vllm", "serve"]\nenv_file = "{secret}"\n'
                    f'[vllm.env]\nGOOGLE_APPLICATION_CREDENTIALS = "{GCP}"\n')
    return str(path)


def test_a_credentials_files_path_is_shown_and_the_secrets_beside_it_are_not(
        tmp_path: Path) -> None:
    cmd = command.build(load(_config(tmp_path, "HF_TOKEN=hf_Zq9XkLmP\n"
                                     "SSH_AUTH_SOCK=/run/user/0/ssh-agent\n")), {},
                        api_key="/etc/vllm/key")  # a key that looks like a path is a key
    learnt = [*launch.secrets_of(cmd.env, "/etc/vllm/key"), *cmd.hidden]
    assert sorted(set(learnt)) == ["/etc/vllm/key", "hf_Zq9XkLmP"]
    red = Redactor(learnt, known=False)
    assert red.text(ERROR) == ERROR
    assert red.text("--api-key /etc/vllm/key") == f"--api-key {REDACTED}"
    assert f"GOOGLE_APPLICATION_CREDENTIALS={GCP}" in cmd.display()
    assert cmd.shown_env["HF_TOKEN"] == REDACTED


@pytest.mark.parametrize(("text", "want"), [
    (f"GOOGLE_APPLICATION_CREDENTIALS={GCP}", f"GOOGLE_APPLICATION_CREDENTIALS={GCP}"),
    (f"{{'credentials': '{GCP}'}}", f"{{'credentials': '{GCP}'}}"),
    ("token: ~/.cache/huggingface/token", "token: ~/.cache/huggingface/token"),
    # a secret that starts with `/` is no directory's path: hidden as before
    ("password=/Xk/29dL", f"password={REDACTED}"),
    ("DB_PASSWORD=/xk29dL", f"DB_PASSWORD={REDACTED}"),
])
def test_the_named_rules_leave_a_path(text: str, want: str) -> None:
    assert Redactor(known=False).text(text) == want


def test_structures_and_env_files_leave_a_path() -> None:
    red = Redactor(known=False)
    env = {"GOOGLE_APPLICATION_CREDENTIALS": GCP, "HF_TOKEN": "hf_Zq9XkLmP"}
    assert red.env(env) == {**env, "HF_TOKEN": REDACTED}
    assert red.deep({"env": env}) == {"env": {**env, "HF_TOKEN": REDACTED}}
    assert env_file_secrets(env) == ["hf_Zq9XkLmP"]
