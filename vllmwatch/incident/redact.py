"""Moved: the redaction rules live in vllmwatch/config/redact.py (one set for every writer).

Kept so that `from vllmwatch.incident.redact import Redactor` still works.
"""

from __future__ import annotations

from vllmwatch.config.redact import Redactor as Redactor
from vllmwatch.config.redact import secrets_of as secrets_of
