"""The imperative shell: the one loop, the effects it runs (child process, probes, memory
sampling, sd_notify, logs, clock), each posting exactly one result event back.

May import: core, config, status (snapshot types), prewarm.
"""
