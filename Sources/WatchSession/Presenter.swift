import FoundationEssentials
import Glibc
import SessionCore
import SessionOAuth

/// Prints what happens: one line per event with local time (colour on a terminal unless
/// NO_COLOR), or one JSON object per line (NDJSON). Never a token.
final class Presenter: @unchecked Sendable {
    let json: Bool
    let colour: Bool
    let terminal: Bool
    private let lock = Lock()
    private var statusShown = false
    /// A sign-in waiting for the user: what the countdown says, until when.
    private var pending: Pending?

    private struct Pending {
        let flow: String
        /// "code ABCD-EFGH expires in", "waiting for the browser; gives up in"...
        let label: String
        let deadline: ContinuousClock.Instant
        /// What the terminal shows now (drawn again only when it changes).
        var shown: String?
        /// Not a terminal: a plain line each 30 s step of the time left.
        var step: Int?
    }

    init(json: Bool) {
        self.json = json
        terminal = isatty(STDOUT_FILENO) == 1
        colour = terminal && !json && ProcessInfo.processInfo.environment["NO_COLOR"] == nil
    }

    /// A part of a line: text, or text in a colour. Both are escaped (`Terminal.escape`)
    /// when the line is written; the colour's own escape sequences are added after.
    enum Segment {
        case plain(String)
        case styled(String, String)
    }

    private func render(_ segments: [Segment]) -> String {
        segments.map { segment in
            switch segment {
            case .plain(let text): Terminal.escape(text)
            case .styled(let text, let code):
                colour ? "\u{1B}[\(code)m\(Terminal.escape(text))\u{1B}[0m" : Terminal.escape(text)
            }
        }.joined()
    }

    /// The one way a line reaches standard output: escaped, whatever it holds.
    private func write(_ segments: Segment...) {
        write(rendered: render(segments))
    }

    private func write(rendered line: String) {
        lock.withLock {
            var out = ""
            if statusShown { out += "\r\u{1B}[2K" }
            statusShown = false
            out += line + "\n"
            StandardStream.output.write(Data(out.utf8))
        }
    }

    /// The status line, drawn in place (terminal only): escaped like every line.
    private func drawStatus(_ text: String) {
        StandardStream.output.write(Data("\r\u{1B}[2K  \(render([.styled(text, "2")]))".utf8))
    }

    private func emitJSON(_ fields: [String: Any]) {
        var object = fields
        object["time"] = Clock.iso8601()
        write(rendered: Terminal.escapeJSON(JSONText.of(object)))
    }

    private var now: Segment { .plain("\(Clock.timeOfDay())  ") }

    func state(_ state: SessionState) {
        if json {
            emitJSON(["kind": "state", "state": state.rawValue])
            return
        }
        let code = switch state {
        case .loggedIn: "1;32"
        case .loggedOut: "1;33"
        case .sessionExpired: "1;31"
        }
        write(now, .styled("STATE → \(state.rawValue)", code))
    }

    /// The store status, shown next to the state: `loggedOut` with the store `available` is
    /// "signed out"; with it `reading` or `unavailable`, "cannot read the session yet".
    func store(_ status: StoreStatus) {
        let name = switch status {
        case .reading: "reading"
        case .available: "available"
        case .unavailable: "unavailable"
        }
        var reason: String?
        if case .unavailable(let error) = status { reason = error.message }
        if json {
            emitJSON(["kind": "store", "status": name, "reason": reason ?? JSONNull()])
            return
        }
        let code = if case .unavailable = status { "1;31" } else { "2" }
        let text = reason.map { "STORE → \(name): \($0) (the stored session is not known until it can be read)" } ?? "STORE → \(name)"
        write(now, .styled(text, code))
    }

