import CSecretService
import Crypto
import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@_spi(Fuzzing) @testable import SessionFileStore

#if canImport(Glibc)
import Glibc
#endif

/// The store's keys (issue 14, point 3): where the key comes from, logout rotating it
/// (crypto-shredding earlier copies), records bound to their account and the file to its name.
@Suite("Store keys")
struct StoreKeyTests {
    enum Source: String, CaseIterable, Sendable, CustomTestStringConvertible {
        case keyFile, provided
        var testDescription: String { rawValue }
    }

    static let hostKey = SymmetricKey(size: .bits256)

    static func key(_ source: Source) -> FileCredentialStore.Key {
        source == .keyFile ? .keyFile : .provided(hostKey)
    }

    static func home(_ source: Source) -> KeyHome {
        source == .keyFile ? .file : .wrapped(hostKey)
    }

    /// The key ring the store keeps now (read through the store's own code).
    static func ring(_ store: FileCredentialStore, _ source: Source) throws -> [SymmetricKey] {
        guard case .opened(let directory) = TrustedDirectory.open(store.directory, create: false) else {
            throw SetupFailure(description: "cannot open \(store.directory)")
        }
        return try store.loadRing(home(source), in: directory)
    }

    static func keys(inKeyFile bytes: [UInt8]) -> [SymmetricKey] {
        stride(from: 0, to: bytes.count - bytes.count % 32, by: 32).map { SymmetricKey(data: bytes[$0..<$0 + 32]) }
    }

    static func damaged(_ read: StoreRead) -> Bool {
        if case .damaged = read { return true }
        return false
    }

    // MARK: Logout rotates the key

