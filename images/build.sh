#!/usr/bin/env bash
# `make images`: the operator and router images from Dockerfile.operator and Dockerfile.runtime, built
# with no Docker engine and no registry, as OCI image-layout archives:
#   build/images/oculis-operator.oci.tar, build/images/oculis-router.oci.tar  (+ <name>.cdx.json SBOMs)
# Steps, each skipped when its inputs are unchanged (the script says so):
#   1. base root filesystems from Debian bookworm's packages (mmdebstrap --variant=minbase), cached under
#      build/images-cache by their package list, and imported as local images (buildah from scratch + add);
#   2. a pip configuration for the builds: this machine's CA bundle, index and proxy;
#   3. `buildah bud --isolation chroot` of each Dockerfile with BASE/BUILD_BASE set to those bases and the
#      org.opencontainers.image.* labels, pushed to an oci-archive; the digest is printed;
#   4. a CycloneDX SBOM from each image's own site-packages (cyclonedx-py environment), and its sizes.
# Environment: OCULIS_IMAGES_DIR (default build/images), OCULIS_IMAGES_CACHE (default build/images-cache),
# PYTHON (default .venv/bin/python: its cyclonedx-py writes the SBOMs).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OCULIS_IMAGES_DIR:-$ROOT/build/images}"
CACHE="${OCULIS_IMAGES_CACHE:-$ROOT/build/images-cache}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
SUITE=bookworm
# One package list per base; the cache key is the list itself (plus suite and variant).
BUILD_PACKAGES="python3,python3-venv"
RUNTIME_PACKAGES="python3,ca-certificates"
# merged-usr hook: /usr merged by mmdebstrap itself, so the usrmerge package (and with it perl, ~45 MB) stays
# out. Documentation, manual pages and translations are left out: nothing in an image reads them.
MMDEBSTRAP_OPTS=(--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*')
# mmdebstrap reads this machine's apt sources on Debian (its mirror, proxy or snapshot); elsewhere (an
# Ubuntu runner) Debian's own mirror. OCULIS_DEBIAN_MIRROR overrides both.
MIRROR=()
if [ -n "${OCULIS_DEBIAN_MIRROR:-}" ]; then MIRROR=("$OCULIS_DEBIAN_MIRROR")
elif ! grep -qx 'ID=debian' /etc/os-release 2>/dev/null; then MIRROR=(http://deb.debian.org/debian); fi
SOURCE_URL="https://github.com/oculis/oculis"
start=$(date +%s)

say() { echo "images: $*"; }
die() { echo "images: $*" >&2; exit 1; }

# ---------------------------------------------------------------------------------------------- tools
missing=()
command -v buildah >/dev/null || missing+=(buildah)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v umoci >/dev/null || missing+=(umoci)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "${CI:-}" = "true" ]; then
    say "apt-get install ${missing[*]} (CI=true)"
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    die "missing ${missing[*]}: install the Debian packages with \`apt-get install ${missing[*]}\` and rerun"
  fi
fi
[ "$(id -u)" -eq 0 ] || die "buildah --isolation chroot and mmdebstrap need root here; rerun as root (sudo make images)"
[ -x "$PYTHON" ] || die "no $PYTHON: run \`make install\` first (its cyclonedx-py writes the SBOMs)"
[ -x "$(dirname "$PYTHON")/cyclonedx-py" ] || die "no cyclonedx-py beside $PYTHON: run \`make install\` (cyclonedx-bom is in the dev extra)"

mkdir -p "$OUT" "$CACHE"
VERSION=$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
LICENSES=$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["license"])')
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)

