"""EVM execution for the state node: calls, multi-calls, simulations, gas estimates, traces.

Execution runs on pyrevm in worker processes (see `docs/evm.md` for why and how).
"""