    func event(_ event: SessionEvent) {
        if json {
            var fields: [String: Any] = ["kind": "event", "event": Self.name(of: event), "text": event.description]
            switch event {
            case .tokenRefreshed(let expiresIn, let reason):
                fields["expires_in_ms"] = expiresIn.milliseconds
                fields["reason"] = reason.rawValue
            case .refreshFailed(let attempt, let retryIn, let error):
                fields["attempt"] = attempt
                fields["retry_in_ms"] = retryIn.map { $0.milliseconds as Any } ?? JSONNull()
                fields["error"] = error.kind.rawValue
            case .signedIn(let member):
                fields["member_id"] = member ?? JSONNull()
            default:
                break
            }
            emitJSON(fields)
            return
        }
        write(now, .plain(Self.describe(event)))
    }

    /// The accounts of the store (several accounts): keys, states, the active one.
    func accounts(_ accounts: [SessionAccount]) {
        if json {
            emitJSON(["kind": "accounts", "accounts": accounts.map { account -> [String: Any] in
                ["key": account.key, "state": account.state.rawValue, "active": account.isActive]
            }])
            return
        }
        let list = accounts.isEmpty
            ? "none"
            : accounts.map { "\(Self.printable($0.key)) (\($0.isActive ? "active, " : "")\($0.state.rawValue))" }
                .joined(separator: " · ")
        write(now, .styled("ACCOUNTS \(list)", "1;36"))
    }

    /// `text` with every control and formatting character shown as its escape
    /// (`Terminal.escape`). Every line is escaped when written anyway; this is for text built
    /// into other text first (JSON fields, messages).
    static func printable(_ text: String) -> String {
        Terminal.escape(text)
    }

    func note(_ text: String) {
        if json {
            emitJSON(["kind": "note", "text": text])
        } else {
            write(now, .styled(text, "1"))
        }
    }

    /// The status line (terminal only): countdowns to expiry and to the next refresh — or,
    /// while a sign-in waits for the user, the time its code (or wait) has left: in place on a
    /// terminal, a plain line every 30 s otherwise.
    func status(expiresIn: Duration?, nextRefreshIn: Duration?) {
        guard !json else { return }
        if countdown() { return }
        guard terminal else { return }
        var parts: [String] = []
        if let expiresIn { parts.append("token expires in \(Self.seconds(expiresIn))") }
        if let nextRefreshIn { parts.append("next refresh in \(Self.seconds(nextRefreshIn))") }
        guard !parts.isEmpty else { return }
        lock.withLock {
            statusShown = true
            drawStatus(parts.joined(separator: " · "))
        }
    }

    // MARK: - Signing in and out

    /// The device flow's prompt (RFC 8628 §3.3): where to go, the code to enter (last on its
    /// line, so it is easy to copy), the link with the code filled in if the server gave one.
    /// Never the device code: the prompt does not hold it.
    func devicePrompt(_ prompt: DevicePrompt) {
        let uri = Self.printable(prompt.verificationURI.absoluteString)
        let complete = prompt.verificationURIComplete.map { Self.printable($0.absoluteString) }
        let code = Self.printable(prompt.userCode)
        let seconds = Int(prompt.expiresIn.timeInterval.rounded())
        startCountdown(flow: "device", label: "code \(code) expires in", lifetime: prompt.expiresIn)
        if json {
            emitJSON([
                "kind": "sign_in", "event": "sign_in_prompt", "flow": "device", "user_code": code,
                "verification_uri": uri, "verification_uri_complete": complete ?? JSONNull(),
                "expires_in": seconds, "interval": Int(prompt.interval.timeInterval.rounded()),
            ])
            return
        }
        write(.plain("To sign in, open \(uri) and enter "), .styled(code, "1"))
        if let complete { write(.plain("or open \(complete) (the code is filled in)")) }
        write(.plain("The code expires in \(Self.minutes(seconds)). Waiting for the approval… (Ctrl-C cancels)"))
    }

