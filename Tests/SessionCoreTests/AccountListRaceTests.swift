import Foundation
import LoopFlow
import SessionFlowTestSupport
import Synchronization
import Testing

@testable import SessionCore

/// An account store in memory whose account list can be held at the moment it was read (a
/// slow disk: the answer of a read made before a change arrives after it).
final class GatedAccountStore: AccountCredentialStore, @unchecked Sendable {
    private let lock = NSLock()
    /// Called inline on the loop thread (`callsMayBlock` false), as a store that never waits
    /// may ask to be; its gates must then stay unused.
    let inline: Bool
    var callsMayBlock: Bool { !inline }

    init(inline: Bool = false) {
        self.inline = inline
    }
    private var records: [String: StoredSession] = [:]
    private var active: String?
    /// While set, `readAccounts` takes the list at once, then waits for `release()`.
    private var gate: DispatchSemaphore?
    /// Whether a read took its list and is waiting for `release()`.
    private(set) var holding = false

    func locked<T>(_ body: () -> T) -> T {
        lock.lock()
        defer { lock.unlock() }
        return body()
    }

    func put(_ key: String, active makeActive: Bool = false, expiresIn: Double = 3600) {
        let expiry = Duration.seconds(Date().timeIntervalSince1970 + expiresIn)
        locked {
            records[key] = StoredSession(
                accessToken: Secret("\(key)-a"), refreshToken: Secret("\(key)-r"), accessTokenExpiresAt: expiry,
                memberID: key, account: key)
            if makeActive { active = key }
        }
    }

    func holdNextListRead() { locked { gate = DispatchSemaphore(value: 0) } }
    /// While set, the next read of that account's record waits for `releaseRecordRead()`.
    private var recordGate: (key: String, gate: DispatchSemaphore)?
    private var heldRecordGate: DispatchSemaphore?
    private(set) var holdingRecordRead = false
    func holdNextRead(of key: String) { locked { recordGate = (key, DispatchSemaphore(value: 0)) } }
    func releaseRecordRead() { locked { heldRecordGate }?.signal() }
    /// The next read of `key`'s record finds the store unavailable.
    func failNextRead(of key: String) { locked { recordReadToFail = key } }
    private var recordReadToFail: String?
    private(set) var failedRecordReads = 0
    fileprivate func readRecord(_ key: String) -> StoreRead {
        let fails = locked { () -> Bool in
            guard recordReadToFail == key else { return false }
            recordReadToFail = nil
            failedRecordReads += 1
            return true
        }
        if fails { return .unavailable(StoreError("the record could not be read for now")) }
        let gate: DispatchSemaphore? = locked {
            guard let held = recordGate, held.key == key else { return nil }
            recordGate = nil
            heldRecordGate = held.gate
            holdingRecordRead = true
            return held.gate
        }
        gate?.wait()
        return locked { records[key].map { .present($0) } ?? .absent }
    }
    func release() { locked { heldGate }?.signal() }
    private var heldGate: DispatchSemaphore?

    final class Record: CredentialStore, Sendable {
        let store: GatedAccountStore
        let key: String
        init(store: GatedAccountStore, key: String) {
            self.store = store
            self.key = key
        }
        var callsMayBlock: Bool { store.callsMayBlock }
        func read() -> StoreRead { store.readRecord(key) }
        func write(_ session: StoredSession) throws(StoreError) { store.locked { store.records[key] = session } }
        func clear() throws(StoreError) { store.locked { store.records[key] = nil } }
    }

