import CSessionFlow
import LoopFlow
import SessionCore
import SessionFlowErrors

#if canImport(Glibc)
import Glibc
#endif

/// The C callback of one token request, carried to the loop thread.
struct TokenCallback: @unchecked Sendable {
    let function: sf_token_fn
    let userdata: UnsafeMutableRawPointer?
    /// The C function that asked (for sf_last_error_message in a failing answer).
    let call: String

    func callAsFunction(_ result: Result<Secret, SessionError>) {
        switch result {
        case .success(let token):
            // In place: the host borrows the secret's own bytes (no copy to zero).
            token.withCString { function(SF_OK.code, $0, userdata) }
        case .failure(let error):
            let code = answerFailed(call, error)
            function(code, nil, userdata)
        }
    }
}

/// A failing answer of `call` is about to be handed to the host's callback, on this (the loop)
/// thread: its code, and the reason as this thread's sf_last_error_message ("call (answer):
/// the session's message"), which the callback may read. Never a secret: errors carry none.
func answerFailed(_ call: String, _ error: SessionError) -> Int32 {
    let code = errorCode(error)
    sf_detail_clear()
    sf_detail_set(error.message)
    return "\(call) (answer)".withCString { sf_detail_finish($0, code) }
}

/// A secret copied straight from a host's C string (never through a `String`, which could
/// not be zeroed). The host's own buffer stays the host's.
func secret(_ text: UnsafePointer<CChar>) -> Secret {
    Secret(copying: UnsafeRawBufferPointer(start: text, count: strlen(text)))
}

/// A call that waits for the loop's answer: on a borrowed loop, only from its thread.
func synchronousCall(_ pointer: OpaquePointer?, _ body: (Runtime) throws(SessionError) -> Void) -> Int32 {
    withRuntime(pointer) { runtime throws(SessionError) in
        guard runtime.synchronousCallsAllowed else { return SF_ETHREAD.code }
        try body(runtime)
        return SF_OK.code
    }
}

/// A call that only posts work: any thread.
func posting(_ pointer: OpaquePointer?, _ body: (Runtime) throws(SessionError) -> Void) -> Int32 {
    withRuntime(pointer) { runtime throws(SessionError) in
        try body(runtime)
        return SF_OK.code
    }
}

/// The sign-ins: the tokens copied (and the DPoP key, read straight into secret memory), then
/// signed in on the loop (see the header).
private func signIn(
    _ pointer: OpaquePointer?, _ tokens: UnsafePointer<sf_tokens>?, replacingStore: Bool, dpop: DPoPKey? = nil,
    call: String? = nil
) -> Int32 {
    let call = call ?? (replacingStore ? "sf_session_sign_in_replacing_store" : "sf_session_sign_in")
    guard let tokens = readTokens(tokens, call, pointer) else { return SF_EINVAL.code }
    var sessionTokens = tokens.session
    sessionTokens.dpopKey = dpop
    return synchronousCall(pointer) { runtime throws(SessionError) in
        try runtime.session.signInAndWait(sessionTokens, replacingUnreadableStore: replacingStore)
    }
}

@c @implementation
public func sf_session_sign_in(_ pointer: OpaquePointer!, _ tokens: UnsafePointer<sf_tokens>!) -> Int32 {
    api("sf_session_sign_in") {
        signIn(pointer, tokens, replacingStore: false)
    }
}

@c @implementation
public func sf_session_sign_in_dpop(
    _ pointer: OpaquePointer!, _ tokens: UnsafePointer<sf_tokens>!, _ dpopKey: UnsafePointer<CChar>!
) -> Int32 {
    api("sf_session_sign_in_dpop") {
        // 43 characters exactly; reading stops one past that (never past a host's short buffer's NUL).
        guard let dpopKey, strnlen(dpopKey, 44) == 43,
              let key = try? DPoPKey(encodedPrivateKey: Secret(copying: UnsafeRawBufferPointer(start: dpopKey, count: 43)))
        else {
            refuse("sf_session_sign_in_dpop", pointer, "dpop_key is NULL or not base64url of a P-256 private key (43 characters)")
            return SF_EINVAL.code
        }
        return signIn(pointer, tokens, replacingStore: false, dpop: key, call: "sf_session_sign_in_dpop")
    }
}

@c @implementation
public func sf_session_sign_in_replacing_store(_ pointer: OpaquePointer!, _ tokens: UnsafePointer<sf_tokens>!) -> Int32 {
    api("sf_session_sign_in_replacing_store") {
        signIn(pointer, tokens, replacingStore: true)
    }
}

@c @implementation
public func sf_session_logout(_ pointer: OpaquePointer!) -> Int32 {
    api("sf_session_logout") {
        synchronousCall(pointer) { runtime throws(SessionError) in try runtime.session.logoutAndWait() }
    }
}

@c @implementation
public func sf_session_reconfigure(_ pointer: OpaquePointer!) -> Int32 {
    api("sf_session_reconfigure") {
        synchronousCall(pointer) { runtime throws(SessionError) in try runtime.session.reconfigureAndWait() }
    }
}

@c @implementation
public func sf_session_is_logged_in(_ pointer: OpaquePointer!) -> Int32 {
    api("sf_session_is_logged_in") {
        withRuntime(pointer) { runtime in runtime.session.isLoggedIn() ? 1 : 0 }
    }
}

@c @implementation
public func sf_session_member_id(_ pointer: OpaquePointer!, _ buffer: UnsafeMutablePointer<CChar>!, _ length: Int) -> Int32 {
    api("sf_session_member_id") {
        guard let buffer else { return SF_EINVAL.code }
        return withRuntime(pointer) { runtime in
            copy(Array((runtime.session.memberID ?? "").utf8), to: buffer, length: length)
        }
    }
}

@c @implementation
public func sf_session_fresh_token(_ pointer: OpaquePointer!, _ callback: sf_token_fn!, _ userdata: UnsafeMutableRawPointer!) -> Int32 {
    api("sf_session_fresh_token") {
        guard let callback else { return SF_EINVAL.code }
        let answer = TokenCallback(function: callback, userdata: userdata, call: "sf_session_fresh_token")
        return posting(pointer) { runtime throws(SessionError) in
            try runtime.session.freshAccessToken { answer($0) }
        }
    }
}

@c @implementation
public func sf_session_notify_unauthorized(_ pointer: OpaquePointer!, _ accessToken: UnsafePointer<CChar>!) -> Int32 {
    api("sf_session_notify_unauthorized") {
        guard let accessToken else { return SF_EINVAL.code }
        let token = secret(accessToken)
        return posting(pointer) { runtime throws(SessionError) in
            try runtime.session.handleUnauthorized(token: token) { _ in }
        }
    }
}

@c @implementation
public func sf_session_resume(_ pointer: OpaquePointer!) -> Int32 {
    api("sf_session_resume") {
        posting(pointer) { runtime throws(SessionError) in try runtime.session.resume() }
    }
}
