import Crypto
import Foundation
import LoopFlow
import SessionCore
import Testing

@_spi(Fuzzing) @testable import SessionFileStore

#if canImport(Glibc)
import Glibc
#endif

// The store file is replaced through a spare (`FileIO.replaceThroughSpare`): the new bytes go
// over `<store>.spare` in place, the two entries are exchanged (renameat2 RENAME_EXCHANGE),
// the old file becomes the spare. What must hold: each write still replaces the file whole
// (the crash campaign kills writers mid-write: CrashConsistencyTests); the spare is reused,
// not a new file each time; nothing planted at its name is followed or written; a filesystem
// that cannot exchange still gets every write; and a reader of another process whose opened
// copy becomes the spare and is overwritten under it reads again instead of calling the
// store damaged. Real files in /tmp.

private func inode(_ path: String) -> ino_t? {
    var info = stat()
    return lstat(path, &info) == 0 ? info.st_ino : nil
}

private func links(_ path: String) -> nlink_t {
    var info = stat()
    return lstat(path, &info) == 0 ? info.st_nlink : 0
}

private func exists(_ path: String) -> Bool {
    var info = stat()
    return lstat(path, &info) == 0
}

@Suite("The store's spare file")
struct SpareFileTests {
    /// From the third write on, the store file's new inode is the spare's — two inodes take
    /// turns — and the spare holds the file as it was before.
    @Test func eachWriteGoesOverTheSpareAndTakesItsPlace() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store, key: .keyFile)
        let spare = store.path + ".spare"
        try store.write(session("alice", access: "access-0"))
        #expect(!exists(spare), "the first write has nothing to exchange with: its file is renamed")
        var inodes: Set<ino_t> = []
        for n in 1...10 {
            let spareBefore = inode(spare)
            let fileBefore = contents(store.path)
            try store.write(session("alice", access: "access-\(n)"))
            #expect(store.read() == .present(session("alice", access: "access-\(n)")))
            #expect(contents(spare) == fileBefore, "write \(n): the spare is not the file before")
            #expect(mode(spare) == 0o600 && links(spare) == 1)
            if let spareBefore { #expect(inode(store.path) == spareBefore, "write \(n) made a new file") }
            inodes.insert(inode(store.path) ?? 0)
        }
        #expect(inodes.count == 2, "the store file had \(inodes.count) inodes in 10 writes, not 2 in turn")
        #expect(!tmp.files().contains { $0.contains(".tmp-") })
    }

    /// Anything at the spare's name that is not a private regular file of ours with one link
    /// is removed unread, never followed or written; that write takes a temporary file.
    @Test(arguments: ["link to a file", "dangling link", "hard link", "fifo", "readable by others", "directory"])
    func somethingPlantedAtTheSpareIsNeverWrittenThrough(kind: String) throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store, key: .keyFile)
        try store.write(session("alice"))
        let spare = store.path + ".spare"
        let outside = tmp.path + "/outside"
        let planted = Array("not the store's".utf8)
        switch kind {
        case "link to a file":
            _ = FileManager.default.createFile(atPath: outside, contents: Data(planted), attributes: [.posixPermissions: 0o600])
            #expect(symlink(outside, spare) == 0)
        case "dangling link":
            #expect(symlink(outside, spare) == 0)
        case "hard link":
            _ = FileManager.default.createFile(atPath: outside, contents: Data(planted), attributes: [.posixPermissions: 0o600])
            #expect(link(outside, spare) == 0)
        case "fifo":
            #expect(mkfifo(spare, 0o600) == 0)
        case "readable by others":
            _ = FileManager.default.createFile(atPath: spare, contents: Data(planted), attributes: [.posixPermissions: 0o644])
        default:
            #expect(mkdir(spare, 0o700) == 0)
        }
        try store.write(session("bob", access: "bob-access"))
        #expect(store.read() == .present(session("bob", access: "bob-access")))
        if kind == "directory" {
            #expect(TemporaryDirectory.list(spare).isEmpty, "written into a planted directory")
        } else {
            #expect(!exists(spare), "the planted \(kind) is still there")
        }
        if kind == "dangling link" {
            #expect(!exists(outside), "created through a planted link")
        } else if kind.hasSuffix("file") || kind == "hard link" {
            #expect(contents(outside) == planted, "written through a planted \(kind)")
            #expect(links(outside) == 1)
        }
        #expect(!tmp.files().contains { $0.contains(".tmp-") })
        // The next write makes a spare of its own again.
        try store.write(session("carol", access: "carol-access"))
        #expect(store.read() == .present(session("carol", access: "carol-access")))
        if kind != "directory" { #expect(mode(spare) == 0o600 && links(spare) == 1) }
    }

    /// Where the filesystem cannot exchange (vfat, some FUSE mounts: EINVAL), the spare is
    /// renamed over the file instead: every write lands whole, no spare and no temporary
    /// file stay behind.
    @Test func aFilesystemThatCannotExchangeStillGetsEveryWrite() throws {
        let tmp = TemporaryDirectory()
        FileIO.injectedExchangeErrors.withLockedValue { $0[tmp.store] = EINVAL }
        defer { _ = FileIO.injectedExchangeErrors.withLockedValue { $0.removeValue(forKey: tmp.store) } }
        let store = FileCredentialStore(directory: tmp.store, key: .keyFile)
        for n in 0..<5 {
            try store.write(session("m\(n % 2)", access: "access-\(n)"))
            #expect(store.read() == .present(session("m\(n % 2)", access: "access-\(n)")))
            #expect(tmp.files() == ["session.sfstore", "session.sfstore.key", "session.sfstore.wlock"])
        }
        #expect(store.accounts() == ["m0", "m1"])
    }

    /// A writer killed between its exchange and its directory fsync leaves the exchange in
    /// memory only: the next writer makes it durable before it writes over the spare. When
    /// that fsync fails, the write takes a new temporary file and leaves the spare alone.
    @Test func aSpareWhoseExchangeMayNotBeOnDiskIsNotWrittenOver() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store, key: .keyFile)
        try store.write(session("alice", access: "alice-1"))
        try store.write(session("alice", access: "alice-2"))
        let spare = store.path + ".spare"
        let spareBefore = contents(spare)
        let spareInode = inode(spare)
        FileIO.injectedDirectorySyncErrors.withLockedValue { $0[tmp.store] = EIO }
        defer { _ = FileIO.injectedDirectorySyncErrors.withLockedValue { $0.removeValue(forKey: tmp.store) } }
        try store.write(session("bob", access: "bob-1"))
        #expect(store.read() == .present(session("bob", access: "bob-1")))
        #expect(contents(spare) == spareBefore && inode(spare) == spareInode, "the spare was written over")
        #expect(inode(store.path) != spareInode)
        #expect(!tmp.files().contains { $0.contains(".tmp-") })
    }

    /// Every logout removes the spare — the file before it, sealed with a key the logout
    /// rotates away, or (a version-1 file of a host's key) with the host's key itself.
    @Test(arguments: ["key file", "host key"])
    func aLogoutRemovesTheSpare(key: String) throws {
        let tmp = TemporaryDirectory()
        let source: FileCredentialStore.Key = key == "key file" ? .keyFile : .provided(SymmetricKey(size: .bits256))
        let store = FileCredentialStore(directory: tmp.store, key: source)
        let spare = store.path + ".spare"
        try store.write(session("alice", access: "alice-1"))
        try store.write(session("bob", access: "bob-1"))
        #expect(exists(spare))
        try store.clear()  // the active account (bob); alice stays
        #expect(!exists(spare), "\(tmp.files())")
        #expect(store.accounts() == ["alice"])
        try store.write(session("bob", access: "bob-2"))
        #expect(exists(spare))
        try store.account("bob", isActive: false).clear()
        #expect(!exists(spare), "\(tmp.files())")
        #expect(store.accounts() == ["alice"])
    }

    /// A reader of another process opened the store file; before it read, a write made that
    /// copy the spare, and a writer then wrote over it — a whole record, dying before its
    /// exchange (the reader's bytes authenticate: a record the store never published), or
    /// halfway (they do not). Either way the name is on another file now: the reader reads
    /// again and gets the published session — not a ghost, not "damaged", nothing moved aside.
    /// (Instances stand for processes: each has its own lock; the pause runs the other writes
    /// between the reader's open and its read.)
    @Test(arguments: ["a whole record", "halfway"])
    func aReaderWhoseOpenedCopyBecameTheSpareReadsTheNameAgain(overwritten: String) throws {
        let tmp = TemporaryDirectory()
        let writer = FileCredentialStore(directory: tmp.store, key: .keyFile)
        try writer.write(session("ghost", access: "never-published"))
        let unpublished = contents(writer.path)
        try writer.write(session("alice", access: "alice-1"))
        let spare = writer.path + ".spare"
        let paused = LockedBox(false)
        FileIO.injectedPausesAfterOpen.withLockedValue {
            $0[tmp.store] = { name in
                guard name == "session.sfstore", !paused.withLockedValue({ let was = $0; $0 = true; return was }) else { return }
                // The reader's copy (alice-1) becomes the spare...
                try? writer.write(session("bob", access: "bob-1"))
                // ...and a writer writes over it.
                let fd = open(spare, O_WRONLY)
                if overwritten == "halfway" {
                    _ = Array("half-written".utf8).withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 40) }
                } else {
                    _ = unpublished.withUnsafeBytes { pwrite(fd, $0.baseAddress, $0.count, 0) }
                    _ = ftruncate(fd, off_t(unpublished.count))
                }
                close(fd)
            }
        }
        defer { _ = FileIO.injectedPausesAfterOpen.withLockedValue { $0.removeValue(forKey: tmp.store) } }
        let read = FileCredentialStore(directory: tmp.store, key: .keyFile).read()
        #expect(paused.withLockedValue { $0 }, "the pause never ran: the test tested nothing")
        #expect(read == .present(session("bob", access: "bob-1")), "\(summary(of: read))")
        #expect(!tmp.files().contains { $0.contains(".damaged-") }, "\(tmp.files())")
    }
}
