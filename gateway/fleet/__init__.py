"""The running backends: the engine factory, the registry and its health poller, breakers, KV-cache
events, shared prefix blocks."""
