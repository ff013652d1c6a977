"""Issue 36.1-7 and 37.1: `vllmwatch init` keeps what the hand-run vLLM did (its address, the
GPUs it asked for, a command systemd can run), reads vLLM's own YAML config, moves secrets out
of the TOML into files the TOML names (and the config still works), says what replaces the
memory cron job and what comes next, and turns every write error into one line."""

from __future__ import annotations

import io
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.shell.test_init import known
from vllmwatch.config import command, flags, serveline
from vllmwatch.config.hosts import parse_listen
from vllmwatch.config.redact import REDACT
from vllmwatch.config.schema import from_dict, load
from vllmwatch.migrate import render, runner, translate
from vllmwatch.migrate.draft import Facts

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def toml_of(text: str, facts: Facts | None = None) -> tuple[dict[str, Any], translate.Draft]:
    """(the whole config as loaded, the draft) for one line; the config must load."""
    draft = translate.translate(serveline.parse(serveline.split_text(text)),
                                facts or Facts(known=known()))
    data = tomllib.loads(render.render(draft, "test"))
    from_dict(data)
    return data, draft


def run_init(words: list[str], output: Path, **kw: Any) -> tuple[int, str, str]:
    """runner.main as the CLI calls it: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    req = runner.Request(words, None, str(output), fast=True, **kw)
    rc = runner.main(req, os.environ, out=out, err=err)
    return rc, out.getvalue(), err.getvalue()


# ---- 36.1: the address clients used ----

@pytest.mark.parametrize(("line", "gate", "vllm_at", "listen"), [
    ("vllm serve m", False, ("0.0.0.0", 8000), None),  # vLLM's default: every interface
    ("vllm serve m --port 9000", False, ("0.0.0.0", 9000), None),
    ("vllm serve m --host 127.0.0.1 --port 9000", False, ("127.0.0.1", 9000), None),
    ("vllm serve m --host 10.1.2.3", False, ("10.1.2.3", 8000), None),
    ("vllm serve m", True, ("127.0.0.1", 8001), "0.0.0.0:8000"),
    ("vllm serve m --host 10.1.2.3 --port 9000", True, ("127.0.0.1", 9001), "10.1.2.3:9000"),
    ("vllm serve m --host :: --port 9000", True, ("127.0.0.1", 9001), "[::]:9000"),
])
def test_clients_keep_the_address_the_hand_run_vllm_had(
        line: str, gate: bool, vllm_at: tuple[str, int], listen: str | None) -> None:
    data, draft = toml_of(line, Facts(known=known(), gate=gate))
    config = from_dict(data)
    assert (config.vllm.host, config.vllm.port) == vllm_at
    if listen is None:
        assert not config.gate.enabled
    else:  # the gate takes the public address; vLLM is on loopback, never beside it
        assert config.gate.enabled and config.gate.listen == listen
        assert config.drain.deregister_delay == 0
    assert any("clients keep" in s for s in draft.said), draft.said


@given(port=st.sampled_from([8000, 9100, 9101, 9102, 65534, 65535]) | st.integers(1, 65535),
       gate=st.booleans(), host=st.sampled_from(["", "127.0.0.1", "0.0.0.0", "::"]))
@settings(max_examples=80, deadline=None)
def test_inits_own_ports_never_collide_with_the_lines(port: int, gate: bool,
                                                      host: str) -> None:
    """`--port 9101` (status.listen's default port), or `--port 9100 --gate` (the private
    port 9101): init wrote a config that does not load, "status.listen ... is also
    vllm.port". Whatever the line's address, the config init writes loads, and clients keep
    the line's port."""
    line = f"vllm serve m --port {port}" + (f" --host {host}" if host else "")
    data, _ = toml_of(line, Facts(known=known(), gate=gate))
    config = from_dict(data)  # raises on a clash
    listen = parse_listen(config.gate.listen) if gate else None
    assert (listen[1] if listen else config.vllm.port) == port


# ---- 36.2: the GPUs the line asked for, not the ones this machine has ----

@pytest.mark.parametrize(("line", "gpus"), [
    ("vllm serve m --gpu-memory-utilization 0.92", None),  # every GPU, as vLLM would
    ("CUDA_VISIBLE_DEVICES=1 vllm serve m", [1]),
    ("vllm serve m --device cpu", []),
])
def test_gpus_follow_the_line_not_the_machine_init_runs_on(line: str,
                                                            gpus: list[int] | None) -> None:
    data, draft = toml_of(line, Facts(known=known(), has_gpu=False))
    assert data["vllm"].get("gpus") == gpus
    if gpus is None:
        assert any("--device cpu" in s for s in draft.said), draft.said


# ---- 36.3: a command systemd can run ----

