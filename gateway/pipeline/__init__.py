"""The one generation pipeline every front door goes through: route, dispatch with failover, shape, answer, account."""
