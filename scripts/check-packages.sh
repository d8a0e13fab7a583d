#!/usr/bin/env bash
# Installs and uses what scripts/package.sh makes, the way a user without a Swift toolchain
# would (root or sudo: it installs and removes the Debian packages):
#   bash scripts/check-packages.sh [DIR]
# DIR: the artifacts of an earlier `bash scripts/package.sh DIR`; without it they are built
# into a temporary directory (the release builds are Bindings/install.sh's: after the test
# command's install of the library they are reused, nothing is compiled twice).
# Checks:
#   - lintian on the three .debs: no error (warnings, info and overrides are printed); the
#     symbols file names the header's functions, all the packaged library's dynamic symbols;
#   - dpkg -i of the three; with the toolchain out of PATH and of the library search path
#     (env -i PATH=/usr/bin:/bin): a C host built with `cc host.c $(pkg-config --cflags --libs
#     sessionflow)` runs and loads /usr/lib/…/libsessionflow.so.MAJOR, `watch-session
#     --version`, `man -w watch-session`, the bash completion (`complete -p watch-session` after
#     sourcing it, and it completes a subcommand); then dpkg -r of the three leaves nothing of
#     their `dpkg -L` listings behind (the packages are removed on failure too);
#   - the wheel: `auditwheel show` names its manylinux tag, its metadata (License-Expression
#     Apache-2.0, Requires-Python); it installs into a fresh venv, and there `import
#     sessionflow; sessionflow.Runtime()` signs in and out with the system's libuv and libcurl
#     hidden (unshare --mount, an empty file bind-mounted over each), the bundled copies the
#     ones loaded (/proc/self/maps); it imports and signs in on every other Python >= 3.9 the
#     machine has;
#   - the archive unpacks into a temporary prefix; a C host builds against it with
#     PKG_CONFIG_PATH alone and runs; its watch-session runs; it holds LICENSE, the man page
#     and the completions.
# Prints the size of each artifact.
source "$(dirname "$0")/setup.sh"
root=$PWD
packages=(watch-session libsessionflow-dev libsessionflow0)

for package in "${packages[@]}"; do
    if dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q installed; then
        echo "check-packages: $package is installed already; remove it first (dpkg -r ${packages[*]})" >&2
        exit 1
    fi
done
command -v lintian >/dev/null 2>&1 || apt_install lintian
command -v man >/dev/null 2>&1 || apt_install man-db
command -v cc >/dev/null 2>&1 || apt_install gcc

