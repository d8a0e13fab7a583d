#!/usr/bin/env python3
"""Adds the notices of the libraries auditwheel bundled into a repaired wheel.

    python3 scripts/wheel-notices.py WHEEL

`auditwheel repair` copies libuv, libcurl and everything they load into
`sessionflow.libs/` (renamed `<name>-<hash>.so...`), but not their licences. For each bundled
library this finds the Debian package that installed the original (`dpkg -S`) and adds that
package's copyright file (`/usr/share/doc/<package>/copyright`, every Debian package has one)
as `<dist-info>/licenses/third-party/<package>.copyright`, names each in METADATA
(`License-File: third-party/<package>.copyright`: relative to `licenses/`, PEP 639), and
rewrites RECORD. The wheel is rewritten in place, with every
other member as it was. Fails when a bundled library's package or copyright file is not found.
"""
import base64
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile

# auditwheel names a bundled library <the name up to its first dot>-<8 hex digits><the rest>:
# libuv.so.1.0.0 -> libuv-1a2b3c4d.so.1.0.0, liblber-2.5.so.0.1.8 -> liblber-2-64f183c1.5.so.0.1.8.
BUNDLED = re.compile(r"^sessionflow\.libs/(?P<stem>[^./]+)-[0-9a-f]{8}(?P<suffix>\.[^/]+)$")


def owner(library: str) -> str:
    """The Debian package that installed a library file of that name (the first, if several)."""
    found = subprocess.run(["dpkg", "-S", f"*/{library}"], capture_output=True, text=True)
    for line in found.stdout.splitlines():
        packages, _, path = line.partition(": ")
        if os.path.basename(path) == library:
            return packages.split(",")[0].strip().split(":")[0]
    sys.exit(f"wheel-notices: no Debian package installed {library} (dpkg -S)")


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main(path: str) -> None:
    with zipfile.ZipFile(path) as wheel:
        members = [(info, wheel.read(info)) for info in wheel.infolist()]
    names = [info.filename for info, _ in members]
    dist_info = next(n.split("/")[0] for n in names if re.match(r"^[^/]+\.dist-info/METADATA$", n))
    packages = {}
    for name in names:
        if not name.startswith("sessionflow.libs/") or name.endswith("/"):
            continue
        match = BUNDLED.match(name)
        if not match:
            sys.exit(f"wheel-notices: {name} is not named as auditwheel names what it bundles")
        library = match["stem"] + match["suffix"]
        packages.setdefault(owner(library), []).append(f"{name.split('/', 1)[1]} ({library})")
    if not packages:
        sys.exit("wheel-notices: the wheel bundles no library (was it repaired?)")
    notices = {}
    for package, libraries in sorted(packages.items()):
        copyright_file = f"/usr/share/doc/{package}/copyright"
        if not os.path.isfile(copyright_file):
            sys.exit(f"wheel-notices: {package} (which installed {', '.join(libraries)}) has no {copyright_file}")
        with open(copyright_file, "rb") as notice:
            header = f"Bundled in sessionflow.libs/: {', '.join(sorted(libraries))}, from the Debian package {package}.\n\n"
            notices[f"{dist_info}/licenses/third-party/{package}.copyright"] = header.encode() + notice.read()

    out = []
    for info, data in members:
        if info.filename in notices:
            continue  # made again below (a second run replaces the first run's notices)
        if info.filename == f"{dist_info}/METADATA":
            text = data.decode()
            head, separator, body = text.partition("\n\n")
            # License-File paths are relative to <dist-info>/licenses/ (as LICENSE's is).
            prefix = f"{dist_info}/licenses/"
            lines = [line for line in head.splitlines() if not line.startswith("License-File: third-party/")]
            lines += [f"License-File: {name[len(prefix):]}" for name in sorted(notices)]
            data = ("\n".join(lines) + separator + body).encode()
        out.append((info, data))
    record_name = f"{dist_info}/RECORD"
    out = [(info, data) for info, data in out if info.filename != record_name]
    for name, data in sorted(notices.items()):
        info = zipfile.ZipInfo(name, date_time=out[0][0].date_time)
        info.external_attr = 0o644 << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        out.append((info, data))
    files = [(info, data) for info, data in out if not info.filename.endswith("/")]  # RECORD lists files only
    record = "\n".join([record_line(info.filename, data) for info, data in files] + [f"{record_name},,", ""])
    record_info = zipfile.ZipInfo(record_name, date_time=out[0][0].date_time)
    record_info.external_attr = 0o644 << 16
    record_info.compress_type = zipfile.ZIP_DEFLATED
    out.append((record_info, record.encode()))

    directory = os.path.dirname(os.path.abspath(path))
    with tempfile.NamedTemporaryFile(dir=directory, suffix=".whl", delete=False) as temporary:
        with zipfile.ZipFile(temporary, "w") as wheel:
            for info, data in out:
                wheel.writestr(info, data, compress_type=info.compress_type)
    os.replace(temporary.name, path)
    os.chmod(path, 0o644)
    bundled = sum(len(v) for v in packages.values())
    print(f"wheel-notices: {bundled} bundled libraries, the notices of {len(notices)} packages added", file=sys.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
