"""stack: what assembles chainstate out of its parts — the `chainstate` command and
`chainstate up`. It sits above `proxy`, `nodes` and `workspace` and is the only package that
knows all of them; `chainstate/` (shared helpers) knows none."""