def test_a_bare_vllm_not_on_path_is_an_error_that_says_what_to_do() -> None:
    _, draft = toml_of("vllm serve m", Facts(known=known(), searched=True))
    assert any("not on this PATH" in e and "full path" in e for e in draft.errors)
    data, draft = toml_of("vllm serve m", Facts(known=known(), searched=True,
                                                resolve=lambda w: "/opt/v/bin/vllm"))
    assert data["vllm"]["command"] == ["/opt/v/bin/vllm", "serve"] and not draft.errors


def test_the_kernels_view_of_a_console_script_becomes_the_script(tmp_path: Path) -> None:
    from vllmwatch.migrate.proc import script_form

    script = tmp_path / "vllm"
    script.write_text(f"#!{sys.executable}\nimport sys\n")
    script.chmod(0o755)
    assert script_form([sys.executable, str(script), "serve"], "/", "") == \
        [str(script), "serve"]
    # Another interpreter than the shebang's stays as it was (the standby takes that form).
    assert script_form(["/usr/bin/python3.99", str(script), "serve"], "/", "") == \
        ["/usr/bin/python3.99", str(script), "serve"]
    assert script_form([sys.executable, "-m", "vllm"], "/", "") == [sys.executable, "-m", "vllm"]


# ---- 36.5: vLLM's own YAML config ----

def test_vllms_yaml_config_is_folded_in_and_the_line_wins(tmp_path: Path) -> None:
    yaml = tmp_path / "serve.yaml"
    yaml.write_text("model: /srv/m\nmax-model-len: 4096\nmax_num_seqs: 8\n"
                    "enable-prefix-caching: true\n")
    rc, out, err = run_init(["--", "vllm", "serve", "--config", str(yaml), "--max-num-seqs",
                             "16"], tmp_path / "vw.toml", stdout=True)
    assert rc == 0, err
    vllm = tomllib.loads(out)["vllm"]
    assert vllm["model"] == "/srv/m"
    assert vllm["args"] == {"max-model-len": 4096, "max-num-seqs": 16,
                            "enable-prefix-caching": True}


@pytest.mark.parametrize("where", ["before", "after"])
def test_the_lines_flags_win_over_the_yaml_wherever_config_stands(tmp_path: Path,
                                                                 where: str) -> None:
    """vLLM puts the YAML's keys right after the model, before every flag of the line: init
    put them where --config stood, so a flag before it lost (8192 written, 4096 served). An
    empty list passes nothing; null passes `None`, as vLLM's load_config_file does."""
    yaml = tmp_path / "serve.yaml"
    yaml.write_text("max-model-len: 8192\nallowed-origins: []\nseed: null\n")
    line = ["--max-model-len", "4096"]
    conf = ["--config", str(yaml)]
    rc, out, err = run_init(["--", "vllm", "serve", "/srv/m",
                             *(line + conf if where == "before" else conf + line)],
                            tmp_path / "vw.toml", stdout=True)
    assert rc == 0, err
    args = tomllib.loads(out)["vllm"]["args"]
    assert args["max-model-len"] == 4096 and "allowed-origins" not in args, args
    assert args["seed"] == "None", args


def test_config_with_an_equals_sign_is_not_read_as_vllm_does_not(tmp_path: Path) -> None:
    yaml = tmp_path / "serve.yaml"
    yaml.write_text("max-model-len: 8192\n")
    rc, out, err = run_init(["--", "vllm", "serve", "/srv/m", f"--config={yaml}"],
                            tmp_path / "vw.toml", stdout=True)
    assert rc == 0, err
    vllm = tomllib.loads(out)["vllm"]
    assert "max-model-len" not in vllm.get("args", {}) and "config" not in vllm.get("args", {})


