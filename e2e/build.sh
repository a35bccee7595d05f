#!/usr/bin/env bash
# Builds the local control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl, kwok, helm) from Go modules into a cache directory keyed by every pinned version.
# Prints that directory on stdout (last line). Reuses it when it is complete.
#
# Why wrapper modules: k8s.io/kubernetes and etcd's server module carry replace directives, so
# `go install pkg@version` refuses them; a small module of ours that *requires* them builds fine
# (see ../shared/notes/control-plane.md, verified in this script's first run).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=versions.env
source "$HERE/versions.env"

die() { echo "e2e/build: $*" >&2; exit 1; }
command -v go >/dev/null || die "Go toolchain not found; install Go >= 1.26 (https://go.dev/dl) and put it on PATH"

CACHE_ROOT="${OCULIS_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/oculis-e2e}"
KEY="k8s-v${K8S_VERSION}_etcd-v${ETCD_VERSION}_kwok-v${KWOK_VERSION}_helm-v${HELM_VERSION}"
DEST="$CACHE_ROOT/$KEY"
BINS="etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok helm"

complete() { for b in $BINS; do [ -x "$DEST/bin/$b" ] || return 1; done; }
if complete; then echo "$DEST"; exit 0; fi

mkdir -p "$DEST/bin"
export CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=mod"
STAMP_DATE="2026-01-01T00:00:00Z"
start=$(date +%s)
log() { echo "e2e/build: $*" >&2; }

build_k8s() {
  local mod="$HERE/gobuild/k8s" sv="v0.${K8S_VERSION#1.}" minor
  minor=$(echo "$K8S_VERSION" | cut -d. -f2)
  cd "$mod"
  if ! grep -q "k8s.io/kubernetes v${K8S_VERSION}" go.mod 2>/dev/null; then
    log "generating wrapper module for Kubernetes v${K8S_VERSION}"
    rm -f go.mod go.sum
    go mod init example.invalid/oculis/k8sbin >/dev/null 2>&1
    local kkmod
    kkmod=$(go mod download -json "k8s.io/kubernetes@v${K8S_VERSION}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["GoMod"])')
    # Every staging module k/k requires at v0.0.0 maps to its published v0.X.Y tag.
    for m in $(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$kkmod"); do
      go mod edit -replace="$m=$m@$sv"
    done
    go get -tool $(for c in kube-apiserver kube-controller-manager kube-scheduler kubectl; do echo "k8s.io/kubernetes/cmd/$c@v${K8S_VERSION}"; done) >&2
    go mod tidy >&2
  fi
  local ldf="-s -w -buildid="
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldf="$ldf -X $pkg.gitVersion=v${K8S_VERSION} -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor} -X $pkg.gitTreeState=clean -X $pkg.buildDate=${STAMP_DATE}"
  done
  log "building kube-apiserver kube-controller-manager kube-scheduler kubectl (slow when cold)"
  go build -trimpath -tags selinux,notest -ldflags "$ldf" -o "$DEST/bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl
}

build_etcd() {
  local mod="$HERE/gobuild/etcd"
  cd "$mod"
  if ! grep -q "go.etcd.io/etcd/server/v3 v${ETCD_VERSION}" go.mod 2>/dev/null; then
    log "generating wrapper module for etcd v${ETCD_VERSION}"
    rm -f go.mod go.sum
    go mod init example.invalid/oculis/etcdbin >/dev/null 2>&1
    go get -tool "go.etcd.io/etcd/server/v3@v${ETCD_VERSION}" >&2
    go mod tidy >&2
  fi
  log "building etcd"
  go build -trimpath -ldflags "-s -w" -o "$DEST/bin/etcd" go.etcd.io/etcd/server/v3
}

build_plain() {
  log "building kwok v${KWOK_VERSION} and helm v${HELM_VERSION}"
  local hv="v${HELM_VERSION}" kminor
  kminor=$(echo "$K8S_VERSION" | cut -d. -f2)
  GOBIN="$DEST/bin" GOFLAGS="-buildvcs=false" go install -trimpath -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=v${KWOK_VERSION}" "sigs.k8s.io/kwok/cmd/kwok@v${KWOK_VERSION}"
  # helm stamps its version and default KubeVersion through ldflags (helm's Makefile).
  GOBIN="$DEST/bin" GOFLAGS="-buildvcs=false" go install -trimpath -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${hv} -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=${kminor}" "helm.sh/helm/v3/cmd/helm@${hv}"
}

mkdir -p "$HERE/gobuild/k8s" "$HERE/gobuild/etcd"
for step in build_etcd build_plain build_k8s; do
  case $step in
    build_etcd) [ -x "$DEST/bin/etcd" ] && continue ;;
    build_plain) [ -x "$DEST/bin/kwok" ] && [ -x "$DEST/bin/helm" ] && continue ;;
    build_k8s) [ -x "$DEST/bin/kube-apiserver" ] && [ -x "$DEST/bin/kubectl" ] && [ -x "$DEST/bin/kube-scheduler" ] && [ -x "$DEST/bin/kube-controller-manager" ] && continue ;;
  esac
  ( $step ) || die "$step failed (see the Go output above); fix: check network access to the Go module proxy (go env GOPROXY) and disk space, then rerun e2e/build.sh"
done
complete || die "build finished but binaries are missing in $DEST/bin"
log "built in $(( $(date +%s) - start ))s into $DEST"
echo "$DEST"
