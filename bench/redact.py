"""The redactor on hostile lines: every vLLM line the daemon forwards to the journal, every
record and status answer passes `Redactor.text`, so a line shaped to make a rule backtrack
must not cost the reader thread seconds.

    .venv/bin/python bench/redact.py [--kib 16] [--repeat 5]

For each shape, a line of --kib KiB made of it, redacted --repeat times: the median
milliseconds. Writes bench/results/redact.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from vllmwatch.config.redact import Redactor

# Each shape repeats what one rule scans for, with nothing that ends the scan early.
SHAPES = {
    "url-userinfo x://:": "x://:",
    "url-userinfo a://b:": "a://b:",
    "url https://u:p": "https://u:p",
    "bearer": "Bearer ",
    "authorization": "authorization: x ",
    "name=": "token=",
    "quoted name": "'token': ",
    "secret flag": "--api-key ",
    "percent-encoded _": "%5F",
    "percent-encoded name": "api%5Fkey%3D",
    "long word with a hint": "a_token_",
    "plain log line": "INFO 12-04 22:30:45 [loggers.py:123] Avg prompt throughput: 1.0 ",
    # no :// at all; "sk-" inside "task-" switched the URL rules on (quadratic before)
    "task-": "task-",
}
# Shapes that were exponential: one short line each, not repeated to --kib (each escaped
# quote more after an unclosed quote doubled the time before)
SHORT = {
    "unclosed quote, 20 escaped quotes": "prompt: 'cfg, token='{" + ", ".join(
        f'\\"k{i}\\": \\"v\\"' for i in range(5)),
    "unclosed quote, 32 backslashes": "api_key='" + "\\" * 32,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kib", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    redactor = Redactor(known=False)
    size = args.kib * 1024
    out = {}
    lines = {name: (piece * (size // len(piece) + 1))[:size] for name, piece in SHAPES.items()}
    for name, line in {**lines, **SHORT}.items():
        samples = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            redactor.text(line)
            samples.append((time.perf_counter() - start) * 1000)
        out[name] = round(statistics.median(samples), 2)
        print(f"{out[name]:9.2f} ms  {name}")
    results = Path(__file__).resolve().parent / "results"
    results.mkdir(exist_ok=True)
    (results / "redact.json").write_text(json.dumps({"kib": args.kib, "median_ms": out},
                                                    indent=1) + "\n")


if __name__ == "__main__":
    main()
