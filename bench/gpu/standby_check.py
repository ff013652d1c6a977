"""Before a standby phase on a GPU machine: does this checkout's standby module list leave
CUDA untouched (torch's flag and the driver's cuInit, as standby_main.cuda_initialized asks),
and can a child forked after those imports use the GPU (what a forked EngineCore does)?

    python3 -m bench.gpu.standby_check     # one JSON line; "ok": true when both hold

Run under the interpreter that has vLLM (vllm_h200.sh `install` makes python3 see it).
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import time
from typing import Any


def _standby_main() -> Any:
    from vllmwatch.shell import standby as sb

    spec = importlib.util.spec_from_file_location("standby_main_check", sb.SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _forked_child_uses_cuda() -> dict[str, Any]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the forked EngineCore's first GPU work, in miniature
        try:
            import torch

            t0 = time.monotonic()
            x = torch.ones(4, device="cuda").sum().item()
            msg: dict[str, Any] = {"child_cuda": x,
                                   "child_init_s": round(time.monotonic() - t0, 2)}
        except BaseException as exc:  # reported, never raised in a fork
            msg = {"child_error": repr(exc)[:300]}
        os.write(w, json.dumps(msg).encode())
        os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    got: dict[str, Any] = json.loads(os.read(r, 65536) or b"{}")
    os.close(r)
    return got


def check() -> dict[str, Any]:
    """Import the GPU standby's modules one by one; stop at the first that initializes CUDA."""
    from vllmwatch.shell import standby as sb

    sm = _standby_main()
    out: dict[str, Any] = {"ok": False, "imports_s": {}}
    for name in sb.modules_for(True, []):
        t0 = time.monotonic()
        try:
            importlib.import_module(name)
            out["imports_s"][name] = round(time.monotonic() - t0, 2)
        except BaseException as exc:  # a missing module is a finding
            out["imports_s"][name] = f"failed: {type(exc).__name__}: {exc}"[:200]
        if sm.cuda_initialized():
            out["cuda_after"] = name
            break
    out["cuda"], out["driver"] = bool(sm.cuda_initialized()), bool(sm.driver_initialized())
    out.update(_forked_child_uses_cuda())
    out["ok"] = not out["cuda"] and out.get("child_cuda") == 4.0
    return out


if __name__ == "__main__":
    try:
        result = check()
    except BaseException as exc:  # one line either way
        result = {"ok": False, "error": repr(exc)[:300]}
    print(json.dumps(result), flush=True)
