import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@_spi(Fuzzing) @testable import SessionFileStore

#if canImport(Glibc)
import Glibc
#endif

// A damaged store file is moved aside by whichever reader meets it first. A record that was in
// it then reads as damaged for an instance that had seen it (`RecordWitness`), so the session
// holding it writes it back, instead of taking its absence for another process's logout. A
// logout stays a logout (the document's `cleared`), whatever the copies and the clock.

@Suite("Records lost with a damaged file", .serialized)
struct LostRecordTests {
    private func damaged(_ tmp: TemporaryDirectory, _ path: String, _ kind: String) {
        replaceFile(path, with: damage(contents(path), kind), staging: tmp.path + "/staging")
    }

    /// Damages the store file; another process's reader meets the damage and moves it aside.
    private func damagedAndMovedAside(_ tmp: TemporaryDirectory, _ path: String, _ kind: String) {
        damaged(tmp, path, kind)
        _ = FileCredentialStore(directory: tmp.store).read()
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
        damagedAndMovedAside(tmp, store.path, kind)
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
        damagedAndMovedAside(tmp, store.path, "garbage")
        try store.clear()
        #expect(copies(tmp).count == 1)
        #expect(store.read() == .absent)
        let alice = store.account("alice", isActive: true)
        try alice.write(session("alice"))
        damagedAndMovedAside(tmp, store.path, "garbage")
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

    /// An instance that only read the record (a session restored at start) knows it too.
    @Test func aRecordOnlyReadIsKnownToo() throws {
        let tmp = TemporaryDirectory()
        try FileCredentialStore(directory: tmp.store).write(session("alice"))
        let reader = FileCredentialStore(directory: tmp.store)
        #expect(summary(of: reader.read()) == aliceStored)
        damagedAndMovedAside(tmp, reader.path, "garbage")
        guard case .damaged = reader.read() else {
            Issue.record("a record only read, lost with the damage, read as absent")
            return
        }
    }

    /// Another process logs the account out, with copies of an earlier damage beside the store,
    /// or meeting the damage itself: its other sessions read the logout (absent), not damage;
    /// another account's record lost with that damage still reads damaged.
    @Test(arguments: ["old copies", "meets the damage", "plain clear"])
    func anotherInstancesLogoutIsALogoutWhateverTheCopies(case name: String) throws {
        let tmp = TemporaryDirectory()
        let here = FileCredentialStore(directory: tmp.store)
        let there = FileCredentialStore(directory: tmp.store)
        if name == "plain clear" {
            try there.write(session("alice"))
            #expect(summary(of: here.read()) == aliceStored)
            damaged(tmp, here.path, "garbage")
            try there.clear()
            #expect(here.read() == .absent, "the plain logout read as damage")
            return
        }
        try there.account("alice", isActive: true).write(session("alice"))
        try there.account("bob", isActive: false).write(session("bob", access: "bob-access", refresh: "bob-refresh"))
        if name == "old copies" {
            damagedAndMovedAside(tmp, here.path, "garbage")
            try there.account("alice", isActive: true).write(session("alice"))
            try there.account("bob", isActive: false).write(session("bob", access: "bob-access", refresh: "bob-refresh"))
        }
        #expect(summary(of: here.account("alice", isActive: true).read()) == aliceStored)
        #expect(summary(of: here.account("bob", isActive: false).read()) == "present bob bob-access")
        if name == "meets the damage" { damaged(tmp, here.path, "header-then-garbage") }
        try there.account("alice", isActive: true).clear()
        #expect(!copies(tmp).isEmpty)
        #expect(here.account("alice", isActive: true).read() == .absent, "alice's logout read as damage")
        if name == "meets the damage" {
            guard case .damaged = here.account("bob", isActive: false).read() else {
                Issue.record("bob's record, lost with the damage alice's logout met, read as absent")
                return
            }
        } else {
            #expect(summary(of: here.account("bob", isActive: false).read()) == "present bob bob-access")
        }
        // Alice signs in again: her record is hers, and a later loss is damage again.
        try there.account("alice", isActive: true).write(session("alice"))
        #expect(summary(of: here.account("alice", isActive: true).read()) == aliceStored)
        damagedAndMovedAside(tmp, here.path, "garbage")
        guard case .damaged = here.account("alice", isActive: true).read() else {
            Issue.record("after signing in again, alice's record lost with damage read as absent")
            return
        }
    }

    /// No clock is compared: a copy named with a time far ahead (a clock stepped back since) or
    /// far behind (stepped forward) is judged by whether it was there when the record was seen.
    @Test func copiesAreJudgedByNameNotByTheTimeInIt() throws {
        let tmp = TemporaryDirectory()
        let here = FileCredentialStore(directory: tmp.store)
        let there = FileCredentialStore(directory: tmp.store)
        let future = tmp.store + "/session.sfstore.damaged-99999999999-1"
        try there.write(session("alice"))
        _ = FileManager.default.createFile(atPath: future, contents: Data(), attributes: [.posixPermissions: 0o600])
        #expect(summary(of: here.read()) == aliceStored)
        // A real logout elsewhere, no damage: absent (the copy from "the future" was known).
        try there.account("alice", isActive: true).clear()
        #expect(here.read() == .absent)
        // A copy from "the past" made after the record was seen is new.
        try there.write(session("alice"))
        #expect(summary(of: here.read()) == aliceStored)
        #expect(rename(here.path, tmp.store + "/session.sfstore.damaged-1-1") == 0)
        guard case .damaged = here.read() else {
            Issue.record("a copy named with an old time, made after the record was seen, was not taken as damage")
            return
        }
    }

    /// An absence that is no damage (a logout followed) is forgotten: damage appearing later is
    /// not reported for a record the session no longer holds.
    @Test func anAbsenceFollowedIsForgotten() throws {
        let tmp = TemporaryDirectory()
        let here = FileCredentialStore(directory: tmp.store)
        let there = FileCredentialStore(directory: tmp.store)
        try there.write(session("alice"))
        #expect(summary(of: here.read()) == aliceStored)
        try there.clear()
        #expect(here.read() == .absent)
        try there.write(session("bob", access: "bob-access", refresh: "bob-refresh"))
        damagedAndMovedAside(tmp, here.path, "garbage")
        #expect(here.read() == .absent)
    }

    /// A logout with copies beside the store empties them (what they hold may be sealed with a
    /// key no rotation reaches) and keeps their names, also at the last account's logout: a
    /// document written after the damage cannot tell whose records were lost with it.
    @Test func aLogoutEmptiesTheCopiesAndKeepsTheirNames() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        try store.account("alice", isActive: true).write(session("alice"))
        try store.account("bob", isActive: false).write(session("bob", access: "bob-access", refresh: "bob-refresh"))
        damagedAndMovedAside(tmp, store.path, "truncated")
        let aside = copies(tmp)
        #expect(aside.count == 1 && !contents(tmp.store + "/" + aside[0]).isEmpty)
        try store.account("alice", isActive: true).write(session("alice"))
        try store.account("bob", isActive: false).write(session("bob", access: "bob-access", refresh: "bob-refresh"))
        try store.account("alice", isActive: true).clear()
        #expect(copies(tmp) == aside, "the copy's name is kept")
        #expect(contents(tmp.store + "/" + aside[0]).isEmpty, "the copy still holds what it held")
        #expect(mode(tmp.store + "/" + aside[0]) == 0o600)
        #expect(try storedDocument(tmp.store).cleared == ["alice"])
        // Signed in again: out of the list.
        try store.account("alice", isActive: true).write(session("alice"))
        #expect(try storedDocument(tmp.store).cleared.isEmpty)
        try store.account("alice", isActive: true).clear()
        try store.account("bob", isActive: false).clear()
        #expect(copies(tmp) == aside, "\(tmp.files())")
        #expect(try storedDocument(tmp.store).cleared == ["alice", "bob"])
        #expect(!tmp.files().contains { $0.contains(".tmp-") || $0.contains(".new-") }, "\(tmp.files())")
    }

