import FoundationEssentials
import LoopFlow
import Synchronization
import SessionCore

/// Configuration from an issuer URL: OAuth 2.0 Authorization Server Metadata (RFC 8414),
/// with OpenID Connect Discovery 1.0 as the fallback.
///
/// For an issuer `https://h/tenant` the document is fetched from
/// `https://h/.well-known/oauth-authorization-server/tenant` (RFC 8414 §3.1: the well-known
/// segment goes between the host and the issuer's path); if that answers 404, from
/// `https://h/tenant/.well-known/openid-configuration` (OIDC Discovery §4). Both are GETs on the
/// loop's own HTTP client, with its rules: https (plain http only to a loopback host), no
/// redirect followed, an overall deadline, the answer size limited while it is received,
/// `Accept-Encoding: identity`.
///
/// The document is refused, with an error naming the member, when its `issuer` is not exactly
/// (string comparison, RFC 8414 §3.3) the issuer asked for, when it has no `token_endpoint`, or
/// when any endpoint it names breaks the transport's rule (plain http to a host that is not
/// loopback, credentials inside the URL, another scheme, no host). The endpoints it gives are
/// `token_endpoint`, `revocation_endpoint`, `introspection_endpoint`,
/// `device_authorization_endpoint`, `authorization_endpoint` and (OIDC) `userinfo_endpoint`.
///
/// Nothing the server wrote reaches an error unfiltered: a value shown (an `issuer` that does
/// not match) is kept to printable ASCII and cut to `ErrorText.maximumDescriptionLength`.
public enum OAuthDiscovery {
    /// The RFC 8414 well-known suffix.
    public static let authorizationServerSuffix = "/.well-known/oauth-authorization-server"
    /// The OpenID Connect Discovery well-known suffix.
    public static let openIDSuffix = "/.well-known/openid-configuration"

    /// Fetches the issuer's metadata on `loop` and makes the configuration it describes.
    /// `completion` runs once, on the loop thread, never inside this call (unless the loop is
    /// already shut down: then it runs at once with a `.network` error).
    ///
    /// `clientSecret`, `requestTimeout` and `maximumAnswerSize` go into the configuration
    /// made, and the last two also bound the discovery requests themselves.
    ///
    /// The result's `cancel()` (any thread, any number of times) ends the request in flight;
    /// the completion then says `.cancelled` (unless it had run already), on a later loop
    /// turn, never inside `cancel()`.
    @discardableResult
    public static func configuration(
        issuer: URL, clientID: String, loop: EventLoop, clientSecret: Secret? = nil,
        requestTimeout: Duration = .seconds(20), maximumAnswerSize: Int = 1 << 20,
        completion: @escaping @Sendable (Result<OAuthConfiguration, OAuthDiscoveryError>) -> Void
    ) -> any SignInCancellable {
        var template = OAuthConfiguration(tokenEndpoint: issuer, clientID: clientID, clientSecret: clientSecret)
        template.issuer = issuer
        template.requestTimeout = requestTimeout
        template.maximumAnswerSize = maximumAnswerSize
        let run: DiscoveryRun
        do {
            let locations = try wellKnownLocations(issuer)
            try template.validate()
            run = DiscoveryRun(issuer: issuer.absoluteString, locations: locations, template: template, loop: loop,
                               completion: completion)
        } catch {
            let failure = OAuthDiscoveryError(.configuration, field: error.field, message: error.description)
            do {
                try loop.execute { completion(.failure(failure)) }
            } catch {
                completion(.failure(failure))
            }
            return NothingToCancel()
        }
        do {
            try loop.execute { run.fetch(run.locations.authorizationServer, fallback: run.locations.openID) }
        } catch {
            completion(.failure(OAuthDiscoveryError(.network, message: "the event loop is shut down")))
        }
        return run
    }