    func read() -> StoreRead { account(locked { active } ?? defaultAccount, isActive: true).read() }
    func write(_ session: StoredSession) throws(StoreError) {
        try account(locked { active } ?? defaultAccount, isActive: true).write(session)
    }
    func clear() throws(StoreError) { try account(locked { active } ?? defaultAccount, isActive: true).clear() }
    /// The next `count` list reads find the store unavailable.
    func failNextListReads(_ count: Int) { locked { listReadsToFail = count } }
    private var listReadsToFail = 0
    private(set) var failedListReads = 0
    func readAccounts() -> AccountsRead {
        let failed = locked { () -> Bool in
            guard listReadsToFail > 0 else { return false }
            listReadsToFail -= 1
            failedListReads += 1
            return true
        }
        if failed { return .unavailable(StoreError("the disk is gone for a while")) }
        let (list, gate) = locked { (StoredAccounts(keys: records.keys.sorted(), active: active), self.gate) }
        if let gate {
            locked {
                self.gate = nil
                heldGate = gate
                holding = true
            }
            gate.wait()
            locked { heldListReadsAnswered += 1 }
        }
        return .present(list)
    }
    /// Held list reads that have answered (after `release()`).
    private(set) var heldListReadsAnswered = 0
    func account(_ key: String, isActive: Bool) -> any CredentialStore { Record(store: self, key: key) }
    func setActiveAccount(_ key: String?) throws(StoreError) {
        locked {
            active = key
            pointerWrites.append(key)
        }
    }
    /// The keys the manager recorded as active, in order (`setActiveAccount`).
    private(set) var pointerWrites: [String?] = []
    /// Another process records `key` as the active account (not counted in `pointerWrites`).
    func otherProcessPoints(to key: String) { locked { active = key } }
    var activeKey: String? { locked { active } }
}

@Suite("The account list after changes of the store")
struct AccountListRaceTests {
    struct NoAuthority: AsyncSessionAuthority {
        func refresh(_ request: RefreshRequest) async throws -> TokenGrant {
            throw AuthorityError.transient("not used")
        }
    }

    /// A manager on a loop of its own over a store where bob alone is signed in (active), his
    /// session read and listed.
    static func bobAlone() async throws -> (EventLoop, GatedAccountStore, SessionManager) {
        let loop = try EventLoop(name: "accounts")
        let store = GatedAccountStore()
        store.put("bob", active: true)
        let session = try SessionManager(loop: loop, authority: AsyncAuthority(NoAuthority()), store: store)
        await session.storeRead()
        #expect(await eventually { session.accounts.map(\.key) == ["bob"] })
        return (loop, store, session)
    }

    @Test func aReadAnsweredAfterALaterChangeDoesNotHideThatChange() async throws {
        let (loop, store, session) = try await Self.bobAlone()

        // A change of the store (another process): the list is read again, and that read is
        // slow: it took the list before the next change.
        store.holdNextListRead()
        try loop.execute { session.storeChanged() }
        #expect(await eventually { store.locked { store.holding } })
        // The next change: carol signed in elsewhere; its read is queued behind the first.
        store.put("carol")
        try loop.execute { session.storeChanged() }
        store.release()
        // The first answer ([bob]) arrives after the second change: carol must still join.
        #expect(await eventually { session.accounts.map(\.key) == ["bob", "carol"] })
        _ = try loop.shutdown()
    }