    /// Every account of a damaged file logged out one after another (logout_all): the last
    /// logout's document is whole and empty, yet a third account lost with the damage, seen by
    /// another instance, still reads damaged (the copies were once removed at that logout).
    @Test func loggingEveryoneOutOverDamageLeavesTheLostAccountDamaged() throws {
        let tmp = TemporaryDirectory()
        let here = FileCredentialStore(directory: tmp.store)
        let there = FileCredentialStore(directory: tmp.store)
        try there.account("alice", isActive: true).write(session("alice"))
        try there.account("bob", isActive: false).write(session("bob", access: "bob-access", refresh: "bob-refresh"))
        try here.account("carol", isActive: false).write(session("carol", access: "carol-access", refresh: "carol-refresh"))
        damaged(tmp, here.path, "garbage")
        try there.account("alice", isActive: true).clear()
        try there.account("bob", isActive: false).clear()
        guard case .damaged = here.account("carol", isActive: false).read() else {
            Issue.record("carol's record, lost with the damage, read as a logout after the others logged out")
            return
        }
    }

    /// This instance's own logout of an account, whichever way it read it (its record, or the
    /// active one), is expected: a damage afterwards is not reported for it.
    @Test func thisInstancesOwnLogoutIsForgottenWhateverDamageFollows() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        let alice = store.account("alice", isActive: true)
        try alice.write(session("alice"))
        #expect(summary(of: store.read()) == aliceStored)  // the active record, seen too
        try alice.clear()  // no copies beside the store: nothing in `cleared`
        try FileCredentialStore(directory: tmp.store).write(session("bob", access: "bob-access", refresh: "bob-refresh"))
        damagedAndMovedAside(tmp, store.path, "garbage")
        #expect(alice.read() == .absent)
        #expect(store.read() == .absent, "the active record, last seen as alice's, read as damaged")
    }

    /// The mirror: the plain clear() of the active account this instance wrote as a record.
    @Test func thisInstancesPlainLogoutForgetsTheAccountsRecordToo() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        let alice = store.account("alice", isActive: true)
        try alice.write(session("alice"))
        try store.clear()  // the active account: alice
        try FileCredentialStore(directory: tmp.store).write(session("bob", access: "bob-access", refresh: "bob-refresh"))
        damagedAndMovedAside(tmp, store.path, "garbage")
        #expect(alice.read() == .absent, "alice's record, logged out here, read as damaged")
    }

    /// A copy is emptied once: later logouts leave it (and the directory) as it is.
    @Test func aCopyIsEmptiedOnce() throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        try store.account("alice", isActive: true).write(session("alice"))
        damagedAndMovedAside(tmp, store.path, "garbage")
        try store.account("alice", isActive: true).write(session("alice"))
        try store.account("alice", isActive: true).clear()
        let aside = try #require(copies(tmp).first)
        var first = stat()
        #expect(lstat(tmp.store + "/" + aside, &first) == 0 && first.st_size == 0)
        try store.account("alice", isActive: true).write(session("alice"))
        try store.account("alice", isActive: true).clear()
        var second = stat()
        #expect(lstat(tmp.store + "/" + aside, &second) == 0 && second.st_ino == first.st_ino, "emptied again")
    }

    /// A signed-out session that meets damage reports it and goes on following the store: it
    /// has nothing to write back (it stayed "behind" for good, and ignored every later change,
    /// another process's sign-in included).
    @Test func aSignedOutSessionThatMeetsDamageStillFollowsASignInElsewhere() async throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        try store.write(session("alice"))
        try store.clear()
        let observed = try await observedSession(store: FileCredentialStore(directory: tmp.store))
        #expect(await eventually { await observed.manager.watchesStore() }, "the session never watched its store")
        #expect(observed.manager.state.value == .loggedOut)
        replaceFile(store.path, with: Array("garbage, not a store".utf8), staging: tmp.path + "/staging")
        let message = await observed.storeError(containing: "damaged", within: .seconds(60))
        #expect(message != nil, "store errors: \(observed.storeErrors); log:\n\(observed.output)")
        try FileCredentialStore(directory: tmp.store).write(session("bob", access: "bob-access", refresh: "bob-refresh"))
        #expect(
            await eventually(timeout: .seconds(30)) { observed.manager.state.value == .loggedIn },
            "another process's sign-in was not followed after the damage; log:\n\(observed.output)")
        await observed.stop()
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
