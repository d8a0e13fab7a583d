import CSessionFlow
import LoopFlow
import SessionCore
import Synchronization

/// An open refresh the host is performing.
final class RefreshRequest: Sendable {
    let completion: AuthorityCompletion<TokenGrant>
    let authority: ObjectIdentifier

    init(completion: AuthorityCompletion<TokenGrant>, authority: ObjectIdentifier) {
        self.completion = completion
        self.authority = authority
    }
}

let refreshRequests = HandleTable<RefreshRequest>(.refreshRequest)

/// The host-supplied refresher of `sf_options.refresh`, as a `SessionAuthority`.
///
/// Closed at `sf_runtime_destroy` (and again by the teardown, on the loop thread): from
/// then on `refresh` never calls the host, and the requests it left open are SF_ECLOSED.
/// Only the loop thread calls `refresh`, so once the teardown has closed it, no call of the
/// host's refresher is running or will start — `refresh_release` runs after that.
final class HostAuthority: SessionAuthority {
    typealias CancelFunction = @convention(c) (OpaquePointer?, UnsafeMutableRawPointer?) -> Void
    let refresh: sf_refresh_fn?
    /// `sf_options.refresh_cancel`, if the host can cancel its refreshes.
    let cancel: CancelFunction?
    let userdata: UserData
    private let closed = Atomic<Bool>(false)

    init(refresh: sf_refresh_fn?, cancel: CancelFunction?, userdata: UserData) {
        self.refresh = refresh
        self.cancel = cancel
        self.userdata = userdata
    }

    func refresh(_ request: SessionCore.RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        guard let refresh else {
            completion.fail(.configuration("no_refresher", "no refresh callback was configured (sf_options.refresh)"))
            return
        }
        // Destroyed: the host is not asked. The completion stays open, like a request the
        // host never answered; the teardown that follows fails its waiters (SF_ESHUTDOWN).
        guard !closed.load(ordering: .acquiring) else { return }
        let id = refreshRequests.insert(RefreshRequest(completion: completion, authority: ObjectIdentifier(self)))
        if let cancel {
            // The session asks on its loop thread; a request already completed or closed
            // by destroy is not the host's any more.
            completion.onCancel { [self, userdata] in
                guard !closed.load(ordering: .acquiring), refreshRequests.lookup(id) != nil else { return }
                cancel(pointer(for: id), userdata.pointer)
            }
        }
        request.refreshToken.withCString { token in
            refresh(pointer(for: id), token, userdata.pointer)
        }
    }

    /// At destroy: the host's refresher is not called again, and its late answers find
    /// nothing (SF_ECLOSED). Idempotent.
    func close() {
        closed.store(true, ordering: .releasing)
        let me = ObjectIdentifier(self)
        _ = refreshRequests.removeAll { $0.authority == me }
    }
}

/// `sf_options.refresh_release` and the userdata it frees: run once, by the teardown of
/// the runtime that took ownership, on the loop thread, after the refresher was closed.
struct RefreshRelease: @unchecked Sendable {
    let function: (@convention(c) (UnsafeMutableRawPointer?) -> Void)?
    let userdata: UserData

    func callAsFunction() {
        function?(userdata.pointer)
    }
}

/// Reads `tokens` (up to the size the host declared); nil if unusable, with the reason said
/// (`refuse`: logged and in sf_last_error_message), naming the field.
func readTokens(_ tokens: UnsafePointer<sf_tokens>?, _ call: String, _ pointer: OpaquePointer?) -> sf_tokens? {
    guard let tokens else {
        refuse(call, pointer, "tokens is NULL")
        return nil
    }
    let declared = tokens.pointee.size
    // One released layout so far.
    guard acceptedSize(declared, [MemoryLayout<sf_tokens>.size]) else {
        refuse(call, pointer, "sf_tokens.size is \(declared); this library takes \(MemoryLayout<sf_tokens>.size) "
            + "(set it to sizeof(sf_tokens))")
        return nil
    }
    var result = sf_tokens()
    let count = declared
    withUnsafeMutableBytes(of: &result) { target in
        target.copyMemory(from: UnsafeRawBufferPointer(start: tokens, count: count))
    }
    if let problem = HostInput.problem(result) {
        refuse(call, pointer, problem)
        return nil
    }
    guard let access = result.access_token, !secret(access).isBlank else {
        refuse(call, pointer, "sf_tokens.access_token is NULL or blank")
        return nil
    }
    return result
}

extension sf_tokens {
    /// The host's tokens as the session takes them (checked by `readTokens` first).
    var session: SessionTokens {
        SessionTokens(
            accessToken: secret(access_token), refreshToken: refresh_token.map(secret),
            expiresIn: .seconds(expires_in), memberID: string(member_id))
    }
}

func string(_ text: UnsafePointer<CChar>?) -> String? {
    text.map { String(cString: $0) }
}

@c @implementation
public func sf_refresh_request_succeed(_ request: OpaquePointer!, _ tokens: UnsafePointer<sf_tokens>!) -> Int32 {
    api("sf_refresh_request_succeed") {
        guard let id = handle(of: request), refreshRequests.lookup(id) != nil else { return SF_ECLOSED.code }
        guard let tokens = readTokens(tokens, "sf_refresh_request_succeed", nil) else { return SF_EINVAL.code }
        guard let open = refreshRequests.remove(id) else { return SF_ECLOSED.code }
        guard !open.completion.isAbandoned else {
            // The session that asked has ended (logout, a new sign-in): the tokens are not used.
            open.completion.fail(.cancelled)
            return SF_ECLOSED.code
        }
        let session = tokens.session
        open.completion.succeed(TokenGrant(
            accessToken: session.accessToken, refreshToken: session.refreshToken,
            expiresIn: session.expiresIn, memberID: session.memberID))
        return SF_OK.code
    }
}

@c @implementation
public func sf_refresh_request_fail(_ request: OpaquePointer!, _ code: Int32, _ retryAfterMilliseconds: Int64) -> Int32 {
    api("sf_refresh_request_fail") {
        guard let id = handle(of: request), refreshRequests.lookup(id) != nil else { return SF_ECLOSED.code }
        let error: AuthorityError
        switch code {
        case SF_EAUTH.code:
            error = .terminal("invalid_grant", "the host's refresher reported a terminal failure")
        case SF_ENETWORK.code:
            error = .transient(
                "the host's refresher reported a transient failure",
                retryAfter: retryAfterMilliseconds >= 0 ? .milliseconds(retryAfterMilliseconds) : nil)
        case SF_ECONFIG.code:
            error = .configuration("host_configuration", "the host's refresher reported a configuration error")
        default:
            return SF_EINVAL.code
        }
        guard let open = refreshRequests.remove(id) else { return SF_ECLOSED.code }
        guard !open.completion.isAbandoned else {
            open.completion.fail(.cancelled)
            return SF_ECLOSED.code
        }
        open.completion.fail(error)
        return SF_OK.code
    }
}