    /// The list reads find the store unavailable (at creation, and at the active session's
    /// start): nothing else asks for the list again while bob's session stays signed in, so
    /// the manager reads it again on the store's retry interval — carol's session is made
    /// without any change of state or of the store. Before, carol stayed unlisted.
    /// Made off the loop thread, the manager reads each listed account's record as it makes
    /// its session; carol's read finds the store unavailable for now. That is not "signed
    /// out": her session is kept, reads again once started, and restores her. (It was retired
    /// as if her record had gone, and with the list taken nothing made it again.)
    @Test func aBackgroundAccountWhoseRecordCouldNotBeReadYetIsKept() async throws {
        let loop = try EventLoop(name: "accounts")
        let store = GatedAccountStore()
        store.put("bob", active: true)
        store.put("carol")
        store.failNextRead(of: "carol")
        var configuration = SessionConfiguration()
        configuration.storeRetryInterval = .milliseconds(100)
        let session = try await madeOffThePool { [configuration] in
            try SessionManager(loop: loop, authority: AsyncAuthority(NoAuthority()), store: store, configuration: configuration)
        }
        #expect(store.locked { store.failedRecordReads } == 1, "carol's read did not fail: the test tested nothing")
        #expect(await eventually {
            session.accounts.map(\.key) == ["bob", "carol"] && session.accounts.allSatisfy { $0.state == .loggedIn }
        }, "\(session.accounts)")
        await session.close()
        _ = try loop.shutdown()
    }

    /// A list read on the worker when the manager closes answers after the close, with an
    /// account that has no session: none is made for a closed manager (it would refresh on its
    /// own), and nothing is read again.
    @Test func aListReadAnsweredAfterTheCloseMakesNoSession() async throws {
        let (loop, store, session) = try await Self.bobAlone()
        store.holdNextListRead()
        store.put("carol")
        try loop.execute { session.storeChanged() }
        #expect(await eventually { store.locked { store.holding } })
        // The close waits for the store work (the held read is on the active session's
        // worker): the read is let go once the manager has closed its accounts.
        let closing = Task { await session.close() }
        #expect(await eventually { session.sessions.withLockedValue { $0.accounts.closed } })
        store.release()
        await closing.value
        #expect(store.locked { store.heldListReadsAnswered } == 1)
        try await loop.submit {}  // the answer, posted by the worker, has entered
        try await loop.submit {}
        #expect(session.sessions.withLockedValue { $0.background.isEmpty && $0.making.isEmpty },
                "a session was made for a closed manager: \(session.sessions.withLockedValue { Array($0.background.keys) })")
        _ = try loop.shutdown()
    }

    @Test func aListTheStoreCouldNotGiveIsReadAgainOnTheRetryTimer() async throws {
        let loop = try EventLoop(name: "accounts")
        let store = GatedAccountStore()
        store.put("bob", active: true)
        store.put("carol")
        store.failNextListReads(2)
        var configuration = SessionConfiguration()
        configuration.storeRetryInterval = .milliseconds(100)
        let session = try SessionManager(
            loop: loop, authority: AsyncAuthority(NoAuthority()), store: store, configuration: configuration)
        await session.storeRead()
        #expect(await eventually { store.locked { store.failedListReads } == 2 })
        #expect(await eventually { session.accounts.map(\.key) == ["bob", "carol"] }, "\(session.accounts)")
        #expect(session.state.value == .loggedIn)
        await session.close()
        _ = try loop.shutdown()
    }
}

extension AccountListRaceTests {
    /// Counts the refreshes asked of it (on the loop thread) and refuses them.
    final class CountingAuthority: SessionAuthority {
        let refreshes = Atomic<Int>(0)
        func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
            refreshes.add(1, ordering: .relaxed)
            _ = completion.fail(.transient("not used"))
        }
    }

    /// Made off the loop thread, the manager makes a session for each other account it lists,
    /// waiting for each record; if the active session takes one of those accounts meanwhile
    /// (it followed another process's sign-in), the account keeps one session, the active one.
    /// The session made for it is retired before it ever starts: bob's record is due for a
    /// refresh, and a started duplicate would refresh with bob's refresh token.
    @Test func anAccountTheActiveSessionTookMeanwhileGetsNoSecondSession() async throws {
        let loop = try EventLoop(name: "accounts")
        let store = GatedAccountStore()
        // Listed, and due; the active pointer is unset, so the active session has no account.
        store.put("bob", expiresIn: -60)
        let authority = CountingAuthority()
        let signedIn = LockedBox<Bool?>(nil)
        let session = try await madeOffThePool {
            try SessionManager.$beforeBackgroundInsertion.withValue({ manager in
            // What the loop does while bob's session is made: the active session takes bob.
            let done = DispatchSemaphore(value: 0)
            try? loop.execute {
                Self.signBobIn(manager, noting: signedIn)
                done.signal()
            }
            done.wait()
            }) {
                try SessionManager(loop: loop, authority: authority, store: store)
            }
        }
        try await loop.submit {}  // every start queued so far has run
        expectBobSignedInOnceAndNeverRefreshed(session, authority, signedIn)
        await session.close()
        _ = try loop.shutdown()
    }
}

extension AccountListRaceTests {
    /// On the loop thread: the active session signs into bob (fresh tokens); notes whether it did.
    static func signBobIn(_ manager: SessionManager, noting signedIn: LockedBox<Bool?>) {
        let tokens = SessionTokens(
            accessToken: Secret("bob-a2"), refreshToken: Secret("bob-r2"), expiresIn: .seconds(3600), memberID: "bob")
        signedIn.withLockedValue { $0 = (try? manager.signInOnLoop(tokens)) != nil }
    }

