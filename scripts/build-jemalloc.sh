#!/usr/bin/env bash
# build-jemalloc.sh DEST - builds the jemalloc that libcuheap.so carries for its
# pinned host memory cache, into DEST/include and DEST/lib/libjemalloc_pic.a.
#
# The source is Debian's jemalloc 5.3.0 (the orig tarball of the bookworm
# package, checked against the package's SHA-256), fetched from the Debian
# mirror apt uses. Debian's own libjemalloc_pic.a cannot be used: it is built
# with initial-exec thread-local storage, which a library that PyTorch loads
# with dlopen after start-up may not have ("cannot allocate memory in static
# TLS block"). So it is configured here with:
#   --with-jemalloc-prefix=cuh_je_   every function is cuh_je_*: the program's
#                                    malloc stays glibc's;
#   --disable-initial-exec-tls       global-dynamic TLS: dlopen works;
#   --disable-cache-oblivious         no random page of padding per large
#                                    allocation: page-locked memory is dear;
#   --with-private-namespace, --with-pic, static only, no C++, no profiling.
# Takes about a minute on two cores; done once per build folder.
set -euo pipefail

dest=${1:?usage: build-jemalloc.sh DEST}
version=5.3.0
tarball=jemalloc_${version}.orig.tar.bz2
sha256=2db82d1e7119df3e71b7640219b6dfe84789bc0537983c3b7ac4f7189aecfeaa

if [ -f "$dest/lib/libjemalloc_pic.a" ] && [ -f "$dest/include/jemalloc/jemalloc.h" ]; then
    exit 0
fi

# The mirror apt is configured with, else Debian's own.
mirror=$(grep -rhoE 'https?://[^ ]*/debian/?( |$)' /etc/apt/sources.list /etc/apt/sources.list.d 2>/dev/null |
         head -n1 | tr -d ' ' || true)
mirror=${mirror:-http://deb.debian.org/debian}
mirror=${mirror%/}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
url="$mirror/pool/main/j/jemalloc/$tarball"
echo "build-jemalloc: fetching $url" >&2
if ! curl -sSfL --retry 3 -o "$work/$tarball" "$url"; then
    echo "build-jemalloc: cannot download $url; put $tarball (sha256 $sha256) in $work's place by hand" >&2
    exit 1
fi
if ! echo "$sha256  $work/$tarball" | sha256sum -c --quiet -; then
    echo "build-jemalloc: $tarball does not have the expected SHA-256 $sha256" >&2
    exit 1
fi
tar -xjf "$work/$tarball" -C "$work"
src="$work/jemalloc-$version"
echo "build-jemalloc: configuring and building jemalloc $version into $dest (about a minute)" >&2
(
    cd "$src"
    ./configure --prefix="$work/install" --with-jemalloc-prefix=cuh_je_ --with-private-namespace=cuh_je_internal_ \
        --disable-initial-exec-tls --disable-cxx --disable-shared --with-pic --disable-prof \
        --disable-libdl --disable-stats --disable-fill --disable-utrace --disable-log --disable-cache-oblivious \
        CC="${CC:-gcc}" CFLAGS="-O2" >"$work/configure.log" 2>&1 ||
        { tail -20 "$work/configure.log" >&2; exit 1; }
    make -j"$(nproc)" build_lib_static >"$work/make.log" 2>&1 || { tail -20 "$work/make.log" >&2; exit 1; }
)
mkdir -p "$dest/lib" "$dest/include/jemalloc"
# Without debug information: 0.8 MiB instead of 38 (it travels to GPU machines).
strip --strip-debug -o "$dest/lib/libjemalloc_pic.a" "$src/lib/libjemalloc_pic.a"
cp "$src/include/jemalloc/jemalloc.h" "$dest/include/jemalloc/"
cp "$src/COPYING" "$dest/COPYING"
echo "build-jemalloc: done" >&2