def _bomb(shape: str) -> str:
    """A YAML alias bomb: each level holds nine aliases of the level below."""
    lines = ["a0: &a0 [lol]"]
    for n in range(1, 10):
        refs = ", ".join(f"k{i}: *a{n - 1}" if shape.startswith("{{") else f"*a{n - 1}"
                         for i in range(9))
        lines.append(f"a{n}: &a{n} " + shape.format(refs))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(("make", "words"), [
    (lambda p: p.write_text("x: &a {y: *a}\n"), "an alias of itself"),
    (lambda p: p.write_text("l: &b [*b]\n"), "an alias of itself"),
    # aliases of aliases: 9 levels of 9 are 387 million words (a hang, then MemoryError)
    (lambda p: p.write_text(_bomb("[{}]")), "expand to more than"),
    (lambda p: p.write_text(_bomb("{{{}}}")), "expand to more than"),
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: os.mkfifo(p), "only a regular file is read"),
    (lambda p: p.write_text("x" * (2 << 20)), "at most"),
    (lambda p: p.write_text("model: [unclosed\n"), "not YAML"),
    (lambda p: p.write_text("- a list\n"), "expected a mapping"),
    (lambda p: None, "file not found"),
    # what YAML reads and neither JSON nor a flag can say (a review, 2026-12-05: tracebacks)
    (lambda p: p.write_text("hf-overrides: {a: 2020-01-01}\n"), "JSON cannot say"),
    (lambda p: p.write_text("hf-overrides: {a: !!binary aGVsbG8=}\n"), "JSON cannot say"),
    (lambda p: p.write_text("seed: 2020-01-01\n"), "YAML date"),
    (lambda p: p.write_text("seed: !!binary aGVsbG8=\n"), "YAML bytes"),
    (lambda p: p.write_text("seed: 2020-01-01 10:00:00\n"), "YAML datetime"),
    (lambda p: p.write_text("max-model-len: " + "[" * 5000 + "]" * 5000 + "\n"),
     "nested too deep"),
])
def test_a_yaml_config_init_cannot_read_is_refused_with_what_to_do(
        tmp_path: Path, make: Any, words: str) -> None:
    yaml = tmp_path / "serve.yaml"
    make(yaml)
    rc, out, err = run_init([f"vllm serve --config {yaml}"], tmp_path / "vw.toml")
    assert rc == 2 and out == "" and not (tmp_path / "vw.toml").exists()
    assert words in err and "--config" in err and "flags" in err, err
    assert "bug" not in err and "Traceback" not in err


def test_a_line_with_no_model_says_so_and_blames_no_one(tmp_path: Path) -> None:
    rc, _, err = run_init(["vllm serve --max-model-len 2048"], tmp_path / "vw.toml")
    assert rc == 2 and "vllm.model" in err and "bug" not in err, err


@pytest.mark.parametrize("line", [
    "vllm serve /srv/served --model /srv/other", "vllm serve --model /srv/other /srv/served",
    "vllm serve /srv/served --model=/srv/other --max-model-len 2048",
    "vllm serve /srv/served --model /srv/served",
])
def test_a_model_given_twice_is_refused_as_vllm_refuses_it(line: str, tmp_path: Path) -> None:
    """vLLM's parser moves --model's value to the front (vllm#25967): the positional MODEL
    is then an extra word, and `vllm serve /m --model /a` exits with `unrecognized
    arguments: /m` (vLLM 0.32, run here). init wrote a config serving /m, as if vLLM had."""
    rc, _, err = run_init([line], tmp_path / "vw.toml")
    assert rc == 2 and "names its model twice" in err and "unrecognized" in err, err
    assert not (tmp_path / "vw.toml").exists()
    alone, draft = toml_of("vllm serve --model /srv/other")
    assert alone["vllm"]["model"] == "/srv/other" and draft.errors == []


@pytest.mark.parametrize("line", [
    "vllm serve --max-model-len 2048 /srv/served",
    "vllm serve --enforce-eager /srv/served --port 9000",
    "vllm serve --host 127.0.0.1 /srv/served",
])
def test_the_model_after_the_flags_is_the_model_as_argparse_reads_it(line: str) -> None:
    """argparse gives the optional positional the first word no flag takes, wherever it
    stands: init called it a stray word and wrote no model."""
    data, draft = toml_of(line)
    assert data["vllm"]["model"] == "/srv/served" and draft.errors == []


_TAILS = [["-c", "{x}"], ["--stdout"], ["--force", "-c", "{x}"], ["--api-key-file", "{x}"],
          ["--gate"], ["-c={x}"]]


# (`-- vllm serve ... --config F` is vLLM's own --config, its YAML: only after a quoted line)
@pytest.mark.parametrize(("quoted", "tail"), [*[(False, t) for t in _TAILS],
                                              *[(True, t) for t in [*_TAILS, ["--config={x}"],
                                                                    ["--config", "{x}"]]]])
def test_inits_own_options_after_the_line_are_refused_not_passed_to_vllm(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        tail: list[str], quoted: bool) -> None:
    """argparse hands every word after the command words to the line: `-c PATH` there was
    a stray word of vLLM's line and the config went to the default path."""
    from vllmwatch import cli

    default, asked = tmp_path / "default.toml", tmp_path / "asked.toml"
    monkeypatch.setenv("VLLMWATCH_CONFIG", str(default))
    line = ["vllm serve /m --max-model-len 2048"] if quoted else [
        "--", "vllm", "serve", "/m", "--max-model-len", "2048"]
    words = [w.format(x=asked) for w in tail]
    assert cli.main(["init", "--fast", *line, *words]) == 2
    err = capsys.readouterr().err
    assert "init's options go first" in err and "nothing written" in err, err
    assert not default.exists() and not asked.exists()


