#!/usr/bin/env bash
# Build the control-plane tools from Go modules into a versioned cache outside the repo.
#
#   tools/build.sh              build (or reuse) and print the bin directory
#   tools/build.sh --print-bin  print the bin directory without building
#   tools/build.sh --print-key  print the cache key
#
# Each subfolder of tools/ is a wrapper Go module (go.mod + go.sum) that requires one
# upstream module; the versions in those go.mod files are the versions built.
#
# The build is split into parts, one per wrapper module (kubernetes, etcd, kwok, helm,
# kueue).
# A part's key hashes what decides its binaries: the Go version and build environment,
# the wrapper's files, and the source of the bash functions that build it (gobuild and
# build_<part> below, printed by `declare -f`). Parts live in <cache>/parts/ and are
# reused by every bin directory that needs them, so changing one part's recipe (say
# helm's -ldflags) rebuilds that part only. The bin directory's key is made of the
# versions, the Go version and a hash of the part keys; it holds hard links to the
# parts' binaries. A changed key builds into a fresh directory; old ones stay usable.
#
# Environment: RLSCHED_TOOLS_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/rlsched/tools),
# GO (default go). Builds use CGO_ENABLED=0, GOTOOLCHAIN=local and -mod=readonly.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
GO="${GO:-go}"
cache_root="${RLSCHED_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rlsched/tools}"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"

# required version of module $2 in wrapper module $1 (read from its go.mod; a module
# build needs every dependency listed there, so this is the version the build resolves)
modver() {
  awk -v m="$2" '$1 == "require" && $2 == m { print $3 } $1 == m && (NF == 2 || $3 == "//") { print $2 }' \
    "$here/$1/go.mod" | head -n1
}

K8S_VERSION="$(modver kubernetes k8s.io/kubernetes)"
ETCD_VERSION="$(modver etcd go.etcd.io/etcd/server/v3)"
KWOK_VERSION="$(modver kwok sigs.k8s.io/kwok)"
HELM_VERSION="$(modver helm helm.sh/helm/v3)"
KUEUE_VERSION="$(modver kueue sigs.k8s.io/kueue)"
for v in K8S_VERSION ETCD_VERSION KWOK_VERSION HELM_VERSION KUEUE_VERSION; do
  [[ -n "${!v}" ]] || { echo "build.sh: cannot read $v from tools/*/go.mod" >&2; exit 1; }
done
GOVERSION_="$("$GO" env GOVERSION)"

# modtime MODULEDIR MODULE: release time of a required module (reproducible build date)
modtime() { (cd "$here/$1" && "$GO" list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' "$2"); }

# gobuild MODULEDIR PARTDIR OUTNAME PACKAGE LDFLAGS: build PACKAGE into PARTDIR/bin.partial
gobuild() {
  local dir="$1" part="$2" out="$3" pkg="$4" ld="$5" t0=$SECONDS
  if [[ -x "$part/bin.partial/$out" ]]; then echo "tools: $out already built" >&2; return 0; fi
  echo "tools: building $out from $pkg ..." >&2
  if ! (cd "$here/$dir" && "$GO" build -trimpath -ldflags "-s -w $ld" -o "$part/bin.partial/$out.tmp" "$pkg") \
      >"$part/logs/$out.log" 2>&1; then
    echo "tools: building $out failed; last lines of $part/logs/$out.log:" >&2
    tail -n 40 "$part/logs/$out.log" >&2
    exit 1
  fi
  mv "$part/bin.partial/$out.tmp" "$part/bin.partial/$out"
  echo "tools: $out built in $((SECONDS - t0)) s" >&2
}

# ---------------------------------------------------------------- the parts' recipes
# build_<part> PARTDIR builds the part's binaries (listed in part_bins) into PARTDIR.

# Kubernetes: the same -X variables hack/lib/version.sh sets, so /version is the release.
build_kubernetes() {
  local part="$1" minor date ld="" pkg cmd
  minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  date="$(modtime kubernetes k8s.io/kubernetes)"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X '$pkg.gitVersion=$K8S_VERSION' -X '$pkg.gitMajor=1' -X '$pkg.gitMinor=$minor'"
    ld+=" -X '$pkg.gitTreeState=clean' -X '$pkg.buildDate=$date'"
  done
  for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    gobuild kubernetes "$part" "$cmd" "k8s.io/kubernetes/cmd/$cmd" "$ld"
  done
}

build_etcd() { gobuild etcd "$1" etcd go.etcd.io/etcd/server/v3 ""; }

build_kwok() {
  local ld="-X 'sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}'"
  ld+=" -X 'sigs.k8s.io/kwok/pkg/consts.KubeVersion=${K8S_VERSION#v}'"
  gobuild kwok "$1" kwok sigs.k8s.io/kwok/cmd/kwok "$ld"
  gobuild kwok "$1" kwokctl sigs.k8s.io/kwok/cmd/kwokctl "$ld"
}

# helm: the variables helm's Makefile sets. Besides its own version, the Kubernetes
# version that `helm template`/`helm lint` assume without a cluster (.Capabilities.
# KubeVersion, the deprecation lint): major = client-go's major + 1, minor = client-go's
# minor, client-go being the one this helm build resolves. Unset, helm says v1.20.
build_helm() {
  local cg major minor ld pkg
  cg="$(modver helm k8s.io/client-go)"
  [[ "$cg" =~ ^v0\.([0-9]+)\. ]] || { echo "build.sh: unexpected k8s.io/client-go version '$cg' in tools/helm/go.mod" >&2; exit 1; }
  major=1 minor="${BASH_REMATCH[1]}"
  ld="-X 'helm.sh/helm/v3/internal/version.version=$HELM_VERSION' -X 'helm.sh/helm/v3/internal/version.gitTreeState=clean'"
  for pkg in helm.sh/helm/v3/pkg/chartutil helm.sh/helm/v3/pkg/lint/rules; do
    ld+=" -X '$pkg.k8sVersionMajor=$major' -X '$pkg.k8sVersionMinor=$minor'"
  done
  gobuild helm "$1" helm helm.sh/helm/v3/cmd/helm "$ld"
}

# kueue: Kueue's controller manager (Kueue interop tests: rlsched_dev.kueue) and, as
# kueue-crds/, the CRDs of the same module version (config/components/crd/bases)
build_kueue() {
  local dir
  gobuild kueue "$1" kueue sigs.k8s.io/kueue/cmd/kueue "-X 'sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION'"
  dir="$(cd "$here/kueue" && "$GO" list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
  rm -rf "$1/bin.partial/kueue-crds"
  cp -r "$dir/config/components/crd/bases" "$1/bin.partial/kueue-crds"
  chmod -R u+w "$1/bin.partial/kueue-crds"
}

part_bins() {
  case "$1" in
    kubernetes) echo kube-apiserver kube-controller-manager kube-scheduler kubectl ;;
    etcd) echo etcd ;;
    kwok) echo kwok kwokctl ;;
    helm) echo helm ;;
    kueue) echo kueue kueue-crds ;;
  esac
}
part_version() {
  case "$1" in kubernetes) echo "$K8S_VERSION" ;; etcd) echo "$ETCD_VERSION" ;; kwok) echo "$KWOK_VERSION" ;; helm) echo "$HELM_VERSION" ;; kueue) echo "$KUEUE_VERSION" ;; esac
}
# version variables a recipe reads besides its own wrapper's go.mod
part_inputs() { case "$1" in kwok) echo K8S_VERSION ;; esac; }
parts=(kubernetes etcd kwok helm kueue)