    /// The active session signed into bob; bob is listed once, active, and no second session of
    /// his refreshed (his record is due) or is still being made.
    func expectBobSignedInOnceAndNeverRefreshed(
        _ session: SessionManager, _ authority: CountingAuthority, _ signedIn: LockedBox<Bool?>
    ) {
        #expect(signedIn.withLockedValue { $0 } == true)
        #expect(authority.refreshes.load(ordering: .relaxed) == 0, "bob's second session refreshed")
        let accounts = session.accounts
        #expect(accounts.map(\.key) == ["bob"], "\(accounts)")
        #expect(accounts.first?.isActive == true)
        #expect(session.sessions.withLockedValue { $0.background.isEmpty && $0.making.isEmpty })
    }
}

extension AccountListRaceTests {
    /// The same while the loop is inside the active session's sign-in into bob: the session has
    /// taken bob's record but not yet published bob, so the insertion, off the loop thread,
    /// reads no account and lists bob's session. A loop job after that sign-in looks again: bob's
    /// background session is retired before it starts (bob's record is due: it would refresh).
    @Test func anAccountTheActiveSessionIsSigningIntoMeanwhileGetsNoSecondSession() async throws {
        let loop = try EventLoop(name: "accounts")
        let store = GatedAccountStore()
        store.put("bob", expiresIn: -60)
        let authority = CountingAuthority()
        let reached = DispatchSemaphore(value: 0)
        let resume = DispatchSemaphore(value: 0)
        SessionEngine.afterTakingRecordInSignIn.withLockedValue {
            $0 = { engine in
                guard engine.loop === loop else { return }
                reached.signal()
                resume.wait()
            }
        }
        defer { SessionEngine.afterTakingRecordInSignIn.withLockedValue { $0 = nil } }
        let signedIn = LockedBox<Bool?>(nil)
        // Made on a thread of its own: the hook waits for the loop.
        let session = try await madeOffThePool {
            try SessionManager.$beforeBackgroundInsertion.withValue({ manager in
                try? loop.execute { Self.signBobIn(manager, noting: signedIn) }
                reached.wait()  // the loop is in that sign-in: bob's record taken, bob not published
            }) {
                try SessionManager(loop: loop, authority: authority, store: store)
            }
        }
        resume.signal()
        try await loop.submit {}  // the sign-in, then the job after it, have run
        try await loop.submit {}
        expectBobSignedInOnceAndNeverRefreshed(session, authority, signedIn)
        await session.close()
        _ = try loop.shutdown()
    }
}

extension AccountListRaceTests {
    /// A signed-out active session follows the store's active account; when another process
    /// makes an account active that has a session here in the background, the account keeps one
    /// session.
    @Test func followingAnotherProcessToABackgroundAccountMakesNoSecondSession() async throws {
        let loop = try EventLoop(name: "accounts")
        let store = GatedAccountStore()
        store.put("bob")  // listed, not active: bob's session is in the background
        let session = try SessionManager(loop: loop, authority: AsyncAuthority(NoAuthority()), store: store)
        #expect(await eventually { session.accounts.map(\.key) == ["bob"] })
        #expect(session.accounts.first?.isActive == false)
        // Another process makes bob the active account; the active session sees the store change.
        try store.setActiveAccount("bob")
        try await loop.submit { session.engine.storeChanged() }
        try await expectBobAloneAndActive(session, on: loop)
        await session.close()
        _ = try loop.shutdown()
    }

    /// The same while the background session's first read is still on its worker (it is
    /// signed out until that read answers): the switch waits for it, and does not fail.
    @Test func followingToABackgroundAccountStillReadingItsRecordSwitchesOnceItHasRead() async throws {
        let loop = try EventLoop(name: "accounts")
        let store = GatedAccountStore()
        store.put("bob")
        store.holdNextRead(of: "bob")
        // Made on the loop thread: the list's sessions read their records on their workers.
        let session = try await loop.submit {
            try SessionManager(loop: loop, authority: AsyncAuthority(NoAuthority()), store: store)
        }
        #expect(await eventually { store.locked { store.holdingRecordRead } })
        #expect(session.accounts.isEmpty)  // bob's session has not read its record yet
        try store.setActiveAccount("bob")
        try await loop.submit { session.engine.storeChanged() }
        // The active session read bob's record and asked the manager; the switch waits.
        try await loop.submit {}
        #expect(session.state.value == .loggedOut)
        store.releaseRecordRead()
        try await expectBobAloneAndActive(session, on: loop)
        await session.close()
        _ = try loop.shutdown()
    }

