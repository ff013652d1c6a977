"""The adapters' shell side (issue 38) against the fake vLLM, which answers as vLLM 0.32 does:
live loads and unloads, vLLM refusing an adapter, an adapter whose files went missing, a load
that times out, adapters loaded by hand ("unmanaged"), and our request bodies against vLLM's
own request models (read from the installed vLLM's source)."""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.support import TIMEOUT_SCALE, free_port, kill_tree, wait_until
from tests.support.secrets import known_key
from tests.support.tinylora import make
from vllmwatch import bounded_http
from vllmwatch.config.schema import Config, from_dict
from vllmwatch.shell import adapters as watchmod
from vllmwatch.shell.adapters import AdapterWatch, load_body, unload_body
from vllmwatch.testing.world import LogCapture

VLLM_SITE = sorted(Path(__file__).resolve().parents[2].glob(
    ".cache/vllm-venv/lib/python*/site-packages/vllm"))


@contextmanager
def fake_vllm(port: int, *flags: str, runtime: bool = True
              ) -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True" if runtime else "False"}
    proc = subprocess.Popen([sys.executable, "-m", "vllmwatch.testing.fake_vllm", "--port",
                             str(port), "--model", "base", "--enable-lora", *flags],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)
    try:
        yield proc
    finally:
        kill_tree(proc)


def config(port: int, adapters: dict[str, str], **lora: Any) -> Config:
    return from_dict({"vllm": {"model": "base", "port": port, "gpus": []},
                      "adapters": [{"name": n, "path": p} for n, p in adapters.items()],
                      "lora": {"live": True, "max_loras": 4, **lora}})


def up(watch: AdapterWatch) -> None:
    wait_until(lambda: served(watch).get("a") == "loaded", 20 * TIMEOUT_SCALE, "the fake vLLM")


def served(watch: AdapterWatch) -> dict[str, str]:
    watch.refresh()
    view = watch.view(True)
    return {r["name"]: r["state"] for r in view["managed"]} | {
        n: "unmanaged" for n in view["unmanaged"]}


def refused(path: Path) -> tuple[Path, str]:
    """An adapter vLLM refuses (bias "all"), and its good adapter_config.json text."""
    bad = make(path)
    good = (bad / "adapter_config.json").read_text()
    (bad / "adapter_config.json").write_text(json.dumps({**json.loads(good), "bias": "all"}))
    return bad, good


@contextmanager
def watching(port: int, a: str) -> Iterator[tuple[AdapterWatch, LogCapture]]:
    """A fake vLLM started with adapter `a`, and a watch of it that saw it served."""
    with fake_vllm(port, "--lora-modules", f"a={a}"):
        log = LogCapture()
        watch = AdapterWatch(config(port, {"a": a}), log)
        up(watch)
        yield watch, log


def test_live_loads_refusals_missing_files_unmanaged_and_unloads(tmp_path: Path) -> None:
    a, b = str(make(tmp_path / "a")), str(make(tmp_path / "b"))
    (bad, _), gone = refused(tmp_path / "bad"), str(make(tmp_path / "gone"))
    port = free_port()
    with watching(port, a) as (watch, log):
        c1 = config(port, {"a": a, "b": b, "bad": str(bad), "gone": gone})
        shutil.rmtree(gone)  # validated, then removed before the load
        watch.update(c1.adapters[1:], (), ()).join(30 * TIMEOUT_SCALE)
        watch.reconfigure(c1)
        assert [f["adapter"] for f in log.named("lora.loaded")] == ["b"]
        errors = {f["adapter"]: f["error"] for f in log.named("lora.load_failed")}
        assert errors["bad"].startswith("HTTP 500: ") and "Adapter bias is not supported." \
            in errors["bad"]
        assert errors["gone"] == "HTTP 404: Loading lora gone failed: No adapter found for <path>"
        view = watch.view(True)
        rows = {r["name"]: r for r in view["managed"]}
        assert [rows[n]["state"] for n in ("a", "b", "bad", "gone")] == [
            "loaded", "loaded", "failed", "failed"]
        assert rows["bad"]["error"] == errors["bad"] and view["loads_failed"] == 2
        # loaded by hand, past vllmwatch: reported, and it is not ours to restore
        body = json.dumps({"lora_name": "byhand", "lora_path": b}).encode()
        assert bounded_http.request("127.0.0.1", port, "POST", "/v1/load_lora_adapter",
                                    timeout=10 * TIMEOUT_SCALE, max_body=4096, body=body,
                                    headers={"Content-Type": "application/json"})[0] == 200
        assert served(watch)["byhand"] == "unmanaged"
        # removed from the config: unloaded
        c2 = config(port, {"a": a})
        watch.update((), ("b",), ()).join(30 * TIMEOUT_SCALE)
        watch.reconfigure(c2)
        assert [f["adapter"] for f in log.named("lora.unloaded")] == ["b"]
        assert "b" not in served(watch)