# part_dir PART: <cache>/parts/<part>-<version>-<hash of its recipe and inputs>
part_dir() {
  local p="$1" v h
  h="$({
    printf '%s\n' "$GOVERSION_" "CGO_ENABLED=$CGO_ENABLED GOFLAGS=$GOFLAGS GOTOOLCHAIN=$GOTOOLCHAIN"
    declare -f modver modtime gobuild "build_$p"
    for v in $(part_inputs "$p"); do printf '%s=%s\n' "$v" "${!v}"; done
    cd "$here/$p" && cat go.mod go.sum tools.go
  } | sha256sum | cut -c1-10)"
  echo "$cache_root/parts/$p-$(part_version "$p")-$h"
}

cache_key() {
  local p digest
  digest="$(for p in "${parts[@]}"; do basename "$(part_dir "$p")"; done | sha256sum | cut -c1-10)"
  echo "k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_kueue-${KUEUE_VERSION}_${GOVERSION_}_${digest}"
}

key="$(cache_key)"
dest="$cache_root/$key"
case "${1:-}" in
  --print-key) echo "$key"; exit 0 ;;
  --print-bin) echo "$dest/bin"; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--print-bin|--print-key]" >&2; exit 2 ;;
esac

# complete DIR BIN...: every BIN is an executable in DIR
complete() { local d="$1" b; shift; for b in "$@"; do [[ -x "$d/$b" ]] || return 1; done; }
want=()
for p in "${parts[@]}"; do read -ra bins <<<"$(part_bins "$p")"; want+=("${bins[@]}"); done

if complete "$dest/bin" "${want[@]}"; then
  echo "tools: reusing $dest/bin" >&2
  echo "$dest/bin"
  exit 0
fi

mkdir -p "$cache_root/parts"
# One builder per key at a time; others wait and then reuse its result.
exec 9>"$cache_root/$key.lock"
if ! flock -n 9; then
  echo "tools: another build of $key is running; waiting for it" >&2
  flock 9
fi
if complete "$dest/bin" "${want[@]}"; then echo "$dest/bin"; exit 0; fi
start=$SECONDS

# build_part PART: build (or reuse) the part; one builder per part (bin dirs of other
# keys may share it)
build_part() {
  local p="$1" dir bins t0=$SECONDS
  dir="$(part_dir "$p")"
  read -ra bins <<<"$(part_bins "$p")"
  if complete "$dir/bin" "${bins[@]}"; then echo "tools: reusing part $(basename "$dir")" >&2; return 0; fi
  exec 8>"$dir.lock"
  flock 8
  if ! complete "$dir/bin" "${bins[@]}"; then
    mkdir -p "$dir/bin.partial" "$dir/logs"
    "build_$p" "$dir"
    rm -rf "$dir/bin"
    mv "$dir/bin.partial" "$dir/bin"
    echo "tools: part $(basename "$dir") built in $((SECONDS - t0)) s" >&2
  fi
  exec 8>&-
}

stage="$dest/bin.partial"
rm -rf "$stage"
mkdir -p "$stage"
for p in "${parts[@]}"; do
  build_part "$p"
  dir="$(part_dir "$p")"
  for b in $(part_bins "$p"); do
    if [[ -d "$dir/bin/$b" ]]; then cp -rp "$dir/bin/$b" "$stage/$b"; continue; fi
    ln -f "$dir/bin/$b" "$stage/$b" 2>/dev/null || cp -p "$dir/bin/$b" "$stage/$b"
  done
done

rm -rf "$dest/bin"
mv "$stage" "$dest/bin"
ln -sfn "$key" "$cache_root/current.tmp.$$" && mv -T "$cache_root/current.tmp.$$" "$cache_root/current"
echo "tools: ${#want[@]} binaries in $dest/bin ($((SECONDS - start)) s)" >&2
echo "$dest/bin"
