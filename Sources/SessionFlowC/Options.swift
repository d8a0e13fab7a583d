import CSessionFlow
import Logging
import LoopFlow
import SessionCore
import SessionFileStore
import SessionOAuth
import FoundationEssentials

#if canImport(Glibc)
import Glibc
#endif

// What a runtime's sf_options say, read and checked: the released layouts, the session's
// configuration, the authority, the store's key and the sign-in settings. Apart from
// Runtime.swift, which is the runtime's life (create, start, destroy): the options only
// ever grow, the life does not.

/// The sizes of `sf_options` in the released headers, oldest first: each field group added
/// since (min_refresh_interval_ms; the built-in OAuth client and the store; refresh_release;
/// start_manually; refresh_cancel; the store key; issuer; log; dpop) ends one.
let releasedOptionsSizes: [Int] = [
    MemoryLayout<sf_options>.offset(of: \.min_refresh_interval_ms)!,
    MemoryLayout<sf_options>.offset(of: \.token_endpoint)!,
    MemoryLayout<sf_options>.offset(of: \.refresh_release)!,
    MemoryLayout<sf_options>.offset(of: \.start_manually)!,
    MemoryLayout<sf_options>.offset(of: \.refresh_cancel)!,
    MemoryLayout<sf_options>.offset(of: \.store_key)!,
    MemoryLayout<sf_options>.offset(of: \.issuer)!,
    MemoryLayout<sf_options>.offset(of: \.log)!,
    MemoryLayout<sf_options>.offset(of: \.dpop)!,
    MemoryLayout<sf_options>.size,
]

/// The options the host gave, read up to the size it declared (older hosts pass a
/// shorter struct: one of `releasedOptionsSizes`, anything else is nil), over the defaults.
func readOptions(_ options: UnsafePointer<sf_options>?) -> sf_options? {
    var result = sf_options()
    sf_options_init(&result)
    guard let options else { return result }
    let declared = options.pointee.size
    guard acceptedSize(declared, releasedOptionsSizes) else { return nil }
    let count = declared
    withUnsafeMutableBytes(of: &result) { target in
        target.copyMemory(from: UnsafeRawBufferPointer(start: options, count: count))
    }
    result.size = MemoryLayout<sf_options>.size
    return result
}

func configuration(from options: sf_options, logger: Logger) -> SessionConfiguration? {
    var configuration = SessionConfiguration()
    configuration.policy.margin = .milliseconds(options.refresh_margin_ms)
    configuration.policy.timeout = .milliseconds(options.refresh_timeout_ms)
    configuration.policy.initialBackoff = .milliseconds(options.min_backoff_ms)
    configuration.policy.maximumBackoff = .milliseconds(options.max_backoff_ms)
    configuration.policy.minimumInterval = .milliseconds(options.min_refresh_interval_ms)
    // The same check the session makes (RefreshPolicy.problem), answered here as SF_EINVAL.
    if let problem = configuration.policy.problem {
        explain(problem)
        return nil
    }
    configuration.startsAutomatically = options.start_manually == 0
    configuration.logger = logger
    return configuration
}

/// The built-in OAuth 2.0 authority's configuration, when the host names a token endpoint
/// and no refresher of its own; nil when it does not. Unusable settings throw (said in the
/// log: SF_EINVAL alone would not tell the host which field is wrong).
func oauthConfiguration(from options: sf_options) throws(OAuthConfigurationError) -> OAuthConfiguration? {
    guard options.refresh == nil, let tokenEndpoint = string(options.token_endpoint) else { return nil }
    func url(_ text: String, _ field: String) throws(OAuthConfigurationError) -> URL {
        guard let url = URL(string: text) else { throw OAuthConfigurationError(field: field, reason: "is not a URL") }
        return url
    }
    var oauth = OAuthConfiguration(
        tokenEndpoint: try url(tokenEndpoint, "token endpoint"),
        clientID: string(options.client_id) ?? "", clientSecret: string(options.client_secret).map(Secret.init))
    oauth.scope = string(options.scope)
    oauth.dpop = try dpopMode(from: options)
    if let revocation = string(options.revocation_endpoint) {
        oauth.revocationEndpoint = try url(revocation, "revocation endpoint")
    }
    if let introspection = string(options.introspection_endpoint) {
        oauth.introspectionEndpoint = try url(introspection, "introspection endpoint")
    }
    try oauth.validate()
    return oauth
}