def test_a_reload_with_the_same_adapters_retries_the_one_vllm_refused(tmp_path: Path) -> None:
    """lora.load_failed says "fix it and send SIGHUP again": the same config read as no
    change, so the adapter fixed in place stayed failed until a restart."""
    a, (bad, good) = str(make(tmp_path / "a")), refused(tmp_path / "bad")
    port = free_port()
    with watching(port, a) as (watch, log):
        c1 = config(port, {"a": a, "bad": str(bad)})
        watch.reconfigure(c1)  # a change: the core sends it as UpdateAdapters
        watch.update(c1.adapters[1:], (), ()).join(30 * TIMEOUT_SCALE)
        assert served(watch)["bad"] == "failed"
        (bad / "adapter_config.json").write_text(good)  # fixed in place, then SIGHUP
        worker = watch.reconfigure(c1)
        assert worker is not None and [f["adapters"] for f in log.named("lora.retry")] == [
            ["bad"]]
        worker.join(30 * TIMEOUT_SCALE)
        assert served(watch)["bad"] == "loaded" and log.named("lora.loaded")[-1]["adapter"] \
            == "bad"
        assert watch.reconfigure(c1) is None  # nothing left to retry


@pytest.mark.parametrize("retry_first", [False, True])
def test_a_reload_that_brings_back_a_left_out_adapter_loads_it_once(
        tmp_path: Path, retry_first: bool) -> None:
    """vLLM refused an optional adapter at start (core/lora.start_refused: the launch left it
    out); fixed in place, a SIGHUP: the core's change adds it (its config had dropped it) and
    the watch retries it (not served). Both loaded it: vLLM's 400 "already been loaded"
    marked it failed for good while it served, and loads_failed went up."""
    a, (bad, good) = str(make(tmp_path / "a")), refused(tmp_path / "bad")
    port = free_port()
    with watching(port, a) as (watch, log):
        c1 = config(port, {"a": a, "bad": str(bad)})
        watch.reconfigure(c1)
        watch.launched(config(port, {"a": a}))  # the launch that left it out
        (bad / "adapter_config.json").write_text(good)
        if retry_first:
            retry = watch.reconfigure(c1)
            change = watch.update(c1.adapters[1:], (), ())
        else:
            change = watch.update(c1.adapters[1:], (), ())
            retry = watch.reconfigure(c1)
        assert retry is not None
        for sent in (retry, change):
            sent.join(30 * TIMEOUT_SCALE)
        assert served(watch)["bad"] == "loaded" and watch.view(True)["loads_failed"] == 0
        assert log.named("lora.load_failed") == []
        assert [f["adapter"] for f in log.named("lora.loaded")] == ["bad"]


