"""State node: durable chain state at any block in range, served over JSON-RPC."""
