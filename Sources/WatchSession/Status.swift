import ArgumentParser
import FoundationEssentials
import Glibc
import SessionCore

/// `watch-session status`: once, what the store holds, read directly (no session started,
/// nothing sent, nothing refreshed).
struct Status: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Shows, once, each stored account: state, member, issuer, scopes, expiry, next refresh, the store.",
        discussion: """
            Reads the store only: nothing is sent and nothing is refreshed. The exit code is the \
            chosen account's (--account, else the active one):

              0  signed in
              1  signed out (no session, or no such account)
              4  the session expired (sign in again)
              7  the store cannot be read (the session is not known: not "signed out")

            --json prints one object: {"version":1,"store":{"directory":…,"status":…,"reason":…},\
            "account":<the chosen key or null>,"state":…,"accounts":[{"account":…,"active":…,\
            "state":…,"member_id":…,"issuer":…,"client_id":…,"requested_scope":…,\
            "granted_scope":…,"expires_in_s":…,"next_refresh_in_s":…}]}. Every JSON key of \
            watch-session is snake_case. States: loggedIn, loggedOut, sessionExpired.
            """)

    @OptionGroup var options: AccountOptions

    @Flag(help: "Print one JSON object (with a \"version\" field) instead of lines for people.")
    var json = false

    /// The version of the `--json` document (bumped when a field changes meaning or goes).
    static let jsonVersion = 1

    func run() async throws {
        let view = try options.view()
        let accounts: [StoreView.Account]
        var storeFailure: CommandFailure?
        switch view.accounts() {
        case .success(let read): accounts = read
        case .failure(let failure):
            accounts = []
            storeFailure = failure
        }
        var code: Int32 = StatusCodes.signedOut
        var chosen: StoreView.Account?
        var chosenFailure: CommandFailure?
        if let storeFailure {
            code = storeFailure.code
        } else {
            do {
                chosen = try view.chosen(options.account, in: accounts)
            } catch {
                chosenFailure = error
            }
            code = switch chosen?.state {
            case .loggedIn?: StatusCodes.signedIn
            case .sessionExpired?: StatusCodes.expired
            default: StatusCodes.signedOut
            }
        }
        let shown = options.account == nil ? accounts : accounts.filter { $0.key == options.account }
        if json {
            var document: [String: Any] = [
                "version": Self.jsonVersion,
                "store": [
                    "directory": view.directory, "status": storeFailure == nil ? "available" : "unavailable",
                    "reason": storeFailure?.message ?? JSONNull(),
                ] as [String: Any],
                "account": chosen?.key ?? JSONNull(),
                "state": storeFailure == nil ? (chosen?.state ?? .loggedOut).rawValue : JSONNull(),
                "accounts": shown.map(Self.object),
            ]
            if let chosenFailure { document["error"] = chosenFailure.message }
            StandardStream.output.write(Data((Terminal.escapeJSON(JSONText.of(document)) + "\n").utf8))
        } else {
            var lines = ["store: \(Terminal.escape(view.directory)) (\(storeFailure == nil ? "available" : "unavailable"))"]
            if storeFailure == nil && shown.isEmpty && chosenFailure == nil { lines.append("not signed in") }
            for account in shown { lines += Self.lines(account) }
            StandardStream.output.write(Data((lines.joined(separator: "\n") + "\n").utf8))
            if let failure = storeFailure ?? chosenFailure {
                StandardStream.error.write(Data(Terminal.errorLine(failure.message).utf8))
            }
        }
        if code != 0 { throw ExitCode(code) }
    }

    /// Seconds until the access token expires, and until the latest moment its refresh is due
    /// (the library refreshes within the margin before expiry — at most half the time the token
    /// has left, as a session starting now would take it; a running session earlier, with
    /// jitter). nil when the record has no expiry.
    static func timing(_ account: StoreView.Account) -> (expiresIn: Double, nextRefreshIn: Double)? {
        guard account.state == .loggedIn, let expiresAt = account.session.accessTokenExpiresAt else { return nil }
        let remaining = expiresAt - SessionConfiguration.realtime()
        let left = remaining.timeInterval
        let margin = RefreshPolicy().effectiveMargin(lifetime: max(remaining, .zero)).timeInterval
        return (max(left, 0), max(left - margin, 0))
    }

    static func object(_ account: StoreView.Account) -> [String: Any] {
        let profile = account.session.profile
        let timing = timing(account)
        return [
            "account": account.key, "active": account.isActive, "state": account.state.rawValue,
            "member_id": account.session.memberID ?? JSONNull(),
            "issuer": profile?.issuer ?? JSONNull(), "client_id": profile?.clientID ?? JSONNull(),
            "requested_scope": profile?.requestedScope ?? JSONNull(),
            "granted_scope": profile?.grantedScope ?? JSONNull(),
            "expires_in_s": timing.map { Int($0.expiresIn.rounded(.down)) as Any } ?? JSONNull(),
            "next_refresh_in_s": timing.map { Int($0.nextRefreshIn.rounded(.down)) as Any } ?? JSONNull(),
        ]
    }

    static func lines(_ account: StoreView.Account) -> [String] {
        let profile = account.session.profile
        var lines = ["\(Terminal.escape(account.key))\(account.isActive ? " (active)" : ""): \(account.state.rawValue)"]
        lines.append("  member:   \(account.session.memberID.map(Terminal.escape) ?? "unknown")")
        lines.append("  issuer:   \(profile.map { Terminal.escape($0.issuer) } ?? "unknown (signed in before profiles were kept)")")
        if let profile {
            lines.append("  client:   \(Terminal.escape(profile.clientID))")
            let granted = profile.grantedScope.map(Terminal.escape) ?? "as requested"
            lines.append("  scopes:   \(profile.requestedScope.map(Terminal.escape) ?? "the server's default") (granted: \(granted))")
        }
        if let timing = timing(account) {
            lines.append("  expires:  in \(Presenter.minutes(Int(timing.expiresIn)))")
            lines.append("  refresh:  due in \(Presenter.minutes(Int(timing.nextRefreshIn)))")
        }
        return lines
    }
}