def test_an_adapter_loaded_by_hand_under_a_configured_name_is_replaced(tmp_path: Path) -> None:
    """vLLM already serves a same-named adapter vllmwatch did not load: the config's path
    replaces it (load_inplace), not a refusal that leaves the wrong weights serving."""
    a, b, other = (str(make(tmp_path / n)) for n in ("a", "b", "other"))
    port = free_port()
    with watching(port, a) as (watch, log):
        body = json.dumps({"lora_name": "b", "lora_path": other}).encode()
        assert bounded_http.request("127.0.0.1", port, "POST", "/v1/load_lora_adapter",
                                    timeout=10 * TIMEOUT_SCALE, max_body=4096, body=body,
                                    headers={"Content-Type": "application/json"})[0] == 200
        c1 = config(port, {"a": a, "b": b})
        watch.update(c1.adapters[1:], (), ()).join(30 * TIMEOUT_SCALE)
        watch.reconfigure(c1)
        [loaded] = log.named("lora.loaded")
        assert loaded["adapter"] == "b" and "in place" in loaded["how"]
        assert served(watch)["b"] == "loaded" and log.named("lora.load_failed") == []


def test_an_unload_without_vllms_endpoint_is_not_called_done(tmp_path: Path) -> None:
    """A 404 from a route that is not there (the runtime endpoints off) was logged as
    `lora.unloaded` while vLLM still served the adapter; only vLLM's own "cannot be found"
    means it is not loaded."""
    a = str(make(tmp_path / "a"))
    port = free_port()
    with fake_vllm(port, "--lora-modules", f"a={a}", runtime=False):
        log = LogCapture()
        watch = AdapterWatch(config(port, {"a": a}), log)
        up(watch)
        watch.update((), ("a",), ()).join(30 * TIMEOUT_SCALE)
        assert not log.named("lora.unloaded") and log.named("lora.unload_failed")
        assert served(watch)["a"] == "loaded"


