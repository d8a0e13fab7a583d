import Foundation
import SessionCore
import Testing

@testable import SessionFileStore

#if canImport(Glibc)
import Glibc
#endif

// Issue 14, trusted paths: the store uses a directory only if it is the effective user's and
// not writable by group or others (opened O_NOFOLLOW), and a file of it only if it is a
// regular file of that user, without group/other bits, with one link (opened O_NOFOLLOW
// relative to the directory). Anything else is refused — unavailable, naming the path and
// the reason — and nothing is read from, written to or created through it. A directory the
// store creates is 0700; an existing one is never chmod-ed. Real files; as root, foreign
// owners are made with chown, and the unprivileged side runs in a session-probe as nobody.

/// Mode bits including the sticky bit, not following a symbolic link.
private func fullMode(_ path: String) -> mode_t {
    var info = stat()
    lstat(path, &info)
    return info.st_mode & 0o7777
}

private func exists(_ path: String) -> Bool {
    var info = stat()
    return lstat(path, &info) == 0
}

private func linkTarget(_ path: String) -> String? {
    try? FileManager.default.destinationOfSymbolicLink(atPath: path)
}

/// The message of a read that must be unavailable ("" and an issue otherwise).
private func unavailableMessage(_ read: StoreRead, sourceLocation: SourceLocation = #_sourceLocation) -> String {
    guard case .unavailable(let error) = read else {
        Issue.record("expected unavailable, got \(summary(of: read))", sourceLocation: sourceLocation)
        return ""
    }
    return error.message
}

/// The message of a store call that must throw ("" and an issue otherwise).
private func failureMessage(sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws(StoreError) -> Void) -> String {
    do {
        try body()
        Issue.record("expected a store error", sourceLocation: sourceLocation)
        return ""
    } catch {
        return error.message
    }
}

/// Every way in: read, write, clear, accounts, the refresh lease, the watch. Each must refuse,
/// naming `path` and `reason`; the lease may not be granted.
private func expectRefusedEverywhere(
    _ store: FileCredentialStore, naming path: String, because reason: String,
    sourceLocation: SourceLocation = #_sourceLocation
) {
    let read = unavailableMessage(store.read(), sourceLocation: sourceLocation)
    #expect(read.contains(path) && read.contains(reason), "read: \(read)", sourceLocation: sourceLocation)
    let write = failureMessage(sourceLocation: sourceLocation) { () throws(StoreError) in try store.write(session("bob", access: "bob-access")) }
    #expect(write.contains(path) && write.contains(reason), "write: \(write)", sourceLocation: sourceLocation)
    #expect(!write.contains("bob-access") && !read.contains(sentinelAccess), sourceLocation: sourceLocation)
    if exists(store.path) {
        let clear = failureMessage(sourceLocation: sourceLocation) { () throws(StoreError) in try store.clear() }
        #expect(clear.contains(path) && clear.contains(reason), "clear: \(clear)", sourceLocation: sourceLocation)
    }
    #expect(store.accounts().isEmpty, sourceLocation: sourceLocation)
    if path == store.lockPath || path == store.directory {
        #expect(store.tryAcquireRefreshLease(for: .seconds(30)) != .acquired, "lease granted", sourceLocation: sourceLocation)
        store.releaseRefreshLease()
    }
    if path == store.directory {
        #expect(store.directoryToWatch() == nil, "a refused directory is watched", sourceLocation: sourceLocation)
    }
}

@Suite("Trusted paths", .serialized)
struct TrustedPathTests {
    // MARK: Symbolic links

    /// A planted symbolic link in place of the store, the key or a lock file — pointing at a
    /// copy of the real file (a store the victim would happily decrypt, a key it would use) or
    /// at nothing — is refused, never followed: the copy is not read or changed, the dangling
    /// target is not created, the link itself stays.
    @Test(arguments: ["session.sfstore", "session.sfstore.key", "session.sfstore.wlock", "session.sfstore.lock"])
    func aPlantedSymbolicLinkIsRefusedAndNotFollowed(name: String) throws {
        for dangling in [false, true] {
            let tmp = TemporaryDirectory()
            let store = FileCredentialStore(directory: tmp.store)
            try store.write(session("alice"))
            #expect(store.tryAcquireRefreshLease(for: .seconds(1)) == .acquired)  // makes the .lock
            store.releaseRefreshLease()
            let planted = tmp.store + "/" + name
            let outside = tmp.path + "/outside-" + name
            if !dangling {
                #expect(rename(planted, outside) == 0)  // the real file's bytes, now outside
            } else {
                unlink(planted)
            }
            let before = contents(outside)
            #expect(symlink(outside, planted) == 0)
            expectRefusedEverywhere(store, naming: planted, because: "is a symbolic link")
            #expect(FileCredentialStore(directory: tmp.store).read() != .present(session("alice")))
            #expect(linkTarget(planted) == outside, "the link was replaced or removed")
            #expect(exists(outside) == !dangling, "\(dangling ? "created" : "removed") through the link")
            #expect(contents(outside) == before, "written through the link")
        }
    }