/// The issuer of `sf_options.issuer`, checked (a URL with the transport rule, no query or
/// fragment), or nil when it is not set.
func issuer(from options: sf_options) throws(OAuthConfigurationError) -> URL? {
    if let problem = HostInput.problem(options.issuer, "issuer", limit: HostInput.maximumURLLength) {
        throw OAuthConfigurationError(field: "issuer", reason: String(problem.dropFirst("issuer ".count)))
    }
    guard let text = string(options.issuer) else { return nil }
    guard !text.isEmpty, let url = URL(string: text) else { throw OAuthConfigurationError(field: "issuer", reason: "is not a URL") }
    _ = try OAuthDiscovery.wellKnownLocations(url)
    return url
}

/// The built-in authority from `sf_options.issuer` alone (no refresher, no token endpoint):
/// its configuration's client, scope and limits, the endpoints left to discovery.
func issuerTemplate(from options: sf_options) throws(OAuthConfigurationError) -> (URL, OAuthConfiguration)? {
    guard options.refresh == nil, string(options.token_endpoint) == nil, let issuer = try issuer(from: options) else {
        return nil
    }
    guard let clientID = string(options.client_id), !clientID.isEmpty else {
        throw OAuthConfigurationError(field: "client id", reason: "is not set (the issuer's authority needs the client)")
    }
    var template = OAuthConfiguration(
        tokenEndpoint: issuer, clientID: clientID, clientSecret: string(options.client_secret).map(Secret.init))
    template.scope = string(options.scope)
    template.dpop = try dpopMode(from: options)
    return (issuer, template)
}

/// `sf_options.dpop` (SF_DPOP_OFF, SF_DPOP_REQUIRED, SF_DPOP_IF_SUPPORTED).
func dpopMode(from options: sf_options) throws(OAuthConfigurationError) -> DPoPMode {
    switch options.dpop {
    case 0: return .off
    case 1: return .required
    case 2: return .ifSupported
    default:
        throw OAuthConfigurationError(
            field: "dpop", reason: "is \(options.dpop), not SF_DPOP_OFF (0), SF_DPOP_REQUIRED (1) or SF_DPOP_IF_SUPPORTED (2)")
    }
}

/// The host's refresher if it gave one; else the built-in OAuth 2.0 authority if it named
/// a token endpoint, or an issuer (endpoints discovered on first use); else a refresher that
/// answers "not configured".
func authority(from options: sf_options, loop: EventLoop) throws(OAuthConfigurationError) -> any SessionAuthority {
    if let oauth = try oauthConfiguration(from: options) {
        return try OAuthAuthority(oauth, loop: loop)
    }
    if let (issuer, template) = try issuerTemplate(from: options) {
        return try IssuerAuthority(issuer: issuer, template: template, loop: loop)
    }
    return HostAuthority(
        refresh: options.refresh, cancel: options.refresh_cancel, userdata: UserData(pointer: options.refresh_userdata))
}

/// Whether the options can make a runtime; an unusable setting is logged by name, and said
/// (sf_last_error_message).
func optionsAreUsable(_ options: sf_options, logger: Logger) -> Bool {
    guard configuration(from: options, logger: logger) != nil else { return false }
    do {
        _ = try oauthConfiguration(from: options)
        _ = try issuer(from: options)
        _ = try issuerTemplate(from: options)
        _ = try storeKey(from: options)
        _ = try dpopMode(from: options)
        return true
    } catch {
        // The field by its C name: "sf_options.token_endpoint uses plain http to a host...".
        let field = "sf_options." + error.field.replacing(" ", with: "_")
        logger.error("sf_runtime_create: SF_EINVAL: \(field) \(error.reason)")
        explain("\(field) \(error.reason)")
        return false
    }
}

