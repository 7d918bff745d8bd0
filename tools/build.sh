#!/usr/bin/env bash
# Build the control-plane tools from Go modules into a versioned cache outside the repo.
#
#   tools/build.sh              build (or reuse) and print the bin directory
#   tools/build.sh --print-bin  print the bin directory without building
#   tools/build.sh --print-key  print the cache key
#
# Each subfolder of tools/ is a wrapper Go module (go.mod + go.sum) that requires one
# upstream module; the versions in those go.mod files are the versions built. The cache
# key is made of those versions, the Go version and a hash of the wrapper files, so a
# change to any of them builds into a fresh directory and old builds stay usable.
#
# Environment: RLSCHED_TOOLS_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/rlsched/tools),
# GO (default go). Builds use CGO_ENABLED=0, GOTOOLCHAIN=local and -mod=readonly.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
GO="${GO:-go}"
cache_root="${RLSCHED_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rlsched/tools}"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"

# required version of module $2 in wrapper module $1 (read from its go.mod)
modver() { awk -v m="$2" '$1 == "require" && $2 == m { print $3 } $1 == m && NF == 2 { print $2 }' "$here/$1/go.mod" | head -n1; }

K8S_VERSION="$(modver kubernetes k8s.io/kubernetes)"
ETCD_VERSION="$(modver etcd go.etcd.io/etcd/server/v3)"
KWOK_VERSION="$(modver kwok sigs.k8s.io/kwok)"
HELM_VERSION="$(modver helm helm.sh/helm/v3)"
for v in K8S_VERSION ETCD_VERSION KWOK_VERSION HELM_VERSION; do
  [[ -n "${!v}" ]] || { echo "build.sh: cannot read $v from tools/*/go.mod" >&2; exit 1; }
done

cache_key() {
  local gover digest
  gover="$("$GO" env GOVERSION)"
  digest="$(cd "$here" && cat build.sh */go.mod */go.sum */tools.go | sha256sum | cut -c1-10)"
  echo "k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}_helm-${HELM_VERSION}_${gover}_${digest}"
}

key="$(cache_key)"
dest="$cache_root/$key"
case "${1:-}" in
  --print-key) echo "$key"; exit 0 ;;
  --print-bin) echo "$dest/bin"; exit 0 ;;
  "") ;;
  *) echo "usage: $0 [--print-bin|--print-key]" >&2; exit 2 ;;
esac

want=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok kwokctl helm)
complete() { local b; for b in "${want[@]}"; do [[ -x "$dest/bin/$b" ]] || return 1; done; }

if complete; then
  echo "tools: reusing $dest/bin" >&2
  echo "$dest/bin"
  exit 0
fi

mkdir -p "$cache_root"
# One builder per key at a time; others wait and then reuse its result.
exec 9>"$cache_root/$key.lock"
if ! flock -n 9; then
  echo "tools: another build of $key is running; waiting for it" >&2
  flock 9
fi
if complete; then echo "$dest/bin"; exit 0; fi

stage="$dest/bin.partial"
mkdir -p "$stage" "$dest/logs"
start=$SECONDS

# modtime MODULEDIR MODULE: release time of a required module (reproducible build date)
modtime() { (cd "$here/$1" && "$GO" list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' "$2"); }

# gobuild MODULEDIR OUTNAME PACKAGE LDFLAGS
gobuild() {
  local dir="$1" out="$2" pkg="$3" ld="$4" t0=$SECONDS
  if [[ -x "$stage/$out" ]]; then echo "tools: $out already built" >&2; return 0; fi
  echo "tools: building $out from $pkg ..." >&2
  if ! (cd "$here/$dir" && "$GO" build -trimpath -ldflags "-s -w $ld" -o "$stage/$out.tmp" "$pkg") \
      >"$dest/logs/$out.log" 2>&1; then
    echo "tools: building $out failed; last lines of $dest/logs/$out.log:" >&2
    tail -n 40 "$dest/logs/$out.log" >&2
    exit 1
  fi
  mv "$stage/$out.tmp" "$stage/$out"
  echo "tools: $out built in $((SECONDS - t0)) s" >&2
}

# Kubernetes: the same -X variables hack/lib/version.sh sets, so /version is the release.
k8s_minor="${K8S_VERSION#v1.}"; k8s_minor="${k8s_minor%%.*}"
k8s_date="$(modtime kubernetes k8s.io/kubernetes)"
k8s_ld=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  k8s_ld+=" -X '$pkg.gitVersion=$K8S_VERSION' -X '$pkg.gitMajor=1' -X '$pkg.gitMinor=$k8s_minor'"
  k8s_ld+=" -X '$pkg.gitTreeState=clean' -X '$pkg.buildDate=$k8s_date'"
done
for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
  gobuild kubernetes "$cmd" "k8s.io/kubernetes/cmd/$cmd" "$k8s_ld"
done

gobuild etcd etcd go.etcd.io/etcd/server/v3 ""

kwok_ld="-X 'sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}'"
kwok_ld+=" -X 'sigs.k8s.io/kwok/pkg/consts.KubeVersion=${K8S_VERSION#v}'"
gobuild kwok kwok sigs.k8s.io/kwok/cmd/kwok "$kwok_ld"
gobuild kwok kwokctl sigs.k8s.io/kwok/cmd/kwokctl "$kwok_ld"

gobuild helm helm helm.sh/helm/v3/cmd/helm "-X 'helm.sh/helm/v3/internal/version.version=$HELM_VERSION' -X 'helm.sh/helm/v3/internal/version.gitTreeState=clean'"

rm -rf "$dest/bin"
mv "$stage" "$dest/bin"
ln -sfn "$key" "$cache_root/current.tmp.$$" && mv -T "$cache_root/current.tmp.$$" "$cache_root/current"
echo "tools: built ${#want[@]} binaries in $((SECONDS - start)) s" >&2
echo "$dest/bin"