def test_a_load_that_does_not_answer_in_time_is_a_failed_load(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = str(make(tmp_path / "a")), str(make(tmp_path / "b"))
    port = free_port()
    monkeypatch.setattr(watchmod, "LOAD_TIMEOUT", 0.5)
    with fake_vllm(port, "--lora-modules", f"a={a}", "--fake-lora-load-seconds", "5"):
        log = LogCapture()
        watch = AdapterWatch(config(port, {"a": a}), log)
        up(watch)
        watch.update(config(port, {"a": a, "b": b}).adapters[1:], (), ()).join(30 * TIMEOUT_SCALE)
        [failed] = log.named("lora.load_failed")
        assert failed["adapter"] == "b" and failed["error"] == "no answer within 0.5s"
        # no answer is no refusal: "fix it" sent the operator after a sound adapter
        assert "SIGHUP" in failed["detail"] and "refused" not in failed["detail"]
        assert "may still be loading it" in failed["detail"]


def test_one_change_at_a_time(tmp_path: Path) -> None:
    """Two changes sent back to back are applied in order, never interleaved."""
    a = str(make(tmp_path / "a"))
    port = free_port()
    with fake_vllm(port, "--lora-modules", f"a={a}", "--fake-lora-load-seconds", "0.3"):
        log = LogCapture()
        c = config(port, {"a": a, "b": a})
        watch = AdapterWatch(c, log)
        up(watch)
        first = watch.update(c.adapters[1:], (), ())
        second = watch.update((), ("b",), ())
        for t in (first, second):
            t.join(30 * TIMEOUT_SCALE)
        order = [(e, f.get("adapter")) for e, f in log.got if e.startswith("lora.")]
        assert order == [("lora.loaded", "b"), ("lora.unloaded", "b")]
        assert threading.active_count() < 50


def _fields(cls: str) -> dict[str, bool]:
    """vLLM's request model: field -> required, read from its source (no vLLM import)."""
    source = (VLLM_SITE[0] / "entrypoints" / "serve" / "lora" / "protocol.py").read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return {s.target.id: s.value is None for s in node.body
                    if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    raise AssertionError(f"{cls} not in vLLM's protocol.py")


@pytest.mark.skipif(not VLLM_SITE, reason="the real vLLM venv is missing (.cache/vllm-venv)")
def test_our_request_bodies_match_vllms_request_models(tmp_path: Path) -> None:
    """pydantic ignores unknown keys: a misspelt one would be dropped silently, so every key
    we send must be one of vLLM's fields, and every field it requires must be sent."""
    from vllmwatch.config.sections import AdapterConfig

    adapter = AdapterConfig("sql", "/srv/lora/sql", True, 8)
    for body, cls in ((load_body(adapter, False), "LoadLoRAAdapterRequest"),
                      (load_body(adapter, True), "LoadLoRAAdapterRequest"),
                      (unload_body("sql"), "UnloadLoRAAdapterRequest")):
        fields = _fields(cls)
        assert set(body) <= set(fields), (body, fields)
        assert {f for f, required in fields.items() if required} <= set(body)
    assert load_body(adapter, True)["load_inplace"] is True
    routes = (VLLM_SITE[0] / "entrypoints" / "serve" / "lora" / "api_router.py").read_text()
    assert f'"{watchmod.LOAD_PATH}"' in routes and f'"{watchmod.UNLOAD_PATH}"' in routes


@pytest.mark.parametrize("cut", [5, 15])
def test_vllms_refusal_is_redacted_before_it_is_cut(monkeypatch: pytest.MonkeyPatch,
                                                    cut: int) -> None:
    """vLLM's error for a load (what the log, /status and the metric's rows name) with the
    API key, a Bearer token and a URL password in it, the key across the 300-byte cut."""
    key = known_key(monkeypatch)  # as the daemon does at its launch (shell/childrun.py)
    tail = " Bearer t0kenB3arer9 from https://u:Passw0rdUrl9@hub/x" * 5
    for raw in (json.dumps({"error": {"message": "m" * (watchmod.ERROR_BYTES - cut) + key
                                      + tail}}).encode(),
                b"z" * (watchmod.ERROR_BYTES - cut) + key.encode() + tail.encode()):
        said = watchmod.vllm_error(500, raw)
        for piece in (key[:4], "t0kenB3", "Passw0r"):
            assert piece not in said, said


def test_live_changes_reach_vllm_in_the_order_of_the_reloads(tmp_path: Path) -> None:
    """Three SIGHUPs inside one slow load (add b, remove b, add b): each change ran on a
    thread of its own, queued on a lock that keeps no order, so the last two could swap and
    vLLM end without b while the config has it. One worker takes them in order now."""
    watch = AdapterWatch(config(free_port(), {}), LogCapture())
    order: list[str] = []
    started: list[str] = []
    first = threading.Event()

    def update(config: Config, load: Any, unload: Any, inplace: Any) -> None:
        what = f"load {load[0]}" if load else f"unload {unload[0]}"
        started.append(what)
        if what == "load b":
            first.wait(30)  # the first load is slow: the next two are sent meanwhile
        order.append(what)

    watch._update = update  # type: ignore[method-assign]
    sent = [watch.update(("b",), (), ()),  # type: ignore[arg-type]
            watch.update((), ("b",), ()), watch.update(("b2",), (), ())]  # type: ignore[arg-type]
    for s in sent[1:]:
        s.join(1)  # in order, they wait behind the slow first; out of order, they are done
    first.set()
    for s in sent:
        s.join(30 * TIMEOUT_SCALE)
    assert order == ["load b", "unload b", "load b2"], order


def test_a_load_that_answered_late_shows_loaded_once_vllm_lists_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A load past LOAD_TIMEOUT is a failed load, but vLLM goes on loading it: once its
    /v1/models lists the adapter with the configured path, /status said `failed` (and
    "fix it and send SIGHUP") for an adapter vLLM served, until the next reload. What vLLM
    lists with the path we asked for is loaded; one listed with another path (a repoint
    it refused) is not."""
    a, b = str(make(tmp_path / "a")), str(make(tmp_path / "b"))
    port = free_port()
    monkeypatch.setattr(watchmod, "LOAD_TIMEOUT", 0.5)
    with fake_vllm(port, "--lora-modules", f"a={a}", "--fake-lora-load-seconds", "2"):
        log = LogCapture()
        cfg = config(port, {"a": a, "b": b})
        watch = AdapterWatch(config(port, {"a": a}), log)
        up(watch)
        watch.reconfigure(cfg)
        watch.update(cfg.adapters[1:], (), ()).join(30 * TIMEOUT_SCALE)
        assert log.named("lora.load_failed") and served(watch)["b"] == "failed"
        wait_until(lambda: served(watch)["b"] == "loaded", 20 * TIMEOUT_SCALE,
                   "b shown loaded once vLLM lists it")
        [late] = log.named("lora.loaded")
        assert late["adapter"] == "b" and "late" in late["how"]
        assert watch.view(True)["managed"][1]["error"] is None
        # a repoint vLLM refused: it lists the old path under the name, still failed
        moved = str(refused(tmp_path / "b2")[0])
        repointed = config(port, {"a": a, "b": moved})
        watch.reconfigure(repointed)
        monkeypatch.setattr(watchmod, "LOAD_TIMEOUT", 60.0)
        watch.update(repointed.adapters[1:], (), ("b",)).join(90 * TIMEOUT_SCALE)
        assert "bias" in log.named("lora.load_failed")[-1]["error"]
        assert served(watch)["b"] == "failed"


def test_an_adapter_loaded_live_then_lost_is_loaded_again_by_the_retry(tmp_path: Path) -> None:
    """An adapter this child loaded live, then unloaded past vllmwatch (vLLM's unguarded
    unload endpoint): /status said `missing` and the SIGHUP logged `lora.retry` for it, but
    the worker skipped it as loaded already (it remembered its own load, not what vLLM
    serves), so it stayed missing until a restart."""
    a, b = str(make(tmp_path / "a")), str(make(tmp_path / "b"))
    port = free_port()
    with watching(port, a) as (watch, log):
        c1 = config(port, {"a": a, "b": b})
        watch.reconfigure(c1)
        watch.update(c1.adapters[1:], (), ()).join(30 * TIMEOUT_SCALE)
        assert served(watch)["b"] == "loaded"
        body = json.dumps({"lora_name": "b"}).encode()
        assert bounded_http.request("127.0.0.1", port, "POST", "/v1/unload_lora_adapter",
                                    timeout=10 * TIMEOUT_SCALE, max_body=4096, body=body,
                                    headers={"Content-Type": "application/json"})[0] == 200
        assert served(watch)["b"] == "missing"
        retry = watch.reconfigure(c1)  # SIGHUP, the same config
        assert retry is not None
        retry.join(30 * TIMEOUT_SCALE)
        assert served(watch)["b"] == "loaded"
        assert [f["adapter"] for f in log.named("lora.loaded")] == ["b", "b"]


def test_a_configured_name_serving_another_path_is_not_loaded(tmp_path: Path) -> None:
    """vLLM serves a configured adapter's name from another path (replaced in place past
    vllmwatch: load_inplace on vLLM's unguarded endpoint): /status said `loaded`, by name
    alone, while clients got other weights, and a SIGHUP's retry left it so. It is
    `missing` with the path vLLM serves, and the retry puts the configured path back."""
    a, other = str(make(tmp_path / "a")), str(make(tmp_path / "other"))
    port = free_port()
    with watching(port, a) as (watch, log):
        body = json.dumps({"lora_name": "a", "lora_path": other, "load_inplace": True})
        assert bounded_http.request("127.0.0.1", port, "POST", "/v1/load_lora_adapter",
                                    timeout=10 * TIMEOUT_SCALE, max_body=4096,
                                    body=body.encode(),
                                    headers={"Content-Type": "application/json"})[0] == 200
        assert served(watch)["a"] == "missing"
        [row] = watch.view(True)["managed"]
        assert other in row["error"]
        retry = watch.reconfigure(config(port, {"a": a}))  # SIGHUP, the same config
        assert retry is not None
        retry.join(30 * TIMEOUT_SCALE)
        assert served(watch)["a"] == "loaded" and watch.view(True)["managed"][0]["error"] is None
        assert log.named("lora.load_failed") == []
