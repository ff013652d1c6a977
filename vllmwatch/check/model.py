"""Model checks for `vllmwatch check`: the model directory (max-model-len: checks_maxlen.py).

A local model directory must hold config.json, a tokenizer and whole weights (safetensors
headers match the file sizes), and match its sha256sums file when it has one; a hub id must
be in the Hugging Face cache or be downloadable.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from vllmwatch.check.base import FAIL, PASS, SKIP, WARN, CheckResult, Context
from vllmwatch.config import command, modellen, safefile
from vllmwatch.prewarm import pagecache

_CHUNK = 8 << 20
PROGRESS_MIN_BYTES = 256 << 20  # files smaller than this hash too fast to need progress
_SUMS_FILES = ("sha256sums.txt", "SHA256SUMS")
_SUM_LINE = re.compile(r"^([0-9a-fA-F]{64})\s+\*?(.+)\Z")
_BSD_SUM_LINE = re.compile(r"^SHA256 \((.+)\) = ([0-9a-fA-F]{64})\Z")
# Files in the model dir are read through safefile: only a regular file, opened without
# blocking (a FIFO named like a shard or a sums file would hang `check` for good), at most
# a bound of bytes, within a deadline (a hung network mount blocks a read in the kernel).
MAX_JSON = 64 << 20  # config.json / *.index.json: real ones are KiB to a few MiB
MAX_SUMS = 4 << 20  # a sha256sums file: one line per file
MAX_HEADER = 100 << 20  # a safetensors header longer than this is not one
READ_TIMEOUT = 30.0  # s for one bounded read


# --- the model -------------------------------------------------------------------------------

def local_model_dir(model: str) -> Path | None:
    """The model as the service's vLLM finds it: an absolute path that exists, else None (a
    hub id). A relative path is looked up from the unit's WorkingDirectory=, not from the
    folder `check` runs in (which passed a model the service then asked the hub for)."""
    p = Path(model)
    return p if p.is_absolute() and p.exists() else None


def hub_cache_dir(env: Mapping[str, str]) -> Path:
    """The Hugging Face hub cache vLLM would use with this environment."""
    if env.get("HF_HUB_CACHE"):
        return Path(env["HF_HUB_CACHE"]).expanduser()
    if env.get("HF_HOME"):
        return Path(env["HF_HOME"]).expanduser() / "hub"
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", "~")) / ".cache")
    return Path(base).expanduser() / "huggingface" / "hub"


def hub_snapshot(model: str, env: Mapping[str, str]) -> Path | None:
    """The cached snapshot of a hub id (refs/main first, else the newest), or None."""
    return pagecache.hub_snapshot(model, hub_cache_dir(env))  # the one reading (bounded)


def check_model(ctx: Context) -> list[CheckResult]:
    """A local model directory has config, tokenizer, whole weights and matching checksums."""
    model = ctx.config.vllm.model
    path = local_model_dir(model)
    if path is None and not model.startswith("/") and os.path.lexists(model):
        return [CheckResult("model", WARN, f"{model!r} is a relative path, found in this "
                            f"folder ({os.getcwd()}); the service's vLLM starts in the unit's "
                            "WorkingDirectory= (/var/lib/vllmwatch as shipped) and looks "
                            "there, or asks the hub for that name: write it from /, e.g. "
                            f"{os.path.abspath(model)!r}")]
    if path is None and (model.startswith(("/", ".", "~")) or model.count("/") > 1):
        return [CheckResult("model", FAIL, f"{model} does not exist (vllm.model is a path, not "
                            "a hub id \"org/name\"); fix the path or download the model")]
    if path is None:
        return [_check_hub_model(model, ctx.env)]
    if path.is_file():
        status = PASS if path.suffix == ".gguf" else WARN
        return [CheckResult("model", status, f"{path} is a single file "
                            f"({path.stat().st_size / 2**30:.2f} GiB), not a model directory")]
    return [_check_model_config(path), _check_tokenizer(path, ctx.config.vllm.args),
            _check_weights(path), _check_checksums(path, ctx)]


def _check_hub_model(model: str, env: Mapping[str, str]) -> CheckResult:
    offline = env.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    snap = hub_snapshot(model, env)
    if snap is not None and (any(snap.glob("*.safetensors")) or any(snap.glob("*.bin"))):
        return CheckResult("model", PASS, f"{model!r} is not a local path; found in the "
                           f"Hugging Face cache at {snap}")
    where = hub_cache_dir(env)
    if offline:
        return CheckResult("model", FAIL, f"{model!r} is not a local path and not in the "
                           f"Hugging Face cache ({where}) while HF_HUB_OFFLINE=1; download it "
                           "first or point vllm.model at a local directory")
    return CheckResult("model", WARN, f"{model!r} is not a local path and not in the Hugging "
                       f"Face cache ({where}): vLLM will download it at start (slow first "
                       "start); pre-download it or point vllm.model at a local directory")


def read_json(path: Path) -> Any:
    """A JSON file's content; a file that cannot be read (not a regular file, too large, no
    answer in time) raises OSError naming the path and why."""
    try:
        raw = safefile.read_within(str(path), MAX_JSON, READ_TIMEOUT)
    except safefile.FileProblem as exc:
        raise OSError(str(exc)) from None
    return json.loads(raw.decode("utf-8"))


def _check_model_config(path: Path) -> CheckResult:
    cfg = path / "config.json"
    if not cfg.is_file():
        if (path / "params.json").is_file():
            return CheckResult("model.config", WARN, f"no config.json in {path}, only "
                               "params.json (Mistral format): set config-format = \"mistral\", "
                               "load-format and tokenizer-mode too, in [vllm.args]")
        return CheckResult("model.config", FAIL, f"no config.json in {path}; is vllm.model "
                           "the model's top directory (the one holding config.json)?")
    try:
        data = read_json(cfg)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return CheckResult("model.config", FAIL, f"{cfg} is not valid JSON ({exc}); "
                           "re-download it")
    if not isinstance(data, dict):
        return CheckResult("model.config", FAIL, f"{cfg} is not a JSON object")
    try:  # vLLM picks its model class by these names
        arch = ", ".join(modellen.strings(data, "architectures") or []) \
            or "architecture not named"
        kind = modellen.string(data, "model_type") or "?"
    except modellen.BadModelValue as exc:
        return CheckResult("model.config", FAIL, f"{exc.text(str(cfg))}; re-download it")
    return CheckResult("model.config", PASS, f"{cfg}: {arch} (model_type {kind})")


def _check_tokenizer(path: Path, args: Mapping[str, object]) -> CheckResult:
    flags = {command.flag_name(k): v for k, v in args.items()}
    if flags.get("skip-tokenizer-init") is True:
        return CheckResult("model.tokenizer", SKIP, "skip-tokenizer-init is set")
    other = flags.get("tokenizer")
    if isinstance(other, str) and other:
        local = local_model_dir(other)
        if local is None:
            return CheckResult("model.tokenizer", PASS, f"from vllm.args.tokenizer = {other!r}")
        path = local
    names = ["tokenizer.json", "tokenizer.model", "tekken.json", "vocab.txt", "vocab.json"]
    found = [n for n in names if (path / n).is_file() and (path / n).stat().st_size > 0]
    found += [p.name for p in path.glob("*.tiktoken")]
    if "vocab.json" in found and not (path / "merges.txt").is_file() and len(found) == 1:
        return CheckResult("model.tokenizer", FAIL, f"{path} has vocab.json but no merges.txt; "
                           "re-download the tokenizer files")
    if not found:
        return CheckResult("model.tokenizer", FAIL, f"no tokenizer in {path} (tokenizer.json, "
                           "tokenizer.model or vocab files); re-download them or set "
                           "tokenizer = \"PATH\" in [vllm.args]")
    return CheckResult("model.tokenizer", PASS, ", ".join(found))


def _check_weights(path: Path) -> CheckResult:
    shards: list[Path] = []
    missing: list[str] = []
    for index in sorted(path.glob("*.index.json")):
        try:
            names = set(read_json(index).get("weight_map", {}).values())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError) as exc:
            return CheckResult("model.weights", FAIL, f"{index.name} is not a valid index "
                               f"({exc}); re-download it")
        missing += sorted(n for n in names if not (path / n).is_file())
    if missing:
        return CheckResult("model.weights", FAIL, f"{len(missing)} shard(s) named in the index "
                           f"missing: {_few(missing)}; the download is incomplete")
    for pattern in ("*.safetensors", "*.bin", "*.pt", "*.gguf"):
        shards += sorted(path.glob(pattern))
    if not shards:
        return CheckResult("model.weights", FAIL, f"no weights (*.safetensors, *.bin) in "
                           f"{path}; the download is incomplete")
    bad = [msg for p in shards if p.suffix == ".safetensors" and (msg := safetensors_problem(p))]
    if bad:
        return CheckResult("model.weights", FAIL, "; ".join(bad[:3]) + (
            f"; and {len(bad) - 3} more" if len(bad) > 3 else "") + "; re-download")
    size = sum(p.stat().st_size for p in shards)
    return CheckResult("model.weights", PASS, f"{len(shards)} file(s), {size / 2**30:.2f} GiB; "
                       "safetensors headers match the file sizes")


def _few(names: Sequence[str], n: int = 5) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def safetensors_problem(path: Path) -> str | None:
    """Why a safetensors file is cut short or malformed, or None when its size adds up."""
    try:
        size = path.stat().st_size
        head = safefile.head_within(str(path), 8, READ_TIMEOUT)
        if len(head) < 8:
            return f"{path.name} is truncated: {size} bytes, shorter than its 8-byte header"
        hlen = int.from_bytes(head, "little")
        if hlen > MAX_HEADER:
            return f"{path.name} is not a safetensors file (header length {hlen})"
        if size < 8 + hlen:
            return f"{path.name} is truncated: {size} bytes, its header alone needs {8 + hlen}"
        raw = safefile.head_within(str(path), 8 + hlen, READ_TIMEOUT)[8:]
    except safefile.FileProblem as exc:
        return str(exc)
    except OSError as exc:
        return f"{str(path)!r}: {exc.strerror or exc}"
    try:
        header = json.loads(raw)
        end = max((int(v["data_offsets"][1]) for k, v in header.items()
                   if k != "__metadata__"), default=0)
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        return f"{path.name} has a malformed header ({type(exc).__name__}: {exc})"
    if size < 8 + hlen + end:
        return (f"{path.name} is truncated: {size} bytes, its header says "
                f"{8 + hlen + end}")
    return None


def read_sums(path: Path) -> list[tuple[str, str]]:
    """(sha256, file name) pairs of a sha256sum (GNU or BSD style) file."""
    pairs = []
    raw = safefile.read_within(str(path), MAX_SUMS, READ_TIMEOUT)
    for line in raw.decode("utf-8", "replace").splitlines():
        line = line.strip()
        if (m := _SUM_LINE.match(line)):
            pairs.append((m.group(1).lower(), m.group(2)))
        elif (m := _BSD_SUM_LINE.match(line)):
            pairs.append((m.group(2).lower(), m.group(1)))
    return pairs


def sha256_file(path: Path, progress: TextIO | None = None,
                progress_min: int = PROGRESS_MIN_BYTES) -> str:
    """Stream a file through sha256; report every 10% to progress for big files.

    Only a regular file (FileProblem otherwise), opened without blocking: a FIFO or a device
    named in the sums file would block or never end. Its whole size is read: that is the
    point of a checksum, so it has no byte bound."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise safefile.FileProblem(f"{str(path)!r} is not a regular file; only a regular "
                                   "file is hashed", transient=False)
    digest, size, done, mark = hashlib.sha256(), st.st_size, 0, 0.1
    tty = progress is not None and progress.isatty()
    show = progress is not None and size >= progress_min
    with os.fdopen(fd, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if show and progress is not None and done >= mark * size:
                progress.write(f"{chr(13) if tty else ''}sha256 {path.name}: "
                               f"{100 * done // size}% of {size / 2**30:.2f} GiB"
                               + ("" if tty else "\n"))
                progress.flush()
                mark = done / size + 0.1
    if show and tty and progress is not None:
        progress.write("\n")
    return digest.hexdigest()


def _check_checksums(path: Path, ctx: Context) -> CheckResult:
    sums = next((path / n for n in _SUMS_FILES if os.path.lexists(path / n)), None)
    if sums is None:
        return CheckResult("model.checksums", SKIP, f"no {' or '.join(_SUMS_FILES)} in {path}")
    try:
        pairs = read_sums(sums)
    except safefile.FileProblem as exc:
        return CheckResult("model.checksums", FAIL, f"{exc}; replace it with the sha256sum "
                           "file of the model's download")
    if not pairs:
        return CheckResult("model.checksums", WARN, f"{sums.name} lists no sha256 lines")
    if ctx.fast:
        return CheckResult("model.checksums", SKIP, f"{sums.name} lists {len(pairs)} files; "
                           "not verified with --fast")
    missing, wrong, odd = [], [], []
    for want, name in pairs:
        target = path / name
        if not os.path.lexists(target):
            missing.append(name)
            continue
        try:
            if sha256_file(target, ctx.progress) != want:
                wrong.append(name)
        except (safefile.FileProblem, OSError) as exc:
            odd.append(f"{name} ({getattr(exc, 'strerror', None) or exc})")
    if wrong or missing or odd:
        parts = ([f"checksum mismatch: {_few(wrong)}"] if wrong else []) + (
            [f"missing: {_few(missing)}"] if missing else []) + (
            [f"unreadable: {_few(odd)}"] if odd else [])
        return CheckResult("model.checksums", FAIL, f"{'; '.join(parts)} (per {sums.name}); "
                           "re-download those files")
    return CheckResult("model.checksums", PASS, f"{len(pairs)} files match {sums.name}")
