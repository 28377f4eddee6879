"""``enginegate epp``: the routing policy as a Gateway API Inference Extension endpoint picker.

An Envoy external processor (``envoy.service.ext_proc.v3.ExternalProcessor``) that reads each
request's OpenAI body, runs ``routing.policy.choose()`` over the config's backends (each backend's
url is an ``ip:port`` endpoint) and tells the proxy where to send it; the proxy, not enginegate,
carries the request. ``pool`` checks the config and maps endpoints to backends, ``wire`` translates
Envoy's messages, ``picker`` decides and learns from the answers, ``server`` runs the gRPC service.
"""