    /// The browser flow's prompt, and how long the listener waits. One URL: the start URL when
    /// the CLI opens a browser (the person's fallback is that same URL, fetched once), the
    /// authorization URL (alone at the end of its line) when it does not (the flow then serves
    /// no start URL).
    func browserPrompt(_ prompt: BrowserPrompt, opening: Bool) {
        let authorization = Self.printable(prompt.authorizationURL.absoluteString)
        let start = prompt.startURL.map { Self.printable($0.absoluteString) }
        let seconds = Int(prompt.timeout.timeInterval.rounded())
        startCountdown(flow: "browser", label: "waiting for the browser; gives up in", lifetime: prompt.timeout)
        if json {
            emitJSON([
                "kind": "sign_in", "event": "sign_in_prompt", "flow": "browser", "authorization_url": authorization,
                "start_url": start ?? JSONNull(), "redirect_uri": Self.printable(prompt.redirectURI.absoluteString),
                "expires_in": seconds, "opened": opening,
            ])
            return
        }
        if opening, let start {
            let site = prompt.authorizationURL.host.map { " at \(Self.printable($0))" } ?? ""
            write(.plain("Opening the sign-in page\(site) in your browser… If it does not open, visit \(start) "
                + "(once: a second visit ends the sign-in)."))
        } else {
            write(.plain("To sign in, open this URL in your browser: \(authorization)"))
        }
        write(.plain("Waiting for the browser to come back to \(Self.printable(prompt.redirectURI.absoluteString)) "
            + "(for \(Self.minutes(seconds)); Ctrl-C cancels)"))
    }

    /// The sign-in waiting for the user ended: the countdown goes; in JSON, the outcome.
    func signInEnded(_ outcome: Result<Void, SessionError>, flow: String?, member: String? = nil) {
        lock.withLock {
            pending = nil
            if statusShown, terminal, !json {
                StandardStream.output.write(Data("\r\u{1B}[2K".utf8))
                statusShown = false
            }
        }
        guard json else { return }
        var fields: [String: Any] = ["kind": "sign_in", "flow": flow ?? JSONNull()]
        switch outcome {
        case .success:
            fields["event"] = "sign_in_succeeded"
            fields["member_id"] = member ?? JSONNull()
        case .failure(let error):
            fields["event"] = "sign_in_failed"
            fields["reason"] = error.code.name
            fields["message"] = SignInPlan.explain(error)
        }
        emitJSON(fields)
    }

    private func startCountdown(flow: String, label: String, lifetime: Duration) {
        lock.withLock {
            pending = Pending(flow: flow, label: label, deadline: .now + lifetime)
        }
    }

    /// Draws the countdown of a waiting sign-in; false when none waits.
    private func countdown() -> Bool {
        lock.withLock {
            guard var waiting = pending else { return false }
            let left = max(Int((waiting.deadline - .now).timeInterval.rounded(.up)), 0)
            if terminal {
                let text = "\(waiting.label) \(Self.minutes(left)) · Ctrl-C cancels"
                if text != waiting.shown {
                    waiting.shown = text
                    statusShown = true
                    drawStatus(text)
                }
            } else {
                let step = (left + 29) / 30
                if let last = waiting.step, step < last {
                    StandardStream.output.write(Data(
                        "\(Self.clockTime())  \(Terminal.escape(waiting.label)) \(Self.minutes(left))\n".utf8))
                }
                waiting.step = step
            }
            pending = waiting
            return true
        }
    }

    /// `login` signed in and ends: who, and where the session is kept (in JSON the
    /// `sign_in_succeeded` line said it already).
    func signedIn(member: String?, account: String?, store: String) {
        guard !json else { return }
        let who = member.map { "as \(Self.printable($0))" } ?? "(the server named nobody)"
        let key = account.map { " (account \(Self.printable($0)))" } ?? ""
        write(.plain("Signed in \(who)\(key). The session is stored in \(Self.printable(store))."))
    }

    /// `login` found the store's account signed in already: nothing is done.
    func alreadySignedIn(member: String?, account: String, issuer: String?) {
        if json {
            emitJSON([
                "kind": "sign_in", "event": "already_signed_in", "member_id": member ?? JSONNull(), "account": account,
                "issuer": issuer ?? JSONNull(),
            ])
            return
        }
        let at = issuer.map { " at \(Self.printable($0))" } ?? ""
        write(.plain("Already signed in as \(Self.printable(member ?? account))\(at): nothing to do "
            + "(--force signs in again; watch-session logout signs out)."))
    }