@pytest.mark.parametrize(("config", "key_file", "line"), [
    ("k", "k", "vllm serve /m --api-key sk-abc123x"),  # the same path
    ("k", "./sub/../k", "vllm serve /m --api-key sk-abc123x"),  # the same file, spelt twice
    # the key file on init's own name for the secrets (the unit's config's, an instance's)
    ("vllmwatch.toml", "secrets.env", "HF_TOKEN=hf_abcdefgh1234 vllm serve /m --api-key sk-x1"),
    ("c.toml", "c.secrets.env", "HF_TOKEN=hf_abcdefgh1234 vllm serve /m --api-key sk-abc1x"),
])
def test_a_secret_file_on_the_configs_path_is_refused_before_anything_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str, key_file: str,
        line: str) -> None:
    """The config's rename came last, over the secret it names: the key was lost and the
    service started without it (or the key file held TOML)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    rc, _, err = run_init([line], tmp_path / config, api_key_file=key_file, force=True)
    assert rc == 2 and "would be both" in err and "nothing written" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"]


@pytest.mark.parametrize(("line", "key"), [
    ("vllm serve /m --api-key ''", None),  # vLLM served without a key
    ("VLLM_API_KEY= vllm serve /m", None),
    ("VLLM_API_KEY=sk-env12345 vllm serve /m --api-key ''", "sk-env12345"),  # `or` in vLLM
    ("VLLM_API_KEY=sk-env12345 vllm serve /m --api-key sk-flag12345", "sk-flag12345"),
])
def test_an_empty_api_key_is_no_key_as_in_vllm(tmp_path: Path, line: str,
                                               key: str | None) -> None:
    """vLLM reads `args.api_key or VLLM_API_KEY`: an empty key is none. init wrote an empty
    key file, which every start (and check) then refused."""
    rc, _, err = run_init([line], tmp_path / "c.toml")
    assert rc == 0, err
    config = load(str(tmp_path / "c.toml"))
    assert command.read_api_key(config) == key
    assert (tmp_path / "c.api-key").exists() is (key is not None)
    if key is None:
        assert "served without one" in err, err


@pytest.mark.parametrize(("line", "says"), [
    ("vllm serve /m --ssl-keyfile /k.pem --ssl-certfile /c.pem", "TLS"),
    ("vllm serve /m --uds /run/vllm.sock", "Unix socket"),
])
def test_a_line_that_serves_off_the_probes_address_is_migrated_without_it(
        line: str, says: str) -> None:
    """init wrote `--uds` or vLLM's TLS into the config: the service never became READY."""
    data, draft = toml_of(line)
    config = from_dict(data)
    assert not set(config.vllm.args) & set(flags.OFF_THE_PROBES)
    assert flags.args_problems(config.vllm.args, config.vllm.extra_args) == []
    assert any(says in e for e in draft.errors), draft.errors


# ---- 36.6: write errors are one line ----

def _write_cases(tmp: Path) -> list[tuple[Path, str]]:
    (tmp / "adir").mkdir()
    (tmp / "afile").write_text("")
    return [(tmp / "adir", "is a directory"),  # with --force
            (tmp / "afile" / "vw.toml", "not a folder"),  # a parent that is a file
            (Path("/proc/sys/vllmwatch-test.toml"), "cannot write")]  # unwritable, root too