# ---------------------------------------------------------------------------------------------- bases
# base NAME PACKAGES -> prints the local image name of a minbase root filesystem with PACKAGES.
base() {
  local name=$1 packages=$2 key tar image
  key=$(printf '%s\n' "$SUITE" minbase "$packages" "${MMDEBSTRAP_OPTS[@]}" "${MIRROR[@]}" | sha256sum | cut -c1-16)
  tar="$CACHE/base-$name-$key.tar"
  image="localhost/oculis-base-$name:$key"
  if [ -s "$tar" ]; then
    say "base $name: $packages unchanged, reusing $tar" >&2
  else
    say "base $name: mmdebstrap --variant=minbase --include=$packages $SUITE (about a minute)" >&2
    local t0=$(date +%s)
    # The downloaded .debs are kept in $CACHE/debs and shared by both bases (the second downloads little).
    mkdir -p "$CACHE/debs"
    if ! mmdebstrap --variant=minbase --include="$packages" --format=tar "${MMDEBSTRAP_OPTS[@]}" \
        --skip=essential/unlink --setup-hook='mkdir -p "$1"/var/cache/apt/archives/' \
        --setup-hook="sync-in $CACHE/debs /var/cache/apt/archives/" \
        --customize-hook="sync-out /var/cache/apt/archives $CACHE/debs" \
        "$SUITE" "$tar.part" "${MIRROR[@]}" >"$CACHE/mmdebstrap-$name.log" 2>&1; then
      rm -f "$tar.part"
      die "base $name: mmdebstrap could not build Debian $SUITE from its packages (no Debian mirror reachable?); log: $CACHE/mmdebstrap-$name.log"
    fi
    mv "$tar.part" "$tar"
    say "base $name: built in $(( $(date +%s) - t0 ))s" >&2
  fi
  if buildah inspect --type image "$image" >/dev/null 2>&1; then
    say "base $name: image $image already imported" >&2
  else
    local ctr
    ctr=$(buildah from scratch)
    buildah add --quiet "$ctr" "$tar" / >/dev/null
    buildah commit --quiet --rm "$ctr" "$image" >/dev/null
    say "base $name: imported as $image" >&2
  fi
  echo "$image"
}
BUILD_BASE=$(base build "$BUILD_PACKAGES")
RUNTIME_BASE=$(base runtime "$RUNTIME_PACKAGES")

# ---------------------------------------------------------------------------------------------- pip
# pip inside the builds reads $CACHE/pip/pip.conf (PIP_CONFIG_FILE, mounted at /tmp/pip: buildah leaves
# the mount point, an empty folder, in each RUN layer, and /tmp is where the pods mount an emptyDir), so it
# reaches PyPI the way this machine's pip does (CA bundle, a TLS-intercepting proxy's included; index;
# proxy). The dependencies' layer is reused (buildah --layers) until pyproject.toml changes.
PIPDIR="$CACHE/pip"
mkdir -p "$PIPDIR"
{
  echo "[global]"
  ca="${PIP_CERT:-${REQUESTS_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}}"
  if [ -s "$ca" ]; then cp "$ca" "$PIPDIR/ca.crt"; echo "cert = /tmp/pip/ca.crt"; fi
  [ -z "${PIP_INDEX_URL:-}" ] || echo "index-url = $PIP_INDEX_URL"
  proxy="${PIP_PROXY:-${HTTPS_PROXY:-${https_proxy:-}}}"
  [ -z "$proxy" ] || echo "proxy = $proxy"
} >"$PIPDIR/pip.conf"

# ---------------------------------------------------------------------------------------------- images
# inputs DOCKERFILE -> a hash of everything the build reads: the Dockerfile, the tracked and untracked
# files of the folders it copies, the bases, pip's configuration and the labels.
inputs() {
  local dockerfile=$1 paths
  paths=$(awk '$1 == "COPY" && $2 !~ /^--from/ {for (i = 2; i < NF; i++) print $i}' "$dockerfile")
  {
    echo "$dockerfile $BUILD_BASE $RUNTIME_BASE $VERSION $REVISION $LICENSES"
    sha256sum "$dockerfile" .dockerignore "$PIPDIR/pip.conf"
    # shellcheck disable=SC2086
    git ls-files -co --exclude-standard -- $paths | LC_ALL=C sort | xargs -d '\n' sha256sum
  } | sha256sum | cut -c1-16
}

