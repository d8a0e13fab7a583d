import LoopFlow
import SessionCore

/// A session over a whole store (the live watch, `login --watch`, `logout`) refreshes every
/// account of it with one authority; a store may hold accounts signed in at other issuers. This
/// authority keeps each stored token going to the issuer that minted it, judged at each call
/// by the profile of the session the token belongs to (`RefreshRequest.profile`; the profile
/// given with a revocation) — not by a list made at start-up, which another process's sign-in
/// at another issuer under the same account key would make wrong:
/// - a session whose profile names this token endpoint is refreshed and revoked here;
/// - a session without a profile (bare tokens, a record stored before profiles) only when the
///   command line named this server (`adoptsSessionsWithoutProfile`: whose server it is, the
///   person running the command says) — not when the server was taken from another account's
///   stored profile;
/// - any other is refused as a configuration matter: that account is only watched.
/// The calls that carry no session (validate, re-authenticate, and a revocation without a
/// profile) go only while every account the store held at start-up belongs here.
final class IssuerBoundAuthority: SessionAuthority, @unchecked Sendable {
    private let inner: any SessionAuthority
    private let tokenEndpoint: String
    private let clientID: String
    private let adoptsSessionsWithoutProfile: Bool
    private let foreign: Bool

    init(
        _ inner: any SessionAuthority, tokenEndpoint: String, clientID: String, adoptsSessionsWithoutProfile: Bool,
        accounts: [StoreView.Account]
    ) {
        self.inner = inner
        self.tokenEndpoint = tokenEndpoint
        self.clientID = clientID
        self.adoptsSessionsWithoutProfile = adoptsSessionsWithoutProfile
        foreign = accounts.contains { account in
            account.session.profile.map { $0.tokenEndpoint != tokenEndpoint || $0.clientID != clientID }
                ?? !adoptsSessionsWithoutProfile
        }
    }

    /// Whether the tokens of the session with `profile` were minted here, for this client (a
    /// refresh token sent with another client's id is refused as `invalid_grant`, RFC 6749
    /// §5.2, and would end that session).
    private func mintedHere(_ profile: SessionProfile?) -> Bool {
        profile.map { $0.tokenEndpoint == tokenEndpoint && $0.clientID == clientID } ?? adoptsSessionsWithoutProfile
    }

    private var otherIssuer: AuthorityError {
        .configuration(
            "other_issuer",
            "this account was not signed in at \(tokenEndpoint) as \(clientID) (another issuer or client, or unknown): watching only")
    }

    func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        guard mintedHere(request.profile) else {
            completion.fail(otherIssuer)
            return
        }
        inner.refresh(request, completion: completion)
    }

    private var wholeStoreIsOurs: Bool { !foreign }

    var canValidate: Bool { inner.canValidate && wholeStoreIsOurs }

    func validate(accessToken: Secret, completion: AuthorityCompletion<Bool>) {
        guard wholeStoreIsOurs else {
            completion.fail(.configuration("other_issuer", "the store holds accounts of other issuers"))
            return
        }
        inner.validate(accessToken: accessToken, completion: completion)
    }

    var canRevoke: Bool { inner.canRevoke }

    func revoke(refreshToken: Secret?, accessToken: Secret?, completion: AuthorityCompletion<Void>) {
        guard wholeStoreIsOurs else {
            completion.fail(.configuration("other_issuer", "the store holds accounts of other issuers: not revoked"))
            return
        }
        inner.revoke(refreshToken: refreshToken, accessToken: accessToken, completion: completion)
    }

    func revoke(
        refreshToken: Secret?, accessToken: Secret?, profile: SessionProfile?, completion: AuthorityCompletion<Void>
    ) {
        guard mintedHere(profile) else {
            completion.fail(.configuration(
                "other_issuer",
                "this account was not signed in at \(tokenEndpoint) as \(clientID) (another issuer or client, or unknown): not revoked"))
            return
        }
        inner.revoke(refreshToken: refreshToken, accessToken: accessToken, profile: profile, completion: completion)
    }

    var canReauthenticate: Bool { inner.canReauthenticate && wholeStoreIsOurs }

    func reauthenticate(externalUserID: String, completion: AuthorityCompletion<TokenGrant>) {
        guard wholeStoreIsOurs else {
            completion.fail(.configuration("other_issuer", "the store holds accounts of other issuers"))
            return
        }
        inner.reauthenticate(externalUserID: externalUserID, completion: completion)
    }
}
