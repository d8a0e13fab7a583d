// Token single-flight: many concurrent freshAccessToken() callers, one refresh.
import CBaseline
import LoopFlow
import SessionCore
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// An authority that answers each refresh after `roundTrip`, from a thread of its own (a
/// stand-in for the network), and counts the refreshes it was asked for.
final class DelayedAuthority: SessionAuthority {
    let roundTrip: Duration
    let refreshes = Atomic<Int>(0)

    init(roundTrip: Duration) { self.roundTrip = roundTrip }

    func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        let number = refreshes.add(1, ordering: .relaxed).newValue
        let microseconds = UInt32(roundTrip / .microseconds(1))
        pthread_detach(startThread {
            usleep(microseconds)
            completion.succeed(TokenGrant(accessToken: Secret("bench-access-\(number)"), expiresIn: .seconds(3600)))
        })
    }
}

/// Time until `callers` concurrent `freshAccessToken()` calls are all answered, on a session
/// whose token is due, and how many refreshes they caused; against one caller alone.
func singleFlightRows(callers: Int, roundTrip: Duration) async throws -> [Row] {
    let loop = try EventLoop(name: "bench-session")
    defer { _ = try? loop.shutdown() }
    let authority = DelayedAuthority(roundTrip: roundTrip)
    let manager = try SessionManager(loop: loop, authority: authority)
    // Expired at sign-in: the next freshAccessToken() must refresh.
    let due = SessionTokens(accessToken: Secret("bench-expired"), refreshToken: Secret("bench-refresh"), expiresIn: .zero)

    /// Nanoseconds until every caller has its token, and the refreshes made meanwhile.
    func round(_ count: Int) async throws -> (nanoseconds: Double, refreshes: Int) {
        if manager.isLoggedIn() { try await manager.logout() }
        let before = authority.refreshes.load(ordering: .relaxed)
        let start = bl_now_ns()
        try await manager.signIn(due)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<count {
                group.addTask {
                    let token = try await manager.freshAccessToken()
                    precondition(token.reveal().hasPrefix("bench-access-"), "a caller got the expired token")
                }
            }
            try await group.waitForAll()
        }
        return (Double(bl_now_ns() - start), authority.refreshes.load(ordering: .relaxed) - before)
    }

    /// The same number of tasks, each awaiting one bare hop to the loop and back: what the
    /// tasks and their continuations cost without any session work.
    func bareHops(_ count: Int) async throws -> Double {
        let start = bl_now_ns()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<count {
                group.addTask { try await loop.submit {} }
            }
            try await group.waitForAll()
        }
        return Double(bl_now_ns() - start)
    }

    var alone: [Double] = []
    var crowd: [Double] = []
    var hops: [Double] = []
    var refreshes = 0
    for _ in 0..<3 {
        alone.append(try await round(1).nanoseconds)
        let result = try await round(callers)
        crowd.append(result.nanoseconds)
        refreshes = max(refreshes, result.refreshes)
        hops.append(try await bareHops(callers))
    }
    await manager.close()
    let label = "\(callers) concurrent freshAccessToken()"
    return [
        Row(name: "\(label): refreshes made", ours: Double(refreshes), floor: .nan, unit: "", target: .exactly(1)),
        Row(
            name: "\(label): all answered (vs 1 caller)", ours: median(crowd) / 1e6, floor: median(alone) / 1e6,
            unit: "ms", baseline: "1 caller"),
        Row(
            name: "  … \(callers) tasks each awaiting a bare loop hop (no session)", ours: median(hops) / 1e6,
            floor: median(alone) / 1e6, unit: "ms", baseline: "1 caller"),
    ]
}
