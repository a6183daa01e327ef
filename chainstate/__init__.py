"""chainstate: shared helpers (JSON-RPC envelopes, hex codecs, block refs, config, the lean
HTTP server). A leaf: it imports no other package of the project (the command and `chainstate
up` are in `stack/`)."""

__version__ = "0.1.0"
