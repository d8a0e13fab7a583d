import Crypto
import Foundation
import LoopFlow
import SessionCore
import Testing

@_spi(Fuzzing) @testable import SessionFileStore

#if canImport(Glibc)
import Glibc
#endif

let sentinelAccess = "SENTINEL-FILE-ACCESS-91c3"
let sentinelRefresh = "SENTINEL-FILE-REFRESH-5e0a"

/// A fresh directory under /tmp, removed afterwards.
final class TemporaryDirectory: Sendable {
    let path: String

    init() {
        var template = Array("/tmp/sessionflow-store-XXXXXX".utf8CString)
        path = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)) }
    }

    deinit {
        // On a thread of its own: a shell and rm, on a machine busy writing to disk, took
        // seconds, and the last reference often goes on a thread of the cooperative pool.
        let command = "rm -rf '\(path)'"
        Thread.detachNewThread { _ = system(command) }
    }

    var store: String { path + "/store" }

    func files(in directory: String? = nil) -> [String] {
        Self.list(directory ?? store)
    }

    /// The names in `directory`, sorted (without . and ..).
    static func list(_ directory: String) -> [String] {
        guard let dir = opendir(directory) else { return [] }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
            if name != "." && name != ".." { names.append(name) }
        }
        return names.sorted()
    }
}

func mode(_ path: String) -> mode_t {
    var info = stat()
    stat(path, &info)
    return info.st_mode & 0o777
}

/// The bytes of `path` (empty if it cannot be read); follows nothing the tests did not plant.
func contents(_ path: String) -> [UInt8] {
    (try? Array(Data(contentsOf: URL(fileURLWithPath: path)))) ?? []
}

func overwrite(_ path: String, with bytes: [UInt8]) {
    let fd = open(path, O_WRONLY | O_TRUNC)
    _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    close(fd)
}

func session(_ member: String, access: String = sentinelAccess, refresh: String = sentinelRefresh) -> StoredSession {
    StoredSession(
        accessToken: Secret(access), refreshToken: Secret(refresh), accessTokenExpiresAt: .seconds(1_900_000_000),
        memberID: member, externalUserID: "ext-\(member)")
}

