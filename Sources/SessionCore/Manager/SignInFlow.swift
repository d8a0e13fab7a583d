import LoopFlow

/// A way of signing in that ends with tokens: the device authorization grant, a browser
/// redirect... (SessionOAuth has them). SessionCore only runs it (`SessionManager.signIn(with:)`)
/// and signs in with what it yields; it knows nothing of the protocol behind it.
///
/// The contract a flow keeps:
/// - `start` is called on `loop`'s thread; the flow's work (requests, timers, callbacks to the
///   host) happens on that thread.
/// - `completion` runs exactly once, on the loop thread, never inside `start` or `cancel()`.
/// - After `cancel()` (any thread, any number of times) the flow sends no further request,
///   leaves no timer armed, ends the request in flight, and completes with `cancelled` (if it
///   had not completed yet).
/// - Errors never carry a secret (a device code, a token).
public protocol SignInFlow: Sendable {
    func start(
        on loop: EventLoop, completion: @escaping @Sendable (Result<SessionTokens, SessionError>) -> Void
    ) -> any SignInCancellable
}

/// Cancels a running sign-in flow (see `SignInFlow`).
public protocol SignInCancellable: Sendable {
    func cancel()
}

/// A sign-in in progress (`SessionManager.signIn(with:completion:)`): `cancel()` from any thread,
/// any number of times. Once `cancel()` has returned, the session is not signed in by this
/// flow (unless the sign-in had already happened: then the completion said success first —
/// completions are decided on the loop thread, one after the other).
public final class SignInHandle: Sendable {
    private let box = LockedBox(Progress())

    struct Progress {
        var cancelled = false
        /// The outcome was decided (signed in, or failed): a cancel comes too late.
        var decided = false
        var flow: (any SignInCancellable)?
    }

    init() {}

    /// Whether `cancel()` was called before the outcome was decided.
    public var isCancelled: Bool { box.withLockedValue { $0.cancelled } }

    /// Stops the flow (its request ended, no timer left, nothing signed in); the completion
    /// then says `cancelled`. Does nothing once the outcome was decided.
    public func cancel() {
        let flow = box.withLockedValue { progress -> (any SignInCancellable)? in
            guard !progress.decided, !progress.cancelled else { return nil }
            progress.cancelled = true
            return progress.flow
        }
        flow?.cancel()
    }

    /// Loop thread: the flow was started (false: cancelled before; do not start).
    func started(_ flow: any SignInCancellable) -> Bool {
        let cancelled = box.withLockedValue { progress -> Bool in
            if !progress.cancelled { progress.flow = flow }
            return progress.cancelled
        }
        if cancelled { flow.cancel() }
        return !cancelled
    }

    /// Loop thread: whether the flow may still sign in (then no cancel can stop it any more).
    func decide() -> Bool {
        box.withLockedValue { progress in
            progress.flow = nil
            guard !progress.cancelled, !progress.decided else { return false }
            progress.decided = true
            return true
        }
    }
}