def test_write_errors_are_one_line_naming_the_path(tmp_path: Path) -> None:
    for path, words in _write_cases(tmp_path):
        rc, _, err = run_init(["vllm serve /m --api-key sk-x1"], path, force=True)
        assert rc == 2, (path, err)
        assert f"cannot write {path}" in err and words in err and "nothing written" in err
        assert "Traceback" not in err
        assert not list(tmp_path.glob("**/.init-*"))  # no temporary file left


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a 0500 folder")
def test_a_read_only_folder_says_run_as_root(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    rc, _, err = run_init(["vllm serve /m"], folder / "vw.toml")
    assert rc == 2 and "sudo" in err and str(folder / "vw.toml") in err, err


# ---- 37.1: secrets move out of the TOML; the config still works ----

KEY, PW, PROXY_PW, TOKEN = "sk-init-key-77", "sk-otlp-secret-55", "proxypass-33", "hf_tok99"


def test_secrets_move_to_0600_files_and_the_config_still_launches(tmp_path: Path) -> None:
    output = tmp_path / "etc" / "vw.toml"
    line = (f"HF_TOKEN={TOKEN} DATABASE_URL=postgres://app:{PW}@db/x "
            f"HTTPS_PROXY=http://me:{PROXY_PW}@proxy:3128 VLLM_LOGGING_LEVEL=INFO "
            f"vllm serve /m --api-key {KEY} "
            f"--otlp-traces-endpoint https://user:{PW}@collector:4317")
    rc, out, err = run_init([line], output)
    assert rc == 0, err
    text = output.read_text()
    for secret in (KEY, PW, PROXY_PW, TOKEN):
        assert secret not in text and secret not in out + err, secret
    config = load(str(output))
    for path in (config.vllm.api_key_file, config.vllm.env_file):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    cmd = command.build(config, {}, api_key=command.read_api_key(config))
    assert cmd.env["VLLM_API_KEY"] == KEY and cmd.env["HF_TOKEN"] == TOKEN
    assert cmd.env["DATABASE_URL"] == f"postgres://app:{PW}@db/x"
    assert cmd.env["HTTPS_PROXY"] == f"http://me:{PROXY_PW}@proxy:3128"
    assert cmd.env["VLLM_LOGGING_LEVEL"] == "INFO"  # not a secret: stays in [vllm.env]
    i = cmd.argv.index("--otlp-traces-endpoint")
    assert cmd.argv[i + 1] == f"https://user:{PW}@collector:4317"
    shown = cmd.display()
    for secret in (KEY, PW, PROXY_PW, TOKEN):
        assert secret not in shown, shown


@pytest.mark.parametrize(("line", "flag", "values"), [
    # a flag vLLM appends, given twice, one with a secret: init kept the last only
    ("vllm serve /m --middleware pkg.a --middleware 'pkg.b?token=Zq9XkLmP42'", "--middleware",
     ["pkg.a", "pkg.b?token=Zq9XkLmP42"]),
    ("vllm serve /m --middleware 'pkg.a?api_key=Zq9XkLmP42' --middleware pkg.b --middleware "
     "pkg.c", "--middleware", ["pkg.a?api_key=Zq9XkLmP42", "pkg.b", "pkg.c"]),
    # a value the redactor hides, not a URL password: it sat in the TOML in clear
    ("vllm serve /m --otlp-traces-endpoint 'http://collector:4317/v1?token=Zq9XkLmP42'",
     "--otlp-traces-endpoint", ["http://collector:4317/v1?token=Zq9XkLmP42"]),
    ("OTEL_EXPORTER_OTLP_HEADERS='Authorization=Bearer Zq9XkLmP42' vllm serve /m",
     "OTEL_EXPORTER_OTLP_HEADERS", ["Authorization=Bearer Zq9XkLmP42"]),
])
def test_what_the_redactor_hides_never_sits_in_the_toml_and_each_value_still_reaches_vllm(
        tmp_path: Path, line: str, flag: str, values: list[str]) -> None:
    output = tmp_path / "vw.toml"
    rc, out, err = run_init([line], output)
    assert rc == 0, err
    strings: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, str):
            strings.append(node)
        for child in node.values() if isinstance(node, dict) else \
                node if isinstance(node, list) else []:
            walk(child)
    walk(tomllib.loads(output.read_text()))
    assert [v for v in strings if REDACT.text(v) != v] == []  # none a log would hide
    cmd = command.build(load(str(output)), {}, api_key=None)
    got = [cmd.argv[i + 1] for i, word in enumerate(cmd.argv) if word == flag] \
        if flag.startswith("--") else [cmd.env[flag]]
    assert got == values, cmd.argv
    assert "Zq9XkLmP42" not in out + err + cmd.display()


def test_existing_secret_files_are_not_replaced_without_force(tmp_path: Path) -> None:
    output = tmp_path / "vw.toml"
    (tmp_path / "vw.api-key").write_text("old\n")
    rc, _, err = run_init([f"vllm serve /m --api-key {KEY}"], output)
    assert rc == 2 and "vw.api-key exists" in err and not output.exists()
    assert (tmp_path / "vw.api-key").read_text() == "old\n"
    rc, _, err = run_init([f"vllm serve /m --api-key {KEY}"], output, force=True)
    assert rc == 0 and (tmp_path / "vw.api-key").read_text() == KEY + "\n", err


@pytest.mark.parametrize("force", [False, True])
def test_each_template_instance_gets_its_own_secret_files(tmp_path: Path, force: bool) -> None:
    """vllmwatch@a and vllmwatch@b read a.toml and b.toml of one folder. init put every
    config's key in that folder's `api-key` (and its other secrets in `secrets.env`): b's init
    found a's files, said "--force replaces it", and with --force b's key went over a's, whose
    clients got 401 from a's next launch on. Each config now has its own; the unit's
    vllmwatch.toml keeps `api-key` and `secrets.env`."""
    keys = {"a": "sk-instance-aaaa1", "b": "sk-instance-bbbb2", "vllmwatch": "sk-unit-cccc3"}
    for name, key in keys.items():
        rc, _, err = run_init([f"HF_TOKEN=hf_{name}tok12345678 vllm serve /m --api-key {key}"],
                              tmp_path / f"{name}.toml", force=force)
        assert rc == 0, err
    files = {"a": ("a.api-key", "a.secrets.env"), "b": ("b.api-key", "b.secrets.env"),
             "vllmwatch": ("api-key", "secrets.env")}
    for name, (key_file, env_file) in files.items():
        config = load(str(tmp_path / f"{name}.toml"))
        assert config.vllm.api_key_file == str(tmp_path / key_file)
        assert config.vllm.env_file == str(tmp_path / env_file)
        assert command.read_api_key(config) == keys[name]
        assert f"HF_TOKEN=hf_{name}tok12345678" in (tmp_path / env_file).read_text()