    /// What `watch-session logout` did.
    func signOut(_ outcome: SignOut.Outcome) {
        if json {
            emitJSON([
                "kind": "logout", "signed_out": outcome.wasSignedIn, "member_id": outcome.member ?? JSONNull(),
                "previous_state": outcome.previousState.rawValue,
                "revocation_endpoint": outcome.revocationEndpoint ?? JSONNull(),
                "revoked": outcome.revoked.map { $0 as Any } ?? JSONNull(),
                "error": outcome.failure ?? JSONNull(),
                "remaining_accounts": outcome.remainingAccounts,
            ])
            return
        }
        guard outcome.failure == nil || outcome.wasSignedIn else { return }  // said on standard error
        guard outcome.wasSignedIn else {
            write(.plain("nothing to sign out: the store holds no session"))
            return
        }
        let who = outcome.member.map { " \(Self.printable($0))" } ?? ""
        let state = outcome.previousState == .sessionExpired ? " (the session had expired)" : ""
        write(.plain("signed out\(who)\(state): the session is wiped from the store"))
        switch outcome.revoked {
        case true?:
            write(.plain("the refresh token was revoked at \(Self.printable(outcome.revocationEndpoint ?? "the server"))"))
        case false?:
            break  // the failure goes to standard error
        case nil:
            if outcome.previousState == .sessionExpired {
                write(.plain("nothing to revoke: the server had refused the refresh token already"))
            } else {
                let why = outcome.issuerGiven ? "the issuer's metadata names no revocation_endpoint" : "the store does not say which issuer minted it, and no --issuer was given"
                write(.plain("not revoked at the server (\(why)): the refresh token stays valid there until it expires"))
            }
        }
        if !outcome.remainingAccounts.isEmpty {
            write(.plain("still signed in: \(outcome.remainingAccounts.map(Self.printable).joined(separator: ", "))"))
        }
    }

    /// `m:ss` (or `h:mm:ss`).
    static func minutes(_ seconds: Int) -> String {
        seconds >= 3600
            ? "\(seconds / 3600):\(Clock.pad(seconds / 60 % 60, 2)):\(Clock.pad(seconds % 60, 2))"
            : "\(seconds / 60):\(Clock.pad(seconds % 60, 2))"
    }

    private static func clockTime() -> String { Clock.timeOfDay() }

    static func seconds(_ duration: Duration) -> String {
        let value = max(duration.timeInterval, 0)
        return value < 1 ? Clock.fixed(value * 1000, 0) + " ms" : Clock.fixed(value, 1) + " s"
    }

    static func name(of event: SessionEvent) -> String {
        switch event {
        case .initialSession: "initialSession"
        case .signedIn: "signedIn"
        case .signedOut: "signedOut"
        case .tokenRefreshed: "tokenRefreshed"
        case .refreshFailed: "refreshFailed"
        case .sessionExpired: "sessionExpired"
        case .validated: "validated"
        case .storeError: "storeError"
        case .accountSwitched: "accountSwitched"
        }
    }

    static func describe(_ event: SessionEvent) -> String {
        switch event {
        case .initialSession(let state): "started: the store says \(state.rawValue)"
        case .signedIn(let member): "signed in as \(member ?? "someone")"
        case .signedOut(let reason): "signed out (\(reason.rawValue))"
        case .tokenRefreshed(let expiresIn, let reason):
            "token refreshed (\(reason.rawValue)); it lives \(seconds(expiresIn))"
        case .refreshFailed(let attempt, let retryIn, let error):
            "refresh failed (attempt \(attempt): \(error.message))"
                + (retryIn.map { "; retrying in \(seconds($0))" } ?? "; not retrying")
        case .sessionExpired(let reason): "session expired (\(reason))"
        case .validated: "session validated"
        case .storeError(let error): "store problem: \(error.message)"
        case .accountSwitched(let account): "switched to the account \(account)"
        }
    }
}

extension Duration {
    var milliseconds: Int64 {
        let (seconds, attoseconds) = components
        return seconds * 1000 + attoseconds / 1_000_000_000_000_000
    }
}
