"""Tenants: API keys in a database, limits exact across replicas on Redis, budgets and usage (issue 14).

``gate.Tenancy`` is what the gateway holds; it exists only when ``auth:`` asks for keys, so a
gateway without them pays nothing on its request path.
"""
