"""The gated delta rule: reference recurrence, chunked WY form, associative scan, dispatch."""