# ---- 36.7: what replaces the cron job, and what comes next ----

def test_init_says_what_replaces_the_memory_cron_job_and_the_next_steps(tmp_path: Path) -> None:
    output = tmp_path / "vw.toml"
    rc, out, err = run_init(["vllm serve /m"], output)
    assert rc == 0, err
    assert "75000 MiB" in err and "memory.gpu_limit" in err and "gpu_growth_rate" in err
    assert "DGX Spark the old figure was system memory" in err
    assert f"sudo -u vllmwatch vllmwatch check --config {output}" in out
    assert "systemctl enable --now vllmwatch" in out
    assert out.index("next steps") > out.index("$ vllmwatch check")  # after check's result


@pytest.mark.parametrize(("vllm_host", "warned"), [("0.0.0.0", True), ("10.1.2.3", True),
                                                   ("127.0.0.1", False), ("localhost", False)])
def test_check_warns_when_vllms_own_port_is_on_the_network_beside_the_gate(
        vllm_host: str, warned: bool) -> None:
    from vllmwatch.check.base import Context
    from vllmwatch.check.host import check_gate_beside

    config = from_dict({"vllm": {"model": "/m", "host": vllm_host, "port": 8001},
                        "gate": {"enabled": True, "listen": "0.0.0.0:8000"}})
    got = check_gate_beside(Context(config))
    assert bool(got) == warned and all("bypass the gate" in r.detail for r in got)
    assert check_gate_beside(Context(from_dict({"vllm": {"model": "/m",
                                                         "host": "0.0.0.0"}}))) == []


@pytest.mark.parametrize("words", [
    ["vllm", "serve", "/models/caf\udce9"],  # Python's form of a Latin-1 byte in argv
    ["vllm", "serve", "/m", "--served-model-name", "caf\udce9"],
    ["LANG_X=caf\udce9", "vllm", "serve", "/m"],
])
def test_a_word_that_is_not_utf8_is_refused_naming_it(tmp_path: Path,
                                                     words: list[str]) -> None:
    """Before: a traceback (UnicodeEncodeError) writing the config, and from /proc a stand-in
    character written silently in place of the byte, which `check` passed."""
    for stdout in (True, False):
        rc, out, err = run_init(["--", *words], tmp_path / "vw.toml", stdout=stdout)
        assert rc == 2 and out == "" and not (tmp_path / "vw.toml").exists(), (rc, err)
        assert "is not UTF-8" in err and "Traceback" not in err, err


@pytest.mark.parametrize("words", [
    ["--api-key", "Zq7xYb9kK3y\udcff"], ["--api-key", "\udcffZq7xYb9kK3y"],
    ["--api_key", "K1x9abcd", "Zq7xYb9kK3y\udcff"], ["--hf-token", "hf_Zq7xYb9kK3y\udcff"],
    ["--api-k", "--Zq7xYb9kK3y\udcff"], ["--api-key", "--Zq7xYb9kK3y\udcff"]])
def test_a_secret_flags_value_that_is_not_utf8_is_refused_unshown(tmp_path: Path,
                                                                  words: list[str]) -> None:
    """The refusal named the word as it was: judged alone, a key is only a word (the flag
    before it says it is one), so a key with a byte that is not UTF-8 was printed whole."""
    rc, _out, err = run_init(["--", "vllm", "serve", "/m", *words], tmp_path / "vw.toml",
                            stdout=True)
    assert rc == 2 and "is not UTF-8" in err and "Zq7xYb9kK3y" not in err, err


def test_proc_words_are_read_losslessly(tmp_path: Path) -> None:
    """/proc's bytes decode so that a byte that is not UTF-8 stays itself (then refused by
    the check above), not a stand-in character written into the config."""
    from vllmwatch.migrate import proc

    (tmp_path / "123").mkdir()
    (tmp_path / "123" / "cmdline").write_bytes(b"vllm\0serve\0/models/caf\xe9\0")
    (tmp_path / "123" / "environ").write_bytes(b"X=caf\xe9\0")
    argv = proc.argv_of(123, str(tmp_path))
    env = proc.environ_of(123, str(tmp_path))
    assert argv is not None and env is not None
    assert argv[2].encode("utf-8", "surrogateescape") == b"/models/caf\xe9"
    assert env["X"].encode("utf-8", "surrogateescape") == b"caf\xe9"


