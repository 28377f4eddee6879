"""The connection layer: uvicorn's protocol with the gateway's limits, one HTTP exchange, the API error,
CORS, graceful drain and the worker supervisor."""
