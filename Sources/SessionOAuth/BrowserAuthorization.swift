import Crypto
import FoundationEssentials
import LoopFlow
import SessionCore

/// What the host does to sign in through a browser: open `startURL` (the CLI runs
/// `xdg-open` on it), or show `authorizationURL` to be opened by hand. The browser comes back
/// to `redirectURI`, the loopback listener, which must answer within `timeout`. The PKCE
/// verifier stays inside the flow; the `state` in the authorization URL is only good for this
/// run, but another local user who reads it in time could answer the listener with a
/// matching error and end the sign-in (or, with the PKCE challenge beside it, sign the user in
/// to an account of theirs) — so hand a program you start (whose argv any local user can read
/// in /proc) the start URL, which carries nothing and answers once: a second fetch of it ends
/// the sign-in (`cancelled`), since whoever fetched it first may not be the browser.
///
/// Use one of the two, not both: when the person opens the URL themselves, show them the
/// start URL too, or make the flow with `startPage: false` (no `/start`: `startURL` is nil)
/// and show the authorization URL. A start page that nothing legitimate will fetch is one
/// another local program can fetch once, unnoticed, to read the state and the challenge.
public struct BrowserPrompt: Sendable, Equatable, CustomStringConvertible {
    /// The authorization request (RFC 6749 §4.1.1 with `state`, `code_challenge`,
    /// `code_challenge_method=S256`, `redirect_uri`).
    public let authorizationURL: URL
    /// `http://127.0.0.1:<port>/start`: the listener answers its first fetch with a 302 to
    /// `authorizationURL`; a second fetch ends the sign-in. Nothing secret is in it. Nil when the
    /// flow was made with `startPage: false` (the listener then answers `/start` 404).
    public let startURL: URL?
    /// `http://127.0.0.1:<port>/callback`: the one-shot listener on the loop.
    public let redirectURI: URL
    /// The flow ends with `signInExpired` when no usable redirect came within it.
    public let timeout: Duration

    public var description: String {
        "BrowserPrompt(authorizationURL: \(authorizationURL.absoluteString), startURL: \(startURL?.absoluteString ?? "nil"), "
            + "redirectURI: \(redirectURI.absoluteString), timeout: \(timeout))"
    }
}

/// The authorization code grant with PKCE on a loopback redirect (RFC 6749 §4.1, RFC 7636 S256,
/// RFC 8252 §7.3) as a `SignInFlow`: `SessionManager.signIn(with: BrowserAuthorization(...))`.
///
/// 1. Listens on 127.0.0.1 at an ephemeral port, on the loop (no thread): the redirect URI is
///    `http://127.0.0.1:<port>/callback`.
/// 2. Makes a code verifier (32 random bytes, base64url) and a `state` (16 random bytes), and
///    hands the host the authorization URL (`onPrompt`, on the loop thread) to open.
/// 3. Takes the redirect: a GET of `/callback` whose `state` matches. Then `code` is exchanged
///    at the token endpoint with the verifier; `error=access_denied` ends with `accessDenied`,
///    another `error` with `configuration` (its code and description, printable ASCII only).
///    Anything else — another path or method, a wrong or missing `state`, a callback with
///    neither code nor error, a second redirect after the first — is answered 400 (404 for
///    another path) and ignored: the flow goes on waiting.
/// 4. The page the browser shows says in plain words that the user can close it.
/// 5. The listener is closed whatever happens (the redirect taken, an error, `cancel()`, the
///    timeout, the loop's end: `shutDown`). No usable redirect within `timeout`:
///    `signInExpired`; once one came, the timeout no longer applies (the exchange has the
///    request deadline).
/// 6. On tokens, the member id as `DeviceAuthorization` finds it (token answer, introspection,
///    userinfo).
public final class BrowserAuthorization: SignInFlow {
    public let configuration: OAuthConfiguration
    /// Requested in the authorization request (default: the configuration's `scope`).
    public let scope: String?
    public let timeout: Duration
    /// Whether the listener serves `/start` (`BrowserPrompt.startURL`).
    public let startPage: Bool
    let onPrompt: @Sendable (BrowserPrompt) -> Void

    /// The path of the redirect URI on the loopback listener.
    public static let callbackPath = "/callback"
    /// The path of the start URL on the listener (a 302 to the authorization URL).
    public static let startPath = "/start"