@c @implementation
public func sf_options_init(_ options: UnsafeMutablePointer<sf_options>!) {
    guard let options else { return }
    options.pointee = sf_options(
        size: MemoryLayout<sf_options>.size,
        refresh_margin_ms: 300_000,
        refresh_timeout_ms: 30_000,
        min_backoff_ms: 1_000,
        max_backoff_ms: 30_000,
        refresh: nil,
        refresh_userdata: nil,
        min_refresh_interval_ms: 10_000,
        token_endpoint: nil,
        client_id: nil,
        client_secret: nil,
        scope: nil,
        revocation_endpoint: nil,
        introspection_endpoint: nil,
        store_directory: nil,
        refresh_release: nil,
        start_manually: 0,
        refresh_cancel: nil,
        store_key: nil,
        store_key_size: 0,
        store_key_file: nil,
        store_key_source: 0,
        issuer: nil,
        log: nil,
        log_userdata: nil,
        log_level: Int32(SF_LOG_INFO.rawValue),
        dpop: 0)
}

/// The store's key as the options say (`store_key`, `store_key_file`, `store_key_source`);
/// unusable settings throw, naming the field. The key bytes are copied here, during create.
func storeKey(from options: sf_options) throws(OAuthConfigurationError) -> FileCredentialStore.Key {
    let hasKey = options.store_key != nil || options.store_key_size != 0
    let keyFile = string(options.store_key_file)
    if hasKey || keyFile != nil, options.store_directory == nil {
        throw OAuthConfigurationError(
            field: hasKey ? "store key" : "store key file", reason: "is set without store_directory (there is no store to key)")
    }
    if hasKey && keyFile != nil {
        throw OAuthConfigurationError(field: "store key", reason: "and store_key_file are both set (give one)")
    }
    if hasKey {
        guard let bytes = options.store_key else {
            throw OAuthConfigurationError(field: "store key", reason: "is NULL with store_key_size \(options.store_key_size)")
        }
        guard options.store_key_size != 0 else {
            throw OAuthConfigurationError(field: "store key size", reason: "is 0 with store_key set (a 256-bit key: 32)")
        }
        guard options.store_key_size == 32 else {
            throw OAuthConfigurationError(
                field: "store key size", reason: "is \(options.store_key_size), not 32 (a 256-bit key) or 0 (no key)")
        }
        return .provided(copying: UnsafeRawBufferPointer(start: bytes, count: 32))
    }
    if let keyFile {
        do {
            return try FileCredentialStore.Key.fromFile(keyFile)
        } catch {
            throw OAuthConfigurationError(field: "store key file", reason: "cannot be used: \(error.message)")
        }
    }
    switch options.store_key_source {
    case SF_STORE_KEY_AUTOMATIC: return .automatic
    case SF_STORE_KEY_FILE: return .keyFile
    case SF_STORE_KEY_SECRET_SERVICE: return .secretService
    default:
        throw OAuthConfigurationError(
            field: "store key source", reason: "is \(options.store_key_source), not one of SF_STORE_KEY_AUTOMATIC, SF_STORE_KEY_FILE, SF_STORE_KEY_SECRET_SERVICE")
    }
}

/// What a runtime's sf_options say about sign-in flows: the client, and the endpoints when
/// a token endpoint is named (whether or not the host refreshes itself).
struct SignInBase: Sendable {
    var configuration: OAuthConfiguration?
    var clientID: String?
    var clientSecret: Secret?
    var scope: String?
    /// `sf_options.issuer`: the issuer of flows that name none.
    var issuer: URL?
    /// `sf_options.dpop`.
    var dpop: DPoPMode

    init(_ options: sf_options) {
        var plain = options
        plain.refresh = nil  // the endpoints are wanted even when the host refreshes itself
        configuration = (try? oauthConfiguration(from: plain)) ?? nil
        clientID = string(options.client_id).flatMap { $0.isEmpty ? nil : $0 }
        clientSecret = string(options.client_secret).map(Secret.init)
        scope = string(options.scope)
        issuer = (try? SessionFlowC.issuer(from: options)) ?? nil
        dpop = (try? dpopMode(from: options)) ?? .off
    }
}