@Suite("FileCredentialStore")
struct FileCredentialStoreTests {
    @Test func aWrittenSessionReadsBackAndNothingReadsAsAbsent() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        #expect(store.read() == .absent)
        try store.write(session("alice"))
        #expect(store.read() == .present(session("alice")))
        // a second instance (another process, a restart) reads the same
        #expect(FileCredentialStore(directory: tmp.store).read() == .present(session("alice")))
    }

    @Test func theDirectoryIsPrivateAndTheFilesOwnerOnly() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store, key: .keyFile)
        try store.write(session("alice"))
        #expect(mode(tmp.store) == 0o700)
        #expect(mode(store.path) == 0o600)
        #expect(mode(store.keyPath) == 0o600)
        // an existing directory is never changed: one others may read is used as it is
        // (one others may write is refused: TrustedPathTests)
        chmod(tmp.store, 0o755)
        try store.write(session("bob"))
        #expect(mode(tmp.store) == 0o755)
    }

    @Test func theContentIsEncryptedNotPlaintext() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        try store.write(session("alice"))
        let bytes = contents(store.path)
        let text = String(decoding: bytes, as: UTF8.self)
        #expect(!bytes.isEmpty)
        #expect(!text.contains(sentinelAccess))
        #expect(!text.contains(sentinelRefresh))
        #expect(!text.contains("alice"))
    }

    @Test func aWriteLeavesNoTemporaryFileAndReplacesWhole() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store, key: .keyFile)
        for n in 0..<20 { try store.write(session("m\(n % 3)", access: "access-\(n)")) }
        #expect(tmp.files() == ["session.sfstore", "session.sfstore.key", "session.sfstore.spare", "session.sfstore.wlock"])
        #expect(store.read() == .present(session("m1", access: "access-19")))
        // The spare is the whole file before the last write (FileIO.replaceThroughSpare).
        let previous = try FileCredentialStore.decode(contents(store.path + ".spare"), key: SymmetricKey(data: contents(store.keyPath)))
        #expect(previous.active == "m0")
        #expect(previous.accounts["m0"]?.session.accessToken?.reveal() == "access-18")
    }

    @Test func concurrentWritersFromManyStoresAlwaysLeaveADecodableSession() throws {
        let tmp = TemporaryDirectory()
        let done = LockedBox(0)
        let readers = LockedBox<[StoreRead]>([])
        _ = try FileCredentialStore(directory: tmp.store).write(session("seed"))
        let threads = (0..<4).map { index in
            Thread {
                let store = FileCredentialStore(directory: tmp.store)  // separate instances: no shared lock
                for n in 0..<25 {
                    try? store.write(session("writer\(index)", access: "access-\(index)-\(n)"))
                    readers.withLockedValue { $0.append(store.read()) }
                }
                done.withLockedValue { $0 += 1 }
            }
        }
        for thread in threads { thread.start() }
        while done.withLockedValue({ $0 }) < 4 { usleep(1000) }
        let reads = readers.withLockedValue { $0 }
        #expect(reads.count == 100)
        #expect(reads.allSatisfy { if case .present = $0 { true } else { false } })
    }

    @Test(arguments: ["flip", "truncate", "garbage", "empty"])
    func aDamagedFileIsMovedAsideReportedAndReadAsAbsent(damage: String) throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        try store.write(session("alice"))
        var bytes = contents(store.path)
        switch damage {
        case "flip": bytes[bytes.count / 2] ^= 0x40
        case "truncate": bytes = Array(bytes.prefix(bytes.count - 7))
        case "garbage": bytes = Array("{\"not\": \"a store\"}".utf8)
        default: bytes = []
        }
        overwrite(store.path, with: bytes)
        guard case .damaged(let error) = store.read() else {
            Issue.record("expected .damaged")
            return
        }
        #expect(error.message.contains("moved aside"))
        #expect(!error.message.contains(sentinelAccess))
        // moved aside, byte for byte, never deleted
        let aside = tmp.files().filter { $0.hasPrefix("session.sfstore.damaged-") }
        #expect(aside.count == 1)
        #expect(contents(tmp.store + "/" + aside[0]) == bytes)
        #expect(store.read() == .absent)
        // and the store works again
        try store.write(session("bob"))
        #expect(store.read() == .present(session("bob")))
    }

    @Test func aMissingKeyFileMakesTheStoreUnreadableSoItIsMovedAside() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store, key: .keyFile)
        try store.write(session("alice"))
        unlink(store.keyPath)
        guard case .damaged = store.read() else {
            Issue.record("expected .damaged")
            return
        }
        #expect(store.read() == .absent)
    }

    @Test func aProvidedKeyWrapsTheStoresOwnKeyAndAnotherKeyCannotOpenIt() throws {
        let tmp = TemporaryDirectory()
        let key = SymmetricKey(size: .bits256)
        let store = FileCredentialStore(directory: tmp.store, key: .provided(key))
        try store.write(session("alice"))
        // The store's data key is kept beside it, sealed with the host's key (so that logout
        // can rotate it): neither the host's key nor the data key is in it in plain.
        #expect(tmp.files() == ["session.sfstore", "session.sfstore.key", "session.sfstore.wlock"])
        let wrapped = contents(store.keyPath)
        #expect(Array(wrapped.prefix(7)) == Array("SFKEYW\u{1}".utf8))
        #expect(wrapped.count == 7 + 12 + 32 + 16)
        let hostKey = key.withUnsafeBytes { Array($0) }
        #expect(!(0...(wrapped.count - 32)).contains { Array(wrapped[$0..<$0 + 32]) == hostKey })
        #expect((try? FileCredentialStore.decode(contents(store.path), key: key)) == nil, "sealed with the data key, not the host's")
        #expect(FileCredentialStore(directory: tmp.store, key: .provided(key)).read() == .present(session("alice")))
        // Another key cannot read it: unavailable (the host gave the wrong key), and the store
        // is left as it is — neither moved aside nor overwritten.
        let other = FileCredentialStore(directory: tmp.store, key: .provided(SymmetricKey(size: .bits256)))
        guard case .unavailable(let error) = other.read() else {
            Issue.record("expected .unavailable")
            return
        }
        #expect(error.message.contains("does not open with the key the host provided"))
        #expect(throws: StoreError.self) { try other.write(session("mallory")) }
        #expect(tmp.files() == ["session.sfstore", "session.sfstore.key", "session.sfstore.wlock"])
        #expect(store.read() == .present(session("alice")))
    }

    @Test func anUnreachableStoreIsUnavailableNotAbsent() throws {
        let tmp = TemporaryDirectory()
        // a path through a regular file: ENOTDIR, whoever runs the test (root included)
        let blocker = tmp.path + "/blocker"
        overwrite(blocker, with: [])
        close(open(blocker, O_CREAT | O_WRONLY, 0o600))
        let store = FileCredentialStore(directory: blocker + "/store")
        guard case .unavailable = store.read() else {
            Issue.record("expected .unavailable, got \(store.read())")
            return
        }
        #expect(throws: StoreError.self) { try store.write(session("alice")) }
    }

    @Test func accountsAreKeyedWithAnActivePointer() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        try store.write(session("alice", access: "a-access"))
        try store.write(session("bob", access: "b-access"))
        #expect(store.accounts() == ["alice", "bob"])
        #expect(store.read() == .present(session("bob", access: "b-access")))
        #expect(try store.activate(account: "alice"))
        #expect(store.read() == .present(session("alice", access: "a-access")))
        #expect(try !store.activate(account: "carol"))
        try store.clear()
        #expect(store.read() == .absent)
        #expect(store.accounts() == ["bob"])
    }
}

