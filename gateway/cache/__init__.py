"""The response cache: deterministic answers served again without an engine (``cache:``)."""
