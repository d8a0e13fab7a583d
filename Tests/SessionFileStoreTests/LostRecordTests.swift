import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@testable import SessionFileStore

#if canImport(Glibc)
import Glibc
#endif

// A damaged store file is moved aside by whichever reader meets it first. A record that was in
// it then reads as damaged for an instance that had seen it (`RecordWitness`), so the session
// holding it writes it back, instead of taking its absence for another process's logout.

@Suite("Records lost with a damaged file", .serialized)
struct LostRecordTests {
    private func damaged(_ tmp: TemporaryDirectory, _ path: String, _ kind: String) {
        replaceFile(path, with: damage(contents(path), kind), staging: tmp.path + "/staging")
    }

    private func copies(_ tmp: TemporaryDirectory) -> [String] {
        tmp.files().filter { $0.hasPrefix("session.sfstore.damaged-") }
    }

    @Test(arguments: ["garbage", "header-then-garbage", "truncated", "empty"])
    func aRecordAnotherReaderLostWithDamageReadsAsDamagedOnce(kind: String) throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        try store.write(session("alice"))
        #expect(summary(of: store.read()) == aliceStored)
        damaged(tmp, store.path, kind)
        // Another process's reader meets the damage and moves the file aside.
        guard case .damaged = FileCredentialStore(directory: tmp.store).read() else {
            Issue.record("the other reader did not find the damage")
            return
        }
        #expect(copies(tmp).count == 1)
        guard case .damaged(let error) = store.read() else {
            Issue.record("a record lost with the damage read as absent: a session would follow it as a logout")
            return
        }
        #expect(error.message.contains("moved it aside to \(tmp.store)/\(copies(tmp).first ?? "?")"), "\(error.message)")
        #expect(!error.message.contains(sentinelAccess) && !error.message.contains(sentinelRefresh))
        // Once per damage; and an instance that never saw the record has nothing to report.
        #expect(store.read() == .absent)
        #expect(FileCredentialStore(directory: tmp.store).read() == .absent)
        // Written back, and damaged again: reported again.
        try store.write(session("alice"))
        damaged(tmp, store.path, kind)
        _ = FileCredentialStore(directory: tmp.store).read()
        #expect(copies(tmp).count == 2)
        guard case .damaged = store.read() else {
            Issue.record("the second damage was not reported")
            return
        }
    }

    @Test func aRecordThisInstanceClearedReadsAsAbsentWhateverCopiesThereAre() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        try store.write(session("alice"))
        damaged(tmp, store.path, "garbage")
        _ = FileCredentialStore(directory: tmp.store).read()
        try store.clear()
        #expect(copies(tmp).count == 1)
        #expect(store.read() == .absent)
        let alice = store.account("alice", isActive: true)
        try alice.write(session("alice"))
        damaged(tmp, store.path, "garbage")
        _ = FileCredentialStore(directory: tmp.store).read()
        try alice.clear()
        #expect(alice.read() == .absent)
    }

    /// One account's change meets the damage (a refresh's write, the pointer's writer): it
    /// starts afresh with its own record. The other accounts' records read as damaged, so their
    /// sessions write themselves back.
    @Test(arguments: ["write", "pointer", "logout"])
    func anotherAccountsChangeOverDamageLeavesTheOthersDamaged(change: String) throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        let alice = store.account("alice", isActive: true)
        let bob = store.account("bob", isActive: false)
        try alice.write(session("alice"))
        try bob.write(session("bob", access: "bob-access", refresh: "bob-refresh"))
        #expect(summary(of: bob.read()) == "present bob bob-access")
        damaged(tmp, store.path, "header-then-garbage")
        switch change {
        case "write": try alice.write(session("alice", access: "alice-2"))
        case "pointer": try store.setActiveAccount("alice")
        default: try alice.clear()
        }
        #expect(copies(tmp).count == 1, "\(tmp.files())")
        guard case .damaged(let error) = bob.read() else {
            Issue.record("bob's record, lost with the damage, read as absent")
            return
        }
        #expect(error.message.contains("account \"bob\""), "\(error.message)")
        #expect(bob.read() == .absent)
        switch change {
        case "write":
            #expect(summary(of: alice.read()) == "present alice alice-2")
        case "pointer":
            // The pointer's writer left alice's record out too: lost with the damage.
            guard case .damaged = alice.read() else {
                Issue.record("alice's record, lost with the damage, read as absent after the pointer's write")
                return
            }
        default:
            // Alice's own logout: her record's absence is what she asked for.
            #expect(alice.read() == .absent)
        }
    }

    /// A running session's store is damaged, and another process's reader moves it aside first:
    /// the session reports the damage and writes itself back (it used to follow "another
    /// process's logout" and end).
    @Test func aRunningSessionWritesItselfBackAfterAnotherReaderMovedTheDamageAside() async throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        let observed = try await observedSession(store: FileCredentialStore(directory: tmp.store))
        try await observed.manager.signIn(tokens("alice"))
        #expect(await eventually { await observed.manager.watchesStore() }, "the session never watched its store")
        // The sign-in's own write was read back by the session (its watch): it has seen it.
        #expect(await eventually(timeout: .seconds(30)) { summary(of: store.read()) == aliceStored })
        // What another process's reader does on meeting damage (`moveAside`): one rename of the
        // file to `<name>.damaged-<seconds>-<nanoseconds>`. Done here in that one step, without
        // writing the damage first, so that the session's watch cannot meet the damage itself.
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        #expect(rename(store.path, "\(store.path).damaged-\(now.tv_sec)-\(now.tv_nsec)") == 0)
        let message = await observed.storeError(containing: "moved it aside", within: .seconds(60))
        #expect(message != nil, "store errors: \(observed.storeErrors); files: \(tmp.files()); log:\n\(observed.output)")
        #expect(await eventually(timeout: .seconds(30)) { summary(of: store.read()) == aliceStored }, "written again from memory")
        #expect(observed.manager.state.value == .loggedIn)
        await observed.stop()
    }
}
