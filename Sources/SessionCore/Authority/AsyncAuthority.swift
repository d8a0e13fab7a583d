/// An authority written with async/await. Wrap it in `AsyncAuthority` to hand it to a
/// `SessionManager`: each call runs in a task of its own, and when the session cancels a
/// refresh (its timeout passed) the task is cancelled — a request that honours cancellation
/// (`URLSession`-style clients, `Task.checkCancellation`, `withTaskCancellationHandler`) ends,
/// and the session waits for it to end before it sends the refresh token again.
///
/// Throw an `AuthorityError` to say what kind of failure it was; a `CancellationError`
/// counts as the request having been cancelled; anything else is a transient failure (its
/// text is not shown: it may hold what the request carried). Tokens returned after a
/// cancellation are kept.
public protocol AsyncSessionAuthority: Sendable {
    /// Exchanges a refresh token for new tokens (RFC 6749 §6 for OAuth 2.0).
    func refresh(_ request: RefreshRequest) async throws -> TokenGrant

    /// Whether `validate` asks the authority.
    var canValidate: Bool { get }
    /// Whether the access token is still active.
    func validate(accessToken: Secret) async throws -> Bool

    /// Whether `revoke` does anything.
    var canRevoke: Bool { get }
    /// Revokes the tokens, best effort.
    func revoke(refreshToken: Secret?, accessToken: Secret?) async throws
}

extension AsyncSessionAuthority {
    public var canValidate: Bool { false }
    public func validate(accessToken: Secret) async throws -> Bool {
        throw AuthorityError.configuration("unsupported", "this authority cannot validate")
    }

    public var canRevoke: Bool { false }
    public func revoke(refreshToken: Secret?, accessToken: Secret?) async throws {}
}

/// A `SessionAuthority` made of an `AsyncSessionAuthority`.
public struct AsyncAuthority<Base: AsyncSessionAuthority>: SessionAuthority {
    public let base: Base

    public init(_ base: Base) {
        self.base = base
    }

    public func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        Self.run(completion) { [base] in try await base.refresh(request) }
    }

    public var canValidate: Bool { base.canValidate }

    public func validate(accessToken: Secret, completion: AuthorityCompletion<Bool>) {
        Self.run(completion) { [base] in try await base.validate(accessToken: accessToken) }
    }

    public var canRevoke: Bool { base.canRevoke }

    public func revoke(refreshToken: Secret?, accessToken: Secret?, completion: AuthorityCompletion<Void>) {
        Self.run(completion) { [base] in try await base.revoke(refreshToken: refreshToken, accessToken: accessToken) }
    }

    /// Runs `body` in a task whose cancellation is the completion's.
    static func run<Output: Sendable>(
        _ completion: AuthorityCompletion<Output>, _ body: @escaping @Sendable () async throws -> Output
    ) {
        let task = Task {
            do {
                completion.succeed(try await body())
            } catch let error as AuthorityError {
                completion.fail(error)
            } catch is CancellationError {
                completion.fail(.cancelled)
            } catch {
                completion.fail(.transient("the authority failed (\(type(of: error)))"))
            }
        }
        completion.onCancel { task.cancel() }
    }
}
