"""Configuration: the typed, frozen Config and its defaults (sections), TOML loading and
validation (schema, the checks across sections in crosschecks, errors, the numeric bounds of
every key, converters, units, addresses), quiet hours, the vLLM command builder and its flag
rules (command, flags), vLLM version info and its accepted flags (vllminfo, vllmflags), and
trusted private files (private).

May import: the stdlib and third-party parsers only; nothing else of vllmwatch.
"""