    @Test(arguments: Source.allCases)
    func aBackupTakenBeforeLogoutCannotBeDecryptedAfterIt(_ source: Source) throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store, key: Self.key(source))
        try store.write(session("alice"))
        try store.write(session("bob"))
        let backup = contents(store.path)
        let keyFileBefore = contents(store.keyPath)
        let before = try Self.ring(store, source)
        // Before the logout the copy opens with what is on the machine (so the check below means something).
        #expect((try? FileCredentialStore.decode(backup, name: "session.sfstore", keys: before)) != nil)

        try store.clear()

        #expect(store.read() == .absent)
        #expect(store.accounts() == ["alice"], "the other account survives the logout")
        let after = try Self.ring(store, source)
        #expect(after.count == 1, "the old key is dropped once the file is sealed with the new one")
        #expect(StoreKeyID.of(after[0]) != StoreKeyID.of(before[0]))
        // Nothing left on the machine opens the copy: not the key file, not the host's key.
        var leftovers = after + Self.keys(inKeyFile: contents(store.keyPath))
        if source == .provided { leftovers.append(Self.hostKey) }
        #expect(throws: (any Error).self) { try FileCredentialStore.decode(backup, name: "session.sfstore", keys: leftovers) }
        // Put back over the store, the copy is damage (moved aside), not bob's session.
        overwrite(store.path, with: backup)
        let read = store.read()
        #expect(Self.damaged(read), "\(summary(of: read))")
        #expect(store.read() == .absent)
        #expect(tmp.files().contains { $0.hasPrefix("session.sfstore.damaged-") })
        // What rotation does not do (docs/storage-and-oauth.md, threat model): a copy of the key file taken with
        // the store (a backup of the whole directory) still opens it — for a key file; for a
        // host's key, the copied wrapped key still needs the host's key.
        if source == .keyFile {
            #expect((try? FileCredentialStore.decode(backup, name: "session.sfstore", keys: Self.keys(inKeyFile: keyFileBefore))) != nil)
        }
    }

    @Test(arguments: Source.allCases)
    func aRotationCutShortAtEitherStepLeavesAStoreThatOpensAndTheNextChangeFinishesIt(_ source: Source) throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store, key: Self.key(source))
        try store.write(session("alice"))
        try store.write(session("bob"))
        guard case .opened(let directory) = TrustedDirectory.open(tmp.store, create: false) else {
            Issue.record("cannot open the store's directory")
            return
        }
        let home = Self.home(source)

        // Cut after step 1: the ring is {new, old}, the file still sealed with old.
        let old = try Self.ring(store, source)
        let first = SymmetricKey(size: .bits256)
        try store.storeRing([first] + old, home, create: false, in: directory)
        #expect(store.read() == .present(session("bob")))
        #expect(store.accounts() == ["alice", "bob"])
        try store.write(session("carol"))
        var ring = try Self.ring(store, source)
        #expect(ring.count == 1 && StoreKeyID.of(ring[0]) == StoreKeyID.of(first), "the next change finishes the rotation")
        #expect(StoreHeader(contents(store.path))?.keyID == StoreKeyID.of(first))

        // Cut after step 2: the ring is {new, old}, the file sealed with new.
        let second = SymmetricKey(size: .bits256)
        try store.storeRing([second] + ring, home, create: false, in: directory)
        let document = try FileCredentialStore.decode(contents(store.path), name: "session.sfstore", keys: ring)
        overwrite(store.path, with: try FileCredentialStore.encode(document, key: second, source: home.tag))
        #expect(store.read() == .present(session("carol")))
        try store.clear()
        ring = try Self.ring(store, source)
        #expect(ring.count == 1)
        #expect(!ring.contains { StoreKeyID.of($0) == StoreKeyID.of(second) || StoreKeyID.of($0) == StoreKeyID.of(first) })
        #expect(store.accounts() == ["alice", "bob"])
    }

    /// A process that logs out over and over (key file store), SIGKILLed at random moments:
    /// the store always opens, never damaged, the account it keeps is never lost, and the ring
    /// never holds more than the two keys of one rotation. Until one logout has been seen to
    /// complete, a round waits for the probe's first `rotated` line before its random delay
    /// (on a loaded machine no logout may finish within 30 ms of "ready", and then the kills
    /// would say nothing about a store mid-rotation); the other rounds kill at any moment.
    @Test(.timeLimit(.minutes(10)))
    func aLogoutKilledAtRandomMomentsNeverLosesTheStore() async throws {
        let failures = try await onOwnThread { () throws -> [String] in
            let probe = try sessionProbeExecutable()
            let tmp = TemporaryDirectory()
            var failures: [String] = []
            var kills = 0
            var rotations = 0
            var midRotation = 0
            let store = FileCredentialStore(directory: tmp.store, key: .keyFile)
            for round in 0..<120 {
                let child = try ChildProcess(probe, ["--rotate-loop", tmp.store])
                guard child.waitForLine(where: { $0 == "ready" }) != nil else {
                    return ["the probe never became ready: \(child.readToEnd())"]
                }
                if rotations == 0 {
                    // The precondition, waited for (a generous hang guard, not a time bound).
                    guard child.waitForLine(timeout: .seconds(120), where: { $0.hasPrefix("rotated ") }) != nil else {
                        return ["round \(round): the probe never completed a logout: \(child.readToEnd())"]
                    }
                }
                usleep(UInt32.random(in: 0...30_000))
                child.kill()
                child.waitForExit()
                kills += 1
                let lines = child.readToEnd()
                if let error = lines.first(where: { $0.hasPrefix("ERROR") || $0.hasPrefix("Fatal") }) {
                    return ["round \(round): the probe failed: \(error)"]
                }
                rotations += lines.filter { $0.hasPrefix("rotated ") }.count
                let keyCount = contents(store.keyPath).count / 32
                if keyCount == 2 { midRotation += 1 }
                if keyCount > 2 { failures.append("round \(round): the ring holds \(keyCount) keys") }
                let read = store.read()
                switch read {
                case .absent, .present: break
                default: failures.append("round \(round): after a SIGKILL the store reads \(summary(of: read))")
                }
                let accounts = store.accounts()
                if !Set(accounts).isSubset(of: ["keep", "gone"]) || (rotations > 0 && !accounts.contains("keep")) {
                    failures.append("round \(round): accounts \(accounts) after \(rotations) logouts")
                }
                let damaged = tmp.files().filter { $0.contains(".damaged-") }
                if !damaged.isEmpty { return failures + ["round \(round): moved aside as damaged: \(damaged)"] }
                if !failures.isEmpty { return failures }
            }
            try store.write(session("after"))
            if contents(store.keyPath).count != 32 { failures.append("a write after the kills left \(contents(store.keyPath).count / 32) keys") }
            print("rotation crash test: \(kills) SIGKILLs, \(rotations) logouts reported, \(midRotation) left the ring mid-rotation")
            if rotations == 0 { failures.append("no logout ever completed: the kills say nothing") }
            return failures
        }
        for failure in failures { Issue.record(Comment(rawValue: failure)) }
    }

    // MARK: Binding

    @Test func aRecordFiledUnderAnotherAccountIsDamaged() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store, key: .keyFile)
        try store.write(session("alice"))
        try store.write(session("bob"))
        let keys = Self.keys(inKeyFile: contents(store.keyPath))
        var document = try FileCredentialStore.decode(contents(store.path), name: "session.sfstore", keys: keys)
        let plaintext = { (document: FileCredentialStore.Document) in try FoundationWrittenDocument.json(document) }
        // Sealed as it is (each record under its own account), the file opens...
        overwrite(store.path, with: try FileCredentialStore.seal(plaintext(document), key: keys[0]))
        #expect(store.read() == .present(session("bob")))
        // ...with the records swapped between the accounts (sealed with the right key), it is damaged.
        let alice = document.accounts["alice"]
        document.accounts["alice"] = document.accounts["bob"]
        document.accounts["bob"] = alice
        overwrite(store.path, with: try FileCredentialStore.seal(plaintext(document), key: keys[0]))
        let read = store.read()
        guard case .damaged(let error) = read else {
            Issue.record("a swapped record read as \(summary(of: read))")
            return
        }
        #expect(error.message.contains("filed under another account"))
    }

    @Test func aStoreFileCopiedOverAnotherStoresNameIsDamaged() throws {
        let tmp = TemporaryDirectory()
        let first = FileCredentialStore(directory: tmp.store, name: "first.sfstore", key: .keyFile)
        let second = FileCredentialStore(directory: tmp.store, name: "second.sfstore", key: .keyFile)
        try first.write(session("alice"))
        try second.write(session("bob"))
        // The second store is given the first one's key, then the first one's file.
        overwrite(second.keyPath, with: contents(first.keyPath))
        let own = second.read()
        #expect(Self.damaged(own), "its own file no longer opens: \(summary(of: own))")
        try second.write(session("bob"))
        #expect(second.read() == .present(session("bob")))
        overwrite(second.path, with: contents(first.path))
        let read = second.read()
        #expect(Self.damaged(read), "another store's file read as \(summary(of: read))")
        #expect(first.read() == .present(session("alice")))
    }

    // MARK: Sources

    static var noSessionBus: Bool { sfss_session_bus_present() == 0 }

    @Test(.enabled(if: noSessionBus, "this process has a session bus"))
    func withoutASessionBusAutomaticUsesAKeyFileAndTheSecretServiceIsUnavailable() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        try store.write(session("alice"))
        #expect(StoreHeader(contents(store.path))?.source == .keyFile)
        #expect(contents(store.keyPath).count == 32)
        #expect(store.read() == .present(session("alice")))

        let other = TemporaryDirectory()
        let required = FileCredentialStore(directory: other.store, key: .secretService)
        let started = ContinuousClock.now
        #expect(throws: StoreError.self) { try required.write(session("bob")) }
        // A hang guard, not a speed test: without a bus a D-Bus client that waited would wait
        // its 25 s default timeout; failing at once takes milliseconds.
        #expect(ContinuousClock.now - started < .seconds(10), "no bus: it fails at once")
        do {
            try required.write(session("bob"))
        } catch {
            #expect(error.message.contains("Secret Service") && error.message.contains("no D-Bus session bus"))
        }
        #expect(!other.files().contains { $0.hasPrefix("session.sfstore") && !$0.hasSuffix(".wlock") })
    }

    /// The ssh login: a store whose key is in the Secret Service, read without a bus.
    @Test(.enabled(if: noSessionBus, "this process has a session bus"))
    func aStoreSealedInTheSecretServiceIsUnavailableWithoutABusAndNeverOverwritten() throws {
        let tmp = TemporaryDirectory()
        mkdir(tmp.store, 0o700)
        var document = FileCredentialStore.Document()
        document.accounts["alice"] = FileCredentialStore.Record(session("alice"))
        document.active = "alice"
        let sealed = try FileCredentialStore.encode(document, key: SymmetricKey(size: .bits256), source: .secretService)
        #expect(FileManager.default.createFile(atPath: tmp.store + "/session.sfstore", contents: Data(sealed), attributes: [.posixPermissions: 0o600]))
        for key in [FileCredentialStore.Key.automatic, .secretService] {
            let store = FileCredentialStore(directory: tmp.store, key: key)
            guard case .unavailable(let error) = store.read() else {
                Issue.record("read as \(summary(of: store.read()))")
                continue
            }
            #expect(error.message.contains("in the Secret Service, which cannot be reached"))
            #expect(throws: StoreError.self) { try store.write(session("bob")) }
            #expect(throws: StoreError.self) { try store.clear() }
        }
        for key in [FileCredentialStore.Key.keyFile, .provided(Self.hostKey)] {
            let store = FileCredentialStore(directory: tmp.store, key: key)
            guard case .unavailable(let error) = store.read() else {
                Issue.record("read as \(summary(of: store.read()))")
                continue
            }
            #expect(error.message.contains("is sealed with the Secret Service, but the store was opened with"))
            #expect(throws: StoreError.self) { try store.write(session("bob")) }
        }
        #expect(contents(tmp.store + "/session.sfstore") == sealed, "never overwritten")
        #expect(tmp.files() == ["session.sfstore", "session.sfstore.wlock"], "no key file made, nothing moved aside")
    }

    @Test func aStoreOfTheKeyFileIsNotOpenedWithAHostsKeyNorTheOtherWay() throws {
        let tmp = TemporaryDirectory()
        try FileCredentialStore(directory: tmp.store, key: .keyFile).write(session("alice"))
        let bytes = contents(tmp.store + "/session.sfstore")
        let hosted = FileCredentialStore(directory: tmp.store, key: .provided(Self.hostKey))
        guard case .unavailable = hosted.read() else {
            Issue.record("read as \(summary(of: hosted.read()))")
            return
        }
        #expect(throws: StoreError.self) { try hosted.write(session("mallory")) }
        #expect(contents(tmp.store + "/session.sfstore") == bytes)
        #expect(FileCredentialStore(directory: tmp.store).read() == .present(session("alice")), ".automatic keeps the key file")
    }

    /// Stores written before key rotation (version 1: the magic alone, the key file's one key)
    /// still open, and the next write seals them as version 2.
    @Test func aVersion1StoreStillOpensAndIsUpgradedOnTheNextWrite() throws {
        let tmp = TemporaryDirectory()
        mkdir(tmp.store, 0o700)
        let key = SymmetricKey(size: .bits256)
        var document = FileCredentialStore.Document()
        document.version = 1
        document.accounts["alice"] = FileCredentialStore.Record(session("alice"))
        document.active = "alice"
        let magic = Array("SFSTORE".utf8) + [1]
        let box = try AES.GCM.seal(try FoundationWrittenDocument.json(document), using: key, authenticating: magic)
        let create = { (path: String, bytes: [UInt8]) in
            FileManager.default.createFile(atPath: path, contents: Data(bytes), attributes: [.posixPermissions: 0o600])
        }
        #expect(create(tmp.store + "/session.sfstore", magic + Array(box.combined!)))
        #expect(create(tmp.store + "/session.sfstore.key", key.withUnsafeBytes { Array($0) }))
        let store = FileCredentialStore(directory: tmp.store)
        #expect(store.read() == .present(session("alice")))
        try store.write(session("bob"))
        #expect(StoreHeader(contents(store.path))?.version == 2)
        #expect(store.accounts() == ["alice", "bob"])
    }

    @Test func aHostsKeyFileIsCheckedLikeTheStoresOwnFilesAndNeverQuoted() throws {
        let tmp = TemporaryDirectory()
        mkdir(tmp.store, 0o700)
        let raw = [UInt8]((0..<32).map { UInt8($0 * 7 & 0xff) })
        let hex = raw.map { String(format: "%02x", $0) }.joined()
        let rawPath = tmp.store + "/raw.key"
        let hexPath = tmp.store + "/hex.key"
        _ = FileManager.default.createFile(atPath: rawPath, contents: Data(raw), attributes: [.posixPermissions: 0o600])
        _ = FileManager.default.createFile(atPath: hexPath, contents: Data((hex + "\n").utf8), attributes: [.posixPermissions: 0o600])
        let fromRaw = try FileCredentialStore.Key.fromFile(rawPath)
        let fromHex = try FileCredentialStore.Key.fromFile(hexPath)
        try FileCredentialStore(directory: tmp.path + "/data", key: fromRaw).write(session("alice"))
        #expect(FileCredentialStore(directory: tmp.path + "/data", key: fromHex).read() == .present(session("alice")))

        func refusal(_ path: String) -> String? {
            do {
                _ = try FileCredentialStore.Key.fromFile(path)
                return nil
            } catch {
                return error.message
            }
        }
        chmod(hexPath, 0o644)
        #expect(refusal(hexPath)?.contains("open to group or others") == true)
        chmod(hexPath, 0o600)
        symlink(rawPath, tmp.store + "/link.key")
        #expect(refusal(tmp.store + "/link.key")?.contains("symbolic link") == true)
        _ = FileManager.default.createFile(atPath: tmp.store + "/short.key", contents: Data(hex.prefix(40).utf8), attributes: [.posixPermissions: 0o600])
        #expect(refusal(tmp.store + "/short.key")?.contains("neither 32 bytes nor 64 hex digits") == true)
        #expect(refusal(tmp.store + "/missing.key")?.contains("does not exist") == true)
        chmod(tmp.store, 0o777)
        #expect(refusal(rawPath)?.contains("writable by group or others") == true)
        chmod(tmp.store, 0o700)
        for message in [refusal(tmp.store + "/short.key") ?? ""] {
            #expect(!message.contains(String(hex.prefix(16))))
        }
    }

    // MARK: The Secret Service, for real

    /// gnome-keyring-daemon under dbus-run-session (Debian: dbus, gnome-keyring,
    /// libsecret-1-0; scripts/test.sh installs them): the probe checks, inside that session,
    /// that the key is kept in the Secret Service (no key file) and that logout rotates it
    /// there. Then this process — which has no session bus, like an ssh login — opens the
    /// same store: unavailable, never overwritten, no key file made.
    @Test(.timeLimit(.minutes(1)), .enabled(if: noSessionBus, "this process has a session bus"))
    func theSecretServiceKeepsTheKeyLogoutRotatesItThereAndWithoutTheBusTheStoreIsUnavailable() async throws {
        for tool in ["/usr/bin/dbus-run-session", "/usr/bin/dbus-send", "/usr/bin/gnome-keyring-daemon"] where access(tool, X_OK) != 0 {
            Issue.record("\(tool) is missing: apt-get install dbus gnome-keyring libsecret-1-0 (scripts/test.sh does)")
            return
        }
        let tmp = TemporaryDirectory()
        let home = tmp.path + "/home"
        mkdir(home, 0o700)
        let probe = try sessionProbeExecutable()
        let (lines, status) = try await onOwnThread { () throws -> ([String], Int32) in
            // A keyring of its own (HOME), unlocked, on a session bus of its own: the daemon is
            // registered before the probe starts and stopped after it, so that nothing outlives
            // the test.
            let child = try ChildProcess("/bin/bash", [
                repositoryPath("scripts/with-private-keyring.sh"), home, probe, "--keyring", tmp.store,
            ])
            let lines = child.readToEnd(timeout: .seconds(45))
            let raw = child.waitForExit()
            return (lines, (raw & 0x7f) == 0 ? (raw >> 8) & 0xff : 128 + (raw & 0x7f))
        }
        let report = lines.filter { $0.hasPrefix("CHECK") || $0.hasPrefix("FAIL") || $0.hasPrefix("DONE") }
        #expect(status == 0, "\(lines)")
        #expect(lines.contains("DONE"), "\(lines)")
        #expect(!lines.contains { $0.hasPrefix("FAIL") }, "\(report)")
        #expect(report.filter { $0.hasPrefix("CHECK") }.count == 12, "\(report)")
        #expect(!lines.contains { $0.contains("access-alice") || $0.contains("refresh-alice") })

        // Without the bus: the store says where its key is, and is left alone.
        let store = FileCredentialStore(directory: tmp.store)
        let bytes = contents(store.path)
        #expect(StoreHeader(bytes)?.source == .secretService)
        guard case .unavailable(let error) = store.read() else {
            Issue.record("without the bus the store read as \(summary(of: store.read()))")
            return
        }
        #expect(error.message.contains("in the Secret Service, which cannot be reached"))
        #expect(throws: StoreError.self) { try store.write(session("mallory")) }
        #expect(contents(store.path) == bytes)
        #expect(!tmp.files().contains("session.sfstore.key"))
    }
}