    /// The first use of a store whose key or lock name is a dangling link: nothing is created
    /// where it points (the finding: root followed a planted `.wlock` link in a directory of
    /// another user and created the file it named).
    @Test(arguments: ["session.sfstore.key", "session.sfstore.wlock", "session.sfstore.lock", "session.sfstore"])
    func aDanglingLinkOnAFreshStoreCreatesNothingOutside(name: String) throws {
        let tmp = TemporaryDirectory()
        mkdir(tmp.store, 0o700)
        let outside = tmp.path + "/created-through-link"
        #expect(symlink(outside, tmp.store + "/" + name) == 0)
        let store = FileCredentialStore(directory: tmp.store)
        _ = store.read()
        _ = try? store.write(session("alice"))
        _ = store.tryAcquireRefreshLease(for: .seconds(1))
        store.releaseRefreshLease()
        #expect(!exists(outside))
        #expect(store.read() != .present(session("alice")), "written through or beside a planted link")
    }

    /// A temporary file's name taken by a link: the write fails naming it, the link's target is
    /// neither created nor written (O_CREAT|O_EXCL|O_NOFOLLOW), the stored session is intact.
    /// (A write takes a temporary file when the spare cannot be used: a link there too.)
    @Test func aPlantedLinkAtTheTemporaryNameIsNotFollowed() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        try store.write(session("alice"))
        FileIO.injectedTemporarySuffixes.withLockedValue { $0[tmp.store] = "1-1" }  // pid 1: alive, never cleaned
        defer { _ = FileIO.injectedTemporarySuffixes.withLockedValue { $0.removeValue(forKey: tmp.store) } }
        let planted = store.path + ".tmp-1-1"
        let outside = tmp.path + "/outside-temporary"
        #expect(symlink(outside, planted) == 0)
        #expect(symlink(tmp.path + "/outside-spare", store.path + ".spare") == 0)
        let message = failureMessage { () throws(StoreError) in try store.write(session("bob")) }
        #expect(message.contains(planted), "\(message)")
        #expect(!exists(outside))
        #expect(linkTarget(planted) == outside)
        #expect(!exists(tmp.path + "/outside-spare"))
        #expect(store.read() == .present(session("alice")))
    }

    /// The store directory itself a link — to a directory of ours holding a good store, or (the
    /// finding) to someone else's holding a planted key and store: refused, not read, not
    /// watched, nothing written there. `link/` and `link/.` do not get around it.
    @Test func aSymlinkedStoreDirectoryIsRefused() throws {
        let tmp = TemporaryDirectory()
        let real = tmp.path + "/real"
        try FileCredentialStore(directory: real).write(session("mallory", access: "mallory-access"))
        if runningAsRoot {
            _ = system("chown -R 65534:65534 '\(real)'")
        }
        let listing = TemporaryDirectory.list(real)
        let link = tmp.path + "/link"
        #expect(symlink(real, link) == 0)
        for given in [link, link + "/", link + "/.", link + "//./"] {
            let store = FileCredentialStore(directory: given)
            let read = unavailableMessage(store.read())
            #expect(read.contains(given) && read.contains("is a symbolic link"), "\(given): \(read)")
            let write = failureMessage { () throws(StoreError) in try store.write(session("victim")) }
            #expect(write.contains("is a symbolic link"), "\(given): \(write)")
            #expect(store.directoryToWatch() == nil)
            #expect(store.tryAcquireRefreshLease(for: .seconds(1)) != .acquired)
            store.releaseRefreshLease()
        }
        #expect(TemporaryDirectory.list(real) == listing)
    }

    /// The decision about parents: links in the path above the store directory are followed
    /// (`/var -> /private/var`); the directory they lead to is checked like any other.
    @Test func aLinkAmongTheParentsIsFollowedAndTheDirectoryStillChecked() throws {
        let tmp = TemporaryDirectory()
        let parent = tmp.path + "/parent"
        mkdir(parent, 0o755)
        #expect(symlink(parent, tmp.path + "/parent-link") == 0)
        let store = FileCredentialStore(directory: tmp.path + "/parent-link/store")
        try store.write(session("alice"))
        #expect(FileCredentialStore(directory: parent + "/store").read() == .present(session("alice")))
        chmod(parent + "/store", 0o770)
        expectRefusedEverywhere(store, naming: store.directory, because: "is writable by group or others (mode 0770)")
    }

    // MARK: Directory owner and mode

    /// Group- or world-writable directories (sticky or not) are refused by every operation —
    /// read, write, clear, lease, watch — and never chmod-ed; nothing is created in them.
    @Test(arguments: [0o777, 0o1777, 0o775, 0o1770, 0o703])
    func aDirectoryOthersMayWriteIsRefusedAndLeftAsItIs(directoryMode: Int) throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        mkdir(tmp.store, 0o700)
        chmod(tmp.store, mode_t(directoryMode))
        let shown = String(directoryMode, radix: 8)
        let reason = "is writable by group or others (mode \(String(repeating: "0", count: 4 - shown.count) + shown))"
        expectRefusedEverywhere(store, naming: tmp.store, because: reason)
        #expect(fullMode(tmp.store) == mode_t(directoryMode), "the directory was chmod-ed")
        #expect(TemporaryDirectory.list(tmp.store).isEmpty, "created in a refused directory")
    }

    /// An existing directory that others may read but not write (0755, 0711, sticky 1700) is
    /// used — and still never chmod-ed. A directory the store creates is 0700, its files 0600.
    @Test func anExistingReadableDirectoryIsUsedUnchangedAndACreatedOneIsPrivate() throws {
        for existing in [0o755, 0o711, 0o1700] {
            let tmp = TemporaryDirectory()
            mkdir(tmp.store, 0o700)
            chmod(tmp.store, mode_t(existing))
            let store = FileCredentialStore(directory: tmp.store)
            #expect(store.directoryToWatch() == tmp.store)
            try store.write(session("alice"))
            #expect(store.read() == .present(session("alice")))
            #expect(fullMode(tmp.store) == mode_t(existing), "an existing directory was chmod-ed")
        }
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        #expect(store.directoryToWatch() == tmp.store)  // creates it
        #expect(fullMode(tmp.store) == 0o700)
        try store.write(session("alice"))
        #expect(store.tryAcquireRefreshLease(for: .seconds(1)) == .acquired)
        store.releaseRefreshLease()
        for path in [store.path, store.keyPath, store.writeLockPath, store.lockPath] {
            #expect(fullMode(path) == 0o600, "\(path)")
        }
    }

    /// Root in a directory (or with files) owned by another user: refused, "owned by uid 65534,
    /// not 0", nothing written. (Unprivileged, the same rule is exercised by the probe test.)
    @Test(arguments: ["", "session.sfstore", "session.sfstore.key", "session.sfstore.wlock", "session.sfstore.lock"])
    func somethingOwnedByAnotherUserIsRefused(name: String) throws {
        guard runningAsRoot else {
            print("foreign owner (\(name)): not root, cannot chown; see the probe test")
            return
        }
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        try store.write(session("alice"))
        #expect(store.tryAcquireRefreshLease(for: .seconds(1)) == .acquired)
        store.releaseRefreshLease()
        let path = name.isEmpty ? tmp.store : tmp.store + "/" + name
        #expect(chown(path, 65534, 65534) == 0)
        let before = contents(store.path)
        let listing = TemporaryDirectory.list(tmp.store)
        expectRefusedEverywhere(store, naming: path, because: "is owned by uid 65534, not 0")
        #expect(contents(store.path) == before)
        #expect(TemporaryDirectory.list(tmp.store) == listing)
        if name.isEmpty { #expect(fullMode(tmp.store) == 0o700) }
    }

    // MARK: Files

    /// A store, key or lock file open to group or others is refused (not read: a key others can
    /// read protects nothing; not written) and left as it is — also a key planted before the
    /// store's first use (the finding: a planted world-readable key was used).
    @Test(arguments: [
        ("session.sfstore", 0o644), ("session.sfstore", 0o666), ("session.sfstore.key", 0o644),
        ("session.sfstore.key", 0o640), ("session.sfstore.key", 0o604), ("session.sfstore.wlock", 0o644),
        ("session.sfstore.lock", 0o660),
    ])
    func aFileOpenToOthersIsRefused(name: String, fileMode: Int) throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        try store.write(session("alice"))
        #expect(store.tryAcquireRefreshLease(for: .seconds(1)) == .acquired)
        store.releaseRefreshLease()
        let path = tmp.store + "/" + name
        chmod(path, mode_t(fileMode))
        let before = contents(store.path)
        expectRefusedEverywhere(store, naming: path, because: "is open to group or others (mode 0\(String(fileMode, radix: 8)))")
        #expect(fullMode(path) == mode_t(fileMode))
        #expect(contents(store.path) == before)
    }

    @Test func aKeyPlantedBeforeTheFirstUseIsNotUsed() throws {
        let tmp = TemporaryDirectory()
        mkdir(tmp.store, 0o700)
        let planted = tmp.store + "/session.sfstore.key"
        let key = [UInt8](repeating: 7, count: 32)
        _ = FileManager.default.createFile(atPath: planted, contents: Data(key), attributes: [.posixPermissions: 0o644])
        let store = FileCredentialStore(directory: tmp.store)
        let message = failureMessage { () throws(StoreError) in try store.write(session("alice")) }
        #expect(message.contains(planted) && message.contains("mode 0644"), "\(message)")
        #expect(!exists(store.path), "a session was encrypted with a key others can read")
        #expect(contents(planted) == key)
    }

    /// A second hard link to the store or key file (a name outside the store's control for the
    /// same bytes) is refused; so is anything that is not a regular file (a FIFO would block a
    /// reader's open; a directory).
    @Test(arguments: ["session.sfstore", "session.sfstore.key", "session.sfstore.wlock", "session.sfstore.lock"])
    func aHardLinkedOrIrregularFileIsRefused(name: String) throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        try store.write(session("alice"))
        #expect(store.tryAcquireRefreshLease(for: .seconds(1)) == .acquired)
        store.releaseRefreshLease()
        let path = tmp.store + "/" + name
        let second = tmp.path + "/second-link"
        #expect(link(path, second) == 0)
        let before = contents(store.path)
        expectRefusedEverywhere(store, naming: path, because: "has 2 links, not 1")
        #expect(contents(store.path) == before)
        unlink(second)
        #expect(unlink(path) == 0 && mkfifo(path, 0o600) == 0)
        expectRefusedEverywhere(store, naming: path, because: "is not a regular file")
        #expect(unlink(path) == 0 && mkdir(path, 0o700) == 0)
        expectRefusedEverywhere(store, naming: path, because: "is not a regular file")
    }

    // MARK: Unprivileged, in a process of its own

    /// As nobody (a session-probe that drops to 65534; root only): a directory of nobody's with
    /// a planted `.wlock` link to a name nobody could create — nothing is created there and the
    /// session reports it; a 1777 directory of nobody's is refused and left 1777 though the
    /// session watches it; root's 0755 directory is refused as someone else's.
    @Test func anUnprivilegedSessionRefusesTheSameThings() throws {
        guard runningAsRoot else {
            print("unprivileged probe: not root (the in-process tests already run unprivileged)")
            return
        }
        let tmp = TemporaryDirectory()
        chmod(tmp.path, 0o755)
        let area = tmp.path + "/nobody"
        mkdir(area, 0o755)
        chown(area, 65534, 65534)

        let linked = area + "/linked"
        mkdir(linked, 0o700)
        chown(linked, 65534, 65534)
        let outside = area + "/created-through-link"
        #expect(symlink(outside, linked + "/session.sfstore.wlock") == 0)
        var (lines, status) = try runSessionProbe(["--session", linked, "--as-nobody", "--sign-in", "bob", "bob-access", "bob-refresh"])
        #expect(status == 0 && lines.contains("UID 65534"), "\(lines)")
        #expect(lines.contains { $0.hasPrefix("EVENT storeError(") && $0.contains(linked + "/session.sfstore.wlock is a symbolic link") }, "\(lines)")
        #expect(lines.contains { $0.hasPrefix("READ unavailable") && $0.contains("session.sfstore.wlock is a symbolic link") }, "\(lines)")
        #expect(!exists(outside))
        #expect(!exists(linked + "/session.sfstore"))

        let sticky = area + "/sticky"
        mkdir(sticky, 0o700)
        chown(sticky, 65534, 65534)
        chmod(sticky, 0o1777)
        (lines, status) = try runSessionProbe(["--session", sticky, "--as-nobody", "--sign-in", "bob", "bob-access", "bob-refresh"])
        #expect(status == 0, "\(lines)")
        #expect(lines.contains { $0.hasPrefix("EVENT storeError(") && $0.contains("\(sticky) is writable by group or others (mode 1777)") }, "\(lines)")
        #expect(fullMode(sticky) == 0o1777, "a watching session chmod-ed the directory")
        #expect(TemporaryDirectory.list(sticky).isEmpty)

        let rootOwned = tmp.path + "/root-owned"
        mkdir(rootOwned, 0o755)
        (lines, status) = try runSessionProbe(["--session", rootOwned, "--as-nobody"])
        #expect(status == 0, "\(lines)")
        #expect(lines.contains { $0.hasPrefix("READ unavailable") && $0.contains("\(rootOwned) is owned by uid 0, not 65534") }, "\(lines)")
        #expect(lines.contains("STATE loggedOut"), "\(lines)")
    }
}
