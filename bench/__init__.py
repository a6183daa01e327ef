"""Load generators and benchmarks for JSON-RPC endpoints (see bench/README.md).

- `bench.loadgen`: the keep-alive HTTP/1.1 load generator (`chainstate bench run`)
- `bench.bodies`: fixed bodies and method/height mixes it sends
- `bench.histogram`: the mergeable latency histogram
- `bench.wrkdriver`: the same load through `wrk`, as a cross-check
- `bench.fakenode`: a fast fake state node with made-up data (`chainstate bench fake-node`)
- `bench.suite`: suites that start services and compare them (`chainstate bench suite`)
- `bench.faults`: the faults suite (killed, hung, failing, slow, lying nodes)
- `bench.suitecli`: the `bench suite` command, over both
- `bench.services`: the processes a benchmark starts, their ports and CPU time
"""
