"""The engine workers behind the gateway: one `Worker` per address, the `WorkerPool` that picks
one per request (routing policies, health checks, circuit breakers, retries, membership)."""
