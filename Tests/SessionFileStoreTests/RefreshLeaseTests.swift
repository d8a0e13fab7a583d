import Foundation
import LoopFlow
import SessionCore
import SessionFlowTestSupport
import Testing

@testable import SessionFileStore

#if canImport(Glibc)
import Glibc
#endif

// The refresh lease across real processes: the holder is a session-probe (`--lease`) that
// took the lease in `<store>.lock`; this test process is the other process. Deadlines are
// compared on CLOCK_MONOTONIC, the clock the record is written in, so "not before the
// deadline" is checked exactly, whatever the machine's load.

/// A probe holding the refresh lease of the store in `directory` for `seconds`.
private func leaseHolder(_ directory: String, seconds: Double) async throws -> ChildProcess {
    let child = try ChildProcess(sessionProbeExecutable(), ["--lease", directory, "\(seconds)"], input: true)
    let first = await offThePool { child.waitForLine(where: { $0.hasPrefix("LEASE ") || $0.hasPrefix("BUSY") || $0.hasPrefix("ERROR") }) }
    guard first == "LEASE \(child.pid)" else {
        throw SetupFailure(description: "the probe did not take the lease: \(child.lines)")
    }
    return child
}

/// A probe holding the lease of `directory`, then `store` asking for it until granted
/// (`waitForLease`); `prepare` runs on the holder first. The lease is short (the test waits
/// its whole length) — so short that on a loaded machine it may run out before the first
/// question: then no answer was busy, nothing was tested, and it is tried again with a
/// longer lease (the precondition is waited for, not assumed from timing).
private func waitBehindAHolder(
    in directory: String, store: FileCredentialStore, prepare: (ChildProcess) async -> Void = { _ in }
) async throws -> (ChildProcess, Wait) {
    var last: (ChildProcess, Wait)?
    for seconds in [2.0, 5, 12] {
        let holder = try await leaseHolder(directory, seconds: seconds)
        await prepare(holder)
        let wait = await offThePool { waitForLease(store) }
        last = (holder, wait)
        if !wait.busy.isEmpty || wait.acquiredAt == nil { break }
        print("refresh lease: the \(seconds) s lease ran out before the first question; again with a longer one")
        store.releaseRefreshLease()
        holder.kill(SIGCONT)
        holder.kill(SIGKILL)
        _ = await offThePool { holder.waitForExit() }
    }
    return last!
}

/// The state letter of /proc/<pid>/stat (R, S, T, Z...), nil if there is no such process.
private func processState(_ pid: pid_t) -> Character? {
    guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let paren = text.lastIndex(of: ")")
    else { return nil }
    return text[text.index(after: paren)...].dropFirst().first
}

private func waitForState(_ pid: pid_t, _ state: Character) -> Bool {
    for _ in 0..<500 {
        if processState(pid) == state { return true }
        usleep(10_000)
    }
    return false
}

/// What one acquisition loop saw.
private struct Wait: Sendable {
    var busy: [RefreshLeaseHolder] = []
    /// CLOCK_MONOTONIC nanoseconds just after the acquisition returned.
    var acquiredAt: Int64?
    var busyAfterDeadline: [Int64] = []
}

/// Asks `store` for the lease every 20 ms until it is granted or `timeout` passes. A busy
/// answer must come before the holder's deadline: it is checked against the clock read just
/// before asking (the store decided after that).
private func waitForLease(_ store: FileCredentialStore, timeout: Duration = .seconds(15)) -> Wait {
    var wait = Wait()
    let deadline = ContinuousClock.now + timeout
    while ContinuousClock.now < deadline {
        let before = LeaseClock.now()
        let result = store.tryAcquireRefreshLease(for: .seconds(30))
        let after = LeaseClock.now()
        switch result {
        case .acquired:
            wait.acquiredAt = after
            return wait
        case .busy(let holder?):
            wait.busy.append(holder)
            if before >= nanoseconds(holder.until) { wait.busyAfterDeadline.append(before) }
        case .busy(nil):
            break  // another process was in its record section that instant
        }
        usleep(20_000)
    }
    return wait
}