# build NAME DOCKERFILE
build() {
  local name=$1 dockerfile=$2 archive="$OUT/$1.oci.tar" key image="localhost/$1:$VERSION" t0
  key=$(inputs "$dockerfile")
  if [ -s "$archive" ] && [ "$(cat "$OUT/$name.inputs" 2>/dev/null)" = "$key" ] && [ -s "$OUT/$name.cdx.json" ]; then
    say "$name: inputs unchanged, reusing $archive ($(cat "$OUT/$name.digest"))"
    return
  fi
  t0=$(date +%s)
  say "$name: buildah bud -f $dockerfile (BASE=$RUNTIME_BASE, BUILD_BASE=$BUILD_BASE)"
  buildah bud --quiet --isolation chroot --layers --force-rm -f "$dockerfile" \
    --build-arg BASE="$RUNTIME_BASE" --build-arg BUILD_BASE="$BUILD_BASE" \
    --build-arg PIP_CONFIG_FILE=/tmp/pip/pip.conf -v "$PIPDIR:/tmp/pip" \
    -t "$image" . >/dev/null \
    || die "$name: buildah bud -f $dockerfile failed (see above)"
  # The labels go on after the build, onto the built image: with `bud --label` (or a LABEL of build args)
  # buildah 1.28 either rebuilds every layer for a new commit or reuses a cached LABEL step with the old
  # commit's values.
  local ctr
  ctr=$(buildah from --quiet --pull-never "$image")
  buildah config --label org.opencontainers.image.title="$name" \
    --label org.opencontainers.image.source="$SOURCE_URL" \
    --label org.opencontainers.image.revision="$REVISION" \
    --label org.opencontainers.image.version="$VERSION" \
    --label org.opencontainers.image.licenses="$LICENSES" "$ctr"
  buildah commit --quiet --rm "$ctr" "$image" >/dev/null
  rm -f "$archive" "$OUT/$name.inputs"
  buildah push --quiet --digestfile "$OUT/$name.digest" "$image" "oci-archive:$archive:$VERSION" >/dev/null \
    || die "$name: buildah push to oci-archive:$archive failed"
  sbom "$name" "$archive"
  echo "$key" >"$OUT/$name.inputs"
  say "$name: built in $(( $(date +%s) - t0 ))s: $archive $(cat "$OUT/$name.digest")"
}

# sbom NAME ARCHIVE: unpack the image (umoci), write its CycloneDX SBOM from its own virtualenv and print
# its sizes.
sbom() {
  local name=$1 archive=$2 work
  work=$(mktemp -d "$CACHE/unpack.XXXXXX")
  mkdir "$work/layout"
  tar -xf "$archive" -C "$work/layout"
  umoci unpack --image "$work/layout:$VERSION" "$work/bundle" >/dev/null
  # The image's venv python is a link to its /usr/bin/python3, which is also bookworm's 3.11 here; run
  # with the venv's pyvenv.cfg it sees exactly the image's site-packages.
  "$(dirname "$PYTHON")/cyclonedx-py" environment --output-reproducible --of JSON -o "$OUT/$name.cdx.json" \
    "$work/bundle/rootfs/opt/oculis" \
    || die "$name: cyclonedx-py environment could not read the image's site-packages"
  say "$name: SBOM $OUT/$name.cdx.json; rootfs $(( $(du -sb "$work/bundle/rootfs" | cut -f1) / 1048576 )) MiB, archive $(( $(stat -c %s "$archive") / 1048576 )) MiB"
  rm -rf "$work"
}

build oculis-operator Dockerfile.operator
build oculis-router Dockerfile.runtime
say "done in $(( $(date +%s) - start ))s (version $VERSION, revision $REVISION)"
