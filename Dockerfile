# Two images, installed exactly as the README installs them.
#   docker build --target gateway -t mmgate-gateway .   (slim: no torch, no vLLM)
#   docker build --target engine  -t mmgate-engine  .   (on vLLM's GPU image)

FROM scratch AS source
COPY pyproject.toml setup.py README.md /app/
COPY protos /app/protos
COPY gateway /app/gateway
COPY multimodal /app/multimodal
COPY engine_server /app/engine_server

# The slim image has no C compiler: the wheel, with the native preprocessing kernels
# (multimodal._kernels), is built on the full image of the same Python.
FROM python:3.11 AS gateway-wheel
COPY --from=source /app /app
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels /app \
    && python -m zipfile -l /wheels/mmgate-*.whl | grep -q "multimodal/_kernels"

FROM python:3.11-slim AS gateway
COPY --from=gateway-wheel /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && python -c "from multimodal import native; assert native.AVAILABLE"
USER nobody
ENTRYPOINT ["mmgate"]
CMD ["--help"]

FROM vllm/vllm-openai:v0.32.0 AS engine
COPY --from=source /app /app
WORKDIR /app
RUN pip install --no-cache-dir ".[engine]"
EXPOSE 50051
ENTRYPOINT ["mmgate", "engine", "--host", "0.0.0.0", "--port", "50051"]
