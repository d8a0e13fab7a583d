import InMemoryLogging
import Logging
@_spi(Testing) import LoopFlow
import SessionFlowTestSupport
import Testing

@testable import SessionCore

/// Token values no output may ever contain: every test signs in with these.
enum Sentinel {
    static let access = "SENTINEL-ACCESS-7f3a9c"
    static let refresh = "SENTINEL-REFRESH-41d2e8"
    static func access(_ n: Int) -> Secret { Secret("\(access)-\(n)") }
    static func refresh(_ n: Int) -> Secret { Secret("\(refresh)-\(n)") }
    static let all = [access, refresh]
}

/// An authority that answers from a script, records every request with its loop time, and
/// can hold answers back ("hang") until the test releases them.
final class ScriptedAuthority: SessionAuthority, @unchecked Sendable {
    enum Reply {
        case grant(TokenGrant)
        case fail(AuthorityError)
        case hang
    }

    private let lock = Lock()
    private var script: [Reply] = []
    private var refreshes: [(request: RefreshRequest, at: Duration)] = []
    private var held: [AuthorityCompletion<TokenGrant>] = []
    private var issued = 0
    var clock: (@Sendable () -> Duration)?

    // Optional capabilities
    var validation: Result<Bool, AuthorityError>?
    var reauthentication: [Reply] = []
    private(set) var validations = 0
    private(set) var reauthentications = 0
    private(set) var revocations: [(refresh: Secret?, storeWasEmpty: Bool)] = []
    var storeToCheckAtRevocation: MemoryCredentialStore?
    var revocationFails = false

    /// Replies for the next refreshes, in order; when the script is empty, each refresh
    /// gets a fresh grant living `defaultLifetime`.
    var defaultLifetime: Duration = .seconds(3600)

    func enqueue(_ replies: Reply...) { lock.withLock { script += replies } }

    var refreshCount: Int { lock.withLock { refreshes.count } }
    var refreshTimes: [Duration] { lock.withLock { refreshes.map(\.at) } }
    var refreshRequests: [RefreshRequest] { lock.withLock { refreshes.map(\.request) } }
    var heldCount: Int { lock.withLock { held.count } }

    /// A grant with new sentinel tokens.
    func nextGrant(lifetime: Duration? = nil, rotate: Bool = true) -> TokenGrant {
        lock.withLock {
            issued += 1
            return TokenGrant(
                accessToken: Sentinel.access(100 + issued),
                refreshToken: rotate ? Sentinel.refresh(100 + issued) : nil,
                expiresIn: lifetime ?? defaultLifetime)
        }
    }

    /// Answers the held refreshes.
    func release(_ reply: Reply) {
        let waiting = lock.withLock { defer { held.removeAll() }; return held }
        for completion in waiting { answer(completion, reply) }
    }

    func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        let reply: Reply = lock.withLock {
            refreshes.append((request, clock?() ?? .zero))
            return script.isEmpty ? .grant(TokenGrant(accessToken: Secret(""), expiresIn: .zero)) : script.removeFirst()
        }
        if case .grant(let grant) = reply, grant.accessToken.isBlank {
            answer(completion, .grant(nextGrant()))
        } else {
            answer(completion, reply)
        }
    }

    private func answer(_ completion: AuthorityCompletion<TokenGrant>, _ reply: Reply) {
        switch reply {
        case .grant(let grant): completion.succeed(grant)
        case .fail(let error): completion.fail(error)
        case .hang: lock.withLock { held.append(completion) }
        }
    }

    var canValidate: Bool { lock.withLock { validation != nil } }
    func validate(accessToken: Secret, completion: AuthorityCompletion<Bool>) {
        let result = lock.withLock { validations += 1; return validation! }
        completion.complete(result)
    }

    var canRevoke: Bool { true }
    func revoke(refreshToken: Secret?, accessToken: Secret?, completion: AuthorityCompletion<Void>) {
        let fails = lock.withLock {
            revocations.append((refreshToken, storeToCheckAtRevocation?.session == nil))
            return revocationFails
        }
        if fails { completion.fail(.transient("offline")) } else { completion.succeed(()) }
    }

    var canReauthenticate: Bool { lock.withLock { !reauthentication.isEmpty || reauthentications > 0 } }
    func reauthenticate(externalUserID: String, completion: AuthorityCompletion<TokenGrant>) {
        let reply: Reply = lock.withLock {
            reauthentications += 1
            return reauthentication.isEmpty ? .fail(.terminal()) : reauthentication.removeFirst()
        }
        answer(completion, reply)
    }
}

/// A session on a loop in virtual time, with everything it says captured: the shared
/// harness on a `ManualClock`, over a scripted authority and a memory store, jitter pinned.
typealias Harness = SessionHarness<ScriptedAuthority, MemoryCredentialStore>

extension SessionHarness where Authority == ScriptedAuthority, Store == MemoryCredentialStore {
    convenience init(
        authority: ScriptedAuthority = ScriptedAuthority(),
        store: MemoryCredentialStore = MemoryCredentialStore(),
        configure: (inout SessionConfiguration) -> Void = { _ in }
    ) async throws {
        let clock = ManualClock()
        authority.clock = { [clock] in clock.now }
        try await self.init(
            loopName: "session-test", authority: authority, store: store, manualClock: clock, recordStates: true
        ) { configuration in
            configuration.random = { 0 }  // jitter pinned; tests that check jitter bounds set their own
            configure(&configuration)
        }
    }

    /// The virtual clock the loop runs on.
    var clock: ManualClock { manualClock! }

    /// Signs in with sentinel tokens (number `n`).
    func signIn(
        _ n: Int = 1, lifetime: Duration = .seconds(3600), member: String = "member-1", external: String? = nil
    ) async throws {
        try await manager.signIn(SessionTokens(
            accessToken: Sentinel.access(n), refreshToken: Sentinel.refresh(n), expiresIn: lifetime,
            memberID: member, externalUserID: external))
        try await settle()
    }

    func waitingCallers() async throws -> Int {
        try await loop.submit { [manager] in manager.engine.waitingCallers }
    }

    /// Fails the test if a sentinel token reached any output.
    func expectNoSecretsInOutput(sourceLocation: SourceLocation = #_sourceLocation) {
        let output = self.output
        for sentinel in Sentinel.all {
            #expect(!output.contains(sentinel), "a token reached the output", sourceLocation: sourceLocation)
        }
    }
}

extension Result {
    var failureCode: SessionError.Code? {
        if case .failure(let error as SessionError) = self { return error.code }
        return nil
    }
}
