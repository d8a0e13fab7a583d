import LoopFlow

/// Signing in through a flow (`SignInFlow`: the device authorization grant, a browser
/// redirect...): the flow runs on the loop, and its tokens sign the session in through the
/// same path as `signIn(_:)` (LOGGED_IN, stored).
extension SessionManager {
    /// Runs `flow` and signs in with the tokens it yields. Returns once the store has
    /// answered the write (as `signIn(_:)`).
    ///
    /// Cancelling the calling `Task` cancels the flow: its request ends, no timer is left, it
    /// sends nothing more, and nothing is signed in afterwards (`cancelled` is thrown).
    /// - Throws: the flow's error (`accessDenied`, `signInExpired`, `transient`,
    ///   `configuration`...), `cancelled`, or what `signIn(_:)` throws (`illegalTransition`
    ///   when someone is signed in already, `storeUnavailable`...).
    public func signIn(with flow: any SignInFlow, replacingUnreadableStore: Bool = false) async throws(SessionError) {
        if Task.isCancelled { throw SessionError(.cancelled, "the sign-in was cancelled") }
        if storeStatus.value == .reading { await storeRead() }
        let handle = SignInHandle()
        let result: Result<Void, SessionError> = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                signIn(with: flow, replacingUnreadableStore: replacingUnreadableStore, handle: handle) {
                    continuation.resume(returning: $0)
                }
            }
        } onCancel: {
            handle.cancel()
        }
        try result.get()
    }

    /// The same with a handle (for hosts without Swift concurrency, the C API): `completion`
    /// runs once, on the loop thread, never inside this call — after the store answered the
    /// write on success. The one exception: when the loop cannot take the sign-in at all (it
    /// is shut down, or too far behind: `EventLoop.executeBounded`'s limit of waiting
    /// requests), nothing will ever run for it there, so `completion` runs at once, on the
    /// calling thread, with that error (`shutDown`, `busy`). Unlike the `async` form it does not wait for the stored session to be
    /// read: while it is (`storeStatus` `.reading`), the final sign-in is refused with
    /// `storeUnavailable` unless `replacingUnreadableStore` (as `signInAndWait`).
    @discardableResult
    public func signIn(
        with flow: any SignInFlow, replacingUnreadableStore: Bool = false,
        completion: @escaping @Sendable (Result<Void, SessionError>) -> Void
    ) -> SignInHandle {
        let handle = SignInHandle()
        signIn(with: flow, replacingUnreadableStore: replacingUnreadableStore, handle: handle, completion: completion)
        return handle
    }

    private func signIn(
        with flow: any SignInFlow, replacingUnreadableStore: Bool, handle: SignInHandle,
        completion: @escaping @Sendable (Result<Void, SessionError>) -> Void
    ) {
        let cancelled = SessionError(.cancelled, "the sign-in was cancelled")
        do throws(SessionError) {
            try admit { [self] in
                // Never inside the call that caused it: a cancel before the start completes on
                // the next turn.
                guard !handle.isCancelled else {
                    try? loop.execute { completion(.failure(cancelled)) }
                    return
                }
                let running = flow.start(on: loop) { [self] outcome in
                    loop.assertInEventLoop()
                    guard handle.decide() else { return completion(.failure(cancelled)) }
                    let tokens: SessionTokens
                    switch outcome {
                    case .success(let value): tokens = value
                    case .failure(let error): return completion(.failure(error))
                    }
                    let before = sessions.withLockedValue { $0.all }
                    do throws(SessionError) {
                        try signInOnLoop(tokens, replacingUnreadableStore: replacingUnreadableStore)
                    } catch {
                        return completion(.failure(error))
                    }
                    var engines = before
                    for engine in sessions.withLockedValue({ $0.all }) where !engines.contains(where: { $0 === engine }) {
                        engines.append(engine)
                    }
                    afterStoreWork(of: engines) { completion(.success(())) }
                }
                _ = handle.started(running)
            }
        } catch {
            // The loop is gone (or has too many requests waiting): nothing will run on it;
            // answer here (no callback of ours ran).
            completion(.failure(error))
        }
    }
}
