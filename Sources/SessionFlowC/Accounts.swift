import CSessionFlow
import SessionCore

/// Copies `bytes` and a NUL into `buffer`, or answers SF_ERANGE (nothing written).
func copy(_ bytes: [UInt8], to buffer: UnsafeMutablePointer<CChar>, length: Int) -> Int32 {
    guard length > bytes.count else { return SF_ERANGE.code }
    for (index, byte) in bytes.enumerated() {
        buffer[index] = CChar(bitPattern: byte)
    }
    buffer[bytes.count] = 0
    return SF_OK.code
}

@c @implementation
public func sf_session_accounts(
    _ pointer: OpaquePointer!, _ buffer: UnsafeMutablePointer<CChar>!, _ length: Int, _ needed: UnsafeMutablePointer<Int>!
) -> Int32 {
    api("sf_session_accounts") {
        guard buffer != nil || length == 0 else { return SF_EINVAL.code }
        return withRuntime(pointer) { runtime in
            // Each key and its NUL; the list's own NUL is `copy`'s.
            let list: [UInt8] = runtime.session.accounts.flatMap { account -> [UInt8] in Array(account.key.utf8) + [0] }
            needed?.pointee = list.count + 1
            guard let buffer else { return SF_ERANGE.code }
            return copy(list, to: buffer, length: length)
        }
    }
}

@c @implementation
public func sf_session_active_account(_ pointer: OpaquePointer!, _ buffer: UnsafeMutablePointer<CChar>!, _ length: Int) -> Int32 {
    api("sf_session_active_account") {
        guard let buffer else { return SF_EINVAL.code }
        return withRuntime(pointer) { runtime in
            let active = runtime.session.accounts.first(where: \.isActive)?.key ?? ""
            return copy(Array(active.utf8), to: buffer, length: length)
        }
    }
}

@c @implementation
public func sf_session_account_state(
    _ pointer: OpaquePointer!, _ account: UnsafePointer<CChar>!, _ out: UnsafeMutablePointer<sf_session_state>!
) -> Int32 {
    api("sf_session_account_state") {
        guard let account, let out else { return SF_EINVAL.code }
        let key = String(cString: account)
        return withRuntime(pointer) { runtime in
            guard let found = runtime.session.accounts.first(where: { $0.key == key }) else { return SF_EINVAL.code }
            out.pointee = found.state.c
            return SF_OK.code
        }
    }
}

@c @implementation
public func sf_session_switch_account(_ pointer: OpaquePointer!, _ account: UnsafePointer<CChar>!) -> Int32 {
    api("sf_session_switch_account") {
        accountCall("sf_session_switch_account", pointer, account) { runtime, key throws(SessionError) in
            try runtime.session.switchAccountAndWait(to: key)
        }
    }
}

@c @implementation
public func sf_session_add_account(_ pointer: OpaquePointer!, _ tokens: UnsafePointer<sf_tokens>!) -> Int32 {
    api("sf_session_add_account") {
        guard let tokens = readTokens(tokens, "sf_session_add_account", pointer) else { return SF_EINVAL.code }
        let sessionTokens = tokens.session
        return synchronousCall(pointer) { runtime throws(SessionError) in try runtime.session.addAccountAndWait(sessionTokens) }
    }
}

@c @implementation
public func sf_session_logout_account(_ pointer: OpaquePointer!, _ account: UnsafePointer<CChar>!) -> Int32 {
    api("sf_session_logout_account") {
        accountCall("sf_session_logout_account", pointer, account) { runtime, key throws(SessionError) in
            try runtime.session.logoutAndWait(account: key)
        }
    }
}

@c @implementation
public func sf_session_logout_all(_ pointer: OpaquePointer!) -> Int32 {
    api("sf_session_logout_all") {
        synchronousCall(pointer) { runtime throws(SessionError) in try runtime.session.logoutAllAndWait() }
    }
}

/// The calls that name an account: the key copied (a NULL one is SF_EINVAL), then the call
/// made as every waiting call is (`synchronousCall`).
private func accountCall(
    _ call: String, _ pointer: OpaquePointer?, _ account: UnsafePointer<CChar>?,
    _ body: (Runtime, String) throws(SessionError) -> Void
) -> Int32 {
    guard let account else {
        refuse(call, pointer, "account is NULL")
        return SF_EINVAL.code
    }
    if let problem = HostInput.problem(account, "account", limit: HostInput.maximumMemberIDLength) {
        refuse(call, pointer, problem)
        return SF_EINVAL.code
    }
    let key = String(cString: account)
    return synchronousCall(pointer) { runtime throws(SessionError) in try body(runtime, key) }
}

@c @implementation
public func sf_session_account_profile(
    _ pointer: OpaquePointer!, _ account: UnsafePointer<CChar>!, _ field: sf_profile_field,
    _ buffer: UnsafeMutablePointer<CChar>!, _ length: Int, _ needed: UnsafeMutablePointer<Int>!
) -> Int32 {
    api("sf_session_account_profile") {
        guard buffer != nil || length == 0 else {
            refuse("sf_session_account_profile", pointer, "buffer is NULL with a length of \(length)")
            return SF_EINVAL.code
        }
        let read: (SessionProfile) -> String?
        switch field {
        case SF_PROFILE_ISSUER: read = { $0.issuer }
        case SF_PROFILE_CLIENT_ID: read = { $0.clientID }
        case SF_PROFILE_REQUESTED_SCOPE: read = { $0.requestedScope }
        case SF_PROFILE_GRANTED_SCOPE: read = { $0.grantedScope }
        default:
            refuse("sf_session_account_profile", pointer, "field is \(field.rawValue), not one of sf_profile_field (0 ... 3)")
            return SF_EINVAL.code
        }
        let key = account.map { String(cString: $0) }
        return withRuntime(pointer) { runtime in
            let accounts = runtime.session.accounts
            guard let found = accounts.first(where: { key == nil ? $0.isActive : $0.key == key }) else {
                if let key {
                    refuse("sf_session_account_profile", pointer, "no account \"\(key)\" has a session")
                    return SF_EINVAL.code
                }
                explain("no account is signed in")
                return SF_ESTATE.code
            }
            guard let profile = found.profile else {
                explain(
                    "account \"\(found.key)\" has no profile (signed in with sf_tokens, "
                        + "or read from a record written before profiles existed)")
                return SF_ESTATE.code
            }
            let bytes = Array((read(profile) ?? "").utf8)
            needed?.pointee = bytes.count + 1
            guard let buffer else { return SF_ERANGE.code }
            return copy(bytes, to: buffer, length: length)
        }
    }
}
