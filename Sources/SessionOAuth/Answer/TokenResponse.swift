import SessionCore

/// The token endpoint's answer (RFC 6749 §5.1, §5.2) read into a grant or an error: the
/// parsers the fuzz target in Tools/Sources/FuzzTokenResponse calls.
@_spi(Fuzzing) public enum TokenResponse {
    /// A 200 with the fields RFC 6749 §5.1 requires, or the error it stands for. `token_type`
    /// must be Bearer — or DPoP too, when `acceptsDPoP` (a request that carried a proof).
    public static func grant(
        from answer: HTTPAnswer, defaultLifetime: Duration, acceptsDPoP: Bool = false
    ) -> Result<TokenGrant, AuthorityError> {
        guard answer.status == 200 else { return .failure(error(from: answer)) }
        guard let object = answer.json else {
            return .failure(.transient("the token answer is not JSON"))
        }
        guard let access = object.secret("access_token"), access.count > 0 else {
            return .failure(.transient("the token answer has no access_token"))
        }
        // RFC 6749 A.12 and A.17: access-token and refresh-token are 1*VSCHAR (%x20-7E). A CR
        // or LF decoded from the JSON would split the `Authorization` header it is sent in
        // (a server could make its clients send headers, or whole requests, of its choosing);
        // any other byte outside VSCHAR is no token either. Refused as a broken answer.
        guard access.isVisibleASCII else {
            return .failure(.transient("the token answer's access_token holds a byte outside %x20-7E (RFC 6749 A.12)"))
        }
        if let type = object["token_type"]?.string, type.lowercased() != "bearer", !(acceptsDPoP && type.lowercased() == "dpop") {
            let shown = ErrorText.description(type, secrets: answer.redactions + [access]) ?? ""
            return .failure(.configuration("unsupported_token_type", "token_type \(shown) is not Bearer"))
        }
        let lifetime: Duration
        // Negative counts as 0; anything beyond 100 years as 100 years (the session clamps
        // further): a Double of 1e20 must not trap converting to an integer.
        let ceiling = 100.0 * 365 * 24 * 3600
        switch object["expires_in"] {
        case .int(let seconds)?: lifetime = .seconds(min(max(seconds, 0), Int(ceiling)))
        case .double(let seconds)? where seconds.isFinite:
            lifetime = .milliseconds(Int64(min(max(seconds, 0), ceiling) * 1000))
        case .string(let text)? where Int(text) != nil: lifetime = .seconds(min(max(Int(text)!, 0), Int(ceiling)))
        default: lifetime = defaultLifetime
        }
        let refresh = object.secret("refresh_token").flatMap { $0.count == 0 ? nil : $0 }
        if let refresh, !refresh.isVisibleASCII {
            return .failure(.transient("the token answer's refresh_token holds a byte outside %x20-7E (RFC 6749 A.17)"))
        }
        return .success(TokenGrant(
            accessToken: access, refreshToken: refresh, expiresIn: lifetime, scope: scope(in: object["scope"]?.string)))
    }

    /// The longest `scope` kept; a longer one is ignored (as if absent).
    public static let maximumScopeLength = 4096

    /// A `scope` member as RFC 6749 §3.3 writes it: scope-tokens of NQCHAR (%x21 / %x23-5B /
    /// %x5D-7E) separated by single spaces, at most `maximumScopeLength` bytes. Anything else
    /// (an empty string, a control character, a quote, a backslash, non-ASCII) is no scope the
    /// server granted: ignored, as if absent.
    public static func scope(in text: String?) -> String? {
        guard let text, !text.isEmpty, text.utf8.count <= maximumScopeLength else { return nil }
        var previousWasSpace = true
        for byte in text.utf8 {
            if byte == 0x20 {
                if previousWasSpace { return nil }
                previousWasSpace = true
            } else if byte == 0x21 || (0x23...0x5B).contains(byte) || (0x5D...0x7E).contains(byte) {
                previousWasSpace = false
            } else {
                return nil
            }
        }
        return previousWasSpace ? nil : text
    }

    /// The error an unsuccessful answer stands for (RFC 6749 §5.2).
    public static func error(from answer: HTTPAnswer) -> AuthorityError {
        let object = answer.json
        // Only what ErrorText lets through reaches a message: a code from the RFCs' list
        // (anything else, the refresh token echoed in `error` included, is
        // "unrecognised_error"), and a short, printable description scrubbed of every form of
        // what we sent.
        let code = ErrorText.code(object?["error"]?.string)
        let description = ErrorText.description(object?["error_description"]?.string, secrets: answer.redactions)
        let message = ["HTTP \(answer.status)", code, description].compactMap { $0 }.joined(separator: ": ")
        switch (answer.status, code) {
        case (_, "invalid_grant"):
            return AuthorityError(.terminal, code: code, message: message)
        case (408, _), (429, _), (500...599, _):
            return AuthorityError(.transient, code: code ?? "\(answer.status)", message: message, retryAfter: answer.retryAfter)
        case (_, "temporarily_unavailable"):
            return AuthorityError(.transient, code: code, message: message, retryAfter: answer.retryAfter)
        case (400...499, _):
            return AuthorityError(.configuration, code: code ?? "\(answer.status)", message: message)
        default:
            return AuthorityError(.transient, code: code ?? "\(answer.status)", message: message)
        }
    }
}

extension Secret {
    /// Every byte is VSCHAR (%x20-7E), RFC 6749's alphabet for tokens.
    var isVisibleASCII: Bool {
        withUnsafeBytes { bytes in bytes.allSatisfy { (0x20...0x7E).contains($0) } }
    }
}