    /// How long the browser has to come back unless the host says otherwise (every host's
    /// default: the C API's `timeout_ms` 0, `watch-session login --browser`).
    public static let defaultTimeout: Duration = .seconds(300)

    /// - Parameters:
    ///   - timeout: how long the browser has to come back (at least 1 s).
    ///   - startPage: serve the start URL (default). Pass false when the host will show the
    ///     authorization URL and never the start URL (see `BrowserPrompt`).
    ///   - onPrompt: runs once on the loop thread when the listener listens (open the URL).
    ///     Calling `cancel()` from inside it is fine.
    /// - Throws: `OAuthConfigurationError` for a configuration without an authorization
    ///   endpoint, or one `OAuthAuthority` would refuse.
    public init(
        _ configuration: OAuthConfiguration, scope: String? = nil, timeout: Duration = defaultTimeout,
        startPage: Bool = true, onPrompt: @escaping @Sendable (BrowserPrompt) -> Void
    ) throws(OAuthConfigurationError) {
        try configuration.validate()
        guard configuration.authorizationEndpoint != nil else {
            throw OAuthConfigurationError(field: "authorization endpoint", reason: "is not set")
        }
        self.configuration = configuration
        self.scope = scope ?? configuration.scope
        self.timeout = max(timeout, .seconds(1))
        self.startPage = startPage
        self.onPrompt = onPrompt
    }

    public func start(
        on loop: EventLoop, completion: @escaping @Sendable (Result<SessionTokens, SessionError>) -> Void
    ) -> any SignInCancellable {
        let run = BrowserRedirect(flow: self, loop: loop, completion: completion)
        run.begin()
        return run
    }

    // MARK: - PKCE (RFC 7636)

    /// base64url without padding (RFC 7636 Appendix A).
    static func base64URL<Bytes: Sequence>(_ bytes: Bytes) -> String where Bytes.Element == UInt8 {
        Base64URL.encode(bytes)
    }

    /// `count` bytes from the system's random source, base64url.
    static func randomToken(bytes count: Int) -> String {
        var generator = SystemRandomNumberGenerator()
        return base64URL((0..<count).map { _ in UInt8.random(in: .min ... .max, using: &generator) })
    }

    /// The S256 challenge of `verifier`: BASE64URL(SHA256(ASCII(verifier))).
    static func challenge(of verifier: String) -> String {
        base64URL(SHA256.hash(data: Array(verifier.utf8)))
    }

    /// The authorization request URL: the endpoint with its own query kept, plus ours.
    static func authorizationURL(
        endpoint: URL, clientID: String, redirectURI: String, scope: String?, state: String, challenge: String
    ) -> URL? {
        var fields = [
            ("response_type", "code"), ("client_id", clientID), ("redirect_uri", redirectURI),
            ("state", state), ("code_challenge", challenge), ("code_challenge_method", "S256"),
        ]
        if let scope { fields.append(("scope", scope)) }
        var text = endpoint.absoluteString
        if let hash = text.firstIndex(of: "#") { text = String(text[..<hash]) }
        let separator = text.contains("?") ? (text.hasSuffix("?") || text.hasSuffix("&") ? "" : "&") : "?"
        return URL(string: text + separator + FormEncoding.encode(fields))
    }
}

/// One run of the browser flow. Loop-confined state; `cancel()` from any thread.
final class BrowserRedirect: SignInRun, @unchecked Sendable {
    private let flow: BrowserAuthorization

    // Loop-confined.
    private var listener: LoopbackListener?
    private var timer: LoopTimer?
    private var verifier: Secret?
    private var state = ""
    private var redirectURI = ""
    /// The redirect was taken (a code or an error): later ones are refused.
    private var taken = false
    /// The authorization URL `/start` redirects to, once (`started`).
    private var authorizationURL = ""
    private var started = false

    init(flow: BrowserAuthorization, loop: EventLoop, completion: @escaping @Sendable (Result<SessionTokens, SessionError>) -> Void) {
        self.flow = flow
        super.init(loop: loop, configuration: flow.configuration, completion: completion)
    }

