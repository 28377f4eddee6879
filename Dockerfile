# enginegate gateway image: the gateway, its embedded CTranslate2 engine, the demo model and default config.
# GPU engines run in their own official images (docker-compose.yml, deploy/k8s).
# The build stage has gcc (the full image): the request path is compiled by mypyc (setup.py, the modules
# pyproject.toml lists), which analyses it against the installed dependencies and their types, the
# optional ones its modules import included. The image carries the extras its own configs and manifests
# use (redis for replicas, traces, vLLM's KV events, the offline API docs); not `llama` (built from
# source), `epp` (its protos clash with the exporter's: docs/epp.md), `sim` or `test`
# (tests/deploy/test_deploy_files.py holds this).
FROM python:3.11 AS build
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY gateway ./gateway
COPY backends ./backends
COPY routing ./routing
COPY values ./values
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[tenancy,otel,kv-events,docs]" \
 && rm /wheels/enginegate-*.whl \
 && pip install --no-cache-dir /wheels/*.whl "mypy>=2.4,<3" "types-PyYAML>=6" "setuptools>=70.1" \
 && ENGINEGATE_COMPILE=1 pip wheel --no-cache-dir --no-build-isolation --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 enginegate
WORKDIR /app
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY configs ./configs
COPY models ./models
ENV ENGINEGATE_CONFIG=/app/configs/default.yaml \
    XDG_CACHE_HOME=/home/enginegate/.cache \
    PYTHONUNBUFFERED=1
USER 10001
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2).status != 200)"]
ENTRYPOINT ["enginegate", "serve", "--host", "0.0.0.0", "--port", "8000"]
