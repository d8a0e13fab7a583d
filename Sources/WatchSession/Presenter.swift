import Foundation
import SessionCore

/// Prints what happens: one line per event with local time (colour on a terminal unless
/// NO_COLOR), or one JSON object per line (NDJSON). Never a token.
final class Presenter: @unchecked Sendable {
    let json: Bool
    let colour: Bool
    let terminal: Bool
    private let lock = NSLock()
    private var statusShown = false

    init(json: Bool) {
        self.json = json
        terminal = isatty(STDOUT_FILENO) == 1
        colour = terminal && !json && ProcessInfo.processInfo.environment["NO_COLOR"] == nil
    }

    private static let clock: DateFormatter = {
        let formatter = DateFormatter()
        formatter.dateFormat = "HH:mm:ss.SSS"
        return formatter
    }()

    private func paint(_ text: String, _ code: String) -> String {
        colour ? "\u{1B}[\(code)m\(text)\u{1B}[0m" : text
    }

    private func write(_ line: String) {
        lock.withLock {
            var out = ""
            if statusShown { out += "\r\u{1B}[2K" }
            statusShown = false
            out += line + "\n"
            FileHandle.standardOutput.write(Data(out.utf8))
        }
    }

    private func emitJSON(_ fields: [String: Any]) {
        var object = fields
        object["time"] = ISO8601DateFormatter().string(from: Date())
        if let data = try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys]) {
            write(String(decoding: data, as: UTF8.self))
        }
    }

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
        write("\(Self.clock.string(from: Date()))  \(paint("STATE → \(state.rawValue)", code))")
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
            emitJSON(["kind": "store", "status": name, "reason": reason ?? NSNull()])
            return
        }
        let code = if case .unavailable = status { "1;31" } else { "2" }
        let text = reason.map { "STORE → \(name): \($0) (the stored session is not known until it can be read)" } ?? "STORE → \(name)"
        write("\(Self.clock.string(from: Date()))  \(paint(text, code))")
    }

    func event(_ event: SessionEvent) {
        if json {
            var fields: [String: Any] = ["kind": "event", "event": Self.name(of: event), "text": event.description]
            switch event {
            case .tokenRefreshed(let expiresIn, let reason):
                fields["expiresInMs"] = expiresIn.milliseconds
                fields["reason"] = reason.rawValue
            case .refreshFailed(let attempt, let retryIn, let error):
                fields["attempt"] = attempt
                fields["retryInMs"] = retryIn.map { $0.milliseconds as Any } ?? NSNull()
                fields["error"] = error.kind.rawValue
            case .signedIn(let member):
                fields["memberID"] = member ?? NSNull()
            default:
                break
            }
            emitJSON(fields)
            return
        }
        write("\(Self.clock.string(from: Date()))  \(Self.describe(event))")
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
        write("\(Self.clock.string(from: Date()))  \(paint("ACCOUNTS \(list)", "1;36"))")
    }

    /// `text` with every control character (escape sequences included) shown as `?`: names from
    /// a store or a server never drive the terminal.
    static func printable(_ text: String) -> String {
        String(String.UnicodeScalarView(text.unicodeScalars.map { scalar in
            scalar.properties.generalCategory == .control || scalar.properties.generalCategory == .format ? "?" : scalar
        }))
    }

    func note(_ text: String) {
        if json {
            emitJSON(["kind": "note", "text": text])
        } else {
            write("\(Self.clock.string(from: Date()))  \(paint(text, "1"))")
        }
    }

    /// The status line (terminal only): countdowns to expiry and to the next refresh.
    func status(expiresIn: Duration?, nextRefreshIn: Duration?) {
        guard terminal, !json else { return }
        var parts: [String] = []
        if let expiresIn { parts.append("token expires in \(Self.seconds(expiresIn))") }
        if let nextRefreshIn { parts.append("next refresh in \(Self.seconds(nextRefreshIn))") }
        guard !parts.isEmpty else { return }
        lock.withLock {
            statusShown = true
            FileHandle.standardOutput.write(Data("\r\u{1B}[2K  \(paint(parts.joined(separator: " · "), "2"))".utf8))
        }
    }

    static func seconds(_ duration: Duration) -> String {
        let value = max(duration.timeInterval, 0)
        return value < 1 ? String(format: "%.0f ms", value * 1000) : String(format: "%.1f s", value)
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