    /// The `async` form of `configuration(issuer:clientID:loop:...)`.
    public static func configuration(
        issuer: URL, clientID: String, loop: EventLoop, clientSecret: Secret? = nil,
        requestTimeout: Duration = .seconds(20), maximumAnswerSize: Int = 1 << 20
    ) async throws(OAuthDiscoveryError) -> OAuthConfiguration {
        // Cancelling the calling Task cancels the discovery (`.cancelled`).
        let running = LockedBox<(run: (any SignInCancellable)?, cancelled: Bool)>((nil, false))
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                let run = configuration(
                    issuer: issuer, clientID: clientID, loop: loop, clientSecret: clientSecret,
                    requestTimeout: requestTimeout, maximumAnswerSize: maximumAnswerSize
                ) { result in
                    continuation.resume(returning: result)
                }
                let cancelled = running.withLockedValue { state -> Bool in
                    state.run = run
                    return state.cancelled
                }
                if cancelled { run.cancel() }
            }
        } onCancel: {
            running.withLockedValue { state -> (any SignInCancellable)? in
                state.cancelled = true
                return state.run
            }?.cancel()
        }
        return try result.get()
    }

    /// Where the metadata documents of `issuer` are.
    public struct Locations: Sendable, Equatable {
        /// RFC 8414 §3.1.
        public let authorizationServer: String
        /// OpenID Connect Discovery 1.0 §4.
        public let openID: String
    }

    /// The two well-known URLs of `issuer` (one terminating `/` of its path is dropped first).
    /// - Throws: for an issuer that breaks the transport rule, or has a query or fragment
    ///   (RFC 8414 §2).
    public static func wellKnownLocations(_ issuer: URL) throws(OAuthConfigurationError) -> Locations {
        try OAuthConfiguration.check(issuer, "issuer")
        let text = issuer.absoluteString
        guard !text.contains("?"), !text.contains("#") else {
            throw OAuthConfigurationError(field: "issuer", reason: "has a query or fragment (RFC 8414 section 2 forbids both)")
        }
        guard let schemeEnd = text.firstRange(of: "://") else {
            throw OAuthConfigurationError(field: "issuer", reason: "is not a URL with a host")
        }
        let authorityEnd = text[schemeEnd.upperBound...].firstIndex(of: "/") ?? text.endIndex
        let origin = String(text[..<authorityEnd])
        var path = String(text[authorityEnd...])
        if path.hasSuffix("/") { path.removeLast() }
        return Locations(authorizationServer: origin + authorizationServerSuffix + path, openID: origin + path + openIDSuffix)
    }

    /// The members naming endpoints, and where each goes. `token_endpoint` is required.
    static var endpointMembers: [(String, WritableKeyPath<OAuthConfiguration, URL?>)] {
        [
            ("revocation_endpoint", \.revocationEndpoint),
            ("introspection_endpoint", \.introspectionEndpoint),
            ("device_authorization_endpoint", \.deviceAuthorizationEndpoint),
            ("authorization_endpoint", \.authorizationEndpoint),
            ("userinfo_endpoint", \.userinfoEndpoint),
        ]
    }

    /// The configuration a metadata document (a 200's body) describes, or why it is refused.
    @_spi(Fuzzing) public static func configuration(
        metadata body: [UInt8], issuer: String, template: OAuthConfiguration
    ) -> Result<OAuthConfiguration, OAuthDiscoveryError> {
        let secrets = [template.clientSecret].compactMap { $0 }
        func refuse(_ field: String?, _ message: String) -> Result<OAuthConfiguration, OAuthDiscoveryError> {
            .failure(OAuthDiscoveryError(.metadata, field: field, message: message))
        }
        guard let object = try? JSONDecoder().decode([String: JSONMember].self, from: Data(body)) else {
            return refuse(nil, "the metadata document is not a JSON object")
        }
        guard let member = object["issuer"] else {
            return refuse("issuer", "the metadata has no issuer")
        }
        guard case .string(let stated) = member else {
            return refuse("issuer", "the metadata's issuer is not a string")
        }
        // Byte for byte (RFC 8414 §3.3 "identical"): Swift's `==` on strings compares canonical
        // equivalence, so ".../K" would equal ".../\u{212A}" (the Kelvin sign).
        guard stated.utf8.elementsEqual(issuer.utf8) else {
            let shown = ErrorText.description(stated, secrets: secrets) ?? ""
            let asked = ErrorText.description(issuer, secrets: secrets) ?? ""
            return refuse("issuer", "the metadata's issuer '\(shown)' is not the issuer asked for '\(asked)' "
                + "(RFC 8414 section 3.3: they must be identical)")
        }
        guard let issuerURL = URL(string: issuer) else {
            return refuse("issuer", "the issuer is not a URL")
        }
        func endpoint(_ name: String) -> Result<URL?, OAuthDiscoveryError> {
            guard let member = object[name] else { return .success(nil) }
            guard case .string(let text) = member else {
                return .failure(OAuthDiscoveryError(.metadata, field: name, message: "the metadata's \(name) is not a string"))
            }
            guard let url = URL(string: text) else {
                return .failure(OAuthDiscoveryError(.metadata, field: name, message: "the metadata's \(name) is not a URL"))
            }
            do {
                // Plain http to loopback only for a loopback issuer (issue 29, point 3).
                try OAuthConfiguration.check(url, "metadata's \(name)", namedBy: issuerURL)
            } catch {
                return .failure(OAuthDiscoveryError(.metadata, field: name, message: error.description))
            }
            return .success(url)
        }
        var configuration = template
        // RFC 9449 §5.1: the algorithms the server takes for DPoP proofs (a member of another
        // shape, or a list of more than 64, is taken as none).
        struct DPoPMetadata: Decodable { let dpop_signing_alg_values_supported: [String]? }
        if let algorithms = (try? JSONDecoder().decode(DPoPMetadata.self, from: Data(body)))?.dpop_signing_alg_values_supported,
           algorithms.count <= 64 {
            configuration.dpopSigningAlgorithms = algorithms
        }
        switch endpoint("token_endpoint") {
        case .failure(let error): return .failure(error)
        case .success(nil): return refuse("token_endpoint", "the metadata has no token_endpoint")
        case .success(let url?): configuration.tokenEndpoint = url
        }
        for (name, path) in endpointMembers {
            switch endpoint(name) {
            case .failure(let error): return .failure(error)
            case .success(let url): configuration[keyPath: path] = url
            }
        }
        do {
            try configuration.validate()
        } catch {
            return refuse(nil, "the configuration made from the metadata is refused: \(error.description)")
        }
        return .success(configuration)
    }
}

