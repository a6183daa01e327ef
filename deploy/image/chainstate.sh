#!/bin/sh
# `chainstate` inside the image (for `podman exec`): the CLI without the entrypoint's set-up.
exec /opt/chainstate/venv/bin/python -m stack.cli "$@"