private func nanoseconds(_ duration: Duration) -> Int64 {
    duration.components.seconds * 1_000_000_000 + duration.components.attoseconds / 1_000_000_000
}

private func lockFileContents(_ store: FileCredentialStore) -> [UInt8] {
    Array(FileManager.default.contents(atPath: store.lockPath) ?? Data())
}

private func setLockFileContents(_ store: FileCredentialStore, _ bytes: [UInt8]) {
    try? FileManager.default.createDirectory(atPath: store.directory, withIntermediateDirectories: true)
    // 0600, as the store makes it: a lock file open to others is refused (TrustedPathTests).
    #expect(FileManager.default.createFile(atPath: store.lockPath, contents: Data(bytes), attributes: [.posixPermissions: 0o600]))
}

@Suite("Refresh lease across processes", .serialized)
struct RefreshLeaseTests {
    /// (a) A live holder blocks everyone else until its deadline — never after — and the
    /// waiter gets the lease promptly once the deadline passes.
    @Test func aLiveHoldersLeaseBlocksAnotherProcessUntilItsDeadlineThenTheWaiterProceeds() async throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        let (holder, wait) = try await waitBehindAHolder(in: tmp.store, store: store)
        #expect(!wait.busy.isEmpty, "the lease of a live process did not block this one")
        #expect(wait.busy.allSatisfy { $0.pid == holder.pid && !$0.isThisProcess }, "\(wait.busy)")
        #expect(wait.busyAfterDeadline.isEmpty, "busy after the holder's deadline")
        guard let until = wait.busy.first.map({ nanoseconds($0.until) }), let acquiredAt = wait.acquiredAt else {
            Issue.record("never acquired (saw \(wait.busy.count) busy answers)")
            return
        }
        #expect(acquiredAt >= until, "acquired before the holder's deadline")
        // Promptly: no question asked after the deadline was answered busy (above), so the first
        // one got it. This bound is a hang guard only: a question is a few file operations, and
        // on a machine busy writing to disk one took over 2 s (it was 1 s, and failed there).
        #expect(acquiredAt - until < 10_000_000_000, "the waiter took \(acquiredAt - until) ns past the deadline")
        // the holder was alive all along: only its deadline ended the lease
        #expect(processState(holder.pid).map { $0 != "Z" } == true)
        store.releaseRefreshLease()
    }

    /// (b) The lease of a process that died is free at once, long before its deadline: a
    /// zombie (dead, not reaped) and a pid that no longer exists.
    @Test func theLeaseOfADeadProcessIsTakenAtOnce() async throws {
        let tmp = TemporaryDirectory()
        let holder = try await leaseHolder(tmp.store, seconds: 600)
        let store = FileCredentialStore(directory: tmp.store)
        let record = lockFileContents(store)
        guard case .busy(let seen?) = store.tryAcquireRefreshLease(for: .seconds(30)) else {
            Issue.record("a live holder's lease was not busy")
            return
        }
        #expect(seen.pid == holder.pid && seen.remaining > .seconds(500))
        holder.kill(SIGKILL)
        #expect(await offThePool { waitForState(holder.pid, "Z") }, "the killed probe did not become a zombie")
        #expect(store.tryAcquireRefreshLease(for: .seconds(30)) == .acquired, "a zombie's lease blocked")
        store.releaseRefreshLease()
        // reaped: the pid is gone
        _ = await offThePool { holder.waitForExit() }
        #expect(kill(holder.pid, 0) != 0 && errno == ESRCH)
        setLockFileContents(store, record)
        #expect(store.tryAcquireRefreshLease(for: .seconds(30)) == .acquired, "a dead pid's lease blocked")
        store.releaseRefreshLease()
    }

    /// (c) A holder stopped with SIGSTOP while it holds the lease (it can never release)
    /// blocks the others only until its deadline.
    @Test func aStoppedHolderBlocksOthersOnlyUntilItsDeadline() async throws {
        let tmp = TemporaryDirectory()
        let store = FileCredentialStore(directory: tmp.store)
        let (holder, wait) = try await waitBehindAHolder(in: tmp.store, store: store) { holder in
            holder.kill(SIGSTOP)
            #expect(await offThePool { waitForState(holder.pid, "T") }, "the probe did not stop")
        }
        defer { holder.kill(SIGCONT) }
        #expect(processState(holder.pid) == "T", "the holder was not stopped all along")
        #expect(!wait.busy.isEmpty && wait.busy.allSatisfy { $0.pid == holder.pid })
        #expect(wait.busyAfterDeadline.isEmpty, "busy after the holder's deadline")
        guard let until = wait.busy.first.map({ nanoseconds($0.until) }), let acquiredAt = wait.acquiredAt else {
            Issue.record("a stopped holder blocked past its deadline (\(wait.busy.count) busy answers)")
            return
        }
        #expect(acquiredAt >= until && acquiredAt - until < 1_000_000_000)
        store.releaseRefreshLease()
    }

    /// (d) A holder whose lease ran out and was taken over releases "its" lease late: the new
    /// holder's record stays.
    @Test func aReleaseByAProcessThatNoLongerOwnsTheLeaseLeavesTheNewHolders() async throws {
        let tmp = TemporaryDirectory()
        let holder = try await leaseHolder(tmp.store, seconds: 1)
        let taker = FileCredentialStore(directory: tmp.store)
        guard await offThePool({ waitForLease(taker) }).acquiredAt != nil else {
            Issue.record("the expired lease was never taken over")
            return
        }
        let ours = LeaseRecord.parse(lockFileContents(taker))
        #expect(ours?.pid == getpid())
        holder.send("release")
        #expect(await offThePool { holder.waitForLine { $0 == "RELEASED" } } != nil, "\(holder.lines)")
        #expect(LeaseRecord.parse(lockFileContents(taker)) == ours, "the late release changed the new holder's record")
        let third = FileCredentialStore(directory: tmp.store)
        guard case .busy(let seen?) = third.tryAcquireRefreshLease(for: .seconds(30)) else {
            Issue.record("the late release freed the new holder's lease")
            third.releaseRefreshLease()
            return
        }
        #expect(seen.pid == getpid() && seen.isThisProcess)
        // the real owner's release does free it
        taker.releaseRefreshLease()
        #expect(third.tryAcquireRefreshLease(for: .seconds(30)) == .acquired)
        third.releaseRefreshLease()
        #expect(lockFileContents(third).isEmpty)
    }

    /// (e) A session whose refresh waits on another process's lease says so when its attempt
    /// times out — naming that process, not blaming the authority — then, when the holder
    /// stores new tokens and lets go, adopts them without a request of its own.
    @Test func aSessionWaitingOnAnotherProcessesRefreshReportsThatAndAdoptsItsTokens() async throws {
        let tmp = TemporaryDirectory()
        // A stored session due for a refresh at restore
        try FileCredentialStore(directory: tmp.store).write(StoredSession(
            accessToken: Secret("old-access"), refreshToken: Secret("old-refresh"),
            accessTokenExpiresAt: SessionConfiguration.realtime() - .seconds(1), memberID: "alice"))
        let holder = try await leaseHolder(tmp.store, seconds: 120)
        let authority = GrantingAuthority()
        let session = try await SessionHarness(
            loopName: "lease-waiter", authority: authority, store: FileCredentialStore(directory: tmp.store)
        ) { configuration in
            // Long enough that the restore's attempt is usually still waiting when the test asks;
            // if it gave up first (a loaded machine), the caller is told the refresh is backing off
            // and why — the same words.
            configuration.policy.timeout = .seconds(3)
        }
        var failure: SessionError?
        do {
            _ = try await session.manager.freshAccessToken()
        } catch {
            failure = error
        }
        #expect(failure?.code == .transient)
        let message = failure?.message ?? ""
        #expect(message.contains("another process (pid \(holder.pid)) is refreshing"), "\(message)")
        #expect(!message.contains("did not answer"), "\(message)")
        func refreshFailures() -> [String] {
            session.recordedEvents.compactMap { event -> String? in
                if case .refreshFailed(_, _, let error) = event { error.message } else { nil }
            }
        }
        // The failed attempt's event is delivered on a later loop turn than the caller's error:
        // on a loaded machine it can still be on its way when the error arrives here.
        _ = await eventually(timeout: .seconds(20)) { !refreshFailures().isEmpty }
        let reported = refreshFailures()
        #expect(!reported.isEmpty && reported.allSatisfy { $0.contains("pid \(holder.pid)") && !$0.contains("did not answer") }, "\(reported)")
        #expect(authority.refreshes == 0)
        // The holder stores what it refreshed and lets go: the waiter takes those tokens.
        holder.send("store alice new-access new-refresh")
        #expect(await offThePool { holder.waitForLine { $0 == "STORED" || $0.hasPrefix("ERROR") } } == "STORED")
        holder.send("release")
        #expect(await offThePool { holder.waitForLine { $0 == "RELEASED" } } != nil)
        let adopted = await eventually(timeout: .seconds(10), every: .milliseconds(50)) {
            (try? await session.manager.freshAccessToken().reveal()) == "new-access"
        }
        #expect(adopted, "the stored tokens were not adopted: \(session.recordedEvents)")
        #expect(authority.refreshes == 0, "the waiter sent the refresh token the holder had rotated")
        // (Events arrive on a later loop turn than the token answer.)
        #expect(await eventually(timeout: .seconds(20)) {
            session.recordedEvents.contains { if case .tokenRefreshed(_, .sharedStore) = $0 { true } else { false } }
        }, "\(session.recordedEvents)")
        await session.stop()
    }

    /// (e, continued) The holder dies without releasing: the waiting session's next attempt
    /// takes the lease and refreshes.
    @Test func aSessionWaitingOnAHolderThatDiesRefreshesItself() async throws {
        let tmp = TemporaryDirectory()
        try FileCredentialStore(directory: tmp.store).write(StoredSession(
            accessToken: Secret("old-access"), refreshToken: Secret("old-refresh"),
            accessTokenExpiresAt: SessionConfiguration.realtime() - .seconds(1), memberID: "alice"))
        let holder = try await leaseHolder(tmp.store, seconds: 120)
        let authority = GrantingAuthority()
        let session = try await SessionHarness(
            loopName: "lease-waiter", authority: authority, store: FileCredentialStore(directory: tmp.store)
        ) { configuration in
            // Long enough that the restore's attempt is usually still waiting when the test asks;
            // if it gave up first (a loaded machine), the caller is told the refresh is backing off
            // and why — the same words.
            configuration.policy.timeout = .seconds(3)
        }
        try await Task.sleep(for: .milliseconds(300))
        #expect(authority.refreshes == 0)
        holder.kill(SIGKILL)
        _ = await offThePool { holder.waitForExit() }
        let refreshed = await eventually(timeout: .seconds(10), every: .milliseconds(50)) { authority.refreshes == 1 }
        #expect(refreshed)
        #expect(try await session.manager.freshAccessToken().reveal() == "granted-access-1")
        await session.stop()
    }

    /// (f) Whatever the lock file holds that is not a live lease — garbage, a truncated or
    /// oversized record, numbers out of range, a record of another boot — is free, and is
    /// replaced by a good record. A live record (the control) is not.
    @Test func garbageTruncatedAndOversizedLockFilesAreFree() throws {
        let tmp = TemporaryDirectory()
        let owner = FileCredentialStore(directory: tmp.store)
        #expect(owner.tryAcquireRefreshLease(for: .seconds(600)) == .acquired)
        let live = lockFileContents(owner)
        let record = try #require(LeaseRecord.parse(live))
        #expect(record.pid == getpid() && record.until - record.granted == 600_000_000_000)
        owner.releaseRefreshLease()
        #expect(lockFileContents(owner).isEmpty)

        func text(_ edit: (inout LeaseRecord) -> Void) -> [UInt8] {
            var changed = record
            edit(&changed)
            return Array(changed.line.utf8)
        }
        func replacing(_ key: String, with value: String) -> [UInt8] {
            let line = String(decoding: live, as: UTF8.self)
            let fields = line.dropLast().split(separator: " ").map { word in
                word.hasPrefix(key + "=") ? "\(key)=\(value)" : String(word)
            }
            return Array((fields.joined(separator: " ") + "\n").utf8)
        }
        var random = SystemRandomNumberGenerator()
        var cases: [(String, [UInt8])] = [
            ("empty", []),
            ("text", Array("hello\n".utf8)),
            ("random bytes", (0..<300).map { _ in UInt8.random(in: 0...255, using: &random) }),
            ("a NUL inside", Array(live.prefix(30)) + [0] + Array(live.dropFirst(31))),
            ("two records", live + live),
            ("oversized record", Array(live.dropLast()) + Array(repeating: UInt8(ascii: "x"), count: 1 << 20) + [10]),
            ("oversized garbage", Array(repeating: 0xff, count: 1 << 20)),
            ("pid 0", replacing("pid", with: "0")),
            ("pid -1", replacing("pid", with: "-1")),
            ("pid overflows", replacing("pid", with: "99999999999999999999")),
            ("until overflows", replacing("until", with: "99999999999999999999999")),
            ("until before granted", replacing("until", with: "1")),
            ("until years away", text { $0.until = $0.granted + 100 * 365 * 86_400 * 1_000_000_000 }),
            ("until just over the longest lease", text { $0.until = $0.granted + LeaseRecord.maximumDuration + 1 }),
            ("until not a number", replacing("until", with: "soon")),
            ("nonce too long", replacing("nonce", with: "12345678901234567")),
            ("boot with a slash", replacing("boot", with: "../../x")),
            ("empty pidns", replacing("pidns", with: "")),
            ("another version", Array(String(decoding: live, as: UTF8.self).replacingOccurrences(of: "sessionflow-lease 1 ", with: "sessionflow-lease 2 ").utf8)),
            ("a duplicate key", Array(live.dropLast()) + Array(" pid=1\n".utf8)),
            ("another boot", text { $0.boot = "00000000-0000-0000-0000-000000000000" }),
            ("granted in the future", text { $0.granted = LeaseClock.now() + 3_600_000_000_000; $0.until = $0.granted + 1 }),
            ("expired", text { $0.until = $0.granted + 1 }),
        ]
        for length in 0..<live.count {
            cases.append(("truncated to \(length) bytes", Array(live.prefix(length))))
        }
        for (name, bytes) in cases {
            setLockFileContents(owner, bytes)
            let store = FileCredentialStore(directory: tmp.store)
            #expect(store.tryAcquireRefreshLease(for: .seconds(30)) == .acquired, "\(name): not free")
            // a good record of this store now: another instance sees it busy
            guard case .busy(let holder?) = FileCredentialStore(directory: tmp.store).tryAcquireRefreshLease(for: .seconds(30)) else {
                Issue.record("\(name): no lease recorded after acquiring")
                store.releaseRefreshLease()
                continue
            }
            #expect(holder.pid == getpid() && holder.remaining <= .seconds(30), "\(name)")
            store.releaseRefreshLease()
        }
        // the control: the live record itself is busy
        setLockFileContents(owner, live)
        #expect(FileCredentialStore(directory: tmp.store).tryAcquireRefreshLease(for: .seconds(30)) != .acquired)
    }

    /// A lock file that exists but can only be read (a read-only filesystem): the lease cannot
    /// be written, so the flock is held for the whole refresh, as before the lease — the second
    /// process still waits.
    @Test func aReadOnlyLockFileStillExcludesASecondRefresher() throws {
        let mount: TmpfsMount
        do {
            mount = try TmpfsMount(size: "1m")
        } catch {
            print("read-only lock file: cannot mount a tmpfs (\(error)); not exercised")
            return
        }
        defer { mount.unmount() }
        let directory = mount.path + "/store"
        let first = FileCredentialStore(directory: directory)
        #expect(first.tryAcquireRefreshLease(for: .seconds(30)) == .acquired)
        first.releaseRefreshLease()  // leaves an empty lock file
        try mount.remountReadOnly()
        #expect(first.tryAcquireRefreshLease(for: .seconds(30)) == .acquired)
        let second = FileCredentialStore(directory: directory)
        #expect(second.tryAcquireRefreshLease(for: .seconds(30)) == .busy(nil))
        first.releaseRefreshLease()
        #expect(second.tryAcquireRefreshLease(for: .seconds(30)) == .acquired)
        second.releaseRefreshLease()
    }
}
