"""What every stage reports through: Prometheus metrics, OpenTelemetry spans and the request
log with its request id. A base beside `gateway.errors`: every stage imports it, it imports no
stage."""