/// Why discovery produced no configuration. `field` names what was refused: a member of the
/// metadata document (`issuer`, `token_endpoint`, `revocation_endpoint`...) for `.metadata`,
/// a setting (`issuer`, `client id`...) for `.configuration`. `description` is bounded and
/// holds only printable ASCII of what the server sent.
public struct OAuthDiscoveryError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        /// What was asked for is unusable (the issuer breaks the transport rule...); no request was made.
        case configuration
        /// The document was refused (mismatching issuer, missing or unusable endpoint,
        /// not JSON, too large).
        case metadata
        /// The server answered a status other than 200 (a redirect included: never followed).
        case http
        /// No answer: network failure, timeout, the loop shutting down. Worth retrying.
        case network
        /// `cancel()` (or the calling Task's cancellation) ended it.
        case cancelled
    }

    public let kind: Kind
    public let field: String?
    public let message: String
    /// The HTTP status of an `.http` failure (nil for the others, and for a redirect).
    public let status: Int?

    public init(_ kind: Kind, field: String? = nil, status: Int? = nil, message: String) {
        self.kind = kind
        self.field = field
        self.status = status
        self.message = message
    }

    /// Worth trying again later: no answer (network, timeout), or a server that is
    /// overloaded or failing (HTTP 408, 429, 5xx).
    public var isTransient: Bool {
        switch kind {
        case .network: true
        case .http: status.map { $0 == 408 || $0 == 429 || (500...599).contains($0) } ?? false
        default: false
        }
    }

    public var description: String { message }
}

private struct NothingToCancel: SignInCancellable {
    func cancel() {}
}

/// One discovery: the RFC 8414 request, then perhaps the OIDC one. Loop-confined once started;
/// `cancel()` from any thread.
private final class DiscoveryRun: SignInCancellable, @unchecked Sendable {
    private let cancelRequested = Atomic<Bool>(false)
    // Loop-confined.
    private var call: HTTPCall?
    private var finished = false

    let issuer: String
    let locations: OAuthDiscovery.Locations
    let template: OAuthConfiguration
    let loop: EventLoop
    let http: LoopHTTPClient
    let completion: @Sendable (Result<OAuthConfiguration, OAuthDiscoveryError>) -> Void