work=$(mktemp -d "${TMPDIR:-/tmp}/sessionflow-check-packages.XXXXXX")
installed=0
cleanup() {
    if [ "$installed" -eq 1 ]; then
        # (A dpkg interrupted with this script may still hold its lock for a moment.)
        local attempt
        for attempt in $(seq 1 60); do
            if as_root dpkg -r "${packages[@]}" >"$work/cleanup.log" 2>&1; then break; fi
            if [ "$attempt" -eq 60 ]; then
                echo "check-packages: dpkg -r ${packages[*]} failed: $(tail -n 1 "$work/cleanup.log")" >&2
            fi
            sleep 1
        done
    fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM # (the EXIT trap then removes the packages)

out=${1:-}
if [ -z "$out" ]; then
    out=$work/out
    bash scripts/package.sh "$out"
fi
version=$(bash scripts/version.sh)
major=${version%%.*}
arch=$(dpkg --print-architecture)
debs=()
for package in libsessionflow$major libsessionflow-dev watch-session; do
    deb=$(ls "$out/${package}_${version}-"*"_$arch.deb" 2>/dev/null | head -n 1)
    [ -n "$deb" ] || { echo "check-packages: no $package .deb of $version in $out" >&2; exit 1; }
    debs+=("$deb")
done
wheel=$(ls "$out"/sessionflow-"$version"-*manylinux*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || { echo "check-packages: no manylinux wheel of $version in $out" >&2; exit 1; }
archive=$out/sessionflow-$version-linux-$(uname -m).tar.gz
[ -f "$archive" ] || { echo "check-packages: no $archive" >&2; exit 1; }
echo "== artifacts"
for artifact in "${debs[@]}" "$wheel" "$archive"; do
    printf '%10d bytes (%5.1f MiB)  %s\n' "$(stat -c %s "$artifact")" \
        "$(awk -v b="$(stat -c %s "$artifact")" 'BEGIN { print b / 1048576 }')" "$(basename "$artifact")"
done

# The install commands of the READMEs name these artifacts, as built: every package, wheel
# or archive file name (and the library's file name) they give is one that exists, so a new
# version or manylinux tag cannot leave them naming files that do not.
python3 - "$version" "$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo none)" \
    "${debs[@]}" "$wheel" "$archive" <<'PY'
import os, re, sys
version, built = sys.argv[1], {os.path.basename(p) for p in sys.argv[3:]}
built |= {name[: -len(".tar.gz")] for name in built if name.endswith(".tar.gz")}  # the directory it unpacks into
patterns = [r"(?:libsessionflow\d*|libsessionflow-dev|watch-session)_[^\s/]+\.deb",
            r"sessionflow-[0-9][^\s/]*\.whl", r"sessionflow-[0-9][^\s/]*-linux-[a-z0-9_]+(?:\.tar\.gz)?"]
bad = []
for readme in ("README.md", "Bindings/README.md", "Bindings/python/README.md"):
    text = open(readme, encoding="utf-8").read()
    for pattern in patterns:
        for name in re.findall(pattern, text):
            if name not in built:
                bad.append(f"{readme}: {name}")
    for so in re.findall(r"libsessionflow\.so\.(\d+\.\d+\.\d+)", text):
        if so != version:
            bad.append(f"{readme}: libsessionflow.so.{so}")
if bad:
    sys.exit("check-packages: the READMEs name artifacts that were not built (version " + version + "):\n  "
             + "\n  ".join(bad) + "\nbuilt: " + ", ".join(sorted(built)))
print(f"READMEs: every artifact they name was built ({version})")
PY

# A C host with only the system's tools: no Swift toolchain in PATH or in the library path.
clean=(env -i PATH=/usr/bin:/bin HOME="$work")
if "${clean[@]}" sh -c 'command -v swift' >/dev/null; then
    echo "check-packages: swift is in /usr/bin or /bin: the toolchain cannot be kept out of reach" >&2
    exit 1
fi
cp Bindings/examples/quickstart.c "$work/host.c"
expect_host_output() { # the quickstart's lines: every state, signed in and out
    grep -qx 'session state 1' "$1" && grep -qx 'session state 0' "$1" || {
        echo "check-packages: the C host printed:" >&2
        cat "$1" >&2
        exit 1
    }
}
no_toolchain() { # an ELF file and what it loads: nothing of the toolchain's
    if ldd "$1" | grep -E 'swift|not found'; then
        echo "check-packages: $1 needs the Swift toolchain's libraries (above)" >&2
        exit 1
    fi
}

echo "== lintian (errors fail; warnings, info and overrides printed)"
lintian --fail-on error --display-info --show-overrides "${debs[@]}" | tee "$work/lintian.txt"
echo "lintian: $(grep -c '^E:' "$work/lintian.txt" || true) errors, $(grep -c '^W:' "$work/lintian.txt" || true) warnings"

# The symbols file names exactly the header's functions, as the packaged library exports them.
symbols=$(dpkg-deb -I "${debs[0]}" symbols | sed -n 's/^ \([^@]*\)@Base .*/\1/p' | sort)
mkdir -p "$work/lib0"
dpkg-deb -x "${debs[0]}" "$work/lib0"
table=$(nm -D --defined-only "$work"/lib0/usr/lib/*/libsessionflow.so."$version" | awk '{ sub(/@.*/, "", $3); print $3 }' | sort)
if [ "$symbols" != "$(bash Bindings/header-functions.sh)" ] || [ "$symbols" != "$table" ]; then
    echo "check-packages: the symbols file, the header and the packaged library's dynamic symbols differ" >&2
    diff <(echo "$symbols") <(echo "$table") >&2 || true
    exit 1
fi
echo "symbols file: the header's $(grep -c . <<<"$symbols") functions, the packaged library's whole dynamic symbol table"

# Depends names the package of every library the packaged library and the CLI load (NEEDED),
# as dpkg-shlibdeps found them; libsecret, which the store loads at run time, is recommended.
mkdir -p "$work/cli"
dpkg-deb -x "${debs[2]}" "$work/cli"
for pair in "${debs[0]}:$(ls "$work"/lib0/usr/lib/*/libsessionflow.so."$version")" "${debs[2]}:$work/cli/usr/bin/watch-session"; do
    deb=${pair%%:*} elf=${pair#*:}
    depends=$(dpkg-deb -f "$deb" Depends)
    # The package names Depends gives (alternatives included), one per line.
    named=$(tr ',|' '\n\n' <<<"$depends" | sed 's/^ *//; s/[ (].*//' | sort -u)
    for needed in $(objdump -p "$elf" | awk '/NEEDED/ { print $2 }'); do
        # "pkg:arch, pkg2:arch: /path" for each file of that name: the packages.
        owners=$({ dpkg -S "*/$needed" 2>/dev/null || true; } | sed 's|: /.*||' | tr ',' '\n' | sed 's/^ *//; s/:.*//' | sort -u)
        [ -n "$owners" ] || { echo "check-packages: no installed package holds $needed, which $(basename "$elf") loads" >&2; exit 1; }
        found=0
        for owner in $owners; do
            if grep -Fxq "$owner" <<<"$named"; then found=1; fi
        done
        [ "$found" -eq 1 ] || { echo "check-packages: $(basename "$deb") loads $needed ($owners), its Depends ($depends) does not name it" >&2; exit 1; }
    done
    echo "$(basename "$deb"): Depends: $depends"
done
dpkg-deb -f "${debs[0]}" Recommends | grep -q 'libsecret-1-0' ||
    { echo "check-packages: libsessionflow$major does not recommend libsecret-1-0" >&2; exit 1; }

echo "== the Debian packages: dpkg -i, used without the toolchain, dpkg -r"
installed=1
as_root dpkg -i "${debs[@]}"
for package in "${packages[@]}"; do
    dpkg -L "$package" >"$work/$package.list"
done
multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -dumpmachine)
(cd "$work" && "${clean[@]}" sh -c 'cc host.c $(pkg-config --cflags --libs sessionflow) -o host')
loaded=$("${clean[@]}" ldd "$work/host" | awk '$1 ~ /^libsessionflow/ { print $3 }')
if [ "$(readlink -f "$loaded")" != "/usr/lib/$multiarch/libsessionflow.so.$version" ]; then
    echo "check-packages: the host loads libsessionflow from '$loaded', not the package's" >&2
    exit 1
fi
no_toolchain "$work/host"
"${clean[@]}" "$work/host" >"$work/host.out"
expect_host_output "$work/host.out"
echo "C host: built with pkg-config, loads $loaded, signed in and out"
no_toolchain /usr/bin/watch-session
said=$("${clean[@]}" watch-session --version)
[ "$said" = "watch-session $version" ] || { echo "check-packages: watch-session --version said '$said'" >&2; exit 1; }
page=$("${clean[@]}" man -w watch-session)
[ "$page" = /usr/share/man/man1/watch-session.1.gz ] || { echo "check-packages: man -w watch-session: '$page'" >&2; exit 1; }
completion=$("${clean[@]}" bash -c 'source /usr/share/bash-completion/completions/watch-session && complete -p watch-session
COMP_WORDS=(watch-session log); COMP_CWORD=1; COMP_LINE="watch-session log"; COMP_POINT=${#COMP_LINE}
function=$(complete -p watch-session | sed -n "s/.*-F \([^ ]*\).*/\1/p")
"$function" watch-session log watch-session; printf "%s\n" "${COMPREPLY[@]}"')
echo "$completion" | head -n 1
if ! grep -qx login <<<"$completion" || ! grep -qx logout <<<"$completion"; then
    echo "check-packages: the bash completion of 'watch-session log' offered: $(echo $completion)" >&2
    exit 1
fi
for file in /usr/share/zsh/vendor-completions/_watch-session /usr/share/fish/vendor_completions.d/watch-session.fish; do
    [ -s "$file" ] || { echo "check-packages: $file missing" >&2; exit 1; }
done
echo "watch-session: '$said', man page $page, bash completion offers login and logout, zsh and fish files installed"

as_root dpkg -r "${packages[@]}"
installed=0
left=()
for package in "${packages[@]}"; do
    if dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -qv 'not-installed'; then
        left+=("$package: $(dpkg-query -W -f='${Status}' "$package")")
    fi
    while read -r path; do
        [ "$path" = /. ] && continue
        if [ -L "$path" ] || [ -f "$path" ]; then
            left+=("$path")
        elif [ -d "$path" ] && [ -z "$(ls -A "$path")" ] && ! dpkg -S "$path" >/dev/null 2>&1; then
            left+=("$path (an empty directory nobody owns)")
        fi
    done <"$work/$package.list"
done
if ldconfig -p | grep libsessionflow >/dev/null; then left+=("libsessionflow in the ldconfig cache"); fi
if [ ${#left[@]} -gt 0 ]; then
    printf 'check-packages: left after dpkg -r: %s\n' "${left[@]}" >&2
    exit 1
fi
echo "dpkg -r: nothing of $(cat "$work"/*.list | grep -c .) listed paths left behind"

echo "== the wheel: $(basename "$wheel")"
python3 -m auditwheel show "$wheel"
# The tag auditwheel finds the wheel consistent with (its JSON's overall_tag: the text output
# begins with the file name, so a tag grepped from it would be the name's own), which the file
# name must carry: a wheel that needs a newer glibc than its name says fails here.
tag=$(python3 -m auditwheel show --json "$wheel" | python3 -c 'import json, sys; print(json.load(sys.stdin)["overall_tag"])')
case "$tag" in
manylinux_*_x86_64) ;;
*) echo "check-packages: auditwheel finds the wheel consistent with '$tag', not a manylinux tag" >&2; exit 1 ;;
esac
case "$(basename "$wheel")" in
*"$tag"*) echo "auditwheel: consistent with $tag, as the file name says" ;;
*) echo "check-packages: auditwheel finds '$tag', the wheel's file name does not say it" >&2; exit 1 ;;
esac
python3 - "$wheel" <<'PY'
import sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
text = wheel.read(meta).decode()
headers = [line for line in text.split("\n\n")[0].splitlines()]
def field(name):
    return [line.split(": ", 1)[1] for line in headers if line.startswith(name + ": ")]
license = field("License-Expression") or field("License")
assert license == ["Apache-2.0"], f"license {license}"
assert field("Requires-Python") == [">=3.9"], field("Requires-Python")
assert any(c.startswith("License :: OSI Approved :: Apache") for c in field("Classifier")) or field("License-Expression")
libs = [n for n in wheel.namelist() if n.startswith("sessionflow.libs/") and not n.endswith("/")]
# Every loadable segment of every library as repaired (patchelf rewrote them): its address and
# file offset agree modulo its alignment — 64 KiB for libsessionflow (-z max-page-size), which
# glibc before 2.35 refuses to load otherwise (patchelf 0.18.0 broke it: NixOS/patchelf#528).
import struct
for name in [n for n in wheel.namelist() if ".so" in n.rsplit("/", 1)[-1] and not n.endswith("/")]:
    elf = wheel.read(name)
    if elf[:4] != b"\x7fELF":
        continue
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    for index in range(phnum):
        kind, flags, offset, vaddr, paddr, filesz, memsz, align = struct.unpack_from("<IIQQQQQQ", elf, phoff + index * phentsize)
        if kind == 1 and align > 1:
            assert (vaddr - offset) % align == 0, f"{name}: LOAD at {vaddr:#x}, offset {offset:#x}, not aligned to {align:#x}"
for needed in ("libuv", "libcurl"):
    assert any(n.split("/")[1].startswith(needed) for n in libs), f"{needed} not bundled: {libs}"
# Each bundled library's notice (scripts/wheel-notices.py): a copyright file that names it,
# listed in METADATA; and RECORD matches every member (the wheel was rewritten to add them).
import base64, hashlib
notices = {n: wheel.read(n).decode(errors="replace") for n in wheel.namelist() if "/licenses/third-party/" in n}
for lib in libs:
    shown = lib.split("/")[1]
    assert any(shown in text.split("\n", 1)[0] for text in notices.values()), f"no notice names {shown}"
dist_info = meta.split("/")[0]
# License-File paths are relative to <dist-info>/licenses/ (PEP 639), each one in the wheel.
assert all(f"{dist_info}/licenses/{path}" in wheel.namelist() for path in field("License-File")), field("License-File")
assert {n[len(dist_info) + len("/licenses/"):] for n in notices} <= set(field("License-File")), field("License-File")
record = {}
for line in wheel.read(f"{dist_info}/RECORD").decode().splitlines():
    path, digest, size = line.rsplit(",", 2)
    record[path] = (digest, size)
assert set(record) == set(n for n in wheel.namelist() if not n.endswith("/")), "RECORD does not list exactly the members"
for path, (digest, size) in record.items():
    if path.endswith("/RECORD"):
        continue
    data = wheel.read(path)
    expected = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    assert (digest, size) == (expected, str(len(data))), f"RECORD is wrong for {path}"
print(f"wheel metadata: license {license[0]}, Requires-Python {field('Requires-Python')[0]}; "
      f"bundled: {', '.join(n.split('/')[1] for n in libs)}; notices of {len(notices)} packages; RECORD matches")
PY
python3 -m venv "$work/venv"
"$work/venv/bin/python" -m pip install --quiet --no-index "$wheel"
cat >"$work/use.py" <<'PY'
import re, sys
import sessionflow
with sessionflow.Runtime() as runtime:
    runtime.sign_in("access", "refresh", expires_in=3600, member="member-42")
    assert runtime.is_logged_in() and runtime.member_id() == "member-42"
    runtime.logout()
    assert not runtime.is_logged_in()
maps = {line.split()[-1] for line in open("/proc/self/maps") if re.search(r"/lib(uv|curl|sessionflow)[-.]", line)}
# The wheel's own copies: sessionflow/_lib/libsessionflow.so, sessionflow.libs/libuv-HASH.so.1…
for name, directory in (("libuv", "sessionflow.libs"), ("libcurl", "sessionflow.libs"), ("libsessionflow", "_lib")):
    paths = [p for p in maps if re.search(rf"/{name}[-.]", p)]
    assert paths and all(p.rsplit("/", 2)[-2] == directory for p in paths), f"{name} loaded from {paths}"
print(f"Python {sys.version.split()[0]}: signed in and out; loaded {', '.join(sorted(p.rsplit('/', 2)[-2] + '/' + p.rsplit('/', 1)[-1] for p in maps))}")
PY
# Hide the system's libuv and libcurl: an empty file bind-mounted over each, in a mount
# namespace of this command only.
hidden=()
for name in libuv.so.1 libcurl.so.4; do
    # awk reads to the end: a reader that quits early would kill ldconfig with SIGPIPE, and
    # under pipefail the assignment would fail (exit 141) when that happens.
    real=$(ldconfig -p | awk -v n="$name" '$1 == n && /x86-64/ && !found { print $NF; found = 1 }')
    [ -n "$real" ] && hidden+=("$(readlink -f "$real")")
done
touch "$work/empty"
mounts=""
for file in "${hidden[@]}"; do mounts+="mount --bind $work/empty $file && "; done
as_root unshare --mount sh -c "${mounts}python3 -c 'import ctypes
for n in (\"libuv.so.1\", \"libcurl.so.4\"):
    try:
        ctypes.CDLL(n)
    except OSError:
        continue
    raise SystemExit(\"the system \" + n + \" is still loadable\")' && ${clean[*]} $work/venv/bin/python $work/use.py"
echo "wheel: installs into a fresh venv; with the system's $(echo "${hidden[@]##*/}" | sed 's/ / and /') hidden, it signs in and out on the bundled copies"
pythons=()
for candidate in $(compgen -c python3. | sort -u) /usr/bin/python3.* "$(pyenv root 2>/dev/null || echo /nonexistent)"/versions/*/bin/python3; do
    path=$(command -v "$candidate" 2>/dev/null) || continue
    [[ "$path" =~ -config$ ]] && continue
    "$path" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 9) else 1)' 2>/dev/null || continue
    pythons+=("$("$path" -c 'import os, sys; print(os.path.realpath(sys.executable))')")
done
mkdir -p "$work/unpacked"
python3 -m zipfile -e "$wheel" "$work/unpacked"
for python in $(printf '%s\n' "${pythons[@]}" | sort -u); do
    PYTHONPATH="$work/unpacked" PYTHONDONTWRITEBYTECODE=1 "$python" "$work/use.py" | sed 's/;.*//'
done

echo "== the archive: $(basename "$archive")"
prefix=$work/prefix
mkdir -p "$prefix"
tar -xzf "$archive" -C "$prefix" --strip-components=1
for path in LICENSE include/sessionflow.h "lib/libsessionflow.so.$version" "lib/libsessionflow.so.$major" \
    lib/libsessionflow.so lib/pkgconfig/sessionflow.pc bin/watch-session share/man/man1/watch-session.1 \
    share/bash-completion/completions/watch-session share/zsh/site-functions/_watch-session \
    share/fish/vendor_completions.d/watch-session.fish share/doc/sessionflow/c-api.html; do
    [ -e "$prefix/$path" ] || { echo "check-packages: the archive has no $path" >&2; exit 1; }
done
# The archive's .pc alone (PKG_CONFIG_LIBDIR replaces pkg-config's default search path: no
# libuv.pc or libcurl.pc of this machine's can help), and it points into the prefix it was
# unpacked in, wherever that is.
archive_pc=(env PKG_CONFIG_LIBDIR="$prefix/lib/pkgconfig" PKG_CONFIG_PATH= pkg-config)
for variable in includedir libdir; do
    said=$("${clean[@]}" "${archive_pc[@]}" --variable="$variable" sessionflow)
    [ "$(readlink -f "$said")" = "$(readlink -f "$prefix/${variable%dir}")" ] ||
        { echo "check-packages: the archive's .pc says $variable=$said, not in $prefix" >&2; exit 1; }
done
(cd "$work" && "${clean[@]}" "${archive_pc[@]}" --cflags --libs sessionflow >archive_flags &&
    "${clean[@]}" sh -c 'cc host.c $(cat archive_flags) -o archive_host')
"${clean[@]}" LD_LIBRARY_PATH="$prefix/lib" "$work/archive_host" >"$work/archive_host.out"
expect_host_output "$work/archive_host.out"
loaded=$("${clean[@]}" LD_LIBRARY_PATH="$prefix/lib" ldd "$work/archive_host" | awk '/libsessionflow/ { print $3 }')
[ "$(readlink -f "$loaded")" = "$(readlink -f "$prefix/lib/libsessionflow.so.$version")" ] ||
    { echo "check-packages: the archive's host loaded '$loaded', not the archive's library" >&2; exit 1; }
said=$("${clean[@]}" "$prefix/bin/watch-session" --version)
[ "$said" = "watch-session $version" ] || { echo "check-packages: the archive's watch-session said '$said'" >&2; exit 1; }
echo "archive: a C host built with PKG_CONFIG_PATH=$prefix/lib/pkgconfig only, ran; watch-session '$said'"
echo "package checks: all passed"