    /// The switch that follows another process's sign-in of bob writes no pointer: that process
    /// moved on to carol before the switch was made (it waits for bob's session to read its
    /// record), and writing bob again would undo carol. Before: the store named bob after it.
    @Test func aSwitchFollowingAnotherProcessDoesNotUndoItsLaterChoice() async throws {
        let loop = try EventLoop(name: "accounts")
        let store = GatedAccountStore()
        store.put("bob")
        store.put("carol")
        store.holdNextRead(of: "bob")
        let session = try await loop.submit {
            try SessionManager(loop: loop, authority: AsyncAuthority(NoAuthority()), store: store)
        }
        #expect(await eventually { store.locked { store.holdingRecordRead } })
        store.otherProcessPoints(to: "bob")
        try await loop.submit { session.engine.storeChanged() }
        // The active session reads bob's record on its worker and asks the manager; the switch
        // waits for bob's session.
        let asking = try await loop.submit { session.engine }
        await afterPendingWork(of: asking.worker, on: loop)
        try await loop.submit {}
        #expect(session.state.value == .loggedOut)
        #expect(session.engine === asking)
        store.otherProcessPoints(to: "carol")
        store.releaseRecordRead()
        #expect(await eventually { session.accounts.contains { $0.key == "bob" && $0.isActive } })
        #expect(session.state.value == .loggedIn)
        try await loop.submit {}
        let pointerWorker = try #require(session.pointerWorker)
        await afterPendingWork(of: pointerWorker, on: loop)
        #expect(store.pointerWrites.isEmpty)
        #expect(store.activeKey == "carol")
        await session.close()
        _ = try loop.shutdown()
    }

    /// An explicit switch to the account this process is on records it in the store, which
    /// may name another (another process chose it since): "switch to bob" leaves the store
    /// naming bob, as a switch to any account does, and switches nothing here.
    @Test func anExplicitSwitchToTheAccountThisProcessIsOnRecordsItInTheStore() async throws {
        let loop = try EventLoop(name: "accounts")
        let store = GatedAccountStore()
        store.put("bob", active: true)
        let session = try SessionManager(loop: loop, authority: AsyncAuthority(NoAuthority()), store: store)
        #expect(await eventually { session.accounts.contains { $0.key == "bob" && $0.isActive } })
        let onBob = session.engine
        store.otherProcessPoints(to: "carol")
        try await session.switchAccount(to: "bob")
        #expect(store.activeKey == "bob")
        #expect(store.locked { store.pointerWrites } == ["bob"])
        #expect(session.engine === onBob)
        #expect(session.state.value == .loggedIn)
        await session.close()
        _ = try loop.shutdown()
    }

    /// With a store called inline, a call that waits for the store work of the sessions it let
    /// go of (a background account's logout retires its session) answers once they left, a
    /// loop turn later — and not by waiting for them again and again inside the call itself
    /// (each wait answered at once, inline, with the session still there: the stack ran out).
    @Test func aCallOnAnInlineStoreWaitsForTheSessionsItRetiredOnALaterTurn() async throws {
        let loop = try EventLoop(name: "accounts")
        let store = GatedAccountStore(inline: true)
        let session = try await loop.submit {
            try SessionManager(loop: loop, authority: AsyncAuthority(NoAuthority()), store: store)
        }
        func tokens(_ key: String) -> SessionTokens {
            SessionTokens(
                accessToken: Secret("\(key)-a"), refreshToken: Secret("\(key)-r"), expiresIn: .seconds(3600),
                memberID: key)
        }
        try await session.signIn(tokens("alice"))
        try await session.addAccount(tokens("bob"))
        #expect(session.accounts.map(\.key) == ["alice", "bob"])
        try await session.logout(account: "alice")
        #expect(session.accounts.map(\.key) == ["bob"])
        #expect(session.sessions.withLockedValue { $0.retired.isEmpty })
        #expect(store.locked { store.pointerWrites } == ["alice", "bob"])
        await session.close()
        _ = try loop.shutdown()
    }

