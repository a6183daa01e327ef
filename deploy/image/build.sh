#!/usr/bin/env bash
# Build chainstate's image with podman, with no container registry: the base is Debian made by
# debootstrap, the Python packages are wheels built here, and both are cached between runs.
#   deploy/image/build.sh [TAG]        (default TAG: localhost/chainstate:latest)
# Environment (all optional):
#   CHAINSTATE_IMAGE_CACHE  where the base and wheels are kept (~/.cache/chainstate/image)
#   DEBIAN_MIRROR           debootstrap's mirror (http://deb.debian.org/debian)
#   ANVIL                   the anvil binary to put in the image (default: the project's npm
#                           copy under .tools/, else anvil on PATH)
# Needs root (debootstrap), podman, debootstrap; a cold run takes minutes (docs/image.md).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
TAG="${1:-localhost/chainstate:latest}"
CACHE="${CHAINSTATE_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/chainstate/image}"
SUITE=bookworm # Debian 12: its python3 is 3.11, the version the project targets
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
# etcd and Redis ride along so one base serves every container of the compose file
BASE_PACKAGES="python3,python3-venv,ca-certificates,etcd-server,etcd-client,redis-server"

log() { printf '[image] %s\n' "$*" >&2; }
die() { printf '[image] error: %s\n' "$*" >&2; exit 1; }

short_hash() { sha256sum | cut -c1-12; }

ensure_base() {
  # The base image is named by what went into it, so a changed package list makes a new one.
  local key tar rootfs
  key="$(printf '%s %s v1' "$SUITE" "$BASE_PACKAGES" | short_hash)"
  BASE="localhost/chainstate-base:$key"
  if podman image exists "$BASE"; then return; fi
  tar="$CACHE/base-$SUITE-$key.tar"
  if [ ! -s "$tar" ]; then
    command -v debootstrap >/dev/null || die "debootstrap is needed (apt-get install debootstrap)"
    rootfs="$CACHE/rootfs-$key.tmp"
    rm -rf "$rootfs"
    log "debootstrap $SUITE with $BASE_PACKAGES (a few minutes, once)"
    debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$rootfs" "$MIRROR" \
      >"$CACHE/debootstrap.log" 2>&1 || die "debootstrap failed: see $CACHE/debootstrap.log"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar --numeric-owner -C "$rootfs" -cf "$tar.tmp" .
    mv "$tar.tmp" "$tar"
    rm -rf "$rootfs"
  fi
  log "importing the base $BASE"
  podman import --quiet \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["/bin/bash"]' \
    "$tar" "$BASE" >/dev/null
}

ensure_wheels() {
  # Wheels of the project's runtime dependencies, named by the dependency list. They are built
  # by the base's own Python (3.11.2), whose markers and tags differ from the host's 3.11.x.
  local key tmp pipconf=()
  tomllib_deps >"$CONTEXT/requirements.txt"
  key="$(short_hash <"$CONTEXT/requirements.txt")"
  WHEELS="$CACHE/wheels-$key"
  if [ -d "$WHEELS" ]; then return; fi
  log "building wheels for the image's Python packages (once per dependency list)"
  tmp="$WHEELS.tmp"
  rm -rf "$tmp"
  # pip's cache of the host: what `./dev` (or any pip here) downloaded is not fetched again
  local pipcache
  pipcache="$(python3 -m pip cache dir 2>/dev/null || echo "$CACHE/pip-cache")"
  mkdir -p "$tmp" "$pipcache"
  cp "$CONTEXT/requirements.txt" "$tmp/requirements.txt"
  # the host's pip configuration (a local index, a mirror) applies inside too
  [ -f /etc/pip.conf ] && pipconf+=(--volume /etc/pip.conf:/etc/pip.conf:ro)
  [ -d /etc/xdg/pip ] && pipconf+=(--volume /etc/xdg/pip:/etc/xdg/pip:ro)
  # and the host's certificate authorities (a TLS-inspecting proxy's among them)
  local ca=/etc/ssl/certs/ca-certificates.crt
  [ -f "$ca" ] && pipconf+=(--volume "$ca:$ca:ro" -e "PIP_CERT=$ca")
  podman run --rm --network host "${pipconf[@]}" \
    -e PIP_INDEX_URL -e PIP_EXTRA_INDEX_URL -e PIP_DEFAULT_TIMEOUT \
    --volume "$tmp:/wheels" --volume "$pipcache:/root/.cache/pip" "$BASE" \
    sh -c 'python3 -m venv /tmp/venv && /tmp/venv/bin/pip wheel -q -w /wheels -r /wheels/requirements.txt' \
    >"$CACHE/wheels.log" 2>&1 || die "pip wheel failed: see $CACHE/wheels.log"
  rm "$tmp/requirements.txt"
  mv "$tmp" "$WHEELS"
}

tomllib_deps() {
  # The runtime dependencies of pyproject.toml, one a line (tomllib: Python 3.11 or newer).
  python3 -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' \
    "$REPO/pyproject.toml"
}

find_anvil() {
  local candidate
  for candidate in "${ANVIL:-}" "$REPO"/.tools/node_modules/@foundry-rs/anvil-linux-*/bin/anvil \
    "$(command -v anvil || true)"; do
    [ -n "$candidate" ] && [ -f "$candidate" ] || continue
    candidate="$(readlink -f "$candidate")"
    # npm's `anvil` on PATH may be a Node.js launcher; the image needs the binary itself
    if [ "$(head -c4 "$candidate" | od -An -c | tr -d ' ')" = '177ELF' ]; then
      echo "$candidate"
      return
    fi
  done
  die "no anvil binary: run ./dev devnet install (npm), or set ANVIL=/path/to/anvil"
}

stage_context() {
  # Only what the image needs: no .venv, data directories, tests or bench.
  mkdir -p "$CONTEXT/app"
  tar -C "$REPO" --exclude=__pycache__ -cf - chainstate proxy nodes stack workspace configs |
    tar -C "$CONTEXT/app" -xf -
  cp "$HERE/entrypoint.py" "$HERE/chainstate.sh" "$CONTEXT/"
  cp "$(find_anvil)" "$CONTEXT/anvil"
}

command -v podman >/dev/null || die "podman is needed (apt-get install podman)"
mkdir -p "$CACHE"
# one build at a time per cache: two would write the same base and wheels
exec 9>"$CACHE/.lock"
flock 9
CONTEXT="$(mktemp -d "$CACHE/context.XXXXXX")"
trap 'rm -rf "$CONTEXT"' EXIT
ensure_base
podman tag "$BASE" localhost/chainstate-base:latest # the Containerfile's default BASE
ensure_wheels
stage_context
log "building $TAG from $BASE"
previous="$(podman image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)"
# what the image was built from, for `podman image inspect`
version="$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' "$REPO/chainstate/__init__.py")"
revision="$(git -C "$REPO" rev-parse HEAD 2>/dev/null || echo unknown)"
git -C "$REPO" diff --quiet HEAD 2>/dev/null || revision="$revision+changes"
podman build --quiet --layers -f "$HERE/Containerfile" --build-arg "BASE=$BASE" \
  --label "org.opencontainers.image.version=$version" \
  --label "org.opencontainers.image.revision=$revision" \
  --volume "$WHEELS:/wheels:ro" -t "$TAG" "$CONTEXT" >/dev/null
# the image this tag named before is left untagged: remove it unless a container uses it
current="$(podman image inspect --format '{{.Id}}' "$TAG")"
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
  podman rmi "$previous" >/dev/null 2>&1 || true
fi
log "built $TAG"