@pytest.mark.parametrize("line", [
    "vllm serve /m --served-model-name --port 8001", "vllm serve /m --host --port 8001",
    "vllm serve /m --port --host 127.0.0.1", "vllm serve /m --port",
])
def test_an_owned_flag_without_its_value_is_refused(line: str, tmp_path: Path) -> None:
    """`--served-model-name $NAME` with NAME unset: init wrote served_model_name = "True"
    (clients got 404) and host = "True"; vLLM refuses the line. Review of 2026-12-05."""
    rc, _, err = run_init([line], tmp_path / "vw.toml")
    assert rc == 2 and "no value on the line" in err, err
    assert not (tmp_path / "vw.toml").exists()


@pytest.mark.parametrize("line", ["vllm serve /m --max-model-len --port 8001",
                                  "vllm serve /m --gpu-memory-utilization --enforce-eager",
                                  "vllm serve /m --compilation-config --port 8001"])
def test_a_flag_that_takes_a_number_or_json_without_it_is_dropped(line: str) -> None:
    """With vLLM's flag list the kind is known: a number or JSON flag needs its value (init
    wrote `max-model-len = true`); dropped with a comment, as without the list
    (migrate/refusals.py), the rest written."""
    draft = translate.translate(serveline.parse(serveline.split_text(line)), Facts(known=known()))
    assert not draft.fatal and any("no value on the line" in e for e in draft.errors), draft.errors
    assert [e.value for e in draft.args if not e.active] == [None], draft.args


def test_a_flag_that_may_go_bare_is_kept() -> None:
    """`--hf-token` alone (the cached login) and switches stay as they were."""
    data, draft = toml_of("vllm serve /m --hf-token --enforce-eager")
    assert not draft.fatal and data["vllm"]["args"]["hf-token"] is True


@pytest.mark.parametrize(("line", "key", "want"), [
    # vLLM under the service opens these from its WorkingDirectory, not the line's folder:
    # a chat template it could not open stopped every start, a tokenizer became a hub id
    ("vllm serve /m --chat-template=./t.jinja", "chat-template", "/home/me/t.jinja"),
    ("vllm serve /m --chat-template t.jinja", "chat-template", "/home/me/t.jinja"),
    ("vllm serve /m --tokenizer tok", "tokenizer", "/home/me/tok"),
    ("vllm serve /m --download-dir ../cache", "download-dir", "/home/cache"),
    ("vllm serve /m --tokenizer org/name", "tokenizer", "org/name"),  # no such folder: a hub id
    ("vllm serve /m --dtype auto", "dtype", "auto"),  # a file named auto: still vLLM's word
    ("vllm serve /m --chat-template /srv/t.jinja", "chat-template", "/srv/t.jinja"),
])
def test_a_relative_path_in_a_flag_is_made_absolute_as_the_model_is(
        line: str, key: str, want: str) -> None:
    here = {"/home/me/t.jinja", "/home/me/tok", "/home/me/auto"}
    data, draft = toml_of(line, Facts(known=known(), cwd="/home/me", exists=here.__contains__))
    assert data["vllm"]["args"][key] == want
    if want.startswith("/home/"):
        note = next(e.note for e in draft.args if e.key == key)
        assert "relative to /home/me" in note and "starts elsewhere" in note


@pytest.mark.parametrize(("line", "key", "want"), [
    # the same inside a JSON value: written as the line had it, vLLM looked for its draft
    # model, compiled, read its overrides under the service's WorkingDirectory
    ("""vllm serve /m --speculative-config '{"model": "./d", "num_speculative_tokens": 3}'""",
     "speculative-config", {"model": "/home/me/d", "num_speculative_tokens": 3}),
    # (`mode`: vLLM 0.32's CompilationConfig has no `level`, and init refuses it)
    ("""vllm serve /m --compilation-config '{"cache_dir": "../c", "mode": 3}'""",
     "compilation-config", {"cache_dir": "/home/c", "mode": 3}),
    ("vllm serve /m --hf-overrides \"{'files': ['tok/x', 'org/name', '/abs']}\"",
     "hf-overrides", {"files": ["/home/me/tok/x", "org/name", "/abs"]}),
])
def test_a_relative_path_inside_a_json_flag_is_made_absolute(line: str, key: str,
                                                             want: object) -> None:
    data, draft = toml_of(line, Facts(known=known(), cwd="/home/me",
                                      exists={"/home/me/tok/x"}.__contains__))
    assert data["vllm"]["args"][key] == want
    note = next(e.note for e in draft.args if e.key == key)
    assert "relative to /home/me" in note and "starts elsewhere" in note, note


