"""What a config would do before it runs: its structural difference from another, and the traffic a
request log (or trace) sends to each, replayed through ``routing.choose`` and the fleet simulator.

Used by ``enginegate config diff``, ``enginegate simulate``, ``POST /admin/config/diff`` and the reload
answer; pure computation over configs and logged requests, no network.
"""