    func begin() {
        loop.assertInEventLoop()
        guard watchTeardown(), makeAuthority(), let endpoint = configuration.authorizationEndpoint else { return }
        // The secrets exist before anything listens (an empty state would match nothing, but
        // no request is looked at with them unset).
        let verifier = BrowserAuthorization.randomToken(bytes: 32)  // 43 characters (RFC 7636 §4.1)
        self.verifier = Secret(verifier)
        state = BrowserAuthorization.randomToken(bytes: 16)
        do throws(SessionError) {
            listener = try LoopbackListener(loop: loop) { [self] method, target in request(method, target) }
        } catch {
            return finish(.failure(error))
        }
        guard let listener else { return }
        redirectURI = "http://127.0.0.1:\(listener.port)\(BrowserAuthorization.callbackPath)"
        guard let redirect = URL(string: redirectURI),
              let url = BrowserAuthorization.authorizationURL(
                  endpoint: endpoint, clientID: configuration.clientID, redirectURI: redirectURI, scope: flow.scope,
                  state: state, challenge: BrowserAuthorization.challenge(of: verifier))
        else {
            return finish(.failure(SessionError(.configuration, "the authorization URL could not be made")))
        }
        let timeout = flow.timeout
        do {
            timer = try loop.scheduleTimer(after: timeout) { [self] in
                timer = nil
                finish(.failure(SessionError(
                    .signInExpired, "no sign-in came back from the browser within \(timeout)")))
            }
        } catch {
            return finish(.failure(SessionError(.shutDown, "the event loop is shut down")))
        }
        authorizationURL = url.absoluteString
        let start = flow.startPage ? URL(string: "http://127.0.0.1:\(listener.port)\(BrowserAuthorization.startPath)") : nil
        flow.onPrompt(BrowserPrompt(authorizationURL: url, startURL: start, redirectURI: redirect, timeout: timeout))
    }

    // MARK: - The redirect (loop thread, from the listener)

    static let closePage = page(
        "Signed in", "The sign-in reached the application. You can close this window and go back to it.")
    static let stalePage = page(
        "Already done", "This sign-in has already been completed or has ended. You can close this window.")
    static let mismatchPage = page(
        "Not accepted",
        "This answer does not belong to the sign-in in progress, so it was ignored. You can close this window.")
    static let notFoundPage = page("Not found", "There is nothing here. You can close this window.")
    static let continuePage = page("Signing in", "Continuing to the sign-in page of your account.")