    /// The signed-out session a switch to a followed account retired is no longer active: a
    /// sign-in it still follows (a read of the store it submitted before the switch, answered
    /// after it) leaves it signed out — bob keeps one session, the one the switch made active.
    @Test func theSessionASwitchRetiredFollowsNoSignIn() async throws {
        let loop = try EventLoop(name: "accounts")
        let store = GatedAccountStore()
        store.put("bob")
        let session = try SessionManager(loop: loop, authority: AsyncAuthority(NoAuthority()), store: store)
        #expect(await eventually { session.accounts.map(\.key) == ["bob"] })
        let retired = session.engine
        try store.setActiveAccount("bob")
        try await loop.submit { session.engine.storeChanged() }
        try await expectBobAloneAndActive(session, on: loop)
        #expect(session.engine !== retired)
        // The answer of that earlier read, arriving now.
        let followed = try await loop.submit { () -> SessionState in
            guard case .present(let stored) = store.account("bob", isActive: true).read() else { return .loggedIn }
            retired.followSignIn(stored, access: Secret("bob-a"))
            return retired.published.state
        }
        #expect(followed == .loggedOut)
        try await expectBobAloneAndActive(session, on: loop)
        await session.close()
        _ = try loop.shutdown()
    }

    /// After a switch to bob: bob is listed once, active and signed in, none in the background.
    private func expectBobAloneAndActive(_ session: SessionManager, on loop: EventLoop) async throws {
        #expect(await eventually { session.accounts.contains { $0.isActive } })
        try await loop.submit {}
        let accounts = session.accounts
        #expect(accounts.map(\.key) == ["bob"], "\(accounts)")
        #expect(accounts.first?.isActive == true, "\(accounts)")
        #expect(session.state.value == .loggedIn)
        #expect(session.sessions.withLockedValue { $0.background.isEmpty })
    }
}

/// Makes a manager on a thread of its own: the tests' hooks wait for the loop inside its
/// making, and a thread of the cooperative pool must not wait.
private func madeOffThePool(_ make: @escaping @Sendable () throws -> SessionManager) async throws -> SessionManager {
    try await offThePool { Result { try make() } }.get()
}

/// Returns once `worker` ran what was submitted to it before (asked from the loop thread, as
/// store work is submitted).
private func afterPendingWork(of worker: StoreWorker, on loop: EventLoop) async {
    await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
        do {
            try loop.execute { worker.afterPendingWork { done.resume() } }
        } catch {
            done.resume()
        }
    }
}

/// Polls `condition` (every 10 ms, up to 5 s).
private func eventually(_ condition: @escaping () -> Bool) async -> Bool {
    for _ in 0..<500 {
        if condition() { return true }
        try? await Task.sleep(for: .milliseconds(10))
    }
    return condition()
}

extension AccountListRaceTests {
    /// Made off the loop thread, a manager of several accounts sets the callbacks its active
    /// session calls it with (a state change, a store change, a sign-in to follow) before that
    /// session starts: the loop reads them, and a start queued before would race their writes
    /// (and could follow a sign-in or change state with no manager told).
    @Test func theFirstSessionStartsOnlyOnceTheManagerHasSetItsCallbacks() async throws {
        let loop = try EventLoop(name: "accounts")
        let store = GatedAccountStore()
        store.put("alice", active: true)
        let startedEarly = LockedBox<Bool?>(nil)
        let session = try await madeOffThePool {
            try SessionManager.$beforeFirstSessionCallbacks.withValue({ engine in
            // Every job queued so far runs before this one: a start queued with the session.
            let done = DispatchSemaphore(value: 0)
            try? loop.execute {
                startedEarly.withLockedValue { $0 = engine.storeMachine.started }
                done.signal()
            }
            done.wait()
            }) {
                try SessionManager(loop: loop, authority: CountingAuthority(), store: store)
            }
        }
        #expect(startedEarly.withLockedValue { $0 } == false)
        let started = try await loop.submit { session.engine.storeMachine.started }
        #expect(started, "the session never started")
        #expect(session.accounts.map(\.key) == ["alice"])
        await session.close()
        _ = try loop.shutdown()
    }
}
