"""Machine tuning beside the decoding core, passed into it and never imported by it: the verify-cost curve and the
cost model that sizes the ``auto`` tree (and its cache), draft backoff, and the CPU matrix-kernel choice."""
