# Two images, installed exactly as the README installs them.
#   docker build --target gateway -t mmgate-gateway .   (slim: no torch, no vLLM)
#   docker build --target engine  -t mmgate-engine  .   (on vLLM's GPU image)

FROM scratch AS source
COPY pyproject.toml README.md /app/
COPY protos /app/protos
COPY gateway /app/gateway
COPY multimodal /app/multimodal
COPY engine_server /app/engine_server

FROM python:3.11-slim AS gateway
COPY --from=source /app /app
WORKDIR /app
RUN pip install --no-cache-dir .
USER nobody
ENTRYPOINT ["mmgate"]
CMD ["--help"]

FROM vllm/vllm-openai:v0.32.0 AS engine
COPY --from=source /app /app
WORKDIR /app
RUN pip install --no-cache-dir ".[engine]"
EXPOSE 50051
ENTRYPOINT ["mmgate", "engine", "--host", "0.0.0.0", "--port", "50051"]
