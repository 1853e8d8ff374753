#!/bin/sh
# Build stargz-grpc (see main.go) offline from Debian's golang-*-dev packages
# (GOPATH mode over /usr/share/gocode). Installs nothing; the packages it needs
# are listed in APT_PACKAGES next to this script.
# Usage: build.sh OUTPUT_PATH
set -eu
if [ $# -ne 1 ]; then
    echo "usage: $0 OUTPUT_PATH" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
case "$1" in /*) out=$1 ;; *) out=$(pwd)/$1 ;; esac

if ! command -v go >/dev/null 2>&1; then
    echo "build.sh: 'go' not found; apt-get install $(tr '\n' ' ' < "$here/APT_PACKAGES")" >&2
    exit 1
fi
if [ ! -d /usr/share/gocode/src/github.com/containerd/stargz-snapshotter/fs ]; then
    echo "build.sh: stargz-snapshotter Go sources missing under /usr/share/gocode;" \
         "apt-get install $(tr '\n' ' ' < "$here/APT_PACKAGES")" >&2
    exit 1
fi
go version

export GO111MODULE=off GOPATH=/usr/share/gocode GOPROXY=off GOFLAGS= GOTOOLCHAIN=local
export GOCACHE="${GOCACHE:-${XDG_CACHE_HOME:-${HOME:-/tmp}/.cache}/stargz-grpc-gocache}"
mkdir -p "$(dirname "$out")"
cd "$here"
if ! go build -trimpath -o "$out" .; then
    echo "build.sh: FAILED to build stargz-grpc from Debian's Go packages" \
         "(needs: $(tr '\n' ' ' < "$here/APT_PACKAGES"))" >&2
    exit 1
fi
echo "built $out"