@Suite("FileCredentialStore with a SessionManager")
struct FileStoreSessionTests {
    struct NoAuthority: SessionAuthority {
        func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
            completion.fail(.transient("offline"))
        }
    }

    @Test func aSessionSurvivesARestartAndALogoutDoesToo() async throws {
        let tmp = TemporaryDirectory()
        let loop = try EventLoop()
        defer { _ = try? loop.shutdown() }
        do {
            let manager = try SessionManager(
                loop: loop, authority: NoAuthority(), store: FileCredentialStore(directory: tmp.store))
            try await manager.signIn(SessionTokens(
                accessToken: Secret(sentinelAccess), refreshToken: Secret(sentinelRefresh),
                expiresIn: .seconds(3600), memberID: "alice"))
            await manager.close()
        }
        let restarted = try SessionManager(
            loop: loop, authority: NoAuthority(), store: FileCredentialStore(directory: tmp.store))
        #expect(restarted.state.value == .loggedIn)
        #expect(restarted.memberID == "alice")
        #expect(try await restarted.freshAccessToken() == Secret(sentinelAccess))
        try await restarted.logout()
        await restarted.close()
        let again = try SessionManager(
            loop: loop, authority: NoAuthority(), store: FileCredentialStore(directory: tmp.store))
        #expect(again.state.value == .loggedOut)
        await again.close()
    }

    @Test func aDamagedStoreAtStartIsReportedAndStartsLoggedOut() async throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        try store.write(session("alice"))
        overwrite(store.path, with: Array("garbage".utf8))
        let loop = try EventLoop()
        defer { _ = try? loop.shutdown() }
        let events = LockedBox<[SessionEvent]>([])
        // Made and subscribed in one loop job: the start events cannot run in between.
        let (manager, subscription) = try await loop.submit {
            let manager = try SessionManager(loop: loop, authority: NoAuthority(), store: store)
            let subscription = try manager.events.subscribe(onEvent: { event in events.withLockedValue { $0.append(event) } })
            return (manager, subscription)
        }
        defer { subscription.close() }
        #expect(manager.state.value == .loggedOut)
        for _ in 0..<100 where events.withLockedValue({ $0.isEmpty }) { try await Task.sleep(for: .milliseconds(5)) }
        let first = events.withLockedValue { $0.first }
        guard case .storeError(let error)? = first else {
            Issue.record("expected storeError first, got \(String(describing: first))")
            return
        }
        #expect(error.message.contains("moved aside"))
        await manager.close()
    }
}
