import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@testable import SessionFileStore

#if canImport(Glibc)
import Glibc
#endif

// Issue 14, point 5: "Store unavailable is visible". While the store cannot be read, an
// observer tells "no session" from "cannot read the session yet" (`storeStatus` next to the
// state), a sign-in does not overwrite the unreadable store unless the host asks, and the
// session is restored when the store becomes readable. Real file stores; the fault is a key
// file open to its group (mode 0640), which the store refuses even for root.

/// Every file of the store directory and its bytes.
private func snapshot(_ directory: String) -> [String: [UInt8]] {
    var files: [String: [UInt8]] = [:]
    for name in TemporaryDirectory.list(directory) {
        files[name] = contents(directory + "/" + name)
    }
    return files
}

/// A store holding alice's session, made unreadable: its key is open to the group.
private func unreadableStore() throws -> (TemporaryDirectory, FileCredentialStore, before: [String: [UInt8]]) {
    let tmp = TemporaryDirectory()
    let store = FileCredentialStore(directory: tmp.store)
    try store.write(session("alice"))
    #expect(chmod(store.keyPath, 0o640) == 0)
    guard case .unavailable = store.read() else {
        Issue.record("the fault does not make the store unreadable: \(summary(of: store.read()))")
        return (tmp, store, snapshot(tmp.store))
    }
    return (tmp, store, snapshot(tmp.store))
}

private func bob() -> SessionTokens {
    SessionTokens(accessToken: Secret("bob-access"), refreshToken: Secret("bob-refresh"), expiresIn: .seconds(3600), memberID: "bob")
}

private func configuration() -> SessionConfiguration {
    var configuration = SessionConfiguration()
    configuration.storeRetryInterval = .milliseconds(100)
    configuration.logger.logLevel = .critical
    return configuration
}