    /// Whether `a` and `b` hold the same bytes, in a time that depends on their lengths only
    /// (a local process must not learn `state` a byte at a time from how fast it is refused).
    static func constantTimeEqual(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8), y = Array(b.utf8)
        guard x.count == y.count else { return false }
        var difference: UInt8 = 0
        for index in x.indices { difference |= x[index] ^ y[index] }
        return difference == 0
    }

    static func page(_ title: String, _ text: String) -> String {
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>\(title)</title></head>"
            + "<body><h1>\(title)</h1><p>\(text)</p></body></html>"
    }

    private func request(_ method: String, _ target: String) -> LoopbackListener.Reply {
        let (path, query) = Self.split(target)
        if flow.startPage, path == BrowserAuthorization.startPath, query == nil, method == "GET" {
            guard !taken, !finished else { return .init(status: 400, page: Self.stalePage) }
            guard !started else {
                // Fetched before: by the browser, or by another local program that found the
                // port — which then holds the state and the PKCE challenge. Ended, rather than
                // completed by whoever answers first.
                taken = true
                stopTimer()
                finish(.failure(SessionError(
                    .cancelled,
                    "the sign-in's start page was opened twice, so another program may have read the sign-in: "
                        + "nothing was signed in; sign in again")))
                return .init(status: 400, page: Self.page(
                    "Not signed in",
                    "This sign-in's start page was opened twice, so the sign-in was ended for safety. "
                        + "Start the sign-in again in the application."))
            }
            started = true
            return .init(status: 302, page: Self.continuePage, location: authorizationURL)
        }
        guard path == BrowserAuthorization.callbackPath else { return .init(status: 404, page: Self.notFoundPage) }
        guard !taken, !finished else { return .init(status: 400, page: Self.stalePage) }
        guard method == "GET", let fields = query.map(Self.parseQuery),
              fields.filter({ $0.0 == "state" }).count == 1,
              let sent = fields.first(where: { $0.0 == "state" })?.1, Self.constantTimeEqual(sent, state)
        else {
            return .init(status: 400, page: Self.mismatchPage)
        }
        let codes = fields.filter { $0.0 == "code" }
        let errors = fields.filter { $0.0 == "error" }
        if errors.count == 1, codes.isEmpty {
            taken = true
            stopTimer()
            let code = Self.printable(errors[0].1, limit: 64)
            let description = fields.first(where: { $0.0 == "error_description" }).map { Self.printable($0.1, limit: 200) }
            let said = description.map { "\(code): \($0)" } ?? code
            let error = code == "access_denied"
                ? SessionError(.accessDenied, "the sign-in was denied in the browser (\(said))")
                : SessionError(.configuration, "the authorization server refused the sign-in (\(said))")
            finish(.failure(error))
            return .init(status: 200, page: Self.page(
                "Not signed in", "The sign-in did not complete (\(Self.html(said))). You can close this window."))
        }
        guard codes.count == 1, errors.isEmpty, !codes[0].1.isEmpty, codes[0].1.utf8.count <= 2048 else {
            return .init(status: 400, page: Self.mismatchPage)
        }
        taken = true
        // The browser came back in time: the deadline is over (the exchange has its own).
        stopTimer()
        exchange(Secret(codes[0].1))
        return .init(status: 200, page: Self.closePage)
    }

    /// The code for tokens (RFC 6749 §4.1.3 with the verifier, RFC 7636 §4.5). The listener is
    /// closed first: the browser has its page, nothing else is taken.
    private func exchange(_ code: Secret) {
        closeListener()
        guard let verifier else { return }
        let form: [(String, FormValue)] = [
            ("grant_type", .text("authorization_code")), ("code", .secret(code)), ("redirect_uri", .text(redirectURI)),
            ("code_verifier", .secret(verifier)),
        ]
        tokenPost(form: form, secrets: [code, verifier]) { [self] outcome in
            let answer: HTTPAnswer
            switch outcome {
            case .failure(let error): return finish(.failure(Self.failure(error, at: "the token endpoint")))
            case .success(let value): answer = value
            }
            guard answer.status == 200 else {
                return finish(.failure(Self.failure(TokenResponse.error(from: answer), at: "the token endpoint")))
            }
            switch grant(from: answer) {
            case .success(let (grant, bound)):
                granted(grant, bound: bound, answer: answer, requestedScope: flow.scope)
            case .failure(let error):
                finish(.failure(Self.failure(error, at: "the token endpoint")))
            }
        }
    }

    private func stopTimer() {
        timer?.cancel()
        timer = nil
    }

    private func closeListener() {
        listener?.close()
        listener = nil
    }

    override func cleanUp() {
        closeListener()
        stopTimer()
        verifier = nil
    }

    /// Loop thread: the listener's port while it listens (tests).
    var listeningPort: Int? { listener?.port }

    // MARK: - Parsing

    static func split(_ target: String) -> (path: String, query: String?) {
        guard let mark = target.firstIndex(of: "?") else { return (target, nil) }
        return (String(target[..<mark]), String(target[target.index(after: mark)...]))
    }

    /// `application/x-www-form-urlencoded` pairs ('+' is a space, %XX decoded); a pair that does
    /// not decode to UTF-8 is dropped.
    static func parseQuery(_ query: String) -> [(String, String)] {
        query.split(separator: "&", omittingEmptySubsequences: true).compactMap { pair in
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard let name = decode(parts[0]), let value = decode(parts.count > 1 ? parts[1] : "") else { return nil }
            return (name, value)
        }
    }

    static func decode(_ text: Substring) -> String? {
        var bytes: [UInt8] = []
        var index = text.utf8.startIndex
        let utf8 = text.utf8
        while index < utf8.endIndex {
            let byte = utf8[index]
            if byte == UInt8(ascii: "+") {
                bytes.append(UInt8(ascii: " "))
            } else if byte == UInt8(ascii: "%") {
                let high = utf8.index(after: index)
                guard high < utf8.endIndex, utf8.index(after: high) < utf8.endIndex,
                      let h = hex(utf8[high]), let l = hex(utf8[utf8.index(after: high)])
                else { return nil }
                bytes.append(h << 4 | l)
                index = utf8.index(after: high)
            } else {
                bytes.append(byte)
            }
            index = utf8.index(after: index)
        }
        return String(validating: bytes, as: UTF8.self)
    }

    private static func hex(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    /// Server-given text for a message: printable ASCII only (others become '?'), bounded.
    static func printable(_ text: String, limit: Int) -> String {
        String(String.UnicodeScalarView(text.unicodeScalars.prefix(limit).map {
            (0x20...0x7E).contains($0.value) ? $0 : "?"
        }))
    }

    static func html(_ text: String) -> String {
        var out = ""
        for character in text {
            switch character {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            default: out.append(character)
            }
        }
        return out
    }
}
