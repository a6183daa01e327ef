"""Load generators and benchmarks for JSON-RPC endpoints."""
