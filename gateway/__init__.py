"""mmgate's gateway: an OpenAI-compatible server that does the CPU work of serving itself and
drives engine workers over the VllmEngine gRPC protocol.

A request's path, folder by folder:

    server/     the HTTP app: routes, middleware (request ids, logs, metrics, API keys,
                CORS, admission), admin and Prometheus endpoints
    api/        the OpenAI endpoints: request models, chat / completions / embeddings /
                tokenize services, sampling fields onto the wire
    render/     the model's files, chat templates, messages -> prompt ids; media items
                fetched and preprocessed (by multimodal/) into the prompt
    workers/    the pool: which worker takes a request (routing, health, breakers, retries)
    transport/  our HTTP/2 client for streamed Generate calls
    stream/     the worker's tokens back to OpenAI: detokenizer, logprobs, SSE
    cli/        `mmgate serve | engine | demo | preprocess`

`errors.py` holds every error the gateway answers with, and the one mapping to HTTP.
"""