    init(
        issuer: String, locations: OAuthDiscovery.Locations, template: OAuthConfiguration, loop: EventLoop,
        completion: @escaping @Sendable (Result<OAuthConfiguration, OAuthDiscoveryError>) -> Void
    ) {
        self.issuer = issuer
        self.locations = locations
        self.template = template
        self.loop = loop
        self.http = LoopHTTPClient(loop: loop)
        self.completion = completion
    }

    func cancel() {
        guard !cancelRequested.exchange(true, ordering: .acquiringAndReleasing) else { return }
        let stop: @Sendable () -> Void = { [self] in
            finish(.failure(OAuthDiscoveryError(.cancelled, message: "the discovery was cancelled")))
        }
        // On a later turn, never inside this call (the completion may call back into the host).
        try? loop.execute(stop)
    }

    /// Loop thread. GETs `url`; on 404, `fallback` if there is one.
    func fetch(_ url: String, fallback: String?) {
        guard !finished else { return }
        guard !cancelRequested.load(ordering: .acquiring) else {
            return finish(.failure(OAuthDiscoveryError(.cancelled, message: "the discovery was cancelled")))
        }
        let request = HTTPRequest(
            method: .get, url: url, headers: ["Accept: application/json"], timeout: template.requestTimeout,
            maximumAnswerSize: template.maximumAnswerSize,
            allowsLoopbackHTTP: true)  // only an issuer that passed the rule reaches here
        call = http.send(request) { [self] result in
            call = nil
            guard !finished else { return }
            // A cancel posted before this answer was handled wins (the contract: after
            // `cancel()` the completion says `.cancelled`), and no fallback is fetched.
            guard !cancelRequested.load(ordering: .acquiring) else {
                return finish(.failure(OAuthDiscoveryError(.cancelled, message: "the discovery was cancelled")))
            }
            switch result {
            case .success(let response) where response.status == 404 && fallback != nil:
                fetch(fallback!, fallback: nil)
            case .success(let response) where response.status == 200:
                finish(OAuthDiscovery.configuration(metadata: response.bytes, issuer: issuer, template: template))
            case .success(let response) where (300...399).contains(response.status):
                finish(.failure(OAuthDiscoveryError(.http, message:
                    "the metadata request got HTTP \(response.status): the server redirects elsewhere; "
                        + "redirects are not followed (the issuer must be the server's own URL)")))
            case .success(let response):
                let which = url == locations.openID
                    ? "the OpenID Connect discovery request (after a 404 at the RFC 8414 location)"
                    : "the metadata request"
                finish(.failure(OAuthDiscoveryError(.http, status: response.status, message: "\(which) got HTTP \(response.status)")))
            case .failure(let failure):
                finish(.failure(error(for: failure)))
            }
        }
    }

    private func error(for failure: HTTPFailure) -> OAuthDiscoveryError {
        let secrets = [template.clientSecret].compactMap { $0 }
        switch failure {
        case .cancelled:
            return OAuthDiscoveryError(.network, message: "the metadata request was cancelled (the loop is shutting down)")
        case .timedOut:
            return OAuthDiscoveryError(.network, message:
                "network: no metadata within \(template.requestTimeout) (the request timed out)")
        case .tooLarge:
            return OAuthDiscoveryError(.metadata, message:
                "the metadata document is larger than \(template.maximumAnswerSize) bytes; the transfer was stopped")
        case .network(let text):
            return OAuthDiscoveryError(.network, message:
                "network: \(ErrorText.description(text, secrets: secrets) ?? "")")
        case .refused(let text):
            return OAuthDiscoveryError(.network, message:
                "the metadata request was not sent: \(ErrorText.description(text, secrets: secrets) ?? "")")
        case .answerLost(let status, let text):  // only refreshes have an answer rule
            return OAuthDiscoveryError(.network, message:
                "network: the metadata answer (HTTP \(status)) was cut off: \(ErrorText.description(text, secrets: secrets) ?? "")")
        }
    }

    /// Loop thread. The client is let go of on a later loop turn, not inside its own callback.
    private func finish(_ result: Result<OAuthConfiguration, OAuthDiscoveryError>) {
        guard !finished else { return }
        finished = true
        if let running = call {
            call = nil
            running.cancel()  // its handler sees `finished`
        }
        let http = self.http
        try? loop.execute { withExtendedLifetime(http) {} }
        completion(result)
    }
}
