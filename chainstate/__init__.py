"""chainstate: shared helpers (JSON-RPC envelopes, hex codecs, block refs, config, CLI)."""

__version__ = "0.1.0"
