"""Chain nodes served in process or alone: state, writer, checker, and the devnet chain."""
