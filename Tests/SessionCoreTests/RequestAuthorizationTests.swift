import SessionFlowTestSupport
import Testing

@testable import SessionCore

/// Which requests `SessionManager.authorization(method:url:)` refuses before any token is
/// touched.
@Suite struct RequestAuthorizationTests {
    @Test(arguments: [
        ("GET", "ftp://example.com/x"), ("GET", "http://example.com/api"), ("GET", "https://example.com/a#frag"),
        ("GET", "https://user@example.com/"), ("GE T", "https://example.com/"), ("", "https://example.com/"),
        ("GET", "https://example.com/a b"), ("GET", "https:///path"), ("GET", "http://127.0.0.1.example.com/"),
    ])
    func aRequestThatCannotBeAuthorizedIsRefusedBeforeAnyToken(_ method: String, _ url: String) {
        #expect(RequestAuthorization.problem(method: method, url: url) != nil)
    }

    @Test(arguments: [
        ("GET", "https://api.example.com/v1/items?page=2"), ("POST", "http://127.0.0.1:8080/x"),
        ("DELETE", "http://localhost/x"), ("PATCH", "http://[::1]:9/"), ("GET", "HTTPS://API.EXAMPLE.COM"),
    ])
    func anAuthorizableRequestPasses(_ method: String, _ url: String) {
        #expect(RequestAuthorization.problem(method: method, url: url) == nil)
    }

    /// What a C host hands back as it sent it (`sf_session_unauthorized`): the token inside.
    @Test(arguments: ["Bearer tok-1", "bearer tok-1", "BEARER   tok-1  "])
    func aRefusedBearerValueGivesBackItsToken(_ value: String) throws {
        let refused = try RequestAuthorization(refused: Secret(value), method: "GET", url: "https://api.example.com/")
        #expect(refused.accessToken == Secret("tok-1"))
        #expect(refused.value(of: "Authorization") == Secret("Bearer tok-1"))
        #expect(refused.method == "GET" && refused.url == "https://api.example.com/")
    }

    /// A DPoP session's refusal (issue 31) comes back as a DPoP value: its token, scheme DPoP.
    @Test(arguments: ["DPoP tok-1", "dpop tok-1", "DPOP   tok-1  "])
    func aRefusedDPoPValueGivesBackItsToken(_ value: String) throws {
        let refused = try RequestAuthorization(refused: Secret(value), method: "GET", url: "https://api.example.com/")
        #expect(refused.accessToken == Secret("tok-1"))
        #expect(refused.scheme == .dpop)
    }

    @Test(arguments: ["", "Bearer", "Bearer ", "Bearer    ", "Basic YTpi", "Bearertok", "DPoPtok", "DPoP ", "DPoP    "])
    func aValueThatIsNoBearerTokenIsRefused(_ value: String) {
        #expect(throws: SessionError.self) {
            try RequestAuthorization(refused: Secret(value), method: "GET", url: "https://api.example.com/")
        }
    }

    @Test func aRefusedValueForARequestThatCannotBeAuthorizedIsRefused() {
        #expect(throws: SessionError.self) {
            try RequestAuthorization(refused: Secret("Bearer t"), method: "GET", url: "http://example.com/")
        }
    }
}

/// A server's DPoP nonce is checked before it is remembered for its origin: one no proof can
/// carry (not NQCHARs, RFC 9449 §4.2) would fail every later proof to that server.
@Suite struct DPoPNonceTests {
    @Test(arguments: ["", "bad \"nonce", "with space", "back\\slash", "tab\tnonce", "é", String(repeating: "n", count: 1025)])
    func aNonceNoProofCanCarryIsNeverRemembered(_ nonce: String) throws {
        let nonces = DPoPNonces()
        let url = "https://api.example.com/items"
        #expect(nonces.remember("n-1", for: url))
        #expect(!nonces.remember(nonce, for: url))
        #expect(nonces.nonce(for: url) == "n-1")
        // Through a refusal: that refusal is the answer, the origin keeps its nonce.
        let origin = "https://nonce-check-\(nonce.utf8.count).example.com/items"
        DPoPNonces.shared.remember("n-2", for: origin)
        let refused = try RequestAuthorization(refused: Secret("DPoP tok-1"), method: "GET", url: origin)
        #expect(throws: SessionError.self) {
            try SessionManager.wantsNonce(refused, wwwAuthenticate: #"DPoP error="use_dpop_nonce""#, dpopNonce: nonce)
        }
        #expect(DPoPNonces.shared.nonce(for: origin) == "n-2")
    }

    @Test func aNonceOfNQCharsIsRememberedAndCarried() throws {
        let url = "https://nonce-ok.example.com/items"
        let refused = try RequestAuthorization(refused: Secret("DPoP tok-1"), method: "GET", url: url)
        let nonce = "!#[]~" + String(repeating: "z", count: 1019)
        #expect(try SessionManager.wantsNonce(refused, wwwAuthenticate: #"DPoP error="use_dpop_nonce""#, dpopNonce: nonce))
        #expect(DPoPNonces.shared.nonce(for: url) == nonce)
    }
}

@Suite struct AuthenticationChallengeTests {
    @Test func bearerParametersAreRead() {
        let challenges = AuthenticationChallenge.parse(
            #"Bearer realm="example", error="invalid_token", error_description="The access token expired""#)
        #expect(challenges.count == 1)
        #expect(challenges[0].scheme == "bearer" && challenges[0].error == "invalid_token")
        #expect(challenges[0].parameters["error_description"] == "The access token expired")
    }

    @Test func severalChallengesAndTokenValuesAreRead() {
        let challenges = AuthenticationChallenge.parse(
            #"Basic realm="x", DPoP algs="ES256 PS256", error=use_dpop_nonce, Bearer error="insufficient_scope", scope="a\"b""#)
        #expect(challenges.map(\.scheme) == ["basic", "dpop", "bearer"])
        #expect(challenges[1].error == "use_dpop_nonce" && challenges[1].parameters["algs"] == "ES256 PS256")
        #expect(challenges[2].parameters["scope"] == #"a"b"#)
    }

    @Test func brokenFieldsKeepWhatParsed() {
        #expect(AuthenticationChallenge.parse(nil).isEmpty)
        #expect(AuthenticationChallenge.parse("").isEmpty)
        #expect(AuthenticationChallenge.parse("Bearer").map(\.scheme) == ["bearer"])
        #expect(AuthenticationChallenge.parse(#"Bearer error="unterminated"#).first?.error == nil)
        #expect(AuthenticationChallenge.parse("Negotiate abc==, Bearer error=invalid_token").last?.error == "invalid_token")
        let huge = "Bearer error=" + String(repeating: "x", count: 1 << 20)
        #expect(AuthenticationChallenge.parse(huge).first?.error?.count ?? 0 < AuthenticationChallenge.maximumFieldLength)
    }
}
