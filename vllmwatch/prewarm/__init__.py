"""Pre-warm before a start: persistent cache locations, the page cache, attention kernels.

May import: config, logfn.
"""
