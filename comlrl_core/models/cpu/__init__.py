"""Optional CPU speed paths: copy-free GQA attention, pre-packed linear weights, heap tuning.

Each one probes once, falls back to the plain path on any failure, and says so in the log.
"""
