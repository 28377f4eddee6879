"""Envoy's external-processing messages, read and written: pure functions, no I/O.

The endpoint-picker protocol (Gateway API Inference Extension, v1.0.0) in Envoy's terms: the pick
goes out in the request headers' answer, as the ``x-gateway-destination-endpoint`` header and the
same value in dynamic metadata ``envoy.lb``; the proxy may restrict the choice with filter metadata
``envoy.lb.subset_hint`` and reports the endpoint that served in ``envoy.lb`` too. Bodies run in
full-duplex streamed mode, so every body byte the proxy sends must come back as a streamed body
mutation, in order, or the upstream never sees it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from gateway.http.errors import ApiError

NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
DESTINATION = "x-gateway-destination-endpoint"
SUBSET = "x-gateway-destination-endpoint-subset"
SERVED = "x-gateway-destination-endpoint-served"
BODY_CHUNK = 64 * 1024
"""Bytes per streamed body answer: far below gRPC's 4 MiB message limit, whatever the body's size."""
FULL_DUPLEX = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED


class ProtocolError(Exception):
    """A message the protocol does not allow here: the stream ends with INVALID_ARGUMENT naming it."""


def kind(request: Any) -> str:
    """Which message this is: ``request_headers``, ``request_body``, ... (``""`` for none)."""
    return str(request.WhichOneof("request") or "")


def headers_of(headers: Any) -> dict[str, str]:
    """An ``HttpHeaders`` message as a dict of lower-case names (Envoy sends bytes in ``raw_value``)."""
    out: dict[str, str] = {}
    for h in headers.headers.headers:
        value = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
        out[h.key.lower()] = value
    return out


def _entry(request: Any, namespace: str, key: str) -> Any:
    """The value under ``namespace``/``key`` of the request's filter metadata, or None."""
    spaces = request.metadata_context.filter_metadata
    if namespace not in spaces or key not in spaces[namespace].fields:
        return None
    return spaces[namespace].fields[key]


def subset_of(request: Any) -> frozenset[str] | None:
    """The endpoints the proxy allows (None: no hint, any). A list of ``ip:port`` strings; a
    comma-separated string is read too. Entries that are not strings allow nothing."""
    value = _entry(request, SUBSET_NAMESPACE, SUBSET)
    if value is None:
        return None
    if value.WhichOneof("kind") == "string_value":
        items: Iterable[str] = value.string_value.split(",")
    elif value.WhichOneof("kind") == "list_value":
        items = (v.string_value for v in value.list_value.values if v.WhichOneof("kind") == "string_value")
    else:
        items = ()
    return frozenset(item.strip() for item in items if item.strip())


def served_of(request: Any) -> str | None:
    """The endpoint that served, as the proxy reports it (the first, if it lists several)."""
    value = _entry(request, NAMESPACE, SERVED)
    if value is None or value.WhichOneof("kind") != "string_value":
        return None
    return value.string_value.split(",")[0].strip() or None


def streamed_mode(request: Any) -> bool:
    """False when the proxy says its request body is not sent full-duplex streamed (older proxies
    send no protocol configuration: assumed streamed, the protocol's requirement)."""
    if not request.HasField("protocol_config"):
        return True
    return bool(request.protocol_config.request_body_mode == FULL_DUPLEX)


def _set(name: str, value: str) -> Any:
    """A header set to ``value``, replacing any the client sent: appended to a client's own
    ``x-gateway-destination-endpoint`` (Envoy's default action), a pick could be steered."""
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=name, raw_value=value.encode()),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def picked(endpoints: list[str]) -> Any:
    """The request headers' answer: the endpoints, best first, in the header and in ``envoy.lb``
    metadata, the same string in both; the route is recomputed with the new header."""
    value = ",".join(endpoints)
    header = _set(DESTINATION, value)
    metadata = struct_pb2.Struct()
    metadata.update({NAMESPACE: {DESTINATION: value}})
    common = ext.CommonResponse(header_mutation=ext.HeaderMutation(set_headers=[header]), clear_route_cache=True)
    return ext.ProcessingResponse(request_headers=ext.HeadersResponse(response=common), dynamic_metadata=metadata)


def body(data: bytes, end: bool, response: bool = False) -> Any:
    """One streamed body answer carrying ``data`` on (the request's, or the response's)."""
    mutation = ext.BodyMutation(streamed_response=ext.StreamedBodyResponse(body=data, end_of_stream=end))
    answer = ext.BodyResponse(response=ext.CommonResponse(body_mutation=mutation))
    return ext.ProcessingResponse(response_body=answer) if response else ext.ProcessingResponse(request_body=answer)


def request_body(data: bytes, end: bool) -> list[Any]:
    """The whole request body handed back, in ``BODY_CHUNK`` pieces (one empty piece for no body)."""
    pieces = [data[i : i + BODY_CHUNK] for i in range(0, len(data), BODY_CHUNK)] or [b""]
    return [body(piece, end and i == len(pieces) - 1) for i, piece in enumerate(pieces)]


def headers_seen(response: bool) -> Any:
    """An unchanged headers answer."""
    answer = ext.HeadersResponse(response=ext.CommonResponse())
    return (
        ext.ProcessingResponse(response_headers=answer) if response else ext.ProcessingResponse(request_headers=answer)
    )


def trailers_seen(response: bool) -> Any:
    answer = ext.TrailersResponse()
    if response:
        return ext.ProcessingResponse(response_trailers=answer)
    return ext.ProcessingResponse(request_trailers=answer)


def refusal(error: ApiError) -> Any:
    """The client's answer, from the picker instead of an endpoint: OpenAI's error JSON."""
    headers: Mapping[str, str] = {"content-type": "application/json", **error.headers()}
    mutation = ext.HeaderMutation(set_headers=[_set(k, v) for k, v in headers.items()])
    immediate = ext.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=error.status),
        headers=mutation,
        body=error.json(),
        details=f"enginegate_epp_{error.code or error.status}",
    )
    return ext.ProcessingResponse(immediate_response=immediate)
