"""Configuration: the typed, frozen Config, TOML loading and validation, value converters,
units, quiet hours, the vLLM command builder and vLLM version info.

May import: the stdlib and third-party parsers only; nothing else of vllmwatch.
"""