def test_a_relative_path_after_a_name_in_json_text_or_the_environment_is_made_absolute(
        ) -> None:
    """`--lora-modules a=./a` (vLLM loaded the adapter from its WorkingDirectory and failed its
    start), each word of `--lora-modules a=./a b=../b`, JSON text of a text flag, and
    `HF_HOME=./hf` (another hub cache) were copied as written; check warned of each."""
    facts = Facts(known=known(), cwd="/home/me")
    data, _ = toml_of("HF_HOME=./hf vllm serve /m --enable-lora --lora-modules a=./a", facts)
    assert data["vllm"]["env"]["HF_HOME"] == "/home/me/hf"
    assert data["vllm"]["args"]["lora-modules"] == "a=/home/me/a"
    data, _ = toml_of("vllm serve /m --enable-lora --lora-modules "
                      """'{"name": "c", "path": "../c"}'""", facts)
    assert data["vllm"]["args"]["lora-modules"] == '{"name": "c", "path": "/home/c"}'
    data, draft = toml_of("vllm serve /m --enable-lora --lora-modules a=./a b=../b x=y",
                          Facts(known=known(), cwd="/home/me"))
    assert data["vllm"]["extra_args"] == ["--lora-modules", "a=/home/me/a", "b=/home/b", "x=y"]
    assert any("'b=../b' was relative to /home/me" in said for said in draft.said), draft.said


def test_a_relative_path_in_a_json_flag_kept_as_json_is_made_absolute_and_said() -> None:
    """A JSON null keeps the value as JSON text in extra_args: its paths too."""
    data, draft = toml_of("""vllm serve /m --speculative-config '{"model": "./d", "x": null}'""",
                          Facts(known=known(), cwd="/home/me"))
    assert data["vllm"]["extra_args"] == ["--speculative-config",
                                          '{"model":"/home/me/d","x":null}']
    assert any("speculative-config.model './d' was relative" in s for s in draft.said)


@pytest.mark.parametrize(("output", "unit", "status"), [
    ("/etc/vllmwatch/gpu1.toml", "vllmwatch@gpu1", "vllmwatch status -c /etc/vllmwatch/gpu1.toml"),
    ("/etc/vllmwatch/vllmwatch.toml", "vllmwatch", "vllmwatch status"),
    ("/srv/vw.toml", "vllmwatch", "vllmwatch status"),
])
def test_init_names_the_instance_unit_that_reads_the_config_it_wrote(
        output: str, unit: str, status: str) -> None:
    """`init -c /etc/vllmwatch/gpu1.toml` (install.md: the template's config of vllmwatch@gpu1)
    told the operator to copy it over the main unit's config or to point vllmwatch.service at
    it with a drop-in, and to enable vllmwatch: two instances' worth of GPUs on one unit. The
    steps name vllmwatch@gpu1, and `status` with that config (its own status.listen)."""
    from vllmwatch.migrate import deliver
    from vllmwatch.migrate.draft import Draft

    out = io.StringIO()
    deliver.next_steps(output, False, Draft(), out)
    text = out.getvalue()
    assert f"sudo systemctl enable --now {unit}    # then: {status}\n" in text
    assert ("the unit reads" in text) is output.startswith("/srv")


@pytest.mark.parametrize("supervised", [False, True])
@pytest.mark.parametrize("seconds", [0, 120])
def test_the_lines_shutdown_timeout_becomes_the_drain_vllmwatch_passes(
        supervised: bool, seconds: int) -> None:
    # A hand-run vLLM drained its requests in flight for --shutdown-timeout on SIGTERM. Kept in
    # [vllm.args], vllmwatch's SIGKILL came after restart.stop_timeout (30 s) all the same;
    # read from a vLLM an earlier vllmwatch supervised, it was dropped and the new one
    # drained the default 30 s, not the old config's figure.
    facts = Facts(known=known(), supervised=supervised)
    data, _ = toml_of(f"vllm serve /m --shutdown-timeout {seconds}", facts)
    assert data["restart"]["drain_timeout"] == seconds
    assert "shutdown-timeout" not in data["vllm"].get("args", {})
    config = from_dict(data)
    argv = command.build(config, {}, vllm_version=known().version).argv
    assert argv.count("--shutdown-timeout") == 1
    assert argv[argv.index("--shutdown-timeout") + 1] == str(seconds)
    # vLLM's int() would refuse a word: left where `run` and `check` name it, as before
    data, _ = toml_of("vllm serve /m --shutdown-timeout=1h", Facts(known=known()))
    assert "restart" not in data
