#!/usr/bin/env bash
# Lints the GitHub Actions workflows (.github/workflows/*.yml) with actionlint, built once from its Go
# module at a pinned version into ~/.cache/oculis-tools/actionlint-<version> (the pattern of e2e/build.sh:
# a cache folder keyed by the version, reused when present). `make lint` runs it.
set -euo pipefail
VERSION=v1.7.12
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DEST="${OCULIS_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/oculis-tools}/actionlint-$VERSION"
if [ ! -x "$DEST/bin/actionlint" ]; then
  command -v go >/dev/null || { echo "actionlint: Go not found; install Go >= 1.26 (https://go.dev/dl) to lint the workflows" >&2; exit 1; }
  echo "actionlint: building github.com/rhysd/actionlint $VERSION into $DEST" >&2
  mkdir -p "$DEST/bin"
  GOBIN="$DEST/bin" GOFLAGS="-buildvcs=false" go install -trimpath -ldflags "-s -w" \
    "github.com/rhysd/actionlint/cmd/actionlint@$VERSION" >&2
fi
"$DEST/bin/actionlint" -no-color .github/workflows/*.yml
echo "actionlint: .github/workflows ok"
