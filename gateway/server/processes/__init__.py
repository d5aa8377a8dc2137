"""`--api-server-count N`: N gateway processes serving one port as one gateway.

The supervisor (supervisor.py) binds the socket and starts the children (child.py); what must
stay global lives in shared memory (shared.py: admission slots, readiness) or goes through the
supervisor (control.py: runtime worker changes, cache-aware routing inserts).
"""
