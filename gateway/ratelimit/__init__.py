"""Rate limits: requests per second and generated tokens per second, per API key (issue 31)."""
