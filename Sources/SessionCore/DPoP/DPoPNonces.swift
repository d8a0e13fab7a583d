import LoopFlow

/// The DPoP nonces servers gave (RFC 9449 §8 for authorization servers, §9 for resource
/// servers), remembered per server — its origin, `scheme://host[:port]` — for the next proof
/// to it. Process-wide (`shared`): a sign-in's nonce serves the refreshes after it. Any thread.
/// Bounded: past `capacity` servers, the oldest is forgotten (a server whose nonce was
/// forgotten asks for it again: one retry).
package final class DPoPNonces: Sendable {
    package static let shared = DPoPNonces()
    package static let capacity = 256

    private let nonces = LockedBox<[(origin: String, nonce: String)]>([])

    package init() {}

    /// The nonce last given by the server of `url`, if any.
    package func nonce(for url: String) -> String? {
        let origin = Self.origin(of: url)
        return nonces.withLockedValue { list in list.last { $0.origin == origin }?.nonce }
    }

    /// Remembers `nonce` for the server of `url` (replacing the one it had) — unless it is no
    /// nonce a proof can carry (`DPoPKey.isNonce`): then nothing changes, and false.
    @discardableResult
    package func remember(_ nonce: String, for url: String) -> Bool {
        guard DPoPKey.isNonce(nonce) else { return false }
        let origin = Self.origin(of: url)
        nonces.withLockedValue { list in
            list.removeAll { $0.origin == origin }
            list.append((origin, nonce))
            if list.count > Self.capacity { list.removeFirst(list.count - Self.capacity) }
        }
        return true
    }

    /// `scheme://authority` of `url`, lowercased (the path and what follows dropped).
    package static func origin(of url: String) -> String {
        let parts = url.split(separator: "/", maxSplits: 3, omittingEmptySubsequences: false)
        guard parts.count >= 3, parts[0].hasSuffix(":"), parts[1].isEmpty else { return url.lowercased() }
        let authority = parts[2].prefix { $0 != "?" && $0 != "#" }
        return "\(parts[0])//\(authority)".lowercased()
    }
}
