import LoopFlow
import SessionCore

/// A session over a whole store (the live watch, `login --watch`, `logout`) refreshes every
/// account of it with one authority; a store may hold accounts signed in at other issuers. This
/// authority keeps each stored token going to the issuer that minted it: a refresh goes to the
/// inner authority only for an account whose stored profile names its token endpoint (or that
/// has no profile: a session stored before profiles, whose server the command line names), by
/// member id; any other is refused as a configuration matter (that account is only watched).
/// The calls that carry no member (validate, revoke, reauthenticate) go only while every account
/// of the store belongs here — revoke also when the caller revokes only the account whose
/// profile named this authority (`logout`: `revokesOwnAccount`).
final class IssuerBoundAuthority: SessionAuthority, @unchecked Sendable {
    private let inner: any SessionAuthority
    private let tokenEndpoint: String
    private let state: LockedBox<(members: Set<String>, foreign: Bool)>
    private let revokesOwnAccount: Bool

    init(_ inner: any SessionAuthority, tokenEndpoint: String, accounts: [StoreView.Account], revokesOwnAccount: Bool = false) {
        self.inner = inner
        self.tokenEndpoint = tokenEndpoint
        self.revokesOwnAccount = revokesOwnAccount
        var members: Set<String> = []
        var foreign = false
        for account in accounts {
            if account.session.profile.map({ $0.tokenEndpoint == tokenEndpoint }) ?? true {
                members.insert(account.key)
                if let member = account.session.memberID { members.insert(member) }
            } else {
                foreign = true
            }
        }
        state = LockedBox((members, foreign))
    }

    /// A session signed in here, with this authority (login): its refreshes go here.
    func allow(member: String?, account: String?) {
        state.withLockedValue { state in
            for key in [member, account].compactMap({ $0 }) { state.members.insert(key) }
        }
    }

    private var wholeStoreIsOurs: Bool { !state.withLockedValue { $0.foreign } }

    func refresh(_ request: RefreshRequest, completion: AuthorityCompletion<TokenGrant>) {
        let member = request.memberID ?? defaultAccount
        guard state.withLockedValue({ $0.members.contains(member) }) else {
            completion.fail(.configuration(
                "other_issuer", "this account was signed in at another issuer than \(tokenEndpoint): watching only"))
            return
        }
        inner.refresh(request, completion: completion)
    }

    var canValidate: Bool { inner.canValidate && wholeStoreIsOurs }

    func validate(accessToken: Secret, completion: AuthorityCompletion<Bool>) {
        guard wholeStoreIsOurs else {
            completion.fail(.configuration("other_issuer", "the store holds accounts of other issuers"))
            return
        }
        inner.validate(accessToken: accessToken, completion: completion)
    }

    var canRevoke: Bool { inner.canRevoke && (revokesOwnAccount || wholeStoreIsOurs) }

    func revoke(refreshToken: Secret?, accessToken: Secret?, completion: AuthorityCompletion<Void>) {
        guard revokesOwnAccount || wholeStoreIsOurs else {
            completion.fail(.configuration("other_issuer", "the store holds accounts of other issuers: not revoked"))
            return
        }
        inner.revoke(refreshToken: refreshToken, accessToken: accessToken, completion: completion)
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