@Suite("Store unavailable is visible (issue 14.5)", .serialized)
struct StoreUnavailableTests {
    /// The finding: at start with an unreadable store the state said `loggedOut` and only a
    /// start-up event (not replayed) told otherwise. Now `storeStatus` says `unavailable`; a
    /// sign-in is refused and changes nothing on disk; once the fault goes, the stored session
    /// is restored by the retry.
    @Test func anUnreadableStoreIsVisibleRefusesASignInAndIsRestoredWhenReadable() async throws {
        let (tmp, file, before) = try unreadableStore()
        let loop = try EventLoop(name: "unavailable")
        defer { _ = try? loop.shutdown() }
        // Made off the loop thread: the manager waits for the read, which answers unavailable.
        let manager = try SessionManager(loop: loop, authority: RotatingAuthority(), store: file, configuration: configuration())
        #expect(manager.state.value == .loggedOut)
        guard case .unavailable(let error) = manager.storeStatus.value else {
            Issue.record("store status \(manager.storeStatus.value), expected unavailable")
            return
        }
        #expect(error.message.contains(file.keyPath), "\(error.message)")
        #expect(!error.message.contains(sentinelAccess))

        // A sign-in would replace a session no one has read: refused, nothing changes.
        await #expect(throws: SessionError.self) { try await manager.signIn(bob()) }
        do throws(SessionError) {
            try await manager.signIn(bob())
            Issue.record("signed in over an unreadable store")
        } catch {
            #expect(error.code == .storeUnavailable)
            #expect(error.message.contains("cannot be read") && !error.message.contains("bob-access"), "\(error.message)")
        }
        await manager.storeWorkDone()
        try await Task.sleep(for: .milliseconds(300))  // retries come and go: still nothing written
        #expect(manager.state.value == .loggedOut && !manager.isLoggedIn() && manager.memberID == nil)
        #expect(snapshot(tmp.store) == before, "the unreadable store was changed")

        // The fault goes: the retry reads alice's session and restores it.
        #expect(chmod(file.keyPath, 0o600) == 0)
        #expect(await eventually(timeout: .seconds(20)) { manager.state.value == .loggedIn })
        #expect(manager.memberID == "alice")
        #expect(manager.storeStatus.value == .available)
        // Read, the store holds alice: a sign-in is an ordinary one again (log out first).
        await #expect(throws: SessionError.illegalTransition(from: .loggedIn, request: .signIn)) {
            try await manager.signIn(bob())
        }
        #expect(summary(of: file.read()) == summary(of: .present(session("alice"))))
        await manager.close()
    }

    /// The host asks to replace the unreadable store: signed in in memory at once; the file
    /// store still refuses to write over a file it cannot read (nothing lost on disk while the
    /// fault holds); once it can be read, the host's sign-in wins: written, and made the active
    /// account. (Another account's session the store held stays, in the background.)
    @Test func aSignInReplacingTheUnreadableStoreWinsOnceItIsReadable() async throws {
        let (tmp, file, before) = try unreadableStore()
        let loop = try EventLoop(name: "replace")
        defer { _ = try? loop.shutdown() }
        let manager = try SessionManager(loop: loop, authority: RotatingAuthority(), store: file, configuration: configuration())
        let events = LockedBox<[SessionEvent]>([])
        let subscription = try await loop.submit {
            try manager.events.subscribe(onEvent: { event in events.withLockedValue { $0.append(event) } })
        }
        defer { subscription.close() }
        try await manager.signIn(bob(), replacingUnreadableStore: true)
        #expect(manager.state.value == .loggedIn && manager.memberID == "bob")
        #expect(await eventually(timeout: .seconds(20)) {
            events.withLockedValue { $0 }.contains { if case .storeError = $0 { true } else { false } }
        })
        if case .unavailable = manager.storeStatus.value {} else {
            Issue.record("store status \(manager.storeStatus.value), expected unavailable")
        }
        #expect(snapshot(tmp.store) == before, "written over a store that cannot be read")

        #expect(chmod(file.keyPath, 0o600) == 0)
        #expect(await eventually(timeout: .seconds(20)) {
            if case .present(let stored) = file.read() { stored.memberID == "bob" } else { false }
        })
        #expect(manager.state.value == .loggedIn && manager.memberID == "bob")
        #expect(await eventually(timeout: .seconds(20)) { manager.storeStatus.value == .available })
        // Alice's session was another account's: kept, and listed in the background.
        #expect(await eventually(timeout: .seconds(20)) { manager.accounts.map(\.key) == ["alice", "bob"] })
        #expect(manager.accounts.first { $0.key == "alice" }?.isActive == false)
        await manager.close()
    }

    /// Made on its loop thread, the session reads the store on the worker (`reading`). The
    /// synchronous sign-in (the C API's), which cannot wait there, is refused while it reads;
    /// the async one waits for the read and answers from what the store holds (alice: log out
    /// first), so nothing stored is lost either way.
    @Test func aSignInWhileTheStoreIsBeingReadNeverReplacesWhatItHolds() async throws {
        let tmp = TemporaryDirectory()
        try FileCredentialStore(directory: tmp.store).write(session("alice"))
        let store = ProbedStore(FileCredentialStore(directory: tmp.store))
        store.close()  // the read waits
        let loop = try EventLoop(name: "reading")
        defer { _ = try? loop.shutdown() }
        let made = configuration()
        let manager = try await loop.submit {
            try SessionManager(loop: loop, authority: RotatingAuthority(), store: store, configuration: made)
        }
        #expect(manager.storeStatus.value == .reading)
        let refused: SessionError? = try await loop.submit {
            do throws(SessionError) {
                try manager.signInAndWait(bob())
                return nil
            } catch {
                return error
            }
        }
        #expect(refused?.code == .storeUnavailable, "\(String(describing: refused))")
        #expect(refused?.message.contains("still being read") == true)
        #expect(manager.state.value == .loggedOut)
        let waiting = Task { () -> SessionError? in
            do throws(SessionError) {
                try await manager.signIn(bob())
                return nil
            } catch {
                return error
            }
        }
        try await Task.sleep(for: .milliseconds(100))
        store.open()
        let answer = await waiting.value
        #expect(answer?.code == .illegalTransition, "\(String(describing: answer))")
        #expect(manager.state.value == .loggedIn && manager.memberID == "alice")
        await manager.close()
        #expect(summary(of: FileCredentialStore(directory: tmp.store).read()) == summary(of: .present(session("alice"))))
    }
}
