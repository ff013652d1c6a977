"""The imperative shell: the one loop and its outputs (outputs.py: the snapshot, STATUS=,
WATCHDOG=1), the effects it runs (child process, probes, memory sampling and GPU faults,
sd_notify, logs and the native journal, orphan reaping, fleet settings, clock), each posting
exactly one result event back.

May import: core, config, status (snapshot types), prewarm, incident (records), logfn,
bounded_http (the probes' HTTP client).
"""
