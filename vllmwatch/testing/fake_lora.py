"""The fake vLLM's LoRA adapters (issue 38), with vLLM 0.32's answers, seen on the real CPU vLLM:

- `--enable-lora --lora-modules name=path ... --max-lora-rank R`: each adapter is checked at
  start as vLLM does (adapter_config.json, `r` <= R, `bias` "none"); the first refused one
  ends the start as vLLM's does (`ValueError: Call to add_lora method failed: ...` from
  init_static_loras, exit 1), after a "Loaded new LoRA adapter" line for each one before it.
- /v1/models lists the adapters (id = name, root = path, parent = the base model).
- With VLLM_ALLOW_RUNTIME_LORA_UPDATING=True: POST /v1/load_lora_adapter and
  /v1/unload_lora_adapter (else they are not routes: 404), their bodies and errors as
  vllm/entrypoints/openai/models/serving.py gives them; `--fake-lora-load-seconds` makes
  each load that slow (a load timeout).
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Any

ROUTES = ("/v1/load_lora_adapter", "/v1/unload_lora_adapter")


def add_args(p: argparse.ArgumentParser) -> None:
    """The LoRA flags of `vllm serve` the fake knows."""
    p.add_argument("--enable-lora", action="store_true")
    p.add_argument("--lora-modules", nargs="+", default=[])
    p.add_argument("--max-loras", type=int, default=1)
    p.add_argument("--max-lora-rank", type=int, default=16)
    p.add_argument("--fake-lora-load-seconds", type=float, default=0.0)


def _error(message: str, kind: str, code: int) -> tuple[int, dict[str, Any]]:
    return code, {"error": {"message": message, "type": kind, "param": None, "code": code}}


class Loras:
    """The adapters this fake serves, by name -> path."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args, self.lock = args, threading.Lock()
        self.loaded: dict[str, str] = {}
        self.runtime = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in (
            "1", "true")

    def problem(self, path: str) -> str | None:
        """Why vLLM's worker would refuse the adapter at path (None: it loads)."""
        try:
            with open(os.path.join(path, "adapter_config.json"), encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError):
            return f"No adapter found for {path}"
        if config.get("bias", "none") != "none":
            return "Adapter bias is not supported."
        if int(config.get("r", 0)) > self.args.max_lora_rank:
            return (f"LoRA rank {config.get('r')} is greater than max_lora_rank "
                    f"{self.args.max_lora_rank}.")
        return None

    def load_static(self, log: Any) -> str | None:
        """--lora-modules at start: the error that ends the start, else None."""
        if self.args.lora_modules and not self.args.enable_lora:
            return "ValueError: --lora-modules needs --enable-lora"
        for item in self.args.lora_modules:
            if "=" in item and "," not in item:
                name, path = item.split("=", 1)
            else:
                data = json.loads(item)
                name, path = data["name"], data["path"]
            why = self.problem(path)
            if why is not None:
                return (f"ValueError: Call to add_lora method failed: Worker failed with error "
                        f"'{why}', please check the stack trace above for the root cause")
            self.loaded[name] = path
            log("INFO", f"Loaded new LoRA adapter: name '{name}', path '{path}'", "serving.py:226")
        return None

    def models(self, base: str) -> list[dict[str, Any]]:
        """/v1/models rows of the adapters."""
        with self.lock:
            return [{"id": n, "object": "model", "created": 0, "owned_by": "vllm", "root": p,
                     "parent": base, "max_model_len": None} for n, p in self.loaded.items()]

    def serves(self, name: str) -> bool:
        """A loaded adapter's name (a request may name it as its model)."""
        with self.lock:
            return name in self.loaded

    def post(self, path: str, body: dict[str, Any], base: list[str]
             ) -> tuple[int, dict[str, Any] | bytes] | None:
        """Answer a load or unload (None: not a LoRA route, or runtime updating is off)."""
        if path not in ROUTES or not self.runtime:
            return None
        name = body.get("lora_name")
        if path == ROUTES[1]:
            with self.lock:
                if not name:
                    return _error("'lora_name' needs to be provided to unload a LoRA adapter.",
                                  "InvalidUserInput", 400)
                if name not in self.loaded:
                    return _error(f"The lora adapter '{name}' cannot be found.",
                                  "NotFoundError", 404)
                del self.loaded[name]
            return 200, f"Success: LoRA adapter '{name}' removed successfully.".encode()
        lora_path = body.get("lora_path")
        if not name or not lora_path:
            return _error("Both 'lora_name' and 'lora_path' must be provided.",
                          "InvalidUserInput", 400)
        if name in base:
            return _error(f"The lora adapter '{name}' conflicts with a served base model.",
                          "InvalidUserInput", 400)
        if not body.get("load_inplace") and self.serves(name):
            return _error(f"The lora adapter '{name}' has already been loaded. If you want to "
                          "load the adapter in place, set 'load_inplace' to True.",
                          "InvalidUserInput", 400)
        time.sleep(self.args.fake_lora_load_seconds)
        why = self.problem(str(lora_path))
        if why is not None and why.startswith("No adapter found"):
            return _error(f"Loading lora {name} failed: No adapter found for <path>",
                          "NotFoundError", 404)
        if why is not None:
            return _error(f"Call to add_lora method failed: Worker failed with error '{why}', "
                          "please check the stack trace above for the root cause",
                          "InternalServerError", 500)
        with self.lock:
            self.loaded[name] = str(lora_path)
        return 200, f"Success: LoRA adapter '{name}' added successfully.".encode()
