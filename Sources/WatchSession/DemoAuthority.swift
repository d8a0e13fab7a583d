import Dispatch
import FoundationEssentials
import Glibc
import SessionCore

/// The embedded demo authority: answers refreshes from a plan, a little later, from
/// another thread — like a server would. Tokens are random and never printed.
final class DemoAuthority: SessionAuthority, @unchecked Sendable {
    enum Step {
        case grant
        case transient(String)
        case terminal(String)
        case silent
    }

    private let lock = Lock()
    private var plan: [Step]
    private let lifetime: Duration
    private let latency: Duration
    private var issued = 0

    init(plan: [Step], lifetime: Duration, latency: Duration) {
        self.plan = plan
        self.lifetime = lifetime
        self.latency = latency
    }

    static func token(_ kind: String) -> Secret {
        Secret("demo-token-\(kind)-\(UUID().uuidString)")
    }

    func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        let step: Step = lock.withLock { plan.isEmpty ? .grant : plan.removeFirst() }
        let lifetime = self.lifetime
        DispatchQueue.global().asyncAfter(deadline: .now() + latency.timeInterval) {
            switch step {
            case .grant:
                completion.succeed(TokenGrant(
                    accessToken: Self.token("access"), refreshToken: Self.token("refresh"), expiresIn: lifetime))
            case .transient(let why):
                completion.fail(AuthorityError(.transient, code: "503", message: why))
            case .terminal(let why):
                completion.fail(.terminal("invalid_grant", why))
            case .silent:
                break  // never answers: the session's timeout frees the slot
            }
        }
    }

    var canRevoke: Bool { true }
}

extension Duration {
    var timeInterval: TimeInterval {
        let (seconds, attoseconds) = components
        return TimeInterval(seconds) + TimeInterval(attoseconds) / 1e18
    }

    /// `self` divided by `factor` (time compression).
    func compressed(by factor: Double) -> Duration {
        .milliseconds(Int64((timeInterval / factor * 1000).rounded()))
    }
}
